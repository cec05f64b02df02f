"""sm120-vllm's launch profiles against vLLM 0.34.0's own `vllm serve` parser, read from the
pinned release wheel (PyPI's file, its sha256 checked against the pin) by
builder/upstream/vllm_parser.py: every option a profile renders exists, every value is one
the option (or, for an Enum, the server at start-up) takes, every JSON config key is a field
of its config, every tool and reasoning parser is registered. The wheel is read, not run.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from builder.spec import launch, launch_profiles
from builder.upstream import vllm_parser
from tests.conftest import REPO_ROOT
from tests.upstreams import fetch_release_file

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PIN = tomllib.loads((REPO_ROOT / "forks/vllm/pin.toml").read_text())
TARGET = REPO_ROOT / "images/sm120-vllm/target.toml"
PROFILES = list(launch_profiles.load_profiles(TARGET)[0])


@pytest.fixture(scope="module")
def vllm_source(tmp_path_factory) -> Path:
    wheel = fetch_release_file("vllm", PIN["ref"])
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == PIN["sha256"]
    root = tmp_path_factory.mktemp("vllm-0.34.0")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(
            root, [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")]
        )
    return root / "vllm"


@pytest.fixture(scope="module")
def options(vllm_source: Path) -> dict:
    return vllm_parser.serve_flags(vllm_source)


@pytest.fixture(scope="module")
def parsers(vllm_source: Path) -> dict:
    return vllm_parser.registered_parsers(vllm_source)


def _variants() -> list[tuple[str, tuple]]:
    """Each profile as written, and with its fallback params."""
    known = launch_profiles.Profiles.of(TARGET)
    found = []
    for name in PROFILES:
        found.append((name, ()))
        fallback = launch_profiles.fallback_params(known, name)
        if fallback:
            found.append((name, fallback))
    return found


@pytest.mark.parametrize(("profile", "params"), _variants())
def test_every_option_a_profile_renders_is_one_vllm_0_34_takes(
    options: dict, parsers: dict, profile: str, params: tuple
) -> None:
    recipe = launch.resolve(
        TARGET, profile, "i@sha256:" + "0" * 64, launch.Overrides(params=params)
    )
    assert vllm_parser.check_args(options, recipe.args, parsers) == []


def test_the_reader_finds_what_the_profiles_rely_on(options: dict, parsers: dict) -> None:
    assert len(options) > 300  # 327 primary options in 0.34.0, their negations beside them
    attention = options["--attention-backend"]
    assert "FLASHINFER_MLA_SPARSE_SM120" in attention.choices and attention.upper
    assert "B12X_MLA_SPARSE" not in attention.choices  # vllm #54976, not in 0.34.0
    assert attention.checked_at == "start-up"
    assert "b12x" in options["--moe-backend"].choices
    assert options["--moe-backend"].checked_at == "argparse"
    assert not options["--enable-auto-tool-choice"].takes_value
    assert "--no-enable-auto-tool-choice" in options
    assert "--disable-flashinfer-autotune" in options  # the enable/disable pair
    graphs = options["--compilation-config"].json_choices["cudagraph_mode"]
    assert {"FULL_AND_PIECEWISE", "PIECEWISE", "FULL_DECODE_ONLY"} <= set(graphs)
    assert "num_speculative_tokens" in options["--speculative-config"].json_fields
    assert options["-tp"].dest == options["--tensor-parallel-size"].dest
    assert "glm47" in parsers["--tool-call-parser"] and "glm45" in parsers["--reasoning-parser"]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["m", "--attention-backend", "B12X_MLA_SPARSE"], "--attention-backend B12X_MLA_SPARSE: refused at start-up"),
        (["m", "--speculative-algorithm", "EAGLE"], "--speculative-algorithm: not an option of vllm serve"),
        (["m", "--moe-backend", "cutlass_magic"], "--moe-backend cutlass_magic: argparse refuses"),
        (["m", "--compilation-config", '{"cudagraph_mod": "FULL"}'], "'cudagraph_mod' is not a field"),
        (["m", "--compilation-config", '{"cudagraph_mode": "SOMETIMES"}'], "cudagraph_mode='SOMETIMES' is not one of"),
        (["m", "--speculative-config", "mtp"], "--speculative-config: not JSON"),
        (["m", "--tool-call-parser", "glm99"], "--tool-call-parser glm99: no such parser registered"),
        (["m", "--kv-cache-dtype"], "--kv-cache-dtype: takes a value, none given"),
    ],
)  # fmt: skip
def test_what_vllm_0_34_would_refuse_is_said(options: dict, parsers: dict, args, problem) -> None:
    said = vllm_parser.check_args(options, args, parsers)
    assert len(said) == 1 and problem in said[0], said


def test_the_moe_backend_is_read_as_vllm_reads_it(options: dict, parsers: dict) -> None:
    """`type = lambda s: s.lower().replace("-", "_")` (engine/arg_utils.py:1872-1884)."""
    assert vllm_parser.check_args(options, ["m", "--moe-backend", "B12X"], parsers) == []
    assert vllm_parser.check_args(options, ["m", "--attention-backend", "flashinfer_mla_sparse_sm120"], parsers) == []  # fmt: skip
