"""GPU peer-to-peer probe: what the PCIe fabric between this machine's GPUs does, measured
before any model is loaded. One JSON document on stdout (progress on stderr).

    python3 p2p_probe.py [--world N] [--pcie-ipc auto|on|off] [--stage-timeout 120]
    python3 -m builder.site.probes.p2p_probe ...      # the same, from an installed builder

`builder doctor --p2p` bind-mounts this file read-only into the server image
(`docker run --rm --gpus all --ipc=host IMAGE python3 /opt/builder-probe/p2p_probe.py`),
where torch, NCCL, FlashInfer and builder's kernel wheel are; it runs as well on any host
whose Python has torch. It imports only the standard library here: torch and FlashInfer are
imported by the stages, each a child process, so a Python without torch gets a clear
"no CUDA" document and a hung stage is killed and recorded, never a hung probe.

Stages (each with its own timeout; `status` ok, failed, hung or skipped, and `detail`):
- gpus: index, name, UUID and PCI bus id of every GPU torch sees, in nvidia-smi's order
  (CUDA_DEVICE_ORDER=PCI_BUS_ID);
- pairs: for every GPU pair, torch.cuda.can_device_access_peer both ways, copy bandwidth
  each way (--copy-mib copies, CUDA events, after warm-up, median of --repeats) and latency
  (a 4-byte copy, queued behind a sleep kernel so only the GPU's time counts);
- nccl: all-reduce through torch.distributed (NCCL), one process per GPU, at the sizes a
  GLM-5 decode step reduces (hidden 6144 bf16 x batch 1, 8, 32, 128, 256), with the
  --nccl-env given (a profile's NCCL_*), then again with NCCL_P2P_DISABLE=1;
- pcie_ipc: FlashInfer's PCIe IPC all-reduce at the same sizes, JIT disabled
  (FLASHINFER_DISABLE_JIT=1: the kernel must come from the installed kernel wheel), its
  control collectives on NCCL with P2P off; its words when it refuses. World sizes 2, 4
  and 8 only; otherwise only the module load.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

PROBE_VERSION = 1
SCRIPT = str(Path(__file__).resolve())
HIDDEN = 6144  # GLM-5's hidden size
BATCHES = (1, 8, 32, 128, 256)  # decode batches; 256 = the profiles' CUDA-graph maximum
PCIE_IPC_WORLDS = (2, 4, 8)  # flashinfer/comm/pcie_ipc_ar.py _SUPPORTED_WORLD_SIZES
# Multicast stays off (a shared NVLink host can lose its GPUs to it); no effect over PCIe.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
FAILED_RANK_GRACE_S = 10.0  # once one rank failed, the others' wait in its collective
SMI_TIMEOUT_S = 30


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(message: str) -> None:
    print(f"p2p_probe: {message}", file=sys.stderr, flush=True)


# --- the parent: stages as child processes, each with a deadline -------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill(process: subprocess.Popen) -> None:
    """The process and what it started (its own session: see run_processes)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


def _wait(processes: list[subprocess.Popen], started: float, timeout_s: float) -> str:
    failed_at = None
    while True:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes):
            return "failed" if any(codes) else "ok"
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > FAILED_RANK_GRACE_S:
            return "failed"
        if time.monotonic() - started > timeout_s:
            return "hung"
        time.sleep(0.1)


