"""The P2P record: what `builder doctor --p2p` measured on a machine and chose for it, and
what `builder launch` (deploy-files, qualify --start) does with it.

    /var/lib/builder/p2p/gpus-<12 hex>-topo-<12 hex>.json   (elsewhere: BUILDER_P2P_DIR)

keyed by the GPUs' UUIDs in index order and the normalised `nvidia-smi topo -m` matrix
(builder/site/p2p_host.py): a record made for other GPUs, another order or another topology is
stale and ignored. Launch applies the record's NCCL settings to the recipe and refuses a
profile that needs peer access (the `-pcie-ar` ones) when the record says no.

Whoever can write the record chooses what goes into the server's environment and whether a
`-pcie-ar` profile starts (security review #54). So it is believed only where the server's
container cannot write it:
- it lives in builder's own folder on the host, which no profile mounts (a profile mounts
  read-write only under its engine's state folder, /var/lib/sglang/ or /var/lib/vllm/,
  builder/spec/launch.py); launch and doctor refuse a record folder inside any folder the
  recipe mounts read-write (an operator's `--set` or BUILDER_P2P_DIR could put them
  together), so nothing the server runs (a model's remote code, a compromised sglang) can
  forge a verdict, delete an honest refusal, or put back an older record that allowed what
  this one refuses;
- the folder is reached from / without following a symbolic link, and it and the record
  are owned by root or this user and writable by nobody else; the record is opened without
  following a link or waiting on a FIFO, must be a regular file of at most 1 MiB, and must
  have the shape doctor writes;
- of its settings launch applies only what doctor can choose (builder/site/p2p.py NCCL_SETS and
  NCCL_UNSETS: NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL dropped); a record that sets any other
  variable (NCCL_NET_PLUGIN naming a library, NCCL_TUNER_PLUGIN, NCCL_PROTO ...) is refused.
A seal (an HMAC with a key outside the volume) on a record kept beside the server's caches
would prove who wrote a record, but not that it is the latest: deleting a refusal or
replaying an older record would still lift it. A folder the container cannot reach has
neither hole and needs no key. Doctor writes the record the same way: the folder made
without following a link, the record written beside its name and renamed over it.

Standard library and builder's light modules only: the VM's launch path and the GPU proof
(bench/p2p_probe_check.py) import it without Docker or git libraries.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from builder import __version__
from builder.core.cache import LinkedFolder, open_folder_unlinked, replace_in_folder
from builder.core.errors import BuilderError
from builder.core.settings import P2P_DIR_ENV
from builder.core.untrusted import printable
from builder.site import doctor
from builder.site.p2p import NCCL_SETS, NCCL_UNSETS, Analysis, Settings
from builder.site.p2p_host import (
    GPU_IDS_QUERY,
    TOPOLOGY_QUERY,
    HostFacts,
    parse_gpu_ids,
    topology_hash,
    topology_matrix,
)

SCHEMA = "builder-p2p-record"
VERSION = 1
DIR_ENV = P2P_DIR_ENV
DEFAULT_DIR = "/var/lib/builder/p2p"  # outside the engines' state folders, where profiles mount
MAX_RECORD_BYTES = 1 << 20  # eight GPUs' record is about 30 KB
PCIE_AR_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
HOME_IN_RECIPE = "$HOME"  # launch.HOME: a recipe's host paths, as the VM's shell expands them
_RECORD_NAME = re.compile(r"gpus-[0-9a-f]{12}-topo-[0-9a-f]{12}\.json")
_GPU_UUID = re.compile(r"[A-Za-z0-9-]{1,80}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_GPUS = 64
_MOVE_IT = f"keep records outside it ({DIR_ENV}=DIR for doctor --p2p and launch)"

Volumes = tuple[tuple[str, str, str], ...]  # a recipe's (host, container, mode)


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


def record_dir() -> Path:
    """Where records are kept: BUILDER_P2P_DIR, else /var/lib/builder/p2p."""
    chosen = os.environ.get(DIR_ENV) or DEFAULT_DIR
    return Path(os.path.abspath(os.path.expanduser(chosen)))


def record_path(folder: Path, machine: Machine) -> Path:
    return folder / f"{machine.key}.json"


def server_writes(folder: Path, volumes: Volumes) -> str | None:
    """The read-write volume (`HOST:CONTAINER`) through which the server's container can
    write in `folder`, or None."""
    home = os.path.expanduser("~")
    real = os.path.realpath(folder)
    for host, container, mode in volumes:
        mounted = os.path.realpath(host.replace(HOME_IN_RECIPE, home))
        if mode == "rw" and (real == mounted or real.startswith(mounted.rstrip("/") + "/")):
            return f"{host}:{container}"
    return None


def _outside_the_server(folder: Path, volumes: Volumes) -> None:
    via = server_writes(folder, volumes)
    if via:
        raise BuilderError(
            f"P2P record folder {folder}: inside the volume {via}, which the server's "
            f"container writes: a record there is not believed; {_MOVE_IT}"
        )


def trust_problem(info: os.stat_result) -> str | None:
    """Why a file or folder could have been written by someone else than its owner (root or
    this user): a P2P record, a sweep's chosen.json."""
    if info.st_uid not in (0, os.geteuid()):
        return f"owned by uid {info.st_uid}, not root or this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by group or others"
    return None


