"""Stage 4a: the FlashInfer kernels, each compiled once, as a kernel wheel.

The Dockerfile's `kernel-builder` stage (runtime + the patched flashinfer wheel + the
warm-up script) is built first. In one container of it the warm-up (the target's modules,
and those that `builder jit harvest` found a server compiling) names each module's lookup
key and waits; builder brings the entries
it has for those keys (local cache, then the shared registry, pulled side by side) into
that container, and the warm-up reuses every entry whose inputs are unchanged and compiles
the rest. New entries go back to the cache and the registry; every module's .so goes into
the kernel wheel, which the image installs.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
from rich.markup import escape

from builder.build.kernels import cache as kernel_cache
from builder.build.kernels import trust as kernel_trust
from builder.build.kernels import wheel as kernel_wheel
from builder.build.wheels import BuiltWheel
from builder.core import progress
from builder.core.cache import read_limited, sha256_file, staging_dir
from builder.core.errors import BuilderError
from builder.spec.jit import packs

WARMUP = "/opt/builder/jit_warmup.py"
_IN, _OUT = "/kernels-in", "/kernels-out"
_TAIL_LINES = 30
_LOOKUPS = "jit-warmup: lookups "
_RUN_FIELDS = ("name", "lookup", "key", "source", "reason", "compile_seconds", "harvested_from")


@dataclass(frozen=True)
class KernelJob:
    builder_image: str  # the kernel-builder stage
    modules: tuple[str, ...]
    jobs: int
    job_memory_gb: float
    harvested: dict[str, dict[str, str]]  # generator call -> module name and pack
    network_host: bool


def _tar_of(files: dict[str, Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, path in files.items():
            tar.add(path, arcname=name)
    return buffer.getvalue()


def run_warmup(
    client: docker.DockerClient,
    job: KernelJob,
    extra: list[str],
    inputs: dict[str, Path],
    into: Path,
    bring: Callable[[list[str]], Path] | None = None,
) -> Path:
    """Run the warm-up in a fresh container with `inputs` under /kernels-in; return the
    folder under `into` with what it wrote to /kernels-out (inventory.json, modules/,
    entries/). With `bring`, the warm-up waits after naming each module's lookup key:
    `bring(lookups)` fills a folder with their entries, which goes into the same running
    container as /kernels-in/entries (one container start, not one to ask and one to build).
    """
    command = [
        WARMUP, "--modules", json.dumps(list(job.modules)), "--jobs", str(job.jobs),
        "--job-memory-gb", str(job.job_memory_gb), "--inventory", f"{_OUT}/inventory.json",
        *extra, *(["--entries", f"{_IN}/entries", "--await-entries"] if bring else []),
    ]  # fmt: skip
    container = client.containers.create(
        job.builder_image,
        command,
        entrypoint=["python"],
        network_mode="host" if job.network_host else "none",
    )
    recent: list[str] = []
    try:
        if inputs:
            container.put_archive("/", _tar_of(inputs))
        container.start()
        pending = ""
        for raw in container.logs(stream=True, follow=True):
            pending += raw.decode(errors="replace")
            *lines, pending = pending.split("\n")
            for line in lines:
                recent = [*recent[-_TAIL_LINES:], line]
                if bring and line.startswith(_LOOKUPS):
                    try:
                        lookups = json.loads(line.removeprefix(_LOOKUPS))
                    except ValueError:
                        raise BuilderError(f"kernel build: unreadable key line: {line}") from None
                    container.put_archive("/", _entries_then_ready(bring(lookups)))
                elif line.startswith("jit-warmup:"):
                    progress.info(escape(f"  {line}"))
        recent = [*recent, pending] if pending else recent
        status = container.wait()
        if status.get("StatusCode"):
            errors = [line for line in recent if "jit-warmup: error" in line]
            tail = "\n".join(f"    {line}" for line in recent[-_TAIL_LINES:])
            first = errors[0].split("error: ", 1)[1] if errors else "see the output below"
            pack = first.removeprefix("kernel pack ").split(":", 1)[0]
            if first.startswith("kernel pack ") and pack in _packs_of(job):
                if "failed to compile" in first:  # the compiler's words (the rest: shown)
                    progress.info(escape(f"  kernel build, last output:\n{tail}"))
                raise packs.PackRefused(pack, first.split(": ", 1)[1])
            raise BuilderError(f"kernel build failed: {first}\n  last output:\n{tail}")
        out = Path(tempfile.mkdtemp(prefix="run-", dir=into))
        chunks, _ = container.get_archive(_OUT)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            tar.extractall(out, filter="data")
        return out / Path(_OUT).name
    finally:
        container.remove(force=True)


def _packs_of(job: KernelJob) -> set[str]:
    return {harvested["pack"] for harvested in job.harvested.values()}


def _entries_then_ready(entries: Path) -> bytes:
    """The entries, then the marker the warm-up waits for: a tar unpacks in order."""
    buffer = io.BytesIO()
    folder = f"{_IN.strip('/')}/entries"
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(entries, arcname=folder)
        tar.addfile(tarfile.TarInfo(f"{folder}/.ready"), io.BytesIO(b""))
    return buffer.getvalue()


def plan(
    client: docker.DockerClient,
    job: KernelJob,
    cache_dir: Path,
    shared: kernel_cache.SharedKernels,
    trust: kernel_trust.Trust,
) -> list[dict]:
    """Per module: its lookup key, where its entry is, and reuse or compile with why."""
    where: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="builder-kernels-") as tmp:
        work = Path(tmp)

        def bring(lookups: list[str]) -> Path:
            found, _ = kernel_cache.gather(lookups, cache_dir, shared, trust, work / "entries")
            where.update(found)
            return work / "entries"

        decided = run_warmup(client, job, ["--plan"], {}, work, bring)
        modules = json.loads((decided / "inventory.json").read_text())["plan"]
    for module in modules:
        module["entry"] = where[module["lookup"]]
    return modules


def build(
    client: docker.DockerClient,
    job: KernelJob,
    cache_dir: Path,
    shared: kernel_cache.SharedKernels,
    trust: kernel_trust.Trust,
    flashinfer: BuiltWheel,
    target_name: str,
    wheel_dir: Path,
) -> tuple[BuiltWheel, dict, list[str]]:
    """Reuse or compile every module, keep the new entries, and make the kernel wheel;
    (wheel, this run's record: per module its source, reason and compile seconds, the
    signers of the entries it could hold: the wheel is used only while all are trusted)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="builder-kernels-") as tmp:
        work = Path(tmp)
        where: dict[str, str] = {}
        signers: dict[str, str] = {}

        def bring(lookups: list[str]) -> Path:
            found, signed = kernel_cache.gather(lookups, cache_dir, shared, trust, work / "entries")
            where.update(found)
            signers.update(signed)
            found = sum(1 for source in where.values() if source != "none")
            progress.info(
                f"kernels: {found} of {len(lookups)} modules have an entry "
                f"({sum(1 for s in where.values() if s == 'registry')} from the registry)"
            )
            return work / "entries"

        progress.info("kernels: look up each module's key")
        harvested = ["--harvested", json.dumps(job.harvested)] if job.harvested else []
        out = run_warmup(client, job, [*harvested, "--out", _OUT], {}, work, bring)
        inventory = json.loads((out / "inventory.json").read_text())
        new_entries = sorted((out / "entries").glob(f"*{kernel_cache.ENTRY_SUFFIX}"))
        signers.update(kernel_cache.keep(new_entries, cache_dir, shared, trust))
        wheel = kernel_wheel.build_kernel_wheel(
            out / "modules", inventory, flashinfer, target_name, wheel_dir
        )
    compiled = [m["name"] for m in inventory["modules"] if m["source"] != "reused"]
    seconds = round(time.monotonic() - started, 1)
    progress.info(
        f"[green]✓[/] kernels: {len(inventory['modules']) - len(compiled)} reused, "
        f"{len(compiled)} compiled{': ' + ', '.join(compiled) if compiled else ''} "
        f"({seconds:.0f} s) -> {wheel.filename}"
    )
    record = {
        "seconds": seconds,
        "entries": dict(where),
        "modules": [
            {field: module.get(field) for field in _RUN_FIELDS} for module in inventory["modules"]
        ],
    }
    return wheel, record, sorted(set(signers.values()))


