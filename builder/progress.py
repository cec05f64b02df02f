"""Progress and messages on stderr (rich); stdout stays free for `--json` results."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

console = Console(stderr=True, highlight=False)


def info(message: str) -> None:
    console.print(message)


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/] {message}")


@contextmanager
def task(description: str, total: float | None = None, announce: bool = True) -> Iterator[Progress]:
    """A live line (spinner, bar when `total` is known, elapsed time) for one long step; with
    `announce`, a ✓ line when the step finishes (the caller reports its own verdict if not)."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    started = time.monotonic()
    with progress:
        progress.add_task(description, total=total)
        yield progress
    if announce:
        console.print(f"[green]✓[/] {description} ({time.monotonic() - started:.1f} s)")
