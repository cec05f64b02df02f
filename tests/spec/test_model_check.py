"""What `launch` checks about a checkpoint before a start: the GLM-5.2 index-sharing pattern
and an MTP profile's draft weights, from the command line down to the one-line refusal.

The checkpoints here are stand-ins: a directory (or a Hugging Face cache snapshot) holding
only `config.json` and `model.safetensors.index.json`, the two files the check reads; no
weights (400+ GB each). Their shapes are the real checkpoints' (sources at each helper).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from builder.core.errors import BuilderError
from builder.spec import launch, model_check
from tests.conftest import REPO_ROOT, Builder

TARGET = REPO_ROOT / "images/sm120/target.toml"
IMAGE = "registry.example/ml/sglang-sm120@sha256:" + "a" * 64
GLM52_REVISION = "8a1f4a13204acf2b7ac840375efaed64c231c522"
LAYERS = 78


def glm52_indexer_types() -> list[str]:
    """GLM-5.2's `indexer_types`, one per layer: 3 full, then (3 shared, 1 full) x 18, then
    3 shared. The shape is the one the vLLM + B12X launchers' 78-letter pattern is derived
    from ("Pattern derived from the checkpoint's indexer_types": blackwell-llm-docker
    launchers/serve-glm52-v16.sh, ../shared/ANCHORS-serving.md §1.4, §4), written as the
    config writes it ("full"/"shared", as in GLM-5.x configs in the code index)."""
    return ["full"] * 3 + (["shared"] * 3 + ["full"]) * 18 + ["shared"] * 3


GLM52_PATTERN = "FFF" + "SSSF" * 18 + "SSS"


def glm_config(**changes) -> dict:
    """A GLM-5.x config.json: the fields the check reads, as the HF configs of
    lukealonso/GLM-5-NVFP4 and festr2/GLM-5-NVFP4-MTP declare them (78 layers, one MTP
    layer: ../shared/ANCHORS-serving.md §4)."""
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "num_hidden_layers": LAYERS,
        "num_nextn_predict_layers": 1,
        "first_k_dense_replace": 3,
    }
    return {**config, **changes}


def write_checkpoint(directory: Path, config: dict, layers_with_weights: range) -> Path:
    """A stand-in checkpoint: config.json and the shard index, no shard files. The index
    names what a GLM-5 checkpoint names per layer (attention, experts, norms) and, for the
    MTP layer, the NextN tensors sglang loads (eh_proj, enorm, hnorm, shared_head.norm:
    deepseek_weight_loader.py:576-581)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00090.safetensors"}
    for layer in layers_with_weights:
        names = ["self_attn.kv_a_proj_with_mqa.weight", "mlp.experts.0.down_proj.weight",
                 "input_layernorm.weight"]  # fmt: skip
        if layer == config["num_hidden_layers"]:
            names += ["eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight"]
        for name in names:
            weight_map[f"model.layers.{layer}.{name}"] = "model-00002-of-00090.safetensors"
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def _builder(root: Path) -> Builder:
    """builder on a copy of the repository's data, with a manifest for sm120 whose image
    was pushed (so `launch` gets as far as printing the recipe)."""
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, root / "data" / folder)
    manifests = root / "data/manifests/sm120"
    manifests.mkdir(parents=True)
    image = {"reference": "sglang-sm120:test", "pushed": {"reference": IMAGE}}
    (manifests / "20260101T000000Z-test.json").write_text(
        json.dumps({"schema_version": 1, "image": image})
    )
    return Builder(root / "data", root / "cache", "unused=unused", root / "wheelhouse")


# -- the index pattern ------------------------------------------------------------------


