"""Each target's JIT list and its launch profiles agree, both ways.

A profile setting that makes sglang load FlashInfer kernels must have its modules in the
list, or the server compiles them at start-up; a listed module no profile loads costs
compile time for nothing. The settings are what each profile's readiness check reads back
from /server_info, and the profile's arguments must ask for them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from builder.spec import launch, launch_profiles
from builder.spec.engines import vllm
from builder.spec.jit import jit_list, packs
from builder.spec.target import available_targets, load_target
from tests.conftest import REPO_ROOT


def _data_copy(tmp_path: Path) -> Path:
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder)
    return tmp_path


@pytest.mark.parametrize("target_name", available_targets(REPO_ROOT))
def test_the_list_and_the_profiles_agree(target_name: str) -> None:
    target = load_target(REPO_ROOT, target_name)
    assert jit_list.disagreements(target) == []
    assert all(module.call_site for module in target.jit)


@pytest.mark.parametrize("target_name", available_targets(REPO_ROOT))
def test_profiles_ask_for_what_they_expect(target_name: str) -> None:
    target = load_target(REPO_ROOT, target_name)
    known = launch_profiles.Profiles.of(target.file)
    for name in known.profiles:
        recipe = launch.resolve(known, name, "i@sha256:" + "0" * 64, launch.Overrides())
        args = recipe.args
        if target.engine == "vllm":  # expect holds what /v1/models and the log read back
            asked = vllm.ENGINE.asked(args)
            for key, value in recipe.expect.items():
                assert asked.get(key) == str(value), f"{name}: expects {key}={value}"
            continue
        chosen_by_sglang = launch_profiles.flattened(known, name).get("chosen_by_sglang", [])
        for key, value in recipe.expect.items():
            flag = "--" + key.replace("_", "-")
            if key == "tp_size":
                flag = "--tp" if "--tp" in args else "--tp-size"
            if key in chosen_by_sglang:
                assert flag not in args, f"{name}: {key} is left to sglang, yet {flag} is passed"
                continue
            assert flag in args, f"{name}: expects {key} but does not pass {flag}"
            if not isinstance(value, bool):
                assert args[args.index(flag) + 1] == str(value), f"{name}: {flag}"


def test_sm120_lists_the_sparse_attention_path_not_dense_mla() -> None:
    generators = "\n".join(load_target(REPO_ROOT, "sm120").jit_modules)
    for needed in (
        "gen_sparse_mla_sm120_module",  # DSA with FP8 KV on SM120
        "gen_cutlass_fused_moe_sm120_module",
        "gen_fp4_quantization_sm120f_module",  # 120f: FlashInfer 0.7.2 on CUDA >= 12.9
        "gen_pcie_ipc_comm_module",
    ):
        assert needed in generators
    assert "gen_batch_mla_module" not in generators  # dense MLA is the 0.5.9 workaround


def test_sm120_0_5_9_lists_the_glm5_modules_with_the_model_shapes() -> None:
    generators = "\n".join(load_target(REPO_ROOT, "sm120-0.5.9").jit_modules)
    for needed in (
        "gen_cutlass_fused_moe_sm120_module",
        "gen_trtllm_comm_module",
        "gen_gemm_sm120_module_cutlass_fp4",
        "gen_fp4_quantization_sm120_module",
    ):
        assert needed in generators
    # GLM-5: kv_lora_rank 512, qk_rope 64; ragged prefill head dims 192 + 64 = 256, v 256.
    assert "gen_batch_mla_module('fa2', torch.bfloat16, torch.bfloat16" in generators
    assert ", 512, 64, False)" in generators
    assert "gen_batch_prefill_module('fa2'" in generators and ", 256, 256, " in generators


def test_a_flashinfer_setting_without_its_module_is_named(tmp_path: Path) -> None:
    data = _data_copy(tmp_path)
    toml = data / "images/sm120-0.5.9/target.toml"
    toml.write_text(
        toml.read_text().replace(
            'loaded_when = "attention_backend=flashinfer"',
            'loaded_when = "quantization=modelopt_fp4"',
        )
    )
    problems = jit_list.disagreements(load_target(data, "sm120-0.5.9"))
    assert (
        "profile glm5-nvfp4-tp8: attention_backend=flashinfer loads FlashInfer, no module "
        "listed" in problems
    )


def test_a_module_no_profile_loads_is_named(tmp_path: Path) -> None:
    data = _data_copy(tmp_path)
    profiles = data / "images/sm120-0.5.9/profiles.toml"
    text = profiles.read_text()
    fusion = text.index("[profiles.glm5-nvfp4-tp8-fusion]")
    profiles.write_text(text[:fusion])
    problems = jit_list.disagreements(load_target(data, "sm120-0.5.9"))
    assert problems == [
        "flashinfer.jit.comm:gen_trtllm_comm_module: no profile has "
        "enable_flashinfer_allreduce_fusion=true"
    ]


def test_a_renamed_kernel_pack_is_refused(tmp_path: Path, capsys) -> None:
    """`builder image` keys packs on their names, which stand for their content: a renamed
    one is named and moved aside, never used (and never fails a later build)."""
    module = packs.CompiledModule("0.6.3+sm120.gabc", "120a", "norm", "/unused")
    pack = packs.write_pack([module], {}, tmp_path, "test")
    assert packs.packs_for(tmp_path, "0.6.3+sm120.gabc", ("12.0a",)) == [pack]
    assert packs.packs_for(tmp_path, "0.6.3+sm120.gother", ("12.0a",)) == []
    renamed = tmp_path / "flashinfer-0.6.3+sm120.gabc-120a-000000000000.kernel-pack.json"
    pack.rename(renamed)
    assert packs.packs_for(tmp_path, "0.6.3+sm120.gabc", ("12.0a",)) == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{renamed}: its name does not match its content" in line
    assert f"moved aside to {renamed.name}.rejected" in line
    assert not renamed.exists() and (tmp_path / f"{renamed.name}.rejected").is_file()
    assert packs.packs_for(tmp_path, "0.6.3+sm120.gabc", ("12.0a",)) == []
    assert capsys.readouterr().err == ""


MTP_PROFILES = ("glm5-nvfp4-tp8-mtp", "glm5-nvfp4-tp8-pcie-ar-mtp", "glm52-nvfp4-tp8-mtp")


def test_each_profile_s_modules_cover_its_draft_and_verify() -> None:
    """MTP loads no FlashInfer module of its own on SM120: the draft's BF16 experts run in
    fused_moe_120, its attention in sparse_mla_sm120, the verify's renormalisation in
    sampling. `jit list` shows each profile's modules."""
    by_profile = jit_list.modules_by_profile(load_target(REPO_ROOT, "sm120"))
    plain = set(by_profile["glm5-nvfp4-tp8"])
    assert len(plain) == 5
    for name in MTP_PROFILES:
        assert plain <= set(by_profile[name]), name
    assert set(by_profile["glm5-nvfp4-tp8-pcie-ar-mtp"]) - plain == {
        "flashinfer.jit.comm:gen_pcie_ipc_comm_module"
    }
    assert by_profile["glm52-nvfp4-tp8-mtp"] == by_profile["glm52-nvfp4-tp8"]


