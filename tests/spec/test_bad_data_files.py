"""Bad data files and arguments (issue 20): one `error:` line, exit 1, nothing written.

Fast and offline: builder's own functions on a copy of images/ and forks/, or the real CLI
on values refused while the input is checked, before any fetch or daemon."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pygit2
import pytest

from builder.build import wheels
from builder.core.errors import BuilderError
from builder.spec import launch_profiles
from builder.spec.target import load_fork, load_target
from builder.upstream import series
from tests.conftest import REPO_ROOT

TOKEN = "T0pS3cret"
IMAGE = "registry.example/ml/sglang-sm120:v1"
PUSHED = {"pushed": {"reference": "registry.example/ml/sglang-sm120@sha256:" + "a" * 64}}
TARGET = "sm120-0.5.9"


def _copy(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, data / folder)
    return data


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in root.rglob("*")
    }


def _manifest(tmp_path: Path, image: object) -> Path:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"schema_version": 1, "image": image}))
    return path


def _cli(cwd: Path, *args: str) -> str:
    """The real CLI, run in `cwd`: its one error line (exit 1, no traceback); stderr may
    hold warnings besides it, nothing else."""
    env = {**os.environ, "BUILDER_CONFIG": "/nonexistent", "BUILDER_TARGET": TARGET}
    env.pop("BUILDER_KERNEL_REGISTRY", None)
    result = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    others = [line for line in lines if not line.startswith(("error: ", "warning: "))]
    assert len(errors) == 1 and not others, result.stderr
    assert TOKEN not in result.stdout + result.stderr
    return errors[0]


@pytest.fixture
def work(tmp_path: Path) -> tuple[Path, Path]:
    """(data copy, an empty folder the CLI runs in)."""
    data = _copy(tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return data, cwd


# --- pin.toml paths stay in the source export ------------------------------------------------


@pytest.mark.parametrize("path", ["/etc", "../outside", "python/../../x"])
def test_a_project_dir_outside_the_source_export_is_refused(tmp_path: Path, path: str) -> None:
    """build.write_files are written into project_dir, and the backend runs there."""
    data = _copy(tmp_path)
    pin = data / "forks/sglang-0.5.9/pin.toml"
    text = pin.read_text()
    assert 'project_dir = "python"' in text
    pin.write_text(text.replace('project_dir = "python"', f'project_dir = "{path}"'))
    with pytest.raises(BuilderError, match=rf"field 'build.project_dir' is '{re.escape(path)}'"):
        load_target(data, TARGET)


def _upstream_with_a_link(tmp_path: Path, outside: Path) -> tuple[pygit2.Repository, str]:
    """A commit whose `link` is a symlink to a folder outside any export."""
    repo = pygit2.init_repository(str(tmp_path / "upstream"), bare=True)
    tree = repo.TreeBuilder()
    tree.insert("link", repo.create_blob(str(outside).encode()), pygit2.enums.FileMode.LINK)
    tree.insert("setup.py", repo.create_blob(b"# upstream\n"), pygit2.enums.FileMode.BLOB)
    who = pygit2.Signature("t", "t@t", 1700000000, 0)
    commit = repo.create_commit(None, who, who, "upstream", tree.write(), [])
    return repo, str(commit)


@pytest.mark.parametrize(
    "change",
    [
        {"clean": ("link/victim",)},
        {"write_files": {"link/victim": "overwritten"}},
        {"project_dir": "link"},
    ],
)
def test_a_pin_path_through_an_upstream_symlink_leaves_the_outside_alone(
    tmp_path: Path, change: dict
) -> None:
    """build.clean deletes and build.write_files writes in the export: a symlink the
    upstream commit holds does not take either outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").mkdir()
    (outside / "victim/keep.txt").write_text("keep")
    before = _files(outside)
    repo, commit = _upstream_with_a_link(tmp_path, outside)
    fork = load_fork(REPO_ROOT, "flashinfer-0.6.3")
    wheel = dataclasses.replace(
        fork.wheel, **{"clean": (), "write_files": {}, "file_list": "", **change}
    )
    fork = dataclasses.replace(fork, wheel=wheel)
    with pytest.raises(BuilderError, match="leads out of the source export through a symlink"):
        wheels._export_source(repo, fork, commit, "0.6.3", tmp_path / "export")
    assert _files(outside) == before


