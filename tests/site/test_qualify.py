"""`builder qualify` against the stand-in sglang server in a real container on the real engine.

No GPU exists here: tests/standin_sglang.py plays the model (right answers, garbled text, or
a needle lost past N tokens) and streams /generate; NVML finds no driver, which the receipt
must say rather than invent figures. The GPU sampler's arithmetic is checked with a
stand-in NVML module for the same reason.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from builder.site import gpu_state
from tests.conftest import GOOD_INFO, REPO_ROOT, Builder
from tests.services import free_port
from tests.standin_sglang import write_gsm8k_questions

pytestmark = pytest.mark.docker

SCHEMA = json.loads((REPO_ROOT / "manifests" / "receipt-v1.json").read_text())
# The hub cannot be reached from here: GSM8K is a generated file or left out (--gsm8k none).
NO_GSM8K = ["--gsm8k", "none"]
SMALL = ["--concurrency", "1,4", "--prompts", "8", "--input-len", "64", "--output-len", "8",
         "--prefill-lens", "512,65536", *NO_GSM8K]  # fmt: skip
KEY = "s3cret-qualify-key"


def qualify(builder: Builder, docker_host: str, *args: str):
    return builder.run("qualify", *args, env={"DOCKER_HOST": docker_host}, check=False)


def receipt_of(out: Path) -> dict:
    receipt = json.loads((out / "receipt.json").read_text())
    validator = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
    validator.validate(receipt)
    return receipt


def key_file(path: Path, key: str) -> str:
    path.write_text(key + "\n")
    path.chmod(0o600)
    return str(path)


def test_a_right_server_qualifies_with_every_figure_in_the_receipt(
    builder, docker_host, standin, tmp_path
) -> None:
    url, name = standin(args=("--api-key", KEY), STARTUP_SECONDS="2")
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, *SMALL,
        "--api-key-file", key_file(tmp_path / "key", KEY), "--arithmetic", "4",
        "--gsm8k", str(write_gsm8k_questions(tmp_path / "gsm8k.jsonl", 8)),
        "--needles", "4096,16384,65536", "--out", str(out), "--allow-partial",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    receipt = receipt_of(out)
    # No builder image (no verify), no --profile (no backends): every check that ran passed,
    # and the verdict says what did not run (exit 0 only with --allow-partial).
    result_ = receipt["result"]
    assert (result_["ok"], result_["failed_at"], result_["verdict"]) == (False, None, "partial")
    said = re.fullmatch(
        r"every check that ran passed; not checked: verify \((\S+) is not a builder image \(no "
        r"io\.builder labels\)\); backends \(no --profile, and the container has no launch labels\)",
        result_["message"],
    )
    image = receipt["server"]["image"]
    assert said and said.group(1) in (image["reference"], image.get("id")), result_["message"]
    assert receipt["server"]["container"] == name
    assert receipt["server"]["command"][-3:] == [url.rsplit(":", 1)[1], "--api-key", "<redacted>"]
    assert receipt["startup"]["state"] == "ready"
    # From the container's start to sglang's ready line (the stand-in's 2 s of loading).
    assert receipt["startup"]["ready_seconds_from"] == "container start (its log)"
    assert 2 <= receipt["startup"]["ready_seconds"] < 30
    assert receipt["startup"]["compiled_at_start"] == {
        "flashinfer": [], "deep_gemm": [], "sglang_jit": [], "triton": []
    }  # fmt: skip
    probes = receipt["correctness"]["probes"]
    assert [p["name"] for p in probes] == [
        "add",
        "multiply",
        "subtract",
        "capital",
        "planet",
        "water",
    ]
    needles = receipt["correctness"]["needles"]
    # 65536 is clamped to the served context (32768) less room for the answer.
    assert [n["target_tokens"] for n in needles] == [4096, 16384, 32768 - 256]
    assert all(n["ok"] and n["past_top_k"] and n["prompt_tokens"] > 2048 for n in needles)
    statuses = {gate["name"]: (gate["status"], gate["result"]) for gate in receipt["gates"]}
    assert statuses == {
        "probes": ("passed", "6/6"), "arithmetic": ("passed", "4/4"),
        "identical": ("passed", "32/32"), "needle": ("passed", "3/3"),
        "gsm8k": ("passed", "1.0000 (8/8)"), "mtp": ("skipped", "-"),
    }  # fmt: skip
    unchecked = [n["what"] for n in receipt["not_checked"]]
    assert unchecked == ["backends", "GPU state", "verify"]
    prefill = receipt["throughput"]["prefill"]
    assert prefill[0]["input_len"] == 512 and prefill[0]["completed"] == 4
    assert prefill[0]["prefill_tok_s"] > 0 and prefill[0]["ttft_ms"]["p50"] > 0
    assert prefill[1] == {"input_len": 65536, "skipped": "over the served context (32768)"}
    levels = receipt["throughput"]["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert (level["completed"], level["failed"], level["total_output_tokens"]) == (8, 0, 64)
        assert level["output_throughput"] > 0 and level["ttft_ms"]["p50"] > 0
        assert level["tpot_ms"]["p50"] >= 1.5  # the stand-in streams a token each 2 ms
        assert level["gpu"]["sampled"] is False and "NVML" in level["gpu"]["why"]
    assert receipt["gpus"]["available"] is False and "NVML" in receipt["gpus"]["why"]
    assert (out / "receipt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The stand-in image has no sglang: builder's own client, and the receipt says why.
    assert receipt["throughput"]["client"].startswith("builder")
    assert receipt["throughput"]["client_why"] == (
        f"container {name}: its image has no sglang.bench_serving"
    )
    assert "partial, not qualified: every check that ran passed; not checked: verify" in (
        result.stdout
    )
    assert "qualified: every check passed" not in result.stdout
    for text in (result.stdout, result.stderr, (out / "receipt.json").read_text()):
        assert KEY not in text


STANDIN_BENCH = REPO_ROOT / "tests" / "standin_bench_serving.py"


def standin_with_bench_serving(standin, tmp_path: Path, **env: str) -> tuple[str, str]:
    """The stand-in server in a container that also has `sglang.bench_serving` (the stand-in
    client, tests/standin_bench_serving.py), as a real sglang image has the real one."""
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "bench_serving.py").write_text(STANDIN_BENCH.read_text())
    site = {str(package.parent): {"bind": "/opt/standin-site", "mode": "ro"}}
    info = {**GOOD_INFO, "tokenizer_path": "/models/standin", "api_key": KEY}
    return standin(
        volumes=site, args=("--api-key", KEY), STARTUP_SECONDS="0",
        PYTHONPATH="/opt/standin-site", SERVER_INFO=json.dumps(info),
        EXPECT_TOKENIZER="/models/standin", **env,
    )  # fmt: skip


def test_throughput_is_measured_by_the_images_own_bench_serving(
    builder, docker_host, standin, tmp_path
) -> None:
    url, name = standin_with_bench_serving(standin, tmp_path)
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, *SMALL, "--needles", "4096",
        "--api-key-file", key_file(tmp_path / "key", KEY), "--out", str(out), "--allow-partial",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    receipt = receipt_of(out)
    throughput = receipt["throughput"]
    assert throughput["client"] == "sglang.bench_serving in the server's image"
    assert throughput["client_why"] == f"from container {name}"
    levels = throughput["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert (level["completed"], level["failed"], level["total_output_tokens"]) == (8, 0, 64)
        assert level["ttft_ms"]["p50"] > 0 and level["tpot_ms"]["p50"] >= 1.5
        assert level["gpu"]["sampled"] is False
    assert levels[0]["seed"] != levels[1]["seed"]  # no level replays another's prompts
    assert "throughput client: sglang.bench_serving in the server's image" in result.stdout
    # The key went to the client through its environment, and bench_serving's copy of the
    # server's /server_info (which holds it here) stayed out of the receipt.
    for text in (result.stdout, result.stderr, (out / "receipt.json").read_text()):
        assert KEY not in text


def test_a_bench_serving_that_fails_fails_qualify_at_throughput(
    builder, docker_host, standin, tmp_path
) -> None:
    url, name = standin_with_bench_serving(standin, tmp_path, BENCH_FAIL="1")
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, *SMALL, "--needles", "4096",
        "--client", "image", "--api-key-file", key_file(tmp_path / "key", KEY),
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 8, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["result"]["failed_at"] == "throughput"
    assert receipt["result"]["message"] == (
        "concurrency 1: no request completed (sglang.bench_serving exited 1: "
        "RuntimeError: CUDA error: no kernel image is available for execution)"
    )


def test_client_image_without_sglang_in_the_container_is_one_line(
    builder, docker_host, standin, tmp_path
) -> None:
    url, name = standin(STARTUP_SECONDS="0")
    result = qualify(
        builder, docker_host, url, "--container", name, "--client", "image", *NO_GSM8K,
        "--out", str(tmp_path / "q"),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"error: --client image: container {name}: its image has no sglang.bench_serving"
    )
    assert not (tmp_path / "q" / "receipt.json").exists()


@pytest.mark.parametrize(
    ("env", "args", "failed_at", "message"),
    [
        ({"WRONG_TEXT": "1"}, (), "correctness",
         "probe add ('What is 17 + 25? Reply with the number only.'): expected '42'"),
        ({"NEEDLE_LIMIT": "8000"}, (), "correctness", "needle at 16"),
        ({"WRITE_AT_START": "/root/.cache/sglang/deep_gemm/cache/kernel.mqa.1/kernel.cubin"},
         (), "startup", "1 JIT compiles (deep_gemm: kernel.mqa.1); they are on the sglang cache "
         "volume now: restart and qualify again"),
        ({}, ("--api-key-file", "WRONG"), "startup", "the API key is not the server's"),
    ],
    ids=["garbled-text", "needle-lost-past-top-k", "compiled-at-start", "wrong-key"],
)  # fmt: skip
def test_a_wrong_server_fails_at_the_check_that_shows_it(
    builder, docker_host, standin, tmp_path, env, args, failed_at, message
) -> None:
    url, name = standin(args=("--api-key", KEY), STARTUP_SECONDS="0", **env)
    args = tuple(key_file(tmp_path / "wrong", "not-the-key") if a == "WRONG" else a for a in args)
    if "--api-key-file" not in args:
        args += ("--api-key-file", key_file(tmp_path / "key", KEY))
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, *SMALL, "--needles", "4096,16384",
        "--out", str(out), *args,
    )  # fmt: skip
    assert result.returncode == 8, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["result"]["ok"] is False and receipt["result"]["failed_at"] == failed_at
    assert message in receipt["result"]["message"]
    last = result.stdout.strip().splitlines()[-2]
    assert last.startswith(f"NOT qualified: {failed_at}: ") and message in last
    assert receipt["throughput"] is None  # it stopped at the first hard failure


def test_compiles_on_a_hosts_first_start_can_be_accepted(
    builder, docker_host, standin, tmp_path
) -> None:
    url, name = standin(
        STARTUP_SECONDS="0",
        WRITE_AT_START="/root/.cache/sglang/jit/sm_120/topk_v2/build-1/deps-2/topk_v2.so",
    )
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--no-throughput", "--needles", "4096",
        "--accept-start-compiles", *NO_GSM8K, "--out", str(out), "--allow-partial",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["startup"]["compiled_at_start"]["sglang_jit"] == ["topk_v2"]
    assert receipt["throughput"] is None and receipt["result"]["verdict"] == "partial"
    assert "JIT compiles at start-up: flashinfer 0, deep_gemm 0, sglang_jit 1" in result.stdout


def test_no_server_is_one_line_and_a_receipt_that_says_so(builder, tmp_path) -> None:
    out = tmp_path / "q"
    url = f"http://127.0.0.1:{free_port()}"
    result = builder.run(
        "qualify", url, "--deadline", "0s", *NO_GSM8K, "--out", str(out), check=False
    )
    assert result.returncode == 8
    assert "NOT qualified: startup: timeout: not ready after" in result.stdout
    assert "nothing is listening there" in result.stdout
    assert receipt_of(out)["startup"]["state"] == "timeout"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "qualify: give the server URL (http://HOST:PORT), --start to launch one, --sweep P1,P2"),
        (["--sweep", "a", "http://127.0.0.1:1"], "qualify --sweep starts each profile itself: give no URL"),
        (["--sweep", "a", "--no-throughput"], "--no-throughput: not with --sweep (it chooses by speed"),
        (["--sweep", "a", "--concurrency", "1,4"], "--choose-at 32: not one of the --concurrency levels (1,4)"),
        (["--sweep", "a,a"], "--sweep 'a,a': expected profile names, each once"),
        (["--sweep", "glm5-nvfp4-tp8,nosuch"], "unknown profile 'nosuch'"),
        (["--sweep", "glm5-nvfp4-tp8", "--set", "nosuch=1"], "--set nosuch: profile 'glm5-nvfp4-tp8' has no such param"),
        (["--sweep", "glm5-nvfp4-tp8,glm5-nvfp4-tp8-fusion", "--set", "glm5-nvfp4-tp8-fusion:nosuch=1"],
         "--set nosuch: profile 'glm5-nvfp4-tp8-fusion' has no such param"),
        (["--sweep", "glm5-nvfp4-tp8", "--set", "glm5-nvfp4-tp8-fusion:port=1"],
         "--set glm5-nvfp4-tp8-fusion:port=1: profile glm5-nvfp4-tp8-fusion is not in --sweep (glm5-nvfp4-tp8)"),
        (["http://127.0.0.1:1", "--gsm8k", "/nonexistent.jsonl"], "--gsm8k /nonexistent.jsonl: cannot read it"),
        (["http://127.0.0.1:1", "--arithmetic", "0"], "--arithmetic 0: must be a whole number above 0"),
        (["http://127.0.0.1:1", "--prefill-lens", "8k"], "--prefill-lens '8k': expected whole numbers above 0"),
        (["http://127.0.0.1:1", "--stall-minutes", "x"], "--stall-minutes x: must be a number of minutes"),
        (["http://127.0.0.1:1", "--start"], "qualify --start starts the server itself: give no URL"),
        (["http://127.0.0.1:1", "--port", "30001"], "--port: only with --start (it launches the server)"),
        (["http://127.0.0.1:1", "--concurrency", "0,4"], "--concurrency '0,4': expected whole numbers above 0"),
        (["http://127.0.0.1:1", "--needles", "x"], "--needles 'x': expected whole numbers above 0"),
        (["http://127.0.0.1:1", "--deadline", "nan"], "--deadline nan: must be a number of minutes, 0 or more"),
        (["http://127.0.0.1:1", "--deadline", "20x"], "--deadline 20x: must be a number of minutes"),
        (["http://127.0.0.1:1", "--output-len", "0"], "--output-len 0: must be a whole number above 0"),
        (["http://127.0.0.1:1", "--client", "image"], "--client image: needs --container NAME or --start"),
        (["ftp://127.0.0.1:1"], "qualify URL 'ftp://127.0.0.1:1': expected http://HOST:PORT"),
        (["--compare", "/nonexistent.json", "/nonexistent.json"], "--compare /nonexistent.json: not a readable receipt"),
    ],
)  # fmt: skip
def test_bad_qualify_input_is_one_line(builder, args, message) -> None:
    result = builder.run("qualify", *args, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr


def test_a_sweep_checks_every_profile_s_checkpoint_before_it_starts_any(tmp_path: Path) -> None:
    """#55: the MTP profile's checkpoint was read when the sweep reached it, after a full
    start of each profile before it. One model per profile (`--set PROFILE:model=DIR`);
    the second lacks its MTP layer: refused before any start (no Docker daemon here: a
    start would be a receipt saying so, and exit 8)."""
    from tests.spec.test_model_check import LAYERS, _builder, glm_config, write_checkpoint

    builder = _builder(tmp_path)
    plain = write_checkpoint(tmp_path / "GLM-5-NVFP4", glm_config(), range(LAYERS))
    no_mtp = write_checkpoint(tmp_path / "GLM-5-NVFP4-MTP", glm_config(), range(LAYERS))
    out = tmp_path / "q"
    result = builder.run(
        "qualify", "--target", "sm120", "--sweep", "glm5-nvfp4-tp8,glm5-nvfp4-tp8-mtp",
        "--set", f"glm5-nvfp4-tp8:model={plain}", "--set", f"glm5-nvfp4-tp8-mtp:model={no_mtp}",
        *NO_GSM8K, "--out", str(out), env={"DOCKER_HOST": "unix:///nonexistent.sock"},
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: profile glm5-nvfp4-tp8-mtp: {no_mtp} has no MTP weights: config.json declares "
        f"num_nextn_predict_layers 1 but model.safetensors.index.json has no model.layers."
        f"{LAYERS}.* tensor; use a checkpoint that ships the draft layer (e.g. "
        "festr2/GLM-5-NVFP4-MTP for GLM-5)"
    )
    assert not (out / "glm5-nvfp4-tp8").exists(), "nothing started"


def test_compare_puts_receipts_side_by_side_against_the_field(
    builder, docker_host, standin, tmp_path
) -> None:
    url, name = standin(STARTUP_SECONDS="0")
    outs = []
    for profile, concurrency in (("default", "1,4"), ("pcie-ar", "1")):
        out = tmp_path / profile
        qualify(
            builder, docker_host, url, "--container", name, "--needles", "4096",
            "--concurrency", concurrency, "--prompts", "4", "--input-len", "16",
            "--output-len", "4", "--prefill-lens", "64", *NO_GSM8K, "--out", str(out),
        )  # fmt: skip
        outs.append(str(out / "receipt.json"))
    plots = tmp_path / "plots"
    table = builder.run("qualify", "--compare", *outs, "--out", str(plots), "--json").stdout
    compared = json.loads(table)
    assert compared["plot"] == str(plots / "compare.png")
    assert (plots / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert compared["columns"] == ["", "default", "pcie-ar"]
    rows = {row[0]: row[1:] for row in compared["rows"]}
    assert rows["result"] == ["partial", "partial"]  # no builder image, no --profile
    assert rows["c=4 tok/s"][1] == "-" and float(rows["c=4 tok/s"][0]) > 0
    assert rows["field c=1024 tok/s"] == ["3740", "3740"]
    text = builder.run("qualify", "--compare", *outs, "--out", str(plots)).stdout
    assert text.splitlines()[0].split() == ["default", "pcie-ar"]
    assert text.splitlines()[-1] == f"plot: {plots / 'compare.png'}"


class _StandInNvml:
    """NVML for two GPUs at fixed readings: no GPU (nor driver) exists on this machine."""

    NVML_CLOCK_SM = 1
    NVML_P2P_CAPS_INDEX_READ = 0

    def __init__(self) -> None:
        self.power = {0: [150_000, 250_000], 1: [300_000, 300_000]}

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA RTX PRO 6000 Blackwell Server Edition"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 600_000

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=96 * 2**30, used=80 * 2**30)

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        return 0 if {a, b} == {0, 1} else 5

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlDeviceGetPowerUsage(self, handle):
        readings = self.power[handle]
        return readings.pop(0) if len(readings) > 1 else readings[0]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 2100

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=90)


def test_gpu_state_summarises_power_against_the_limit() -> None:
    nvml = _StandInNvml()
    described = gpu_state.describe(nvml)
    assert described["driver"] == "580.95.05"
    assert described["p2p_read"] == [["X", "OK"], ["OK", "X"]]
    assert described["devices"][0]["power_limit_w"] == 600
    sampler = gpu_state.Sampler(interval=0.01, nvml=nvml).start()
    give_up = time.monotonic() + 10
    while len(sampler.samples) < 3 and time.monotonic() < give_up:
        time.sleep(0.01)
    summary = sampler.stop()
    assert summary["samples"] >= 3
    first, second = summary["per_gpu"]
    assert first["power_w_peak"] == 250 and first["power_w_mean"] > 150
    assert second["power_pct_of_limit_mean"] == 50.0
    assert first["sm_clock_mhz_mean"] == 2100 and first["memory_used_gib_peak"] == 80


def test_without_nvml_the_gpu_state_says_why() -> None:
    described = gpu_state.describe()  # this machine: no NVIDIA driver
    assert described["available"] is False and described["why"].startswith("NVML")
    summary = gpu_state.measure().stop()
    assert summary["sampled"] is False and summary["why"].startswith("NVML")


def test_a_missing_matplotlib_is_said_once_per_run(monkeypatch, capsys, tmp_path: Path) -> None:
    """A sweep plots each profile's receipt and the comparison: one warning, not three."""
    from builder.site import receipt_views

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    receipt_views._pyplot.cache_clear()
    try:
        for _ in range(3):
            assert receipt_views.plot_compare([], tmp_path / "compare.png") is None
    finally:
        receipt_views._pyplot.cache_clear()
    assert capsys.readouterr().err.count("no plot: matplotlib is not installed") == 1