def _open_folder(folder: Path, create: bool) -> int:
    """The record folder, reached without a link; its owner and mode checked."""
    try:
        descriptor = open_folder_unlinked(folder, create=create)
    except LinkedFolder as exc:
        raise BuilderError(
            f"P2P record folder {folder}: {exc}: not followed; give a real folder ({DIR_ENV})"
        ) from None
    problem = trust_problem(os.fstat(descriptor))
    if problem:
        os.close(descriptor)
        raise BuilderError(f"P2P record folder {folder}: {problem}: a record there is not believed")
    return descriptor


def write(
    folder: Path, machine: Machine, topology: str | None, probe: dict, facts: HostFacts,
    analysis: Analysis, image: str | None, profile: str, volumes: Volumes,
) -> Path:  # fmt: skip
    """The record, in `folder` (made without following a link), written beside its name and
    renamed over it; refused where the profile's server could write it."""
    _outside_the_server(folder, volumes)
    path = record_path(folder, machine)
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
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if len(text.encode()) > MAX_RECORD_BYTES:
        raise BuilderError(
            f"P2P record {path}: {len(text.encode())} bytes, over the {MAX_RECORD_BYTES} "
            "launch reads: the probe's answer is not what builder's probe writes"
        )
    try:
        descriptor = _open_folder(folder, create=True)
        try:
            replace_in_folder(descriptor, path.name, text)
        finally:
            os.close(descriptor)
    except OSError as exc:
        raise BuilderError(
            f"P2P record {path}: cannot write it ({exc.strerror}); run as root, or set "
            f"{DIR_ENV}=DIR for doctor --p2p and launch"
        ) from None
    return path


def _read(path: Path) -> bytes:
    """The record's bytes: its folder reached without a link, the file itself not a link, a
    FIFO, a device or larger than MAX_RECORD_BYTES; one line naming it otherwise."""
    try:
        folder = _open_folder(path.parent, create=False)
    except FileNotFoundError:
        raise BuilderError(f"P2P record {path}: no such file") from None
    except OSError as exc:
        raise BuilderError(f"P2P record {path}: cannot read it ({exc.strerror})") from None
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO opens without a writer
        descriptor = os.open(path.name, flags, dir_fd=folder)
    except OSError as exc:
        why = {errno.ENOENT: "no such file", errno.ELOOP: "a symbolic link: not followed"}
        raise BuilderError(
            f"P2P record {path}: {why.get(exc.errno) or f'cannot read it ({exc.strerror})'}"
        ) from None
    finally:
        os.close(folder)
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BuilderError(f"P2P record {path}: not a regular file")
        problem = trust_problem(info)
        if problem:
            raise BuilderError(f"P2P record {path}: {problem}: not believed")
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise BuilderError(f"P2P record {path}: larger than {MAX_RECORD_BYTES} bytes: not a record")
    return data


