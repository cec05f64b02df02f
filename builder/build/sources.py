"""Stage 1: upstream sources at their pinned commits, with pygit2.

Each upstream (and each submodule) has a bare mirror in the cache, fetched only when the
pinned commit is missing (shallow where the remote allows it). A work directory per target
and upstream is a normal repository that borrows the mirror's objects (git alternates), so
a checkout copies no history. The checked-out commit is verified against the pin.
"""

from __future__ import annotations

import concurrent.futures
import configparser
import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pygit2
from pygit2.enums import CheckoutStrategy, ObjectType

from builder.build import release
from builder.core import http_client, progress
from builder.core.cache import remove_tree, staging_dir
from builder.core.errors import BuilderError, Unreachable
from builder.core.settings import Mirrors
from builder.core.untrusted import printable
from builder.core.urls import redact
from builder.spec.target import Fork

ALL_REFS = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
_CLEAN_CHECKOUT = (
    CheckoutStrategy.FORCE | CheckoutStrategy.REMOVE_UNTRACKED | CheckoutStrategy.REMOVE_IGNORED
)


@dataclass(frozen=True)
class Submodule:
    path: str
    url: str
    commit: str


@dataclass(frozen=True)
class Checkout:
    """A work directory at a verified commit, with its submodules checked out."""

    name: str
    path: Path
    commit: str
    submodules: tuple[Submodule, ...]


class _FetchProgress(pygit2.RemoteCallbacks):
    def __init__(self, bar, url: str, what: str) -> None:
        super().__init__()
        self._bar = bar
        self._url = url
        self._what = what
        self._gave = False

    def transfer_progress(self, stats: pygit2.remotes.TransferProgress) -> None:
        if self._bar is None:  # one of several fetches side by side: counted by the caller
            return
        task_id = self._bar.task_ids[0]
        self._bar.update(task_id, total=stats.total_objects, completed=stats.received_objects)

    def credentials(self, url: str, username_from_url: str | None, allowed_types):
        if allowed_types & pygit2.enums.CredentialType.SSH_KEY:
            return pygit2.KeypairFromAgent(username_from_url or "git")
        # HTTP: the login written in the mirror URL, else ~/.netrc's (or the keyring's) for
        # the host over https, given once; libgit2 asks again after a refusal, and that ends
        # the fetch. `url` is where libgit2 is now, after any redirect: the mirror's login
        # goes to the mirror's own origin only, never to one it redirects to.
        mirror, written = http_client.split_credentials(self._url)
        if http_client.origin(url) != http_client.origin(mirror):
            raise BuilderError(
                f"{self._what}: {redact(mirror)} redirected to another origin, "
                f"{printable(redact(url))}, which asks for credentials: withheld (the "
                "mirror's go to its own scheme, host and port only); give the URL it "
                "redirects to as the mirror if you trust that host"
            )
        found = None
        if not self._gave:
            found = written or http_client.stored_login(url, self._what)
        if found is not None and allowed_types & pygit2.enums.CredentialType.USERPASS_PLAINTEXT:
            self._gave = True
            return pygit2.UserPass(*found)
        refused = "refused the credentials given" if self._gave else "asks for credentials"
        raise BuilderError(
            f"{self._what}: {printable(redact(url))} {refused}: give USER:TOKEN@ in the "
            "mirror's URL (--mirror), or (https) the host's login in ~/.netrc or the keyring; "
            "none is printed or recorded"
        )


def _mirror_path(cache_dir: Path, url: str) -> Path:
    """Mirrors are keyed on the pinned URL, so switching a site mirror reuses the cache."""
    parts = urlsplit(url)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", (parts.path or url).strip("/"))[-60:]
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return cache_dir / "mirrors" / f"{slug}-{digest}"


def _open_or_create_mirror(path: Path) -> pygit2.Repository:
    if path.is_dir():
        try:
            return pygit2.Repository(str(path))
        except pygit2.GitError:
            progress.warn(f"{path}: damaged mirror, fetching it again")
            remove_tree(path)
    with staging_dir(path) as staging:
        pygit2.init_repository(str(staging), bare=True)
    return pygit2.Repository(str(path))


def _has_commit(repo: pygit2.Repository, commit: str) -> bool:
    try:
        obj = repo.get(commit)
    except (ValueError, pygit2.GitError):
        return False
    return obj is not None and obj.type == ObjectType.COMMIT


