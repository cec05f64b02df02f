"""The engine interface (builder/spec/engines/__init__.py says what it is for) and what
both engines' modules share."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Probe:
    """One readiness stage over HTTP: a GET (or a one-token POST) that answers 200 once the
    server has got that far."""

    path: str
    timeout_s: float
    waiting: str  # what a non-200 means at this stage ("still loading")
    body: str = ""  # a POST's JSON body; "" for a GET ({served} is the served model's name)


@dataclass(frozen=True)
class Acceptance:
    """A speculative server's draft acceptance, as its engine reports it."""

    length: float | None  # tokens per verify step, the bonus token counted
    rate: float | None  # accepted draft tokens / proposed draft tokens
    figures: dict = field(default_factory=dict)  # every figure read, for the receipt
    missing: str = ""  # why there is no length (one line)


@dataclass(frozen=True)
class JitCache:
    """A folder where a server writes the kernels it compiles at start-up outside FlashInfer.
    A profile keeps it on a host volume, so a kernel file written there since the container
    started was compiled by that start."""

    label: str  # as reports print it ("Triton")
    key: str  # as JSON names it ("triton")
    suffixes: tuple[str, ...]  # the files in it that are a compiled kernel
    # Which part of a kernel file's path under the folder names the kernel (1 or -2: its
    # module, its own folder) when the file is not right in the folder; None: the file's
    # name less its suffix.
    name_part: int | None = None


class Engine(Protocol):
    name: str  # as target.toml names it
    # What a server of this engine answers while it starts, stage by stage: "port", then
    # the probes, then the identity read (`identity_paths`).
    probes: tuple[Probe, ...]
    identity_paths: tuple[str, ...]  # GETs whose answers say what it serves
    log_keys: frozenset[str]  # served settings only its start-up log says
    bench_module: str  # the benchmark client inside the image (python3 -m ...)
    bench_name: str  # that client as receipts and messages name it
    bench_prose: str  # ... and as a sentence does
    own_client: str  # builder's own client for this engine, as a receipt names it
    # The start-up log's lines that say it serves, in the order it writes them (the last
    # one's time is the time to ready).
    ready_lines: tuple[str, ...]
    speculative_flag: str  # the flag that makes a profile speculative, named when absent
    # GETs whose text the acceptance figures read, before and after the gates' traffic.
    acceptance_paths: tuple[str, ...]
    spec_reply_request: Mapping  # what a chat request adds to get its reply's figures
    # The image's entrypoint takes the API key from the file this variable names.
    api_key_file_env: str
    # The flag whose JSON object overrides the checkpoint's config (index_topk_pattern).
    model_override_flag: str
    bench_result_keys: tuple[str, ...]
    # Start-up log lines that say a CUDA-graph capture began, and that it ended: a start
    # that went quiet after a begin line with no end line after it hung in capture.
    capture_begin: re.Pattern[str]
    capture_end: re.Pattern[str]
    # Where it writes the kernels it compiles at start-up outside FlashInfer, in the order
    # reports list them; `jit_cache_roots` says where each folder is.
    jit_caches: tuple[JitCache, ...]
    cache_volume: str  # the profiles' host volume that keeps them, as a message names it
    # The folder on the GPU VM its profiles' read-write volumes live under (the Hugging Face
    # cache's default among them): a profile, which whoever pushed the image wrote, mounts
    # nothing else unless the operator's own flag names the folder.
    state_root: str

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

    def spec_reply(self, answer: Mapping) -> dict | None:
        """A chat answer's own speculative figures (asked with `spec_reply_request`)."""
        ...

    def acceptance(
        self, replies: Sequence[dict], before: Mapping[str, str | None],
        after: Mapping[str, str | None],
    ) -> Acceptance:  # fmt: skip
        """Draft acceptance from the replies' figures and the `acceptance_paths` answers
        (None: no 200) read before and after the gates."""
        ...

    def stream_request(
        self, model: str, input_ids: Sequence[int], output_len: int
    ) -> tuple[str, dict]:
        """The path and JSON body that stream `output_len` tokens for token-id prompt
        `input_ids` at temperature 0, ignoring EOS."""
        ...

    def stream_progress(self, chunk: Mapping) -> tuple[bool, int | None]:
        """Of one streamed `data:` chunk: whether it carries output, and the completion
        tokens so far when it says (None when it does not)."""
        ...

    def listen_port(self, args: Sequence[str] | None, served: Mapping) -> int | None:
        """The port the server listens on inside its container, when it says."""
        ...

    def tokenizer(self, served: Mapping, model: str) -> str:
        """The tokenizer its benchmark client loads: the server's, else the served model."""
        ...

    def bench_result(self, result: Mapping) -> dict:
        """The client's result keys in the names a receipt uses."""
        ...

    def jit_cache_roots(self, env: Mapping[str, str]) -> dict[str, str]:
        """Each of `jit_caches`' folder (by key) inside a container whose environment is
        `env`, as the engine resolves it."""
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


def home_path(env: Mapping[str, str], path: str) -> str:
    """`path` with a leading `~` as the container's $HOME (root's when it has none)."""
    home = env.get("HOME") or "/root"
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def ready_line_indices(lines: Sequence[str], ready_lines: Sequence[str]) -> Iterator[int]:
    """The index of each line that says the server serves: one holding the last of
    `ready_lines` after the others, in order (each start of a log that holds several)."""
    wanted = 0
    for at, line in enumerate(lines):
        if ready_lines[wanted] in line:
            if wanted == len(ready_lines) - 1:
                yield at
                wanted = 0
            else:
                wanted += 1