def load(path: Path) -> dict:
    """A record, checked enough to act on; one line naming the file otherwise."""
    try:
        record = json.loads(_read(path))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else "not JSON"
        raise BuilderError(f"P2P record {path}: cannot read it ({why})") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise BuilderError(f"P2P record {path}: not a builder P2P record (schema {SCHEMA})")
    if record.get("version") != VERSION:
        raise BuilderError(
            f"P2P record {path}: version {printable(record.get('version'), 40)}, this builder "
            f"reads {VERSION}: rerun builder doctor --p2p"
        )
    problem = _shape_problem(record) or _settings_problem(record["settings"])
    if problem:
        raise BuilderError(f"P2P record {path}: {problem}; rerun builder doctor --p2p")
    return record


def _shape_problem(record: dict) -> str | None:
    """What launch reads besides the settings, in the shapes doctor writes."""
    uuids = record.get("gpu_uuids")
    if not (
        isinstance(uuids, list) and 0 < len(uuids) <= _MAX_GPUS
        and all(isinstance(u, str) and _GPU_UUID.fullmatch(u) for u in uuids)
    ):  # fmt: skip
        return f"gpu_uuids must list 1 to {_MAX_GPUS} GPU UUIDs"
    if not (
        isinstance(record.get("topology_sha256"), str)
        and _SHA256.fullmatch(record["topology_sha256"])
    ):
        return "topology_sha256 must be 64 hex digits"
    if not isinstance(record.get("written_at", ""), str):
        return "written_at must be a string"
    if not isinstance(record.get("settings"), dict):
        return "settings missing"
    return None


def _settings_problem(settings: dict) -> str | None:
    """What in a record's settings doctor would not have written: it sets NCCL_P2P_DISABLE=1
    and drops NCCL_P2P_LEVEL (builder/site/p2p.py NCCL_SETS, NCCL_UNSETS), nothing else."""
    nccl, pcie_ar = settings.get("nccl"), settings.get("pcie_ar")
    if not isinstance(nccl, dict) or not isinstance(pcie_ar, dict):
        return "settings.nccl and settings.pcie_ar must be objects"
    given, unset = nccl.get("set", {}), nccl.get("unset", [])
    if not isinstance(given, dict) or not isinstance(unset, list):
        return "settings.nccl.set must be an object, settings.nccl.unset a list"
    for key, value in given.items():
        if value not in NCCL_SETS.get(key, ()):
            writes = ", ".join(f"{k}={'|'.join(v)}" for k, v in NCCL_SETS.items())
            return (
                f"settings.nccl.set {printable(key, 60)}={printable(value, 60)}: not a "
                f"setting doctor writes (it sets {writes} only)"
            )
    for key in unset:
        if key not in NCCL_UNSETS:
            return (
                f"settings.nccl.unset {printable(key, 60)}: not a setting doctor drops (it "
                f"drops {', '.join(NCCL_UNSETS)} only)"
            )
    if not isinstance(pcie_ar.get("allowed"), bool):
        return "settings.pcie_ar.allowed must be true or false"
    for why in (nccl.get("why", ""), pcie_ar.get("why", "")):
        if not isinstance(why, str):
            return "a settings 'why' is not a string"
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


def _records_in(folder: Path) -> list[str]:
    """The record names in `folder`, newest first; none when it does not exist."""
    try:
        descriptor = _open_folder(folder, create=False)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise BuilderError(f"P2P record folder {folder}: cannot read it ({exc.strerror})") from None
    try:
        names = [name for name in os.listdir(descriptor) if _RECORD_NAME.fullmatch(name)]
        mtime = {
            name: os.stat(name, dir_fd=descriptor, follow_symlinks=False).st_mtime for name in names
        }
    finally:
        os.close(descriptor)
    return sorted(names, key=lambda name: mtime[name], reverse=True)


