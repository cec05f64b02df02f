"""Rails that keep labels and manifests honest: no secrets in build args, no dirty pushes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.build.provenance import refuse_dirty_push, uncommitted_data
from builder.core.errors import BuilderError
from tests.conftest import REPO_ROOT, Builder


def test_index_url_with_credentials_is_refused_before_any_build(builder: Builder) -> None:
    result = builder.run(
        "image", "--pip-index-url", "https://ci:t0ken-xyz@pypi.internal/simple", check=False,
        env={"DOCKER_HOST": "unix:///nonexistent.sock"},
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        "--pip-index-url https://pypi.internal/simple: the URL carries credentials" in result.stderr
    )
    assert "t0ken-xyz" not in result.stderr


def test_push_from_uncommitted_project_data_is_refused(builder: Builder) -> None:
    git = ["git", "-C", str(builder.data_dir), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "data"], check=True)
    assert uncommitted_data(builder.data_dir) == []
    refuse_dirty_push(builder.data_dir, allow_dirty=False)

    pin = builder.data_dir / "forks/sglang/pin.toml"
    pin.write_text(pin.read_text() + "\n# local experiment\n")
    assert uncommitted_data(builder.data_dir) == ["forks/sglang/pin.toml"]
    with pytest.raises(
        BuilderError, match=r"refusing to push: uncommitted changes in forks/sglang/pin\.toml"
    ):
        refuse_dirty_push(builder.data_dir, allow_dirty=False)
    refuse_dirty_push(builder.data_dir, allow_dirty=True)

    result = builder.run("image", "--push", "127.0.0.1:5000/x", check=False)
    assert result.returncode == 1 and "refusing to push" in result.stderr


def _code_keys(package_root, *modules: str) -> dict[str, str]:
    script = (
        "import json, sys; from builder.core.identity import code_key; "
        "print(json.dumps({m: code_key(m) for m in sys.argv[1:]}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *modules],
        env={"PYTHONPATH": str(package_root), "PATH": "/usr/bin:/bin"},
        cwd=package_root, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(result.stdout)


def test_cache_keys_follow_the_builder_code_that_shapes_each_artifact(tmp_path: Path) -> None:
    """An edit to wheels.py changes the wheels' key (a stale wheel is never reused) and
    leaves the image's key alone; a copy of the same code gives the same keys."""
    copy = tmp_path / "pkg"
    shutil.copytree(
        REPO_ROOT / "builder", copy / "builder", ignore=shutil.ignore_patterns("__pycache__")
    )
    before = _code_keys(copy, "build/wheels", "build/image")
    assert before == _code_keys(REPO_ROOT, "build/wheels", "build/image")
    with (copy / "builder/build/wheels.py").open("a") as module:
        module.write("\n# a change to how wheels are built\n")
    after = _code_keys(copy, "build/wheels", "build/image")
    assert after["build/wheels"] != before["build/wheels"]
    assert after["build/image"] == before["build/image"]
