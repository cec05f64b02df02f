"""scripts/scratch: the test run's temporary files on a journaled loop file system, where the
temporary folder is on ext4 without a journal (docs/test-times.md, 2026-12-07). Real loop
mounts and real mkfs; root only, as scripts/test uses it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SCRATCH = REPO_ROOT / "scripts/scratch"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not Path("/dev/loop-control").exists(),
    reason="needs root, mkfs.ext4 and loop devices",
)


def _scratch(*args: str, tmpdir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    return subprocess.run([SCRATCH, *args], env=env, capture_output=True, text=True)


@pytest.fixture
def small_ext4(tmp_path: Path):
    """Mount a 64 MB ext4 file system, with or without a journal, on tmp_path/NAME."""
    mounted = []

    def make(name: str, *features: str) -> Path:
        image, point = tmp_path / f"{name}.img", tmp_path / name
        point.mkdir()
        subprocess.run(["truncate", "-s", "64M", image], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", *features, image], check=True)
        subprocess.run(["mount", "-o", "loop", image, point], check=True)
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", point], check=True)


def test_needed_only_on_ext4_without_a_journal(small_ext4) -> None:
    assert _scratch("needed", tmpdir=small_ext4("bare", "-O", "^has_journal")).returncode == 0
    assert _scratch("needed", tmpdir=small_ext4("journaled")).returncode == 1
    assert _scratch("needed", tmpdir=Path("/dev/shm")).returncode == 1  # tmpfs


def _mount(folder: Path) -> None:
    made = _scratch("mount", str(folder))
    if made.returncode and "under 30 GB free" in made.stderr:
        pytest.skip(made.stderr.strip())
    assert made.returncode == 0, made.stderr


def _mounted(point: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", point]).returncode == 0


def test_mount_gives_a_journaled_folder_and_release_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "scratch"
    _mount(folder)
    try:
        point = folder / "fs"
        assert _mounted(point)
        assert point.stat().st_mode & 0o7777 == 0o1777
        assert _scratch("needed", tmpdir=point).returncode == 1  # journaled: never needed again
        again = _scratch("mount", str(folder))  # never a second mount over a run's own
        assert again.returncode == 1 and "mounted already" in again.stderr
    finally:
        released = _scratch("release", str(folder))
    assert released.returncode == 0, released.stderr
    assert not folder.exists()


def test_release_lets_go_of_a_file_system_something_still_holds(tmp_path: Path) -> None:
    """An engine killed with its mounts inside, here a process whose folder is in it: the
    release unmounts lazily and the folder is gone at once."""
    folder = tmp_path / "scratch"
    _mount(folder)
    holder = subprocess.Popen(["sleep", "60"], cwd=folder / "fs")
    try:
        released = _scratch("release", str(folder))
        assert released.returncode == 0, released.stderr
        assert not folder.exists()
    finally:
        holder.kill()
        holder.wait()


def test_release_stale_takes_only_what_no_run_holds(tmp_path: Path) -> None:
    """Three folders a run would make (`scripts/scratch new`): an hour old with its lock
    held, an hour old with none, and one just made (its run may not have locked it yet):
    only the second is released."""
    import fcntl

    held, left, young = (Path(_scratch("new").stdout.strip()) for _ in range(3))
    try:
        for folder in (held, left, young):
            assert folder.name.startswith("builder-test-scratch.") and folder.is_dir()
            (folder / "lock").touch()
        for folder in (held, left):
            os.utime(folder, (time.time() - 3600,) * 2)
        with (held / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            result = _scratch("release-stale")
        assert result.returncode == 0, result.stderr
        assert held.exists() and young.exists() and not left.exists()
        assert f"released {left}" in result.stderr
    finally:
        for folder in (held, left, young):
            shutil.rmtree(folder, ignore_errors=True)


def test_usage_is_one_line_and_exit_2() -> None:
    result = _scratch("mount")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "usage: scripts/scratch needed | new | mount DIR | release DIR | release-stale"
    )
