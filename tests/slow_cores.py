"""Run a command as on a machine of this kind whose cores are slower: the suite's time where
docs/test-times.md's g++ gauge reads 9-10 s, measured on a machine where it reads 3.

    python -m tests.slow_cores --factor 3 -- ./scripts/test

One real-time (SCHED_FIFO) process per core busy-loops for part of every 30 ms and sleeps
the rest, so everything else on the machine (pytest, the engine, the containers, nvcc) gets
only the rest of each core, whatever it runs. A CPU quota would slow the processes in its
cgroup only (the engine puts its containers in cgroups of its own) and would let one busy
process use a whole core where the slow machine has none to give. The gauge is timed under
the same load before and after the command: the figure to quote beside its time. The disk,
memory and network are not slowed. Needs root (a real-time policy); the kernel keeps 5 % of
each second for other processes whatever the share asked for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import Event, Process
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

PERIOD_MS = 30.0
GAUGE_SOURCE = "#include <bits/stdc++.h>\nint main() { return 0; }\n"


def _occupy(core: int, busy_s: float, idle_s: float, ready: EventType) -> None:
    os.sched_setaffinity(0, {core})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    except PermissionError:
        return  # `ready` never set: the parent says why
    ready.set()
    while True:
        until = time.monotonic() + busy_s
        while time.monotonic() < until:
            pass
        time.sleep(idle_s)


def gauge() -> float:
    """Seconds for three `g++ -O2 -c` of a file that includes <bits/stdc++.h>."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "gauge.cpp"
        source.write_text(GAUGE_SOURCE)
        start = time.monotonic()
        for _ in range(3):
            subprocess.run(["g++", "-O2", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                           check=True)  # fmt: skip
        return time.monotonic() - start


def _occupiers(factor: float) -> list[Process]:
    busy_s = PERIOD_MS * (1 - 1 / factor) / 1000
    idle_s = PERIOD_MS / factor / 1000
    started = []
    for core in sorted(os.sched_getaffinity(0)):
        ready = Event()
        occupier = Process(target=_occupy, args=(core, busy_s, idle_s, ready), daemon=True)
        occupier.start()
        started.append(occupier)
        if not ready.wait(10):
            for each in started:
                each.terminate()
            raise SystemExit(
                "slow_cores: cannot give a process a real-time policy (SCHED_FIFO): run as root"
            )
    return started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.slow_cores", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--factor", type=float, default=3.0,
                        help="how many times slower each core is (default 3: a third of it left)")  # fmt: skip
    parser.add_argument("--no-gauge", action="store_true",
                        help="skip timing the g++ gauge before and after the command")  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run: python -m tests.slow_cores --factor 3 -- ./scripts/test")
    if not args.factor >= 1:
        parser.error(f"--factor {args.factor}: cores can only be made slower (1 or more)")

    def report(what: str) -> None:
        measured = "" if args.no_gauge else f"; gauge {gauge():.1f} s"
        print(f"slow_cores: {what}{measured}", file=sys.stderr, flush=True)

    occupiers = _occupiers(args.factor)
    try:
        report(f"each core {args.factor:g}x slower")
        started = time.monotonic()
        returncode = subprocess.run(command).returncode
        took = time.monotonic() - started
        report(f"{' '.join(command)} exited {returncode} after {took // 60:.0f} min "
               f"{took % 60:.0f} s")  # fmt: skip
        return returncode
    finally:
        for occupier in occupiers:
            occupier.terminate()


if __name__ == "__main__":
    sys.exit(main())