def test_the_glm52_profiles_pass_the_78_letter_pattern_of_the_checkpoint() -> None:
    assert model_check.pattern_of_indexer_types(glm52_indexer_types(), "t") == GLM52_PATTERN
    for name in ("glm52-nvfp4-tp8", "glm52-nvfp4-tp8-mtp"):
        recipe = launch.resolve(TARGET, name, IMAGE, launch.Overrides())
        assert model_check.index_topk_pattern(recipe.args, name) == GLM52_PATTERN
        assert recipe.model == "lukealonso/GLM-5.2-NVFP4"
        assert recipe.model_revision == GLM52_REVISION
        assert recipe.args[recipe.args.index("--revision") + 1] == GLM52_REVISION
        assert recipe.to_json()["model_revision"] == GLM52_REVISION


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (GLM52_PATTERN[:-1], "index_topk_pattern has 77 letters, the model has 78 layers"),
        (GLM52_PATTERN + "S", "index_topk_pattern has 79 letters, the model has 78 layers"),
        ("FFFX" + GLM52_PATTERN[4:], "letter 'X' at layer 3 is neither F"),
        ("fff" + GLM52_PATTERN[3:], "letter 'f' at layer 0 is neither F"),
        ("S" + GLM52_PATTERN[1:], "starts with S: layer 0 has no previous top-k to reuse"),
    ],
)
def test_an_ill_formed_pattern_is_refused_in_one_line(pattern: str, message: str) -> None:
    with pytest.raises(BuilderError) as refused:
        launch.resolve(
            TARGET, "glm52-nvfp4-tp8", IMAGE,
            launch.Overrides(params=(("index_topk_pattern", pattern),)),
        )  # fmt: skip
    text = str(refused.value)
    assert text.startswith("profile 'glm52-nvfp4-tp8': ") and message in text
    assert "\n" not in text


def test_a_pattern_that_is_not_what_the_checkpoint_declares_is_refused(tmp_path: Path) -> None:
    """sglang follows the checkpoint's indexer_types over any pattern, so a pattern that
    differs would not be what runs (a well-formed one: layer 6 flipped)."""
    checkpoint = write_checkpoint(
        tmp_path / "GLM-5.2", glm_config(indexer_types=glm52_indexer_types()), range(79)
    )
    flipped = GLM52_PATTERN[:6] + "S" + GLM52_PATTERN[7:]
    recipe = launch.resolve(
        TARGET, "glm52-nvfp4-tp8", IMAGE,
        launch.Overrides(model=str(checkpoint), params=(("index_topk_pattern", flipped),)),
    )  # fmt: skip
    with pytest.raises(BuilderError, match=r"differs from the checkpoint's indexer_types at "
                       r"layer 6 \(the pattern says S, the checkpoint F\)"):  # fmt: skip
        model_check.check_checkpoint(
            recipe.profile, recipe.args, recipe.model, True, recipe.model_revision, "/none"
        )
    same = launch.resolve(TARGET, "glm52-nvfp4-tp8", IMAGE, launch.Overrides(model=str(checkpoint)))
    model_check.check_checkpoint(same.profile, same.args, same.model, True, "", "/none")


def test_a_checkpoint_with_another_layer_count_or_indexer_type_is_refused(tmp_path: Path) -> None:
    short = glm_config(num_hidden_layers=77, indexer_types=glm52_indexer_types()[:77])
    with pytest.raises(BuilderError, match="has 78 letters, the model has 77 layers"):
        model_check.check_pattern_against_config(GLM52_PATTERN, short, "t")
    odd = glm_config(indexer_types=["full", "sparse", *glm52_indexer_types()[2:]])
    with pytest.raises(BuilderError, match=r"indexer_types\[1\] is 'sparse'"):
        model_check.check_pattern_against_config(GLM52_PATTERN, odd, "t")
    # A checkpoint that declares no indexer_types: sglang reads the pattern (the layer
    # count still has to match).
    model_check.check_pattern_against_config(GLM52_PATTERN, glm_config(), "t")


