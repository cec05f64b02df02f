"""qualify's gates and the sweep's verdict as logic: generated prompts, scoring, comparison,
the graph-capture hang, the profiles' fallback, and which profile a sweep chooses. No
Docker: where a server answers, it is the stand-in sglang server (tests/standin_sglang.py,
the declared fake for sglang on a GPU) run as a local process; the Hugging Face hub, which
cannot be reached from here, is a local stand-in of its rows API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest

from builder.core.errors import BuilderError, Unreachable
from builder.site import capture, gates, gsm8k, sweep
from builder.site.qualify import Server
from builder.spec.engines import sglang, vllm
from tests.conftest import REPO_ROOT
from tests.services import free_port, wait_for
from tests.standin_sglang import write_gsm8k_questions

STANDIN = Path(__file__).parents[1] / "standin_sglang.py"
SGLANG = sglang.ENGINE

# --- arithmetic ----------------------------------------------------------------------------


def test_arithmetic_prompts_come_from_the_seed() -> None:
    first = gates.arithmetic_cases(7, 20)
    assert first == gates.arithmetic_cases(7, 20), "the same seed, the same prompts"
    assert first != gates.arithmetic_cases(8, 20)
    assert gates.arithmetic_cases(7, 5) == first[:5]
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, b in first)
    assert gates.arithmetic_prompt(37, 19) == "What is 37 * 19? Reply with the number only."


@pytest.mark.parametrize(
    ("reply", "ok"),
    [("703", True), (" 703.\n", True), ("**703**", True), ("703!", True),
     ("704", False), ("The answer is 703", False), ("70 3", True), ("7030", False), ("", False)],
)  # fmt: skip
def test_an_arithmetic_reply_is_the_exact_product(reply: str, ok: bool) -> None:
    assert gates.arithmetic_ok(reply, 37, 19) is ok
    assert gates.arithmetic_ok("9,801", 99, 99), "a thousands comma is still the number"


# --- byte-identical --------------------------------------------------------------------------


def test_the_burst_sends_each_prompt_at_several_batch_positions() -> None:
    order = gates.burst_order(8)
    assert len(order) == gates.BURST == 32
    assert {index: order.count(index) for index in set(order)} == dict.fromkeys(range(8), 4)
    prompts = gates.identical_prompts(3)
    assert prompts == gates.identical_prompts(3) and len(set(prompts)) == 8


def test_byte_identical_means_every_byte() -> None:
    alone = ["1, 2, 3", "4, 5, 6"]
    order = [0, 1, 0, 1]
    assert gates.mismatches(alone, ["1, 2, 3", "4, 5, 6", "1, 2, 3", "4, 5, 6"], order) == []
    burst = ["1, 2, 3", "4, 5, 6", "1, 2, 3 ", "4, 5, 7"]  # a trailing space, one digit
    assert gates.mismatches(alone, burst, order) == [2, 3]


# --- GSM8K -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answer", "ok"),
    [
        ("She earns 12 * 6 = 72.\n#### 72", "Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", True),
        ("#### 1,234", "#### 1234", True),          # commas go, as lm-eval ignores them
        ("#### 18.", "#### 18", True),              # one trailing period goes
        ("#### -3", "#### -3", True),
        ("#### 5\nchecking...\n#### 7", "#### 7", True),  # the last #### (InferenceX: -1)
        ("#### 7\nwait\n#### 5", "#### 7", False),
        ("The answer is 72.", "#### 72", False),    # strict: no '#### N', no answer
        ("#### $72", "#### 72", False),             # the regex wants a digit after '#### '
        ("####72", "#### 72", False),
        ("#### 72.5", "#### 72", False),
    ],
)  # fmt: skip
def test_gsm8k_strict_match(reply: str, answer: str, ok: bool) -> None:
    assert gsm8k.correct(reply, answer) is ok


def test_gsm8k_extracts_the_last_strict_answer() -> None:
    assert gsm8k.extract("#### 3\n#### 4,5.") == "4,5."
    assert gsm8k.extract("no answer here") is None


def _items(count: int) -> list[gsm8k.Item]:
    return [gsm8k.Item(f"Q{n}?", f"work {n}\n#### {n}") for n in range(count)]


def test_gsm8k_prompt_is_five_shots_then_the_question() -> None:
    items = _items(8)
    shots = gsm8k.shots_for(0, items[0], items, seed=1)
    assert len(shots) == 5 and items[0] not in shots
    assert shots == gsm8k.shots_for(0, items[0], items, seed=1)
    text = gsm8k.prompt(items[0], shots)
    blocks = text.split("\n\n")
    assert len(blocks) == 6
    assert (
        blocks[0]
        == f"Question: {shots[0].question}\n{gsm8k.INSTRUCTION}\nAnswer: {shots[0].answer}"
    )
    assert blocks[-1] == f"Question: Q0?\n{gsm8k.INSTRUCTION}\nAnswer:"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["not json"], "line 1: not JSON"),
        ([json.dumps({"question": "q", "answer": "42"})], "line 1: the answer must end '#### N'"),
        ([json.dumps({"answer": "#### 4"})], "line 1: no question"),
        ([json.dumps({"question": "q", "answer": "#### 4"})] * 5, "5 items; needs 6 or more"),
    ],
)
def test_a_bad_gsm8k_file_is_one_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BuilderError, match=message.replace("(", r"\(")):
        gsm8k.load(str(path), None)


def test_gsm8k_limit_asks_the_first_questions_and_keeps_every_shot(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(item.__dict__) + "\n" for item in _items(9)))
    data = gsm8k.load(str(path), 3)
    assert [item.question for item in data.items] == ["Q0?", "Q1?", "Q2?"]
    assert len(data.shots) == 9 and data.source == f"file: {path}"
    assert gsm8k.load("none", None) is None


class _RowsApi(BaseHTTPRequestHandler):
    """The dataset viewer's /rows API for openai/gsm8k, as its docs describe its answer (the
    hub cannot be reached from here): 130 test rows, 100 at most a call; each call logged."""

    calls: ClassVar[list[dict]] = []
    truncate = False

    def do_GET(self) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        type(self).calls.append(query)
        offset, length = int(query["offset"]), min(int(query["length"]), 100)
        total = 130 if query["split"] == "test" else 7473
        rows = [
            {"row_idx": n, "row": {"question": f"{query['split']} {n}?", "answer": f"w\n#### {n}"},
             "truncated_cells": ["answer"] if self.truncate else []}
            for n in range(offset, min(offset + length, total))
        ]  # fmt: skip
        body = json.dumps({"rows": rows, "num_rows_total": total}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def rows_api(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RowsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(gsm8k, "ROWS_API", f"http://127.0.0.1:{server.server_port}/rows")
    _RowsApi.calls, _RowsApi.truncate = [], False
    yield _RowsApi
    server.shutdown()


def test_gsm8k_from_the_hub_pages_through_the_rows_api(rows_api) -> None:
    data = gsm8k.load("hub", None)
    assert [item.question for item in data.items] == [f"test {n}?" for n in range(130)]
    assert len(data.shots) == gsm8k.SHOT_POOL and data.shots[0].question == "train 0?"
    asked = [
        (c["dataset"], c["config"], c["split"], c["offset"], c["length"]) for c in rows_api.calls
    ]
    assert asked == [
        ("openai/gsm8k", "main", "test", "0", "100"), ("openai/gsm8k", "main", "test", "100", "100"),
        ("openai/gsm8k", "main", "train", "0", "100"),
    ]  # fmt: skip
    rows_api.calls.clear()
    assert len(gsm8k.load("hub", 5).items) == 5
    assert rows_api.calls[0]["length"] == "5", "--gsm8k-limit fetches no more than it asks"


def test_gsm8k_from_the_hub_refuses_truncated_rows_and_says_when_it_is_unreachable(
    rows_api, monkeypatch
) -> None:
    rows_api.truncate = True
    with pytest.raises(BuilderError, match="GSM8K test row 0: the rows API truncated it"):
        gsm8k.load("hub", 3)
    monkeypatch.setattr(gsm8k, "ROWS_API", f"http://127.0.0.1:{free_port()}/rows")
    with pytest.raises(Unreachable, match=r"GSM8K from the hub: cannot read .*; give --gsm8k FILE"):
        gsm8k.load("hub", 3)


def test_gsm8k_save_writes_what_an_offline_vm_asks_as_the_hub_run_would(
    rows_api, tmp_path: Path, capsys
) -> None:
    """`qualify --gsm8k-save FILE` where the hub is reachable; `--gsm8k FILE` on the VM then
    asks the same questions with the same shots (the prompts are equal, seed for seed)."""
    from builder.cli import main as cli

    saved = tmp_path / "gsm8k.jsonl"
    assert cli.main(["qualify", "--gsm8k-save", str(saved)]) == 0
    assert capsys.readouterr().out.startswith(f"{saved}: 130 GSM8K questions and 100 shots")
    offline, hub = gsm8k.load(str(saved), None), gsm8k.load("hub", None)
    assert offline.items == hub.items and offline.shots == hub.shots
    prompts = [
        [
            gsm8k.prompt(item, gsm8k.shots_for(n, item, data.shots, 1))
            for n, item in enumerate(data.items)
        ]
        for data in (offline, hub)
    ]
    assert prompts[0] == prompts[1]
    assert cli.main(["qualify", "--gsm8k-save", str(tmp_path / "no" / "such.jsonl")]) == 1
    assert "--gsm8k-save" in capsys.readouterr().err


# --- MTP figures -----------------------------------------------------------------------------


def test_acceptance_is_pooled_over_the_replies() -> None:
    details = [
        {"spec_accept_length": 2.0, "spec_verify_ct": 10, "spec_num_correct_drafts": 10,
         "spec_num_proposed_drafts": 30, "spec_accept_rate": 1 / 3},
        {"spec_accept_length": 3.0, "spec_verify_ct": 30, "spec_num_correct_drafts": 60,
         "spec_num_proposed_drafts": 90, "spec_accept_rate": 2 / 3},
    ]  # fmt: skip
    # (2*10 + 3*30) tokens over 40 verify steps; 70 of 120 drafts accepted.
    assert sglang.acceptance(details) == {
        "replies": 2,
        "accept_length": 2.75,
        "accept_rate": 0.5833,
    }
    assert sglang.acceptance([]) == {"replies": 0, "accept_length": None, "accept_rate": None}


def test_server_level_acceptance_from_server_info_and_metrics() -> None:
    info = {"internal_states": [{"avg_spec_accept_length": 2.5}, {"avg_spec_accept_length": 3.5}]}
    assert sglang.server_accept_length(info) == 3.0
    assert sglang.server_accept_length({"internal_states": [{}]}) is None
    text = (
        "# HELP sglang:spec_accept_length Mean acceptance length\n"
        'sglang:spec_accept_length{model_name="glm",tp_rank="0"} 2.4\n'
        'sglang:spec_accept_rate{model_name="glm",tp_rank="0"} 0.61\n'
        'sglang:num_running_reqs{model_name="glm"} 3\n'
    )
    assert SGLANG.acceptance_from_metrics(text) == {"accept_length": 2.4, "accept_rate": 0.61}
    assert SGLANG.acceptance_from_metrics(None) == {}


def test_a_profile_is_speculative_by_its_args() -> None:
    assert SGLANG.speculative(["--speculative-algorithm", "EAGLE"], {})
    assert SGLANG.speculative(["--speculative-algorithm=NEXTN"], {})
    assert SGLANG.speculative(None, {"speculative_algorithm": "EAGLE"})
    assert not SGLANG.speculative(["--tp-size", "8"], {"speculative_algorithm": None})


# --- the receipt's gate list -----------------------------------------------------------------


def test_every_gate_is_listed_and_a_skipped_one_is_not_passed() -> None:
    ran = [gates.entry("probes", "passed", "6/6")]
    listed = gates.complete(ran, "correctness")
    assert [g["name"] for g in listed] == list(gates.GATES)
    assert listed[1]["status"] == "skipped"
    assert listed[1]["why"] == "not reached: the run stopped at correctness"
    assert gates.not_passed(listed)["name"] == "arithmetic"
    mtp = gates.entry("mtp", "skipped", "-", "not a speculative profile")
    assert mtp["mandatory"] is False and mtp["pass_mark"] is None
    every = [gates.entry(n, "passed", "ok") for n in gates.GATES if n != "mtp"] + [mtp]
    assert gates.not_passed(every) is None, "a figure without a pass mark never blocks"
    gsm = [*every[:4], gates.entry("gsm8k", "skipped", "-", "--gsm8k none"), mtp]
    assert gates.not_passed(gsm)["name"] == "gsm8k"


# --- the gates against the stand-in server ---------------------------------------------------


@pytest.fixture
def local_standin():
    started = []

    def start(**env: str) -> Server:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, str(STANDIN), str(port)],
            env={**os.environ, "STARTUP_SECONDS": "0", **env},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        started.append(process)

        def up() -> bool:
            try:
                return (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status
                    == 200
                )
            except OSError:
                return False

        wait_for(up, 20, "the stand-in server")
        return Server(f"http://127.0.0.1:{port}", None)

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def test_the_gates_pass_on_a_right_server(local_standin, tmp_path: Path) -> None:
    server = local_standin(SPEC_ACCEPT_LENGTH="2.5", SPEC_ACCEPT_RATE="0.5")
    data = gsm8k.load(str(write_gsm8k_questions(tmp_path / "g.jsonl", 12)), 10)
    ran = gates.run_all(server, "standin", seed=1, arithmetic=6, data=data, is_speculative=True)
    by_name = {g["name"]: g for g in ran}
    assert [g["name"] for g in ran] == ["arithmetic", "identical", "gsm8k", "mtp"]
    assert by_name["arithmetic"]["status"] == "passed" and by_name["arithmetic"]["result"] == "6/6"
    assert by_name["identical"] == {**by_name["identical"], "status": "passed", "result": "32/32"}
    assert by_name["gsm8k"]["status"] == "passed" and by_name["gsm8k"]["score"] == 1.0
    assert by_name["gsm8k"]["questions"] == 10
    mtp = by_name["mtp"]
    assert mtp["status"] == "recorded" and mtp["mandatory"] is False
    assert mtp["figures"]["per_reply"]["replies"] == 6 + 8 + 32 + 10
    assert mtp["figures"]["server_average_accept_length"] == 2.5
    assert mtp["figures"]["metrics"] == {"accept_length": 2.5, "accept_rate": 0.5}
    assert mtp["result"].startswith("accept length ")


def test_a_wrong_fraction_fails_gsm8k_below_its_mark(local_standin, tmp_path: Path) -> None:
    server = local_standin(GSM8K_WRONG_FRACTION="0.3")
    data = gsm8k.load(str(write_gsm8k_questions(tmp_path / "g.jsonl", 20)), None)
    ran = gates.run_all(server, "standin", seed=1, arithmetic=2, data=data, is_speculative=False)
    scored = ran[2]
    assert scored["status"] == "failed" and scored["score"] < gsm8k.PASS_MARK
    assert scored["why"].endswith(f"is below the pass mark {gsm8k.PASS_MARK}")
    assert all(w["got"] == str(int(w["expected"]) + 1) for w in scored["wrong"])
    assert ran[3]["status"] == "skipped" and "not a speculative profile" in ran[3]["why"]


def test_a_garbling_server_fails_arithmetic_and_identical_stays_checked(local_standin) -> None:
    server = local_standin(WRONG_TEXT="1")
    ran = gates.run_all(server, "standin", seed=1, arithmetic=3, data=None, is_speculative=False)
    assert ran[0]["status"] == "failed" and ran[0]["result"] == "0/3"
    assert ran[0]["why"].startswith("'What is ")
    assert ran[1]["status"] == "passed", "garbled, but the same garble: not this gate's failure"
    assert ran[2] == {**ran[2], "status": "skipped", "why": "--gsm8k none"}


# --- graph-capture hang ----------------------------------------------------------------------

BEGIN = "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=9 GB"
VLLM = vllm.ENGINE


@pytest.mark.parametrize(
    ("tail", "hang"),
    [
        (f"Load weight end.\n{BEGIN}\n", BEGIN),
        (f"{BEGIN}\r\nCapturing batches (bs=256 avail_mem=8.10 GB):   0%|  | 0/36",
         "Capturing batches (bs=256 avail_mem=8.10 GB):   0%|  | 0/36"),
        (f"{BEGIN}\nCapture target decode CUDA graph end. elapsed=40.1 s\n", None),
        ("Capture target prefill CUDA graph begin. backend=breakable\n"
         "Capture target prefill CUDA graph end. elapsed=3 s\n" + BEGIN, BEGIN),
        ("Init torch distributed begin.\n", None),
        ("", None),
        # vLLM's capture lines are not sglang's
        ("\rCapturing CUDA graphs (FULL):   0%|          | 0/51\n", None),
    ],
    ids=["decode-begin", "progress-bar", "ended", "prefill-ended-decode-begun", "nccl", "empty",
         "vllm-bar"],
)  # fmt: skip
def test_a_stall_in_capture_is_a_graph_capture_hang(tail: str, hang: str | None) -> None:
    assert capture.hang_line(tail, SGLANG) == hang


# vLLM 0.34.0's lines as the container's log holds them: the tqdm bar on stderr, one line per
# bar (its updates \r-separated, ended when it closes), the finish line from its logger.
PIECEWISE = (
    "\rCapturing CUDA graphs (PIECEWISE):   0%|          | 0/35 [00:00<?, ?it/s]"
    "\rCapturing CUDA graphs (PIECEWISE): 100%|##########| 35/35 [00:07<00:00,  4.9it/s]\n"
)
FULL_DONE = (
    "\rCapturing CUDA graphs (FULL):   0%|          | 0/35 [00:00<?, ?it/s]"
    "\rCapturing CUDA graphs (FULL): 100%|##########| 35/35 [00:05<00:00,  6.8it/s]\n"
)
FINISHED = (
    "(EngineCore pid=310) INFO 12-07 17:03:11 [model_runner.py:1217] Graph capturing "
    "finished in 14 secs, took 1.52 GiB\n"
)
KV = "(EngineCore pid=310) INFO 12-07 17:03:02 [kv_cache_utils.py:1291] GPU KV cache size: 1,212,416 tokens\n"  # fmt: skip
FULL_STUCK = "\rCapturing CUDA graphs (FULL):  57%|#####7    | 20/35 [00:03<00:02,  6.1it/s]"
SPEC_STUCK = "\rCapturing prefill CUDA graphs (FULL):  10%|#         | 1/10 [00:00<00:04]\n"


@pytest.mark.parametrize(
    ("tail", "hang"),
    [
        # The FULL bar after the PIECEWISE one: its partial line shown (a 16 KiB one would be)
        (PIECEWISE + FULL_STUCK, FULL_STUCK.removeprefix("\r")),
        # ... or held back by Docker until it ends: the closed bar before it says capture
        (PIECEWISE, "Capturing CUDA graphs (PIECEWISE): 100%|##########| 35/35 [00:07<00:00,  4.9it/s]"),
        (PIECEWISE + FULL_DONE + FINISHED, None),
        # the memory-sizing capture finished, the stall is after it (KV cache, warm-up)
        (PIECEWISE + FULL_DONE + FINISHED + KV, None),
        # ... then the real capture began and hung
        (PIECEWISE + FULL_DONE + FINISHED + KV + PIECEWISE + FULL_STUCK,
         FULL_STUCK.removeprefix("\r")),
        # the speculator's graphs, after the model's
        (PIECEWISE + FULL_DONE + SPEC_STUCK, SPEC_STUCK.strip()),
        (PIECEWISE + FULL_DONE + SPEC_STUCK + FINISHED, None),
        (KV, None),
        # sglang's capture lines are not vLLM's
        (f"{BEGIN}\n", None),
    ],
    ids=["full-bar-stuck", "after-piecewise", "finished", "stalled-after-sizing",
         "real-capture-stuck", "speculator-stuck", "speculator-finished", "no-capture",
         "sglang-line"],
)  # fmt: skip
def test_a_vllm_start_quiet_inside_capture_is_a_graph_capture_hang(
    tail: str, hang: str | None
) -> None:
    assert capture.hang_line(tail, VLLM) == hang


# --- the verdict -------------------------------------------------------------------------------


def _receipt(
    levels: dict[int, float],
    failed: str | None = None,
    skipped: str | None = None,
    result: tuple[bool, str | None] = (True, None),
    fallback: bool = False,
) -> dict:
    listed = []
    for name in gates.GATES:
        status = "failed" if name == failed else "skipped" if name in (skipped, "mtp") else "passed"
        listed.append(
            gates.entry(name, status, "x", f"{name} said no" if status != "passed" else None)
        )
    ok, failed_at = result
    return {
        "server": {"profile": "p", "params": [["k", "v"]],
                   "image": {"reference": "img:1", "id": "sha256:abc",
                             "repo_digests": ["reg/img@sha256:def"]}},
        "startup": {"state": "ready", "attempts": [{"state": "graph-capture hang"}] if fallback else []},
        "gates": listed,
        "throughput": {"levels": [{"concurrency": c, "completed": 4, "output_throughput": f}
                                  for c, f in levels.items()]},
        "result": {"ok": ok and not failed, "failed_at": failed_at or ("correctness" if failed else None),
                   "message": "m"},
    }  # fmt: skip


def test_the_sweep_chooses_the_fastest_profile_that_passed_every_gate() -> None:
    swept = [
        sweep.Swept("first", _receipt({1: 40.0, 32: 900.0}, fallback=True), "first/receipt.json"),
        sweep.Swept("tied", _receipt({1: 45.0, 32: 900.0}), "tied/receipt.json"),
        sweep.Swept("wrong", _receipt({1: 60.0, 32: 1200.0}, failed="gsm8k"), "wrong/receipt.json"),
        sweep.Swept("no-gsm8k", _receipt({1: 70.0, 32: 1300.0}, skipped="gsm8k"), "n/receipt.json"),
        sweep.Swept("hung", _receipt({}, result=(False, "startup")), "hung/receipt.json"),
    ]
    doc = sweep.choose(swept, [1, 32, 256], choose_at=32)
    by_level = {c["concurrency"]: c for c in doc["levels"]}
    assert by_level[1]["profile"] == "tied" and by_level[1]["output_throughput"] == 45.0
    # A tie goes to the profile named first in --sweep; the other is named.
    assert by_level[32]["profile"] == "first" and by_level[32]["ties"] == ["tied"]
    assert by_level[256] == {"concurrency": 256, "profile": None}
    chosen = doc["chosen"]
    assert chosen["profile"] == "first" and chosen["receipt"] == "first/receipt.json"
    assert chosen["params"] == [["k", "v"]] and chosen["image_ref"] == "reg/img@sha256:def"
    stands = {p["profile"]: (p["stands"], p["fell_at"]) for p in doc["profiles"]}
    assert stands == {
        "first": (True, None), "tied": (True, None), "wrong": (False, "gate gsm8k"),
        "no-gsm8k": (False, "gate gsm8k"), "hung": (False, "startup"),
    }  # fmt: skip
    assert doc["profiles"][0]["fallback_used"] is True
    assert "skipped" in doc["profiles"][3]["why"]
    rows = sweep.table(doc, swept)
    assert rows[0] == ["profile", "verdict", "c=1", "c=32", "c=256"]
    assert rows[1] == ["first", "ok (on its fallback)", "40", "900*", "-"]
    assert rows[3][:2] == ["wrong", "FAIL gate gsm8k: failed: gsm8k said no"]
    assert sweep.summary(doc) == "chosen at concurrency 32: first (900 output tok/s)"
    schema = json.loads((Path(__file__).parents[2] / "manifests/chosen-v2.json").read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)


def test_no_profile_standing_chooses_none() -> None:
    swept = [sweep.Swept("wrong", _receipt({32: 1200.0}, failed="identical"), "w/receipt.json")]
    doc = sweep.choose(swept, [32], choose_at=32)
    assert doc["chosen"] is None
    assert sweep.summary(doc) == "no profile stands at concurrency 32: nothing chosen"
    old = _receipt({32: 1.0})
    del old["gates"]
    assert sweep.standing(old) == (
        False,
        "gates",
        "the receipt has no gates (made before they existed)",
    )


def test_deploy_files_says_in_one_line_that_the_sweep_chose_nothing(tmp_path: Path) -> None:
    from builder.site.commands import deploy_chosen

    wrong = [sweep.Swept("wrong", _receipt({32: 1.0}, failed="gsm8k"), "wrong/receipt.json")]
    (tmp_path / "chosen.json").write_text(json.dumps(sweep.choose(wrong, [32], choose_at=32)))
    with pytest.raises(BuilderError, match="the sweep chose no profile at concurrency 32"):
        deploy_chosen.load(tmp_path)
    with pytest.raises(BuilderError, match=r"chosen\.json: not a readable chosen\.json"):
        deploy_chosen.load(tmp_path / "nowhere")


def test_a_partial_receipt_stands_in_a_sweep_only_with_allow_partial() -> None:
    partial = _receipt({32: 1500.0})
    partial["result"] = gates.verdict(
        partial["result"], [{"what": "verify", "why": "not a builder image"}]
    )
    assert partial["result"]["verdict"] == "partial" and partial["result"]["ok"] is False
    swept = [sweep.Swept("partial", partial, "p/receipt.json"),
             sweep.Swept("full", _receipt({32: 900.0}), "f/receipt.json")]  # fmt: skip
    doc = sweep.choose(swept, [32], choose_at=32)
    assert doc["chosen"]["profile"] == "full"
    assert doc["profiles"][0]["fell_at"] == "partial" and "verify" in doc["profiles"][0]["why"]
    allowed = sweep.choose(swept, [32], choose_at=32, allow_partial=True)
    assert allowed["chosen"]["profile"] == "partial" and "--allow-partial" in allowed["rule"]
    # One word, one way (#55 saw `FAIL partial: ...`, `ok` and `(partial)` in one sweep), and
    # chosen.json says its choice's receipt is partial.
    assert [row[1] for row in sweep.table(doc, swept)[1:]] == [
        "partial (not chosen without --allow-partial)", "ok"
    ]  # fmt: skip
    assert [row[1] for row in sweep.table(allowed, swept)[1:]] == ["partial", "ok"]
    assert (allowed["chosen"]["partial"], doc["chosen"]["partial"]) == (True, False)
    assert [p["partial"] for p in allowed["profiles"]] == [True, False]
    # Gaps that no receipt needs (no container to look into, no GPU seen) leave it qualified.
    fine = gates.verdict(
        {"ok": True, "failed_at": None, "message": "every check passed"},
        [{"what": "GPU state", "why": "NVML"}, {"what": "compiled at start-up", "why": "-"}],
    )
    assert fine["verdict"] == "qualified" and fine["ok"] is True


def test_a_profile_the_sweep_cannot_start_falls_and_the_others_are_still_chosen(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A `docker run` refused for one profile ended the whole sweep with no chosen.json.
    The start is the engine's (tests/site/test_sweep.py); here it is replaced, to fail for one
    profile and to hand back a receipt qualify wrote on the lent H200 for the other."""
    import argparse

    from builder.site.commands import qualify_sweep

    measured = json.loads((REPO_ROOT / "bench/results/sweep-h200/sweep-gpu.json").read_text())[
        "runs"
    ]["standin-mtp"]["receipt"]

    partial = {**measured, "result": gates.verdict(
        measured["result"], [{"what": "verify", "why": "not a builder image"}]
    )}  # fmt: skip

    def start(args, name, known, plan, folder):
        if name == "broken":
            raise BuilderError("docker run: image not found")
        return partial if name == "partial" else measured

    monkeypatch.setattr(qualify_sweep, "_qualify_one", start)
    plan = SimpleNamespace(concurrency=[1, 32])
    args = argparse.Namespace(choose_at=32, json=False, allow_partial=False)
    qualify_sweep.run(args, plan, tmp_path, ["broken", "good", "partial"], known=None)
    chosen = json.loads((tmp_path / "chosen.json").read_text())
    assert chosen["chosen"]["profile"] == "good"
    fell = {p["profile"]: (p["stands"], p["fell_at"], p["why"]) for p in chosen["profiles"]}
    assert fell["broken"] == (False, "start", "docker run: image not found")
    assert json.loads((tmp_path / "broken" / "receipt.json").read_text())["result"]["ok"] is False
    said = capsys.readouterr()
    assert "broken: docker run: image not found" in said.err
    # Each profile's verdict is worded the same in its progress line and in the table.
    table = dict(line.split(None, 1) for line in said.out.splitlines()[1:4])
    for name, verdict in (("broken", "FAIL start: docker run: image not found"), ("good", "ok"),
                          ("partial", "partial (not chosen without --allow-partial)")):  # fmt: skip
        assert f"\n{name}: {verdict}\n" in said.err
        assert table[name].startswith(f"{verdict}  "), said.out


