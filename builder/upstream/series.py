"""Patch series against a moving upstream: list, check, refresh onto a new ref, export.

A series is a branch of commits (like gbp pq). `check` classifies each patch against REF
without touching any work tree:
  clean     applies exactly as it is;
  merged    applies with a 3-way merge (its hunks moved; shown);
  conflict  the 3-way merge conflicts (files and hunks named);
  upstream  REF already contains the change (the merge is a no-op): the patch can go.
`refresh` rebases the series onto REF in a refresh work directory, drops `upstream`
patches, and only when every patch succeeded rewrites forks/<upstream>/ (patch files and
pin). On a conflict it leaves the conflict marked in the work directory and `export`
finishes the job after the user's edit.
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import tempfile

try:
    import tomllib
except ImportError:  # Python 3.10 (a GPU VM's Ubuntu 22.04): tomli is the same parser
    import tomli as tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pygit2
import tomlkit
import tomlkit.exceptions
from packaging.utils import parse_wheel_filename
from pygit2.enums import ApplyLocation, CheckoutStrategy, DiffStatsFormat

from builder.build.patches import COMMITTER_EMAIL, COMMITTER_NAME, PatchFile, parse_patch_file
from builder.build.release import commit_sha256 as release_sha256
from builder.build.sources import (
    checkout_commit,
    ensure_commit,
    ensure_release,
    fetch_ref,
    fetch_release,
    open_workdir,
    workdir_path,
)
from builder.core.cache import (
    atomic_write_text,
    durable_replace,
    fsync_files,
    remove_tree,
    uninterrupted,
)
from builder.core.errors import BuilderError
from builder.core.settings import Mirrors
from builder.spec.target import Fork

STATE_FILE = "builder-refresh.json"


@dataclass
class PatchCheck:
    patch: PatchFile
    status: str  # clean | merged | conflict | upstream
    details: list[str] = field(default_factory=list)
    conflicts: dict[str, list[str]] = field(default_factory=dict)  # file -> hunks

    def to_json(self) -> dict:
        return {
            "patch": self.patch.path.name,
            "status": self.status,
            "details": self.details,
            "conflicts": self.conflicts,
        }


@dataclass
class SeriesCheck:
    upstream: str
    base_commit: str
    onto: str
    onto_commit: str
    patches: list[PatchCheck]
    trees: list[pygit2.Oid]  # the series' tree on REF after each patch (conflicts skipped)
    pinned_trees: list[pygit2.Oid]  # the series' tree on the pin before each patch, and after

    @property
    def unattended(self) -> bool:
        return all(p.status != "conflict" for p in self.patches)

    def to_json(self) -> dict:
        return {
            "upstream": self.upstream,
            "base_commit": self.base_commit,
            "onto": self.onto,
            "onto_commit": self.onto_commit,
            "can_move_unattended": self.unattended,
            "patches": [p.to_json() for p in self.patches],
        }


def _checkout(repo: pygit2.Repository, commit: str) -> None:
    """checkout_commit after dropping what _apply_exact left in the index: libgit2 only
    updates paths that differ between HEAD and the target, so stale entries would stay."""
    repo.index.read_tree(repo.get(commit).tree)
    repo.index.write()
    checkout_commit(repo, commit)


def _apply_exact(repo: pygit2.Repository, tree: pygit2.Oid, diff_text: str) -> pygit2.Oid:
    """`tree` + the patch, with libgit2's exact (no fuzz) apply; GitError if it does not."""
    repo.index.read_tree(repo.get(tree))
    diff = pygit2.Diff.parse_diff(diff_text)
    repo.applies(diff, ApplyLocation.INDEX, raise_error=True)
    repo.apply(diff, ApplyLocation.INDEX)
    return repo.index.write_tree()


def _hunks(file_text: str) -> tuple[str, list[str]]:
    """(file header, [hunk texts]) of one file's diff."""
    parts = re.split(r"(?m)^(?=@@ )", file_text)
    return parts[0], parts[1:]


