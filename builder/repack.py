"""Stage 3 for a release-sourced upstream: the fork wheel is the released wheel, repacked.

The fork commit's tree is the released wheel's files with the series applied. The wheel is
written from that tree as it is (upstream's compiled extensions byte for byte) with the
local version `<version>+<label>.g<fork sha7>`: the `.dist-info` folder renamed, METADATA's
Version line rewritten, RECORD computed anew. Fixed member order, times (the fork commit's)
and modes make it byte-reproducible.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import time
import zipfile
from pathlib import Path

import pygit2

from builder.errors import BuilderError
from builder.target import Fork

_ZIP_EPOCH = 315532800  # 1980-01-01: the earliest time a zip member can carry


def _tree_files(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = ""):
    for entry in tree:
        path = f"{prefix}{entry.name}"
        if entry.filemode == pygit2.enums.FileMode.TREE:
            yield from _tree_files(repo, repo.get(entry.id), path + "/")
        elif entry.filemode in (pygit2.enums.FileMode.BLOB, pygit2.enums.FileMode.BLOB_EXECUTABLE):
            executable = entry.filemode == pygit2.enums.FileMode.BLOB_EXECUTABLE
            yield path, repo.get(entry.id).data, executable
        else:
            raise BuilderError(f"{path}: a {entry.filemode!r} entry cannot go into a wheel")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def repack(
    repo: pygit2.Repository, commit: str, fork: Fork, version: str, outdir: Path
) -> Path:
    """The fork wheel for `commit`, written into `outdir`; returns its path."""
    assert fork.release is not None
    files = {path: (data, executable) for path, data, executable in _tree_files(
        repo, repo.get(commit).peel(pygit2.Tree)
    )}  # fmt: skip
    old_info = {path.split("/", 1)[0] for path in files if ".dist-info/" in path}
    if len(old_info) != 1:
        raise BuilderError(
            f"{fork.release.filename}: expected one top-level .dist-info folder, found "
            f"{sorted(old_info) or 'none'}"
        )
    (old_info_dir,) = old_info
    distribution = old_info_dir.removesuffix(".dist-info").rsplit("-", 1)[0]
    info_dir = f"{distribution}-{version}.dist-info"
    renamed: dict[str, tuple[bytes, bool]] = {}
    for path, payload in files.items():
        if path.startswith(old_info_dir + "/"):
            path = info_dir + path[len(old_info_dir) :]
        renamed[path] = payload
    record = f"{info_dir}/RECORD"
    renamed.pop(record, None)
    metadata_path = f"{info_dir}/METADATA"
    if metadata_path not in renamed:
        raise BuilderError(f"{fork.release.filename}: no {old_info_dir}/METADATA")
    metadata, _ = renamed[metadata_path]
    metadata, count = re.subn(
        rb"(?m)^Version: .*$", f"Version: {version}".encode(), metadata, count=1
    )
    if not count:
        raise BuilderError(f"{fork.release.filename}: METADATA has no Version line")
    renamed[metadata_path] = (metadata, False)

    tags = fork.release.filename.removesuffix(".whl").split("-")[-3:]
    wheel = outdir / f"{distribution}-{version}-{'-'.join(tags)}.whl"
    stamp = time.gmtime(max(repo.get(commit).commit_time, _ZIP_EPOCH))[:6]
    # Packages first, sorted; .dist-info last, RECORD at the very end (as wheel tools do).
    order = sorted(renamed, key=lambda p: (p.startswith(info_dir + "/"), p))
    record_text = io.StringIO()
    lines = csv.writer(record_text, lineterminator="\n")  # quotes paths holding commas
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in order:
            data, executable = renamed[path]
            info = zipfile.ZipInfo(path, date_time=stamp)
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
            lines.writerow((path, _record_hash(data), len(data)))
        lines.writerow((record, "", ""))
        info = zipfile.ZipInfo(record, date_time=stamp)
        info.external_attr = 0o100644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, record_text.getvalue())
    return wheel
