"""The no-op record (builder/build/noop.py) without an engine: which command lines are replayed at
all, and that every kind of change to a watched file sends the next run the full way. The
replay itself, against the real engine, is in tests/build/test_image.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from builder.build import noop


@pytest.fixture(autouse=True)
def _unix_daemon(monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")


@pytest.mark.parametrize(
    "argv",
    [
        ["image", "--push", "registry.example/x"],
        ["image", "--pus", "registry.example/x"],  # argparse takes a unique prefix
        ["image", "--sav", "ctx"],
        ["image", "--js"],
        ["image", "--index-simple", "https://index.example/simple/"],  # hidden alias
        ["image", "stray"],
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


def test_global_flags_before_or_after_the_command_are_read() -> None:
    assert noop._split(["-q", "image", "--json"]) == (True, ["--json"])
    assert noop._split(["-v", "image"]) == (False, [])
    # After the command, as argparse takes them: read, and left out of the record's key.
    assert noop._split(["image", "--json", "-q"]) == (True, ["--json"])
    assert noop._split(["image", "--verbose", "--target", "sm90"]) == (False, ["--target", "sm90"])
    # --json before the command is the command's own: one record for both spellings.
    assert noop._split(["--json", "image"]) == noop._split(["image", "--json"])
    assert noop._split(["--json", "-q", "image", "-v"]) == (True, ["--json"])
    plain = ["image", "--target", "sm90", "--mirror=a=b", "--network-host", "--json"]
    assert noop._split(plain) == (False, plain[1:])


def _inputs(root: Path, argv: tuple[str, ...] = ("image", "--json")) -> noop.Inputs:
    """A data folder whose files settled a while ago (a just-written input is never
    recorded: see test_an_input_written_just_before_the_build_leaves_no_record)."""
    for name in ("images/sm120/profiles.toml", "forks/sglang/patches/sm120/0001-a.patch"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x = 1\n")
    past = time.time_ns() - 60 * 10**9
    for path in [root, *root.rglob("*")]:
        os.utime(path, ns=(past, past))
    inputs = noop.watch(list(argv), root, "--json" in argv)
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


def _saved(tmp_path: Path, argv: list[str]) -> Path:
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
    record = json.loads(_saved(tmp_path, ["image", "--json"]).read_text())
    for image in (record["manifest"]["image"], record["output"]["json"]["image"]):
        assert image["skipped"] is True and image["kernel_build"] is None
    assert str(tmp_path / "manifests") not in json.dumps(record["output"])


def test_no_record_a_changed_file_or_an_unreachable_daemon_runs_the_full_command(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    assert noop.replay(argv) is None  # no record
    _saved(tmp_path, argv)
    assert noop.replay(argv) is None  # the record matches, but no daemon answers
    (tmp_path / "data/images/sm120/profiles.toml").write_text("changed\n")
    monkeypatch.setattr(noop, "_images_unchanged", lambda record: True)
    assert noop.replay(argv) is None  # a daemon would say yes: the changed file says no
    assert not (tmp_path / "manifests").exists(), "nothing written by a refused replay"


def test_no_credential_reaches_the_record_not_even_hashed(tmp_path: Path, monkeypatch) -> None:
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "s3cret-one")
    first = _saved(tmp_path, argv)
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "s3cret-two")
    assert noop._record_path(tmp_path / "cache", argv[1:]) == first  # not part of the key
    monkeypatch.setenv("BUILDER_TARGET", "sm90")  # a setting is
    assert noop._record_path(tmp_path / "cache", argv[1:]) != first


def test_a_matching_record_writes_the_no_op_manifest_and_output(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The answer itself (the daemon's side is the engine test's, tests/build/test_image.py)."""
    monkeypatch.chdir(tmp_path)
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    _saved(tmp_path, argv)
    monkeypatch.setattr(noop, "_images_unchanged", lambda record: True)  # no daemon here
    assert noop.replay(argv) == 0
    output = json.loads(capsys.readouterr().out)
    (written,) = (tmp_path / "manifests").glob("2*.json")
    assert output["manifest"] == str(written)
    assert output["image"]["skipped"] is True and output["image"]["kernel_build"] is None
    manifest = json.loads(written.read_text())
    assert manifest["image"]["skipped"] is True and manifest["created"]


def test_an_input_written_just_before_the_build_leaves_no_record(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path / "data")
    (tmp_path / "data/images/sm120/profiles.toml").write_text("x = 2\n")
    fresh = noop.watch(["image", "--json"], tmp_path / "data", True)
    assert not fresh.unchanged(), "it may change again within its time stamp"
    assert inputs.unchanged() is False  # and the old snapshot no longer matches


