"""Progress and messages on stderr (rich); stdout stays free for `--json` results.

On a terminal a long step is a live line (spinner, bar, elapsed time) and a ✓ line when it
ends. Elsewhere (CI logs, `| tee`, systemd) there is no live line, so a step prints when it
starts, again at least once a minute while it runs, and when it ends; lines are never
wrapped, and text from outside (URLs, paths, server answers) is never read as markup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from builder.core.urls import scrub

console = Console(stderr=True, highlight=False, soft_wrap=True)
HEARTBEAT_S = 60.0
_quiet = False


def set_quiet(quiet: bool) -> None:
    """`builder -q`: no step or info lines; warnings and errors still show."""
    global _quiet
    _quiet = quiet


def info(message: str) -> None:
    """A line; `message` may use rich markup (callers escape what they did not write). Any
    URL in it is shown without its credentials, as in every line builder prints."""
    if not _quiet:
        console.print(scrub(message))


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/] {escape(scrub(message))}")


def _heartbeat(progress: Progress, started: float, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        description = progress.tasks[0].description if progress.tasks else ""
        minutes = (time.monotonic() - started) / 60
        console.print(f"… {escape(scrub(description))} (running {minutes:.0f} min)")


@contextmanager
def task(description: str, total: float | None = None, announce: bool = True) -> Iterator[Progress]:
    """One long step: a live line on a terminal, start and heartbeat lines elsewhere; with
    `announce`, a ✓ line when the step finishes (the caller reports its own verdict if not).
    Yields the rich Progress (its one task: `task_ids[0]`) for bars and new descriptions."""
    description = scrub(description)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    started = time.monotonic()
    progress.add_task(description, total=total)
    if _quiet:
        yield progress
        return
    if console.is_terminal:
        with progress:
            yield progress
    else:
        console.print(f"… {escape(description)}")
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(progress, started, stop), daemon=True)
        beat.start()
        try:
            yield progress
        finally:
            stop.set()
            beat.join()
    if announce:
        console.print(f"[green]✓[/] {escape(description)} ({time.monotonic() - started:.1f} s)")