@dataclass(frozen=True)
class Reading:
    """What launch does: the environment to use and the one line that says so."""

    env: dict[str, str]
    line: str


def for_launch(
    env: dict[str, str], profile: str, needs_peer_access: bool, volumes: Volumes,
    record_file: str | None = None, disabled: bool = False,
    machine: Machine | str | None = None,
) -> Reading:  # fmt: skip
    """The record for this machine applied to a recipe's `env`, or why none was; raises a
    one-line BuilderError when the record refuses a profile that needs peer access, or sits
    where the recipe's server could have written it."""
    if disabled:
        return Reading(env, "P2P record: not read (--no-p2p-record)")
    machine = this_machine() if machine is None else machine
    if record_file:
        path = Path(os.path.abspath(record_file))
        _outside_the_server(path.parent, volumes)
        record = load(path)
        if isinstance(machine, Machine):
            stale = stale_because(record, machine)
            if stale:
                return Reading(env, f"P2P record {path}: ignored, stale: made for {stale}")
            note = ""
        else:
            note = f" (not matched against this machine: {machine})"
        return _applied(env, profile, needs_peer_access, path, record, note)
    folder = record_dir()
    _outside_the_server(folder, volumes)
    names = _records_in(folder)
    if not isinstance(machine, Machine):
        if not names:
            return Reading(env, "")  # a build host: no GPUs and no record, nothing to say
        return Reading(
            env, f"P2P record: none read ({machine}, so this machine's GPU order and topology "
            "are unknown)",
        )  # fmt: skip
    path = record_path(folder, machine)
    if path.name in names:
        return _applied(env, profile, needs_peer_access, path, load(path), "")
    if not names:
        return Reading(
            env, f"P2P record: none in {folder} (`builder doctor --p2p` measures this "
            "machine and writes one)",
        )  # fmt: skip
    try:
        why = stale_because(load(folder / names[0]), machine) or "another key"
    except BuilderError:
        why = "unreadable"
    return Reading(
        env, f"P2P record: none for this machine's GPU order and topology in {folder}; "
        f"ignored {len(names)} stale ({names[0]}: {why}); rerun builder doctor --p2p",
    )  # fmt: skip


def _applied(
    env: dict[str, str], profile: str, needs_peer_access: bool, path: Path, record: dict,
    note: str,
) -> Reading:  # fmt: skip
    settings = Settings.from_json(record["settings"])
    made = f"P2P record {path} ({printable(record.get('written_at', 'undated'), 40)})"
    if needs_peer_access and not settings.pcie_ar_allowed:
        raise BuilderError(
            f"profile {profile} needs peer access on every GPU pair; {made} refuses it: "
            f"{printable(settings.pcie_ar_why, 400)}; launch a profile without it (NCCL), fix "
            "the host and rerun builder doctor --p2p, or pass --no-p2p-record"
        )
    new = settings.apply(env)
    why = printable(settings.nccl_why, 400)
    if new == env:
        return Reading(env, f"{made}{note}: {why}")
    changes = [f"{key}={value}" for key, value in settings.nccl_set.items()]
    changes += [f"{key} dropped" for key in settings.nccl_unset if key in env]
    return Reading(new, f"{made}{note}: {', '.join(changes)}: {why}")


def apply(
    recipe: Any, needs_peer_access: bool, record_file: str | None = None,
    disabled: bool = False, machine: Machine | str | None = None,
) -> tuple[Any, str]:  # fmt: skip
    """`for_launch` on a launch.Recipe: (the recipe with the record's env, the line)."""
    reading = for_launch(
        recipe.env, recipe.profile, needs_peer_access or recipe.env.get(PCIE_AR_ENV) == "1",
        recipe.volumes, record_file, disabled, machine,
    )  # fmt: skip
    return dataclasses.replace(recipe, env=reading.env), reading.line
