"""A release-sourced fork wheel keeps the release's deflate stream for each file the series
left alone, and compresses only what it changed: the bytes pip reads are the tree's either
way (RECORD checked by wheel's own reader)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pygit2
import pytest
from wheel.wheelfile import WheelFile

from builder.build.release import import_wheel
from builder.build.repack import _ReleaseStreams, repack

RELEASE = "pkg-1.0-py3-none-any.whl"
FILES = {
    "pkg/kept.py": b"print('the release file, as it was')\n" * 200,
    "pkg/patched.py": b"VALUE = 1\n" * 100,
    "pkg/stored.bin": bytes(range(256)) * 8,
    "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
    "pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    "pkg-1.0.dist-info/RECORD": b"",
}


class _Release:
    filename = RELEASE


class _Fork:
    release = _Release()


def _release(folder: Path) -> Path:
    """A release wheel deflated at level 1, as no repack would deflate it: a member copied as
    its stream shows in its compressed size."""
    path = folder / RELEASE
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in FILES.items():
            stored = name.endswith(".bin")
            archive.writestr(
                name, data, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED, compresslevel=1
            )
    return path


def _patched(repo: pygit2.Repository, base: str) -> str:
    """A commit on `base` that changes pkg/patched.py, as the series would."""
    index = pygit2.Index()
    index.read_tree(repo.get(base).tree)
    blob = repo.create_blob(b"VALUE = 2\n" * 100)
    index.add(pygit2.IndexEntry("pkg/patched.py", blob, pygit2.enums.FileMode.BLOB))
    tree = index.write_tree(repo)
    who = pygit2.Signature("t", "t@example.invalid", 1_700_000_000, 0)
    return str(repo.create_commit(None, who, who, "patch", tree, [base]))


@pytest.fixture
def fork(tmp_path: Path) -> tuple[pygit2.Repository, str, Path]:
    release = _release(tmp_path)
    repo = pygit2.init_repository(str(tmp_path / "repo.git"), bare=True)
    return repo, _patched(repo, import_wheel(repo, release, "0" * 64)), release


def test_unchanged_files_keep_the_release_s_stream(tmp_path: Path, fork) -> None:
    repo, commit, release = fork
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    streamed = repack(repo, commit, _Fork(), "1.0+sm120.gabc", tmp_path / "a", release)
    compressed = repack(repo, commit, _Fork(), "1.0+sm120.gabc", tmp_path / "b")
    with zipfile.ZipFile(release) as old, zipfile.ZipFile(streamed) as new:
        kept = new.getinfo("pkg/kept.py")
        assert kept.compress_size == old.getinfo("pkg/kept.py").compress_size
        assert kept.CRC == old.getinfo("pkg/kept.py").CRC
        assert new.getinfo("pkg/stored.bin").compress_type == zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(compressed) as level6:
        assert level6.getinfo("pkg/kept.py").compress_size < kept.compress_size
    for wheel in (streamed, compressed):
        with WheelFile(wheel) as archive:  # reads every member against RECORD
            files = {name: archive.read(name) for name in archive.namelist()}
        with zipfile.ZipFile(wheel) as archive:
            assert archive.testzip() is None  # every member's CRC
        assert files["pkg/kept.py"] == FILES["pkg/kept.py"]
        assert files["pkg/stored.bin"] == FILES["pkg/stored.bin"]
        assert files["pkg/patched.py"] == b"VALUE = 2\n" * 100
        assert b"Version: 1.0+sm120.gabc\n" in files["pkg-1.0+sm120.gabc.dist-info/METADATA"]
    again = repack(repo, commit, _Fork(), "1.0+sm120.gabc", tmp_path, release)
    assert again.read_bytes() == streamed.read_bytes()


def test_a_stream_is_taken_only_where_it_inflates_to_the_tree_s_blob(fork) -> None:
    repo, commit, release = fork
    tree = repo.get(commit).tree
    with _ReleaseStreams(release) as streams:
        assert streams.stream("pkg/kept.py", (tree / "pkg/kept.py").id) is not None
        assert streams.stream("pkg/patched.py", (tree / "pkg/patched.py").id) is None
        assert streams.stream("pkg/stored.bin", (tree / "pkg/stored.bin").id) is None
        assert streams.stream("pkg/absent.py", (tree / "pkg/kept.py").id) is None
    data = bytearray(release.read_bytes())
    with zipfile.ZipFile(release) as archive:
        info = archive.getinfo("pkg/kept.py")
    at = info.header_offset + 30 + len(info.filename) + 8  # a byte inside its stream
    data[at] ^= 0xFF
    release.write_bytes(bytes(data))  # a cache file that changed since the import
    with _ReleaseStreams(release) as streams:
        assert streams.stream("pkg/kept.py", (tree / "pkg/kept.py").id) is None
    with _ReleaseStreams(release.with_name("absent.whl")) as streams:
        assert streams.stream("pkg/kept.py", (tree / "pkg/kept.py").id) is None