# --- patches refresh: pin.toml rewritten as TOML, patches and pin swapped together ------------


def _refresh_fixture(tmp_path: Path, version_txt: str = "0.6.16"):
    """A fork folder (the flashinfer-0.6.3 copy) and a repository: `onto` upstream with
    one patch commit on top. Returns (repo, fork, onto, head)."""
    data = _copy(tmp_path)
    fork = load_fork(data, "flashinfer-0.6.3")
    repo = pygit2.init_repository(str(tmp_path / "work"), bare=True)
    who = pygit2.Signature("t", "t@t", 1700000000, 0)

    def commit(files: dict[str, bytes], parents: list, message: str) -> str:
        tree = repo.TreeBuilder()
        for name, body in files.items():
            tree.insert(name, repo.create_blob(body), pygit2.enums.FileMode.BLOB)
        return str(repo.create_commit(None, who, who, message, tree.write(), parents))

    onto = commit({"version.txt": version_txt.encode(), "a.py": b"x = 1\n"}, [], "upstream")
    head = commit(
        {"version.txt": version_txt.encode(), "a.py": b"x = 2\n"},
        [pygit2.Oid(hex=onto)],
        "sm120: patch a\n",
    )
    return repo, fork, onto, head


def test_refresh_writes_the_pin_and_series_it_reports(tmp_path: Path) -> None:
    """The happy path the failures below are measured against; a pin written with
    single quotes and spacing TOML allows is rewritten too, not silently left as it was."""
    repo, fork, onto, head = _refresh_fixture(tmp_path)
    pin = fork.directory / "pin.toml"
    pin.write_text(re.sub(r'(?m)^commit = "(\w+)"', r"commit   =  '\1'", pin.read_text()))
    assert "commit   =  'd0886ce" in pin.read_text()
    old = tomllib.loads(pin.read_text())
    written = series._write_series(repo, fork, "sm120", "refs/tags/v0.6.16", onto, head)
    new = tomllib.loads(pin.read_text())
    assert new == {**old, "commit": onto, "ref": "refs/tags/v0.6.16", "version": "0.6.16"}
    assert written["patches"] == ["0001-sm120-patch-a.patch"]
    assert sorted(p.name for p in fork.series_dir("sm120").iterdir()) == written["patches"]
    assert "# FlashInfer, pinned." in pin.read_text()  # comments kept
    assert not list(fork.directory.glob("patches/.*")) and not list(fork.directory.glob(".pin*"))


@pytest.mark.parametrize(
    ("ref", "version_txt", "refused"),
    [
        ('refs/tags/v0.6.16"\nurl = "https://evil.example/x.git', "0.6.16", "ref"),
        ("refs/tags/v0.6.16", '0.6.16"\n[build.env]\nLD_PRELOAD = "/tmp/x.so', "version"),
        ("refs/tags/v0.6.16", "0.6.16'\n", "version"),
    ],
)
def test_upstream_text_never_injects_into_the_pin(
    tmp_path: Path, ref: str, version_txt: str, refused: str
) -> None:
    """A tag name or version.txt is upstream's text: quotes and line breaks in it are
    refused, and forks/ is left exactly as it was (pin and series, no leftovers)."""
    repo, fork, onto, head = _refresh_fixture(tmp_path, version_txt)
    before = _files(fork.directory)
    with pytest.raises(BuilderError, match=rf"pin.toml: refusing to write {refused} = "):
        series._write_series(repo, fork, "sm120", ref, onto, head)
    assert _files(fork.directory) == before


