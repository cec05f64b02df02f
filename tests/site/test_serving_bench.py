"""qualify's image client against the real sources of sglang's bench_serving (0.5.9's sdist
and 0.5.23's release, from PyPI): the module builder runs exists in both, every option it
passes is one of that parser's, and every key it reads is in the result line it writes.
The source is read, not run: importing it starts sglang's whole GPU runtime.
"""

from __future__ import annotations

import ast
import tarfile
import tomllib
import zipfile

import pytest

from builder.site import serving_bench
from builder.spec.engines import sglang
from tests.conftest import REPO_ROOT
from tests.upstreams import fetch_release_file, fetch_sdist

SGLANG = sglang.ENGINE
RELEASE = tomllib.loads((REPO_ROOT / "forks/sglang/pin.toml").read_text())["ref"]


def _sources(version: str) -> dict[str, str]:
    """The package's bench modules by path, from the release builder's targets pin."""
    if version == "0.5.9":
        with tarfile.open(fetch_sdist("sglang", "0.5.9")) as sdist:
            member = sdist.extractfile("sglang-0.5.9/sglang/bench_serving.py")
            return {"sglang/bench_serving.py": member.read().decode()}
    with zipfile.ZipFile(fetch_release_file("sglang", RELEASE)) as wheel:
        names = ("sglang/bench_serving.py", "sglang/benchmark/serving.py")
        return {name: wheel.read(name).decode() for name in names}


@pytest.fixture(scope="module", params=["0.5.9", "0.5.23"])
def bench(request) -> tuple[str, ast.Module]:
    sources = _sources(request.param)
    forwarded = sources.get("sglang/benchmark/serving.py")
    if forwarded:  # 0.5.23: the old module name starts the new module's CLI
        shim = sources["sglang/bench_serving.py"]
        assert "from sglang.benchmark.serving import cli_main" in shim
        assert 'if __name__ == "__main__":\n    cli_main()' in shim
    code = forwarded or sources["sglang/bench_serving.py"]
    return request.param, ast.parse(code)


def _options(tree: ast.Module) -> dict[str, list | None]:
    """Each `*.add_argument("--flag", ..., choices=[...])`: flag -> its literal choices."""
    options = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            choices = next((k.value for k in node.keywords if k.arg == "choices"), None)
            literal = ast.literal_eval(choices) if isinstance(choices, ast.List) else None
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    options[arg.value] = literal
    return options


def test_every_option_builder_passes_is_bench_servings(bench) -> None:
    version, tree = bench
    options = _options(tree)
    argv = SGLANG.bench_command(
        base_url="http://127.0.0.1:30000", model="m", tokenizer="t", concurrency=4, prompts=8,
        input_len=64, output_len=8, seed=1, deadline_s=60, output_file="/tmp/x.jsonl",
    )  # fmt: skip
    passed = argv[argv.index(SGLANG.bench_module) + 1 :]
    assert argv[argv.index("-m") + 1] == "sglang.bench_serving"
    for position, word in enumerate(passed):
        if word.startswith("--"):
            assert word in options, f"sglang {version}'s bench_serving has no {word}"
            choices = options[word]
            value = passed[position + 1] if position + 1 < len(passed) else None
            if choices is not None and value is not None and not value.startswith("--"):
                assert value in choices, (version, word, value)
    assert "random-ids" in options["--dataset-name"]


def test_every_key_builder_reads_is_in_the_result_line(bench) -> None:
    version, tree = bench
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"output_throughput", "median_ttft_ms"} <= keys:
                break
    else:
        pytest.fail(f"sglang {version}: no result dict with output_throughput")
    assert set(SGLANG.bench_result_keys) <= keys, set(SGLANG.bench_result_keys) - keys
    source = ast.unparse(tree)
    assert serving_bench.API_KEY_ENV in source  # where builder puts the server's key


def test_a_result_line_becomes_a_receipt_level() -> None:
    line = {
        "completed": 7, "duration": 2.0, "total_output_tokens": 56, "request_throughput": 3.5,
        "output_throughput": 28.0, "mean_ttft_ms": 5.0, "median_ttft_ms": 4.0,
        "p99_ttft_ms": 9.0, "mean_tpot_ms": 2.0, "median_tpot_ms": 2.1, "p99_tpot_ms": 3.0,
        "mean_e2e_latency_ms": 20.0, "median_e2e_latency_ms": 19.0, "p99_e2e_latency_ms": 30.0,
    }  # fmt: skip
    level = serving_bench.level_from_result(line, concurrency=4, prompts=8, seed=7)
    assert (level["completed"], level["failed"], level["sent"]) == (7, 1, 8)
    assert level["first_error"] == "1 of 8 requests did not complete"
    assert level["ttft_ms"] == {"mean": 5.0, "p50": 4.0, "p99": 9.0}
    assert level["e2e_latency_ms"]["p99"] == 30.0 and level["output_throughput"] == 28.0
    assert serving_bench.level_seed(1, 64) != serving_bench.level_seed(1, 1)
