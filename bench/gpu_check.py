"""Prove the products on a real GPU: our patched FlashInfer wheel + builder's JIT warm-up.

Run on a machine with NVIDIA GPUs and our flashinfer wheel installed (see bench/README.md):

    python bench/gpu_check.py --arch 9.0a --out results/

1. JIT warm-up: builder's own images/sm120/jit_warmup.py compiles the modules for --arch
   into a fresh workspace, without using the GPU (as in the image build).
2. Load: a fresh process loads each module from that cache; zero compilation is proven by
   the module files and ninja logs being unchanged and ninja having no work. The same load
   into an empty workspace (cold, it compiles) is timed beside it, and the first call.
3. With 2+ GPUs: the patched trtllm_allreduce_fusion (allreduce + residual add + RMSNorm)
   against torch.distributed all_reduce + add + RMSNorm (max error), and fused vs unfused
   timing at several token counts (ratio).
Writes gpu-results.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP = REPO / "images" / "sm120" / "jit_warmup.py"
NORM = "flashinfer.jit.norm:gen_norm_module"
COMM = "flashinfer.jit.comm:gen_trtllm_comm_module"
TOKENS = (1, 16, 128, 512, 2048)
HIDDEN = 6144  # GLM-5's hidden size


def _env(workspace: Path, arch: str) -> dict[str, str]:
    return {
        **os.environ,
        "FLASHINFER_WORKSPACE_BASE": str(workspace),
        "FLASHINFER_CUDA_ARCH_LIST": arch,
        # Multicast off: it can take the shared host's GPUs out of service.
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


LOAD_PROBE = r"""
import json, os, subprocess, sys, time
from pathlib import Path
import importlib
started = time.perf_counter()
import torch, flashinfer
import_s = time.perf_counter() - started
result = {"flashinfer": flashinfer.__version__, "import_s": round(import_s, 3), "modules": {}}
for qualified in sys.argv[1].split(","):
    module, _, function = qualified.partition(":")
    spec = getattr(importlib.import_module(module), function)()
    lib = Path(spec.jit_library_path)
    log = Path(spec.build_dir) / ".ninja_log"
    before = (lib.stat().st_mtime_ns if lib.exists() else None,
              log.read_text().count("\n") if log.exists() else 0)
    t0 = time.perf_counter()
    spec.build_and_load()
    load_s = time.perf_counter() - t0
    after = (lib.stat().st_mtime_ns, log.read_text().count("\n") if log.exists() else 0)
    dry = subprocess.run(["ninja", "-n", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)],
                         capture_output=True, text=True).stdout
    result["modules"][spec.name] = {
        "load_s": round(load_s, 3),
        "compiled": before != after,
        "ninja_no_work": "no work to do" in dry,
    }