def test_a_pin_a_text_edit_would_miss_is_rewritten_by_the_toml_writer(tmp_path: Path) -> None:
    """`commit` as a quoted key: a text edit would miss it, and the series would move to
    the new upstream while the pin still named the old one. The TOML writer sets it."""
    repo, fork, onto, head = _refresh_fixture(tmp_path)
    pin = fork.directory / "pin.toml"
    pin.write_text(pin.read_text().replace('\ncommit = "', '\n"commit" = "', 1))
    old = tomllib.loads(pin.read_text())
    series._write_series(repo, fork, "sm120", "refs/tags/v0.6.16", onto, head)
    new = tomllib.loads(pin.read_text())
    assert new == {**old, "commit": onto, "ref": "refs/tags/v0.6.16", "version": "0.6.16"}


def test_a_failed_pin_swap_puts_the_old_series_back(tmp_path: Path, monkeypatch) -> None:
    repo, fork, onto, head = _refresh_fixture(tmp_path)
    before = _files(fork.directory)
    real_replace = os.replace

    def failing(source, destination) -> None:
        if Path(destination).name == "pin.toml":
            raise OSError(28, "No space left on device")
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        series._write_series(repo, fork, "sm120", "refs/tags/v0.6.16", onto, head)
    assert _files(fork.directory) == before  # old pin with old series, no .new/.old/.pin*


# --- generated files: --name, a profile name, a manifest's image reference -------------------


def test_a_line_break_in_name_adds_no_line_and_writes_nothing(work) -> None:
    data, cwd = work
    manifest = _manifest(cwd.parent, PUSHED)
    line = _cli(
        cwd, "deploy-files", "--data-dir", str(data), "--manifest", str(manifest),
        "--out", "deploy", "--name", "glm5\n    privileged: true",
    )  # fmt: skip
    assert "container name 'glm5\\n    privileged: true': not allowed" in line
    assert not any(cwd.iterdir())


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({"reference": f"{IMAGE}\n    pid: host"}, f"image '{IMAGE}\\n    pid: host': not an image"),
        ({"pushed": {"reference": "x\nExecStartPre=/bin/id"}}, "image 'x\\nExecStartPre=/bin/id'"),
        ({"pushed": "reg.example/x:y"}, "field 'image.pushed' must be an object"),
        ({"reference": ["reg.example/x:y"]}, "the image reference must be a string"),
        (["reg.example/x:y"], "not a builder manifest"),
    ],
)  # fmt: skip
def test_a_bad_image_reference_in_a_manifest_is_one_line_and_writes_nothing(
    work, image, expected: str
) -> None:
    data, cwd = work
    manifest = _manifest(cwd.parent, image)
    for command in ("deploy-files", "launch"):
        line = _cli(cwd, command, "--data-dir", str(data), "--manifest", str(manifest))
        assert f"error: {manifest}: " in line and expected in line
    assert not any(cwd.iterdir())  # no ./deploy


def test_a_profile_name_never_leads_out_of_the_install_root(work) -> None:
    """A profile name becomes a folder and a unit file name under --root."""
    data, cwd = work
    profiles = data / f"images/{TARGET}/profiles.toml"
    evil = "x/../../../../escape/evil"
    text = profiles.read_text().replace('"glm5-nvfp4-tp8"', f'"{evil}"')  # default, extends
    profiles.write_text(
        re.sub(r"\[profiles\.glm5-nvfp4-tp8([.\]])", rf'[profiles."{evil}"\1', text)
    )
    manifest = _manifest(cwd.parent, PUSHED)
    root = cwd / "root"
    root.mkdir()
    line = _cli(
        cwd, "deploy-files", "--data-dir", str(data), "--manifest", str(manifest),
        "--install", "--root", str(root),
    )  # fmt: skip
    assert f"profile name '{evil}': not allowed in generated files" in line
    assert not any(root.iterdir()) and not (cwd.parent / "escape").exists()


def test_a_line_break_in_the_out_folder_never_reaches_the_unit(work) -> None:
    """--out went into the unit's WorkingDirectory=, where a line break would add a line:
    the unit now names the installed folder, whatever --out is."""
    data, cwd = work
    manifest = _manifest(cwd.parent, PUSHED)
    out = cwd / "deploy\nExecStartPre=/bin/id"
    env = {**os.environ, "BUILDER_CONFIG": "/nonexistent", "BUILDER_TARGET": TARGET}
    written = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", "deploy-files", "--data-dir", str(data),
         "--manifest", str(manifest), "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    unit = (out / "sglang-glm5-nvfp4-tp8.service").read_text()
    assert "ExecStartPre" not in unit
    assert "\nWorkingDirectory=/etc/sglang/glm5-nvfp4-tp8\n" in unit


