"""The image's JIT warm-up inside the real test image, with real flashinfer and nvcc: a
host-only module is valid, and the first module that fails stops the others at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.services import CUDA_TOOLKIT, requirement_lines

pytestmark = pytest.mark.docker

GENERATORS = """
from pathlib import Path
from flashinfer.jit.core import gen_jit_spec

def gen_broken_module():
    source = Path("/tmp/broken.cu")
    source.write_text("__global__ void k() { this is not CUDA; }\\n")
    return gen_jit_spec("broken", [source])

def gen_host_only_module():
    source = Path("/tmp/host_only.cpp")
    source.write_text('extern "C" int builder_host_only() { return 1; }\\n')
    return gen_jit_spec("host_only", [source])
"""


@pytest.fixture(scope="module")
def image(built_image) -> str:
    """The session's test image (gelu_tanh_and_mul and fp4_quantization_120 pre-compiled)."""
    return built_image[1]["reference"]


def _warmup(docker_client, image: str, modules: list[str], tmp_path: Path) -> tuple[int, str]:
    (tmp_path / "test_jit.py").write_text(GENERATORS)
    container = docker_client.containers.run(
        image,
        ["-c", "python /opt/builder/jit_warmup.py --modules \"$MODULES\" --jobs 2 "
         "--inventory /tmp/inventory.json; rc=$?; cat /tmp/inventory.json 2>/dev/null; "
         "ls $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/*/120a/cached_ops/*/*.so; exit $rc"],
        entrypoint=["sh"],
        environment={"MODULES": json.dumps(modules), "PYTHONPATH": "/jit-test"},
        volumes={str(tmp_path): {"bind": "/jit-test", "mode": "ro"}},
        network_mode="none",
        detach=True,
    )  # fmt: skip
    try:
        code = container.wait(timeout=600)["StatusCode"]
        return code, container.logs().decode()
    finally:
        container.remove(force=True)


def test_a_host_only_module_is_recorded_as_host_only(docker_client, image, tmp_path) -> None:
    """A module of C++ sources alone (as FlashInfer's spdlog is: one generated here, as it
    compiles in a second where spdlog takes a minute) is a library with no GPU code."""
    code, output = _warmup(docker_client, image, ["test_jit:gen_host_only_module"], tmp_path)
    assert code == 0, output
    inventory = json.loads(output[output.index("{") : output.rindex("}") + 1])
    (host_only,) = [m for m in inventory["modules"] if m["name"] == "host_only"]
    assert host_only["device_code"] is False and host_only["arch"] == []
    assert "host_only/host_only.so" in output
    nvcc = next(line for line in requirement_lines(CUDA_TOOLKIT) if "nvcc==" in line)
    assert inventory["nvcc_version"] == nvcc.split("==")[1]


def test_the_first_failure_stops_the_other_compiles(docker_client, image, tmp_path) -> None:
    slow = "flashinfer.jit.activation:gen_act_and_mul_module('gelu_tanh')"
    code, output = _warmup(docker_client, image, [slow, "test_jit:gen_broken_module"], tmp_path)
    assert code == 1
    assert "test_jit:gen_broken_module (broken) failed to compile; other compiles stopped" in output
    assert "/tmp/broken.cu(1): error" in output  # the compiler's own words, in the tail
    assert "gelu_tanh_and_mul.so" not in output, "the other module's build ran to the end"
