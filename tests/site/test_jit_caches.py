"""The JIT caches each engine's server writes at start-up outside FlashInfer: where each
folder is, from a container's environment as the engine resolves it; which files in it are
a compiled kernel and what each is named; and the report of them (builder/site/runtime_jit.py).

No container here: the in-container lister is run by this machine's python3 over folders
written here, with their times set as a start would leave them (the container-side run is
in tests/site/test_readiness.py and test_vllm_site.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.site import runtime_jit
from builder.spec import engines, launch, launch_profiles
from builder.spec.engines import sglang, vllm
from tests.conftest import REPO_ROOT

SGLANG = sglang.ENGINE
VLLM = vllm.ENGINE


@pytest.mark.parametrize("name", engines.NAMES)
def test_each_engine_says_where_every_one_of_its_caches_is(name: str) -> None:
    engine = engines.engine(name)
    assert list(engine.jit_cache_roots({})) == [cache.key for cache in engine.jit_caches]


@pytest.mark.parametrize(
    ("env", "roots"),
    [
        ({}, {"deep_gemm": "/root/.cache/sglang/deep_gemm",
              "sglang_jit": "/root/.cache/sglang/jit", "triton": "/root/.cache/sglang/triton"}),
        ({"HOME": "/home/op", "SGLANG_CACHE_DIR": "~/sg", "SGLANG_DG_CACHE_DIR": "/dg"},
         {"deep_gemm": "/dg", "sglang_jit": "/home/op/.cache/sglang/jit",
          "triton": "/home/op/sg/triton"}),
        ({"DG_JIT_CACHE_DIR": "/first", "SGLANG_DG_CACHE_DIR": "/dg",
          "SGLANG_JIT_CACHE_DIR": "/jit", "TRITON_CACHE_DIR": "/tmp/triton"},
         {"deep_gemm": "/first", "sglang_jit": "/jit", "triton": "/tmp/triton"}),
    ],
    ids=["defaults", "sglang-cache-dir", "each-its-own"],
)  # fmt: skip
def test_sglang_s_caches_are_where_sglang_0_5_23_puts_them(env: dict, roots: dict) -> None:
    assert SGLANG.jit_cache_roots(env) == roots


@pytest.mark.parametrize(
    ("env", "roots"),
    [
        ({}, {"b12x": "/root/.cache/b12x/compile",
              "torch_compile": "/root/.cache/vllm/torch_compile_cache",
              "triton": "/root/.triton/cache", "deep_gemm": "/root/.cache/vllm/deep_gemm"}),
        ({"HOME": "/home/op", "XDG_CACHE_HOME": "/xdg"},
         {"b12x": "/xdg/b12x/compile", "torch_compile": "/xdg/vllm/torch_compile_cache",
          "triton": "/home/op/.triton/cache", "deep_gemm": "/xdg/vllm/deep_gemm"}),
        ({"HOME": "/home/op", "XDG_CACHE_HOME": "/xdg", "VLLM_CACHE_ROOT": "~/v",
          "B12X_COMPILE_CACHE_DIR": "/b12x", "TRITON_CACHE_DIR": "/t",
          "DG_JIT_CACHE_DIR": "/dg"},
         {"b12x": "/b12x", "torch_compile": "/home/op/v/torch_compile_cache", "triton": "/t",
          "deep_gemm": "/dg"}),
    ],
    ids=["defaults", "xdg-cache-home", "each-its-own"],
)  # fmt: skip
def test_vllm_s_caches_are_where_vllm_0_34_and_b12x_put_them(env: dict, roots: dict) -> None:
    assert VLLM.jit_cache_roots(env) == roots


def _dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The NAME=VALUE pairs of a Dockerfile's ENV instructions (continued lines joined)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            pairs.update(re.findall(r"(\w+)=(\S+)", line))
    return pairs


@pytest.mark.parametrize("target", ["sm120", "sm120-vllm"])
def test_every_cache_a_start_compiles_into_is_on_the_profile_s_host_volume(target: str) -> None:
    """So a host compiles each kernel once, and the next start finds it: the image's
    environment and each profile's, resolved as the engine resolves them."""
    image_env = _dockerfile_env(REPO_ROOT / "images" / target / "Dockerfile")
    known = launch_profiles.Profiles.of(REPO_ROOT / "images" / target / "target.toml")
    for profile in known.profiles:
        recipe = launch.resolve(known, profile, "-", launch.Overrides())
        mounted = [container for _, container, mode in recipe.volumes if mode == "rw"]
        roots = engines.engine(recipe.engine).jit_cache_roots({**image_env, **recipe.env})
        for key, root in roots.items():
            assert any(root.startswith(f"{folder}/") for folder in mounted), (profile, key, root)


def _vllm_cache(key: str):
    return next(cache for cache in VLLM.jit_caches if cache.key == key)


