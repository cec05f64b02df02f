"""builder's own identity: the version, the commit it runs from, and its code in cache keys.

A cache entry made by one revision of builder's code must not be taken by another that
would make it differently, whatever `__version__` says: each artifact's key holds the
bytes of the modules that shape it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from builder import __version__

if TYPE_CHECKING:
    import pygit2

PACKAGE = Path(__file__).resolve().parents[1]


def code_key(*modules: str) -> str:
    """sha256 over builder's version and the named modules' source (`wheels`, `image`...)."""
    digest = hashlib.sha256(__version__.encode())
    for module in sorted(modules):
        digest.update(f"\0{module}\0".encode())
        digest.update((PACKAGE / f"{module}.py").read_bytes())
    return digest.hexdigest()


def checkout(path: Path) -> pygit2.Repository | None:
    """The git repository with a work tree that `path` is in, or None (also where pygit2, a
    build host's dependency, is not installed: a GPU VM's builder is no checkout)."""
    try:
        import pygit2
    except ImportError:
        return None
    found = pygit2.discover_repository(str(path))
    if found is None:
        return None
    repo = pygit2.Repository(found)
    return None if repo.workdir is None else repo


@functools.cache
def builder_identity() -> dict:
    """version, commit (None outside a git checkout) and whether tracked files differ."""
    unknown = {"version": __version__, "commit": None, "dirty": None}
    repo = checkout(PACKAGE)
    if repo is None or repo.head_is_unborn:
        return unknown
    package = PACKAGE.relative_to(Path(repo.workdir).resolve()).as_posix() + "/"
    import pygit2

    if f"{package}__init__.py" not in repo.head.peel(pygit2.Tree):
        return unknown  # installed inside some other checkout: not builder's own history
    status = pygit2.enums.FileStatus
    dirty = any(
        not flags & status.IGNORED and (not flags & status.WT_NEW or path.startswith(package))
        for path, flags in repo.status().items()
    )  # an edited tracked file, or a new file in builder's own package
    return {"version": __version__, "commit": str(repo.head.target), "dirty": dirty}
