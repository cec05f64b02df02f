"""`builder qualify` against a vLLM server: the stand-in `vllm serve` (tests/standin_vllm.py,
playing the sglang stand-in's model: no GPU exists here) in a real container on the real
engine, given the args a sm120-vllm profile renders, and the stand-in `vllm bench serve`
(tests/standin_vllm_bench.py) inside it where a test gives it one.

The same gates as for sglang, asked through vLLM's answers: the context from /v1/models,
the tokenizer its model, builder's own client streaming /v1/completions, the image's client
`vllm bench serve`, the MTP figure from the /metrics spec-decode counters, the time to
ready from vLLM's and uvicorn's lines, and the engine in the receipt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.spec.engines import ready_line_indices, vllm
from tests.conftest import REPO_ROOT, Builder
from tests.site.test_qualify import key_file, receipt_of
from tests.standin_sglang import write_gsm8k_questions

STANDIN_BENCH = REPO_ROOT / "tests" / "standin_vllm_bench.py"
# A minute to be ready (the profile's is 30): a server read as another engine's fails soon.
SMALL = ["--concurrency", "1,4", "--prompts", "8", "--input-len", "64", "--output-len", "8",
         "--prefill-lens", "512,65536", "--target", "sm120-vllm", "--deadline", "1"]  # fmt: skip
KEY = "s3cret-vllm-qualify-key"
VLLM = vllm.ENGINE


def qualify(builder: Builder, docker_host: str, *args: str):
    return builder.run("qualify", *args, env={"DOCKER_HOST": docker_host}, check=False)


def with_vllm_bench(tmp_path: Path) -> dict:
    """A site folder holding `vllm.entrypoints.cli.main` (the stand-in client), mounted
    into the server's container as a real vLLM image has the real one."""
    cli = tmp_path / "site" / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (cli, cli.parent, cli.parent.parent):
        (folder / "__init__.py").write_text("")
    (cli / "main.py").write_text(STANDIN_BENCH.read_text())
    return {str(tmp_path / "site"): {"bind": "/opt/standin-site", "mode": "ro"}}


