"""What `launch` checks about a checkpoint before a server starts on it.

Two things sglang 0.5.23 would get wrong without a word (file:line in its `sglang` package):

- The DSA index-sharing pattern. A GLM-5.x layer either computes its own top-k ("F", full)
  or reuses the previous layer's ("S", shared): `dsa_layer_skips_topk` reads the checkpoint's
  `indexer_types` first ("shared" skips) and only without it `index_topk_pattern`, where "S"
  skips (srt/configs/model_config.py:488-508). A pattern shorter than the model leaves the
  layers past its end computing their own top-k, with no error.
- The MTP draft layer. With EAGLE/NEXTN and no draft path, sglang loads the draft from the
  target checkpoint (srt/arg_groups/speculative_hook.py:1120-1147), as layer
  `model.layers.{num_hidden_layers}` (srt/models/deepseek_common/deepseek_weight_loader.py:
  563-580); a checkpoint that declares the layer but ships no tensors for it would load a
  draft with no trained weights.

The pattern is checked from the command line alone; the rest needs the checkpoint's
`config.json` and `model.safetensors.index.json`, read when the model is on this machine (a
local directory, or a Hugging Face cache snapshot under --hf-cache).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from builder.core import progress
from builder.core.errors import BuilderError
from builder.spec import engines
from builder.spec.engines import flag_value

PATTERN_KEY = "index_topk_pattern"
FULL, SHARED = "F", "S"
# The real GLM-5.2 configs write `indexer_types` as "full"/"shared" per layer; the pattern's
# letters are their initials (the 78-letter pattern the vLLM launchers pass is derived from
# that list: ../shared/ANCHORS-serving.md §1.4, §4).
_LETTER_OF_INDEXER_TYPE = {"full": FULL, "shared": SHARED}
_REVISION_SHA = re.compile(r"[0-9a-f]{40}")


def index_topk_pattern(
    args: tuple[str, ...] | list[str], where: str, engine: str = engines.DEFAULT
) -> str | None:
    """The pattern the command line hands the engine in its config-override flag
    (sglang's --json-model-override-args, vLLM's --hf-overrides), if any."""
    flag = engines.engine(engine).model_override_flag
    raw = flag_value(args, flag)
    if raw is None:
        return None
    try:
        overrides = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BuilderError(f"{where}: {flag} is not JSON ({exc.msg})") from None
    if not isinstance(overrides, dict):
        raise BuilderError(f"{where}: {flag} must be a JSON object")
    pattern = overrides.get(PATTERN_KEY)
    if pattern is not None and not isinstance(pattern, str):
        raise BuilderError(f"{where}: {PATTERN_KEY} must be a string of {FULL}/{SHARED}")
    return pattern


def check_pattern(pattern: str, layers: int | None, where: str) -> None:
    """One letter per layer, F or S, the first F. `layers`: the model's layer count."""
    if layers is not None and len(pattern) != layers:
        raise BuilderError(
            f"{where}: {PATTERN_KEY} has {len(pattern)} letters, the model has {layers} layers "
            f"(a short pattern leaves the layers past its end computing their own top-k)"
        )
    for layer, letter in enumerate(pattern):
        if letter not in (FULL, SHARED):
            raise BuilderError(
                f"{where}: {PATTERN_KEY} letter {letter!r} at layer {layer} is neither {FULL} "
                f"(the layer computes its top-k) nor {SHARED} (it reuses the previous layer's)"
            )
    if pattern.startswith(SHARED):
        raise BuilderError(
            f"{where}: {PATTERN_KEY} starts with {SHARED}: layer 0 has no previous top-k to reuse"
        )


def pattern_of_indexer_types(indexer_types: Any, where: str) -> str:
    """`indexer_types` as the pattern sglang follows (`shared` skips: model_config.py:492-496)."""
    if not isinstance(indexer_types, list):
        raise BuilderError(f"{where}: indexer_types must be a list of 'full'/'shared'")
    letters = []
    for layer, kind in enumerate(indexer_types):
        if kind not in _LETTER_OF_INDEXER_TYPE:
            raise BuilderError(
                f"{where}: indexer_types[{layer}] is {kind!r}, not 'full' or 'shared'"
            )
        letters.append(_LETTER_OF_INDEXER_TYPE[kind])
    return "".join(letters)


def check_pattern_against_config(pattern: str, config: dict, where: str) -> None:
    """The pattern fits the checkpoint: its layer count and, where it declares them, its
    `indexer_types`, which sglang (model_config.py:492-496) and vLLM
    (model_executor/models/utils.py:1026-1042) follow over any pattern."""
    layers = config.get("num_hidden_layers")
    check_pattern(pattern, layers if isinstance(layers, int) else None, where)
    if "indexer_types" not in config:
        return
    declared = pattern_of_indexer_types(config["indexer_types"], where)
    if declared != pattern:
        layer = next(
            (i for i, (a, b) in enumerate(zip(pattern, declared, strict=False)) if a != b),
            min(len(pattern), len(declared)),
        )
        ours, theirs = pattern[layer : layer + 1] or "none", declared[layer : layer + 1] or "none"
        raise BuilderError(
            f"{where}: {PATTERN_KEY} differs from the checkpoint's indexer_types at layer "
            f"{layer} (the pattern says {ours}, the checkpoint {theirs}); sglang and vLLM follow "
            "indexer_types, so the pattern would not be what runs"
        )


def draft_from_checkpoint(args: tuple[str, ...] | list[str], engine: str = engines.DEFAULT) -> bool:
    """Speculative decoding whose draft layers are the checkpoint's own (MTP)."""
    return engines.engine(engine).draft_from_checkpoint(args)