def test_a_sweep_across_engines_chooses_per_level_from_either_engine(tmp_path: Path) -> None:
    """#57, on stand-in receipts: vLLM leads at c=1, sglang at c=64 (the anchors' shape).
    Both images have a glm5-nvfp4-tp8: the entries tell them apart, chosen.json names each
    level's engine, image and bare profile, and deploy-files reads the one at --choose-at."""
    from builder.site.commands import deploy_chosen

    launched = {"model": "lukealonso/GLM-5-NVFP4", "model_revision": "0" * 40,
                "hf_cache": "/var/lib/sglang/huggingface", "port": 30000, "api_key_file": None,
                "extra_args": []}  # fmt: skip
    sglang_receipt = _receipt({1: 48.0, 64: 1425.0})
    sglang_receipt["server"].update(profile="glm5-nvfp4-tp8", launch=launched)
    vllm_receipt = _receipt({1: 88.0, 64: 900.0})
    vllm_receipt["server"].update(
        profile="glm5-nvfp4-tp8", engine="vllm", launch={**launched, "port": 8000},
        image={"reference": "vllm:1", "id": "sha256:v", "repo_digests": ["reg/vllm@sha256:1"]},
    )  # fmt: skip
    swept = [
        sweep.Swept("glm5-nvfp4-tp8", sglang_receipt, "glm5-nvfp4-tp8/receipt.json"),
        sweep.Swept("glm5-nvfp4-tp8", vllm_receipt, "vllm/glm5-nvfp4-tp8/receipt.json",
                    "vllm/glm5-nvfp4-tp8"),
    ]  # fmt: skip
    doc = sweep.choose(swept, [1, 64], choose_at=1)
    by_level = {c["concurrency"]: c for c in doc["levels"]}
    assert (by_level[1]["entry"], by_level[1]["engine"]) == ("vllm/glm5-nvfp4-tp8", "vllm")
    assert by_level[1]["profile"] == "glm5-nvfp4-tp8"  # as the vLLM image's recipe names it
    assert by_level[1]["image_ref"] == "reg/vllm@sha256:1"
    assert (by_level[64]["entry"], by_level[64]["engine"]) == ("glm5-nvfp4-tp8", "sglang")
    assert {p["entry"]: p["engine"] for p in doc["profiles"]} == {
        "glm5-nvfp4-tp8": "sglang", "vllm/glm5-nvfp4-tp8": "vllm",
    }  # fmt: skip
    rows = sweep.table(doc, swept)
    assert rows[1] == ["glm5-nvfp4-tp8", "ok", "48", "1425*"]
    assert rows[2] == ["vllm/glm5-nvfp4-tp8", "ok", "88*", "900"]
    assert sweep.summary(doc) == "chosen at concurrency 1: vllm/glm5-nvfp4-tp8 (88 output tok/s)"
    schema = json.loads((Path(__file__).parents[2] / "manifests/chosen-v2.json").read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)
    (tmp_path / "chosen.json").write_text(json.dumps(doc))
    for one in swept:  # the receipts beside it, as the sweep leaves them
        (tmp_path / one.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / one.path).write_text(json.dumps(one.receipt))
    chosen = deploy_chosen.load(tmp_path).choice
    assert (chosen["profile"], chosen["image_ref"]) == ("glm5-nvfp4-tp8", "reg/vllm@sha256:1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sweep", "glm5-nvfp4-tp8,tgi/glm5-nvfp4-tp8"),
         "--sweep tgi/glm5-nvfp4-tp8: 'tgi' is not an engine (sglang, vllm); write ENGINE/PROFILE"),
        (("--sweep", "glm5-nvfp4-tp8,vllm/glm5-nvfp4-tp8"),
         "sm120/profiles.toml serves with sglang; give the vllm image as --engine-image "
         "vllm=IMAGE"),
        (("--sweep", "glm5-nvfp4-tp8", "--engine-image", "tgi=img"),
         "--engine-image tgi=img: expected ENGINE=IMAGE, ENGINE one of sglang, vllm"),
        (("--url", "http://127.0.0.1:9", "--engine-image", "vllm=img"),
         "--engine-image: only with --sweep"),
    ],
)  # fmt: skip
def test_a_sweep_across_engines_refuses_what_it_cannot_run_in_one_line(
    builder, args: tuple, message: str
) -> None:
    if args[0] == "--url":
        args = (args[1], *args[2:])
    result = builder.run("qualify", "--target", "sm120", *args, "--gsm8k", "none", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert message in result.stderr.strip().splitlines()[-1]
