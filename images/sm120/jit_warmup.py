"""Pre-compile FlashInfer JIT modules without a GPU, reusing every module whose inputs are
unchanged; and check an image's installed kernels.

Runs with only the standard library and the installed flashinfer (in the image's
kernel-builder stage, or on a GPU host). For each generator `package.module:function` it
writes the module's ninja file (exactly what FlashInfer writes at run time) and computes the
module's lookup key: the module name, that ninja file (compile flags, arch, source paths),
the contents of its sources (generated ones included), the nvcc version and the arch list.
An entry (`--entries`, `<lookup>.<key>.kernel.tar`) of an earlier build is reused when every
file it recorded as an input (the sources and every header nvcc read, from ninja's deps)
still has the same sha256; otherwise the module compiles, in parallel with the others, with
the same `ninja -C <dir>` FlashInfer runs. The first failure stops every other compile and
prints that module's compiler output. Each result is proved (its .so, its GPU code per arch
by cuobjdump, ninja has no work left) and written to --inventory; with --out, every
module's .so and an entry for each newly compiled module go there too.

    FLASHINFER_CUDA_ARCH_LIST=12.0f python jit_warmup.py --modules '["a:gen_x", "b:gen_y(1)"]' \
        --entries /in --out /out --inventory /out/inventory.json

--plan only decides (reuse or compile, and why). --check runs where the kernel wheel is
installed: every module must load from FlashInfer's AOT folder, byte for byte as built.
--await-entries prints each module's lookup key (`jit-warmup: lookups [...]`) and waits for
`<entries>/.ready` before deciding: builder then brings the entries for those keys into
this same container, so a build that compiles nothing costs one container start.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import hashlib
import importlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
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


_PLAIN_STRING = re.compile(r"[A-Za-z0-9_.]{0,64}")  # a harvested call's strings (jit_journal.py)


def generator_argument(node: ast.expr, entry: str, pack: str = ""):
    """A literal (a number may be negative), or `torch.<dtype>`: all a FlashInfer generator
    takes for its module's shape. A harvested call (`pack`: "kernel pack NAME: "): strings
    are short identifiers, and a refusal names the pack."""
    plain = bool(pack)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        if isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
            return -node.operand.value
    elif isinstance(node, ast.Constant):
        value = node.value
        if not (plain and isinstance(value, str) and not _PLAIN_STRING.fullmatch(value)):
            return value
    elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "torch":
        import torch

        value = getattr(torch, node.attr, None)
        if isinstance(value, torch.dtype):
            return value
    fail(f"{pack}module entry '{entry}': arguments must be literals or torch.<dtype>")


def load_spec(entry: str, harvested: dict | None = None):
    """`package.module:gen_function` or `package.module:gen_function(arg, ...)` -> JitSpec.
    A `harvested` entry (from a kernel pack) must be a plain call of a `flashinfer.jit`
    generator (not `gen_customize_*`: those take C++ source) that makes the module the pack
    names."""
    module_name, _, call = entry.partition(":")
    plain = harvested is not None
    pack = f"kernel pack {harvested['pack']}: " if plain else ""  # the host moves it aside
    if plain and not (
        module_name.startswith("flashinfer.jit.")
        and call.strip().startswith("gen_")
        and "customize" not in call.split("(")[0]
    ):
        fail(f"{pack}{entry} is not a FlashInfer generator: refused")
    try:
        parsed = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        parsed = None
    if isinstance(parsed, ast.Name):
        parsed = ast.Call(func=parsed, args=[], keywords=[])
    if not module_name or not isinstance(parsed, ast.Call) or not isinstance(parsed.func, ast.Name):
        fail(f"{pack}module entry '{entry}' must look like package.module:gen_function(args)")
    try:
        generator = getattr(importlib.import_module(module_name), parsed.func.id)
    except (ImportError, AttributeError) as exc:
        fail(f"{pack}cannot load generator {entry}: {exc}")
    args = [generator_argument(node, entry, pack) for node in parsed.args]
    kwargs = {kw.arg: generator_argument(kw.value, entry, pack) for kw in parsed.keywords}
    if not plain:
        return generator(*args, **kwargs)
    try:  # a pack's call with arguments this flashinfer's generator does not take
        spec = generator(*args, **kwargs)
    except Exception as exc:  # named, with the pack, in one line
        fail(f"{pack}{entry} failed: {exc.__class__.__name__}: {str(exc)[:200]}")
    if spec.name != harvested["name"]:
        fail(f"{pack}{entry} makes module {spec.name}, not {harvested['name']}: refused")
    return spec


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
    """The GPU code in a module, one name per arch (sm_90a, sm_120f); [] for a module with no
    device code at all. `cuobjdump --list-elf` names a family-specific cubin (code=sm_120f,
    what CUDA >= 12.9 builds for SM120) after its base arch (sm_120); the arch ptxas built
    it for is in the cubin's tool note (`-arch sm_120f`), so those cubins are read."""
    cuobjdump = cuobjdump_path()
    result = subprocess.run([cuobjdump, "--list-elf", str(library)], capture_output=True, text=True)
    if result.returncode:
        if "does not contain device code" in result.stderr + result.stdout:
            return []
        fail(f"cuobjdump --list-elf {library} failed: {result.stderr.strip()}")
    listed = set()
    for line in result.stdout.splitlines():
        for part in line.replace(".", " ").split():
            if part.startswith("sm_"):
                listed.add(part)
    bare = sorted(arch for arch in listed if arch[-1].isdigit())
    if not bare:
        return sorted(listed)
    arches = listed - set(bare)
    with tempfile.TemporaryDirectory(prefix="jit-warmup-elf-") as tmp:
        for arch in bare:
            extracted = subprocess.run(
                [cuobjdump, "-xelf", f".{arch}.cubin", str(library.resolve())],
                cwd=tmp, capture_output=True, text=True,
            )  # fmt: skip
            if extracted.returncode:
                fail(f"cuobjdump -xelf {library} failed: {extracted.stderr.strip()}")
            cubins = sorted(Path(tmp).glob(f"*.{arch}.cubin"))
            for cubin in cubins:
                note = _TOOL_ARCH.search(cubin.read_bytes())
                arches.add(note.group(1).decode() if note else arch)
                cubin.unlink()
            if not cubins:
                arches.add(arch)
    return sorted(arches)


