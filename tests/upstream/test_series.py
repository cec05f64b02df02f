"""Patch series vs a moving upstream, on real flashinfer history 0.6.3 -> 0.6.16 -> 0.6.17.

The fixture repository has one commit per release on one branch (from the PyPI sdists).
Upstream removed the SM120 gates in 0.6.17 (2deed6c15), and rewrote the version checks in
jit/env.py on the way: so patches 1-2 move cleanly to 0.6.16 and are `upstream` at 0.6.17,
while patch 3 really conflicts.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pygit2
import pytest

from tests.conftest import REPO_ROOT, Builder, Upstreams, set_pin
from tests.services import start_git_daemon
from tests.upstreams import FLASHINFER, SGLANG, build_history

SERIES = "forks/flashinfer-0.6.3/patches/sm120"


@pytest.fixture(scope="session")
def history(tmp_path_factory) -> tuple[Upstreams, dict[str, str]]:
    root = tmp_path_factory.mktemp("github-history")
    commits = build_history(FLASHINFER, ["0.6.3", "0.6.16", "0.6.17"], root)
    sglang = build_history(SGLANG, ["0.5.9"], root)
    process, served = start_git_daemon(root)
    pins = {"flashinfer": commits["0.6.3"], "sglang": sglang["0.5.9"]}
    yield Upstreams(root, pins, served), commits
    process.terminate()
    process.wait()


@pytest.fixture
def builder(tmp_path: Path, history) -> Builder:
    upstreams, _ = history
    data = tmp_path / "data"
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, data / folder)
    for fork, commit in upstreams.commits.items():
        set_pin(data, fork, commit=commit)
    return Builder(data, tmp_path / "cache", upstreams.mirror, tmp_path / "wheelhouse")


def _only_sm120_gates(builder: Builder) -> None:
    """The series as the gates alone (patches 1-2), without the env.py version patch."""
    for patch in (builder.data_dir / SERIES).glob("0003-*.patch"):
        patch.unlink()


def _check(builder: Builder, onto: str):
    result = builder.run(
        "patches", "check", "--upstream", "flashinfer", "--onto", onto, "--json", check=False
    )
    return result.returncode, json.loads(result.stdout)["flashinfer"]


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_check_classifies_each_patch(builder: Builder, history) -> None:
    code, at_16 = _check(builder, "v0.6.16")
    assert [p["status"] for p in at_16["patches"]] == ["merged", "clean", "conflict"]
    assert "flashinfer/jit/comm.py hunk 1: line 58 -> 189 (+131)" in at_16["patches"][0]["details"]
    conflict = at_16["patches"][2]["conflicts"]
    assert list(conflict) == ["flashinfer/jit/env.py"]
    assert [h.split(" (")[0] for h in conflict["flashinfer/jit/env.py"]] == [
        "hunk 2 of 3",
        "hunk 3 of 3",
    ]
    assert at_16["onto_commit"] == history[1]["0.6.16"]
    assert code == 7 and at_16["can_move_unattended"] is False

    code, at_17 = _check(builder, "v0.6.17")
    assert [p["status"] for p in at_17["patches"]] == ["upstream", "upstream", "conflict"]


def test_gates_alone_move_unattended_and_refresh_builds(builder: Builder, history) -> None:
    _only_sm120_gates(builder)
    code, at_16 = _check(builder, "v0.6.16")
    assert code == 0 and [p["status"] for p in at_16["patches"]] == ["merged", "clean"]

    refreshed = json.loads(
        builder.run(
            "patches", "refresh", "--upstream", "flashinfer", "--onto", "v0.6.16", "--json"
        ).stdout
    )
    assert refreshed["pin"] == {
        "commit": history[1]["0.6.16"],
        "ref": "refs/tags/v0.6.16",
        "version": "0.6.16",
    }
    pin = (builder.data_dir / "forks/flashinfer-0.6.3/pin.toml").read_text()
    assert f'commit = "{history[1]["0.6.16"]}"' in pin and 'version = "0.6.16"' in pin
    assert len(list((builder.data_dir / SERIES).glob("*.patch"))) == 2

    # The refreshed series is a normal series: the patch and wheels stages take it as is.
    wheels = json.loads(builder.run("wheels", "--upstream", "flashinfer", "--json").stdout)
    wheel = wheels["upstreams"]["flashinfer"]["wheel"]
    assert wheel["version"].startswith("0.6.16+sm120.g")
    import zipfile

    with zipfile.ZipFile(wheel["path"]) as archive:
        cuh = archive.read("flashinfer/data/include/flashinfer/comm/trtllm_allreduce.cuh").decode()
    assert "__CUDA_ARCH__ < 1200" not in cuh


def test_refresh_onto_a_release_that_has_them_drops_them(builder: Builder, history) -> None:
    _only_sm120_gates(builder)
    result = builder.run(
        "patches", "refresh", "--upstream", "flashinfer", "--onto", "v0.6.17", "--json"
    )
    refreshed = json.loads(result.stdout)
    assert [p["status"] for p in refreshed["check"]["patches"]] == ["upstream", "upstream"]
    assert refreshed["patches"] == []
    assert not list((builder.data_dir / SERIES).glob("*.patch"))
    assert refreshed["pin"]["version"] == "0.6.17"


def test_conflict_stops_leaves_forks_untouched_then_export_finishes(
    builder: Builder, history
) -> None:
    forks = builder.data_dir / "forks"
    before = _snapshot(forks)
    result = builder.run(
        "patches", "refresh", "--upstream", "flashinfer", "--onto", "v0.6.16", check=False
    )
    assert result.returncode == 7
    assert "0003-jit-env-compare-public-versions" in result.stderr
    assert "conflicts in flashinfer/jit/env.py (hunk 2 of 3" in result.stderr
    assert "builder patches export --target sm120-0.5.9 --upstream flashinfer" in result.stderr
    assert _snapshot(forks) == before, "forks/ must not change before the series succeeds"

    workdir = builder.cache_dir / "work/sm120-0.5.9/flashinfer-refresh"
    env_py = workdir / "flashinfer/jit/env.py"
    assert env_py.read_text().count("<<<<<<< ours") == 2
    repo = pygit2.Repository(str(workdir))
    assert str(repo.head.target) != history[1]["0.6.16"], "patches 1-2 are committed below it"

    early = builder.run("patches", "export", "--upstream", "flashinfer", check=False)
    assert (
        early.returncode == 1 and "conflict markers remain in flashinfer/jit/env.py" in early.stderr
    )
    assert _snapshot(forks) == before

    # The user's edit: keep the patch's side of both conflicts.
    env_py.write_text(
        re.sub(
            r"<<<<<<< ours\n.*?=======\n(.*?)>>>>>>> theirs\n",
            r"\1",
            env_py.read_text(),
            flags=re.S,
        )
    )
    exported = json.loads(
        builder.run("patches", "export", "--upstream", "flashinfer", "--json").stdout
    )
    assert len(exported["patches"]) == 3 and exported["pin"]["commit"] == history[1]["0.6.16"]
    patched = json.loads(builder.run("patch", "--upstream", "flashinfer", "--json").stdout)
    assert patched["upstreams"]["flashinfer"]["upstream_commit"] == history[1]["0.6.16"]
    work = Path(patched["upstreams"]["flashinfer"]["path"])
    assert "Version(flashinfer_version).public" in (work / "flashinfer/jit/env.py").read_text()


def test_export_of_an_unchanged_branch_keeps_the_fork_commit(builder: Builder) -> None:
    first = json.loads(builder.run("patch", "--upstream", "flashinfer", "--json").stdout)
    builder.run("patches", "export", "--upstream", "flashinfer")
    again = json.loads(builder.run("patch", "--upstream", "flashinfer", "--json").stdout)
    assert (
        again["upstreams"]["flashinfer"]["fork_commit"]
        == first["upstreams"]["flashinfer"]["fork_commit"]
    )


def test_list_and_bad_ref(builder: Builder) -> None:
    listed = json.loads(builder.run("patches", "list", "--json").stdout)
    assert [p["file"][:4] for p in listed["flashinfer"]["patches"]] == ["0001", "0002", "0003"]
    assert listed["flashinfer"]["patches"][1]["files"] == [
        "include/flashinfer/comm/trtllm_allreduce.cuh"
    ]
    result = builder.run(
        "patches", "check", "--upstream", "flashinfer", "--onto", "v9.9.9", check=False
    )
    assert result.returncode == 1
    assert "error: --onto v9.9.9: no such tag, branch or commit" in result.stderr
