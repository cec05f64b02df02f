"""A stalled start that stopped inside its engine's CUDA-graph capture: a graph-capture hang.

Each engine says which of its start-up log lines begin a capture and which end one
(`capture_begin`, `capture_end` in builder/spec/engines). A start whose log went quiet
after a begin line without an end line after it hung in capture, not in NCCL or the
weights: the decode graph's `full` backend did so for GLM DSA on RTX PRO 6000 in sglang
PR #29580, and another graph backend started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from builder.spec.engines import Engine


def hang_line(log_tail: str, engine: Engine) -> str | None:
    """The capture line a stalled start's log stopped after, or None when its last capture
    had ended (or never began): then the stall is somewhere else (NCCL, weights...)."""
    last = None
    for line in log_tail.replace("\r", "\n").splitlines():
        if engine.capture_end.search(line):
            last = None
        elif engine.capture_begin.search(line):
            last = line.strip()
    return last
