"""Stage 3 for a release-sourced upstream: the fork wheel is the released wheel, repacked.

The fork commit's tree is the released wheel's files with the series applied. The wheel is
written from that tree as it is (upstream's compiled extensions byte for byte) with the
local version `<version>+<label>.g<fork sha7>`: the `.dist-info` folder renamed, METADATA's
Version line rewritten, RECORD computed anew; byte-reproducible (builder/build/wheelfiles.py, with
the fork commit's time).
"""

from __future__ import annotations

import re
from pathlib import Path

import pygit2

from builder.build.wheelfiles import write_wheel
from builder.core.errors import BuilderError
from builder.spec.target import Fork


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


def repack(repo: pygit2.Repository, commit: str, fork: Fork, version: str, outdir: Path) -> Path:
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
    renamed.pop(f"{info_dir}/RECORD", None)  # written anew with the wheel
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
    modes = {path: (data, 0o755 if run else 0o644) for path, (data, run) in renamed.items()}
    write_wheel(wheel, modes, epoch=repo.get(commit).commit_time)
    return wheel
