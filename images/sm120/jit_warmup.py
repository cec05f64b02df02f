"""Pre-compile FlashInfer JIT modules inside the image build, without a GPU.

Runs in the image with only the standard library and the installed flashinfer. For each
generator `package.module:function` it writes the module's ninja file (exactly what
FlashInfer would write at run time), then runs the same `ninja -C <dir>` FlashInfer runs, in
parallel, so each module's own build log says "up to date" when a server starts. The first
module that fails stops every other compile at once and prints that module's compiler
output. Then it proves the result: every module's .so exists, a module with CUDA sources
holds code for every requested arch (cuobjdump), a host-only module (spdlog) is recorded as
such, and ninja has no work left. The inventory (with the nvcc version) goes to --inventory.

    FLASHINFER_CUDA_ARCH_LIST=12.0a python jit_warmup.py --modules '["a:gen_x", "b:gen_y(1)"]' \
        --jobs 0 --job-memory-gb 6 --inventory /opt/builder/jit-inventory.json
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
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


def generator_argument(node: ast.expr, entry: str):
    """A literal, or `torch.<dtype>`: all a FlashInfer generator takes for its module's shape."""
    if isinstance(node, ast.Constant):
        return node.value
    torch_name = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    if torch_name and node.value.id == "torch":
        import torch

        return getattr(torch, node.attr)
    fail(f"module entry '{entry}': arguments must be literals or torch.<dtype>")


def load_spec(entry: str):
    """`package.module:gen_function` or `package.module:gen_function(arg, ...)` -> JitSpec."""
    module_name, _, call = entry.partition(":")
    try:
        parsed = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        parsed = None
    if isinstance(parsed, ast.Name):
        parsed = ast.Call(func=parsed, args=[], keywords=[])
    if not module_name or not isinstance(parsed, ast.Call) or not isinstance(parsed.func, ast.Name):
        fail(f"module entry '{entry}' must look like package.module:gen_function(args)")
    try:
        generator = getattr(importlib.import_module(module_name), parsed.func.id)
    except (ImportError, AttributeError) as exc:
        fail(f"cannot load generator {entry}: {exc}")
    args = [generator_argument(node, entry) for node in parsed.args]
    kwargs = {kw.arg: generator_argument(kw.value, entry) for kw in parsed.keywords}
    return generator(*args, **kwargs)


def ninja_command(spec, jobs: int, *extra: str) -> list[str]:
    return ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", str(jobs), *extra]


