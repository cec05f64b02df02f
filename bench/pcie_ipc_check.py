"""FlashInfer's PCIe IPC all-reduce loaded from a builder kernel wheel, on 2 GPUs.

On a machine with 2+ NVIDIA GPUs, the unpatched flashinfer 0.7.x wheel (+ apache-tvm-ffi)
importable, nvcc on PATH and builder importable (the repository root on PYTHONPATH):

    python bench/pcie_ipc_check.py --work /tmp/pcie --out $OUT --arch 9.0a

1. builder's warm-up (images/sm120/jit_warmup.py) compiles pcie_ipc_comm for --arch
   (or --kernels names a folder an earlier warm-up --out wrote);
2. builder/build/kernels/wheel.py packs it into builder's kernel wheel, as `builder image` does;
3. the wheel is installed with pip (unzipped if pip refuses it), and a fresh process with
   FLASHINFER_DISABLE_JIT=1 asks FlashInfer for the module: where it loads it from, or
   what FlashInfer says (FlashInfer 0.7 reads a kernel wheel through
   get_jit_cache_providers(), flashinfer/jit/env.py);
4. world size 2, one process a GPU, JIT disabled, no arch list set (the arch FlashInfer
   computes for the device, as a server does): the bf16 all-reduce against an fp32
   torch.distributed reference, timed against torch.distributed all_reduce (NCCL), eager
   and in CUDA graphs (how sglang runs decode), with the seed launch policy and (--tune)
   tuned. If the workspace refuses to be built, its words are recorded.
Writes pcie-ipc.json to --out. Without GPUs, --probe-arch ARCH --no-world does 1-3 only,
the probe computing FlashInfer's target arch from ARCH instead of the device.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP = REPO / "images" / "sm120" / "jit_warmup.py"
MODULE = "flashinfer.jit.comm:gen_pcie_ipc_comm_module"
HIDDEN = 6144  # GLM-5's hidden size
TOKENS = (1, 8, 32, 128, 512)  # decode-sized, as sglang sizes this workspace
EAGER_ITERS = 200
GRAPH_CALLS, GRAPH_REPLAYS = 50, 10
SAFE_ENV = {  # multicast off: it can take the shared host's GPUs out of service
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

PROBE = r"""
import json, os, sys, warnings, logging, io
log = io.StringIO()
logging.basicConfig(stream=log, level=logging.WARNING)
result = {}
try:
    import flashinfer_jit_cache
    result["jit_cache_version"] = getattr(flashinfer_jit_cache, "__version__", None)
    result["jit_cache_file"] = flashinfer_jit_cache.__file__
    import flashinfer
    from flashinfer.jit import env as jit_env
    result["flashinfer"] = flashinfer.__version__
    result["providers"] = [
        {"id": p.provider_id, "version": p.version, "dir": str(p.jit_cache_dir),
         "archs": sorted(p.cuda_architectures), "modules": sorted(p.modules)}
        for p in getattr(jit_env, "FLASHINFER_AOT_PROVIDERS", ())
    ]
    from flashinfer.jit.comm import gen_pcie_ipc_comm_module
    spec = gen_pcie_ipc_comm_module()
    result["target_archs"] = sorted(jit_env._target_cuda_architectures())
    result["is_aot"] = spec.is_aot
    result["aot_path"] = str(spec.aot_path)
    try:
        spec.build_and_load()
        result["load"] = "loaded"
    except Exception as exc:
        result["load"] = f"{type(exc).__name__}: {exc}"
    result["compiled_here"] = os.path.exists(spec.jit_library_path)
except Exception as exc:
    import traceback
    result["error"] = traceback.format_exc()[-3000:]