# --- numbers: NaN and infinity ----------------------------------------------------------------

URL = "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["wait-ready", URL, "--deadline", "inf"], "--deadline inf: must be a number of minutes"),
        (["wait-ready", URL, "--deadline", "1e309"], "--deadline 1e309: must be a number"),
        (["wait-ready", URL, "--deadline", "nanh"], "--deadline nanh: must be a number"),
        (["wait-ready", URL, "--stall-minutes", "inf"], "--stall-minutes inf: must be a number"),
        (["wait-ready", URL, "--poll", "nan"], "--poll nan: must be a number of seconds above 0"),
        (["qualify", URL, "--deadline", "inf"], "--deadline inf: must be a number of minutes"),
        (["qualify", URL, "--level-seconds", "inf"], "--level-seconds inf: must be a number"),
        (["qualify", URL, "--level-seconds", "nan"], "--level-seconds nan: must be a number"),
        (["launch", "--run", "--poll", "nan"], "--poll nan: must be a number of seconds above 0"),
        (["launch", "--run", "--poll", "inf"], "--poll inf: must be a number of seconds above 0"),
    ],
)  # fmt: skip
def test_nan_and_infinity_are_refused_in_every_numeric_option(work, args, expected) -> None:
    """`launch --run` would start the server first, then never poll (nan) or poll once a
    forever (inf): refused before anything starts (no Docker needed to see it)."""
    data, cwd = work
    if args[0] == "launch":
        args = [*args, "--data-dir", str(data), "--image", IMAGE]
    assert expected in _cli(cwd, *args)
    assert not any(cwd.iterdir())


@pytest.mark.parametrize("value", ["inf", "nan", "-5.0", '"20"'])
def test_a_profile_deadline_that_is_no_number_is_one_line(work, value: str) -> None:
    data, cwd = work
    profiles = data / f"images/{TARGET}/profiles.toml"
    text = profiles.read_text()
    assert "\nready_deadline_minutes = 20" in text
    profiles.write_text(
        text.replace("\nready_deadline_minutes = 20", f"\nready_deadline_minutes = {value}")
    )
    manifest = _manifest(cwd.parent, {"reference": IMAGE})
    line = _cli(cwd, "launch", "--data-dir", str(data), "--manifest", str(manifest))
    assert "profile 'glm5-nvfp4-tp8' field 'ready_deadline_minutes'" in line


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "90"])
def test_a_profile_gpu_memory_that_is_no_number_is_refused(value) -> None:
    """doctor compares the GPUs' memory with it: NaN would pass every GPU."""
    with pytest.raises(BuilderError, match="field 'min_gpu_memory_gib'"):
        launch_profiles.profile_number({"min_gpu_memory_gib": value}, "min_gpu_memory_gib", 0, "p:")


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-2", "true"])
def test_a_jit_job_memory_that_is_no_positive_number_is_refused(tmp_path: Path, value) -> None:
    data = _copy(tmp_path)
    toml = data / f"images/{TARGET}/target.toml"
    text = toml.read_text()
    assert "job_memory_gb = 6" in text
    toml.write_text(text.replace("job_memory_gb = 6", f"job_memory_gb = {value}", 1))
    with pytest.raises(BuilderError, match=r"field 'jit.job_memory_gb' (is|must be)"):
        load_target(data, TARGET)


# --- key files --------------------------------------------------------------------------------


def test_an_oversized_api_key_file_is_one_line(work) -> None:
    _, cwd = work
    key = cwd.parent / "key"
    key.write_text("k" * 5000)
    line = _cli(cwd, "wait-ready", URL, "--api-key-file", str(key))
    assert f"--api-key-file {key}: over 4096 bytes, not a key file" in line


