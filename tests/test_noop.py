"""The no-op record (builder/noop.py) without an engine: which command lines are replayed at
all, and that every kind of change to a watched file sends the next run the full way. The
replay itself, against the real engine, is in tests/test_image.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from builder import noop


@pytest.mark.parametrize(
    "argv",
    [
        ["image", "--push", "registry.example/x"],
        ["image", "--plan"],
        ["image", "--save-context", "ctx"],
        ["image", "--publish-index", "https://index.example/"],
        ["image", "--help"],
        ["wheels", "--json"],
        ["-q", "verify", "x"],
        [],
    ],
)
def test_only_a_plain_image_build_is_ever_replayed(argv: list[str]) -> None:
    assert noop._split(argv) is None


def test_global_flags_before_the_command_are_read() -> None:
    assert noop._split(["-q", "image", "--json"]) == (True, ["--json"])
    assert noop._split(["-v", "image"]) == (False, [])


def _inputs(root: Path, argv: tuple[str, ...] = ("image", "--json")) -> noop.Inputs:
    for name in ("images/sm120/profiles.toml", "forks/sglang/patches/sm120/0001-a.patch"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x = 1\n")
    inputs = noop.watch(list(argv), root)
    assert inputs is not None
    return inputs


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "forks/sglang/patches/sm120/0002-new.patch").write_text("new"),
        lambda root: (root / "forks/sglang/patches/sm120/0001-a.patch").unlink(),
        lambda root: (root / "images/sm120/profiles.toml").write_text("x = 2\n"),  # same size
        lambda root: os.utime(root / "images/sm120/profiles.toml", ns=(0, 10**9)),
        lambda root: (root / "images/sm120/profiles.toml").rename(root / "images/sm120/p.toml"),
    ],
    ids=["added", "removed", "rewritten", "touched", "renamed"],
)
def test_every_change_to_a_watched_file_is_seen(tmp_path: Path, change) -> None:
    inputs = _inputs(tmp_path)
    assert noop._snapshot(inputs.trees, inputs.files) == inputs.snapshot
    change(tmp_path)
    assert noop._snapshot(inputs.trees, inputs.files) != inputs.snapshot


def _saved(tmp_path: Path, argv: list[str], monkeypatch) -> Path:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    inputs = _inputs(tmp_path / "data", tuple(argv))
    cache = tmp_path / "cache"
    manifest = tmp_path / "manifests" / "m.json"
    image = {"reference": "r:t", "skipped": False, "kernel_build": {"compiled": 1}}
    noop.save(
        inputs, cache_dir=cache, wheel_files=[], images={"r:t": "sha256:1"},
        manifest_dir=manifest.parent, manifest_tag="t", manifest={"image": image}, sbom=None,
        output_json={"image": image, "manifest": str(manifest)},
        lines=[f"manifest {manifest}"], written=manifest,
    )  # fmt: skip
    (record,) = (cache / noop.RECORDS).glob("*.json")
    return record


def test_a_record_is_written_as_the_no_op_run_would_write_it(tmp_path: Path, monkeypatch) -> None:
    record = json.loads(_saved(tmp_path, ["image", "--json"], monkeypatch).read_text())
    for image in (record["manifest"]["image"], record["output"]["json"]["image"]):
        assert image["skipped"] is True and image["kernel_build"] is None
    assert str(tmp_path / "manifests") not in json.dumps(record["output"])


def test_no_record_a_changed_file_or_an_unreachable_daemon_runs_the_full_command(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    assert noop.replay(argv) is None  # no record
    _saved(tmp_path, argv, monkeypatch)
    assert noop.replay(argv) is None  # the record matches, but no daemon answers
    (tmp_path / "data/images/sm120/profiles.toml").write_text("changed\n")
    monkeypatch.setattr(noop, "_images_unchanged", lambda record: True)
    assert noop.replay(argv) is None  # a daemon would say yes: the changed file says no
    assert not (tmp_path / "manifests").exists(), "nothing written by a refused replay"


def test_no_credential_reaches_the_record_not_even_hashed(tmp_path: Path, monkeypatch) -> None:
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "s3cret-one")
    first = _saved(tmp_path, argv, monkeypatch)
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "s3cret-two")
    assert noop._record_path(tmp_path / "cache", argv[1:]) == first  # not part of the key
    assert "s3cret" not in first.read_text()
    monkeypatch.setenv("BUILDER_TARGET", "sm90")  # a setting is
    assert noop._record_path(tmp_path / "cache", argv[1:]) != first