_WHEEL_RECORD = "wheel.json"
_WHEEL_FIELDS = {field.name for field in dataclasses.fields(BuiltWheel)} - {"path", "cached"}


def cached_wheel(cache_dir: Path, stage_key: str, trust: kernel_trust.Trust) -> BuiltWheel | None:
    """The kernel wheel made for this flashinfer stage key earlier, if still in the cache and
    still trusted: its record signed by this host's key (a cache restored from elsewhere
    does not bring it), and every key that signed an entry it could hold trusted today. One
    warning line when it is there but not used; the kernels are then made again."""
    folder = _wheel_folder(cache_dir, stage_key)
    meta = folder / _WHEEL_RECORD
    if not os.path.lexists(meta):
        return None
    try:
        body = read_limited(meta, 1 << 20)
        record = json.loads(body)
        fields = {name: record[name] for name in _WHEEL_FIELDS}
        signers = [str(signer) for signer in record["signers"]]
        path = folder / Path(str(record["filename"])).name
    except (ValueError, KeyError, TypeError) as exc:
        progress.warn(f"cached kernel wheel {meta} is unreadable ({exc}): made again")
        return None
    why = trust.check(body, kernel_trust.read_signature(meta), host_only=True)
    untrusted = [signer for signer in signers if not trust.still_trusted(signer)]
    if not why and untrusted:
        why = f"holds kernels signed by a key ({untrusted[0][:12]}…) not trusted now"
    if why:
        progress.warn(f"cached kernel wheel {meta} {why}: made again")
        return None
    if path.is_symlink() or not path.is_file() or sha256_file(path) != record["sha256"]:
        return None  # damaged: made again
    return BuiltWheel(**{**fields, "path": path, "cached": True})


def remember_wheel(
    cache_dir: Path,
    stage_key: str,
    wheel: BuiltWheel,
    signers: list[str],
    trust: kernel_trust.Trust,
) -> BuiltWheel:
    """Keep the wheel for its flashinfer stage key: the folder is made whole beside the old
    one and renamed over it, so it holds one wheel and its record, whatever ran before."""
    folder = _wheel_folder(cache_dir, stage_key)
    record = {k: v for k, v in wheel.to_json().items() if k in _WHEEL_FIELDS}
    body = json.dumps({**record, "signers": signers}, indent=2, sort_keys=True) + "\n"
    with staging_dir(folder) as staging:
        shutil.copyfile(wheel.path, staging / wheel.filename)
        (staging / _WHEEL_RECORD).write_text(body)
        kernel_trust.write_signature(staging / _WHEEL_RECORD, trust.sign_as_host(body.encode()))
    return BuiltWheel(**{**record, "path": folder / wheel.filename, "cached": False})


def _wheel_folder(cache_dir: Path, stage_key: str) -> Path:
    return cache_dir / "kernel-wheels" / stage_key[:24]
