"""`builder qualify --sweep`'s verdict on receipts measured on a real GPU.

Run from the repository root on a GPU machine whose python3 has torch and nvidia-ml-py, with
builder's imports on PYTHONPATH (bench/README.md):

    python3 bench/sweep_gpu_check.py --out $OUT

No model can be served on a lent machine and it has no Docker engine, so the sweep's start,
stall and fallback steps (containers) are proven by the suite on a real engine
(tests/site/test_sweep.py). What this proves on the GPU: two stand-in servers
(tests/standin_sglang.py) play two profiles, one right and speculative (MTP figures on
/server_info and in each reply), one that answers a quarter of the GSM8K questions wrongly;
`builder qualify` (the CLI) qualifies each while every GPU multiplies bf16 matrices, with
every gate (arithmetic from the seed, byte-identical greedy output at concurrency 1 and 32,
the needle, GSM8K from a file of its format, MTP) and NVML sampling each level; then
builder/site/sweep.py chooses from those receipts as `--sweep` does. Fails (exit 1) unless the
right profile is chosen at every level, the wrong one falls at its GSM8K gate (exit 8, no
speed levels: qualify stops at the first failed check), and every level of the right one's
receipt carries GPU samples. Writes sweep-gpu.json and chosen.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_state_check import _free_port, _load  # noqa: E402
from builder.site import gpu_state, sweep  # noqa: E402
from tests.standin_sglang import write_gsm8k_questions  # noqa: E402

LEVELS = "1,32"
PROFILES = {
    "standin-mtp": {
        "SPEC_ACCEPT_LENGTH": "3.1",
        "SPEC_ACCEPT_RATE": "0.7",
        "SERVER_INFO": json.dumps({"speculative_algorithm": "EAGLE"}),
    },
    "standin-wrong-gsm8k": {"GSM8K_WRONG_FRACTION": "0.25"},
}


def _qualify(name: str, env: dict[str, str], questions: Path, out: Path) -> dict:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "standin_sglang.py"), str(port)],
        env={**os.environ, "STARTUP_SECONDS": "1", "SERVER_INFO": "{}", **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        done = subprocess.run(
            [
                sys.executable, "-m", "builder.cli.main", "qualify", f"http://127.0.0.1:{port}",
                "--concurrency", LEVELS, "--prompts", "32", "--input-len", "128",
                "--output-len", "32", "--needles", "4096", "--prefill-lens", "2048",
                "--arithmetic", "8", "--gsm8k", str(questions), "--deadline", "1",
                "--out", str(out / name), "--json",
            ],
            cwd=REPO, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait()
    receipt_file = out / name / "receipt.json"
    receipt = json.loads(receipt_file.read_text()) if receipt_file.exists() else {}
    return {"exit_code": done.returncode, "stderr_tail": done.stderr[-1500:], "receipt": receipt}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    described = gpu_state.describe()
    if not described["available"]:
        print(f"no GPU telemetry: {described['why']}", file=sys.stderr)
        return 1
    questions = write_gsm8k_questions(args.out / "gsm8k.jsonl", 24)
    stop, tflops = threading.Event(), {}
    loader = threading.Thread(target=_load, args=(stop, tflops), daemon=True)
    loader.start()
    try:
        runs = {name: _qualify(name, env, questions, args.out) for name, env in PROFILES.items()}
    finally:
        stop.set()
        loader.join()
    swept = [
        sweep.Swept(name, run["receipt"], f"{name}/receipt.json")
        for name, run in runs.items()
        if run["receipt"]
    ]
    levels = [int(level) for level in LEVELS.split(",")]
    chosen = sweep.choose(swept, levels, levels[-1])
    (args.out / "chosen.json").write_text(json.dumps(chosen, indent=2, sort_keys=True) + "\n")

    failures = []
    picked = {entry["concurrency"]: entry["profile"] for entry in chosen["levels"] if entry}
    if any(picked.get(level) != "standin-mtp" for level in levels):
        failures.append(f"chosen per level {picked}, expected standin-mtp at {levels}")
    fell = sweep.standing(runs["standin-wrong-gsm8k"]["receipt"])
    if fell[0] or fell[1] != "gate gsm8k":
        failures.append(f"the wrong profile was not stopped by its GSM8K gate: {fell}")
    # qualify stops at the first failed gate: the wrong profile has no speed levels at all.
    right = runs["standin-mtp"]
    levels_done = (right["receipt"].get("throughput") or {}).get("levels") or []
    if right["exit_code"] != 0 or not levels_done:
        failures.append(f"standin-mtp: exit {right['exit_code']}: {right['stderr_tail']}")
    elif not all(level["gpu"].get("sampled") for level in levels_done):
        failures.append("standin-mtp: levels without GPU samples")
    if runs["standin-wrong-gsm8k"]["exit_code"] != 8:
        failures.append(f"standin-wrong-gsm8k: exit {runs['standin-wrong-gsm8k']['exit_code']}")
    mtp = next(g for g in runs["standin-mtp"]["receipt"].get("gates", []) if g["name"] == "mtp")
    result = {
        "describe": described, "matmul_tflops_per_gpu": tflops, "runs": runs,
        "chosen": chosen, "mtp_gate": mtp, "failures": failures,
    }  # fmt: skip
    (args.out / "sweep-gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"chosen": picked, "mtp": mtp, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
