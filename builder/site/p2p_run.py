"""Running the P2P probe (builder/site/probes/p2p_probe.py): in the server image with the GPUs,
as `builder doctor --p2p` does, or with a Python on this host (bench/p2p_probe_check.py).
Either way the answer is the probe's JSON document; a probe that gives none (the image
lacks python3, docker run failed, the outer deadline passed) becomes a document with
`cuda: false` and the reason, which the analysis reports as a failed check."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from builder.site import doctor, probes

PROBE_IN_CONTAINER = "/opt/builder-probe/p2p_probe.py"
STAGES = 5  # gpus, pairs, nccl, nccl with P2P off, pcie ipc: each under --stage-timeout
START_S = 300.0  # the container's start and the probe's imports, on top of the stages
MAX_DOCUMENT_CHARS = 1 << 20  # eight GPUs' document is about 20 KB; a record holds it
TAIL_LINES = 20  # of stderr, kept for the reason: docker's error sits above its help hint


def probe_file() -> Path:
    return Path(probes.__file__).resolve().parent / "p2p_probe.py"


def probe_args(
    world: int | None, pcie_ipc: str, stage_timeout: float, nccl_env: dict[str, str]
) -> list[str]:
    args = ["--pcie-ipc", pcie_ipc, "--stage-timeout", f"{stage_timeout:g}"]
    if world:
        args += ["--world", str(world)]
    for key, value in sorted(nccl_env.items()):
        args += ["--nccl-env", f"{key}={value}"]
    return args


def deadline_s(stage_timeout: float) -> float:
    return STAGES * stage_timeout + START_S


def container_command(image: str, args: list[str], name: str) -> list[str]:
    """`docker run` of the probe in `image`, the file bind-mounted read-only, with every GPU
    and the host's IPC namespace (CUDA IPC between the ranks, as the server has)."""
    return [
        "docker", "run", "--rm", "--name", name,
        "--gpus", "all", "--ipc=host",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "-v", f"{probe_file()}:{PROBE_IN_CONTAINER}:ro",
        "--entrypoint", "python3",
        image, PROBE_IN_CONTAINER, *args,
    ]  # fmt: skip


def local_command(args: list[str], python: str = sys.executable) -> list[str]:
    return [python, str(probe_file()), *args]


def _stop(process: subprocess.Popen, container: str | None) -> None:
    process.kill()
    process.wait()
    if container:  # named by us a moment ago: ours to remove
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)


def _no_document(why: str) -> dict:
    return {"probe": "builder-p2p", "cuda": False, "error": why}


def run(
    command: list[str], timeout_s: float, container: str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> dict:  # fmt: skip
    """The probe's document. Its stderr (progress, or docker's own error) goes to `on_line`
    as it comes, and what it ended with (docker's error lines, or its last lines) into the
    reason when no document comes back."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def pump(stream) -> None:
        for line in stream:
            tail.append(line.rstrip())
            if on_line:
                on_line(line.rstrip())

    with tempfile.TemporaryFile("w+") as stdout:
        try:
            process = subprocess.Popen(
                command, stdout=stdout, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                text=True, errors="replace",
            )  # fmt: skip
        except FileNotFoundError:
            return _no_document(f"{command[0]}: not found")
        reader = threading.Thread(target=pump, args=(process.stderr,), daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process, container)
            return _no_document(f"the probe gave no answer within {timeout_s:g} s")
        except BaseException:  # Ctrl-C, or anything else: no probe left holding the GPUs
            _stop(process, container)
            raise
        finally:
            reader.join(timeout=5)
        stdout.seek(0)
        text = stdout.read(MAX_DOCUMENT_CHARS + 1)
    if len(text) > MAX_DOCUMENT_CHARS:
        return _no_document(f"the probe's answer is over {MAX_DOCUMENT_CHARS} characters")
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        said = doctor.docker_failure("\n".join(tail)) if tail else "nothing on stderr"
        return _no_document(f"the probe exited {code} without a JSON document: {said}")
    if not isinstance(document, dict):
        return _no_document("the probe's answer is not a JSON object")
    return document


def container_name() -> str:
    return f"builder-p2p-probe-{os.getpid()}"
