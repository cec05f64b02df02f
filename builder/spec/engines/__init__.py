"""The serving engine a target's image runs (target.toml `engine`), as one small interface.

What differs between sglang and vLLM lives in one module per engine (sglang.py, vllm.py):
how a server says it is ready and what it serves, the speculative-decoding flags and
figures, the benchmark client it ships and the streaming endpoint builder's own client
measures, the log lines of its CUDA-graph capture and the caches its start-up JITs write.
Each is pure: it reads answers (HTTP bodies, log text) handed to it and builds argument
lists and request bodies, so the GPU VM's commands and the tests drive the same code. The
flag reader of each engine's argument parser is on the upstream side
(builder/upstream/sglang_parser.py, vllm_parser.py), chosen by the same name.
"""

from __future__ import annotations

from builder.core.errors import BuilderError
from builder.spec.engines.base import (
    Acceptance,
    Engine,
    JitCache,
    Probe,
    flag_value,
    ready_line_indices,
)

__all__ = [
    "DEFAULT", "NAMES", "Acceptance", "Engine", "JitCache", "Probe", "engine", "flag_value",
    "ready_line_indices",
]  # fmt: skip

NAMES = ("sglang", "vllm")
DEFAULT = "sglang"


def engine(name: str) -> Engine:
    """The engine called `name` (target.toml's `engine`, a recipe's, a receipt's)."""
    if name == "sglang":
        from builder.spec.engines import sglang

        return sglang.ENGINE
    if name == "vllm":
        from builder.spec.engines import vllm

        return vllm.ENGINE
    raise BuilderError(f"engine '{name}' is not one builder knows ({', '.join(NAMES)})")
