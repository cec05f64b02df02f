"""Rails that keep labels and manifests honest: no secrets in build args, no dirty pushes."""

from __future__ import annotations

import subprocess

import pytest

from builder.errors import BuilderError
from builder.provenance import refuse_dirty_push, uncommitted_data
from tests.conftest import Builder


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
