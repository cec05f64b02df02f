"""The foundation on real sglang 0.5.9 / flashinfer 0.6.3 code: sources -> patch -> wheels."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pygit2
import pytest

from tests.conftest import Builder, Upstreams, make_data_dir, seed_cache


@pytest.fixture(scope="module")
def first(fork_wheels_build: tuple[Builder, dict]) -> tuple[Builder, dict]:
    """`builder wheels` from nothing: no mirror, no work tree, no wheel (the run's one)."""
    return fork_wheels_build


def _read(wheel: Path, member_suffix: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(member_suffix)]
        return archive.read(name).decode()


def test_wheels_carry_version_and_patches(first: tuple[Builder, dict]) -> None:
    _, result = first
    sglang, flashinfer = result["upstreams"]["sglang"], result["upstreams"]["flashinfer"]

    for upstream, release in ((sglang, "0.5.9"), (flashinfer, "0.6.3")):
        wheel = upstream["wheel"]
        assert wheel["version"] == f"{release}+sm120.g{upstream['fork_commit'][:7]}"
        assert f"Version: {wheel['version']}\n" in _read(Path(wheel["path"]), ".dist-info/METADATA")

    fi_wheel = Path(flashinfer["wheel"]["path"])
    assert "supported_major_versions=[9, 10, 12]" in _read(fi_wheel, "flashinfer/jit/comm.py")
    cuh = _read(fi_wheel, "flashinfer/data/include/flashinfer/comm/trtllm_allreduce.cuh")
    assert "__CUDA_ARCH__ < 1200" not in cuh
    assert cuh.count("(__CUDA_ARCH__ >= 900))") == 13
    assert "Version(flashinfer_version).public" in _read(fi_wheel, "flashinfer/jit/env.py")
    with zipfile.ZipFile(fi_wheel) as archive:
        assert "flashinfer/data/cutlass/include/cutlass/cutlass.h" in archive.namelist()
    assert fi_wheel.stat().st_size > 5_000_000  # not the 2.6 MB wheel without submodules

    sg_wheel = Path(sglang["wheel"]["path"])
    communicator = _read(sg_wheel, "sglang/srt/layers/communicator.py")
    assert "(_is_sm90_supported or _is_sm100_supported or _is_sm120_supported)" in communicator
    server_args = _read(sg_wheel, "sglang/srt/server_args.py")
    assert "flashinfer_cutlass as MoE runner backend on sm120 for {model_arch}" in server_args
    assert "flashinfer_cutlass as MoE runner backend on sm120 for Glm4MoeForCausalLM" in server_args
    # Fusion stays an explicit opt-in on SM120: the auto-enable guard is untouched.
    assert "and (is_sm90_supported() or is_sm100_supported())\n" in server_args
    # The API keys stay out of the `server_args=` log line and /server_info.
    assert "api_key: Optional[str] = dataclasses.field(default=None, repr=False)" in server_args
    http_server = _read(sg_wheel, "sglang/srt/entrypoints/http_server.py")
    assert 'for secret in ("api_key", "admin_api_key"):' in http_server


def test_fork_branch_is_upstream_plus_one_commit_per_patch(first: tuple[Builder, dict]) -> None:
    _, result = first
    for name, count in (("sglang", 3), ("flashinfer", 3)):
        upstream = result["upstreams"][name]
        repo = pygit2.Repository(upstream["path"])
        branch = repo.references[f"refs/heads/{upstream['branch']}"]
        assert str(branch.target) == upstream["fork_commit"]
        walker = repo.walk(branch.target)
        commits = [next(walker) for _ in range(count + 1)]
        assert str(commits[-1].id) == upstream["upstream_commit"]
        assert commits[0].committer.name == "builder"
        assert len(upstream["patches"]) == count


def test_second_run_is_a_cache_hit(first: tuple[Builder, dict]) -> None:
    builder, result = first
    wheels = [Path(u["wheel"]["path"]) for u in result["upstreams"].values()]
    mtimes = [w.stat().st_mtime_ns for w in wheels]
    again = json.loads(builder.run("wheels", "--json").stdout)
    assert all(u["wheel"]["cached"] for u in again["upstreams"].values())
    assert [w.stat().st_mtime_ns for w in wheels] == mtimes


def test_wheel_bytes_do_not_depend_on_the_git_cli(
    first: tuple[Builder, dict], tmp_path: Path, github: Upstreams
) -> None:
    """A second clean build (nothing cached) gives the same bytes, and without the git CLI:
    `first` ran with git on PATH, this build has none. Both build from an export with no
    .git, with the fork commit and the tracked file list written in from pin.toml."""
    _, result = first
    assert shutil.which("git"), "the first build should have had the git CLI"
    no_git = tmp_path / "bin"
    no_git.mkdir()
    assert shutil.which("git", path=str(no_git)) is None
    fresh = Builder(
        make_data_dir(tmp_path / "data", github), tmp_path / "cache", github.mirror, tmp_path / "wh"
    )
    second = json.loads(fresh.run("wheels", "--json", env={"PATH": str(no_git)}).stdout)
    for name in ("sglang", "flashinfer"):
        one, two = result["upstreams"][name], second["upstreams"][name]
        assert two["fork_commit"] == one["fork_commit"]
        assert two["wheel"]["cached"] is False
        assert two["wheel"]["sha256"] == one["wheel"]["sha256"]
    flashinfer = second["upstreams"]["flashinfer"]
    build_meta = _read(Path(flashinfer["wheel"]["path"]), "flashinfer/_build_meta.py")
    assert f'__git_version__ = "{flashinfer["fork_commit"]}"' in build_meta  # not "unknown"
    with zipfile.ZipFile(second["upstreams"]["sglang"]["wheel"]["path"]) as archive:
        # package data only `git ls-files` (or the file list builder writes) brings in
        assert "sglang/README.md" in archive.namelist()


def test_upstream_filter_and_sources_only(builder: Builder) -> None:
    result = json.loads(builder.run("sources", "--upstream", "sglang", "--json").stdout)
    assert list(result["upstreams"]) == ["sglang"]
    assert not (builder.cache_dir / "work" / "sm120-0.5.9" / "flashinfer").exists()
    repo = pygit2.Repository(result["upstreams"]["sglang"]["path"])
    assert str(repo.head.target) == result["upstreams"]["sglang"]["commit"]


def test_submodules_are_checked_out_at_their_gitlinks(builder: Builder) -> None:
    result = json.loads(builder.run("sources", "--upstream", "flashinfer", "--json").stdout)
    subs = result["upstreams"]["flashinfer"]["submodules"]
    assert set(subs) == {"3rdparty/cutlass", "3rdparty/spdlog"}
    assert subs["3rdparty/cutlass"]["url"] == "https://github.com/NVIDIA/cutlass.git"
    path = Path(result["upstreams"]["flashinfer"]["path"]) / "3rdparty/cutlass"
    assert (path / "include/cutlass/cutlass.h").is_file()
    assert str(pygit2.Repository(str(path)).head.target) == subs["3rdparty/cutlass"]["commit"]


def test_kill_during_wheel_build_leaves_nothing_half_done(
    builder: Builder, first: tuple[Builder, dict]
) -> None:
    seed_cache(builder, first[0].cache_dir, folders=("mirrors",))  # the fetch is not the subject
    builder.run("patch")  # sources and patches in place; the kill lands in the wheel build
    homes_before = set(Path(tempfile.gettempdir()).glob("builder-backend-home-*"))
    process = subprocess.Popen(
        builder.command("wheels"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    log = builder.cache_dir / "logs" / "sglang-wheel.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and log.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the kill must land while the build runs"
    assert not list(builder.wheelhouse.glob("*.whl"))
    assert not list((builder.cache_dir / "wheels").glob("*/wheel.json"))

    assert list(builder.cache_dir.glob(".source-*")), "the killed build's export is left"
    # with the backend's HOME inside it: nothing of the build outside the cache
    assert set(Path(tempfile.gettempdir()).glob("builder-backend-home-*")) <= homes_before
    assert list(builder.cache_dir.glob(".source-*/backend-home"))

    result = json.loads(builder.run("wheels", "--json").stdout)
    assert {p.name for p in builder.wheelhouse.iterdir()} == {
        Path(u["wheel"]["path"]).name for u in result["upstreams"].values()
    }
    assert not list(builder.cache_dir.glob(".source-*")), "and the next build clears it"


def test_two_builds_at_once_share_the_cache_safely(builder: Builder) -> None:
    processes = [
        subprocess.Popen(
            builder.command("patch", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    forks = [json.loads(out)["upstreams"]["flashinfer"]["fork_commit"] for out, _ in outputs]
    assert forks[0] == forks[1]
    assert any("waiting for another builder run" in err for _, err in outputs)


def test_image_runtime_requirements_come_from_target_pins_and_wheel_metadata(
    first: tuple[Builder, dict],
) -> None:
    from types import SimpleNamespace

    from builder.build.image_plan import runtime_inputs, wheels_requirements
    from builder.spec.target import load_target

    builder, result = first
    target = load_target(builder.data_dir, "sm120-0.5.9")
    wheels = {
        name: SimpleNamespace(dist_name=u["wheel"]["dist_name"], path=Path(u["wheel"]["path"]))
        for name, u in result["upstreams"].items()
    }
    lines = [str(r) for r in runtime_inputs(target, wheels_requirements(wheels))]
    assert {"torch==2.9.1", "sgl-kernel==0.3.21", "flashinfer-cubin==0.6.3"} <= set(lines)
    assert "transformers==4.57.1" in lines  # sglang 0.5.9's own pin, from its METADATA
    assert any(line.startswith("apache-tvm-ffi") for line in lines)  # flashinfer's
    names = [line.split("=")[0].split("<")[0].split(">")[0].split(";")[0].lower() for line in lines]
    assert not {"sglang", "flashinfer-python", "flashinfer_python", "flashinfer-jit-cache"} & set(
        names
    )
    assert len(lines) == len(set(lines)), "each requirement once"


def test_the_committed_sm120_lock_satisfies_the_wheels_and_a_stale_one_is_refused(
    first: tuple[Builder, dict], tmp_path: Path
) -> None:
    """`builder lock --check` on the real wheels: the reviewed lock is current; the same
    lock with torch moved off sglang's pin is refused in one line naming the file."""
    builder, _ = first
    lock = builder.data_dir / "images/sm120-0.5.9/runtime-lock.txt"
    assert builder.run("lock", "--check").returncode == 0
    stale = tmp_path / "stale-lock.txt"
    stale.write_text(lock.read_text().replace("\ntorch==2.9.1 ", "\ntorch==2.8.0 "))
    refused = builder.run("lock", "--check", "--out", str(stale), check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {stale}: stale lock: torch==2.9.1 is not met by its torch==2.8.0; "
        "run `builder lock --target sm120-0.5.9` and review the change"
    )