def test_a_signing_key_of_dev_zero_is_one_line(tmp_path: Path) -> None:
    """Run in a child with its address space capped: unfixed, it ends in MemoryError
    within a second instead of taking the machine's memory."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from builder.core.errors import BuilderError\n"
        "from builder.build.kernels import trust\n"
        "try:\n"
        "    trust.signing_key()\n"
        "except BuilderError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "BUILDER_KERNEL_SIGNING_KEY": "/dev/zero"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr[-300:]
    assert "/dev/zero: not a regular file, not a key file" in result.stdout


# --- URLs with credentials: one line, never the secret ---------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["publish", "--publish-repository", "internal", "--publish-simple",
          f"https://u:{TOKEN}@pypi.internal:99999/simple/"],
         "--publish-simple https://pypi.internal:99999/simple/: expected an http(s)://HOST/"),
        (["publish", "--publish-repository", "internal", "--publish-simple",
          f"https://u:{TOKEN}@[::1/simple/"], "--publish-simple https://[::1/simple/: expected"),
        (["publish", "--publish-index", f"https://u:{TOKEN}@idx:x/"], "--publish-index https://idx:x/"),
        (["image", "--pip-index-url", f"https://u:{TOKEN}@pypi.internal:99999/simple"],
         "--pip-index-url https://pypi.internal:99999/simple: the URL carries credentials"),
        (["wait-ready", f"http://u:{TOKEN}@127.0.0.1:x"], "wait-ready URL 'http://127.0.0.1:x'"),
        (["wait-ready", f"http://u:{TOKEN}@127.0.0.1:1/health"], "give the server root"),
        (["wait-ready", "http://[::1"], "wait-ready URL 'http://[::1': expected http://HOST:PORT"),
        (["qualify", f"http://127.0.0.1:1/?token={TOKEN}"], "qualify URL 'http://127.0.0.1:1/?token=***'"),
    ],
)  # fmt: skip
def test_a_broken_url_with_a_secret_is_one_line_without_it(work, args, expected) -> None:
    data, cwd = work
    if args[0] in ("publish", "image"):
        args = [*args, "--data-dir", str(data), "--cache-dir", "cache", "--wheelhouse", "wh"]
    assert expected in _cli(cwd, *args)
    assert not any(cwd.iterdir())  # no cache, no wheelhouse


@pytest.mark.parametrize(
    "text",
    [
        f"--extra-index-url=https://pypi.internal/simple?token={TOKEN}\ntorch==2.9.1\n",
        f"-i https://ci:{TOKEN}@pypi.internal/simple\ntorch==2.9.1\n",
        f"--extra-index-url \\\n    https://ci:{TOKEN}@pypi.internal/simple\ntorch==2.9.1\n",
        f"--find-links https://files.internal/?X-Amz-Signature={TOKEN}\ntorch==2.9.1\n",
        f"torch @ https://ci:{TOKEN}@files.internal/torch-2.9.1-cp312-cp312-linux_x86_64.whl\n",
    ],
)
def test_every_credential_form_in_a_requirements_file_is_refused(work, text: str) -> None:
    """The file is copied into the image: each way pip takes a URL from it is checked."""
    data, cwd = work
    requirements = cwd.parent / "runtime.txt"
    requirements.write_text(text)
    line = _cli(
        cwd, "image", "--runtime-requirements", str(requirements), "--data-dir", str(data),
        "--cache-dir", "cache", "--wheelhouse", "wh",
    )  # fmt: skip
    # The line the URL is on (a continued option's second line for the third form).
    number = next(n for n, t in enumerate(text.splitlines(), 1) if "://" in t)
    assert line.startswith(f"error: {requirements}:{number}: https://")
    assert "carries credentials" in line
    assert not any(cwd.iterdir())


def test_a_binary_requirements_file_is_one_line(work) -> None:
    data, cwd = work
    requirements = cwd.parent / "runtime.txt"
    requirements.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe torch==2.9.1\n")
    line = _cli(
        cwd, "image", "--runtime-requirements", str(requirements), "--data-dir", str(data),
        "--cache-dir", "cache", "--wheelhouse", "wh",
    )  # fmt: skip
    assert f"{requirements}: not a requirements file (not UTF-8 text)" in line
    assert not any(cwd.iterdir())