@pytest.mark.parametrize(
    ("engine", "key", "relative", "name"),
    [
        (SGLANG, "deep_gemm", "cache/kernel.sm120_fp8_mqa_logits.1a2b/kernel.cubin",
         "kernel.sm120_fp8_mqa_logits.1a2b"),
        (SGLANG, "sglang_jit", "sm_120/topk_v2/build-ab/topk_v2.so", "topk_v2"),
        (SGLANG, "triton", "9f8e/_fwd_kernel.cubin", "_fwd_kernel"),
        (SGLANG, "deep_gemm", "kernel.cubin", "kernel"),  # right in the folder: its own name
        (VLLM, "b12x", "3f/3f9a0c.o", "3f9a0c"),
        (VLLM, "torch_compile", "torch_aot_compile/ab12/inductor_cache/xy/cxyabc.py", "cxyabc"),
        (VLLM, "triton", "Q2HX/_topk_kernel.cubin", "_topk_kernel"),
        (VLLM, "deep_gemm", "cache/kernel.sm120_fp8_paged_mqa_logits.77/kernel.cubin",
         "kernel.sm120_fp8_paged_mqa_logits.77"),
    ],
)  # fmt: skip
def test_a_compiled_file_is_named_as_its_cache_names_kernels(
    engine, key: str, relative: str, name: str
) -> None:
    cache = next(cache for cache in engine.jit_caches if cache.key == key)
    assert runtime_jit.kernel_name(cache, relative) == name


def test_the_lister_counts_each_cache_s_kernel_files_written_since_the_start(
    tmp_path: Path,
) -> None:
    """vLLM's caches as a second start leaves them: what the first compiled is older than
    the start; b12x's manifests, locks and staging files are no kernel, nor Inductor's
    pickled FX graphs, nor the Triton kernel's JSON metadata."""
    start = time.time()
    written = {
        "b12x/3f/3f9a.o": True,
        "b12x/3f/3f9a.json": False,
        "b12x/3f/3f9a.lock": False,
        "b12x/3f/.3f9a.o.x1.tmp": False,
        "b12x/00/00aa.o": None,
        "tc/torch_aot_compile/h/inductor_cache/xy/cxyabc.py": True,
        "tc/torch_aot_compile/h/inductor_cache/fxgraph/ab/fab": False,
        "tc/torch_aot_compile/h/rank_0_0/model": False,
        "triton/Q2HX/_topk_kernel.cubin": True,
        "triton/Q2HX/_topk_kernel.json": False,
        "triton/Q2HX/__triton_launcher.so": True,
        "dg/cache/kernel.mqa.77/kernel.cubin": True,
        "dg/cache/kernel.mqa.77/kernel.cu": False,
        "dg/cache/kernel.old.11/kernel.cubin": None,
    }  # fmt: skip  (True: written this start, False: written but no kernel, None: earlier)
    for relative, now in written.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        if now is None:
            os.utime(path, (start - 3600,) * 2)
    folders = {"b12x": "b12x", "torch_compile": "tc", "triton": "triton", "deep_gemm": "dg"}
    listed = {
        cache.key: [str(tmp_path / folders[cache.key]), list(cache.suffixes)]
        for cache in VLLM.jit_caches
    }
    answer = subprocess.run(
        [sys.executable, "-c", runtime_jit._LIST_NEWER, json.dumps(listed), repr(start - 1.0)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = {key: sorted(files) for key, files in json.loads(answer.stdout).items()}
    assert found == {
        "b12x": ["3f/3f9a.o"],
        "torch_compile": ["torch_aot_compile/h/inductor_cache/xy/cxyabc.py"],
        "triton": ["Q2HX/__triton_launcher.so", "Q2HX/_topk_kernel.cubin"],
        "deep_gemm": ["cache/kernel.mqa.77/kernel.cubin"],
    }


def test_the_report_lists_the_engine_s_caches_in_its_order() -> None:
    compiled = runtime_jit.RuntimeCompiles(
        VLLM.jit_caches, {"b12x": ["3f9a", "00aa"], "triton": ["_topk_kernel"]}
    )
    assert compiled.to_json() == {
        "b12x": ["3f9a", "00aa"], "torch_compile": [], "triton": ["_topk_kernel"],
        "deep_gemm": [],
    }  # fmt: skip
    assert compiled.summary() == (
        "other JIT kernels compiled at start-up: b12x 2, torch.compile 0, Triton 1, DeepGEMM 0 "
        "(00aa, 3f9a, _topk_kernel)"
    )
    assert compiled.total == 3
    unread = runtime_jit.RuntimeCompiles(SGLANG.jit_caches, None, "container exited")
    assert unread.to_json() == {"deep_gemm": None, "sglang_jit": None, "triton": None}
    assert unread.summary() == "other JIT kernels compiled at start-up: not read (container exited)"