def test_a_file_named_as_option_equals_value_is_watched(tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("torch\n")
    inputs = _inputs(tmp_path / "data", ("image", f"--runtime-requirements={requirements}"))
    assert str(requirements) in inputs.files


def test_settled_means_settled_when_the_snapshot_was_taken(tmp_path: Path, monkeypatch) -> None:
    """A long build does not make a file written just before it started look settled."""
    monkeypatch.setattr(noop, "_SETTLED_NS", 10**8)
    _inputs(tmp_path / "data")
    (tmp_path / "data/images/sm120/profiles.toml").write_text("x = 2\n")
    inputs = noop.watch(["image", "--json"], tmp_path / "data", True)
    time.sleep(0.2)  # the build runs longer than the settling time
    assert not inputs.unchanged()


def test_a_file_added_beside_the_dockerfile_is_seen(tmp_path: Path) -> None:
    """The recipe folder may lie outside images/: its own entry is watched."""
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    past = time.time_ns() - 60 * 10**9
    os.utime(recipe, ns=(past, past))
    inputs = _inputs(tmp_path / "data")
    inputs.also([recipe])
    assert inputs.unchanged()
    (recipe / "extra.py").write_text("")
    assert not inputs.unchanged()


@pytest.mark.parametrize(
    "forge",
    [
        lambda record: record["manifest"]["image"].update(
            pushed={"reference": "registry.example/x@sha256:" + "0" * 64}
        ),
        lambda record: record["output"]["json"]["image"].update(pushed={"reference": "x"}),
        lambda record: record["manifest"].update(
            wheels={"sglang": {"published": [{"index": "https://pypi.internal/"}]}}
        ),
        lambda record: record.update(images={}),  # names no image: nothing for the daemon to check
        lambda record: record.update(reference="other:t"),
    ],
    ids=["pushed", "pushed-output", "published", "no-image", "other-image"],
)
def test_a_record_claiming_more_than_a_plain_build_did_is_not_believed(
    tmp_path: Path, monkeypatch, forge
) -> None:
    """A record is written by builder but read from a folder anyone with the cache can edit:
    one that says a push or a publish happened is never replayed into a manifest."""
    monkeypatch.chdir(tmp_path)
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    path = _saved(tmp_path, argv)
    monkeypatch.setattr(noop, "_images_unchanged", lambda record: True)  # no daemon here
    record = json.loads(path.read_text())
    forge(record)
    path.write_text(json.dumps(record))
    assert noop.replay(argv) is None
    assert not (tmp_path / "manifests").exists()


def test_a_record_that_watches_no_file_is_not_believed(tmp_path: Path, monkeypatch) -> None:
    """#54: a record that watches nothing would say "up to date" whatever changed."""
    monkeypatch.chdir(tmp_path)
    argv = ["image", "--json", "--cache-dir", str(tmp_path / "cache")]
    path = _saved(tmp_path, argv)
    record = json.loads(path.read_text())
    record.update(trees=[], files=[], snapshot={})
    path.write_text(json.dumps(record))
    monkeypatch.setattr(noop, "_images_unchanged", lambda record: True)  # no daemon here
    assert noop.replay(argv) is None
    assert not (tmp_path / "manifests").exists()


def test_a_build_that_pushed_is_never_recorded(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path / "data", ("image", "--json"))
    image = {"reference": "r:t", "pushed": {"reference": "registry.example/x@sha256:1"}}
    manifest = tmp_path / "manifests" / "m.json"
    noop.save(
        inputs, cache_dir=tmp_path / "cache", wheel_files=[], images={"r:t": "sha256:1"},
        manifest_dir=manifest.parent, manifest_tag="t", manifest={"image": image}, sbom=None,
        output_json={"image": image, "manifest": str(manifest)},
        lines=[f"manifest {manifest}"], written=manifest,
    )  # fmt: skip
    assert not (tmp_path / "cache" / noop.RECORDS).exists()


def test_a_key_removed_from_the_trusted_keys_file_is_a_full_run(
    tmp_path: Path, monkeypatch
) -> None:
    """The kernels an image holds were trusted by the keys of its build: the trusted keys
    file (and this host's key) are watched like the data, so a key removed in place sends
    the next run the full way, whose kernel step refuses what that key signed."""
    keys = tmp_path / "trusted.pub"
    keys.write_text("old-key\nnew-key\n")
    monkeypatch.setenv("BUILDER_KERNEL_TRUSTED_KEYS", str(keys))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inputs = _inputs(tmp_path / "data")
    assert str(keys) in inputs.files
    assert str(tmp_path / "state/builder/kernel-host.key") in inputs.files
    keys.write_text("new-key\n")
    assert noop._snapshot(inputs.trees, inputs.files) != inputs.snapshot
