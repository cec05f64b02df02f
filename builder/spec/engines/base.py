"""The engine interface (builder/spec/engines/__init__.py says what it is for) and what
both engines' modules share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Probe:
    """One readiness stage over HTTP: a GET (or a one-token POST) that answers 200 once the
    server has got that far."""

    path: str
    timeout_s: float
    waiting: str  # what a non-200 means at this stage ("still loading")
    body: str = ""  # a POST's JSON body; "" for a GET ({served} is the served model's name)


class Engine(Protocol):
    name: str  # as target.toml names it
    # What a server of this engine answers while it starts, stage by stage: "port", then
    # the probes, then the identity read (`identity_paths`).
    probes: tuple[Probe, ...]
    identity_paths: tuple[str, ...]  # GETs whose answers say what it serves
    log_keys: frozenset[str]  # served settings only its start-up log says
    bench_module: str  # the benchmark client inside the image (python3 -m ...)
    # The image's entrypoint takes the API key from the file this variable names.
    api_key_file_env: str
    # The flag whose JSON object overrides the checkpoint's config (index_topk_pattern).
    model_override_flag: str
    bench_result_keys: tuple[str, ...]

    @property
    def stages(self) -> tuple[str, ...]: ...

    def served(self, answers: Mapping[str, bytes], log_text: str = "") -> dict | str:
        """The settings it serves, from the identity answers (and its start-up log when a
        container is watched), or why they cannot be read (one line)."""
        ...

    def served_name(self, answers: Mapping[str, bytes]) -> str: ...

    def speculative(self, args: Sequence[str] | None, served: Mapping) -> bool: ...

    def draft_from_checkpoint(self, args: Sequence[str]) -> bool:
        """Speculative decoding whose draft layers come from the served checkpoint (MTP)."""
        ...

    def acceptance_from_metrics(self, metrics_text: str | None) -> dict: ...

    def bench_result(self, result: Mapping) -> dict:
        """The client's result keys in the names a receipt uses."""
        ...

    def bench_command(
        self, *, base_url: str, model: str, tokenizer: str, concurrency: int, prompts: int,
        input_len: int, output_len: int, seed: int, deadline_s: int, output_file: str,
    ) -> list[str]: ...  # fmt: skip


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value argparse ends up with for `flag` (the last one given), or None."""
    value = None
    for at, word in enumerate(args):
        if word == flag and at + 1 < len(args):
            value = args[at + 1]
        elif word.startswith(f"{flag}="):
            value = word.split("=", 1)[1]
    return value
