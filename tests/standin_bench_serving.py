"""A stand-in for sglang's `python3 -m sglang.bench_serving`, inside the stand-in server's
container: the real one imports sglang's whole GPU runtime (torch, sgl_kernel, flashinfer)
at start, which no test image here has. tests/site/test_serving_bench.py checks against the real
0.5.9 and 0.5.23 sources that every option builder passes exists there and every key builder
reads is in its result line.

It takes only the options builder passes (argparse refuses any other, as the real one
does), sends `random-ids` prompts to /generate, streaming, with at most --max-concurrency
in flight and the key from OPENAI_API_KEY, and appends one JSON line to --output-file with
the real result keys, the server's /server_info among them (as the real one does). With
BENCH_FAIL=1 it dies the way a broken client would.
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
    parser = argparse.ArgumentParser(prog="sglang.bench_serving", allow_abbrev=False)
    for flag in (
        "--backend", "--base-url", "--model", "--tokenizer", "--dataset-name",
        "--output-file",
    ):  # fmt: skip
        parser.add_argument(flag, required=True)
    for flag in (
        "--random-input-len", "--random-output-len", "--num-prompts", "--max-concurrency",
        "--seed",
    ):  # fmt: skip
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--random-range-ratio", type=float, required=True)
    parser.add_argument("--tokenize-prompt", action="store_true")
    parser.add_argument("--disable-tqdm", action="store_true")
    return parser.parse_args()


def headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")
    return {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {key}"} if key else {}),
    }


def one(base_url: str, input_ids: list[int], output_len: int) -> tuple[float, float, int]:
    body = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    request = urllib.request.Request(
        base_url + "/generate", json.dumps(body).encode(), headers(), method="POST"
    )
    started = time.perf_counter()
    ttft, tokens = 0.0, 0
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                count = json.loads(line[5:])["meta_info"]["completion_tokens"]
                if not tokens:
                    ttft = time.perf_counter() - started
                tokens = count
    return ttft, time.perf_counter() - started, tokens


def main() -> None:
    args = parse()
    if os.environ.get("BENCH_FAIL") == "1":
        sys.exit("RuntimeError: CUDA error: no kernel image is available for execution")
    assert args.backend == "sglang" and args.dataset_name == "random-ids", args
    assert args.tokenize_prompt and args.random_range_ratio == 1, args
    # The tokenizer the server loaded (its /server_info), where the test says which it is.
    assert args.tokenizer == os.environ.get("EXPECT_TOKENIZER", args.tokenizer), args
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(1000, 30000) for _ in range(args.random_input_len)]
        for _ in range(args.num_prompts)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(args.max_concurrency) as pool:
        done = list(pool.map(lambda p: one(args.base_url, p, args.random_output_len), prompts))
    duration = time.perf_counter() - started
    info_request = urllib.request.Request(args.base_url + "/server_info", headers=headers())
    with urllib.request.urlopen(info_request, timeout=10) as response:
        server_info = json.loads(response.read())

    def ms(values: list[float]) -> dict:
        ordered = sorted(values)
        return {
            "mean": statistics.fmean(ordered) * 1000,
            "median": statistics.median(ordered) * 1000,
            "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000,
        }

    output = sum(tokens for _, _, tokens in done)
    result = {
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "max_concurrency": args.max_concurrency,
        "server_info": server_info,
        "duration": duration,
        "completed": len(done),
        "total_output_tokens": output,
        "request_throughput": len(done) / duration,
        "output_throughput": output / duration,
    }
    metrics = {
        "ttft": [ttft for ttft, _, _ in done],
        "tpot": [(e2e - ttft) / (n - 1) for ttft, e2e, n in done if n > 1],
        "e2e_latency": [e2e for _, e2e, _ in done],
    }
    for metric, values in metrics.items():
        for stat, value in ms(values).items():
            result[f"{stat}_{metric}_ms"] = value
    with open(args.output_file, "a") as file:
        file.write(json.dumps(result) + "\n")
    print(f"Successful requests: {len(done)}")


if __name__ == "__main__":
    main()