# ptxas's command line, kept in every cubin's .note.nv.tkinfo: "-arch sm_120f -m 64".
_TOOL_ARCH = re.compile(rb"-arch (sm_[0-9]+[af]?)(?![0-9A-Za-z])")


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


def library_record(
    label: str, name: str, library: Path, wanted: list[str], *, expects_device_code: bool
) -> dict:
    """A module's .so as the inventory lists it, once its GPU code is checked per arch."""
    if not library.is_file():
        fail(f"{label}: {library} is missing")
    arches = elf_arches(library)
    missing = [arch for arch in wanted if arch not in arches]
    if (arches or expects_device_code) and missing:
        fail(f"{label}: {library.name} holds {arches or 'no GPU code'}, not {missing}")
    return {
        "module": label,
        "name": name,
        "file": f"{name}/{name}.so",  # in FlashInfer's AOT folder (the kernel wheel)
        "size": library.stat().st_size,
        "sha256": sha256(library),
        "arch": arches,
        "device_code": bool(arches),
    }


def prove(
    label: str, name: str, build_dir: Path, wanted: list[str], *, expects_device_code: bool
) -> dict:
    """The record of a module just built here, once ninja also says it has no work left."""
    record = library_record(
        label, name, build_dir / f"{name}.so", wanted, expects_device_code=expects_device_code
    )
    dry_run = subprocess.run(
        ["ninja", "-C", str(build_dir), "-f", str(build_dir / "build.ninja"), "-n"],
        capture_output=True,
        text=True,
    )
    if "no work to do" not in dry_run.stdout:
        fail(f"{label}: ninja still has work after the build:\n{dry_run.stdout[-2000:]}")
    return record


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


ENTRY_SUFFIX = ".kernel.tar"
ENTRY_SCHEMA = 1
_ENTRY_LIMIT = 1 << 30  # as builder/build/kernels/cache.py's ENTRY_LIMIT


_WORKSPACE = "<flashinfer-workspace>"


def workspace_dir() -> str:
    """FlashInfer's `<base>/.cache/flashinfer/<flashinfer version>/<arch>`: build folders and
    generated sources live there, so its name changes with every flashinfer build."""
    from flashinfer.jit import env as jit_env

    return str(jit_env.FLASHINFER_WORKSPACE_DIR)


def portable(text: str) -> str:
    """Paths as keys and entries hold them: the same module of another flashinfer build
    (same sources, flags and headers) has the same key."""
    return text.replace(workspace_dir(), _WORKSPACE)


def local(path: str) -> Path:
    return Path(path.replace(_WORKSPACE, workspace_dir()))


