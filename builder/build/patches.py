"""Stage 2: apply a target's patch series with pygit2 and commit it on a fork branch.

Each patch becomes one commit with a fixed committer and a time derived from the upstream
commit, so the fork commit SHA is a pure function of (upstream commit, patch files) on
every machine. A patch that does not apply leaves the work tree exactly at the upstream
commit.
"""

from __future__ import annotations

import email.parser
import email.policy
import email.utils
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import pygit2
from pygit2.enums import ApplyLocation

from builder.build.sources import Checkout, checkout_commit
from builder.core import progress
from builder.core.errors import BuilderError

COMMITTER_NAME = "builder"
COMMITTER_EMAIL = "builder@localhost"
_HUNK_LINE = re.compile(r"hunk at line (\d+)")


@dataclass(frozen=True)
class FilePatch:
    path: str
    text: str


@dataclass(frozen=True)
class PatchFile:
    """One `git format-patch` file: who wrote it, why, and the per-file diffs."""

    path: Path
    author_name: str
    author_email: str
    message: str
    files: tuple[FilePatch, ...]
    sha256: str

    @property
    def diff_text(self) -> str:
        return "".join(f.text for f in self.files)


@dataclass(frozen=True)
class ForkResult:
    fork_commit: str
    branch: str
    patches: tuple[PatchFile, ...]
    series_sha256: str
    checkout: Checkout

    @property
    def name(self) -> str:
        return self.checkout.name

    @property
    def upstream_commit(self) -> str:
        return self.checkout.commit


def _split_per_file(diff: str) -> list[FilePatch]:
    chunks = re.split(r"(?m)^(?=diff --git )", diff)
    files = []
    for chunk in chunks:
        if not chunk.startswith("diff --git "):
            continue
        match = re.match(r"diff --git a/(\S+) b/(\S+)", chunk)
        path = match.group(2) if match else chunk.split("\n", 1)[0]
        files.append(FilePatch(path, chunk))
    return files


def parse_patch_file(path: Path) -> PatchFile:
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    head, sep, _ = text.partition("\ndiff --git ")
    if not sep:
        raise BuilderError(f"{path}: not a patch (no 'diff --git' section)")
    diff = "diff --git " + text.split("\ndiff --git ", 1)[1]
    diff = re.split(r"(?m)^-- \n", diff)[0]  # drop a format-patch signature
    headers = email.parser.Parser(policy=email.policy.default).parsestr(head, headersonly=True)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(headers.get("Subject", "")).strip())
    if not subject:
        raise BuilderError(f"{path}: missing 'Subject:' header (write it with git format-patch)")
    name, address = email.utils.parseaddr(str(headers.get("From", "")))
    body = head.split("\n\n", 1)[1] if "\n\n" in head else ""
    body = body.split("\n---\n", 1)[0].strip()
    message = f"{subject}\n\n{body}\n" if body else f"{subject}\n"
    files = tuple(_split_per_file(diff))
    for file_patch in files:
        try:
            pygit2.Diff.parse_diff(file_patch.text)
        except pygit2.GitError as exc:
            raise BuilderError(f"{path}: malformed diff for {file_patch.path} ({exc})") from None
    return PatchFile(
        path=path,
        author_name=name or COMMITTER_NAME,
        author_email=address or COMMITTER_EMAIL,
        message=message,
        files=files,
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def series_sha256(patches: list[PatchFile] | tuple[PatchFile, ...]) -> str:
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(f"{patch.path.name}\0{patch.sha256}\n".encode())
    return digest.hexdigest()


def _describe_failure(patch: PatchFile, file_patch: FilePatch, error: str) -> str:
    diff = pygit2.Diff.parse_diff(file_patch.text)
    hunks = [hunk for p in diff for hunk in p.hunks]
    match = _HUNK_LINE.search(error)
    where = ""
    if match:
        line = int(match.group(1))
        for number, hunk in enumerate(hunks, 1):
            if hunk.old_start == line:
                where = f" at hunk {number} of {len(hunks)} ({hunk.header.strip()})"
                break
        else:
            where = f" at the hunk for line {line}"
    return f"{patch.path}: does not apply to {file_patch.path}{where}: {error}"


def _apply_one(repo: pygit2.Repository, patch: PatchFile) -> None:
    for file_patch in patch.files:
        diff = pygit2.Diff.parse_diff(file_patch.text)
        try:
            repo.applies(diff, ApplyLocation.BOTH, raise_error=True)
        except pygit2.GitError as exc:
            raise BuilderError(_describe_failure(patch, file_patch, str(exc))) from None
    repo.apply(pygit2.Diff.parse_diff(patch.diff_text), ApplyLocation.BOTH)


def apply_series(checkout: Checkout, series: str, patch_files: list[Path]) -> ForkResult:
    """Commit each patch on `builder/<series>` on top of the upstream commit.

    `checkout` is what fetch_and_checkout returned: the tree is exactly the upstream commit.
    """
    patches = tuple(parse_patch_file(p) for p in patch_files)
    repo = pygit2.Repository(str(checkout.path))
    parent = repo.get(checkout.commit)
    base_time = parent.commit_time
    try:
        counted = f"{len(patches)} patch{'' if len(patches) == 1 else 'es'}"
        with progress.task(f"patch {checkout.name} ({counted})", len(patches)) as bar:
            for number, patch in enumerate(patches, 1):
                _apply_one(repo, patch)
                tree = repo.index.write_tree()
                when = base_time + number
                author = pygit2.Signature(patch.author_name, patch.author_email, when, 0)
                committer = pygit2.Signature(COMMITTER_NAME, COMMITTER_EMAIL, when, 0)
                oid = repo.create_commit(None, author, committer, patch.message, tree, [parent.id])
                repo.set_head(oid)
                parent = repo.get(oid)
                bar.advance(bar.task_ids[0])
    except BaseException:
        # Whatever happened (bad patch, Ctrl-C), leave the tree at the upstream commit.
        checkout_commit(repo, checkout.commit)
        raise
    branch = f"builder/{series}"
    repo.references.create(f"refs/heads/{branch}", parent.id, force=True)
    return ForkResult(
        fork_commit=str(parent.id),
        branch=branch,
        patches=patches,
        series_sha256=series_sha256(patches),
        checkout=checkout,
    )
