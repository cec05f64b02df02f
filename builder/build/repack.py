"""Stage 3 for a release-sourced upstream: the fork wheel is the released wheel, repacked.

The fork commit's tree is the released wheel's files with the series applied. The wheel is
written from that tree as it is (upstream's compiled extensions byte for byte) with the
local version `<version>+<label>.g<fork sha7>`: the `.dist-info` folder renamed, METADATA's
Version line rewritten, RECORD computed anew; byte-reproducible (builder/build/wheelfiles.py, with
the fork commit's time). A file the series left as it was keeps the release's own deflate
stream, taken from the release file in the cache once it inflates to the tree's blob: vLLM's
700 MB are not compressed again (a file that does not match, or no release file, is).
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pygit2
from pygit2.enums import FileMode

from builder.build.release import IMPORT_MEMBER_LIMIT
from builder.build.wheelfiles import Deflated, copyable, write_wheel
from builder.build.zip_bounds import END_BYTES, ZIP_ERRORS, check_member, open_archive
from builder.core.errors import BuilderError
from builder.spec.target import Fork

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and extra's lengths


def _tree_files(
    repo: pygit2.Repository, tree: pygit2.Tree
) -> Iterator[tuple[str, pygit2.Oid, bool]]:
    """(path, blob id, executable) of every file under `tree`."""
    folders = [("", tree)]
    while folders:
        prefix, folder = folders.pop()
        for entry in folder:
            path = f"{prefix}{entry.name}"
            if entry.filemode == FileMode.TREE:
                folders.append((path + "/", repo.get(entry.id)))
            elif entry.filemode in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
                yield path, entry.id, entry.filemode == FileMode.BLOB_EXECUTABLE
            else:
                raise BuilderError(f"{path}: a {entry.filemode!r} entry cannot go into a wheel")


class _ReleaseStreams:
    """The deflate streams of the release file, each given only where it inflates to the
    blob the tree holds at that path."""

    def __init__(self, release: Path | None) -> None:
        self._file = None
        self._members: dict[str, zipfile.ZipInfo] = {}
        if release is None or not release.is_file():
            return
        self._file = release.open("rb")
        try:
            self._file.seek(-min(release.stat().st_size, END_BYTES), 2)
            with open_archive(self._file, self._file.read(), release.name) as archive:
                self._members = {info.filename: info for info in archive.infolist()}
        except BuilderError:
            self._members = {}

    def __enter__(self) -> _ReleaseStreams:
        return self

    def __exit__(self, *_) -> None:
        if self._file is not None:
            self._file.close()

    def stream(self, path: str, blob: pygit2.Oid) -> Deflated | None:
        info = self._members.get(path)
        if (
            self._file is None
            or info is None
            or info.compress_type != zipfile.ZIP_DEFLATED
            or not copyable(info.file_size)
        ):
            return None
        try:
            # The import's bounds (encrypted, too large, a zip bomb's ratio): inflated only
            # within them; a member outside them is the tree's blob, compressed again.
            check_member(info, IMPORT_MEMBER_LIMIT, self._file.name)
            self._file.seek(info.header_offset)
            header = self._file.read(_LOCAL_HEADER.size)
            if len(header) != _LOCAL_HEADER.size:
                return None
            signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
            if signature != b"PK\x03\x04":
                return None
            self._file.seek(info.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
            stream = self._file.read(info.compress_size)
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            data = inflater.decompress(stream, info.file_size + 1)
        except (*ZIP_ERRORS, zlib.error, BuilderError):
            return None
        if len(data) != info.file_size or not inflater.eof or pygit2.hash(data) != blob:
            return None
        return Deflated.of(stream, data)


def repack(
    repo: pygit2.Repository,
    commit: str,
    fork: Fork,
    version: str,
    outdir: Path,
    release: Path | None = None,
) -> Path:
    """The fork wheel for `commit`, written into `outdir`; returns its path. `release`, the
    release file the tree was imported from, lends its deflate streams."""
    assert fork.release is not None
    files = {path: (blob, run) for path, blob, run in _tree_files(repo, repo.get(commit).tree)}
    old_info = {path.split("/", 1)[0] for path in files if ".dist-info/" in path}
    if len(old_info) != 1:
        raise BuilderError(
            f"{fork.release.filename}: expected one top-level .dist-info folder, found "
            f"{sorted(old_info) or 'none'}"
        )
    (old_info_dir,) = old_info
    distribution = old_info_dir.removesuffix(".dist-info").rsplit("-", 1)[0]
    info_dir = f"{distribution}-{version}.dist-info"
    files.pop(f"{old_info_dir}/RECORD", None)  # written anew with the wheel
    if f"{old_info_dir}/METADATA" not in files:
        raise BuilderError(f"{fork.release.filename}: no {old_info_dir}/METADATA")
    metadata_blob, _ = files.pop(f"{old_info_dir}/METADATA")
    metadata, count = re.subn(
        rb"(?m)^Version: .*$", f"Version: {version}".encode(), repo.get(metadata_blob).data, count=1
    )
    if not count:
        raise BuilderError(f"{fork.release.filename}: METADATA has no Version line")

    members: dict[str, tuple[bytes | Deflated, int]] = {f"{info_dir}/METADATA": (metadata, 0o644)}
    with _ReleaseStreams(release) as streams:
        for path, (blob, run) in files.items():
            payload = streams.stream(path, blob) or repo.get(blob).data
            if path.startswith(old_info_dir + "/"):
                path = info_dir + path[len(old_info_dir) :]
            members[path] = (payload, 0o755 if run else 0o644)
    tags = fork.release.filename.removesuffix(".whl").split("-")[-3:]
    wheel = outdir / f"{distribution}-{version}-{'-'.join(tags)}.whl"
    write_wheel(wheel, members, epoch=repo.get(commit).commit_time)
    return wheel
