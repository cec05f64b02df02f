"""sglang's own `bench_serving`, run inside the server's container, for `builder qualify`.

The client then is the one sglang ships with the very server it measures (same version,
same request shapes, same metric code), and it loads the server's tokenizer where the
server does. `python3 -m sglang.bench_serving` is the module in sglang 0.5.9 and still
starts sglang 0.5.23's (which moved to `sglang.benchmark.serving` and forwards). Its
options and result keys below are in both versions' source (tests/site/test_serving_bench.py
reads them there): `random-ids` prompts of exactly --random-input-len token ids
(`--tokenize-prompt`, `--random-range-ratio 1`), no dataset download.

The server's key goes in the exec's environment (`OPENAI_API_KEY`, which bench_serving
reads), never on its command line; only metric keys are read back from its result line
(which also holds the server's /server_info).
"""

from __future__ import annotations

import json
import uuid

from docker.errors import APIError

MODULE = "sglang.bench_serving"

# The result line's keys (sglang/bench_serving.py 0.5.9, sglang/benchmark/serving.py 0.5.23).
RESULT_KEYS = (
    "completed", "duration", "total_output_tokens", "request_throughput", "output_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
    "p99_tpot_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
)  # fmt: skip

_FIND = (
    "import importlib.util, sys; "
    f"sys.exit(0 if importlib.util.find_spec({MODULE!r}.rsplit('.', 1)[0]) "
    f"and importlib.util.find_spec({MODULE!r}) else 3)"
)


def missing(container) -> str | None:
    """Why the container cannot run sglang's bench_serving, or None when it can."""
    try:
        exit_code, output = container.exec_run(["python3", "-c", _FIND])
    except APIError as exc:
        return f"nothing runs in it ({exc.explanation or exc})"
    if exit_code == 0:
        return None
    if exit_code == 3:
        return f"its image has no {MODULE}"
    text = output.decode(errors="replace").strip().splitlines()
    return f"python3 in it failed ({text[-1] if text else f'exit {exit_code}'})"


def level_seed(seed: int, concurrency: int) -> int:
    """A seed per level, so no level is served from an earlier level's prefix cache."""
    return seed * 100_003 + concurrency


def command(
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    concurrency: int,
    prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    deadline_s: int,
    output_file: str,
) -> list[str]:
    """The exec's command: bench_serving under coreutils' timeout (it has no time bound
    of its own; SIGINT first, so it can exit cleanly)."""
    return [
        "timeout", "--signal=INT", "--kill-after=30", str(deadline_s),
        "python3", "-m", MODULE,
        "--backend", "sglang",
        "--base-url", base_url,
        "--model", model,
        "--tokenizer", tokenizer,
        "--dataset-name", "random-ids",
        "--tokenize-prompt",
        "--random-input-len", str(input_len),
        "--random-output-len", str(output_len),
        "--random-range-ratio", "1",
        "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency),
        "--seed", str(seed),
        "--output-file", output_file,
        "--disable-tqdm",
    ]  # fmt: skip


def _millis(result: dict, metric: str) -> dict[str, float | None]:
    def value(key: str) -> float | None:
        number = result.get(f"{key}_{metric}_ms")
        return round(float(number), 2) if isinstance(number, int | float) else None

    return {"mean": value("mean"), "p50": value("median"), "p99": value("p99")}


def level_from_result(result: dict, concurrency: int, prompts: int, seed: int) -> dict:
    """bench_serving's result line as a receipt level (the same fields as builder's own
    client writes)."""
    completed = int(result.get("completed") or 0)
    duration = float(result.get("duration") or 0)
    return {
        "concurrency": concurrency,
        "prompts": prompts,
        "seed": seed,
        "sent": prompts,
        "completed": completed,
        "failed": max(prompts - completed, 0),
        "first_error": None
        if completed >= prompts
        else f"{prompts - completed} of {prompts} requests did not complete",
        "stopped_by_time": False,
        "duration_s": round(duration, 3),
        "request_throughput": round(float(result.get("request_throughput") or 0), 3),
        "output_throughput": round(float(result.get("output_throughput") or 0), 2),
        "total_output_tokens": int(result.get("total_output_tokens") or 0),
        "ttft_ms": _millis(result, "ttft"),
        "tpot_ms": _millis(result, "tpot"),
        "e2e_latency_ms": _millis(result, "e2e_latency"),
    }


def _failed_level(concurrency: int, prompts: int, seed: int, error: str) -> dict:
    level = level_from_result({}, concurrency, prompts, seed)
    level.update(sent=0, failed=0, first_error=error)
    return level


def run_level(
    container,
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    api_key: str | None,
    concurrency: int,
    prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    deadline_s: int,
) -> dict:
    """One concurrency level through bench_serving in `container`; a run that fails or
    writes no result is a level with nothing completed and bench_serving's last line."""
    seed = level_seed(seed, concurrency)
    output_file = f"/tmp/builder-qualify-{uuid.uuid4().hex[:12]}.jsonl"
    environment = {"HF_HUB_OFFLINE": "1"}  # the server has its tokenizer in the cache
    if api_key:
        environment["OPENAI_API_KEY"] = api_key
    argv = command(
        base_url=base_url, model=model, tokenizer=tokenizer, concurrency=concurrency,
        prompts=prompts, input_len=input_len, output_len=output_len, seed=seed,
        deadline_s=deadline_s, output_file=output_file,
    )  # fmt: skip
    try:
        exit_code, output = container.exec_run(argv, environment=environment)
        _, written = container.exec_run(
            ["sh", "-c", f"cat {output_file}; rm -f {output_file}"], stderr=False
        )
    except APIError as exc:
        return _failed_level(
            concurrency, prompts, seed, f"{MODULE}: cannot exec ({exc.explanation or exc})"
        )
    lines = [line for line in written.decode(errors="replace").splitlines() if line.strip()]
    if exit_code != 0 or not lines:
        said = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
        why = {124: f"stopped after {deadline_s} s", 137: f"killed after {deadline_s} s"}
        error = f"{MODULE} {why.get(exit_code, f'exited {exit_code}')}"
        return _failed_level(
            concurrency, prompts, seed, f"{error}: {said[-1][:300] if said else 'no output'}"
        )
    try:
        result = json.loads(lines[-1])
    except ValueError:
        return _failed_level(concurrency, prompts, seed, f"{MODULE} wrote no JSON result")
    if not isinstance(result, dict):
        return _failed_level(concurrency, prompts, seed, f"{MODULE} wrote no JSON result")
    return level_from_result(
        {key: result.get(key) for key in RESULT_KEYS}, concurrency, prompts, seed
    )
