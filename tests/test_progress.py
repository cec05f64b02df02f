"""Progress as a CI log or `| tee` shows it (stderr is not a terminal)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import time
from builder import progress
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