def test_a_bad_override_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BuilderError, match="--json-model-override-args is not JSON"):
        launch.resolve(
            TARGET, "glm5-nvfp4-tp8", IMAGE,
            launch.Overrides(extra_args=("--json-model-override-args", "{index_topk_pattern:")),
        )  # fmt: skip
    with pytest.raises(BuilderError, match="starts with S"):
        launch.resolve(
            TARGET, "glm5-nvfp4-tp8", IMAGE,
            launch.Overrides(
                extra_args=("--json-model-override-args={\"index_topk_pattern\": \"SF\"}",)
            ),
        )  # fmt: skip


# -- MTP weights, through the CLI ----------------------------------------------------------


def test_launch_refuses_an_mtp_profile_on_a_checkpoint_without_mtp_weights(
    tmp_path: Path,
) -> None:
    """lukealonso/GLM-5-NVFP4 declares num_nextn_predict_layers 1 and ships no layer-78
    tensor: refused in one line; the same config with layer-78 tensors (festr2's
    GLM-5-NVFP4-MTP) passes, and the recipe mounts it."""
    builder = _builder(tmp_path)
    without = write_checkpoint(tmp_path / "GLM-5-NVFP4", glm_config(), range(LAYERS))
    refused = builder.run("launch", "--target", "sm120", "--profile", "glm5-nvfp4-tp8-mtp",
                          "--model", str(without), check=False)  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (
        f"error: profile glm5-nvfp4-tp8-mtp: {without} has no MTP weights: config.json "
        "declares num_nextn_predict_layers 1 but model.safetensors.index.json has no "
        "model.layers.78.* tensor; use a checkpoint that ships the draft layer (e.g. "
        "festr2/GLM-5-NVFP4-MTP for GLM-5)"
    )

    with_mtp = write_checkpoint(tmp_path / "GLM-5-NVFP4-MTP", glm_config(), range(LAYERS + 1))
    passed = builder.run("launch", "--target", "sm120", "--profile", "glm5-nvfp4-tp8-mtp",
                         "--model", str(with_mtp), "--json")  # fmt: skip
    recipe = json.loads(passed.stdout)
    assert "warning" not in passed.stderr, passed.stderr
    assert recipe["args"][recipe["args"].index("--model-path") + 1] == "/models/GLM-5-NVFP4-MTP"
    assert recipe["args"][recipe["args"].index("--speculative-algorithm") + 1] == "EAGLE"
    assert recipe["model"] == str(with_mtp)

    # The plain profile runs no draft: the same checkpoint is not its business.
    plain = builder.run("launch", "--target", "sm120", "--model", str(without), "--json")
    assert "--speculative-algorithm" not in json.loads(plain.stdout)["args"]