def _moved_hunks(repo, before: pygit2.Oid, after: pygit2.Oid, patch: PatchFile) -> list[str]:
    """For a merged patch: where each hunk landed on the new upstream."""
    result = repo.diff(repo.get(before), repo.get(after))
    landed: dict[str, list[pygit2.DiffHunk]] = {}
    for file_patch in result:
        landed[file_patch.delta.new_file.path] = list(file_patch.hunks)
    notes = []
    for file_patch in patch.files:
        _, hunks = _hunks(file_patch.text)
        new_hunks = landed.get(file_patch.path, [])
        for number, hunk_text in enumerate(hunks, 1):
            old_start = int(re.match(r"@@ -(\d+)", hunk_text).group(1))
            if number <= len(new_hunks):
                moved = new_hunks[number - 1].old_start - old_start
                if moved:
                    notes.append(
                        f"{file_patch.path} hunk {number}: line {old_start} -> "
                        f"{new_hunks[number - 1].old_start} ({moved:+d})"
                    )
    return notes


def _conflicting_hunks(repo, base: pygit2.Oid, onto: pygit2.Oid, patch: PatchFile, path: str):
    """Which hunks of `patch` in `path` conflict, probing each hunk alone."""
    file_patch = next(f for f in patch.files if f.path == path)
    header, hunks = _hunks(file_patch.text)
    found = []
    for number, hunk_text in enumerate(hunks, 1):
        # Alone, the hunk starts where it starts in the old file: libgit2 places hunks by
        # their new-file line, which earlier hunks of the patch had shifted.
        alone = re.sub(r"^@@ -(\d+)(,\d+)? \+\d+", r"@@ -\1\2 +\1", hunk_text, count=1)
        single = _apply_exact(repo, base, header + alone)
        if repo.merge_trees(repo.get(base), repo.get(onto), repo.get(single)).conflicts:
            found.append(f"hunk {number} of {len(hunks)} ({hunk_text.splitlines()[0].strip()})")
    return found or ["(the file as a whole)"]


def classify(
    repo: pygit2.Repository, name: str, base: str, onto: str, onto_commit: str, patches
) -> SeriesCheck:
    series_tree = repo.get(base).tree.id
    onto_tree = repo.get(onto_commit).tree.id
    checks: list[PatchCheck] = []
    trees: list[pygit2.Oid] = []
    pinned_trees: list[pygit2.Oid] = [series_tree]
    for patch in patches:
        try:
            next_series = _apply_exact(repo, series_tree, patch.diff_text)
        except pygit2.GitError as exc:
            raise BuilderError(
                f"{patch.path}: does not apply to its own pin {base[:12]}: {exc}"
            ) from None
        try:
            next_onto = _apply_exact(repo, onto_tree, patch.diff_text)
            checks.append(PatchCheck(patch, "clean"))
        except pygit2.GitError:
            merged = repo.merge_trees(
                repo.get(series_tree), repo.get(onto_tree), repo.get(next_series)
            )
            if merged.conflicts:
                paths = sorted(
                    {entry.path for trio in merged.conflicts for entry in trio if entry is not None}
                )
                conflicts = {
                    p: _conflicting_hunks(repo, series_tree, onto_tree, patch, p)
                    for p in paths
                    if any(f.path == p for f in patch.files)
                }
                checks.append(PatchCheck(patch, "conflict", conflicts=conflicts))
                next_onto = onto_tree
            else:
                next_onto = merged.write_tree(repo)
                if next_onto == onto_tree:
                    checks.append(PatchCheck(patch, "upstream", ["already contained in " + onto]))
                else:
                    moved = _moved_hunks(repo, onto_tree, next_onto, patch)
                    checks.append(PatchCheck(patch, "merged", moved or ["context changed"]))
        series_tree, onto_tree = next_series, next_onto
        trees.append(onto_tree)
        pinned_trees.append(series_tree)
    return SeriesCheck(name, base, onto, onto_commit, checks, trees, pinned_trees)