class FirstFailure:
    """Runs each module's ninja in its own process group; the first failure kills the rest."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}
        self.failed: tuple[str, str] | None = None

    def compile(self, qualified: str, spec, jobs: int) -> float:
        started = time.monotonic()
        spec.write_ninja()
        with self.lock:
            if self.failed:
                return 0.0
            process = subprocess.Popen(
                ninja_command(spec, jobs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, start_new_session=True,
            )  # fmt: skip
            self.running[qualified] = process
        output, _ = process.communicate()
        with self.lock:
            del self.running[qualified]
            if process.returncode and not self.failed:
                self.failed = (qualified, output)
                for other in self.running.values():
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(other.pid, signal.SIGKILL)
        return time.monotonic() - started


def cuobjdump_path() -> str:
    found = shutil.which("cuobjdump") or os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"
    )
    if not os.path.exists(found):
        fail("cuobjdump not found: cannot prove which GPU code the modules hold")
    return found


def elf_arches(library: Path) -> list[str]:
    """The sm_XX code in a module; [] for a module with no device code at all."""
    result = subprocess.run(
        [cuobjdump_path(), "--list-elf", str(library)], capture_output=True, text=True
    )
    if result.returncode:
        if "does not contain device code" in result.stderr + result.stdout:
            return []
        fail(f"cuobjdump --list-elf {library} failed: {result.stderr.strip()}")
    arches = set()
    for line in result.stdout.splitlines():
        for part in line.replace(".", " ").split():
            if part.startswith("sm_"):
                arches.add(part)
    return sorted(arches)


def nvcc_version() -> str:
    """`13.0.88` from `nvcc --version`: the compiler that produced every module."""
    nvcc = (
        os.environ.get("FLASHINFER_NVCC")
        or shutil.which("nvcc")
        or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    )
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError as exc:
        fail(f"cannot run nvcc ({nvcc}): {exc}")
    found = re.search(r"V(\d+\.\d+\.\d+)", text)
    if not found:
        fail(f"cannot read the nvcc version from `{nvcc} --version`: {text.strip()[-200:]}")
    return found.group(1)


def prove(
    label: str,
    name: str,
    build_dir: Path,
    wanted: list[str],
    seconds: float,
    source: str,
    *,
    expects_device_code: bool,
) -> dict:
    """The inventory entry of a module, once its .so, its GPU code and ninja's verdict are
    checked: what FlashInfer will find at run time without compiling."""
    library = build_dir / f"{name}.so"
    if not library.is_file():
        fail(f"{label}: {library} is missing after the build")
    arches = elf_arches(library)
    missing = [arch for arch in wanted if arch not in arches]
    if (arches or expects_device_code) and missing:
        fail(f"{label}: {library.name} holds {arches or 'no GPU code'}, not {missing}")
    dry_run = subprocess.run(
        ["ninja", "-C", str(build_dir), "-f", str(build_dir / "build.ninja"), "-n"],
        capture_output=True,
        text=True,
    )
    if "no work to do" not in dry_run.stdout:
        fail(f"{label}: ninja still has work after the build:\n{dry_run.stdout[-2000:]}")
    workspace = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home()))
    return {
        "module": label,
        "name": name,
        "file": str(library.relative_to(workspace))
        if library.is_relative_to(workspace)
        else str(library),
        "size": library.stat().st_size,
        "sha256": sha256(library),
        "arch": arches,
        "device_code": bool(arches),
        "compile_seconds": round(seconds, 1),
        "source": source,
    }


# Before any module is compiled or unpacked: an old, fixed mtime on the files a module's
# build reads from this stage. A kernel pack's object files keep the mtimes they were
# compiled with, at run time in another container; ninja would call them stale next to
# headers installed later, when this stage is built.
_OLD_MTIME = 946684800  # 2000-01-01


def age_build_inputs() -> None:
    import flashinfer
    import tvm_ffi

    for package in (flashinfer, tvm_ffi):
        for path in Path(package.__file__).parent.rglob("*"):
            if path.is_file() and not path.is_symlink():
                os.utime(path, (_OLD_MTIME, _OLD_MTIME))


_PACK_FOLDERS = ("cached_ops", "generated")  # relative to FlashInfer's <version>/<arch>/


def bake_packs(directory: Path) -> dict[str, str]:
    """Unpack every kernel pack in `directory` into FlashInfer's workspace, each file
    checked against the sha256 in its pack.json; a pack for another flashinfer build or
    arch is refused. Returns {module name: pack file name}."""
    import flashinfer
    from flashinfer.jit import env as jit_env

    arch_root = Path(jit_env.FLASHINFER_JIT_DIR).parent
    baked = {}
    for pack in sorted(directory.glob("*.kernel-pack.tar")):
        with tarfile.open(pack) as tar:
            record = json.load(tar.extractfile("pack.json"))
            if (record["flashinfer_version"], record["arch"]) != (
                flashinfer.__version__,
                arch_root.name,
            ):
                fail(
                    f"kernel pack {pack.name} is for flashinfer {record['flashinfer_version']} "
                    f"arch {record['arch']}; this image has {flashinfer.__version__} "
                    f"arch {arch_root.name}"
                )
            for member in tar:
                if member.name == "pack.json":
                    continue
                expected = record["files"].get(member.name)
                parts = Path(member.name).parts
                allowed = parts and parts[0] in _PACK_FOLDERS and ".." not in parts
                if not member.isfile() or expected is None or not allowed:
                    fail(f"kernel pack {pack.name}: unexpected entry {member.name}")
                data = tar.extractfile(member).read()
                if hashlib.sha256(data).hexdigest() != expected:
                    fail(f"kernel pack {pack.name}: {member.name} does not match its sha256")
                target = arch_root / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                target.chmod(member.mode & 0o777)
                os.utime(target, (member.mtime, member.mtime))
        for module in record["modules"]:
            baked[module] = pack.name
        print(f"jit-warmup: unpacked {', '.join(record['modules'])} from {pack.name}", flush=True)
    return baked


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modules", required=True, help='JSON list of "package.module:gen_function(args)"'
    )
    parser.add_argument(
        "--jobs", type=int, default=0, help="compile jobs (0: from cores and memory)"
    )
    parser.add_argument("--job-memory-gb", type=float, default=6.0, help="peak memory per job")
    parser.add_argument("--inventory", required=True, type=Path)
    parser.add_argument(
        "--packs", type=Path, help="folder of kernel packs (builder jit harvest) to unpack first"
    )
    args = parser.parse_args()

    arch_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").split()
    if not arch_list:
        fail("FLASHINFER_CUDA_ARCH_LIST is empty: with no GPU every module would fail (sm75)")
    wanted = ["sm_" + arch.replace(".", "") for arch in arch_list]
    try:
        names = [str(m).strip() for m in json.loads(args.modules) if str(m).strip()]
    except (ValueError, TypeError):
        fail(f"--modules must be a JSON list of generator entries, not {args.modules!r}")
    if not names:
        fail("--modules is empty")

    jobs, why = job_budget(args.jobs, args.job_memory_gb)
    compiler = nvcc_version()
    age_build_inputs()
    baked = bake_packs(args.packs) if args.packs and args.packs.is_dir() else {}
    specs = {name: load_spec(name) for name in names}
    # Split the job budget between modules compiled at once; each ninja gets a share.
    at_once = min(jobs, len(specs))
    per_module = max(1, jobs // at_once)
    print(
        f"jit-warmup: {len(specs)} modules for {' '.join(arch_list)} with nvcc {compiler}, "
        f"jobs {why}",
        flush=True,
    )

    started = time.monotonic()
    seconds: dict[str, float] = {}
    builds = FirstFailure()
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {pool.submit(builds.compile, n, s, per_module): n for n, s in specs.items()}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            seconds[name] = future.result()
            if builds.failed:
                for pending in futures:
                    pending.cancel()
                failed, output = builds.failed
                tail = "\n".join(output.splitlines()[-25:])
                fail(
                    f"{failed} ({specs[failed].name}) failed to compile; other compiles "
                    f"stopped:\n{tail}"
                )
            print(f"jit-warmup: {name} compiled in {seconds[name]:.1f} s", flush=True)

    inventory = [
        prove(name, spec.name, Path(spec.build_dir), wanted, seconds[name],
              f"pack:{baked[spec.name]}" if spec.name in baked else "compiled",
              expects_device_code=any(Path(src).suffix == ".cu" for src in spec.sources))
        for name, spec in specs.items()
    ]  # fmt: skip
    from flashinfer.jit import env as jit_env

    listed = {entry["name"] for entry in inventory}
    for module, pack in baked.items():
        if module not in listed:
            build_dir = Path(jit_env.FLASHINFER_JIT_DIR) / module
            device = ": cuda_compile " in (build_dir / "build.ninja").read_text()
            inventory.append(
                prove(f"kernel pack {pack}", module, build_dir, wanted, 0.0, f"pack:{pack}",
                      expects_device_code=device)
            )  # fmt: skip
    args.inventory.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "arch_list": arch_list,
        "nvcc_version": compiler,
        "jobs": jobs,
        "seconds": round(time.monotonic() - started, 1),
        "modules": inventory,
    }
    args.inventory.write_text(json.dumps(result, indent=2) + "\n")
    print(f"jit-warmup: done in {result['seconds']} s: {args.inventory}", flush=True)


if __name__ == "__main__":
    main()
