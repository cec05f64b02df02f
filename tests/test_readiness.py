"""`builder wait-ready` against a stand-in sglang server inside a real container.

No GPU exists here: tests/standin_sglang.py plays sglang's endpoints (503 while loading,
then 200; or dying mid-start). It runs in a real container on the real engine, so crash
detection is tested against real container state, not a heuristic.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import Builder
from tests.services import free_port

pytestmark = pytest.mark.docker

STANDIN = Path(__file__).with_name("standin_sglang.py")
GOOD_INFO = {
    "moe_runner_backend": "flashinfer_cutlass",
    "attention_backend": "flashinfer",
    "tp_size": 8,
    "kv_cache_dtype": "fp8_e4m3",
    "enable_flashinfer_allreduce_fusion": False,
    "quantization": "modelopt_fp4",
}


@pytest.fixture
def standin(docker_client, test_base):
    started = []

    def start(**env: str) -> tuple[str, str]:
        port = free_port()
        name = f"standin-{uuid.uuid4().hex[:8]}"
        docker_client.containers.run(
            test_base,
            ["python3", "/standin.py", str(port)],
            name=name,
            detach=True,
            network_mode="host",
            environment={"SERVER_INFO": json.dumps(GOOD_INFO), **env},
            volumes={str(STANDIN): {"bind": "/standin.py", "mode": "ro"}},
        )
        started.append(name)
        return f"http://127.0.0.1:{port}", name

    yield start
    for name in started:
        docker_client.containers.get(name).remove(force=True)


def wait(builder: Builder, docker_host: str, url: str, *args: str):
    return builder.run(
        "wait-ready", url, "--poll", "0.3", "--json", *args,
        env={"DOCKER_HOST": docker_host}, check=False,
    )  # fmt: skip


def test_loading_then_ready_with_the_profile_backends(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="4")
    result = wait(builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8")
    verdict = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict["state"] == "ready"
    assert verdict["elapsed_seconds"] >= 3.5, "it waited through the 503s"
    assert verdict["server_info"]["moe_runner_backend"] == "flashinfer_cutlass"


def test_a_container_that_dies_mid_start_is_crashed(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="60", DIE_AFTER_SECONDS="3", EXIT_CODE="3")
    result = wait(builder, docker_host, url, "--container", name, "--deadline", "2")
    verdict = json.loads(result.stdout)
    assert result.returncode == 2
    assert verdict["state"] == "crashed"
    assert f"container {name} exited with code 3" in verdict["message"]
    assert "simulated fatal error" in verdict["log_tail"]


def test_still_loading_at_the_deadline_is_not_a_crash(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="600")
    result = wait(builder, docker_host, url, "--container", name, "--deadline", "0.1")
    verdict = json.loads(result.stdout)
    assert result.returncode == 3
    assert verdict["state"] == "timeout"
    assert verdict["stage"] == "/health"
    assert "still running" in verdict["message"] and "503" in verdict["message"]


def test_other_backends_than_asked_is_a_mismatch(builder, docker_host, standin) -> None:
    info = {**GOOD_INFO, "moe_runner_backend": "triton"}
    url, name = standin(STARTUP_SECONDS="1", SERVER_INFO=json.dumps(info))
    result = wait(builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8")
    verdict = json.loads(result.stdout)
    assert result.returncode == 4
    assert verdict["state"] == "mismatch"
    assert "moe_runner_backend=triton (asked for flashinfer_cutlass)" in verdict["message"]


def test_fusion_profile_expects_fusion_on(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="1")
    result = wait(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8-fusion"
    )
    assert result.returncode == 4
    assert (
        "enable_flashinfer_allreduce_fusion=False (asked for True)"
        in json.loads(result.stdout)["message"]
    )
