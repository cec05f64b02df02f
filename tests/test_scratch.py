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


# --- entries anyone can plant in /var/tmp: never followed, never released ----------------


@pytest.fixture
def victim(tmp_path: Path, small_ext4):
    """What a user would aim root at: a mounted file system (fs) and two files beside it, in
    a folder laid out like a run's, an hour old."""
    folder = tmp_path / "victim"
    folder.mkdir()
    small_ext4("victim/fs")
    for name in ("fs.img", "lock"):
        (folder / name).write_text("precious\n")
    os.utime(folder, (time.time() - 3600,) * 2)
    return folder


def _planted(make) -> Path:
    """A folder named like a run's, made by `make(path)`, an hour old (not a young run's)."""
    entry = Path(f"/var/tmp/builder-test-scratch.planted{os.getpid()}")
    make(entry)
    os.utime(entry, (time.time() - 3600,) * 2, follow_symlinks=False)
    return entry


def _untouched(victim: Path) -> None:
    assert _mounted(victim / "fs")
    for name in ("fs.img", "lock"):
        assert (victim / name).read_text() == "precious\n"


def _release_stale_skips(entry: Path, why: str) -> None:
    result = _scratch("release-stale")
    assert result.returncode == 0, result.stderr
    line = f"scratch: skipped {entry}: {why} (only a folder root made is released)"
    assert line in result.stderr.splitlines(), result.stderr


def test_release_stale_never_follows_a_planted_symlink(victim: Path) -> None:
    entry = _planted(lambda path: path.symlink_to(victim))
    try:
        _release_stale_skips(entry, "a symlink")
        assert entry.is_symlink()
        _untouched(victim)
    finally:
        entry.unlink()


def _theirs_folder(path: Path) -> None:
    path.mkdir()
    for name in ("fs.img", "lock"):
        (path / name).write_text("theirs\n")
        os.chown(path / name, 65534, 65534)
    os.chown(path, 65534, 65534)


def _theirs_file(path: Path) -> None:
    path.write_text("theirs\n")
    os.chown(path, 65534, 65534)


def test_release_refuses_a_folder_root_did_not_make(victim: Path, tmp_path: Path) -> None:
    """`scripts/scratch release DIR` itself, given a link to the victim: exit 1, one line."""
    entry = tmp_path / "scratch"
    entry.symlink_to(victim)
    result = _scratch("release", str(entry))
    assert result.returncode == 1
    assert result.stderr == f"scratch: {entry} not released: a symlink\n"
    _untouched(victim)


@pytest.mark.parametrize(
    ("make", "why"),
    [(_theirs_folder, "owned by uid 65534, not root"), (_theirs_file, "not a directory")],
    ids=["folder", "file"],
)
def test_release_stale_leaves_what_another_user_made(make, why: str) -> None:
    entry = _planted(make)
    try:
        _release_stale_skips(entry, why)
        kept = [entry / "fs.img", entry / "lock"] if entry.is_dir() else [entry]
        assert all(path.read_text() == "theirs\n" for path in kept)
    finally:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _root_folder(path: Path) -> None:
    """A run's folder as `scripts/scratch new` and a run make it: root's, 0700, fs, fs.img
    and lock inside."""
    path.mkdir(mode=0o700)
    (path / "fs").mkdir()
    for name in ("fs.img", "lock"):
        (path / name).touch()


def _link_to_victim(name: str):
    def change(path: Path, victim: Path) -> None:
        (path / name).rename(path / f"{name}.was")
        (path / name).symlink_to(victim / name)

    return change


def _theirs(name: str):
    def change(path: Path, victim: Path) -> None:
        os.chown(path / name, 65534, 65534, follow_symlinks=False)

    return change


def _swap_kind(name: str):
    def change(path: Path, victim: Path) -> None:
        (path / name).rename(path / f"{name}.was")
        if name == "lock":
            (path / name).mkdir()
        else:
            (path / name).touch()

    return change


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_link_to_victim("fs"), "its fs is a symlink"),
        (_link_to_victim("fs.img"), "its fs.img is a symlink"),
        (_link_to_victim("lock"), "its lock is a symlink"),
        (_theirs("fs.img"), "its fs.img is owned by uid 65534, not root"),
        (_swap_kind("lock"), "its lock is a directory"),
        (_swap_kind("fs"), "its fs is a regular empty file"),
        (lambda path, victim: path.chmod(0o777), "writable by others (mode 777)"),
    ],
    ids=["fs-link", "fs.img-link", "lock-link", "fs.img-theirs", "lock-dir", "fs-file", "0777"],
)
def test_release_stale_acts_on_no_root_folder_that_is_not_as_root_made_it(
    victim: Path, change, why: str
) -> None:
    """Root's own folder where one thing is not as root made it (a link to the victim's, a
    file someone else owns, the wrong kind, a folder others can write to): nothing is
    unmounted or deleted, and the folder stays as it is."""

    def make(path: Path) -> None:
        _root_folder(path)
        change(path, victim)

    entry = _planted(make)
    before = sorted(str(path) for path in entry.iterdir())
    try:
        _release_stale_skips(entry, why)
        assert sorted(str(path) for path in entry.iterdir()) == before
        _untouched(victim)
    finally:
        shutil.rmtree(entry)


def test_a_root_folder_that_cannot_be_released_never_stops_the_run(tmp_path: Path) -> None:
    """A stale folder of root's holding a stray file (fs not mounted, so rmdir fails):
    reported in one line, left, and release-stale exits 0 (scripts/test goes on to pytest)."""

    def make(path: Path) -> None:
        _root_folder(path)
        (path / "stray").touch()

    entry = _planted(make)
    try:
        result = _scratch("release-stale")
        assert result.returncode == 0, result.stderr
        assert f"scratch: could not release {entry} (above: why); the run goes on" in result.stderr
        assert (entry / "stray").exists()
    finally:
        shutil.rmtree(entry)