def refresh_dir(cache_dir: Path, target: str, name: str) -> Path:
    return cache_dir / "work" / target / f"{name}-refresh"


def prepare(
    cache_dir: Path, target: str, fork: Fork, mirrors: Mirrors, onto: str
) -> tuple[pygit2.Repository, str, str]:
    """The refresh work repository holding the pin and REF: (repo, REF's commit, full ref)."""
    what = str(fork.directory / "pin.toml")
    if fork.release:
        mirror = ensure_release(cache_dir, fork, mirrors, what)
        onto_commit, full_ref, _ = fetch_release(cache_dir, fork, mirrors, onto, what)
    else:
        mirror = ensure_commit(cache_dir, fork.url, fork.commit, mirrors, what, ref=fork.ref)
        onto_commit, full_ref = fetch_ref(cache_dir, fork.url, onto, mirrors, what)
    repo = open_workdir(refresh_dir(cache_dir, target, fork.name), mirror)
    return repo, onto_commit, full_ref


def check(
    cache_dir: Path, target: str, fork: Fork, series: str, mirrors: Mirrors, onto: str
) -> SeriesCheck:
    repo, onto_commit, _ = prepare(cache_dir, target, fork, mirrors, onto)
    patches = [parse_patch_file(p) for p in fork.patch_files(series)]
    return classify(repo, fork.name, fork.commit, onto, onto_commit, patches)


def _commit(repo, parent: str, tree, patch_author: tuple[str, str], message: str) -> str:
    """A commit one second after its parent: deterministic, like the patch stage's."""
    when = repo.get(parent).commit_time + 1
    author = pygit2.Signature(patch_author[0], patch_author[1], when, 0)
    committer = pygit2.Signature(COMMITTER_NAME, COMMITTER_EMAIL, when, 0)
    return str(repo.create_commit(None, author, committer, message, tree, [repo.get(parent).id]))


def _state_path(repo: pygit2.Repository) -> Path:
    return Path(repo.path) / STATE_FILE


def refresh(
    cache_dir: Path, target: str, fork: Fork, series: str, mirrors: Mirrors, onto: str
) -> tuple[SeriesCheck, dict | None]:
    """Rebase the series onto REF; rewrite forks/ only if every patch made it."""
    repo, onto_commit, full_ref = prepare(cache_dir, target, fork, mirrors, onto)
    patches = [parse_patch_file(p) for p in fork.patch_files(series)]
    result = classify(repo, fork.name, fork.commit, onto, onto_commit, patches)
    state = {"upstream": fork.name, "series": series, "onto": full_ref, "onto_commit": onto_commit}
    head = onto_commit
    for index, (patch_check, tree) in enumerate(zip(result.patches, result.trees, strict=True)):
        patch = patch_check.patch
        if patch_check.status == "upstream":
            continue
        if patch_check.status == "conflict":
            ancestor, theirs = result.pinned_trees[index], result.pinned_trees[index + 1]
            _stop_at_conflict(repo, head, ancestor, theirs, patch, state)
            return result, None
        head = _commit(repo, head, tree, (patch.author_name, patch.author_email), patch.message)
    _checkout(repo, head)
    written = _write_series(repo, fork, series, full_ref, onto_commit, head)
    _state_path(repo).unlink(missing_ok=True)
    return result, written


def _stop_at_conflict(
    repo, head: str, ancestor: pygit2.Oid, theirs: pygit2.Oid, patch: PatchFile, state: dict
) -> None:
    """Check out `head` with this patch's 3-way merge written in, conflict markers and all."""
    _checkout(repo, head)
    merged = repo.merge_trees(repo.get(ancestor), repo.get(head).tree, repo.get(theirs))
    repo.checkout_index(
        index=merged,
        strategy=CheckoutStrategy.FORCE
        | CheckoutStrategy.ALLOW_CONFLICTS
        | CheckoutStrategy.CONFLICT_STYLE_MERGE,
    )
    state["head"] = head
    state["pending"] = str(patch.path)
    atomic_write_text(_state_path(repo), json.dumps(state, indent=2))