def run_processes(
    commands: list[list[str]], env: dict[str, str], timeout_s: float, work: Path, name: str
) -> dict:
    """Start every command (one per rank) in its own session and wait for all of them:
    `status` ok (all exited 0), failed (one exited non-zero: the others get
    FAILED_RANK_GRACE_S to leave the collective it left, then are killed) or hung (still
    running at `timeout_s`: killed). Each rank's stderr goes to work/<name>-<rank>.log, and
    a stage reports where it is in work/<name>-<rank>.progress."""
    processes, logs = [], []
    for rank, command in enumerate(commands):
        log_path = work / f"{name}-{rank}.log"
        logs.append(log_path)
        with open(log_path, "w") as handle:
            processes.append(
                subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle,
                    start_new_session=True,
                )
            )  # fmt: skip
    started = time.monotonic()
    try:
        status = _wait(processes, started, timeout_s)
    finally:  # also on Ctrl-C or SIGTERM: no rank outlives the probe
        for process in processes:
            if process.poll() is None:
                _kill(process)
    progress = []
    for rank in range(len(commands)):
        try:
            progress.append((work / f"{name}-{rank}.progress").read_text().strip())
        except OSError:
            progress.append("not started")
    return {
        "status": status,
        "seconds": round(time.monotonic() - started, 1),
        "exit_codes": [p.returncode for p in processes],
        "progress": progress,
        "log_tails": [_tail(path) for path in logs],
    }


def _results(work: Path, name: str, ranks: int) -> list[dict | None]:
    found: list[dict | None] = []
    for rank in range(ranks):
        try:
            found.append(json.loads((work / f"{name}-{rank}.json").read_text()))
        except (OSError, ValueError):
            found.append(None)
    return found


def where_ranks_were(progress: list[str]) -> str:
    """`ranks 0-7: all_reduce 12288 B: first call`, or one clause per step the ranks were at."""
    steps: dict[str, list[int]] = {}
    for rank, step in enumerate(progress):
        steps.setdefault(step, []).append(rank)
    clauses = []
    for step, ranks in steps.items():
        if len(ranks) == 1:
            who = f"rank {ranks[0]}"
        elif ranks == list(range(ranks[0], ranks[-1] + 1)):
            who = f"ranks {ranks[0]}-{ranks[-1]}"
        else:
            who = f"ranks {', '.join(map(str, ranks))}"
        clauses.append(f"{who}: {step}")
    return "; ".join(clauses)


def run_stage(
    stage: str, world: int, args: argparse.Namespace, env: dict[str, str], work: Path,
    name: str | None = None,
) -> dict:  # fmt: skip
    """One stage, `world` processes of this script (`--stage STAGE --rank R`), judged: ok,
    failed (with the first rank's own words) or hung (with where each rank was)."""
    name = name or stage
    port = free_port()
    command = [
        sys.executable, SCRIPT, "--stage", stage, "--work", str(work), "--name", name,
        "--world", str(world), "--port", str(port), "--copy-mib", str(args.copy_mib),
        "--repeats", str(args.repeats),
    ]  # fmt: skip
    log(f"stage {name}: {world} process(es), {args.stage_timeout:g} s at most")
    ran = run_processes(
        [[*command, "--rank", str(rank)] for rank in range(world)],
        env, args.stage_timeout, work, name,
    )  # fmt: skip
    results = _results(work, name, world)
    outcome: dict = {"status": ran["status"], "seconds": ran["seconds"], "world": world}
    errors = [r["error"] for r in results if r and r.get("error")]
    if ran["status"] == "hung":
        where = where_ranks_were(ran["progress"])
        outcome["detail"] = f"no answer within {args.stage_timeout:g} s ({where})"
        outcome["hung_at"] = ran["progress"]
    elif errors or ran["status"] == "failed":
        outcome["status"] = "failed"
        rank = next((i for i, code in enumerate(ran["exit_codes"]) if code), 0)
        outcome["detail"] = (
            errors[0] if errors else _last_line(ran["log_tails"][rank]) or "no message"
        )
        outcome["exit_codes"] = ran["exit_codes"]
    else:
        outcome["detail"] = "ran"
    if outcome["status"] != "ok":
        outcome["log_tail"] = ran["log_tails"][0]
    outcome["ranks"] = results
    log(f"stage {name}: {outcome['status']} ({outcome['detail'][:200]})")
    return outcome


def skipped(detail: str) -> dict:
    return {"status": "skipped", "detail": detail}


def _smi(*words: str) -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", *words], capture_output=True, text=True, timeout=SMI_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _smi_rows(text: str | None) -> list[list[str]]:
    return [[f.strip() for f in line.split(",")] for line in (text or "").splitlines() if line]