x = torch.randn(128, 6144, device="cuda", dtype=torch.bfloat16)
w = torch.randn(6144, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
flashinfer.norm.rmsnorm(x, w)
torch.cuda.synchronize()
result["first_rmsnorm_call_s"] = round(time.perf_counter() - t0, 4)
print(json.dumps(result))
"""


def probe_load(workspace: Path, arch: str, modules: str) -> dict:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", LOAD_PROBE, modules],
        env=_env(workspace, arch), capture_output=True, text=True,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"load probe failed:\n{out.stdout}\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = round(time.perf_counter() - started, 2)
    return result


def _rmsnorm(x, gamma, eps):
    import torch

    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(x.dtype)


def _measure(tokens: int, rank: int, world: int, workspace, eps: float) -> dict:
    """Fused vs reference at one token count: max error and time per call."""
    import torch
    import torch.distributed as dist
    from flashinfer import norm
    from flashinfer.comm import trtllm_ar

    torch.manual_seed(1234 + rank)
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    gamma = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    dist.broadcast(gamma, 0)
    fused_residual, fused_norm = torch.empty_like(x), torch.empty_like(x)
    summed, unfused_residual = torch.empty_like(x), torch.empty_like(x)

    def fused() -> None:
        trtllm_ar.trtllm_allreduce_fusion(
            allreduce_in=x, world_size=world, world_rank=rank, token_num=tokens,
            hidden_dim=HIDDEN, workspace_ptrs=workspace, launch_with_pdl=True,
            trigger_completion_at_end=True, fp32_acc=True,
            pattern_code=trtllm_ar.AllReduceFusionPattern.kARResidualRMSNorm,
            use_oneshot=None, allreduce_out=None, residual_in=residual,
            residual_out=fused_residual, norm_out=fused_norm, quant_out=None, scale_out=None,
            rms_gamma=gamma, rms_eps=eps, scale_factor=None, layout_code=None,
        )  # fmt: skip

    def unfused() -> None:
        summed.copy_(x)
        dist.all_reduce(summed)
        unfused_residual.copy_(residual)
        norm.fused_add_rmsnorm(summed, unfused_residual, gamma, eps)  # summed <- norm

    reference_sum = x.float()
    dist.all_reduce(reference_sum)
    reference_residual = (reference_sum + residual.float()).to(torch.bfloat16)
    reference_norm = _rmsnorm(reference_residual, gamma, eps)
    fused()
    torch.cuda.synchronize()
    timings = {}
    for name, fn in (("fused", fused), ("unfused", unfused)):
        for _ in range(10):
            fn()
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            fn()
        end.record()
        torch.cuda.synchronize()
        timings[name] = start.elapsed_time(end) / 200 * 1000  # microseconds
    fused()
    torch.cuda.synchronize()
    return {
        "tokens": tokens,
        "max_abs_err_residual": (fused_residual.float() - reference_residual.float())
        .abs()
        .max()
        .item(),
        "max_abs_err_norm": (fused_norm.float() - reference_norm.float()).abs().max().item(),
        "max_abs_norm": reference_norm.float().abs().max().item(),
        "fused_us": round(timings["fused"], 2),
        "unfused_us": round(timings["unfused"], 2),
        "fused_over_unfused": round(timings["fused"] / timings["unfused"], 3),
    }


def _fusion_worker(rank: int, world: int, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from flashinfer.comm import trtllm_ar

    eps = 1e-6
    max_tokens = max(TOKENS)
    ipc, workspace = trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        rank, world, max_tokens, HIDDEN, group=dist.group.WORLD
    )
    rows = [_measure(tokens, rank, world, workspace, eps) for tokens in TOKENS]
    if rank == 0:
        queue.put(rows)
    trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(ipc, group=dist.group.WORLD)
    dist.barrier()
    dist.destroy_process_group()


def fusion_check(workspace: Path, arch: str) -> list[dict]:
    import torch.multiprocessing as mp

    os.environ.update(_env(workspace, arch))
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = 29500 + os.getpid() % 1000
    processes = [context.Process(target=_fusion_worker, args=(r, 2, port, queue)) for r in range(2)]
    for process in processes:
        process.start()
    rows = queue.get(timeout=600)
    for process in processes:
        process.join(timeout=120)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="9.0a", help="FLASHINFER_CUDA_ARCH_LIST for the warm-up")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/builder-gpu-check"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    warm, cold = args.workdir / "warm", args.workdir / "cold"
    results: dict = {"arch": args.arch}

    import torch

    results["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    started = time.perf_counter()
    warmup = subprocess.run(
        [sys.executable, str(WARMUP), "--modules", f"{COMM},{NORM}", "--jobs", "0",
         "--inventory", str(args.out / "jit-inventory.json")],
        env=_env(warm, args.arch), capture_output=True, text=True,
    )  # fmt: skip
    print(warmup.stdout, warmup.stderr[-3000:], flush=True)
    if warmup.returncode:
        raise SystemExit("warm-up failed")
    results["warmup_s"] = round(time.perf_counter() - started, 1)
    results["jit_inventory"] = json.loads((args.out / "jit-inventory.json").read_text())

    results["load_warm"] = probe_load(warm, args.arch, f"{NORM},{COMM}")
    print("warm:", json.dumps(results["load_warm"]), flush=True)
    results["load_cold"] = probe_load(cold, args.arch, NORM)
    print("cold:", json.dumps(results["load_cold"]), flush=True)
    if torch.cuda.device_count() >= 2:
        results["allreduce_fusion"] = fusion_check(warm, args.arch)
        for row in results["allreduce_fusion"]:
            print("fusion:", json.dumps(row), flush=True)
    (args.out / "gpu-results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
