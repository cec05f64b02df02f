"""The GPU VM's commands against a vLLM server: target sm120-vllm's profiles, a stand-in
`vllm serve` (tests/standin_vllm.py: no GPU exists here) inside a real container on the real
engine, given the very arguments the profile renders.

vLLM's port stays closed while it loads (no 503 stage as sglang's), it has no /server_info,
and what it runs is in its start-up log: wait-ready must read each of these as vLLM says
them, and hold the profile's promises (attention, MoE and linear backends, TP size, KV
dtype, speculative config) to them.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from builder.spec.engines import vllm
from tests.conftest import Builder

pytestmark = pytest.mark.docker


def wait(builder: Builder, docker_host: str, url: str, *args: str):
    return builder.run(
        "wait-ready", url, "--poll", "0.3", "--json", "--target", "sm120-vllm", *args,
        env={"DOCKER_HOST": docker_host}, check=False,
    )  # fmt: skip


def test_loading_with_the_port_closed_then_ready_with_the_profile_backends(
    builder, docker_host, vllm_standin
) -> None:
    url, name = vllm_standin("glm5-nvfp4-tp8", STARTUP_SECONDS="6")
    result = wait(builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8")
    verdict = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict["state"] == "ready" and verdict["stage"] == "identity"
    assert "backends match" in verdict["message"] and "not checked" not in verdict["message"]
    served = verdict["server_info"]
    assert served["attention_backend"] == "FLASHINFER_MLA_SPARSE_SM120"
    assert (served["moe_backend"], served["linear_backend"]) == ("b12x", "b12x")
    assert served["tensor_parallel_size"] == "8" and served["kv_cache_dtype"] == "fp8"
    assert served["model"] == "lukealonso/GLM-5-NVFP4" and served["version"] == "0.34.0"
    assert served["cache_dtype"] == "fp8"  # vllm:cache_config_info on /metrics


def test_another_attention_backend_than_asked_is_a_mismatch(
    builder, docker_host, vllm_standin
) -> None:
    url, name = vllm_standin("glm5-nvfp4-tp8", STARTUP_SECONDS="1", ATTENTION_LOGGED="TRITON_MLA")
    result = wait(builder, docker_host, url, "--container", name, "--profile", "glm5-nvfp4-tp8")
    verdict = json.loads(result.stdout)
    assert result.returncode == 5, result.stdout + result.stderr
    assert (
        "attention_backend=TRITON_MLA (asked for FLASHINFER_MLA_SPARSE_SM120)" in verdict["message"]
    )


def test_without_a_container_the_log_only_keys_are_said_unchecked(
    builder, docker_host, vllm_standin
) -> None:
    url, _ = vllm_standin("glm5-nvfp4-tp8-mtp", STARTUP_SECONDS="1")
    result = wait(builder, docker_host, url, "--profile", "glm5-nvfp4-tp8-mtp", "--deadline", "1")
    verdict = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    message = verdict["message"]
    assert "not checked without --container" in message
    for key in ("attention_backend", "moe_backend", "speculative_method", "tensor_parallel_size"):
        assert key in message
    assert verdict["server_info"]["model"] == "festr2/GLM-5-NVFP4-MTP"  # /v1/models, checked


def test_the_wrong_model_on_v1_models_is_a_mismatch_without_a_container(
    builder, docker_host, vllm_standin
) -> None:
    url, _ = vllm_standin("glm5-nvfp4-tp8", STARTUP_SECONDS="1")
    result = wait(builder, docker_host, url, "--profile", "glm52-nvfp4-tp8", "--deadline", "1")
    assert result.returncode == 5, result.stdout + result.stderr
    assert (
        "model=lukealonso/GLM-5-NVFP4 (asked for lukealonso/GLM-5.2-NVFP4)"
        in json.loads(result.stdout)["message"]
    )


def test_a_crash_while_the_port_is_closed_is_crashed(builder, docker_host, vllm_standin) -> None:
    url, name = vllm_standin(
        "glm5-nvfp4-tp8", STARTUP_SECONDS="60", DIE_AFTER_SECONDS="2", EXIT_CODE="3"
    )
    result = wait(
        builder, docker_host, url, "--container", name, "--deadline", "1", "--engine", "vllm"
    )
    verdict = json.loads(result.stdout)
    assert result.returncode == 3, result.stdout + result.stderr
    assert verdict["state"] == "crashed" and verdict["stage"] == "port"
    assert "simulated fatal error" in verdict["log_tail"]


def test_an_api_key_guards_v1_and_the_key_file_opens_it(
    builder, docker_host, vllm_standin, tmp_path
) -> None:
    url, _ = vllm_standin("glm5-nvfp4-tp8", STARTUP_SECONDS="1", VLLM_API_KEY="s3cret-key")
    refused = wait(builder, docker_host, url, "--engine", "vllm", "--deadline", "1")
    assert refused.returncode == 5, refused.stdout + refused.stderr
    assert "refuses /v1/models (401)" in json.loads(refused.stdout)["message"]
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    ok = wait(builder, docker_host, url, "--engine", "vllm", "--api-key-file", str(key))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "s3cret-key" not in ok.stdout + ok.stderr


# The image's environment (images/sm120-vllm/Dockerfile): every cache on the profile's volume.
IMAGE_CACHES = {
    "VLLM_CACHE_ROOT": "/root/.cache/vllm",
    "B12X_COMPILE_CACHE_DIR": "/root/.cache/vllm/b12x",
    "TRITON_CACHE_DIR": "/root/.cache/vllm/triton",
}


def test_kernels_vllm_compiled_at_start_are_named_per_cache(
    builder, docker_host, docker_client, vllm_standin, tmp_path
) -> None:
    """The profile keeps vLLM's caches on a host volume, where `docker diff` sees nothing: a
    kernel file written there by this start counts, one left by an earlier start does not,
    nor a file that is no kernel (b12x's manifest)."""
    host_cache = tmp_path / "vllm-cache"
    earlier = host_cache / "b12x/00/00aa11.o"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"compiled by an earlier start")
    os.utime(earlier, (time.time() - 3600,) * 2)
    now = [
        "/root/.cache/vllm/b12x/3f/3f9a0c.o",
        "/root/.cache/vllm/b12x/3f/3f9a0c.json",
        "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/ab12/inductor_cache/xy/cxyabc.py",
        "/root/.cache/vllm/triton/Q2HX/_topk_kernel.cubin",
        "/root/.cache/vllm/deep_gemm/cache/kernel.sm120_fp8_paged_mqa_logits.77/kernel.cubin",
    ]
    url, name = vllm_standin(
        "glm5-nvfp4-tp8",
        {str(host_cache): {"bind": "/root/.cache/vllm", "mode": "rw"}},
        STARTUP_SECONDS="1", WRITE_AT_START=";".join(now), **IMAGE_CACHES,
    )  # fmt: skip
    result = wait(builder, docker_host, url, "--container", name, "--engine", "vllm")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["other_jit_compiled_at_start"] == {
        "b12x": ["3f9a0c"],
        "torch_compile": ["cxyabc"],
        "triton": ["_topk_kernel"],
        "deep_gemm": ["kernel.sm120_fp8_paged_mqa_logits.77"],
    }
    text = builder.run(
        "wait-ready", url, "--container", name, "--engine", "vllm",
        env={"DOCKER_HOST": docker_host},
    ).stdout  # fmt: skip
    assert (
        "other JIT kernels compiled at start-up: b12x 1, torch.compile 1, Triton 1, DeepGEMM 1 "
        "(3f9a0c, _topk_kernel, cxyabc, kernel.sm120_fp8_paged_mqa_logits.77)"
    ) in text.splitlines()
    docker_client.containers.get(name).stop(timeout=1)
    stopped = json.loads(
        wait(builder, docker_host, url, "--container", name, "--engine", "vllm",
             "--deadline", "0").stdout
    )  # fmt: skip
    assert stopped["other_jit_compiled_at_start"] == dict.fromkeys(
        ("b12x", "torch_compile", "triton", "deep_gemm")
    )


