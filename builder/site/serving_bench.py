"""The engine's own benchmark client, run inside the server's container, for `builder
qualify`: sglang's `bench_serving`, vLLM's `vllm bench serve` (builder/spec/engines builds
each command and names each result key).

The client then is the one the engine ships with the very server it measures (same version,
same request shapes, same metric code), and it loads the server's tokenizer where the
server does. sglang: `python3 -m sglang.bench_serving` is the module in sglang 0.5.9 and
still starts sglang 0.5.23's (which moved to `sglang.benchmark.serving` and forwards). Its
options and result keys are in both versions' source (tests/site/test_serving_bench.py
reads them there): `random-ids` prompts of exactly --random-input-len token ids
(`--tokenize-prompt`, `--random-range-ratio 1`), no dataset download. vLLM: `vllm bench
serve --dataset-name random --ignore-eos`, its result JSON saved to the file named
(`--save-result --result-dir --result-filename`; docs/research/vllm-0.34-b12x.md §6).

The server's key goes in the exec's environment (`OPENAI_API_KEY`, which both clients
read), never on its command line; only metric keys are read back from the result (which
for sglang also holds the server's /server_info).
"""

from __future__ import annotations

import json
import uuid

from docker.errors import APIError

from builder.spec.engines import Engine

# The variable both clients read the server's key from (sglang's bench_serving; vLLM's
# benchmarks/lib/endpoint_request_func.py:169-176): tests/site hold each to its source.
API_KEY_ENV = "OPENAI_API_KEY"
# Each package on the module's path in turn: a missing one is exit 3, not an import error.
_FIND = (
    "import importlib.util, sys; parts = sys.argv[1].split('.'); "
    "sys.exit(0 if all(importlib.util.find_spec('.'.join(parts[:n])) "
    "for n in range(1, len(parts) + 1)) else 3)"
)


def missing(container, engine: Engine) -> str | None:
    """Why the container cannot run the engine's benchmark client, or None when it can."""
    try:
        exit_code, output = container.exec_run(["python3", "-c", _FIND, engine.bench_module])
    except APIError as exc:
        return f"nothing runs in it ({exc.explanation or exc})"
    if exit_code == 0:
        return None
    if exit_code == 3:
        return f"its image has no {engine.bench_module}"
    text = output.decode(errors="replace").strip().splitlines()
    return f"python3 in it failed ({text[-1] if text else f'exit {exit_code}'})"


def level_seed(seed: int, concurrency: int) -> int:
    """A seed per level, so no level is served from an earlier level's prefix cache."""
    return seed * 100_003 + concurrency


def _millis(result: dict, metric: str) -> dict[str, float | None]:
    def value(key: str) -> float | None:
        number = result.get(f"{key}_{metric}_ms")
        return round(float(number), 2) if isinstance(number, int | float) else None

    return {"mean": value("mean"), "p50": value("median"), "p99": value("p99")}


def level_from_result(result: dict, concurrency: int, prompts: int, seed: int) -> dict:
    """The client's result (in bench_serving's key names: `Engine.bench_result`) as a
    receipt level (the same fields as builder's own client writes)."""
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
    engine: Engine,
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
    """One concurrency level through the engine's client in `container`; a run that fails
    or writes no result is a level with nothing completed and the client's last line."""
    seed = level_seed(seed, concurrency)
    output_file = f"/tmp/builder-qualify-{uuid.uuid4().hex[:12]}.jsonl"
    environment = {"HF_HUB_OFFLINE": "1"}  # the server has its tokenizer in the cache
    if api_key:
        environment[API_KEY_ENV] = api_key
    argv = engine.bench_command(
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
            concurrency,
            prompts,
            seed,
            f"{engine.bench_name}: cannot exec ({exc.explanation or exc})",
        )
    lines = [line for line in written.decode(errors="replace").splitlines() if line.strip()]
    if exit_code != 0 or not lines:
        said = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
        why = {124: f"stopped after {deadline_s} s", 137: f"killed after {deadline_s} s"}
        error = f"{engine.bench_name} {why.get(exit_code, f'exited {exit_code}')}"
        return _failed_level(
            concurrency, prompts, seed, f"{error}: {said[-1][:300] if said else 'no output'}"
        )
    try:
        result = json.loads(lines[-1])
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return _failed_level(
            concurrency, prompts, seed, f"{engine.bench_name} wrote no JSON result"
        )
    return level_from_result(engine.bench_result(result), concurrency, prompts, seed)