result["log"] = log.getvalue()[-3000:]
print(json.dumps(result))
"""


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def probe(site: Path, workspace: Path, arch: str | None = None) -> dict:
    """What a fresh process with JIT disabled gets when it asks for pcie_ipc_comm."""
    env = {**os.environ, **SAFE_ENV, "FLASHINFER_DISABLE_JIT": "1",
           "FLASHINFER_WORKSPACE_BASE": str(workspace),
           "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    env.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    if arch:  # no GPU here: the arch FlashInfer would compute for the device
        env["FLASHINFER_CUDA_ARCH_LIST"] = arch
    done = _run([sys.executable, "-c", PROBE], env=env)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {"error": done.stderr[-3000:]}
    result["stderr_tail"] = done.stderr[-1500:]
    return result


def install(wheel: Path, site: Path) -> dict:
    """pip install --target, as a bare-metal host would install it; unzipped if refused."""
    shutil.rmtree(site, ignore_errors=True)
    done = _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                 "--target", str(site), str(wheel)])  # fmt: skip
    pip = _run([sys.executable, "-m", "pip", "--version"]).stdout.split(" from ")[0]
    record = {"wheel": wheel.name, "pip": pip, "pip_rc": done.returncode,
              "pip_said": (done.stdout + done.stderr).strip()[-800:]}  # fmt: skip
    if done.returncode:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        record["installed_by"] = "unzip (pip refused)"
    else:
        record["installed_by"] = "pip"
    return record


def build_wheel(args: argparse.Namespace, result: dict) -> Path:
    """pcie_ipc_comm compiled by builder's warm-up, then builder's kernel wheel of it."""
    kernels = args.kernels or args.work / "kernels"
    if not args.kernels:
        env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": args.arch,
               "FLASHINFER_WORKSPACE_BASE": str(args.work / "compile")}  # fmt: skip
        started = time.perf_counter()
        warm = _run([sys.executable, str(WARMUP), "--modules", json.dumps([MODULE]),
                     "--jobs", str(len(os.sched_getaffinity(0))), "--out", str(kernels),
                     "--inventory", str(kernels / "inventory.json")], env=env)  # fmt: skip
        print(warm.stdout, warm.stderr[-3000:], flush=True)
        if warm.returncode:
            raise SystemExit("warm-up failed")
        result["compile_seconds"] = round(time.perf_counter() - started, 1)
    inventory = json.loads((kernels / "inventory.json").read_text())
    result["compile"] = {
        "arch_list": inventory["arch_list"],
        "nvcc_version": inventory["nvcc_version"],
        "module": {k: inventory["modules"][0][k] for k in ("name", "size", "sha256", "arch")},
    }

    from builder.build.kernels.wheel import build_kernel_wheel
    from builder.build.wheels import BuiltWheel

    dist = importlib.metadata.distribution("flashinfer-python")
    flashinfer = BuiltWheel(
        name="flashinfer", dist_name="flashinfer-python", version=dist.version,
        filename=args.flashinfer_wheel or f"flashinfer_python-{dist.version}-py3-none-any.whl",
        sha256=args.flashinfer_wheel_sha256 or "", size=0, cache_key=dist.version,
        cached=True, path=Path(args.flashinfer_wheel or "."),
    )  # fmt: skip
    built = build_kernel_wheel(kernels / "modules", inventory, flashinfer, "sm120",
                               args.work / "wheels")  # fmt: skip
    shutil.copy2(built.path, args.out / built.filename)
    commit = _run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s", "--",
                   "builder/build/kernels/wheel.py"]).stdout.strip()  # fmt: skip
    result["wheel"] = {"file": built.filename, "version": built.version,
                       "sha256": built.sha256, "builder_kernel_wheel_py": commit}  # fmt: skip
    return built.path


def worker(args: argparse.Namespace) -> None:
    """One rank: workspace, correctness, timing; writes rank<N>.json (and .tuned.json)."""
    import torch
    import torch.distributed as dist

    rank, world = args.rank, args.world
    out = args.work / f"rank{rank}.json"
    result: dict = {"rank": rank}

    def save() -> None:
        out.write_text(json.dumps(result, indent=2) + "\n")

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))  # fmt: skip
    import flashinfer
    from flashinfer.comm import PcieIpcAllReduceWorkspace
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.comm import gen_pcie_ipc_comm_module

    spec = gen_pcie_ipc_comm_module()
    result.update(
        flashinfer=flashinfer.__version__, torch=torch.__version__,
        gpu=torch.cuda.get_device_name(rank),
        target_archs=sorted(jit_env._target_cuda_architectures()),
        is_aot=spec.is_aot, aot_path=str(spec.aot_path),
    )  # fmt: skip
    try:
        workspace = PcieIpcAllReduceWorkspace(
            group=dist.group.WORLD, max_numel=max(TOKENS) * HIDDEN, dtype=torch.bfloat16
        )
    except Exception as exc:
        result["refused"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-3000:]
        save()
        dist.destroy_process_group()
        return
    result.update(profile=workspace.profile, profile_reason=workspace.profile_reason,
                  memop_supported=workspace.memop_supported,
                  compiled_here=os.path.exists(spec.jit_library_path))  # fmt: skip

    def time_us(fn, calls: int) -> float:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / calls * 1000

    def graph_us(fn) -> float | str:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(GRAPH_CALLS):
                    fn()
            torch.cuda.synchronize()
            dist.barrier()
            return time_us(graph.replay, GRAPH_REPLAYS) / GRAPH_CALLS
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc)[:300]}"

    inputs = {}
    for tokens in TOKENS:
        generator = torch.Generator(device="cuda").manual_seed(1000 * rank + tokens)
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda", generator=generator)
        inputs[tokens] = (x, torch.empty_like(x), x.clone())  # input, IPC output, NCCL buffer

    def measure(label: str) -> list[dict]:
        """Eager: the all-reduce against the fp32 reference, and both timed."""
        rows = []
        workspace.prepare([(t, HIDDEN) for t in TOKENS])  # resolved before any capture
        for tokens, (x, out, nccl) in inputs.items():
            reference = x.float()
            dist.all_reduce(reference)
            if not workspace.supports(x):
                rows.append({"tokens": tokens, "supported": False})
                continue
            workspace.all_reduce(x, out=out)
            nccl.copy_(x)
            dist.all_reduce(nccl)
            torch.cuda.synchronize()
            top = reference.abs().max().item()
            ulp = 2.0 ** (math.floor(math.log2(top)) - 7)  # bf16: 8 significant bits
            row = {
                "tokens": tokens,
                "bytes": x.numel() * x.element_size(),
                "config": str(workspace.tuned_launch_config(x)),
                "max_abs_err": (out.float() - reference).abs().max().item(),
                "nccl_bf16_max_abs_err": (nccl.float() - reference).abs().max().item(),
                "max_abs_ref": top,
                "bf16_ulp_at_max": ulp,
            }
            row["within_one_ulp"] = row["max_abs_err"] <= ulp
            pcie_call = lambda: workspace.all_reduce(x, out=out)  # noqa: B023, E731
            nccl_call = lambda: dist.all_reduce(nccl)  # noqa: B023, E731
            row["pcie_ipc_us"] = round(time_us(pcie_call, EAGER_ITERS), 2)
            row["nccl_us"] = round(time_us(nccl_call, EAGER_ITERS), 2)
            row["pcie_ipc_over_nccl"] = round(row["pcie_ipc_us"] / row["nccl_us"], 3)
            rows.append(row)
            print(f"rank {rank} {label}: {json.dumps(row)}", flush=True)
        return rows

    def measure_graphs(rows: list[dict]) -> None:
        """The same calls captured in CUDA graphs (sglang's decode), per call."""
        for row in rows:
            if row.get("supported") is False:
                continue
            x, out, nccl = inputs[row["tokens"]]
            row["graph_pcie_ipc_us"] = graph_us(lambda: workspace.all_reduce(x, out=out))  # noqa: B023
            row["graph_nccl_us"] = graph_us(lambda: dist.all_reduce(nccl))  # noqa: B023
            if all(isinstance(row[k], float) for k in ("graph_pcie_ipc_us", "graph_nccl_us")):
                row["graph_pcie_ipc_us"] = round(row["graph_pcie_ipc_us"], 2)
                row["graph_nccl_us"] = round(row["graph_nccl_us"], 2)
                row["graph_pcie_ipc_over_nccl"] = round(
                    row["graph_pcie_ipc_us"] / row["graph_nccl_us"], 3
                )
            print(f"rank {rank} graph: {json.dumps(row)}", flush=True)
            save()

    result["seed_policy"] = measure("seed")
    save()
    measure_graphs(result["seed_policy"])
    if args.tune:
        started = time.perf_counter()
        try:
            cpu_group = dist.new_group(backend="gloo")
            workspace.tune([HIDDEN], tune_group=cpu_group)
            result["tune_seconds"] = round(time.perf_counter() - started, 1)
            result["tuned"] = measure("tuned")
            save()
            measure_graphs(result["tuned"])
        except Exception as exc:
            result["tune_error"] = f"{type(exc).__name__}: {exc}"
        save()
    workspace.destroy()
    dist.barrier()
    dist.destroy_process_group()


def run_world(args: argparse.Namespace, site: Path, result: dict) -> None:
    env = {**os.environ, **SAFE_ENV, "FLASHINFER_DISABLE_JIT": "1",
           "FLASHINFER_WORKSPACE_BASE": str(args.work / "run-workspace"),
           "FLASHINFER_AUTOTUNE_DIR": str(args.work / "autotune"),
           "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    env.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    port = 29500 + os.getpid() % 1000
    for rank in range(2):
        (args.work / f"rank{rank}.json").unlink(missing_ok=True)
    command = [sys.executable, __file__, "worker", "--work", str(args.work), "--world", "2",
               "--port", str(port), *(["--tune"] if args.tune else [])]  # fmt: skip
    processes = [subprocess.Popen([*command, "--rank", str(r)], env=env) for r in range(2)]
    started, codes = time.perf_counter(), None
    try:
        codes = [p.wait(timeout=args.timeout) for p in processes]
    except subprocess.TimeoutExpired:
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        result["hung"] = f"killed after {args.timeout} s"
    result["world_seconds"] = round(time.perf_counter() - started, 1)
    result["exit_codes"] = codes
    result["ranks"] = []
    for rank in range(2):
        path = args.work / f"rank{rank}.json"
        result["ranks"].append(json.loads(path.read_text()) if path.is_file() else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="all", choices=["all", "worker"])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--arch", default="9.0a", help="FLASHINFER_CUDA_ARCH_LIST to compile")
    parser.add_argument("--flashinfer-wheel", help="the flashinfer wheel's file name")
    parser.add_argument("--flashinfer-wheel-sha256")
    parser.add_argument("--tune", action="store_true", help="also tune, then measure again")
    parser.add_argument("--timeout", type=int, default=240, help="seconds for the 2 ranks")
    parser.add_argument("--kernels", type=Path, help="a warm-up --out folder: skip the compile")
    parser.add_argument("--probe-arch", help="no GPU: the arch list the probe computes from")
    parser.add_argument("--no-world", action="store_true", help="no GPUs: steps 1-3 only")
    parser.add_argument("--note", action="append", help="a line for the result (repeatable)")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    args.work = args.work.resolve()
    if args.mode == "worker":
        worker(args)
        return
    sys.path.insert(0, str(REPO))
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"arch": args.arch, "flashinfer_wheel": args.flashinfer_wheel,
                    "flashinfer_wheel_sha256": args.flashinfer_wheel_sha256,
                    **({"notes": args.note} if args.note else {})}  # fmt: skip
    if shutil.which("nvidia-smi"):
        gpus = _run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                     "--format=csv,noheader"]).stdout  # fmt: skip
        result["gpus"] = [g.strip() for g in gpus.splitlines() if g.strip()]
        result["topology"] = _run(["nvidia-smi", "topo", "-m"]).stdout[-1500:]
    wheel = build_wheel(args, result)
    result["install"] = install(wheel, args.work / "site")
    result["install"]["probe"] = probe(args.work / "site", args.work / "probe", args.probe_arch)
    (args.out / "pcie-ipc.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.no_world:
        result["world"] = "not run (--no-world)"
    else:
        run_world(args, args.work / "site", result)
    (args.out / "pcie-ipc.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "ranks"}, indent=2)[-3000:])


if __name__ == "__main__":
    main()