@pytest.mark.docker
def test_a_right_vllm_server_passes_every_gate_measured_by_vllm_bench_serve(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    # Served under a name of its own: the tokenizer is still the model it loaded.
    url, name = vllm_standin(
        "glm5-nvfp4-tp8", with_vllm_bench(tmp_path), ("--served-model-name", "glm5"),
        STARTUP_SECONDS="2",
        VLLM_API_KEY=KEY, CONTEXT_LENGTH="32768", PYTHONPATH="/opt/standin-site",
        EXPECT_TOKENIZER="lukealonso/GLM-5-NVFP4",
    )  # fmt: skip
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8", *SMALL,
        "--api-key-file", key_file(tmp_path / "key", KEY), "--arithmetic", "4",
        "--gsm8k", str(write_gsm8k_questions(tmp_path / "gsm8k.jsonl", 8)),
        "--needles", "4096,16384,65536", "--out", str(out), "--allow-partial",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["server"]["engine"] == "vllm"
    # The profile's backends held to what vLLM logged (not a builder image: verify left out).
    assert [n["what"] for n in receipt["not_checked"]] == ["GPU state", "verify"]
    assert receipt["result"]["verdict"] == "partial"
    startup = receipt["startup"]
    assert startup["state"] == "ready" and "backends match" in startup["message"]
    served = receipt["server"]["server_info"]
    assert served["attention_backend"] == "FLASHINFER_MLA_SPARSE_SM120"
    assert served["model"] == "lukealonso/GLM-5-NVFP4" and served["max_model_len"] == 32768
    assert receipt["correctness"]["model"] == served["served_model_name"] == "glm5"
    # From the container's start to uvicorn's line after vLLM's (2 s of loading).
    assert startup["ready_seconds_from"] == "container start (its log)"
    assert 2 <= startup["ready_seconds"] < 30
    statuses = {gate["name"]: (gate["status"], gate["result"]) for gate in receipt["gates"]}
    assert statuses == {
        "probes": ("passed", "6/6"), "arithmetic": ("passed", "4/4"),
        "identical": ("passed", "32/32"), "needle": ("passed", "3/3"),
        "gsm8k": ("passed", "1.0000 (8/8)"), "mtp": ("skipped", "-"),
    }  # fmt: skip
    mtp = next(gate for gate in receipt["gates"] if gate["name"] == "mtp")
    assert mtp["why"] == "not a speculative profile (no --speculative-config)"
    # The context is /v1/models' max_model_len: 65536 clamped to it, less room to answer.
    assert receipt["correctness"]["context_length"] == 32768
    needles = receipt["correctness"]["needles"]
    assert [n["target_tokens"] for n in needles] == [4096, 16384, 32768 - 256]
    throughput = receipt["throughput"]
    assert throughput["client"] == "vllm bench serve in the server's image"
    assert throughput["client_why"] == f"from container {name}"
    levels = throughput["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert (level["completed"], level["failed"], level["total_output_tokens"]) == (8, 0, 64)
        assert level["ttft_ms"]["p50"] > 0 and level["tpot_ms"]["p50"] >= 1.5
        assert level["e2e_latency_ms"]["p99"] > 0  # vLLM's `e2el`, in the receipt's name
    assert levels[0]["seed"] != levels[1]["seed"]
    # Prefill by builder's own client: a token-id prompt streamed from /v1/completions.
    prefill = throughput["prefill"]
    assert prefill[0]["input_len"] == 512 and prefill[0]["completed"] == 4
    assert prefill[0]["prefill_tok_s"] > 0
    assert prefill[1] == {"input_len": 65536, "skipped": "over the served context (32768)"}
    assert "throughput client: vllm bench serve in the server's image" in result.stdout
    for text in (result.stdout, result.stderr, (out / "receipt.json").read_text()):
        assert KEY not in text


@pytest.mark.docker
def test_the_mtp_figure_comes_from_the_counters_over_the_gates_and_builder_s_client_streams(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    """The stand-in's counters start from earlier traffic at 30 % acceptance; the gates'
    replies are accepted at 62 % with 3 draft tokens: the figure is the gates' own."""
    url, name = vllm_standin("glm5-nvfp4-tp8-mtp", STARTUP_SECONDS="0")
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8-mtp",
        *SMALL, "--needles", "4096", "--arithmetic", "4",
        "--gsm8k", str(write_gsm8k_questions(tmp_path / "gsm8k.jsonl", 8)),
        "--out", str(out), "--allow-partial",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["server"]["engine"] == "vllm"
    mtp = next(gate for gate in receipt["gates"] if gate["name"] == "mtp")
    assert (mtp["status"], mtp["result"]) == ("recorded", "accept length 2.86, rate 62.0%")
    during, since = mtp["figures"]["during_gates"], mtp["figures"]["since_start"]
    assert (during["accept_length"], during["accept_rate"]) == (2.86, 0.62)
    assert during["draft_tokens"] == 3 * during["drafts"] > 0
    assert since["accept_rate"] < 0.62  # the earlier traffic's 30 % counted in
    # No `vllm bench serve` in this image: builder's client, over /v1/completions.
    throughput = receipt["throughput"]
    assert throughput["client"] == (
        "builder (vllm bench serve's metric definitions, /v1/completions streaming)"
    )
    assert throughput["client_why"] == (
        f"container {name}: its image has no vllm.entrypoints.cli.main"
    )
    for level in throughput["levels"]:
        assert (level["completed"], level["failed"], level["total_output_tokens"]) == (8, 0, 64)
        assert level["ttft_ms"]["p50"] > 0 and level["tpot_ms"]["p50"] >= 1.5


@pytest.mark.docker
def test_a_vllm_server_with_wrong_text_fails_the_probes_gate(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    url, name = vllm_standin("glm5-nvfp4-tp8", STARTUP_SECONDS="0", WRONG_TEXT="1")
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8", *SMALL,
        "--gsm8k", "none", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 8, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["server"]["engine"] == "vllm"
    assert (receipt["result"]["failed_at"], receipt["startup"]["state"]) == ("correctness", "ready")
    message = "probe add ('What is 17 + 25? Reply with the number only.'): expected '42'"
    assert receipt["result"]["message"].startswith(message)
    probes = next(gate for gate in receipt["gates"] if gate["name"] == "probes")
    assert (probes["status"], probes["result"]) == ("failed", "0/1")
    assert receipt["throughput"] is None
    assert f"NOT qualified: correctness: {message}" in result.stdout


@pytest.mark.docker
def test_a_vllm_bench_serve_that_fails_fails_qualify_at_throughput(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    url, name = vllm_standin(
        "glm5-nvfp4-tp8", with_vllm_bench(tmp_path), STARTUP_SECONDS="0", BENCH_FAIL="1",
        PYTHONPATH="/opt/standin-site",
    )  # fmt: skip
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8", *SMALL,
        "--needles", "4096", "--gsm8k", "none", "--client", "image", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 8, result.stdout + result.stderr
    assert receipt_of(out)["result"]["message"] == (
        "concurrency 1: no request completed (vllm bench serve exited 1: "
        "RuntimeError: CUDA error: no kernel image is available for execution)"
    )


@pytest.mark.docker
def test_a_vllm_start_quiet_inside_graph_capture_is_a_graph_capture_hang(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    """The stand-in stops inside the FULL bar: Docker holds that unended line back, the
    closed PIECEWISE bar before it says capture began, and no "Graph capturing finished"."""
    url, name = vllm_standin("glm5-nvfp4-tp8", STARTUP_SECONDS="0", HANG_AT_CAPTURE="1")
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8", *SMALL,
        "--stall-minutes", "3s", "--gsm8k", "none", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 8, result.stdout + result.stderr
    startup = receipt_of(out)["startup"]
    assert startup["state"] == "graph-capture hang"
    assert startup["capture_line"].startswith("Capturing CUDA graphs (")
    assert startup["message"].startswith("no new log line for ")
    assert f"after capture began: {startup['capture_line']!r}" in startup["message"]
    assert "NCCL" not in startup["message"], "a capture hang is not an NCCL stall"
    assert "NOT qualified: startup: graph-capture hang: no new log line for " in result.stdout


@pytest.mark.docker
def test_kernels_a_vllm_start_compiled_fail_startup_and_stay_on_the_vllm_volume(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    url, name = vllm_standin(
        "glm5-nvfp4-tp8", STARTUP_SECONDS="0",
        WRITE_AT_START="/root/.cache/vllm/b12x/3f/3f9a0c.o;/root/.cache/vllm/b12x/3f/3f9a0c.json",
        VLLM_CACHE_ROOT="/root/.cache/vllm", B12X_COMPILE_CACHE_DIR="/root/.cache/vllm/b12x",
    )  # fmt: skip
    out = tmp_path / "q"
    result = qualify(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8", *SMALL,
        "--gsm8k", "none", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 8, result.stdout + result.stderr
    receipt = receipt_of(out)
    assert receipt["startup"]["compiled_at_start"] == {
        "flashinfer": [], "b12x": ["3f9a0c"], "torch_compile": [], "triton": [], "deep_gemm": [],
    }  # fmt: skip
    assert receipt["result"]["message"] == (
        "1 JIT compiles (b12x: 3f9a0c); they are on the vLLM cache volume now: restart and "
        "qualify again"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # --deadline 0: without the refusal, nothing listening there is a quick exit 8.
        (["http://127.0.0.1:1", "--target", "sm120-vllm", "--profile", "glm5-nvfp4-tp8",
          "--engine", "sglang", "--deadline", "0"],
         "--engine sglang: profile glm5-nvfp4-tp8 starts a vllm server"),
        (["--start", "--engine", "vllm"],
         "--engine: not with --start or --sweep (each profile's target names its engine)"),
    ],
)  # fmt: skip
def test_an_engine_that_contradicts_the_profile_is_one_line(
    builder, tmp_path, args, message
) -> None:
    out = tmp_path / "q"
    result = builder.run("qualify", *args, "--gsm8k", "none", "--out", str(out), check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == f"error: {message}"
    assert not out.exists()


def test_vllm_streams_as_its_bench_client_reads_it() -> None:
    path, body = VLLM.stream_request("glm", [5, 6, 7], 8)
    assert (path, body["prompt"], body["max_tokens"]) == ("/v1/completions", [5, 6, 7], 8)
    assert body["ignore_eos"] and body["stream"] and body["stream_options"]["include_usage"]
    assert VLLM.stream_progress({"choices": [{"text": "x"}]}) == (True, None)
    assert VLLM.stream_progress({"choices": [], "usage": {"completion_tokens": 8}}) == (False, 8)


def test_vllm_acceptance_is_the_counters_growth_and_says_when_there_is_none() -> None:
    def counters(drafts: float, tokens: float, accepted: float) -> dict[str, str]:
        return {"/metrics": (
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}\n'
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {tokens}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}\n'
        )}  # fmt: skip

    found = VLLM.acceptance([], counters(10, 30, 3), counters(20, 60, 21))
    assert (found.length, found.rate) == (2.8, 0.6)  # 18 of 30 over 10 drafts
    assert found.figures["since_start"] == {"accept_length": 2.05, "accept_rate": 0.35}
    idle = VLLM.acceptance([], counters(10, 30, 3), counters(10, 30, 3))
    assert idle.length is None and idle.missing.startswith("no draft was counted during")
    none = VLLM.acceptance([], {"/metrics": None}, {"/metrics": "vllm:other 1\n"})
    assert none.missing == "its /metrics has no spec-decode counters (vllm:spec_decode_num_*)"


def test_the_port_inside_is_the_command_line_s() -> None:
    command = ["vllm", "serve", "m", "--port", "8001", "--host", "0.0.0.0"]
    assert VLLM.listen_port(command, {}) == 8001
    assert VLLM.listen_port(["vllm", "serve", "m"], {}) is None  # the URL's port, then
    assert VLLM.tokenizer({"model": "/models/glm"}, "glm") == "/models/glm"


def test_ready_is_uvicorn_s_line_after_vllm_s() -> None:
    lines = ["Application startup complete.", "x Starting vLLM server on http://0.0.0.0:8000",
             "noise", "INFO:     Application startup complete."]  # fmt: skip
    assert list(ready_line_indices(lines, VLLM.ready_lines)) == [3]
    assert list(ready_line_indices(lines[:3], VLLM.ready_lines)) == []