def _format_patch(repo, commit_id: str, number: int, total: int) -> tuple[str, str]:
    """(file name, text) of one commit as `git format-patch --zero-commit` would write it."""
    commit = repo.get(commit_id)
    diff = repo.diff(commit.parents[0].tree, commit.tree)
    subject, _, body = commit.message.partition("\n")
    body = body.strip()
    when = datetime.fromtimestamp(commit.author.time, timezone.utc)
    stats = diff.stats.format(DiffStatsFormat.FULL | DiffStatsFormat.INCLUDE_SUMMARY, 72)
    text = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: {commit.author.name} <{commit.author.email}>\n"
        f"Date: {email.utils.format_datetime(when)}\n"
        f"Subject: [PATCH {number}/{total}] {subject}\n\n"
        + (f"{body}\n" if body else "")
        + f"---\n{stats}\n{diff.patch}"
    )
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-.")[:52].rstrip("-.")
    return f"{number:04d}-{slug}.patch", text


def _version_at(repo, commit: str, fork: Fork, onto: str) -> str:
    """The upstream release at REF: version.txt if the tree has one, else the tag's name."""
    tree = repo.get(commit).tree
    if "version.txt" in tree:
        return tree["version.txt"].data.decode().strip()
    match = re.fullmatch(r"v?(\d+(\.\d+)+(\.post\d+|rc\d+)?)", onto)
    return match.group(1) if match else fork.version


def _rewritten_pin(pin_path: Path, text: str, fields: dict[str, str]) -> str:
    """pin.toml's text with its top-level `fields` set by a TOML writer that keeps comments
    and layout (tomlkit); read back with a TOML parser, it must be the old document with
    exactly those values changed. Upstream text (a tag name, a file name) goes into it:
    only plain characters, though the writer would quote anything."""
    for key, value in fields.items():
        if not re.fullmatch(r"[A-Za-z0-9._+/@-]+", value):
            raise BuilderError(f"{pin_path}: refusing to write {key} = {value!r}")
    try:
        before = tomllib.loads(text)
        document = tomlkit.parse(text)
    except (tomllib.TOMLDecodeError, tomlkit.exceptions.ParseError) as exc:
        raise BuilderError(f"{pin_path}: not valid TOML ({exc})") from None
    for key, value in fields.items():
        document[key] = value
    written = tomlkit.dumps(document)
    if tomllib.loads(written) != {**before, **fields}:
        raise BuilderError(f"{pin_path}: rewriting {', '.join(fields)} changed other values")
    return written


def rewrite_pin(pin_path: Path, fields: dict[str, str]) -> None:
    """Set top-level `fields` of a pin.toml (comments and layout kept), atomically: a re-pin
    with no series to move (FlashInfer's empty series)."""
    atomic_write_text(pin_path, _rewritten_pin(pin_path, pin_path.read_text(), fields))