def test_engine_flag_that_contradicts_the_profile_is_refused(builder) -> None:
    result = builder.run(
        "wait-ready", "http://127.0.0.1:9", "--target", "sm120-vllm",
        "--profile", "glm5-nvfp4-tp8", "--engine", "sglang", check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "--engine sglang: profile glm5-nvfp4-tp8 starts a vllm server" in result.stderr


def test_the_stand_in_logs_what_vllm_0_34_logs() -> None:
    """The config line the stand-in writes is read by the same parser that reads vLLM's:
    VllmConfig.__str__'s field order (config/vllm.py:2890-2923), checked by hand there."""
    text = (
        "INFO Initializing a V1 LLM engine (v0.34.0) with config: model='m', "
        "speculative_config=SpeculativeConfig(method='mtp', model=None, num_spec_tokens=3), "
        "revision=abc, tensor_parallel_size=8, kv_cache_dtype=fp8, "
        "kernel_config=KernelConfig(moe_backend='b12x', linear_backend='auto')\n"
        "INFO Using AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120 backend.\n"
        "INFO Using B12X NvFp4 MoE backend out of potential backends: ['B12X'].\n"
    )
    found = vllm.log_settings(text)
    assert found["speculative_method"] == "mtp" and found["num_speculative_tokens"] == "3"
    assert found["moe_backend"] == "b12x" and found["linear_backend"] == "auto"
    assert found["attention_backend"] == "FLASHINFER_MLA_SPARSE_SM120"
    assert found["moe_backend_selected"] == "b12x" and found["revision"] == "abc"
