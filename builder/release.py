"""Stage 1 for a release-sourced upstream: a published wheel, turned into a commit.

Some upstreams publish no sdist and build their wheels with toolchains a build host should
not need (sglang after 0.5.10 bundles PyO3 Rust extensions). For those, pin.toml names the
released wheel (index, filename, sha256). builder downloads it from the index (rewritten by
`--mirror`), checks the sha256, and writes its files as one commit with pygit2: fixed
author, committer and message, the time of the newest file in the archive. The commit SHA
is therefore a function of the wheel's bytes, recorded in pin.toml and checked like a git
pin; the patch series applies on it as on any upstream commit.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import urllib.error
import zipfile
from pathlib import Path

import pygit2
from packaging.utils import parse_wheel_filename
from pygit2.enums import FileMode

from builder import http_client, progress
from builder.cache import partial_beside, sha256_file
from builder.errors import BuilderError
from builder.settings import Mirrors
from builder.simple_index import read_project
from builder.target import Fork
from builder.urls import redact

IMPORTER = pygit2.Signature("builder release import", "builder@localhost", 0, 0)
_TIMEOUT_S = 60
_DEADLINE_S = 30 * 60  # one release file whole: a slow link's half hour, not a drip's forever


@contextlib.contextmanager
def _open(url: str, what: str):
    try:
        with http_client.open_url(
            url, what, timeout=_TIMEOUT_S, deadline=_DEADLINE_S,
            hint="; point it at a mirror with --mirror FROM=TO or BUILDER_MIRRORS",
        ) as response:  # fmt: skip
            yield response
    except urllib.error.HTTPError as exc:
        raise BuilderError(f"{what}: {redact(url)} answered {exc.code}") from None


def _file_link(index: str, dist: str, filename: str, what: str) -> tuple[str, str | None]:
    """(URL, the index's sha256 or None) of `filename` on the index."""
    try:
        found = read_project(index, dist).get(filename)
    except BuilderError as exc:
        raise type(exc)(f"{what}: {exc}") from None  # Unreachable stays Unreachable
    if found is None:
        raise BuilderError(f"{what}: {redact(index)} does not offer {filename} for {dist}")
    return found.url, found.sha256


def download(
    cache_dir: Path,
    fork: Fork,
    mirrors: Mirrors,
    what: str,
    filename: str | None = None,
) -> tuple[Path, str]:
    """(path, sha256) of a release file in `<cache>/releases/`, fetched once: the pinned one
    (checked against the pin), or `filename` (checked against the index's own sha256, for a
    refresh to write into the pin for review)."""
    release = fork.release
    assert release is not None
    filename = filename or release.filename
    pinned = release.sha256 if filename == release.filename else None
    path = cache_dir / "releases" / filename
    if pinned and path.is_file() and sha256_file(path) == pinned:
        return path, pinned
    index = mirrors.rewrite(fork.url)
    link, offered = _file_link(index, fork.wheel.dist_name, filename, what)
    expected = pinned or offered
    if expected is None:
        raise BuilderError(f"{what}: the index gives no sha256 for {filename}: not used")
    url = mirrors.rewrite(link)
    digest = hashlib.sha256()
    with partial_beside(path) as partial:
        with progress.task(f"download {filename}") as bar, _open(url, what) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            bar.update(bar.task_ids[0], total=total)
            with partial.open("wb") as out:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
                    bar.advance(bar.task_ids[0], len(block))
        if digest.hexdigest() != expected:
            said = "the pin says" if pinned else "the index says"
            raise BuilderError(
                f"{what}: {redact(url)} has sha256 {digest.hexdigest()}, {said} {expected} "
                "(a different file under that name: not used)"
            )
    return path, expected


def onto_filename(fork: Fork, onto: str) -> str:
    """`--onto` for a release-sourced upstream: a wheel file name, or a version whose file
    has the pinned one's tags (0.5.24 -> sglang-0.5.24-cp312-cp312-manylinux_2_34_x86_64.whl)."""
    assert fork.release is not None
    if onto.endswith(".whl"):
        return onto
    version = onto.removeprefix("v")
    name, _, tags = fork.release.filename.partition(f"-{fork.version}-")
    return f"{name}-{version}-{tags}"


def _member_time(info: zipfile.ZipInfo) -> int:
    return calendar.timegm((*info.date_time, 0, 0, 0))


def import_wheel(repo: pygit2.Repository, wheel: Path, sha256: str) -> str:
    """The wheel's files as one parentless commit in `repo`; its SHA depends only on the
    wheel's bytes (content, modes and member times)."""
    index = pygit2.Index()
    newest = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            path = Path(info.filename)
            if path.is_absolute() or ".." in path.parts:
                raise BuilderError(f"{wheel.name}: member {info.filename!r} leaves the archive")
            executable = (info.external_attr >> 16) & 0o111
            mode = FileMode.BLOB_EXECUTABLE if executable else FileMode.BLOB
            blob = repo.create_blob(archive.read(info))
            index.add(pygit2.IndexEntry(info.filename, blob, mode))
            newest = max(newest, _member_time(info))
    tree = index.write_tree(repo)
    when = pygit2.Signature(IMPORTER.name, IMPORTER.email, newest, 0)
    name, version, _, _ = parse_wheel_filename(wheel.name)
    message = f"{name} {version}: the files of {wheel.name}\n\nsha256 {sha256}\n"
    return str(repo.create_commit(None, when, when, message, tree, []))


def release_commit(repo: pygit2.Repository, fork: Fork, wheel: Path, what: str) -> str:
    """Import the wheel into the mirror `repo` and check the commit against the pin."""
    release = fork.release
    assert release is not None
    commit = import_wheel(repo, wheel, release.sha256)
    if commit != fork.commit:
        raise BuilderError(
            f"{what}: the files of {release.filename} make commit {commit}, the pin says "
            f'{fork.commit} (set commit = "{commit}" if the file is the one you meant)'
        )
    repo.references.create(f"refs/releases/{release.filename}", commit, force=True)
    return commit


def commit_sha256(repo: pygit2.Repository, commit: str) -> str:
    """The sha256 of the release file an imported commit was made from (its message)."""
    for line in repo.get(commit).message.splitlines():
        if line.startswith("sha256 "):
            return line.split()[1]
    raise BuilderError(f"commit {commit[:12]} is not a release import")