def test_a_config_without_an_mtp_layer_is_refused(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(
        tmp_path / "dense", glm_config(num_nextn_predict_layers=0), range(LAYERS)
    )
    with pytest.raises(BuilderError, match=r"has no MTP layer \(config.json "
                       r"num_nextn_predict_layers is 0\)"):  # fmt: skip
        model_check.check_mtp_weights(checkpoint, glm_config(num_nextn_predict_layers=0), "t")


def test_the_hf_cache_snapshot_at_the_profile_s_revision_is_checked(tmp_path: Path) -> None:
    """A hub id is looked up as huggingface_hub lays out its cache (the volume the server
    mounts): refs/main names the snapshot for an unpinned profile, the pinned revision
    names it directly."""
    builder = _builder(tmp_path)
    cache = tmp_path / "hf"
    repo = cache / "hub/models--festr2--GLM-5-NVFP4-MTP"
    commit = "0123456789abcdef0123456789abcdef01234567"
    write_checkpoint(repo / "snapshots" / commit, glm_config(), range(LAYERS))
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text(commit)
    refused = builder.run("launch", "--target", "sm120", "--profile", "glm5-nvfp4-tp8-mtp",
                          "--hf-cache", str(cache), check=False)  # fmt: skip
    assert refused.returncode == 1
    assert f"{repo}/snapshots/{commit} has no MTP weights" in refused.stderr

    glm52 = cache / "hub/models--lukealonso--GLM-5.2-NVFP4/snapshots" / GLM52_REVISION
    write_checkpoint(glm52, glm_config(indexer_types=glm52_indexer_types()), range(LAYERS + 1))
    passed = builder.run("launch", "--target", "sm120", "--profile", "glm52-nvfp4-tp8-mtp",
                         "--hf-cache", str(cache), "--json")  # fmt: skip
    assert "warning" not in passed.stderr, passed.stderr
    assert json.loads(passed.stdout)["model_revision"] == GLM52_REVISION


def test_a_checkpoint_not_on_this_machine_is_one_warning_line(tmp_path: Path) -> None:
    builder = _builder(tmp_path)
    result = builder.run("launch", "--target", "sm120", "--profile", "glm52-nvfp4-tp8-mtp",
                         "--hf-cache", str(tmp_path / "empty"), "--json")  # fmt: skip
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, result.stderr
    assert (
        "profile glm52-nvfp4-tp8-mtp: MTP weights and index_topk_pattern not checked: "
        "lukealonso/GLM-5.2-NVFP4 is not on this machine (not in --hf-cache"
    ) in warnings[0]


# -- speculative settings sglang would change ------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ((("speculative_num_draft_tokens", "6"),), "makes it steps + 1 = 4"),
        ((("speculative_eagle_topk", "2"),), "--speculative-eagle-topk 2 refused"),
        ((("speculative_eagle_topk", "16"),), "--speculative-eagle-topk 16 refused"),
        ((("speculative_num_steps", "0"),), "--speculative-num-steps 0: not a whole number"),
    ],
)
def test_speculative_settings_sglang_would_change_are_refused(params, message) -> None:
    with pytest.raises(BuilderError, match=re.escape(message)):
        launch.resolve(TARGET, "glm5-nvfp4-tp8-mtp", IMAGE, launch.Overrides(params=params))
    steps = (("speculative_num_steps", "2"), ("speculative_num_draft_tokens", "3"))
    recipe = launch.resolve(TARGET, "glm5-nvfp4-tp8-mtp", IMAGE, launch.Overrides(params=steps))
    assert recipe.expect["speculative_num_steps"] == "2"
    assert recipe.expect["speculative_num_draft_tokens"] == "3"


def test_a_vllm_profile_s_pattern_and_mtp_layer_are_checked_as_vllm_reads_them(
    tmp_path: Path,
) -> None:
    """#57: vLLM takes the pattern in --hf-overrides and the draft from the checkpoint with
    --speculative-config method mtp; the launch checks (launch --run, the sweep) read
    those, not sglang's flags."""
    from builder.site.commands.launch_options import check_checkpoint

    vllm_target = REPO_ROOT / "images/sm120-vllm/target.toml"
    checkpoint = write_checkpoint(
        tmp_path / "GLM-5.2", glm_config(indexer_types=glm52_indexer_types()), range(79)
    )
    flipped = GLM52_PATTERN[:6] + "S" + GLM52_PATTERN[7:]
    recipe = launch.resolve(
        vllm_target, "glm52-nvfp4-tp8", IMAGE,
        launch.Overrides(model=str(checkpoint), params=(("index_topk_pattern", flipped),)),
    )  # fmt: skip
    assert model_check.index_topk_pattern(recipe.args, "t", recipe.engine) == flipped
    with pytest.raises(
        BuilderError, match="differs from the checkpoint's indexer_types at layer 6"
    ):
        check_checkpoint(recipe)
    mtp = launch.resolve(
        vllm_target, "glm52-nvfp4-tp8-mtp", IMAGE, launch.Overrides(model=str(checkpoint))
    )
    assert model_check.draft_from_checkpoint(mtp.args, mtp.engine)
    assert not model_check.draft_from_checkpoint(mtp.args)  # sglang's flags: none of them
    check_checkpoint(mtp)  # layer 78's weights are there