def check_speculative_settings(args: tuple[str, ...] | list[str], where: str) -> None:
    """Speculative settings sglang would change without a word, so that the readiness
    check (which expects what the command line says) would fail on a healthy server."""
    counts = {}
    for flag in ("--speculative-num-steps", "--speculative-eagle-topk",
                 "--speculative-num-draft-tokens"):  # fmt: skip
        value = flag_value(args, flag)
        if value is None:
            continue
        if not (value.isdigit() and int(value) > 0):
            raise BuilderError(f"{where}: {flag} {value}: not a whole number above 0")
        counts[flag] = int(value)
    steps = counts.get("--speculative-num-steps")
    drafts = counts.get("--speculative-num-draft-tokens")
    one_chain = counts.get("--speculative-eagle-topk") == 1
    if one_chain and steps is not None and drafts is not None and drafts != steps + 1:
        raise BuilderError(
            f"{where}: --speculative-num-draft-tokens {drafts} with --speculative-eagle-topk 1:"
            f" sglang 0.5.23 makes it steps + 1 = {steps + 1} "
            "(srt/arg_groups/speculative_hook.py:1255-1266); set that"
        )


_REVISION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,200}")


def _hub_snapshot(model: str, revision: str, hf_cache: str) -> tuple[Path | None, str]:
    """A hub model's snapshot directory in the Hugging Face cache, or why there is none.
    The cache layout is huggingface_hub's: hub/models--ORG--NAME/{refs/BRANCH,snapshots/SHA}."""
    repo = Path(hf_cache).expanduser() / "hub" / ("models--" + model.replace("/", "--"))
    revision = revision or "main"
    if not _REVISION_NAME.fullmatch(revision) or ".." in revision.split("/"):
        return None, f"revision {revision!r} is not a commit or branch name"
    commit = revision
    if not _REVISION_SHA.fullmatch(revision):
        ref = repo / "refs" / revision
        try:
            commit = ref.read_text().strip()
        except OSError:
            return None, f"not in --hf-cache {hf_cache} (no {ref})"
    snapshot = repo / "snapshots" / commit
    if not (snapshot / "config.json").is_file():
        return None, f"not in --hf-cache {hf_cache} at revision {revision} (no {snapshot})"
    return snapshot, ""


def _read_json(path: Path, where: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise BuilderError(f"{where}: cannot read {path} ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BuilderError(f"{where}: {path} is not JSON") from None
    if not isinstance(data, dict):
        raise BuilderError(f"{where}: {path} is not a JSON object")
    return data


def check_mtp_weights(checkpoint: Path, config: dict, where: str) -> str:
    """Refuses a checkpoint without the MTP draft layer's tensors; '' when it has them, or
    why they could not be looked for."""
    layers = config.get("num_hidden_layers")
    declared = config.get("num_nextn_predict_layers", 0)
    if not isinstance(layers, int) or isinstance(layers, bool):
        raise BuilderError(f"{where}: {checkpoint}/config.json has no num_hidden_layers")
    if not isinstance(declared, int) or declared < 1:
        raise BuilderError(
            f"{where}: {checkpoint} has no MTP layer (config.json num_nextn_predict_layers is "
            f"{declared!r}); an MTP profile needs a checkpoint that ships one"
        )
    index = checkpoint / "model.safetensors.index.json"
    if not index.is_file():
        return f"{index.name} is not in {checkpoint}"
    weight_map = _read_json(index, where).get("weight_map")
    if not isinstance(weight_map, dict):
        raise BuilderError(f"{where}: {index} has no weight_map")
    # sglang loads the draft as model.layers.{num_hidden_layers} (deepseek_weight_loader.py:570-576)
    prefix = f"model.layers.{layers}."
    if not any(name.startswith(prefix) for name in weight_map):
        raise BuilderError(
            f"{where}: {checkpoint} has no MTP weights: config.json declares "
            f"num_nextn_predict_layers {declared} but {index.name} has no {prefix}* tensor; use "
            "a checkpoint that ships the draft layer (e.g. festr2/GLM-5-NVFP4-MTP for GLM-5)"
        )
    return ""


def check_checkpoint(
    profile: str,
    args: tuple[str, ...],
    model: str,
    local: bool,
    revision: str,
    hf_cache: str,
    engine: str = engines.DEFAULT,
) -> None:
    """Before a launch: the checkpoint behind `model` (a `local` directory, or a hub id found
    in `hf_cache` at `revision`) against what the command line asks of it. Refuses in one
    line; when the checkpoint is not on this machine, says in one warning line what was not
    checked."""
    where = f"profile {profile}"
    pattern = index_topk_pattern(args, where, engine)
    needs_mtp = draft_from_checkpoint(args, engine)
    if pattern is None and not needs_mtp:
        return
    wanted = " and ".join(
        what for what, asked in (("MTP weights", needs_mtp), (PATTERN_KEY, pattern)) if asked
    )
    if local:
        checkpoint: Path | None = Path(model).expanduser()
        reason = "" if (checkpoint / "config.json").is_file() else f"no {checkpoint}/config.json"
        if reason:
            checkpoint = None
    else:
        checkpoint, reason = _hub_snapshot(model, revision, hf_cache)
    if checkpoint is None:
        progress.warn(
            f"{where}: {wanted} not checked: {model} is not on this machine ({reason}); "
            f"{engine} reads it where the server runs"
        )
        return
    config = _read_json(checkpoint / "config.json", where)
    if pattern is not None:
        check_pattern_against_config(pattern, config, f"{where} ({checkpoint})")
    if needs_mtp:
        missing = check_mtp_weights(checkpoint, config, where)
        if missing:
            progress.warn(f"{where}: MTP weights not checked: {missing}")
