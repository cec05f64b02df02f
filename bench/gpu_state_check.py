"""`builder qualify`'s GPU telemetry on a real GPU under a real load (a bf16 matmul loop).

Run on a machine with NVIDIA GPUs, torch and nvidia-ml-py (see bench/README.md):

    python bench/gpu_state_check.py --out results/ [--qualify]

1. `builder.site.gpu_state.describe()`: model, driver, power limit, memory, the P2P matrix.
2. The sampler qualify runs during each throughput level, over an idle window, then over a
   window in which every GPU multiplies bf16 matrices without a pause.
3. With --qualify, `builder qualify` itself (the CLI, subprocess) against the stand-in server
   (tests/standin_sglang.py: no model can be served on a lent machine) while the same load
   runs, so its receipt's levels carry what NVML read on the real GPU.
Fails (exit 1) unless, on every GPU, the loaded window's utilisation averages 80 % or more
and its power is above the idle window's. Writes gpu-state.json (and qualify/) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from builder.site import gpu_state  # noqa: E402


def _load(stop: threading.Event, tflops: dict, size: int = 8192) -> None:
    """bf16 matmuls on every GPU, one thread each, until stop; TFLOP/s per GPU."""
    import torch

    def run(index: int) -> None:
        device = torch.device("cuda", index)
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        torch.cuda.synchronize(device)
        started, products = time.perf_counter(), 0
        while not stop.is_set():
            for _ in range(10):
                a @ b
            torch.cuda.synchronize(device)
            products += 10
        seconds = time.perf_counter() - started
        tflops[index] = round(2 * size**3 * products / seconds / 1e12, 1)

    threads = [
        threading.Thread(target=run, args=(i,), daemon=True)
        for i in range(torch.cuda.device_count())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _window(seconds: float, loaded: bool) -> dict:
    stop, tflops = threading.Event(), {}
    loader = threading.Thread(target=_load, args=(stop, tflops), daemon=True)
    if loaded:
        loader.start()
        time.sleep(3)  # allocations and clocks up before the window opens
    sampler = gpu_state.Sampler(interval=0.5).start()
    time.sleep(seconds)
    summary = sampler.stop()
    if loaded:
        stop.set()
        loader.join()
        summary["matmul_tflops_per_gpu"] = tflops
    return summary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _qualify_under_load(out: Path) -> dict:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "standin_sglang.py"), str(port)],
        env={**os.environ, "STARTUP_SECONDS": "1", "SERVER_INFO": "{}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stop, tflops = threading.Event(), {}
    loader = threading.Thread(target=_load, args=(stop, tflops), daemon=True)
    loader.start()
    try:
        done = subprocess.run(
            [
                sys.executable, "-m", "builder.cli.main", "qualify", f"http://127.0.0.1:{port}",
                "--concurrency", "1,16,64", "--prompts", "64", "--input-len", "256",
                "--output-len", "64", "--needles", "4096", "--deadline", "1",
                "--gsm8k", "none",  # no hub from the lent machine: the gate is skipped
                "--out", str(out / "qualify"), "--json",
            ],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        stop.set()
        server.terminate()
        server.wait()
    loader.join()
    receipt_file = out / "qualify" / "receipt.json"
    receipt = json.loads(receipt_file.read_text()) if receipt_file.exists() else {}
    return {"exit_code": done.returncode, "stderr_tail": done.stderr[-2000:], "receipt": receipt}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--qualify", action="store_true", help="also builder qualify, loaded")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    result: dict = {"describe": gpu_state.describe()}
    if not result["describe"]["available"]:
        print(f"no GPU telemetry: {result['describe']['why']}", file=sys.stderr)
        return 1
    result["idle"] = _window(args.seconds / 2, loaded=False)
    result["loaded"] = _window(args.seconds, loaded=True)
    failures = []
    for idle, loaded in zip(result["idle"]["per_gpu"], result["loaded"]["per_gpu"], strict=True):
        if loaded["utilisation_pct_mean"] < 80:
            failures.append(f"GPU {loaded['index']}: {loaded['utilisation_pct_mean']} % busy")
        if loaded["power_w_mean"] <= idle["power_w_mean"]:
            failures.append(f"GPU {loaded['index']}: no more power loaded than idle")
    if args.qualify:
        result["qualify"] = _qualify_under_load(args.out)
        levels = (result["qualify"]["receipt"].get("throughput") or {}).get("levels") or []
        if (
            result["qualify"]["exit_code"] != 0
            or not levels
            or not all(level["gpu"].get("sampled") for level in levels)
        ):
            failures.append(
                f"qualify: exit {result['qualify']['exit_code']}: {result['qualify']['stderr_tail']}"
            )
    result["failures"] = failures
    (args.out / "gpu-state.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("describe", "idle", "loaded", "failures")}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
