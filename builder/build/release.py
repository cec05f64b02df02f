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

from builder.build.remote_wheel import read_answer
from builder.build.simple_index import read_project
from builder.build.zip_bounds import END_BYTES, open_archive, read_member
from builder.core import http_client, progress
from builder.core.cache import partial_beside, sha256_file
from builder.core.errors import BuilderError
from builder.core.settings import Mirrors
from builder.core.untrusted import has_control, printable
from builder.core.urls import redact
from builder.spec.target import Fork

IMPORTER = pygit2.Signature("builder release import", "builder@localhost", 0, 0)
_TIMEOUT_S = 60
_DEADLINE_S = 30 * 60  # one release file whole: a slow link's half hour, not a drip's forever
RELEASE_LIMIT = 2 << 30  # bytes of a release file downloaded: sglang 0.5.23's wheel is 39 MB
# Bytes of one member imported, and of all of them: sglang 0.5.23's largest (a Rust
# extension) is 24 MB, all 6,396 make 123 MB.
IMPORT_MEMBER_LIMIT = 1 << 30
IMPORT_TOTAL_LIMIT = 8 << 30


@contextlib.contextmanager
def _open(url: str, what: str):
    try:
        with http_client.open_url(
            url, what, timeout=_TIMEOUT_S, deadline=_DEADLINE_S,
            hint="; point it at a mirror with --mirror FROM=TO or BUILDER_MIRRORS",
        ) as response:  # fmt: skip
            yield response
    except urllib.error.HTTPError as exc:
        raise BuilderError(f"{what}: {printable(redact(url))} answered {exc.code}") from None


def _file_link(index: str, dist: str, filename: str, what: str) -> tuple[str, str | None]:
    """(URL, the index's sha256 or None) of `filename` on the index."""
    try:
        found = read_project(index, dist).get(filename)
    except BuilderError as exc:
        raise type(exc)(f"{what}: {exc}") from None  # Unreachable stays Unreachable
    if found is None:
        raise BuilderError(f"{what}: {redact(index)} does not offer {filename} for {dist}")
    return found.url, found.sha256


def cached(cache_dir: Path, filename: str) -> Path:
    """Where a release file is kept in the cache (`download` puts it there)."""
    return cache_dir / "releases" / filename


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
    path = cached(cache_dir, filename)
    if pinned and path.is_file() and sha256_file(path) == pinned:
        return path, pinned
    index = mirrors.rewrite(fork.url)
    link, offered = _file_link(index, fork.wheel.dist_name, filename, what)
    expected = pinned or offered
    if expected is None:
        raise BuilderError(f"{what}: the index gives no sha256 for {filename}: not used")
    url = mirrors.rewrite(link)
    digest = hashlib.sha256()
    shown = printable(redact(url))
    with partial_beside(path) as partial:
        with progress.task(f"download {filename}") as bar, _open(url, what) as response:
            declared = (response.headers.get("Content-Length") or "").strip()
            total = int(declared) if declared.isdigit() else None
            if total is not None and total > RELEASE_LIMIT:
                raise BuilderError(
                    f"{what}: {shown} declares {total:,} bytes, over the "
                    f"{RELEASE_LIMIT >> 20} MiB builder downloads of a release: not used"
                )
            bar.update(bar.task_ids[0], total=total or None)
            with partial.open("wb") as out:
                for block in iter(lambda: read_answer(response, 1 << 20, url, what), b""):
                    digest.update(block)
                    out.write(block)
                    bar.advance(bar.task_ids[0], len(block))
                    if out.tell() > RELEASE_LIMIT:
                        raise BuilderError(
                            f"{what}: {shown} is over the {RELEASE_LIMIT >> 20} MiB builder "
                            "downloads of a release: not used"
                        )
        if digest.hexdigest() != expected:
            said = "the pin says" if pinned else "the index says"
            raise BuilderError(
                f"{what}: {shown} has sha256 {digest.hexdigest()}, {said} {expected} "
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


def _member_time(info: zipfile.ZipInfo, where: str) -> int:
    try:
        return calendar.timegm((*info.date_time, 0, 0, 0))
    except ValueError:  # a DOS date of month 0 or 13-15
        raise BuilderError(
            f"{where}: member '{printable(info.filename)}' has no valid time {info.date_time}"
        ) from None


def _checked_path(info: zipfile.ZipInfo, where: str) -> str:
    """A member's name as a path in the commit: relative, inside the archive, no control
    characters, no `.git`; git itself refuses the rest (an empty part, a `.` part)."""
    name = info.filename
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "\\" in name or has_control(name):
        raise BuilderError(f"{where}: member '{printable(name)}' is no path inside the archive")
    if any(part.lower() == ".git" for part in parts):
        raise BuilderError(f"{where}: member '{printable(name)}' is inside a .git folder")
    return name


def import_wheel(repo: pygit2.Repository, wheel: Path, sha256: str) -> str:
    """The wheel's files as one parentless commit in `repo`; its SHA depends only on the
    wheel's bytes (content, modes and member times). Each member is bounded
    (builder.build.zip_bounds); what the archive declares in all is too."""
    index = pygit2.Index()
    newest = 0
    with wheel.open("rb") as source:
        source.seek(-min(wheel.stat().st_size, END_BYTES), 2)
        end = source.read()
        with open_archive(source, end, wheel.name) as archive:
            members = [info for info in archive.infolist() if not info.is_dir()]
            declared = sum(info.file_size for info in members)
            if declared > IMPORT_TOTAL_LIMIT:
                raise BuilderError(
                    f"{wheel.name}: its members declare {declared:,} bytes, over the "
                    f"{IMPORT_TOTAL_LIMIT >> 30} GiB builder imports: not used"
                )
            for info in members:
                path = _checked_path(info, wheel.name)
                executable = (info.external_attr >> 16) & 0o111
                mode = FileMode.BLOB_EXECUTABLE if executable else FileMode.BLOB
                data = read_member(archive, info, IMPORT_MEMBER_LIMIT, wheel.name)
                try:
                    index.add(pygit2.IndexEntry(path, repo.create_blob(data), mode))
                except (ValueError, pygit2.GitError) as exc:
                    raise BuilderError(
                        f"{wheel.name}: member '{printable(path)}' is no path git takes "
                        f"({printable(exc)})"
                    ) from None
                newest = max(newest, _member_time(info, wheel.name))
    tree = index.write_tree(repo)
    when = pygit2.Signature(IMPORTER.name, IMPORTER.email, newest, 0)
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except ValueError:
        raise BuilderError(f"{printable(wheel.name)}: not a wheel's file name") from None
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
