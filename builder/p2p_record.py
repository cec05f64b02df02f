"""The P2P record: what `builder doctor --p2p` measured on a machine and chose for it, kept
on the profile's sglang cache volume, and what `builder launch` (deploy-files, qualify
--start) does with it.

    <sglang_cache>/builder-p2p/gpus-<12 hex>-topo-<12 hex>.json

keyed by the GPUs' UUIDs in index order and the normalised `nvidia-smi topo -m` matrix
(builder/p2p_host.py): a record made for other GPUs, another order or another topology is
stale and ignored. Launch applies the record's NCCL settings to the recipe and refuses a
profile that needs peer access (the `-pcie-ar` ones) when the record says no.

Standard library and builder's light modules only: the VM's launch path and the GPU proof
(bench/p2p_probe_check.py) import it without Docker or git libraries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from builder import __version__, doctor
from builder.cache import atomic_write_text
from builder.errors import BuilderError
from builder.p2p import Analysis, Settings
from builder.p2p_host import (
    GPU_IDS_QUERY,
    TOPOLOGY_QUERY,
    HostFacts,
    parse_gpu_ids,
    topology_hash,
    topology_matrix,
)

SCHEMA = "builder-p2p-record"
VERSION = 1
RECORD_DIR = "builder-p2p"
SGLANG_CACHE_IN_CONTAINER = "/root/.cache/sglang"  # where the profiles mount sglang_cache
PCIE_AR_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"


@dataclass(frozen=True)
class Machine:
    """This machine as a record's key sees it: GPU UUIDs in index order, topology hash."""

    uuids: tuple[str, ...]
    topology_sha256: str

    @property
    def key(self) -> str:
        order = hashlib.sha256("\n".join(self.uuids).encode()).hexdigest()
        return f"gpus-{order[:12]}-topo-{self.topology_sha256[:12]}"


def machine_from(gpu_ids: str | None, topology: str | None) -> Machine | str:
    """The machine from nvidia-smi's answers, or why it cannot be told."""
    rows = parse_gpu_ids(gpu_ids)
    if gpu_ids is None or topology is None:
        return "nvidia-smi not found or not answering here"
    if not rows:
        return "nvidia-smi lists no GPU here"
    return Machine(tuple(uuid for _, uuid, _ in rows), topology_hash(topology))


def this_machine() -> Machine | str:
    return machine_from(
        doctor.run_command(GPU_IDS_QUERY, timeout_s=30),
        doctor.run_command(TOPOLOGY_QUERY, timeout_s=30),
    )


def cache_dir_of(volumes: tuple[tuple[str, str, str], ...]) -> str | None:
    """The host folder a recipe mounts as sglang's cache (the profile's `sglang_cache`)."""
    for host, container, _ in volumes:
        if container.rstrip("/") == SGLANG_CACHE_IN_CONTAINER:
            return host
    return None


def record_path(cache_dir: str | Path, machine: Machine) -> Path:
    return Path(cache_dir) / RECORD_DIR / f"{machine.key}.json"