def test_a_draft_moe_setting_without_its_module_is_named_per_profile(tmp_path: Path) -> None:
    """The draft's MoE runner is chosen by sglang (the target's) and read back as
    speculative_moe_runner_backend: a list that drops it fails for every MTP profile."""
    data = _data_copy(tmp_path)
    toml = data / "images/sm120/target.toml"
    text = toml.read_text()
    toml.write_text(text.replace(" | speculative_moe_runner_backend=flashinfer_cutlass", ""))
    problems = jit_list.disagreements(load_target(data, "sm120"))
    assert problems == [
        f"profile {name}: speculative_moe_runner_backend=flashinfer_cutlass loads FlashInfer, "
        "no module listed"
        for name in MTP_PROFILES
    ]


def test_jit_list_prints_the_modules_of_each_profile(tmp_path: Path) -> None:
    from tests.conftest import Builder

    data = _data_copy(tmp_path)
    builder = Builder(data, tmp_path / "cache", "unused=unused", tmp_path / "wheelhouse")
    listed = json.loads(builder.run("jit list", "--target", "sm120", "--json").stdout)
    assert listed["disagreements"] == []
    assert set(listed["profiles"]) == set(
        launch_profiles.load_profiles(data / "images/sm120/target.toml")[0]
    )
    assert (
        "flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module"
        in (listed["profiles"]["glm5-nvfp4-tp8-mtp"])
    )
    text = builder.run("jit list", "--target", "sm120").stdout
    assert "profile glm52-nvfp4-tp8-mtp: 5 module(s): gen_sparse_mla_sm120_module, " in text
