"""Targets are data: one target extends another instead of copying it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from builder.core.errors import BuilderError
from builder.spec.target import load_target
from tests.conftest import REPO_ROOT


def test_sm90_extends_sm120_and_changes_only_what_it_names() -> None:
    sm120, sm90 = load_target(REPO_ROOT, "sm120"), load_target(REPO_ROOT, "sm90")
    assert sm90.arch_list == ("9.0a",) and sm90.local_label == "sm90"
    assert sm90.image.repository == "sglang-sm90"
    assert sm90.image.dockerfile == sm120.image.dockerfile  # sm120's own, resolved there
    assert sm90.image.requirements == sm120.image.requirements
    assert sm90.image.base == sm120.image.base and sm90.cuda_version == sm120.cuda_version
    assert sm90.upstreams.keys() == sm120.upstreams.keys()
    assert sm90.jit_modules == ("flashinfer.jit.comm:gen_trtllm_comm_module",)
    assert sm90.file.parent.name == "sm90"  # its own profiles


def _copy(tmp_path: Path) -> Path:
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder)
    return tmp_path


def test_a_local_label_is_never_inherited(tmp_path: Path) -> None:
    data = _copy(tmp_path)
    toml = data / "images/sm90/target.toml"
    toml.write_text(toml.read_text().replace('local_label = "sm90"\n', ""))
    assert load_target(data, "sm90").local_label == "sm90"


@pytest.mark.parametrize(
    ("extends", "message"),
    [
        ('"sm90"', "extends 'sm90', which extends it back"),
        ('"sm999"', "unknown target 'sm999' (extended by sm90)"),
        ("3", "field 'extends' must be a target name"),
    ],
)
def test_a_bad_extends_is_one_line_naming_the_file(tmp_path: Path, extends, message) -> None:
    data = _copy(tmp_path)
    toml = data / "images/sm90/target.toml"
    toml.write_text(toml.read_text().replace('extends = "sm120"', f"extends = {extends}"))
    with pytest.raises(BuilderError, match=re.escape(message)):
        load_target(data, "sm90")


@pytest.mark.parametrize("path", ["/some/dir", "../outside", "build/../../x"])
def test_a_clean_path_outside_the_source_export_is_refused(tmp_path: Path, path: str) -> None:
    """pin.toml build.clean deletes folders of the export: never anything outside it."""
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder)
    pin = tmp_path / "forks/flashinfer/pin.toml"
    pin.write_text(pin.read_text().replace('clean = ["build",', f'clean = ["{path}", "build",'))
    with pytest.raises(BuilderError, match=rf"field 'build.clean' is '{re.escape(path)}'"):
        load_target(tmp_path, "sm120")


def test_sm120_vllm_serves_with_vllm_and_takes_sm120s_shared_image_files() -> None:
    from builder.build.image_plan import recipe_files

    target = load_target(REPO_ROOT, "sm120-vllm")
    assert target.engine == "vllm" and load_target(REPO_ROOT, "sm120").engine == "sglang"
    assert target.upstreams["vllm"].fork.release.stable_abi  # cp38-abi3, installed on 3.12
    files = {p.name: p.parent.name for p in recipe_files(target)}
    assert files["entrypoint.py"] == "sm120-vllm"  # its own: `vllm serve`
    assert files["jit_warmup.py"] == files["healthcheck.py"] == "sm120"  # one copy each
    assert "profiles.toml" not in files and "target.toml" not in files


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('engine = "vllm"', 'engine = "tgi"', "field 'engine' is 'tgi', expected one of sglang, vllm"),
        ('engine = "vllm"', 'engine = "sglang"', "field 'engine' is 'sglang', but [upstreams] has no 'sglang'"),
        ('python = "3.12"', 'python = "3.7"', "a cp38 wheel, but the image runs Python 3.7"),
        ('"../sm120/healthcheck.py"]', '"../sm120/nothing.py"]', "names ../sm120/nothing.py, which is no file"),
        ('"../sm120/healthcheck.py"]', '"../sm120/entrypoint.py"]', "names entrypoint.py, which"),
    ],
)  # fmt: skip
def test_a_bad_engine_python_or_context_file_is_one_line(tmp_path: Path, old, new, message) -> None:
    from builder.build.image_plan import recipe_files

    data = _copy(tmp_path)
    toml = data / "images/sm120-vllm/target.toml"
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, new))
    with pytest.raises(BuilderError, match=re.escape(message)):
        recipe_files(load_target(data, "sm120-vllm"))
