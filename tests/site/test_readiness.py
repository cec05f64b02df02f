"""`builder wait-ready` against a stand-in sglang server inside a real container.

No GPU exists here: tests/standin_sglang.py plays sglang's endpoints (503 while loading,
then 200; or dying mid-start). It runs in a real container on the real engine, so crash
detection is tested against real container state, not a heuristic.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import GOOD_INFO, REPO_ROOT, STANDIN, Builder
from tests.services import free_port

pytestmark = pytest.mark.docker


def wait(builder: Builder, docker_host: str, url: str, *args: str):
    return builder.run(
        "wait-ready", url, "--poll", "0.3", "--json", *args,
        env={"DOCKER_HOST": docker_host}, check=False,
    )  # fmt: skip


def test_loading_then_ready_with_the_profile_backends(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="8")
    result = wait(builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8")
    verdict = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict["state"] == "ready"
    # The 8 s of 503s count from the container's start; wait-ready itself starts a few
    # seconds later on a loaded machine.
    assert verdict["elapsed_seconds"] >= 4, "it waited through the 503s"
    assert verdict["server_info"]["moe_runner_backend"] == "flashinfer_cutlass"


def test_a_container_that_dies_mid_start_is_crashed(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="60", DIE_AFTER_SECONDS="3", EXIT_CODE="3")
    result = wait(builder, docker_host, url, "--container", name, "--deadline", "2")
    verdict = json.loads(result.stdout)
    assert result.returncode == 3
    assert verdict["state"] == "crashed"
    assert f"container {name} exited with code 3" in verdict["message"]
    assert "simulated fatal error" in verdict["log_tail"]


def test_still_loading_at_the_deadline_is_not_a_crash(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="600")
    result = wait(builder, docker_host, url, "--container", name, "--deadline", "0.1")
    verdict = json.loads(result.stdout)
    assert result.returncode == 4
    assert verdict["state"] == "timeout"
    assert verdict["stage"] == "/health"
    assert "still running" in verdict["message"] and "503" in verdict["message"]


def test_other_backends_than_asked_is_a_mismatch(builder, docker_host, standin) -> None:
    info = {**GOOD_INFO, "moe_runner_backend": "triton"}
    url, name = standin(STARTUP_SECONDS="1", SERVER_INFO=json.dumps(info))
    result = wait(builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8")
    verdict = json.loads(result.stdout)
    assert result.returncode == 5
    assert verdict["state"] == "mismatch"
    assert "moe_runner_backend=triton (asked for flashinfer_cutlass)" in verdict["message"]


def test_fusion_profile_expects_fusion_on(builder, docker_host, standin) -> None:
    url, name = standin(STARTUP_SECONDS="1")
    result = wait(
        builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8-fusion"
    )
    assert result.returncode == 5
    assert (
        "enable_flashinfer_allreduce_fusion=False (asked for True)"
        in json.loads(result.stdout)["message"]
    )


def test_a_container_removed_while_starting_is_crashed(
    builder, docker_host, docker_client, standin
) -> None:
    url, name = standin(STARTUP_SECONDS="600")
    command = builder.command("wait-ready", url, "--container", name, "--poll", "0.3", "--json")
    waiting = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env={**os.environ, "DOCKER_HOST": docker_host},
    )  # fmt: skip
    time.sleep(3)
    docker_client.containers.get(name).remove(force=True)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 3, err
    verdict = json.loads(out)
    assert verdict["state"] == "crashed"
    assert f"container {name}" in verdict["message"]


def test_a_silent_start_is_stalled(builder, docker_host, standin) -> None:
    url, name = standin(SILENT_SECONDS="600")
    result = wait(builder, docker_host, url, "--container", name, "--stall-minutes", "0.05")
    verdict = json.loads(result.stdout)
    assert result.returncode == 6, result.stderr
    assert verdict["state"] == "stalled" and verdict["stage"] == "port"
    assert "no new log line for" in verdict["message"]
    assert "Load weight begin" not in verdict["log_tail"]  # it never got that far


def test_kernels_other_jits_compile_at_start_are_named_per_cache(
    builder, docker_host, docker_client, standin, tmp_path
) -> None:
    """The profile keeps sglang's cache on a host volume, where `docker diff` sees nothing:
    a kernel written there by this start counts, one left by an earlier start does not."""
    host_cache = tmp_path / "sglang-cache"
    earlier = host_cache / "deep_gemm/cache/kernel.sm120_fp8_mqa_logits.1111/kernel.cubin"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"compiled by an earlier start")
    os.utime(earlier, (time.time() - 3600,) * 2)
    now = [
        "/root/.cache/sglang/deep_gemm/cache/kernel.sm120_fp8_paged_mqa_logits.2222/kernel.cubin",
        "/root/.cache/sglang/jit/sm_120/topk_v2/build-ab/deps-cd/topk_v2.so",
        "/tmp/triton/9f8e/_fwd_kernel.cubin",
    ]
    url, name = standin(
        volumes={str(host_cache): {"bind": "/root/.cache/sglang", "mode": "rw"}},
        WRITE_AT_START=";".join(now),
        TRITON_CACHE_DIR="/tmp/triton",
    )
    result = wait(builder, docker_host, url, "--container", name)
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["other_jit_compiled_at_start"] == {
        "deep_gemm": ["kernel.sm120_fp8_paged_mqa_logits.2222"],
        "sglang_jit": ["topk_v2"],
        "triton": ["_fwd_kernel"],
    }
    text = builder.run(
        "wait-ready", url, "--container", name, env={"DOCKER_HOST": docker_host}
    ).stdout
    assert "DeepGEMM 1, sglang JIT 1, Triton 1" in text
    docker_client.containers.get(name).stop(timeout=1)
    stopped = json.loads(
        wait(builder, docker_host, url, "--container", name, "--deadline", "0").stdout
    )
    assert stopped["other_jit_compiled_at_start"] == {
        "deep_gemm": None,
        "sglang_jit": None,
        "triton": None,
    }


def test_a_closed_port_without_container_is_not_ready_and_never_checked(builder) -> None:
    port = free_port()
    result = builder.run(
        "wait-ready", f"http://127.0.0.1:{port}", "--deadline", "0", "--json", check=False
    )
    verdict = json.loads(result.stdout)
    assert result.returncode == 4
    assert verdict["state"] == "timeout" and verdict["elapsed_seconds"] < 5
    assert "nothing is listening" in verdict["message"]
    assert "✓" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["not-a-url"], "wait-ready URL 'not-a-url': expected http://HOST:PORT"),
        (["ftp://127.0.0.1:21"], "wait-ready URL 'ftp://127.0.0.1:21': expected http://HOST:PORT"),
        (["http://127.0.0.1:99999"], "expected http://HOST:PORT"),
        (["http://127.0.0.1:30000/health"], "give the server root"),
        (
            ["http://127.0.0.1:30000", "--deadline", "-1"],
            "--deadline -1: must be a number of minutes, 0 or more",
        ),
        (
            ["http://127.0.0.1:30000", "--poll", "0"],
            "--poll 0: must be a number of seconds above 0",
        ),
        (["http://127.0.0.1:30000", "--expect", "=x"], "--expect =x: expected KEY=VALUE"),
    ],
)
def test_bad_wait_ready_input_is_one_line(builder, args, message) -> None:
    result = builder.run("wait-ready", *args, check=False)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr


def test_the_image_healthcheck_follows_the_servers_port(docker_client, built_image) -> None:
    """The image's HEALTHCHECK command, run in a container started on a non-default port."""
    reference = built_image[1]["reference"]  # the session's test image
    config = docker_client.images.get(reference).attrs["Config"]["Healthcheck"]
    assert config["Test"] == ["CMD", "python", "/opt/builder/healthcheck.py"]
    port = free_port()
    container = docker_client.containers.run(
        reference, ["--port", str(port)], entrypoint=["python", "/standin.py"], detach=True,
        network_mode="host", environment={"STARTUP_SECONDS": "0"},
        volumes={str(STANDIN): {"bind": "/standin.py", "mode": "ro"}},
    )  # fmt: skip
    try:
        for _ in range(50):
            code, output = container.exec_run(config["Test"][1:])
            if code == 0:
                break
            time.sleep(0.2)
        assert code == 0, output
    finally:
        container.remove(force=True)