def _fetch(
    repo: pygit2.Repository,
    url: str,
    refspecs: list[str],
    shallow: bool,
    what: str,
    show: bool = True,
) -> None:
    remote = repo.remotes.create_anonymous(url)
    with progress.task(f"fetch {redact(url)}") if show else contextlib.nullcontext() as bar:
        callbacks = _FetchProgress(bar, url, what)
        try:
            if shallow:
                try:
                    remote.fetch(refspecs, callbacks=callbacks, depth=1)
                    return
                except pygit2.GitError as exc:
                    if "shallow" not in str(exc):
                        raise
            remote.fetch(refspecs, callbacks=callbacks)
        except pygit2.GitError as exc:
            raise Unreachable(
                f"{what}: fetching {redact(url)} failed: {exc} (no access to it from here? "
                "point it at a mirror with --mirror FROM=TO or BUILDER_MIRRORS)"
            ) from None


_NO_ANSWER = re.compile(r"failed to connect|failed to resolve address|timed out", re.IGNORECASE)


def _fetch_commit(repo: pygit2.Repository, url: str, commit: str, show: bool, what: str) -> bool:
    """Only `commit`, at depth 1, as `git clone --shallow-submodules` asks for a submodule;
    False where the server does not hand out a commit by its id (or not shallow). A server
    that does not answer at all is not asked a second time."""
    remote = repo.remotes.create_anonymous(url)
    with progress.task(f"fetch {redact(url)}") if show else contextlib.nullcontext() as bar:
        try:
            remote.fetch(
                [f"+{commit}:refs/builder/pinned/{commit}"],
                callbacks=_FetchProgress(bar, url, what),
                depth=1,
            )
        except pygit2.GitError as exc:
            if _NO_ANSWER.search(str(exc)):
                raise Unreachable(
                    f"{what}: fetching {redact(url)} failed: {exc} (no access to it from "
                    "here? point it at a mirror with --mirror FROM=TO or BUILDER_MIRRORS)"
                ) from None
            return False
    return _has_commit(repo, commit)


def _advertised_commit(repo: pygit2.Repository, url: str, ref: str, what: str) -> str | None:
    """The commit `ref` points at on the remote now, read from its ref advertisement (what
    `git ls-remote` prints; no object is fetched); None where it has no such ref."""
    remote = repo.remotes.create_anonymous(url)
    try:
        answer = remote.list_heads(_FetchProgress(None, url, what))
        heads = {head.name: str(head.oid) for head in answer}
    except pygit2.GitError as exc:
        raise Unreachable(
            f"{what}: reading the refs of {redact(url)} failed: {exc} (no access to it from "
            "here? point it at a mirror with --mirror FROM=TO or BUILDER_MIRRORS)"
        ) from None
    return heads.get(f"{ref}^{{}}", heads.get(ref))  # an annotated tag: the commit it names


def ref_commit(cache_dir: Path, url: str, ref: str, mirrors: Mirrors, what: str) -> str | None:
    """The commit `ref` names at `url` (rewritten by `mirrors`) now; nothing is fetched."""
    repo = _open_or_create_mirror(_mirror_path(cache_dir, url))
    return _advertised_commit(repo, mirrors.rewrite(url), ref, what)


def ensure_commit(
    cache_dir: Path,
    url: str,
    commit: str,
    mirrors: Mirrors,
    what: str,
    ref: str | None = None,
    show: bool = True,
) -> Path:
    """The mirror holding `commit`, fetched from `url` (rewritten by `mirrors`) if needed:
    through `ref` when given, else the commit alone, else (a server that will not hand it
    out by id) every branch and tag. A pinned `ref` is read from the remote and checked to
    point at `commit` on every call, the commit cached or not: a tag moved upstream is found
    on the next run, not only on a cold cache. Where the remote cannot be reached and the
    commit is cached, that is a warning: an offline rebuild still builds the pinned commit."""
    path = _mirror_path(cache_dir, url)
    repo = _open_or_create_mirror(path)
    effective = mirrors.rewrite(url)
    cached = _has_commit(repo, commit)
    if ref:
        try:
            tip = _advertised_commit(repo, effective, ref, what)
        except Unreachable as exc:
            if not cached:
                raise
            # Offline with the pinned commit at hand: the commit is what is verified; the
            # ref only tells whether upstream moved it, which the next connected run says.
            progress.warn(f"{exc}; building the pinned commit from the cache, {ref} unchecked")
            return path
        if tip is None:
            raise BuilderError(f"{what}: {redact(effective)} has no ref {ref}")
        if tip != commit:
            raise BuilderError(
                f"{what}: {ref} at {redact(effective)} is commit {tip}, the pin says {commit}"
            )
    if cached:
        return path
    if ref:
        _fetch(repo, effective, [f"+{ref}:{ref}"], shallow=True, what=what, show=show)
    elif not _fetch_commit(repo, effective, commit, show, what):
        _fetch(repo, effective, ALL_REFS, shallow=False, what=what, show=show)
    if not _has_commit(repo, commit):
        raise BuilderError(
            f"{what}: commit {commit} is not on any branch or tag of {redact(effective)}"
        )
    return path


