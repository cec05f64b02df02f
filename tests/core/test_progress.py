"""Progress as a CI log or `| tee` shows it (stderr is not a terminal)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import time
from builder.core import progress
progress.HEARTBEAT_S = 0.3
with progress.task("fetch https://[::1]:8443/" + "x" * 150 + " [mirror]"):
    time.sleep(0.8)
progress.warn("see /tmp/[cache]/kernels.log")
"""


def test_off_a_terminal_a_step_shows_when_it_starts_runs_and_ends() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"},
    )  # fmt: skip
    lines = result.stderr.splitlines()
    step = "fetch https://[::1]:8443/" + "x" * 150 + " [mirror]"
    assert lines[0] == f"… {step}"  # when it starts, unwrapped, brackets kept
    assert any(line.startswith(f"… {step} (running ") for line in lines[1:-2])  # heartbeat
    assert lines[-2].startswith(f"✓ {step} (")  # when it ends
    assert lines[-1] == "warning: see /tmp/[cache]/kernels.log"
    assert "" not in lines  # no blank lines


def test_quiet_keeps_warnings_and_drops_the_steps() -> None:
    quiet = SCRIPT.replace(
        "progress.HEARTBEAT_S = 0.3", "progress.HEARTBEAT_S = 0.3\nprogress.set_quiet(True)"
    )
    result = subprocess.run(
        [sys.executable, "-c", quiet], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"},
    )  # fmt: skip
    assert result.stderr.splitlines() == ["warning: see /tmp/[cache]/kernels.log"]


def test_builder_q_is_parsed_before_the_command() -> None:
    from builder.cli.main import build_parser

    args = build_parser().parse_args(["-q", "jit", "list"])
    assert args.quiet and not args.verbose