def all_reduce_sizes() -> list[dict]:
    return [{"batch": batch, "bytes": batch * HIDDEN * 2} for batch in BATCHES]


def no_cuda(result: dict, why: str) -> dict:
    log(f"no CUDA: {why}")
    skip = skipped(f"no CUDA: {why}")
    return {
        **result,
        "cuda": False,
        "error": f"no CUDA: {why}",
        "gpus": [],
        "pairs": skip,
        "all_reduce": {"sizes": all_reduce_sizes(), "nccl": skip, "nccl_p2p_disabled": skip,
                       "pcie_ipc": skip},
    }  # fmt: skip


def stage_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in SAFE_ENV.items():
        env.setdefault(key, value)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # torch's index = nvidia-smi's index
    env["PYTHONUNBUFFERED"] = "1"
    env.update(dict(args.nccl_env))
    return env


def probe(args: argparse.Namespace, work: Path) -> dict:
    result: dict = {
        "probe": "builder-p2p",
        "probe_version": PROBE_VERSION,
        "started_at": now(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "hidden_size": HIDDEN,
        "stage_timeout_s": args.stage_timeout,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nvidia_smi": {
            # The columns of builder/site/p2p_host.py's GPU_IDS_QUERY, then the name.
            "gpus": _smi("--query-gpu=index,uuid,pci.bus_id,name", "--format=csv,noheader"),
            "topology": _smi("topo", "-m"),
        },
    }
    if importlib.util.find_spec("torch") is None:
        return no_cuda(result, f"torch is not installed in this Python ({sys.executable})")
    env = stage_env(args)
    listed = run_stage("gpus", 1, args, env, work)
    info = (listed["ranks"] or [None])[0] or {}
    result.update({k: info.get(k) for k in ("torch", "torch_cuda", "nccl")})
    if listed["status"] != "ok":
        return no_cuda(result, f"torch could not list the GPUs: {listed['detail']}")
    if not info.get("count"):
        return no_cuda(
            result,
            f"torch {info.get('torch')} (CUDA {info.get('torch_cuda')}) sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})",
        )
    gpus = info["gpus"]
    smi = _smi_rows(result["nvidia_smi"]["gpus"])
    if len(smi) == len(gpus) and "CUDA_VISIBLE_DEVICES" not in os.environ:
        for gpu, row in zip(gpus, smi, strict=True):  # what this torch does not report
            if len(row) >= 3:
                gpu["uuid"] = gpu.get("uuid") or row[1]
                gpu["pci_bus_id"] = gpu.get("pci_bus_id") or row[2]
    result.update(cuda=True, gpus=gpus)
    count = len(gpus)
    world = args.world or count
    result["world"] = world

    if count < 2:
        result["pairs"] = {**skipped("one GPU: no pair to measure"), "pairs": []}
    else:
        pairs = run_stage("pairs", 1, args, env, work)
        measured = (pairs.pop("ranks") or [None])[0] or {}
        result["pairs"] = {**pairs, "pairs": measured.get("pairs", [])}
        result["pairs"]["copy_bytes"] = args.copy_mib << 20

    sizes = all_reduce_sizes()
    all_reduce: dict = {"sizes": sizes}
    result["all_reduce"] = all_reduce
    if world > count:
        too_many = skipped(f"--world {world}: torch sees {count} GPU(s)")
        all_reduce.update(nccl=too_many, nccl_p2p_disabled=too_many, pcie_ipc=too_many)
        return result
    all_reduce["nccl"] = _judged(run_stage("nccl", world, args, env, work), world)
    if world < 2:
        all_reduce["nccl_p2p_disabled"] = skipped("world 1: no peer traffic to turn off")
    else:
        fallback = {k: v for k, v in env.items() if k != "NCCL_P2P_LEVEL"}
        fallback["NCCL_P2P_DISABLE"] = "1"
        all_reduce["nccl_p2p_disabled"] = _judged(
            run_stage("nccl", world, args, fallback, work, name="nccl-p2p-disabled"), world
        )
    all_reduce["nccl"]["env"] = _nccl_env(env)
    if world >= 2:
        all_reduce["nccl_p2p_disabled"]["env"] = _nccl_env(fallback)
    all_reduce["pcie_ipc"] = pcie_ipc(args, env, work, world)
    return result