def fetch_ref(cache_dir: Path, url: str, ref: str, mirrors: Mirrors, what: str) -> tuple[str, str]:
    """(commit, full ref name) of a tag, branch or commit SHA of the upstream at `url`."""
    repo = _open_or_create_mirror(_mirror_path(cache_dir, url))
    if re.fullmatch(r"[0-9a-f]{40}", ref) and _has_commit(repo, ref):
        return ref, ref
    candidates = [ref] if ref.startswith("refs/") else [f"refs/tags/{ref}", f"refs/heads/{ref}"]
    effective = mirrors.rewrite(url)
    _fetch(repo, effective, [f"+{c}:{c}" for c in candidates], shallow=True, what=what)
    for candidate in candidates:
        if candidate in repo.references:
            return str(repo.references[candidate].peel(pygit2.Commit).id), candidate
    if re.fullmatch(r"[0-9a-f]{40}", ref):
        _fetch(repo, effective, ALL_REFS, shallow=False, what=what)
        if _has_commit(repo, ref):
            return ref, ref
    raise BuilderError(f"--onto {ref}: no such tag, branch or commit at {redact(effective)}")


def _existing_workdir(path: Path, mirror: Path) -> pygit2.Repository | None:
    try:
        repo = pygit2.Repository(str(path))
        if (Path(repo.path) / "objects/info/alternates").read_text() == f"{mirror / 'objects'}\n":
            return repo
    except (pygit2.GitError, FileNotFoundError):
        pass
    return None


def open_workdir(path: Path, mirror: Path) -> pygit2.Repository:
    """A work repository borrowing `mirror`'s objects; recreated if missing or damaged."""
    if repo := _existing_workdir(path, mirror):
        return repo
    alternates = f"{mirror / 'objects'}\n"
    remove_tree(path)
    with staging_dir(path) as staging:
        pygit2.init_repository(str(staging))
        (staging / ".git/objects/info/alternates").write_text(alternates)
    return pygit2.Repository(str(path))


def checkout_commit(repo: pygit2.Repository, commit: str) -> None:
    """Make the work tree exactly `commit` (detached): no local edits, no stray files."""
    target = repo.get(commit)
    repo.checkout_tree(target, strategy=_CLEAN_CHECKOUT)
    repo.set_head(target.id)
    if str(repo.head.target) != commit:
        raise BuilderError(
            f"{repo.workdir}: checkout ended at {repo.head.target}, expected {commit}"
        )


def _resolve_submodule_url(parent_url: str, url: str) -> str:
    if not url.startswith(("./", "../")):
        return url
    base = parent_url.rstrip("/")
    for part in url.split("/"):
        if part == "..":
            base = base.rsplit("/", 1)[0]
        elif part not in (".", ""):
            base = f"{base}/{part}"
    return base


def read_submodules(repo: pygit2.Repository, commit: str, parent_url: str) -> list[Submodule]:
    """Submodules of `commit` from its .gitmodules and gitlinks (not from the work tree)."""
    tree = repo.get(commit).tree
    if ".gitmodules" not in tree:
        return []
    parser = configparser.ConfigParser(interpolation=None)
    text = tree[".gitmodules"].data.decode()
    parser.read_string("\n".join(line.strip() for line in text.splitlines()))
    found = []
    for section in parser.sections():
        path = parser.get(section, "path", fallback=None)
        url = parser.get(section, "url", fallback=None)
        if not path or not url:
            raise BuilderError(f".gitmodules at {commit[:12]}: [{section}] lacks path or url")
        try:
            entry = tree[path]
        except KeyError:
            continue  # declared but not in the tree at this commit
        if entry.filemode != pygit2.enums.FileMode.COMMIT:
            continue
        found.append(Submodule(path, _resolve_submodule_url(parent_url, url), str(entry.id)))
    return found


