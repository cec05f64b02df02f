"""Target sm120-vllm into an image on the real engine: vLLM 0.34.0 from its released wheel,
repacked with the target's series, FlashInfer from git with its kernels compiled at build.

Real parts: the vLLM 0.34.0 wheel from PyPI (239 MB, cached outside the repository, checked
against the pin's sha256) served by a real package index on loopback through `--mirror`,
FlashInfer from a git daemon, nvcc 13 from NVIDIA's wheels, the engine. Stand-ins, as for
sm120's image (tests/build/test_current_stack.py, whose engine group this test runs in, after
that image): the test base for NVIDIA's CUDA image, PyPI's torch 2.7.1 for vLLM's torch
2.14.0 (no CPU build of either is on PyPI; the runtime layer is that image's own, not another
3 GB), and FlashInfer 0.7.2's source for the pinned 0.7.4 (the run already serves and fetches
0.7.2; 0.7.4's sdist is twice its size). What the image holds of vLLM is checked by its files
and metadata; importing it needs torch 2.14.0 and a GPU.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest

from tests.build import test_current_stack as current_stack
from tests.build.test_current_stack import (
    FLASHINFER_PIN,
    _builder,
    _release_extensions,
    current_stack_image_args,
    own_target,
    seed_from_the_run,
    what_the_image_holds,
)
from tests.conftest import REPO_ROOT, VLLM_PIN, validate_manifest
from tests.upstreams import fetch_release_file

pytestmark = pytest.mark.docker

TARGET = "sm120-vllm"
OWN_REPOSITORY = "vllm-sm120-test"
# The one module compiled: not in this target's list (sparse_mla_sm120 and sampling take
# minutes of nvcc each on 2 cores), one generated translation unit; sm120's image test
# compiles one of its own target's list.
GELU = "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='gelu_tanh')"
FLASHINFER_FORK = tomllib.loads((REPO_ROOT / "forks/flashinfer-0.7.4/pin.toml").read_text())
# sm120's FlashInfer mirror and wheel: made once per run, whichever module asks.
flashinfer_upstream = current_stack.flashinfer_upstream
flashinfer_wheel = current_stack.flashinfer_wheel


def test_sm120_vllm_builds_into_an_image(
    tmp_path: Path,
    flashinfer_upstream: tuple[str, str],
    flashinfer_wheel: dict,
    docker_host: str,
    docker_client,
    test_base: str,
    current_stack_index: int,
) -> None:
    """`builder image --target sm120-vllm`: the release downloaded through the index and
    checked, the series applied (METADATA requires the FlashInfer the image has), the wheel
    repacked with its compiled extensions byte for byte, FlashInfer built from git under the
    target's own label, one module (gelu_tanh_and_mul) compiled for 12.0f and loaded from the
    kernel wheel with JIT off, vLLM's entrypoint, port and cache folders, and a manifest
    whose launch command (the entrypoint's `vllm serve` arguments) asks for the target's
    backends."""
    release = fetch_release_file("vllm", VLLM_PIN["ref"])
    assert hashlib.sha256(release.read_bytes()).hexdigest() == VLLM_PIN["sha256"]
    port = current_stack_index
    builder = _builder(tmp_path, f"https://pypi.org/simple=http://127.0.0.1:{port}/simple")
    builder.env.update({"DOCKER_HOST": docker_host, "BUILDER_TARGET": TARGET})
    own_target(builder, TARGET, OWN_REPOSITORY)
    mirror, flashinfer_commit = flashinfer_upstream
    fork_pin = builder.data_dir / "forks/flashinfer-0.7.4/pin.toml"
    text = fork_pin.read_text()
    for field, value in (("ref", "refs/tags/v0.7.2"), ("commit", flashinfer_commit),
                         ("version", FLASHINFER_PIN["version"])):  # fmt: skip
        text = text.replace(f'{field} = "{FLASHINFER_FORK[field]}"', f'{field} = "{value}"')
    fork_pin.write_text(text)
    seed_from_the_run(builder, flashinfer_wheel, "mirrors")  # the fetch; the wheel is built
    args = current_stack_image_args(test_base, port, GELU)
    result = json.loads(builder.run(*args, "--mirror", mirror).stdout)

    image = result["image"]
    assert image["reference"].startswith(f"{OWN_REPOSITORY}:vllm0.34.0-fi0.7.2-"), image
    manifest = json.loads(Path(result["manifest"]).read_text())
    validate_manifest(manifest)
    assert manifest["target"]["name"] == TARGET and manifest["target"]["arch_list"] == ["12.0f"]
    vllm = manifest["upstreams"]["vllm"]
    assert vllm["source"] == "release" and vllm["release_sha256"] == VLLM_PIN["sha256"]
    assert vllm["commit"] == VLLM_PIN["commit"] and vllm["ref"] == VLLM_PIN["ref"]
    wheels = manifest["wheels"]
    assert wheels["vllm"]["version"].startswith("0.34.0+sm120vllm.g"), wheels
    fork = manifest["upstreams"]["flashinfer"]["fork_commit"]
    assert wheels["flashinfer"]["version"] == f"0.7.2+sm120vllm.g{fork[:7]}", wheels
    assert [m["name"] for m in image["jit_inventory"]["modules"]] == ["gelu_tanh_and_mul"]

    recipe = manifest["launch"]["glm5-nvfp4-tp8"]
    assert recipe["args"][0] == recipe["model"] and recipe["model_revision"], recipe
    command = " ".join(recipe["args"])
    for flag in ("--attention-backend FLASHINFER_MLA_SPARSE_SM120", "--moe-backend b12x",
                 "--tensor-parallel-size 8"):  # fmt: skip
        assert flag in command, command

    config = docker_client.images.get(image["reference"]).attrs["Config"]
    assert config["Entrypoint"] == ["python", "/opt/builder/entrypoint.py"], config
    assert "8000/tcp" in config["ExposedPorts"], config
    assert "VLLM_CACHE_ROOT=/root/.cache/vllm" in config["Env"], config["Env"]

    found = what_the_image_holds(docker_client, image["reference"], "vllm", GELU)
    assert found["versions"] == {
        "vllm": wheels["vllm"]["version"],
        "flashinfer-python": wheels["flashinfer"]["version"],
    }
    assert f"flashinfer-python=={FLASHINFER_FORK['version']}" in found["requires"], found
    extensions = _release_extensions(release)
    assert len(extensions) >= 2 and found["so"] == extensions
    assert found["aot"] and found["engine"] == "vllm", found
