"""`builder qualify --sweep` through the CLI, on the real engine: two profiles of a stand-in
target, each started by the recipe's own `docker run`, one that hangs in CUDA-graph capture
and passes on its declared fallback, one that fails GSM8K; chosen.json names the first, and
`deploy-files --profile chosen` and `--compare` read the sweep back.

No GPU exists here: the server is the stand-in sglang server (tests/standin_sglang.py) in an
image that carries only a recipe with these profiles, and the recipe's `docker run` goes
through the same shim as `qualify --start`'s test (no --gpus, host network).
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import uuid
from pathlib import Path

import jsonschema
import pytest
import yaml
from docker.errors import NotFound

from tests.build.test_image_recipe import bare_builder, docker_without_gpus
from tests.conftest import REPO_ROOT
from tests.services import free_port
from tests.standin_sglang import write_gsm8k_questions

pytestmark = pytest.mark.docker

SERVER_INFO = {"tp_size": 8, "speculative_algorithm": None}
BASE = {"container_name": "sweep-standin", "expect": {"tp_size": 8}}
PROFILES = {
    "hangs-then-falls-back": {
        **BASE,
        "description": "hangs in decode-graph capture unless breakable; speculative",
        "args": ["--port", "{port}", "--cuda-graph-backend-decode", "{cuda_graph_backend_decode}",
                 "--speculative-algorithm", "EAGLE"],
        "params": {"port": "30000", "cuda_graph_backend_decode": "full"},
        "env": {"HANG_AT_CAPTURE": "1", "STARTUP_SECONDS": "0", "SPEC_ACCEPT_LENGTH": "2.5",
                "SPEC_ACCEPT_RATE": "0.5"},
        "fallback": {"cuda_graph_backend_decode": "breakable",
                     "why": "the full decode graph hung at capture (sglang PR #29580)"},
    },
    "wrong-at-gsm8k": {
        **BASE,
        "description": "answers half of GSM8K wrongly",
        "args": ["--port", "{port}", "--mem-fraction-static", "{mem}"],
        "params": {"port": "30000", "mem": "0.85"},
        "env": {"GSM8K_WRONG_FRACTION": "0.5", "STARTUP_SECONDS": "0"},
    },
}  # fmt: skip
RECIPE = {
    "schema_version": 1,
    "target": {"name": "standin", "description": "the stand-in sglang server",
               "cuda_version": "13.0", "arch_list": ["12.0a"]},
    "profiles": {"default": "hangs-then-falls-back", "profiles": PROFILES},
}  # fmt: skip


def _archive(files: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


@pytest.fixture
def sweep_image(docker_client, test_base):
    """The stand-in as an image with a launch recipe and no builder labels (so no verify)."""
    tag = f"sweep-standin:{uuid.uuid4().hex[:8]}"
    dockerfile = (
        f"FROM {test_base}\nCOPY standin.py /standin.py\n"
        'COPY recipe.json /opt/builder/recipe.json\nENTRYPOINT ["python3", "/standin.py"]\n'
    )
    context = _archive({
        "Dockerfile": dockerfile.encode(),
        "standin.py": (REPO_ROOT / "tests" / "standin_sglang.py").read_bytes(),
        "recipe.json": json.dumps(RECIPE).encode(),
    })  # fmt: skip
    docker_client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


def test_a_sweep_retries_a_capture_hang_on_its_fallback_and_chooses_what_passed(
    sweep_image, docker_client, docker_host, tmp_path, monkeypatch
) -> None:
    bin_dir = docker_without_gpus(tmp_path, monkeypatch, SERVER_INFO)
    port, name, out = free_port(), f"sweep-{free_port()}", tmp_path / "qualify"
    questions = write_gsm8k_questions(tmp_path / "gsm8k.jsonl", 12)
    try:
        result = bare_builder(
            tmp_path, docker_host, "qualify", "--sweep", "hangs-then-falls-back,wrong-at-gsm8k",
            "--image", sweep_image, "--port", str(port), "--name", name,
            "--hf-cache", str(tmp_path / "hf"), "--stall-minutes", "3s", "--deadline", "1",
            "--gsm8k", str(questions), "--arithmetic", "3", "--needles", "4096",
            "--concurrency", "1,4", "--choose-at", "4", "--prompts", "4", "--input-len", "16",
            "--output-len", "4", "--prefill-lens", "256", "--level-seconds", "5",
            "--set", "wrong-at-gsm8k:mem=0.7",  # a param of that profile alone
            "--out", str(out), "--allow-partial", check=False, path=str(bin_dir),
        )  # fmt: skip
    finally:  # whatever happened, no container is left for the tests after this one
        with contextlib.suppress(NotFound):
            docker_client.containers.get(name).remove(force=True)
            pytest.fail(f"the sweep left {name} behind")
    assert result.returncode == 0, result.stdout + result.stderr
    chosen = json.loads((out / "chosen.json").read_text())
    schema = json.loads((REPO_ROOT / "manifests" / "chosen-v2.json").read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(
        chosen
    )
    receipt_schema = json.loads((REPO_ROOT / "manifests" / "receipt-v1.json").read_text())
    receipts = {}
    for profile in PROFILES:
        receipts[profile] = json.loads((out / profile / "receipt.json").read_text())
        jsonschema.Draft202012Validator(receipt_schema).validate(receipts[profile])

    # The hang: caught as one, the container stopped, the profile once more on its fallback.
    assert "hangs-then-falls-back: graph-capture hang; once more with its fallback" in result.stderr
    hung = receipts["hangs-then-falls-back"]
    (attempt,) = hung["startup"]["attempts"]
    assert attempt["state"] == "graph-capture hang"
    assert attempt["capture_line"].endswith(
        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
        "avail mem=10.00 GB"
    )
    assert attempt["message"].startswith("graph-capture hang: no new log line for ")
    assert "its fallback: --set cuda_graph_backend_decode=breakable (the full" in attempt["message"]
    assert "NCCL" not in attempt["message"], "a capture hang is not an NCCL stall"
    assert attempt["fallback"]["params"] == [["cuda_graph_backend_decode", "breakable"]]
    assert "backend=full" in (out / "hangs-then-falls-back" / attempt["log"]).read_text()
    # Standing with --allow-partial: every check that ran passed, verify could not (the
    # stand-in image is no builder image), and the receipt says so.
    assert hung["startup"]["state"] == "ready", hung["result"]
    assert (hung["result"]["failed_at"], hung["result"]["verdict"]) == (None, "partial")
    assert ["cuda_graph_backend_decode", "breakable"] in hung["server"]["params"]
    gates = {g["name"]: g for g in hung["gates"]}
    assert {n: g["status"] for n, g in gates.items()} == {
        "probes": "passed", "arithmetic": "passed", "identical": "passed", "needle": "passed",
        "gsm8k": "passed", "mtp": "recorded",
    }  # fmt: skip
    assert gates["mtp"]["figures"]["server_average_accept_length"] == 2.5
    assert {n["what"] for n in hung["not_checked"]} == {"verify", "GPU state"}
    assert [lvl["concurrency"] for lvl in hung["throughput"]["levels"]] == [1, 4]
    assert hung["throughput"]["prefill"][0]["input_len"] == 256

    # The other: GSM8K below its mark, so no speed measured and never chosen.
    wrong = receipts["wrong-at-gsm8k"]
    assert wrong["result"]["failed_at"] == "correctness"
    assert wrong["result"]["message"].startswith("gate gsm8k: ")
    scored = next(g for g in wrong["gates"] if g["name"] == "gsm8k")
    assert scored["status"] == "failed" and scored["score"] < 0.94
    assert wrong["throughput"] is None and "attempts" not in wrong["startup"]
    # Its own --set, recorded as a plain param and run; the other profile has no such param.
    assert wrong["server"]["params"] == [["mem", "0.7"]]
    ran = wrong["server"]["command"]
    assert ran[ran.index("--mem-fraction-static") + 1] == "0.7"
    assert not any(key == "mem" for key, _ in hung["server"]["params"])

    assert chosen["chosen"]["profile"] == "hangs-then-falls-back"
    assert chosen["chosen"]["concurrency"] == 4
    assert chosen["chosen"]["receipt"] == "hangs-then-falls-back/receipt.json"
    assert ["cuda_graph_backend_decode", "breakable"] in chosen["chosen"]["params"]
    # By digest: the local build has no registry digest, so its id; never the tag.
    assert chosen["chosen"]["image_ref"] == hung["server"]["image"]["id"] != sweep_image
    assert chosen["chosen"]["launch"] == {
        "model": None, "model_revision": None, "hf_cache": str(tmp_path / "hf"), "port": port,
        "api_key_file": None, "extra_args": [],
    }  # fmt: skip
    assert chosen["chosen"]["partial"] is True
    standing = {p["profile"]: (p["stands"], p["fell_at"]) for p in chosen["profiles"]}
    assert standing == {
        "hangs-then-falls-back": (True, None),
        "wrong-at-gsm8k": (False, "gate gsm8k"),
    }
    lines = result.stdout.splitlines()
    assert any(line.startswith("wrong-at-gsm8k") and "FAIL gate gsm8k" in line for line in lines)
    # Partial is one word, one way: the table, the progress line, chosen.json, deploy-files.
    assert any(line.split()[:4] == ["hangs-then-falls-back", "partial", "(on", "its"]
               for line in lines)  # fmt: skip
    assert "\nhangs-then-falls-back: partial\n" in result.stderr
    assert lines[-1].startswith("chosen at concurrency 4: hangs-then-falls-back (")

    # deploy-files from the sweep's choice: exactly the server the receipt's container ran,
    # argument by argument, with the same mounts, on the same image. Its HF cache is outside
    # /var/lib/sglang: the operator's own --hf-cache says so.
    deployed = bare_builder(
        tmp_path, docker_host, "deploy-files", "--profile", "chosen", "--qualify-dir", str(out),
        "--hf-cache", str(tmp_path / "hf"), "--out", str(tmp_path / "deploy"),
    )  # fmt: skip
    assert "profile chosen by the sweep" in deployed.stderr
    assert "its receipt is partial" in deployed.stderr
    service = yaml.safe_load((tmp_path / "deploy" / "compose.yaml").read_text())["services"]
    command = service["sglang"]["command"]
    assert command[command.index("--cuda-graph-backend-decode") + 1] == "breakable"
    ran = hung["server"]["command"]
    assert ran[: len(hung["server"]["entrypoint"])] == ["python3", "/standin.py"]
    ran = ran[len(hung["server"]["entrypoint"]) :]
    assert len(command) == len(ran)
    for at, (compose_arg, container_arg) in enumerate(zip(command, ran, strict=True)):
        assert compose_arg == container_arg, f"argument {at}"
    assert sorted(service["sglang"]["volumes"]) == sorted(hung["server"]["mounts"])
    assert service["sglang"]["image"] == hung["server"]["image"]["id"]

    # --compare reads the sweep's folder: one table, one plot.
    compared = json.loads(bare_builder(
        tmp_path, docker_host, "qualify", "--compare", str(out), "--out", str(tmp_path / "cmp"),
        "--json",
    ).stdout)  # fmt: skip
    assert compared["columns"] == ["", "hangs-then-falls-back", "wrong-at-gsm8k"]
    rows = {row[0]: row[1:] for row in compared["rows"]}
    assert rows["gate gsm8k"][0].startswith("ok 1.0000") and rows["gate gsm8k"][1].startswith(
        "FAIL"
    )
    assert rows["c=4 tok/s"][1] == "-"
    assert Path(compared["plot"]).read_bytes()[:4] == b"\x89PNG"
