"""Safety rails that keep an image's labels and manifest honest."""

from __future__ import annotations

from pathlib import Path

import pygit2

from builder.core.errors import BuilderError
from builder.core.identity import checkout
from builder.core.urls import has_credentials, redact

TRACKED_DATA = ("images", "forks")


def uncommitted_data(data_dir: Path) -> list[str]:
    """Files under images/ or forks/ that differ from the data repository's HEAD."""
    repo = checkout(data_dir)
    if repo is None:
        return []
    prefix = data_dir.resolve().relative_to(Path(repo.workdir).resolve())
    roots = tuple(str(prefix / folder).removeprefix("./") + "/" for folder in TRACKED_DATA)
    ignored = pygit2.enums.FileStatus.IGNORED
    return sorted(
        path
        for path, flags in repo.status().items()
        if path.startswith(roots) and not flags & ignored
    )


def refuse_dirty_push(data_dir: Path, allow_dirty: bool) -> None:
    if allow_dirty:
        return
    dirty = uncommitted_data(data_dir)
    if dirty:
        shown = ", ".join(dirty[:3]) + (f" and {len(dirty) - 3} more" if len(dirty) > 3 else "")
        raise BuilderError(
            f"refusing to push: uncommitted changes in {shown} (the image would not match any "
            "commit of the project data); commit them, or pass --allow-dirty"
        )


def refuse_credentials_in_build_args(name: str, url: str) -> None:
    """The classic builder stores build arguments in the image history: no secrets there."""
    if has_credentials(url):
        raise BuilderError(
            f"{name} {redact(url)}: the URL carries credentials, which would be stored in the "
            "image's build history; point the build at an index or read-only mirror that needs "
            "no credentials (one on the build host's loopback works with --network-host)"
        )
