"""tests/slow_cores.py, the slow machine docs/test-times.md times the suite on: the command's
exit status comes back, bad input is one line, and the cores really are slower under it (a
CPU-bound loop takes longer in the same run; the ratio itself is noisy, so only its
direction is asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

LOOP = "import time; t = time.process_time(); s = time.monotonic()\n" \
    "while time.process_time() - t < 0.3: pass\n" \
    "print(time.monotonic() - s)"  # fmt: skip


def _slow_cores(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.slow_cores", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _realtime_allowed() -> bool:
    probe = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.mark.skipif(not _realtime_allowed(), reason="a real-time policy needs root (CAP_SYS_NICE)")
def test_the_command_runs_on_slower_cores_and_its_status_comes_back() -> None:
    alone = float(subprocess.run([sys.executable, "-c", LOOP], capture_output=True,
                                 text=True, check=True).stdout)  # fmt: skip
    slowed = _slow_cores("--no-gauge", "--factor", "4", "--", sys.executable, "-c", LOOP)
    assert slowed.returncode == 0, slowed.stderr
    # 0.3 CPU-s take about 1.2 s of wall where a core gives a quarter of itself
    assert float(slowed.stdout) > 1.5 * alone, (slowed.stdout, alone)
    assert "each core 4x slower" in slowed.stderr
    failed = _slow_cores("--no-gauge", "--factor", "2", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3
    assert "sh -c exit 3 exited 3" in failed.stderr


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--factor", "0.5", "--", "true"], "--factor 0.5: cores can only be made slower"),
        (["--factor", "nan", "--", "true"], "--factor nan: cores can only be made slower"),
        (["--factor", "3"], "no command to run"),
    ],
)
def test_bad_input_is_one_line(args: list[str], error: str) -> None:
    result = _slow_cores(*args)
    assert result.returncode == 2
    assert error in result.stderr.splitlines()[-1]