def test_an_ipv6_server_is_waited_for_like_any_other(builder) -> None:
    """`launch --bind ::1` prints http://[::1]:PORT: wait-ready takes it as given."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(GOOD_INFO).encode() if self.path == "/server_info" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    try:
        server = Server(("::1", 0), Handler)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://[::1]:{server.server_address[1]}"
        result = builder.run("wait-ready", url, "--expect", "tp_size=8", "--json", check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["state"] == "ready"
    finally:
        server.shutdown()


def test_durations_take_a_unit(builder) -> None:
    """--deadline 3s: minutes by default, or seconds, minutes, hours with their unit; --poll
    0.01m: seconds by default, and the same units."""
    from builder.core import validate

    assert validate.duration("--deadline", "90s", "m") == 90
    assert validate.duration("--deadline", "1.5h", "m") == 5400
    assert validate.duration("--deadline", "20", "m") == 1200
    assert validate.duration("--poll", "20m", "s") == 1200
    assert validate.duration("--poll", "2", "s") == 2
    assert validate.duration("--deadline", "0", "m", minimum=0) == 0  # 0 checks once
    assert validate.duration("--deadline", None, "m") is None
    port = free_port()
    result = builder.run(
        "wait-ready", f"http://127.0.0.1:{port}", "--deadline", "3s", "--poll", "0.01m",
        "--json", check=False,
    )  # fmt: skip
    verdict = json.loads(result.stdout)
    assert result.returncode == 4 and 2.5 <= verdict["elapsed_seconds"] < 20
