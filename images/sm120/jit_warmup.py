"""Pre-compile FlashInfer JIT modules inside the image build, without a GPU.

Runs in the image with only the standard library and the installed flashinfer. For each
generator `package.module:function` it writes the module's ninja file (exactly what
FlashInfer would write at run time), then runs the same `ninja -C <dir>` FlashInfer runs, in
parallel, so each module's own build log says "up to date" when a server starts. Then it
proves the result: every module's .so exists, holds code for every requested arch
(cuobjdump), and ninja has no work left. The inventory goes to --inventory as JSON.

    FLASHINFER_CUDA_ARCH_LIST=12.0a python jit_warmup.py --modules a:gen_x,b:gen_y \
        --jobs 0 --job-memory-gb 6 --inventory /opt/builder/jit-inventory.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def fail(message: str) -> None:
    print(f"jit-warmup: error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def memory_bytes() -> int:
    """Memory this build may use: the cgroup limit if there is one, else MemAvailable."""
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def job_budget(requested: int, job_memory_gb: float) -> tuple[int, str]:
    cores = len(os.sched_getaffinity(0))
    by_memory = max(1, int(memory_bytes() / (job_memory_gb * (1 << 30))))
    if requested > 0:
        return requested, f"{requested} (requested)"
    jobs = max(1, min(cores, by_memory))
    return jobs, f"{jobs} (cores {cores}, memory allows {by_memory} at {job_memory_gb} GB/job)"


def load_spec(qualified: str):
    module_name, _, function = qualified.partition(":")
    if not function:
        fail(f"module entry '{qualified}' must look like package.module:gen_function")
    try:
        generator = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        fail(f"cannot load generator {qualified}: {exc}")
    return generator()


def ninja_command(spec, jobs: int, *extra: str) -> list[str]:
    return ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", str(jobs), *extra]


def compile_module(qualified: str, spec, jobs: int) -> float:
    started = time.monotonic()
    spec.write_ninja()
    result = subprocess.run(ninja_command(spec, jobs), capture_output=True, text=True)
    if result.returncode:
        tail = "\n".join(result.stdout.splitlines()[-25:])
        fail(f"{qualified} ({spec.name}) failed to compile:\n{tail}")
    return time.monotonic() - started


def elf_arches(library: Path) -> list[str]:
    cuobjdump = shutil.which("cuobjdump") or os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"
    )
    if not os.path.exists(cuobjdump):
        fail("cuobjdump not found: cannot prove which GPU code the modules hold")
    result = subprocess.run([cuobjdump, "--list-elf", str(library)], capture_output=True, text=True)
    if result.returncode:
        fail(f"cuobjdump --list-elf {library} failed: {result.stderr.strip()}")
    arches = set()
    for line in result.stdout.splitlines():
        for part in line.replace(".", " ").split():
            if part.startswith("sm_"):
                arches.add(part)
    return sorted(arches)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", required=True, help="comma-separated package.module:function")
    parser.add_argument(
        "--jobs", type=int, default=0, help="compile jobs (0: from cores and memory)"
    )
    parser.add_argument("--job-memory-gb", type=float, default=6.0, help="peak memory per job")
    parser.add_argument("--inventory", required=True, type=Path)
    args = parser.parse_args()

    arch_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").split()
    if not arch_list:
        fail("FLASHINFER_CUDA_ARCH_LIST is empty: with no GPU every module would fail (sm75)")
    wanted = ["sm_" + arch.replace(".", "") for arch in arch_list]
    names = [m.strip() for m in args.modules.split(",") if m.strip()]
    if not names:
        fail("--modules is empty")

    jobs, why = job_budget(args.jobs, args.job_memory_gb)
    specs = {name: load_spec(name) for name in names}
    # Split the job budget between modules compiled at once; each ninja gets a share.
    at_once = min(jobs, len(specs))
    per_module = max(1, jobs // at_once)
    print(f"jit-warmup: {len(specs)} modules for {' '.join(arch_list)}, jobs {why}", flush=True)

    started = time.monotonic()
    seconds: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {pool.submit(compile_module, n, s, per_module): n for n, s in specs.items()}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            seconds[name] = future.result()
            print(f"jit-warmup: {name} compiled in {seconds[name]:.1f} s", flush=True)

    inventory = []
    workspace = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home()))
    for name, spec in specs.items():
        library = Path(spec.jit_library_path)
        if not library.is_file():
            fail(f"{name}: {library} is missing after the build")
        arches = elf_arches(library)
        missing = [arch for arch in wanted if arch not in arches]
        if missing:
            fail(f"{name}: {library.name} holds {arches or 'no GPU code'}, not {missing}")
        dry_run = subprocess.run(ninja_command(spec, 1, "-n"), capture_output=True, text=True)
        if "no work to do" not in dry_run.stdout:
            fail(f"{name}: ninja still has work after the build:\n{dry_run.stdout[-2000:]}")
        inventory.append(
            {
                "module": name,
                "name": spec.name,
                "file": str(library.relative_to(workspace))
                if library.is_relative_to(workspace)
                else str(library),
                "size": library.stat().st_size,
                "sha256": sha256(library),
                "arch": arches,
                "compile_seconds": round(seconds[name], 1),
            }
        )
    args.inventory.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "arch_list": arch_list,
        "jobs": jobs,
        "seconds": round(time.monotonic() - started, 1),
        "modules": inventory,
    }
    args.inventory.write_text(json.dumps(result, indent=2) + "\n")
    print(f"jit-warmup: done in {result['seconds']} s: {args.inventory}", flush=True)


if __name__ == "__main__":
    main()
