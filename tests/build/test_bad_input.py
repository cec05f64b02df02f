"""Bad input: one clear line naming the file/patch/setting, non-zero exit, no partial state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pygit2
import pytest

from tests.conftest import FORK_DIRS, Builder, Upstreams, set_pin


def _error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_unknown_target(builder: Builder) -> None:
    line = _error_line(builder.run("sources", "--target", "sm999", check=False))
    assert "unknown target 'sm999'" in line and "known targets: sm120" in line


def test_malformed_target_file(builder: Builder) -> None:
    target = builder.data_dir / "images/sm120-0.5.9/target.toml"
    target.write_text(target.read_text().replace("[cuda]", "[cuda"))
    line = _error_line(builder.run("sources", check=False))
    assert f"{target}: not valid TOML" in line


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('version = "12.8.1"', 'version = "12.6.3"'), "field 'cuda.version' is 12.6.3, but arch 12.0a needs CUDA >= 12.8"),
        (('arch_list = ["12.0a"]', 'arch_list = ["sm120"]'), "field 'cuda.arch_list' has 'sm120'"),
        (('[image]\nbase = "', '[image]\nbasis = "'), "field 'image.base' is missing"),
        (('series = "sm120"', 'series = "nope"'), "patch series 'nope' does not exist"),
        (('"flashinfer.jit.comm:gen_trtllm_comm_module"', '"subprocess:getoutput(\'id\')"'),
         "field 'jit.modules.generator' 'subprocess:getoutput('id')' is not a FlashInfer call"),
    ],
)  # fmt: skip
def test_invalid_target_fields_name_the_field(
    builder: Builder, edit: tuple[str, str], expected: str
) -> None:
    # sm120-0.5.9 takes its base image from its own file, so a base missing from sm120's
    # file shows on sm120 itself.
    name = "sm120" if "basis" in edit[1] else "sm120-0.5.9"
    target = builder.data_dir / f"images/{name}/target.toml"
    text = target.read_text()
    assert edit[0] in text
    target.write_text(text.replace(edit[0], edit[1], 1))
    line = _error_line(builder.run("sources", "--target", name, check=False))
    assert expected in line
    assert not (builder.cache_dir / "work").exists()


def test_pin_to_a_missing_commit(builder: Builder) -> None:
    set_pin(builder.data_dir, "sglang", commit="0123456789abcdef0123456789abcdef01234567")
    line = _error_line(builder.run("sources", "--upstream", "sglang", check=False))
    assert "forks/sglang-0.5.9/pin.toml" in line
    assert "refs/tags/v0.5.9" in line and "the pin says 0123456789abcdef" in line
    assert not (builder.cache_dir / "work" / "sm120-0.5.9" / "sglang").exists()


def test_pin_commit_must_be_a_full_sha(builder: Builder) -> None:
    set_pin(builder.data_dir, "sglang", commit="bbe9c7e")
    line = _error_line(builder.run("sources", check=False))
    assert "pin.toml: field 'commit' must be a full 40-character" in line


def test_unknown_upstream(builder: Builder) -> None:
    line = _error_line(builder.run("sources", "--upstream", "vllm", check=False))
    assert "--upstream vllm" in line and "sglang, flashinfer" in line


def _series(builder: Builder, fork: str) -> list[Path]:
    return sorted((builder.data_dir / "forks" / FORK_DIRS[fork] / "patches/sm120").glob("*.patch"))


def _assert_at_upstream(builder: Builder, fork: str, github: Upstreams) -> None:
    repo = pygit2.Repository(str(builder.cache_dir / "work/sm120-0.5.9" / fork))
    assert str(repo.head.target) == github.commits[fork]
    assert repo.status(untracked_files="normal") == {}


def test_corrupt_patch(builder: Builder, github: Upstreams) -> None:
    bad = _series(builder, "flashinfer")[1]
    bad.write_text("From: someone\nSubject: [PATCH] garbage\n\nthis is not a diff\n")
    line = _error_line(builder.run("wheels", check=False))
    assert f"{bad}: not a patch" in line
    assert not builder.wheelhouse.exists() or not list(builder.wheelhouse.iterdir())


def test_patch_whose_context_no_longer_matches(builder: Builder, github: Upstreams) -> None:
    # Give the second hunk of the .cuh patch a context line upstream does not have.
    patch = _series(builder, "flashinfer")[1]
    lines = patch.read_text().split("\n")
    hunk_starts = [i for i, line in enumerate(lines) if line.startswith("@@ ")]
    second = hunk_starts[1]
    context = next(i for i in range(second + 1, len(lines)) if lines[i].startswith(" "))
    lines[context] = " // a line upstream never had"
    patch.write_text("\n".join(lines))

    result = builder.run("patch", check=False)
    line = _error_line(result)
    assert str(patch) in line
    assert "include/flashinfer/comm/trtllm_allreduce.cuh" in line
    assert "hunk 2 of 13" in line
    _assert_at_upstream(builder, "flashinfer", github)
    repo = pygit2.Repository(str(builder.cache_dir / "work/sm120-0.5.9/flashinfer"))
    assert "refs/heads/builder/sm120" not in list(repo.references)


def test_missing_submodule_repository(builder: Builder, github: Upstreams) -> None:
    nowhere = builder.cache_dir.parent / "no-such-mirror"
    result = builder.run(
        "sources", "--mirror", f"https://github.com/NVIDIA/={nowhere.as_uri()}/", check=False
    )
    assert result.returncode == 9, "a remote that does not answer: could not check"
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "submodule 3rdparty/cutlass" in line and "no-such-mirror/cutlass.git" in line


def test_checkout_without_submodules_fails_the_wheel_check(
    builder: Builder, github: Upstreams, tmp_path: Path
) -> None:
    """A flashinfer commit that lost its submodules must not ship a cutlass-less wheel."""
    work = tmp_path / "fi"
    git = ["git", "-c", "protocol.file.allow=always", "-c", "safe.directory=*"]
    subprocess.run(
        [*git, "clone", "-q", str(github.root / "flashinfer-ai/flashinfer.git"), str(work)],
        check=True,
    )
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(
        [
            *git,
            "-C",
            str(work),
            "rm",
            "-q",
            "--cached",
            "3rdparty/cutlass",
            "3rdparty/spdlog",
            ".gitmodules",
        ],
        check=True,
    )
    subprocess.run([*git, *ident, "-C", str(work), "commit", "-qm", "no submodules"], check=True)
    subprocess.run([*git, "-C", str(work), "tag", "-f", "v0.6.3"], check=True, capture_output=True)
    commit = subprocess.run(
        [*git, "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    set_pin(builder.data_dir, "flashinfer", commit=commit, url=f"{work.as_uri()}/.git")

    line = _error_line(builder.run("wheels", "--upstream", "flashinfer", check=False))
    assert "missing flashinfer/data/cutlass/include/cutlass/cutlass.h" in line
    assert "submodules" in line
    assert not list(builder.wheelhouse.glob("*.whl"))
    assert not list((builder.cache_dir / "wheels").glob("*/wheel.json"))


def test_patch_that_breaks_python_syntax_never_reaches_the_wheelhouse(builder: Builder) -> None:
    patch = _series(builder, "sglang")[0]
    text = patch.read_text()
    assert "+    is_sm120_supported,\n" in text
    patch.write_text(text.replace("+    is_sm120_supported,\n", "+    is_sm120_supported,,\n", 1))
    line = _error_line(builder.run("wheels", "--upstream", "sglang", check=False))
    assert "sglang/srt/layers/communicator.py does not compile after 0001-" in line
    assert not builder.wheelhouse.exists() or not list(builder.wheelhouse.glob("*.whl"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["wheels", "--cache-dir", "/proc/nope"], "/proc/nope: cannot create or write it"),
        (["wheels", "--cache-dir", "/etc/passwd"], "/etc/passwd: exists and is not a directory"),
        (
            ["publish", "--publish-index", "not-a-url"],
            "--publish-index not-a-url: expected an http(s)://HOST/",
        ),
        (["publish", "--index", "not-a-url"], "--publish-index not-a-url: expected"),  # old name
        (
            ["publish", "--publish-static", "/proc/nope"],
            "--publish-static /proc/nope: cannot create or write it",
        ),
        (
            ["publish", "--publish-index", "https://u:pw@idx.example/"],
            "credentials go in TWINE_USERNAME",
        ),
        (
            ["publish", "--publish-index", "https://idx.example/?token=pw"],
            "credentials go in TWINE_USERNAME",
        ),
        (
            ["publish", "--publish-index", "https://idx.example/", "--publish-simple", "ftp://x/"],
            "--publish-simple ftp://x/: expected an http(s)://HOST/",
        ),
        (["publish"], "builder publish needs --publish-index URL"),
        (["image", "--publish-index", "nope"], "--publish-index nope: expected an http(s)://HOST/"),
        (["image", "--publish-static", "/etc/passwd"], "exists and is not a directory"),
        (
            ["image", "--kernel-registry", "Bad Repo"],
            "--kernel-registry (or BUILDER_KERNEL_REGISTRY) Bad Repo: not a valid image repository",
        ),
        (["image", "--jit-jobs", "-1"], "--jit-jobs -1: must be 0"),
        (["image", "--jit-modules", " ; "], "--jit-modules: empty"),
        # Run in the kernel-builder container: FlashInfer's own generators, plain arguments.
        (["image", "--jit-modules", "os:system('id')"],
         "--jit-modules: 'os:system('id')' is not a FlashInfer call"),
        (["image", "--jit-modules", "flashinfer.jit.norm:gen_norm_module(open('/x'))"],
         "is not a FlashInfer call (flashinfer.jit.<module>:gen_<name>(plain arguments))"),
        (
            ["image", "--runtime-requirements", "/nonexistent.txt"],
            "--runtime-requirements /nonexistent.txt: no such file",
        ),
        (["image", "--pip-index-url", "https://u:pw@idx.example/simple"], "--pip-index-url"),
        (["launch", "--port", "0"], "--port 0: not a TCP port"),
        (["launch", "--port", "70000"], "--port 70000: not a TCP port"),
        (["launch", "--set", "novalue"], "--set novalue: expected KEY=VALUE"),
        (["launch", "--set", "nope=1"], "--set nope: profile 'glm5-nvfp4-tp8' has no such param"),
        (["launch", "--profile", "nope"], "unknown profile 'nope'"),
        (["launch", "--port", "x"], "argument --port: invalid int value: 'x'"),
        (
            ["launch", "--image", "a@sha256:12", "--manifest", "m.json"],
            "--image and --manifest: give one",
        ),
        (
            ["launch", "--image", "reg.example/x:bad:tag"],
            "--image reg.example/x:bad:tag: not an image reference",
        ),
        (
            ["deploy-files", "--out", "/etc/passwd"],
            "--out /etc/passwd: exists and is not a directory",
        ),
        (
            ["verify", "reg.example/x@sha256:12"],
            "verify IMAGE reg.example/x@sha256:12: not an image reference",
        ),
        (
            ["wait-ready", "http://127.0.0.1:1", "--deadline", "-1"],
            "--deadline -1: must be a number of minutes, 0 or more",
        ),
        (
            ["wait-ready", "http://127.0.0.1:1", "--deadline", "nan"],
            "--deadline nan: must be a number of minutes, 0 or more",
        ),
        (["wait-ready", "http://127.0.0.1:1", "--poll", "0"], "--poll 0: must be a number of seconds above 0"),
        (["wait-ready", "http://127.0.0.1:1", "--poll", "inf"], "--poll inf: must be a number of seconds above 0"),
        (
            ["wait-ready", "http://127.0.0.1:1", "--stall-minutes", "-2"],
            "--stall-minutes -2: must be a number of minutes, 0 or more",
        ),
        (["wait-ready", "http://127.0.0.1:1/health"], "give the server root"),
        (
            ["wait-ready", "http://127.0.0.1:1", "--image", "UPPER/x:y:z"],
            "--image UPPER/x:y:z: not an image reference",
        ),
        (["doctor", "--image", "a@sha256:1"], "--image a@sha256:1: not an image reference"),
        (["patches", "check"], "the following arguments are required: --onto"),
        (["wheels", "--upstream", "nope"], "--upstream nope: target 'sm120-0.5.9' has no such upstream"),
        (["image", "--push", "UPPER/Case"], "--push UPPER/Case: not a valid image repository"),
        (["image", "--push", "registry.example/ml/x:v1"], "without a tag or digest"),
        (["image", "--push", "reg.example/x@sha256:00"], "without a tag or digest"),
        (["image", "--tag", "rc-1"], "--tag rc-1: needs --push REGISTRY/REPO"),
        # No folder beside it to be swapped through: refused in one line, not a ValueError.
        (["image", "--save-context", "/"], "--save-context /: the file system root"),
        (["image", "--save-context", "."], "--save-context .: . exists and is not a build context"),
        (["image", "--push", "reg.example/x", "--tag", ".bad"], "--tag .bad: not an image tag"),
        (["deploy-files", "--out", "/proc/nope"], "--out /proc/nope: cannot create or write it"),
        (["wait-ready", "localhost:30000"], "expected http://HOST:PORT"),
        (["launch", "--bind", "all"], "--bind all: not an IP address"),
        (["wait-ready", "http://127.0.0.1:1", "--api-key-file", "/dev/zero"],
         "--api-key-file /dev/zero: not a regular file"),
        (["launch", "--set", "port=99999"], "--port 99999: not a TCP port"),
        (["wait-ready", "http://[::1]:1", "--deadline", "nan"], "--deadline nan"),
    ],
)  # fmt: skip
def test_bad_paths_urls_and_references_fail_before_any_work(builder: Builder, args, expected):
    result = builder.run(*args, check=False)
    assert result.returncode == 1, result.stderr
    line = _error_line(result)
    assert expected in line
    assert "pw@" not in line  # a credential is never echoed
    assert not builder.wheelhouse.exists() and not builder.cache_dir.exists()