def checkout_submodules(
    cache_dir: Path, repo: pygit2.Repository, commit: str, url: str, mirrors: Mirrors, what: str
) -> tuple[Submodule, ...]:
    submodules = tuple(read_submodules(repo, commit, url))
    root = Path(repo.workdir)
    mirror_of = _ensure_submodules(cache_dir, submodules, mirrors, what)
    for sub in submodules:
        sub_repo = open_workdir(root / sub.path, mirror_of[sub])
        checkout_commit(sub_repo, sub.commit)
        label = f"{what} submodule {sub.path}"
        checkout_submodules(cache_dir, sub_repo, sub.commit, sub.url, mirrors, label)
    return submodules


_PARALLEL_FETCHES = 8


def _ensure_submodules(
    cache_dir: Path, submodules: tuple[Submodule, ...], mirrors: Mirrors, what: str
) -> dict[Submodule, Path]:
    """Each submodule's mirror with its commit, the missing ones fetched side by side (one
    worker per mirror: two submodules of one URL share it)."""
    by_url: dict[str, list[Submodule]] = {}
    for sub in submodules:
        by_url.setdefault(sub.url, []).append(sub)

    def fetch_all(subs: list[Submodule], show: bool) -> dict[Submodule, Path]:
        return {
            sub: ensure_commit(
                cache_dir, sub.url, sub.commit, mirrors, f"{what} submodule {sub.path}", show=show
            )
            for sub in subs
        }

    missing = [
        subs
        for subs in by_url.values()
        if not all(
            _has_commit(_open_or_create_mirror(_mirror_path(cache_dir, s.url)), s.commit)
            for s in subs
        )
    ]
    found: dict[Submodule, Path] = {}
    if len(missing) > 1:
        total = sum(len(subs) for subs in missing)
        with (
            progress.task(f"fetch {total} submodules of {what}", total=total) as bar,
            concurrent.futures.ThreadPoolExecutor(min(_PARALLEL_FETCHES, len(missing))) as pool,
        ):
            jobs = [pool.submit(fetch_all, subs, False) for subs in missing]
            for job in concurrent.futures.as_completed(jobs):
                fetched = job.result()
                found.update(fetched)
                bar.advance(bar.task_ids[0], len(fetched))
    for subs in by_url.values():
        if subs[0] not in found:
            found.update(fetch_all(subs, True))
    return found


def workdir_path(cache_dir: Path, target: str, name: str) -> Path:
    return cache_dir / "work" / target / name


def ensure_release(cache_dir: Path, fork: Fork, mirrors: Mirrors, what: str) -> Path:
    """The mirror holding the commit a release-sourced pin's wheel makes (imported once)."""
    assert fork.release is not None
    path = _mirror_path(cache_dir, f"{fork.url}#{fork.release.filename}")
    repo = _open_or_create_mirror(path)
    if not _has_commit(repo, fork.commit):
        wheel, _ = release.download(cache_dir, fork, mirrors, what)
        release.release_commit(repo, fork, wheel, what)
    return path


def fetch_release(
    cache_dir: Path, fork: Fork, mirrors: Mirrors, onto: str, what: str
) -> tuple[str, str, str]:
    """Another release of a release-sourced upstream, imported beside the pinned one:
    (its commit, file name, sha256)."""
    filename = release.onto_filename(fork, onto)
    repo = pygit2.Repository(str(ensure_release(cache_dir, fork, mirrors, what)))
    known = repo.references.get(f"refs/releases/{filename}")
    if known is not None:  # imported before: taken again while the index offers the same file
        _, offered = release._file_link(
            mirrors.rewrite(fork.url), fork.wheel.dist_name, filename, what
        )
        if offered is not None and offered == release.commit_sha256(repo, str(known.target)):
            return str(known.target), filename, offered
    wheel, sha256 = release.download(cache_dir, fork, mirrors, what, filename)
    commit = release.import_wheel(repo, wheel, sha256)
    repo.references.create(f"refs/releases/{filename}", commit, force=True)
    return commit, filename, sha256


