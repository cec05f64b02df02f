"""Kernels a server compiled at start-up outside FlashInfer: DeepGEMM, sglang's own JIT, Triton.

FlashInfer's modules are found by `kernels.packs.compiled_in_container` (the image's workspace
against the container's). The other JITs of sglang 0.5.23 write under its cache folder,
which a profile keeps on a host volume (so a host compiles each kernel once), where
`docker diff` sees nothing. So these are found by their files' times: a `.so` or `.cubin`
written since the container (last) started was compiled by this start. Reading them needs
the container running (one `python3` in it); a stopped container's answer is None.

Cache folders, as sglang 0.5.23 resolves them (`srt/environ.py:1373-1397,2308-2321`,
`srt/layers/deep_gemm_wrapper/compile_utils.py:49-51`, `kernels/jit/utils/compile/cache.py:318`):
DeepGEMM `$DG_JIT_CACHE_DIR`, else `$SGLANG_DG_CACHE_DIR`, else `$SGLANG_CACHE_DIR/deep_gemm`;
sglang's JIT `$SGLANG_JIT_CACHE_DIR`, else `~/.cache/sglang/jit`; Triton `$TRITON_CACHE_DIR`,
else `$SGLANG_CACHE_DIR/triton`; `$SGLANG_CACHE_DIR` defaults to `~/.cache/sglang`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePosixPath

from docker.errors import APIError

from builder.core import docker_client
from builder.core.untrusted import printable

# Name as reports print it -> where its files live, read from the container's environment.
CACHES = {"DeepGEMM": "deep_gemm", "sglang JIT": "sglang_jit", "Triton": "triton"}
KERNEL_SUFFIXES = (".so", ".cubin")

# Run inside the container: every kernel file under the roots written at or after `since`.
_LIST_NEWER = r"""
import json, os, sys
roots, since, suffixes = json.loads(sys.argv[1]), float(sys.argv[2]), tuple(sys.argv[3:])
found = {}
for cache, root in roots.items():
    found[cache] = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:  # a build's staging folder may vanish under the walk
                written = os.stat(path).st_mtime
            except OSError:
                continue
            if name.endswith(suffixes) and written >= since:
                found[cache].append(os.path.relpath(path, root))
print(json.dumps(found))
"""


def _environment(container) -> dict[str, str]:
    # `-e NAME` with NAME unset on the host leaves a bare "NAME": no value.
    pairs = (item.partition("=") for item in container.attrs["Config"].get("Env") or [])
    return {name: value for name, sep, value in pairs if sep}


def cache_roots(env: dict[str, str]) -> dict[str, str]:
    """Each cache's folder inside the container, from its environment and sglang's defaults."""

    def expand(path: str) -> str:
        home = env.get("HOME") or "/root"
        return home + path[1:] if path == "~" or path.startswith("~/") else path

    sglang_cache = expand(env.get("SGLANG_CACHE_DIR") or "~/.cache/sglang")
    return {
        "deep_gemm": expand(
            env.get("DG_JIT_CACHE_DIR")
            or env.get("SGLANG_DG_CACHE_DIR")
            or f"{sglang_cache}/deep_gemm"
        ),
        "sglang_jit": expand(env.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit"),
        "triton": expand(env.get("TRITON_CACHE_DIR") or f"{sglang_cache}/triton"),
    }


def kernel_name(cache: str, relative: str) -> str:
    """A readable name for one compiled file: DeepGEMM's kernel folder
    (`cache/kernel.<name>.<hash>/kernel.cubin`), sglang's module (`<target>/<module>/...`),
    Triton's kernel (`<hash>/<kernel>.cubin`)."""
    parts = PurePosixPath(relative).parts
    if cache == "deep_gemm" and len(parts) >= 2:
        return parts[-2]
    if cache == "sglang_jit" and len(parts) >= 2:
        return parts[1]
    return PurePosixPath(relative).stem


@dataclass(frozen=True)
class RuntimeCompiles:
    """Per cache (keys of CACHES' values), the kernels this start compiled; None: not read."""

    by_cache: dict[str, list[str]] | None
    why_unread: str = ""

    def to_json(self) -> dict[str, list[str] | None]:
        caches = CACHES.values()
        if self.by_cache is None:
            return dict.fromkeys(caches)
        return {cache: self.by_cache.get(cache, []) for cache in caches}

    def summary(self) -> str:
        if self.by_cache is None:
            return (
                f"other JIT kernels compiled at start-up: not read ({printable(self.why_unread)})"
            )
        counts = ", ".join(
            f"{label} {len(self.by_cache.get(cache, []))}" for label, cache in CACHES.items()
        )
        names = sorted({n for found in self.by_cache.values() for n in found})
        # The container's file names: what it chose to call them, shown escaped.
        shown = printable(", ".join(names[:8]), 600)
        tail = f" ({shown}{', ...' if len(names) > 8 else ''})" if names else ""
        return f"other JIT kernels compiled at start-up: {counts}{tail}"

    @property
    def total(self) -> int:
        return sum(len(found) for found in (self.by_cache or {}).values())


def compiled_in_container(container) -> RuntimeCompiles:
    """DeepGEMM, sglang JIT and Triton kernels written since the container last started."""
    container.reload()
    if container.status != "running":
        why = f"container {container.status}: its caches are read while it runs"
        return RuntimeCompiles(None, why)
    roots = cache_roots(_environment(container))
    # A second's slack: file times and the engine's start time come from one clock, but
    # the first compile can land within the second the engine records.
    since = docker_client.started_at(container).timestamp() - 1.0
    try:
        result = container.exec_run(
            ["python3", "-c", _LIST_NEWER, json.dumps(roots), repr(since), *KERNEL_SUFFIXES],
            demux=True,
        )
    except APIError as exc:
        return RuntimeCompiles(None, f"docker exec failed: {exc.explanation or exc}")
    stdout, stderr = result.output
    if result.exit_code != 0:
        last = (stderr or stdout or b"").decode(errors="replace").strip().splitlines()[-1:]
        return RuntimeCompiles(None, f"python3 in the container: {' '.join(last) or 'failed'}")
    try:  # the container's python3 answers: what it says is not believed blind
        found = json.loads(stdout)
        return RuntimeCompiles(
            {
                cache: sorted({kernel_name(cache, p) for p in files})
                for cache, files in found.items()
            }
        )
    except (ValueError, TypeError, AttributeError, RecursionError):
        return RuntimeCompiles(None, "python3 in the container answered no list of kernel files")