def lookup_key(spec, compiler: str, arch_list: list[str]) -> str:
    """What names a module's entry before anything compiles: its ninja file (flags, arch,
    source paths), its sources' contents, nvcc and the arch list. Headers are checked after
    the lookup, against the entry's recorded inputs."""
    spec.write_ninja()
    record = {
        "name": spec.name,
        "ninja": portable(Path(spec.ninja_path).read_text()),
        "sources": {portable(str(s)): sha256(Path(s)) for s in sorted(map(str, spec.sources))},
        "nvcc": compiler,
        "arch_list": arch_list,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def recorded_inputs(spec) -> dict[str, str]:
    """Every file the compile read, as ninja's deps log holds it (nvcc's dependency output:
    sources and every header, system ones included), with its sha256."""
    result = subprocess.run(
        ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-t", "deps"],
        capture_output=True,
        text=True,
    )
    if result.returncode:
        fail(f"{spec.name}: `ninja -t deps` failed: {result.stderr.strip()}")
    paths = {str(s) for s in spec.sources}
    paths.update(line.strip() for line in result.stdout.splitlines() if line.startswith(" "))
    return {portable(path): sha256(Path(path)) for path in sorted(paths) if Path(path).is_file()}


def content_key(lookup: str, inputs: dict[str, str]) -> str:
    """The module's key: its lookup key and the contents of every input."""
    body = json.dumps({"lookup": lookup, "inputs": inputs}, sort_keys=True).encode()
    return hashlib.sha256(body).hexdigest()


def read_entry(
    path: Path, name: str, lookup: str | None = None, sources: list[str] | None = None
) -> tuple[dict | None, bytes, str]:
    """(record, .so bytes, "") of a usable entry, or (None, b"", why it cannot be used).
    An entry is data from a shared cache: it must be for the lookup key being served and
    record, among its inputs, every source this build compiles (an entry that lists no
    input would be "unchanged" for any build)."""
    if path.is_symlink() or not path.is_file():
        return None, b"", f"entry {path.name} is not a regular file"
    try:
        with tarfile.open(path) as tar:
            members = [tar.getmember("entry.json"), tar.getmember(f"{name}.so")]
            if not all(m.isfile() and m.size <= _ENTRY_LIMIT for m in members):
                return None, b"", f"entry {path.name} holds a link, a folder or a file too large"
            record = json.load(tar.extractfile(members[0]))
            library = tar.extractfile(members[1]).read()
    except (OSError, tarfile.TarError, KeyError, ValueError, AttributeError) as exc:
        return None, b"", f"entry {path.name} unreadable ({exc.__class__.__name__})"
    shaped = (
        isinstance(record, dict)
        and isinstance(record.get("lookup"), str)
        and isinstance(record.get("inputs"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in record["inputs"].items())
    )
    if not shaped or record.get("schema_version") != ENTRY_SCHEMA or record.get("name") != name:
        return None, b"", f"entry {path.name} is not an entry for {name}"
    if hashlib.sha256(library).hexdigest() != record.get("sha256"):
        return None, b"", f"entry {path.name}: {name}.so does not match its sha256"
    if content_key(record["lookup"], record["inputs"]) != record.get("key"):
        return None, b"", f"entry {path.name}: its key does not match its inputs"
    if lookup is not None and record.get("lookup") != lookup:
        return None, b"", f"entry {path.name} is for another lookup key"
    inputs = record.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        return None, b"", f"entry {path.name} records no inputs"
    missing = [source for source in sources or [] if source not in inputs]
    if missing:
        return None, b"", f"entry {path.name} does not record its source {missing[0]}"
    return record, library, ""


def changed_inputs(record: dict) -> list[str]:
    return [
        path
        for path, digest in record["inputs"].items()
        if not local(path).is_file() or sha256(local(path)) != digest
    ]


def write_entry(out: Path, record: dict, library: Path) -> Path:
    """`<lookup key>.<key>.kernel.tar`: entry.json (key, inputs, sha256) and the .so."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['lookup']}.{record['key'][:16]}{ENTRY_SUFFIX}"
    body = json.dumps(record, indent=2, sort_keys=True).encode() + b"\n"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("entry.json")
        info.size, info.mode = len(body), 0o644
        tar.addfile(info, io.BytesIO(body))
        info = tarfile.TarInfo(f"{record['name']}.so")
        info.size, info.mode = library.stat().st_size, 0o755
        with library.open("rb") as handle:
            tar.addfile(info, handle)
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def has_device_code(spec) -> bool:
    return any(Path(src).suffix == ".cu" for src in spec.sources)


def decide(spec, lookup: str, entries: Path | None) -> tuple[dict | None, bytes, str]:
    """(entry record, .so bytes, why) to reuse a module, or (None, b"", why) to compile it.
    Several entries may share a lookup key (one per header variant): the one whose every
    recorded input is unchanged is reused."""
    candidates = sorted(entries.glob(f"{lookup}.*{ENTRY_SUFFIX}")) if entries else []
    if not candidates:
        return None, b"", "compile: no entry with this key"
    why = ""
    for path in candidates:
        sources = [portable(str(source)) for source in spec.sources]
        record, library, problem = read_entry(path, spec.name, lookup, sources)
        if problem:
            print(f"jit-warmup: warning: {problem}; compiling {spec.name} again", flush=True)
            why = why or f"compile: {problem}"
            continue
        changed = changed_inputs(record)
        if not changed:
            return record, library, f"reuse: its {len(record['inputs'])} inputs are unchanged"
        why = why or f"compile: {len(changed)} input(s) changed, first {changed[0]}"
    return None, b"", why


def compile_all(specs: dict, jobs: int, harvested: dict | None = None) -> dict[str, float]:
    """Compile every module in parallel (its own share of the jobs); seconds per module. A
    harvested module that fails names its kernel pack (the host then moves it aside)."""
    seconds: dict[str, float] = {}
    if not specs:
        return seconds
    at_once = min(jobs, len(specs))
    per_module = max(1, jobs // at_once)
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
                pack = (harvested or {}).get(failed)
                named = f"kernel pack {pack['pack']}: " if pack else ""
                fail(
                    f"{named}{failed} ({specs[failed].name}) failed to compile; other compiles "
                    f"stopped:\n{tail}"
                )
            print(f"jit-warmup: {name} compiled in {seconds[name]:.1f} s", flush=True)
    return seconds


def kernel_wheel_dir() -> Path:
    """The installed kernel wheel's package folder (its jit_cache/ and inventory.json)."""
    import importlib.util

    found = importlib.util.find_spec("flashinfer_jit_cache")
    if found is None or not found.origin:
        fail("no kernel wheel: the flashinfer_jit_cache package is not installed")
    return Path(found.origin).parent


def check_installed(names: list[str], wanted: list[str], inventory: Path) -> None:
    """Every module loads from the kernel wheel's AOT folder, never compiled: present, byte
    for byte what was built, with GPU code for every arch. FlashInfer 0.6.x reads that folder
    from get_jit_cache_dir(); 0.7.x from the providers get_jit_cache_providers() returns
    (flashinfer/jit/env.py): either way the module's aot_path must be the wheel's file."""
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    package = kernel_wheel_dir()
    aot = package / "jit_cache"
    try:
        built = json.loads((package / "inventory.json").read_text())
    except OSError:
        fail(f"no kernel wheel: {package / 'inventory.json'} is missing")
    recorded = {module["name"]: module for module in built["modules"]}
    for name in names:
        spec = load_spec(name)
        expected = aot / spec.name / f"{spec.name}.so"
        if not spec.is_aot:
            fail(f"{name}: {expected} is not loaded by FlashInfer: the kernel wheel lacks "
                 f"{spec.name}, or this FlashInfer does not read the wheel")  # fmt: skip
        if Path(spec.aot_path).resolve() != expected.resolve():
            fail(f"{name}: FlashInfer loads {spec.aot_path}, not the kernel wheel's {expected}")
        entry = recorded.get(spec.name)
        if entry is None or sha256(expected) != entry["sha256"]:
            fail(f"{name}: {expected} is not the module the kernel wheel records")
        library_record(name, spec.name, expected, wanted,
                       expects_device_code=has_device_code(spec))  # fmt: skip
    inventory.parent.mkdir(parents=True, exist_ok=True)
    inventory.write_text(json.dumps({**built, "aot_dir": str(aot)}, indent=2) + "\n")
    print(f"jit-warmup: {len(names)} modules load from {aot} without compiling", flush=True)


def await_ready(marker: Path, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if time.monotonic() > deadline:
            fail(f"no entries arrived within {timeout:.0f} s ({marker} never appeared)")
        time.sleep(0.1)


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
        "--harvested", default="{}",
        help='JSON {"generator entry": {"name": module, "pack": pack file}} from kernel packs '
        "(builder jit harvest): each entry must make a module of that name",
    )  # fmt: skip
    parser.add_argument("--entries", type=Path, help="folder of entries from earlier builds")
    parser.add_argument("--out", type=Path, help="write each .so and the new entries here")
    parser.add_argument(
        "--await-entries", action="store_true",
        help="print the lookup keys, then wait for <entries>/.ready before deciding",
    )  # fmt: skip
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="decide reuse or compile, only")
    mode.add_argument("--check", action="store_true", help="check the installed kernel wheel")
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
    if args.check:
        check_installed(names, wanted, args.inventory)
        return
    if args.entries and not (args.out or args.plan):
        fail("--entries needs --out: a reused module's .so is written there")
    if args.await_entries and not args.entries:
        fail("--await-entries needs --entries: the folder the entries are put into")

    jobs, why = job_budget(args.jobs, args.job_memory_gb)
    compiler = nvcc_version()
    if not args.plan:  # only a compile reads mtimes
        age_build_inputs()
    try:
        harvested = dict(json.loads(args.harvested))
    except (ValueError, TypeError):
        fail(f"--harvested must be a JSON object, not {args.harvested!r}")
    names += [entry for entry in harvested if entry not in names]
    specs = {}
    for name in names:
        spec = load_spec(name, harvested.get(name))
        made_by = next((other for other, s in specs.items() if s.name == spec.name), None)
        if made_by and name in harvested:  # it would overwrite that module's files
            fail(f"kernel pack {harvested[name]['pack']}: {name} makes {spec.name}, "
                 f"which {made_by} already makes: refused")  # fmt: skip
        specs[name] = spec
    lookups = {name: lookup_key(spec, compiler, arch_list) for name, spec in specs.items()}
    if args.await_entries:
        print(f"jit-warmup: lookups {json.dumps(list(lookups.values()))}", flush=True)
        await_ready(args.entries / ".ready")
    decisions = {name: decide(spec, lookups[name], args.entries) for name, spec in specs.items()}
    args.inventory.parent.mkdir(parents=True, exist_ok=True)
    if args.plan:
        plan = [
            {"module": name, "name": specs[name].name, "lookup": lookups[name], "reason": why}
            for name, (_, _, why) in decisions.items()
        ]
        args.inventory.write_text(json.dumps({"plan": plan}, indent=2) + "\n")
        return
    to_compile = {name: spec for name, spec in specs.items() if decisions[name][0] is None}
    print(
        f"jit-warmup: {len(specs)} modules for {' '.join(arch_list)} with nvcc {compiler}: "
        f"{len(specs) - len(to_compile)} reused, {len(to_compile)} to compile, jobs {why}",
        flush=True,
    )
    started = time.monotonic()
    seconds = compile_all(to_compile, jobs, harvested)

    inventory = []
    for name, spec in specs.items():
        record, library, reason = decisions[name]
        device = has_device_code(spec)
        if record is None:
            entry = prove(name, spec.name, Path(spec.build_dir), wanted, expects_device_code=device)
            inputs = recorded_inputs(spec)
            entry.update(lookup=lookups[name], key=content_key(lookups[name], inputs))
            entry["source"] = "compiled"
            entry["compile_seconds"] = round(seconds[name], 1)
            built = Path(spec.build_dir) / f"{spec.name}.so"
            if args.out:
                stored = {**entry, "schema_version": ENTRY_SCHEMA, "inputs": inputs,
                          "flashinfer_version": flashinfer_version(), "nvcc_version": compiler,
                          "arch_list": arch_list}  # fmt: skip
                write_entry(args.out / "entries", stored, built)
        else:
            built = args.out / "modules" / spec.name / f"{spec.name}.so"
            built.parent.mkdir(parents=True, exist_ok=True)
            built.write_bytes(library)
            entry = library_record(name, spec.name, built, wanted, expects_device_code=device)
            entry.update(lookup=record["lookup"], key=record["key"], source="reused",
                         compile_seconds=0.0)  # fmt: skip
        entry["reason"] = reason
        if name in harvested:
            entry["harvested_from"] = harvested[name]["pack"]
        if args.out:
            keep(built, args.out / "modules" / spec.name / f"{spec.name}.so")
        inventory.append(entry)

    result = {
        "arch_list": arch_list,
        "nvcc_version": compiler,
        "flashinfer_version": flashinfer_version(),
        "jobs": jobs,
        "seconds": round(time.monotonic() - started, 1),
        "modules": inventory,
    }
    args.inventory.write_text(json.dumps(result, indent=2) + "\n")
    print(f"jit-warmup: done in {result['seconds']} s: {args.inventory}", flush=True)


def keep(library: Path, destination: Path) -> None:
    if library.resolve() != destination.resolve():
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, destination)


def flashinfer_version() -> str:
    import flashinfer

    return flashinfer.__version__


if __name__ == "__main__":
    main()
