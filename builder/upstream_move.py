"""`builder upstream move` (next commit)."""

from __future__ import annotations

from builder.errors import BuilderError


def move(ctx, to, keep_old_as=None, run_lock=True):
    raise BuilderError("builder upstream move: not implemented yet")
