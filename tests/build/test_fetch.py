"""A cold fetch asks for what git's shallow clone asks for: the pinned commit of each
submodule at depth 1 (side by side), not its whole history; a server that will not hand out
a commit by its id still works. Real git daemon on loopback, the fixture's real upstream."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pygit2
import pytest

from tests.conftest import REPO_ROOT, Builder, Upstreams, seed_cache
from tests.services import start_git_daemon

pytestmark = pytest.mark.skipif(not shutil.which("git"), reason="git not installed")


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` but git's own, by its path: what a build would read."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file() and ".git" not in path.relative_to(root).parts
    }


def _sources(builder: Builder, served: str) -> dict:
    builder.mirror = f"https://github.com/={served}"
    return json.loads(builder.run("sources", "--upstream", "flashinfer", "--json").stdout)


@pytest.mark.parametrize("allow_any_sha", [True, False])
def test_submodules_come_at_their_pinned_commit_alone_where_the_server_allows(
    builder: Builder, github: Upstreams, allow_any_sha: bool
) -> None:
    process, served = start_git_daemon(github.root, allow_any_sha=allow_any_sha)
    try:
        checked_out = _sources(builder, served)["upstreams"]["flashinfer"]
        if allow_any_sha:
            # The main tree and the submodules are written side by side: the result is
            # git's own recursive clone, file for file, and stays so when run again.
            clone = builder.cache_dir.parent / "git-clone"
            subprocess.run(
                ["git", "-c", f"url.{served}.insteadOf=https://github.com/", "clone", "-q",
                 "--recurse-submodules", f"{served}flashinfer-ai/flashinfer.git", str(clone)],
                check=True, capture_output=True,
            )  # fmt: skip
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", "--recurse-submodules",
                            checked_out["commit"]], check=True, capture_output=True)  # fmt: skip
            expected = _files(clone)
            assert "3rdparty/cutlass/include/cutlass/cutlass.h" in expected
            assert _files(Path(checked_out["path"])) == expected
            _sources(builder, served)
            assert _files(Path(checked_out["path"])) == expected
    finally:
        process.terminate()
        process.wait()
    submodules = checked_out["submodules"]
    assert set(submodules) == {"3rdparty/cutlass", "3rdparty/spdlog"}
    for path, sub in submodules.items():
        work = pygit2.Repository(str(Path(checked_out["path"]) / path))
        assert str(work.head.target) == sub["commit"]
        (mirror,) = (builder.cache_dir / "mirrors").glob(f"*{Path(sub['url']).stem}.git-*")
        refs = set(pygit2.Repository(str(mirror)).references)
        if allow_any_sha:  # the commit alone, shallow: what --shallow-submodules fetches
            assert refs == {f"refs/builder/pinned/{sub['commit']}"}
            assert (mirror / "shallow").is_file()
        else:  # the server refused the id: every branch and tag instead, as before
            assert "refs/heads/main" in refs and not (mirror / "shallow").exists()


def test_a_checkout_from_mirrors_already_cached_is_the_same_tree(
    builder: Builder, github: Upstreams, tmp_path: Path
) -> None:
    """No fetch to wait for: the main tree and the submodules are written at once, and
    neither removes the other's files."""
    first = json.loads(builder.run("sources", "--json").stdout)["upstreams"]
    again = Builder(builder.data_dir, tmp_path / "again", github.mirror, tmp_path / "wheels")
    seed_cache(again, builder.cache_dir, folders=("mirrors",))
    second = json.loads(again.run("sources", "--json").stdout)["upstreams"]
    for name, checkout in first.items():
        expected = _files(Path(checkout["path"]))
        assert _files(Path(second[name]["path"])) == expected, name
    cutlass = Path(second["flashinfer"]["path"]) / "3rdparty/cutlass"
    assert (cutlass / "include/cutlass/cutlass.h").is_file()
    work = Path(second["flashinfer"]["path"]).parent
    assert sorted(p.name for p in work.iterdir()) == sorted(second)  # nothing left aside


def test_the_fetch_bench_runs_in_its_smallest_form(tmp_path: Path) -> None:
    """bench/fetch_bench.py, once each way: it cannot rot unnoticed."""
    out = tmp_path / "fetch.json"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench/fetch_bench.py"), "--repeat", "1",
         "--out", str(out)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert len(result["seconds"]["git"]) == len(result["seconds"]["builder"]) == 1
    assert result["ratio_builder_to_git"] > 0
