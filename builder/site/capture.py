"""A stalled start that stopped inside sglang's CUDA-graph capture: a graph-capture hang.

sglang 0.5.23 logs a line when each capture begins and another when it ends
(srt/model_executor/model_runner_components/cuda_graph_setup.py:684-688 for the prefill
graph, 758-762 for decode: "Capture target decode CUDA graph begin. backend=full, ...",
then "Capture ... CUDA graph end. elapsed=..."), and while decode capture runs, a progress
bar "Capturing batches (bs=... avail_mem=... GB)" (srt/model_executor/runner/
decode_cuda_graph_runner.py:1342-1344). A start whose log went quiet after a begin line
without its end line hung in capture: the decode graph's `full` backend did so for GLM DSA
on RTX PRO 6000 in sglang PR #29580, and another graph backend started.
"""

from __future__ import annotations

import re

_BEGIN = re.compile(r"Capture [\w ]+? \w+ graph begin\.|Capturing batches \(")
_END = re.compile(r"Capture [\w ]+? \w+ graph end\.")


def hang_line(log_tail: str) -> str | None:
    """The capture line a stalled start's log stopped after, or None when its last capture
    had ended (or never began): then the stall is somewhere else (NCCL, weights...)."""
    last = None
    for line in log_tail.replace("\r", "\n").splitlines():
        if _END.search(line):
            last = None
        elif _BEGIN.search(line):
            last = line.strip()
    return last