def _nccl_env(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in sorted(env.items()) if key.startswith("NCCL_")}


def _judged(stage: dict, world: int) -> dict:
    """A finished all-reduce stage: per size, the slowest rank's time (the collective's)
    and whether every rank got the exact sum."""
    ranks = stage.pop("ranks", [])
    first = next((r for r in ranks if r), {})
    for key in ("flashinfer", "is_aot", "aot_path", "profile", "profile_reason",
                "memop_supported", "load"):  # fmt: skip
        if key in first:
            stage[key] = first[key]
    rows = []
    for index, size in enumerate(all_reduce_sizes()):
        per_rank = [r["rows"][index] for r in ranks if r and len(r.get("rows", [])) > index]
        if not per_rank:
            continue
        row = {**size, "ranks": len(per_rank)}
        if any(r.get("supported") is False for r in per_rank):
            row["supported"] = False
        else:
            row["us"] = max(r["us"] for r in per_rank)
            row["correct"] = all(r["correct"] for r in per_rank)
            row["max_abs_err"] = max(r["max_abs_err"] for r in per_rank)
        rows.append(row)
    stage["results"] = rows
    wrong = [r["bytes"] for r in rows if r.get("correct") is False]
    if stage["status"] == "ok" and wrong:
        stage["status"] = "failed"
        stage["detail"] = f"wrong sums at {', '.join(f'{b} B' for b in wrong)}"
    elif stage["status"] == "ok" and len(rows) < len(BATCHES):
        stage["status"] = "failed"
        stage["detail"] = f"results for {len(rows)} of {len(BATCHES)} sizes"
    stage["world"] = world
    return stage


def pcie_ipc(args: argparse.Namespace, env: dict[str, str], work: Path, world: int) -> dict:
    if args.pcie_ipc == "off":
        return skipped("--pcie-ipc off")
    if importlib.util.find_spec("flashinfer") is None:
        why = f"flashinfer is not installed in this Python ({sys.executable})"
        return skipped(why) if args.pcie_ipc == "auto" else {"status": "failed", "detail": why}
    # The workspace's own small collectives go over NCCL, as in sglang, with P2P off: a
    # hang here is then the IPC kernels', not NCCL's P2P (the nccl stage judges that).
    ipc_env = {
        **{k: v for k, v in env.items() if k != "NCCL_P2P_LEVEL"},
        "NCCL_P2P_DISABLE": "1",
        "FLASHINFER_DISABLE_JIT": "1",  # the kernel wheel's module, or FlashInfer's refusal
        "FLASHINFER_WORKSPACE_BASE": str(work / "flashinfer-workspace"),
        "FLASHINFER_AUTOTUNE_DIR": str(work / "flashinfer-autotune"),
    }
    if world not in PCIE_IPC_WORLDS:
        loaded = run_stage("ipc-load", 1, args, ipc_env, work)
        first = (loaded.pop("ranks") or [None])[0] or {}
        module = {**loaded, **{k: first[k] for k in ("flashinfer", "is_aot", "aot_path", "load")
                               if k in first}}  # fmt: skip
        outcome = skipped(
            f"world {world}: FlashInfer's PCIe IPC all-reduce runs at "
            f"{', '.join(map(str, PCIE_IPC_WORLDS))} ranks only"
        )
        return {**outcome, "module": module}
    judged = _judged(run_stage("pcie-ipc", world, args, ipc_env, work), world)
    judged["launch_policy"] = "seed (an empty autotune folder: nothing tuned)"
    judged["env"] = _nccl_env(ipc_env)
    return judged