def write(
    path: Path, machine: Machine, topology: str | None, probe: dict, facts: HostFacts,
    analysis: Analysis, image: str | None, profile: str,
) -> Path:  # fmt: skip
    record = {
        "schema": SCHEMA,
        "version": VERSION,
        "key": machine.key,
        "gpu_uuids": list(machine.uuids),
        "topology_sha256": machine.topology_sha256,
        "topology_matrix": topology_matrix(topology),
        "written_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "written_by": f"builder {__version__} doctor --p2p",
        "image": image,
        "profile": profile,
        **analysis.to_json(),
        "probe": probe,
        "host": facts.to_json(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise BuilderError(
            f"P2P record {path}: cannot write it ({exc.strerror}); run as root, or give "
            "--sglang-cache DIR (then launch with --set sglang_cache=DIR)"
        ) from None
    return path


def load(path: Path) -> dict:
    """A record, checked enough to act on; one line naming the file otherwise."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuilderError(f"P2P record {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BuilderError(f"P2P record {path}: cannot read it ({exc})") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise BuilderError(f"P2P record {path}: not a builder P2P record (schema {SCHEMA})")
    if record.get("version") != VERSION:
        raise BuilderError(
            f"P2P record {path}: version {record.get('version')!r}, this builder reads "
            f"{VERSION}: rerun builder doctor --p2p"
        )
    if not (
        isinstance(record.get("gpu_uuids"), list)
        and isinstance(record.get("topology_sha256"), str)
        and isinstance(record.get("settings"), dict)
    ):
        raise BuilderError(f"P2P record {path}: gpu_uuids, topology_sha256 or settings missing")
    problem = _settings_problem(record["settings"])
    if problem:
        raise BuilderError(f"P2P record {path}: {problem}; rerun builder doctor --p2p")
    return record


_NCCL_KEY = re.compile(r"NCCL_[A-Z0-9_]{1,60}")


def _settings_problem(settings: dict) -> str | None:
    """What in a record's settings builder would not have written. The record sits on the
    cache volume the server's container mounts read-write: what it sets in the server's
    environment is limited to NCCL_* variables with printable values."""
    nccl, pcie_ar = settings.get("nccl"), settings.get("pcie_ar")
    if not isinstance(nccl, dict) or not isinstance(pcie_ar, dict):
        return "settings.nccl and settings.pcie_ar must be objects"
    given, unset = nccl.get("set", {}), nccl.get("unset", [])
    if not isinstance(given, dict) or not isinstance(unset, list):
        return "settings.nccl.set must be an object, settings.nccl.unset a list"
    for key in [*given, *unset]:
        if not (isinstance(key, str) and _NCCL_KEY.fullmatch(key)):
            return f"settings.nccl names {str(key)[:40]!r}, not an NCCL_* variable"
    for value in given.values():
        if not (isinstance(value, str) and value.isprintable() and len(value) <= 200):
            return "settings.nccl.set holds a value that is not one printable line"
    if not isinstance(pcie_ar.get("allowed"), bool):
        return "settings.pcie_ar.allowed must be true or false"
    for why in (nccl.get("why", ""), pcie_ar.get("why", "")):
        if not (isinstance(why, str) and why.isprintable()):
            return "a settings 'why' is not one printable line"
    return None


def stale_because(record: dict, machine: Machine) -> str | None:
    """Why a record does not describe this machine, or None when it does."""
    theirs = tuple(record["gpu_uuids"])
    if theirs != machine.uuids:
        if sorted(theirs) == sorted(machine.uuids):
            return "the same GPUs in another order"
        return f"other GPUs ({len(theirs)} recorded, {len(machine.uuids)} here)"
    if record["topology_sha256"] != machine.topology_sha256:
        return "another topology (nvidia-smi topo -m)"
    return None


@dataclass(frozen=True)
class Reading:
    """What launch does: the environment to use and the one line that says so."""

    env: dict[str, str]
    line: str


def for_launch(
    env: dict[str, str], profile: str, needs_peer_access: bool, cache_dir: str | None,
    record_file: str | None = None, disabled: bool = False,
    machine: Machine | str | None = None,
) -> Reading:  # fmt: skip
    """The record for this machine applied to a recipe's `env`, or why none was; raises a
    one-line BuilderError when the record refuses a profile that needs peer access."""
    if disabled:
        return Reading(env, "P2P record: not read (--no-p2p-record)")
    machine = this_machine() if machine is None else machine
    if record_file:
        path = Path(record_file)
        record = load(path)
        if isinstance(machine, Machine):
            stale = stale_because(record, machine)
            if stale:
                return Reading(env, f"P2P record {path}: ignored, stale: made for {stale}")
            note = ""
        else:
            note = f" (not matched against this machine: {machine})"
        return _applied(env, profile, needs_peer_access, path, record, note)
    if not isinstance(machine, Machine):
        if not (cache_dir and any((Path(cache_dir) / RECORD_DIR).glob("gpus-*.json"))):
            return Reading(env, "")  # a build host: no GPUs and no record, nothing to say
        return Reading(
            env, f"P2P record: none read ({machine}, so this machine's GPU order and topology "
            "are unknown)",
        )  # fmt: skip
    if not cache_dir:
        return Reading(env, f"P2P record: none read (profile {profile} has no sglang cache volume)")
    path = record_path(cache_dir, machine)
    if path.is_file():
        return _applied(env, profile, needs_peer_access, path, load(path), "")
    others = sorted(path.parent.glob("gpus-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not others:
        return Reading(
            env, f"P2P record: none in {path.parent} (`builder doctor --p2p` measures this "
            "machine and writes one)",
        )  # fmt: skip
    try:
        why = stale_because(load(others[0]), machine) or "another key"
    except BuilderError:
        why = "unreadable"
    return Reading(
        env, f"P2P record: none for this machine's GPU order and topology in {path.parent}; "
        f"ignored {len(others)} stale ({others[0].name}: {why}); rerun builder doctor --p2p",
    )  # fmt: skip


def _applied(
    env: dict[str, str], profile: str, needs_peer_access: bool, path: Path, record: dict,
    note: str,
) -> Reading:  # fmt: skip
    settings = Settings.from_json(record["settings"])
    made = f"P2P record {path} ({record.get('written_at', 'undated')})"
    if needs_peer_access and not settings.pcie_ar_allowed:
        raise BuilderError(
            f"profile {profile} needs peer access on every GPU pair; {made} refuses it: "
            f"{settings.pcie_ar_why}; launch a profile without it (NCCL), fix the host and "
            "rerun builder doctor --p2p, or pass --no-p2p-record"
        )
    new = settings.apply(env)
    if new == env:
        return Reading(env, f"{made}{note}: {settings.nccl_why}")
    changes = [f"{key}={value}" for key, value in settings.nccl_set.items()]
    changes += [f"{key} dropped" for key in settings.nccl_unset if key in env]
    return Reading(new, f"{made}{note}: {', '.join(changes)}: {settings.nccl_why}")


def apply(
    recipe: Any, needs_peer_access: bool, record_file: str | None = None,
    disabled: bool = False, machine: Machine | str | None = None,
) -> tuple[Any, str]:  # fmt: skip
    """`for_launch` on a launch.Recipe: (the recipe with the record's env, the line)."""
    reading = for_launch(
        recipe.env, recipe.profile, needs_peer_access or recipe.env.get(PCIE_AR_ENV) == "1",
        cache_dir_of(recipe.volumes), record_file, disabled, machine,
    )  # fmt: skip
    return dataclasses.replace(recipe, env=reading.env), reading.line