def _write_series(repo, fork: Fork, series: str, ref: str, onto_commit: str, head: str) -> dict:
    """Replace the series files and the pin together; the old ones stay until both are ready."""
    commits = []
    walker = head
    while walker != onto_commit:
        commits.append(walker)
        walker = str(repo.get(walker).parents[0].id)
    commits.reverse()
    series_dir = fork.series_dir(series)
    staging = series_dir.with_name(f".{series}.new")
    remove_tree(staging)
    staging.mkdir(parents=True)
    names = []
    for number, commit in enumerate(commits, 1):
        name, text = _format_patch(repo, commit, number, len(commits))
        (staging / name).write_text(text)
        names.append(name)
    pin_path = fork.directory / "pin.toml"
    pin = pin_path.read_text()
    fields = {"commit": onto_commit, "ref": ref}
    if fork.release:  # ref is the release file: its version and sha256 (from the index)
        fields["version"] = str(parse_wheel_filename(ref)[1])
        fields["sha256"] = release_sha256(repo, onto_commit)
    else:
        fields["version"] = _version_at(repo, onto_commit, fork, ref.rsplit("/", 1)[-1])
    version = fields["version"]
    try:
        pin = _rewritten_pin(pin_path, pin, fields)
    except BuilderError:
        remove_tree(staging)
        raise
    old = series_dir.with_name(f".{series}.old")
    remove_tree(old)
    # Both new versions are complete before either replaces the old: the pin is written
    # beside its file, then the series and the pin are renamed in one after the other;
    # a failed rename puts the old series back, so the pair is old or new, never mixed.
    handle, name = tempfile.mkstemp(prefix=f".{pin_path.name}.", dir=pin_path.parent)
    os.close(handle)
    new_pin = Path(name)
    try:
        new_pin.write_text(pin)
        new_pin.chmod(0o644)
        fsync_files(staging)
        # Ctrl-C between the renames would leave the new series with the old pin.
        with uninterrupted():
            series_dir.rename(old)
            try:
                staging.rename(series_dir)
                try:
                    durable_replace(new_pin, pin_path)
                except OSError:
                    series_dir.rename(staging)
                    raise
            except OSError:
                old.rename(series_dir)
                raise
    finally:
        new_pin.unlink(missing_ok=True)
        remove_tree(staging)
    remove_tree(old)
    return {"patches": names, "pin": {"commit": onto_commit, "ref": ref, "version": version}}


def export(cache_dir: Path, target: str, fork: Fork, series: str) -> dict:
    """Finish a refresh after the user resolved a conflict, or re-export the fork branch.

    In a refresh work directory with a pending patch: the user's edit becomes that patch's
    commit (conflict markers refused), the remaining patches follow, then forks/ is
    rewritten. Without one: the build work directory's fork branch is exported as is.
    """
    path = refresh_dir(cache_dir, target, fork.name)
    state_file = path / ".git" / STATE_FILE
    if not state_file.is_file():
        repo = pygit2.Repository(str(workdir_path(cache_dir, target, fork.name)))
        head = str(repo.references[f"refs/heads/builder/{series}"].target)
        return _write_series(repo, fork, series, fork.ref, fork.commit, head)
    state = json.loads(state_file.read_text())
    repo = pygit2.Repository(str(path))
    repo.index.read()
    if repo.index.conflicts:
        repo.index.add_all()
    status = repo.status()
    marked = [
        p
        for p in status
        if (path / p).is_file() and "<<<<<<< " in (path / p).read_text(errors="replace")
    ]
    if marked:
        raise BuilderError(
            f"{path}: conflict markers remain in {', '.join(sorted(marked))}: edit them, then "
            "run export again"
        )
    patch = parse_patch_file(Path(state["pending"]))
    repo.index.add_all()
    tree = repo.index.write_tree()
    head = _commit(
        repo, state["head"], tree, (patch.author_name, patch.author_email), patch.message
    )
    remaining = [parse_patch_file(p) for p in fork.patch_files(series)]
    after = [p for p in remaining if p.path.name > Path(state["pending"]).name]
    for later in after:
        try:
            tree = _apply_exact(repo, repo.get(head).tree.id, later.diff_text)
        except pygit2.GitError as exc:
            raise BuilderError(
                f"{later.path}: does not apply after your fix ({exc}); run refresh again"
            ) from None
        head = _commit(repo, head, tree, (later.author_name, later.author_email), later.message)
    _checkout(repo, head)
    written = _write_series(repo, fork, series, state["onto"], state["onto_commit"], head)
    state_file.unlink()
    return written


def conflict_help(path: Path, check: PatchCheck, target: str, upstream: str) -> str:
    files = ", ".join(f"{f} ({'; '.join(h)})" for f, h in check.conflicts.items())
    return (
        f"{check.patch.path.name} conflicts in {files}.\n"
        f"  1. edit the <<<<<<< / >>>>>>> regions in {path}\n"
        f"  2. run: builder patches export --target {target} --upstream {upstream}\n"
        "  forks/ is unchanged until export succeeds."
    )
