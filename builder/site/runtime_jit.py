"""Kernels a server compiled at start-up outside FlashInfer, in its engine's JIT caches
(`jit_caches` in builder/spec/engines: sglang's DeepGEMM, own JIT and Triton; vLLM's b12x,
torch.compile, Triton and DeepGEMM).

FlashInfer's modules are found by `kernels.packs.compiled_in_container` (the image's workspace
against the container's). The other JITs write under the engine's cache folders, which a
profile keeps on a host volume (so a host compiles each kernel once), where `docker diff`
sees nothing. So these are found by their files' times: a kernel file (a suffix of its
cache's) written since the container (last) started was compiled by this start. Reading
them needs the container running (one `python3` in it); a stopped container's answer is
None. Where each folder is comes from the container's environment, as the engine resolves
it (`jit_cache_roots`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from docker.errors import APIError

from builder.core import docker_client
from builder.core.untrusted import printable

if TYPE_CHECKING:
    from builder.spec.engines import Engine, JitCache

# Run inside the container: per cache, every kernel file under its root written at or
# after `since` (argv: {cache: [root, [suffix, ...]]} as JSON, then `since`).
_LIST_NEWER = r"""
import json, os, sys
caches, since = json.loads(sys.argv[1]), float(sys.argv[2])
found = {}
for cache, (root, suffixes) in caches.items():
    found[cache] = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:  # a build's staging folder may vanish under the walk
                written = os.stat(path).st_mtime
            except OSError:
                continue
            if name.endswith(tuple(suffixes)) and written >= since:
                found[cache].append(os.path.relpath(path, root))
print(json.dumps(found))
"""


def _environment(container) -> dict[str, str]:
    # `-e NAME` with NAME unset on the host leaves a bare "NAME": no value.
    pairs = (item.partition("=") for item in container.attrs["Config"].get("Env") or [])
    return {name: value for name, sep, value in pairs if sep}


def kernel_name(cache: JitCache, relative: str) -> str:
    """A readable name for one compiled file: the part of its path the cache names kernels
    by (DeepGEMM's kernel folder, sglang's module), else the file's name less its suffix."""
    parts = PurePosixPath(relative).parts
    part = cache.name_part
    if part is not None and len(parts) >= 2:  # a file right in the folder: its own name
        return parts[part]
    return PurePosixPath(relative).stem


@dataclass(frozen=True)
class RuntimeCompiles:
    """Per cache (of `caches`, by key), the kernels this start compiled; None: not read."""

    caches: tuple[JitCache, ...]
    by_cache: dict[str, list[str]] | None
    why_unread: str = ""

    def to_json(self) -> dict[str, list[str] | None]:
        keys = [cache.key for cache in self.caches]
        if self.by_cache is None:
            return dict.fromkeys(keys)
        return {key: self.by_cache.get(key, []) for key in keys}

    def summary(self) -> str:
        if self.by_cache is None:
            return (
                f"other JIT kernels compiled at start-up: not read ({printable(self.why_unread)})"
            )
        counts = ", ".join(
            f"{cache.label} {len(self.by_cache.get(cache.key, []))}" for cache in self.caches
        )
        names = sorted({n for found in self.by_cache.values() for n in found})
        # The container's file names: what it chose to call them, shown escaped.
        shown = printable(", ".join(names[:8]), 600)
        tail = f" ({shown}{', ...' if len(names) > 8 else ''})" if names else ""
        return f"other JIT kernels compiled at start-up: {counts}{tail}"

    @property
    def total(self) -> int:
        return sum(len(found) for found in (self.by_cache or {}).values())


def compiled_in_container(container, engine: Engine) -> RuntimeCompiles:
    """The kernels in `engine`'s JIT caches written since the container last started."""
    caches = engine.jit_caches
    container.reload()
    if container.status != "running":
        why = f"container {container.status}: its caches are read while it runs"
        return RuntimeCompiles(caches, None, why)
    roots = engine.jit_cache_roots(_environment(container))
    listed = {cache.key: [roots[cache.key], list(cache.suffixes)] for cache in caches}
    # A second's slack: file times and the engine's start time come from one clock, but
    # the first compile can land within the second the engine records.
    since = docker_client.started_at(container).timestamp() - 1.0
    try:
        result = container.exec_run(
            ["python3", "-c", _LIST_NEWER, json.dumps(listed), repr(since)], demux=True
        )
    except APIError as exc:
        return RuntimeCompiles(caches, None, f"docker exec failed: {exc.explanation or exc}")
    stdout, stderr = result.output
    if result.exit_code != 0:
        last = (stderr or stdout or b"").decode(errors="replace").strip().splitlines()[-1:]
        why = f"python3 in the container: {' '.join(last) or 'failed'}"
        return RuntimeCompiles(caches, None, why)
    try:  # the container's python3 answers: what it says is not believed blind
        found = json.loads(stdout)
        return RuntimeCompiles(
            caches,
            {
                cache.key: sorted({kernel_name(cache, p) for p in found[cache.key]})
                for cache in caches
            },
        )
    except (ValueError, TypeError, AttributeError, RecursionError, KeyError):
        why = "python3 in the container answered no list of kernel files"
        return RuntimeCompiles(caches, None, why)