def fetch_and_checkout(cache_dir: Path, target: str, fork: Fork, mirrors: Mirrors) -> Checkout:
    """The upstream at its pinned commit in the target's work directory, submodules included."""
    what = str(fork.directory / "pin.toml")
    if fork.release:
        mirror = ensure_release(cache_dir, fork, mirrors, what)
    else:
        mirror = ensure_commit(cache_dir, fork.url, fork.commit, mirrors, what, ref=fork.ref)
    path = workdir_path(cache_dir, target, fork.name)
    repo = open_workdir(path, mirror)
    # The main tree is written while the submodules are fetched and, where this work
    # directory has none yet, written beside it, outside it (the main checkout removes what
    # it does not know), then moved in: git clone does one after the other; libgit2 runs
    # without the GIL.
    new = [
        sub
        for sub in read_submodules(repo, fork.commit, fork.url)
        if not _existing_workdir(path / sub.path, _mirror_path(cache_dir, sub.url))
    ]
    with (
        tempfile.TemporaryDirectory(prefix=f".{fork.name}-submodules.", dir=path.parent) as aside,
        concurrent.futures.ThreadPoolExecutor(1) as background,
    ):
        main_tree = background.submit(checkout_commit, repo, fork.commit)
        _fetch_submodules(cache_dir, mirror, fork.commit, fork.url, mirrors, what)
        for number, sub in enumerate(new):
            staged = open_workdir(Path(aside) / str(number), _mirror_path(cache_dir, sub.url))
            checkout_commit(staged, sub.commit)
            label = f"{what} submodule {sub.path}"
            checkout_submodules(cache_dir, staged, sub.commit, sub.url, mirrors, label)
        main_tree.result()
        for number, sub in enumerate(new):
            remove_tree(path / sub.path)  # the main checkout's empty directory for it
            (path / sub.path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(aside) / str(number), path / sub.path)
    # In place now: each is checked to be at its commit (a stat of its files where staged).
    submodules = checkout_submodules(cache_dir, repo, fork.commit, fork.url, mirrors, what)
    return Checkout(fork.name, path, fork.commit, submodules)


def _fetch_submodules(
    cache_dir: Path, mirror: Path, commit: str, url: str, mirrors: Mirrors, what: str
) -> None:
    """Every submodule commit under `commit` (nested ones too) into its mirror, read from
    the mirrors alone: no work tree needed."""
    submodules = tuple(read_submodules(pygit2.Repository(str(mirror)), commit, url))
    for sub, sub_mirror in _ensure_submodules(cache_dir, submodules, mirrors, what).items():
        label = f"{what} submodule {sub.path}"
        _fetch_submodules(cache_dir, sub_mirror, sub.commit, sub.url, mirrors, label)


def export_tree(repo: pygit2.Repository, commit: str, destination: Path) -> list[str]:
    """`commit`'s files, submodules at their gitlinks included, written under `destination`
    with no .git anywhere and fixed modes (0644/0755): a build from it cannot depend on the
    git CLI, a repository's owner or the host's umask. Returns the paths written."""
    written: list[str] = []

    def walk(repo: pygit2.Repository, tree: pygit2.Tree, inside: str, out: str) -> None:
        for entry in tree:
            path_in_repo, path = f"{inside}{entry.name}", f"{out}{entry.name}"
            target = destination / path
            mode = entry.filemode
            if mode == pygit2.enums.FileMode.TREE:
                target.mkdir()
                walk(repo, repo.get(entry.id), path_in_repo + "/", path + "/")
            elif mode == pygit2.enums.FileMode.COMMIT:  # a submodule, checked out at its gitlink
                target.mkdir()
                walk(*_submodule_tree(repo, path_in_repo, str(entry.id)), "", path + "/")
            elif mode == pygit2.enums.FileMode.LINK:
                target.symlink_to(repo.get(entry.id).data.decode())
                written.append(path)
            else:
                target.write_bytes(repo.get(entry.id).data)
                target.chmod(0o755 if mode == pygit2.enums.FileMode.BLOB_EXECUTABLE else 0o644)
                written.append(path)

    destination.mkdir(parents=True, exist_ok=True)
    walk(repo, repo.get(commit).peel(pygit2.Tree), "", "")
    return written


def _submodule_tree(
    repo: pygit2.Repository, path: str, commit: str
) -> tuple[pygit2.Repository, pygit2.Tree]:
    """The checked-out submodule at `path` and its gitlink's tree; one line when it is not
    there (a gitlink .gitmodules does not list, or a commit never fetched)."""
    folder = Path(repo.workdir) / path
    try:
        sub = pygit2.Repository(str(folder), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    except pygit2.GitError:
        sub = None
    found = sub.get(commit) if sub is not None else None
    if found is None:
        raise BuilderError(
            f"{repo.workdir}: submodule {path} at {commit[:12]} is not checked out (is it "
            "listed in .gitmodules, and its commit fetched?)"
        )
    return sub, found.peel(pygit2.Tree)
