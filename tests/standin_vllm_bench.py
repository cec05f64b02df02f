"""A stand-in for `vllm bench serve` (`python3 -m vllm.entrypoints.cli.main bench serve`),
inside the stand-in vLLM server's container: no GPU exists here, and the real client
imports vLLM, which no test image here has. Its options are those vLLM 0.34.0's
benchmarks/serve.py declares (docs/research/vllm-0.34-b12x.md §6); argparse refuses any
other, as the real one does.

It sends --num-prompts random token-id prompts of exactly --random-input-len tokens to
/v1/completions, streaming, with at most --max-concurrency in flight, the key from
OPENAI_API_KEY and a temperature only when --temperature gives one (as 0.34.0's), and reads
each request as the real client does: TTFT at the first chunk with choices, the tokens from
the usage chunk. With --save-result it writes one JSON object, as vLLM's json.dump does (no
newline), to --result-dir/--result-filename, with the real result keys (`e2el` for
end-to-end latency, `p99_*` from --metric-percentiles). With BENCH_FAIL=1 it dies the way a
broken client would; with EXPECT_TOKENIZER it checks the tokenizer it was given is the
server's.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    parser.add_argument("command", choices=["bench"])
    parser.add_argument("bench", choices=["serve"])
    for flag in (
        "--backend", "--base-url", "--model", "--tokenizer", "--dataset-name",
        "--percentile-metrics", "--metric-percentiles", "--result-dir", "--result-filename",
        "--random-range-ratio",
    ):  # fmt: skip
        parser.add_argument(flag, required=True)
    for flag in (
        "--random-input-len", "--random-output-len", "--num-prompts", "--max-concurrency",
        "--seed",
    ):  # fmt: skip
        parser.add_argument(flag, type=int, required=True)
    for flag in ("--ignore-eos", "--save-result", "--disable-tqdm", "--trust-remote-code"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--temperature", type=float)
    return parser.parse_args()


def headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")
    return {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {key}"} if key else {}),
    }


def one(args: argparse.Namespace, prompt: list[int]) -> tuple[float, float, int]:
    body = {
        "model": args.model, "prompt": prompt, "max_tokens": args.random_output_len,
        "ignore_eos": args.ignore_eos, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    if args.temperature is not None:  # as the real one: no temperature unless told
        body["temperature"] = args.temperature
    request = urllib.request.Request(
        args.base_url + "/v1/completions", json.dumps(body).encode(), headers(), method="POST"
    )
    started = time.perf_counter()
    ttft, tokens = 0.0, 0
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            if not line.startswith(b"data:") or b"[DONE]" in line:
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and not ttft:
                ttft = time.perf_counter() - started
            elif chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft, time.perf_counter() - started, tokens


def main() -> None:
    args = parse()
    if os.environ.get("BENCH_FAIL") == "1":
        sys.exit("RuntimeError: CUDA error: no kernel image is available for execution")
    assert args.backend == "vllm" and args.dataset_name == "random", args
    assert args.ignore_eos and args.save_result and args.random_range_ratio == "0", args
    assert args.temperature == 0, args
    assert args.tokenizer == os.environ.get("EXPECT_TOKENIZER", args.tokenizer), args
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(1000, 30000) for _ in range(args.random_input_len)]
        for _ in range(args.num_prompts)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(args.max_concurrency) as pool:
        done = list(pool.map(lambda prompt: one(args, prompt), prompts))
    duration = time.perf_counter() - started
    output = sum(tokens for _, _, tokens in done)
    result = {
        "backend": args.backend,
        "model_id": args.model,
        "tokenizer_id": args.tokenizer,
        "max_concurrency": args.max_concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": 0,
        "total_output_tokens": output,
        "request_throughput": len(done) / duration,
        "output_throughput": output / duration,
    }
    metrics = {
        "ttft": [ttft for ttft, _, _ in done],
        "tpot": [(e2el - ttft) / (n - 1) for ttft, e2el, n in done if n > 1],
        "e2el": [e2el for _, e2el, _ in done],
    }
    for metric, values in metrics.items():
        ordered = sorted(values)
        result[f"mean_{metric}_ms"] = statistics.fmean(ordered) * 1000
        result[f"median_{metric}_ms"] = statistics.median(ordered) * 1000
        for percentile in args.metric_percentiles.split(","):
            at = min(len(ordered) - 1, round(int(percentile) / 100 * (len(ordered) - 1)))
            result[f"p{percentile}_{metric}_ms"] = ordered[at] * 1000
    with open(os.path.join(args.result_dir, args.result_filename), "w") as file:
        json.dump(result, file)
    print(f"Successful requests: {len(done)}")


if __name__ == "__main__":
    main()