# --- the children: one stage each, torch imported here --------------------------------


class Stage:
    """A child's bookkeeping: where it is (read by the parent on a hang) and its result."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.base = Path(args.work) / f"{args.name}-{args.rank}"
        self.result: dict = {"rank": args.rank}

    def at(self, step: str) -> None:
        temporary = self.base.with_suffix(".progress.tmp")
        temporary.write_text(step + "\n")
        temporary.replace(self.base.with_suffix(".progress"))

    def save(self) -> None:
        temporary = self.base.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(self.result) + "\n")
        temporary.replace(self.base.with_suffix(".json"))


def _uuid(props) -> str | None:
    value = getattr(props, "uuid", None)
    if value is None:
        return None
    text = str(value)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _bus_id(props) -> str | None:
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if any(part is None for part in parts):
        return None
    domain, bus, device = parts
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"  # as nvidia-smi writes it


def stage_gpus(stage: Stage) -> None:
    import torch

    stage.at("torch.cuda.device_count")
    out = stage.result
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, nccl=None)
    with contextlib.suppress(Exception):
        version = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["count"] = count
    out["gpus"] = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        out["gpus"].append({
            "index": index, "name": props.name, "uuid": _uuid(props),
            "pci_bus_id": _bus_id(props), "compute_capability": f"{props.major}.{props.minor}",
            "memory_mib": props.total_memory >> 20,
        })  # fmt: skip


def _copy_gbps(torch, src: int, dst: int, nbytes: int, repeats: int) -> float:
    """GB/s of one large copy src -> dst: CUDA events on the source's stream (torch copies
    between devices there), after a warm-up, the median of `repeats`."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    y = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    for _ in range(2):  # peer mapping, clocks
        y.copy_(x, non_blocking=True)
    torch.cuda.synchronize(src)
    torch.cuda.synchronize(dst)
    times = []
    with torch.cuda.device(src):
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            y.copy_(x, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
    return round(nbytes / statistics.median(times) / 1e9, 2)


def _copy_latency_us(torch, src: int, dst: int, repeats: int, calls: int = 100) -> float:
    """µs per 4-byte copy src -> dst, the copies queued behind a sleep kernel so that the
    events time the GPU, not Python issuing them; the median of `repeats`."""
    x = torch.ones(1, dtype=torch.float32, device=f"cuda:{src}")
    y = torch.empty(1, dtype=torch.float32, device=f"cuda:{dst}")
    for _ in range(10):
        y.copy_(x, non_blocking=True)
    torch.cuda.synchronize(src)
    times = []
    with torch.cuda.device(src):
        for _ in range(repeats):
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(20_000_000)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                y.copy_(x, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / calls)
    return round(statistics.median(times), 2)


def stage_pairs(stage: Stage, args: argparse.Namespace) -> None:
    import torch

    count = torch.cuda.device_count()
    nbytes = args.copy_mib << 20
    pairs: list[dict] = []
    stage.result["pairs"] = pairs
    for a in range(count):
        for b in range(a + 1, count):
            entry: dict = {
                "a": a, "b": b,
                "peer_access": {"a_to_b": torch.cuda.can_device_access_peer(a, b),
                                "b_to_a": torch.cuda.can_device_access_peer(b, a)},
                "bandwidth_gbps": {}, "latency_us": {},
            }  # fmt: skip
            for src, dst, way in ((a, b, "a_to_b"), (b, a, "b_to_a")):
                stage.at(f"copy GPU{src} -> GPU{dst}, {nbytes} B")
                entry["bandwidth_gbps"][way] = _copy_gbps(torch, src, dst, nbytes, args.repeats)
                stage.at(f"latency GPU{src} -> GPU{dst}")
                entry["latency_us"][way] = _copy_latency_us(torch, src, dst, args.repeats)
                torch.cuda.empty_cache()
            pairs.append(entry)
            stage.save()


def _pattern(torch, batch: int, factor: float):
    """Multiples of 1/8 with an exact bf16 sum over up to 8 ranks in any order."""
    k = (torch.arange(batch * HIDDEN, device="cuda") % 7 + 1).to(torch.float32) / 8
    return (k * factor).view(batch, HIDDEN)


def _time_us(torch, dist, fn, repeats: int, calls: int = 20) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return round(statistics.median(times), 2)


def _init_group(torch, dist, args: argparse.Namespace, backend: str) -> None:
    kwargs = {"backend": backend, "init_method": f"tcp://127.0.0.1:{args.port}",
              "rank": args.rank, "world_size": args.world}  # fmt: skip
    if backend == "nccl":  # the communicator is made here, not at the first all-reduce
        with contextlib.suppress(TypeError):
            dist.init_process_group(**kwargs, device_id=torch.device("cuda", args.rank))
            return
    dist.init_process_group(**kwargs)


def stage_all_reduce(stage: Stage, args: argparse.Namespace, kind: str) -> None:
    import torch
    import torch.distributed as dist

    rank, world = args.rank, args.world
    torch.cuda.set_device(rank)
    out = stage.result
    workspace = None
    if kind == "pcie-ipc":
        stage.at("import flashinfer (JIT disabled)")
        import flashinfer
        from flashinfer.comm import PcieIpcAllReduceWorkspace
        from flashinfer.jit.comm import gen_pcie_ipc_comm_module

        spec = gen_pcie_ipc_comm_module()
        out.update(flashinfer=flashinfer.__version__, is_aot=bool(spec.is_aot),
                   aot_path=str(spec.aot_path))  # fmt: skip
        stage.at("init_process_group (NCCL, P2P off: the workspace's control collectives)")
        _init_group(torch, dist, args, "nccl")
        stage.at("PcieIpcAllReduceWorkspace: peer buffers over CUDA IPC")
        workspace = PcieIpcAllReduceWorkspace(
            group=dist.group.WORLD, max_numel=max(BATCHES) * HIDDEN, dtype=torch.bfloat16
        )
        out.update(profile=workspace.profile, profile_reason=workspace.profile_reason,
                   memop_supported=bool(workspace.memop_supported))  # fmt: skip
    else:
        stage.at("init_process_group (NCCL communicator)")
        _init_group(torch, dist, args, "nccl")
    rows: list[dict] = []
    out["rows"] = rows
    total = world * (world + 1) / 2
    for batch in BATCHES:
        nbytes = batch * HIDDEN * 2
        x = _pattern(torch, batch, rank + 1).to(torch.bfloat16)
        expected = _pattern(torch, batch, total)
        if workspace is not None and not workspace.supports(x):
            rows.append({"batch": batch, "bytes": nbytes, "supported": False})
            continue
        result = torch.empty_like(x) if workspace is not None else x
        stage.at(f"all_reduce {nbytes} B: first call")
        if workspace is not None:
            workspace.all_reduce(x, out=result)
        else:
            dist.all_reduce(result)
        torch.cuda.synchronize()
        error = (result.float() - expected).abs().max().item()
        top = expected.abs().max().item()
        ulp = 2.0 ** (int(top).bit_length() - 8) if top >= 1 else 2.0**-8
        timed = torch.zeros_like(x)
        spare = torch.empty_like(x)
        stage.at(f"all_reduce {nbytes} B: timed")
        if workspace is not None:
            us = _time_us(torch, dist, lambda: workspace.all_reduce(timed, out=spare),  # noqa: B023
                          args.repeats)  # fmt: skip
        else:
            us = _time_us(torch, dist, lambda: dist.all_reduce(timed), args.repeats)  # noqa: B023
        rows.append({"batch": batch, "bytes": nbytes, "us": us, "correct": error <= ulp,
                     "max_abs_err": error})  # fmt: skip
        stage.save()
    stage.at("destroy_process_group")
    if workspace is not None:
        workspace.destroy()
    dist.barrier()
    dist.destroy_process_group()


def stage_ipc_load(stage: Stage) -> None:
    """One process, JIT disabled: does FlashInfer find pcie_ipc_comm in a kernel wheel?"""
    stage.at("import flashinfer (JIT disabled)")
    import flashinfer
    from flashinfer.jit.comm import gen_pcie_ipc_comm_module

    spec = gen_pcie_ipc_comm_module()
    stage.result.update(flashinfer=flashinfer.__version__, is_aot=bool(spec.is_aot),
                        aot_path=str(spec.aot_path))  # fmt: skip
    stage.at("build_and_load pcie_ipc_comm")
    try:
        spec.build_and_load()
        stage.result["load"] = "loaded"
    except Exception as exc:  # FlashInfer's own words: what the record keeps
        stage.result["load"] = f"{type(exc).__name__}: {exc}"[:600]


def run_child(args: argparse.Namespace) -> int:
    stage = Stage(args)
    stage.at("starting")
    try:
        if args.stage == "gpus":
            stage_gpus(stage)
        elif args.stage == "pairs":
            stage_pairs(stage, args)
        elif args.stage in ("nccl", "pcie-ipc"):
            stage_all_reduce(stage, args, args.stage)
        elif args.stage == "ipc-load":
            stage_ipc_load(stage)
    except Exception as exc:
        stage.result["error"] = f"{type(exc).__name__}: {exc}".strip()[:600]
        stage.result["traceback"] = traceback.format_exc()[-3000:]
        stage.save()
        traceback.print_exc()
        return 1
    stage.save()
    return 0


# --- command line -------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # bad input: one line, exit 1
        self.exit(1, f"p2p_probe: error: {message}\n")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="p2p_probe",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python3 -m builder.site.probes.p2p_probe --pcie-ipc auto > p2p.json",
    )
    parser.add_argument("--world", type=int, help="all-reduce world size (default: every GPU)")
    parser.add_argument(
        "--pcie-ipc", choices=("auto", "on", "off"), default="auto",
        help="FlashInfer's PCIe IPC all-reduce: auto runs it where flashinfer is installed, "
        "on fails without it (default: auto)",
    )  # fmt: skip
    parser.add_argument(
        "--stage-timeout", type=_positive, default=120.0, metavar="SECONDS",
        help="a stage still running after this is killed and recorded as hung (default: 120)",
    )  # fmt: skip
    parser.add_argument(
        "--copy-mib", type=int, default=256, help="bandwidth copy size in MiB (default: 256)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (default: 5)")
    parser.add_argument(
        "--nccl-env", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
        help="environment for the NCCL stage, e.g. a profile's NCCL_P2P_LEVEL=PHB (repeatable)",
    )  # fmt: skip
    parser.add_argument("--out", metavar="FILE", help="also write the document here")
    for internal in ("--stage", "--work", "--name"):
        parser.add_argument(internal, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.world is not None and args.world < 1:
        parser.error(f"--world {args.world}: must be 1 or more")
    if args.copy_mib < 1 or args.repeats < 1:
        parser.error("--copy-mib and --repeats must be 1 or more")
    return args


NOTHING_MEASURED = 9  # builder's "could not check" (builder/core/errors.py)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage:
        return run_child(args)
    # SIGTERM (docker stop, a timeout) unwinds like Ctrl-C: the ranks are killed on the way.
    previous = None
    with contextlib.suppress(ValueError):  # not the main thread (in-process callers)
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="builder-p2p-"))
    try:
        result = probe(args, work)
    except Exception as exc:  # a bug here still answers with one document
        result = {"probe": "builder-p2p", "probe_version": PROBE_VERSION, "cuda": False,
                  "error": f"probe error: {type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    result["seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    if not result.get("cuda"):  # a document all the same: doctor shows why
        log(
            f"measured nothing: {result.get('error')}; run it with a python3 that has a CUDA "
            "build of torch (the server image has one: builder doctor --p2p --image IMAGE)"
        )
        return NOTHING_MEASURED
    return 0


if __name__ == "__main__":
    sys.exit(main())
