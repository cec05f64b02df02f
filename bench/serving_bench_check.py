"""The command `builder qualify` runs inside a server's container (sglang's own
bench_serving, builder/site/serving_bench.py), run for real against the stand-in server.

sglang's bench_serving imports sglang's runtime (torch and more), so it runs from a Python
that has sglang and its client's imports (bench/README.md says how to make one); the
stand-in (tests/standin_sglang.py) speaks sglang's /generate stream and needs no GPU. The
tokenizer is a small one made here (the client needs one on disk; no model is downloaded).

    .venv/bin/python bench/serving_bench_check.py --python /tmp/sgvenv/bin/python \
        --result bench/results/serving-bench-check.json

Fails (exit 1) unless every level completes every prompt with the exact token counts asked
for, through the same argv, key handling and result parsing qualify uses.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from builder.site import serving_bench  # noqa: E402
from builder.spec.engines import sglang  # noqa: E402

ENGINE = sglang.ENGINE  # the client this bench runs: sglang's bench_serving

KEY = "serving-bench-check-key"
MAKE_TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"<unk>": 0, **{f"t{i}": i + 1 for i in range(32000)}}
core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(sys.argv[1])
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a Python with sglang's bench_serving")
    parser.add_argument("--result", type=Path)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="serving-bench-"))
    tokenizer = work / "tokenizer"
    subprocess.run([args.python, "-c", MAKE_TOKENIZER, str(tokenizer)], check=True)
    version = subprocess.run(
        [args.python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    port = _free_port()
    info = {"tokenizer_path": str(tokenizer), "api_key": KEY}
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests/standin_sglang.py"), str(port), "--api-key", KEY],
        env={**os.environ, "STARTUP_SECONDS": "0", "SERVER_INFO": json.dumps(info)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    levels, failures = [], []
    try:
        time.sleep(1)
        for concurrency in map(int, args.concurrency.split(",")):
            prompts, input_len, output_len = 4 * concurrency, 128, 16
            argv = ENGINE.bench_command(
                base_url=f"http://127.0.0.1:{port}", model="standin", tokenizer=str(tokenizer),
                concurrency=concurrency, prompts=prompts, input_len=input_len,
                output_len=output_len, seed=serving_bench.level_seed(1, concurrency),
                deadline_s=300, output_file=str(work / f"c{concurrency}.jsonl"),
            )  # fmt: skip
            argv[argv.index("python3")] = args.python
            started = time.perf_counter()
            done = subprocess.run(
                argv,
                env={**os.environ, "OPENAI_API_KEY": KEY, "HF_HUB_OFFLINE": "1"},
                capture_output=True, text=True,
            )  # fmt: skip
            wall = time.perf_counter() - started
            if done.returncode != 0:
                failures.append(f"c={concurrency}: exit {done.returncode}: {done.stderr[-1500:]}")
                continue
            line = json.loads((work / f"c{concurrency}.jsonl").read_text().splitlines()[-1])
            level = serving_bench.level_from_result(
                ENGINE.bench_result(line),
                concurrency, prompts, serving_bench.level_seed(1, concurrency),
            )  # fmt: skip
            level["client_wall_s"] = round(wall, 1)
            levels.append(level)
            if (level["completed"], level["total_output_tokens"]) != (
                prompts,
                prompts * output_len,
            ):
                failures.append(f"c={concurrency}: {level}")
            if KEY in json.dumps(level):
                failures.append(f"c={concurrency}: the key is in the level")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "sglang": version,
        "module": ENGINE.bench_module,
        "argv_tail": argv[argv.index(ENGINE.bench_module) + 1 :],
        "levels": levels,
        "failures": failures,
    }
    text = json.dumps(result, indent=2) + "\n"
    if args.result:
        args.result.write_text(text)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
