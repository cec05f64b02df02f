"""Where the suite's time goes, per test: a pytest plugin, off unless asked for.

    BUILDER_TEST_CPU_PROFILE=/tmp/profile.jsonl ./scripts/test -p tests.cpu_profile
    .venv/bin/python -m tests.cpu_profile /tmp/profile.jsonl     # the heaviest tests and groups

One line per test (setup, call and teardown together): wall seconds, the CPU of the worker
itself and of the processes it waited for (builder runs, build backends, nvcc in a build),
and the CPU every dockerd on the host spent meanwhile (pushes, layer commits; shared by both
workers, so it is an upper bound for either). What runs in containers is not counted per
test; the machine's own busy time (/proc/stat, containers included) is, for the whole run:
its total against what the cores could have given says whether the run is short of CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import struct
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

PROFILE_ENV = "BUILDER_TEST_CPU_PROFILE"
_TICKS = os.sysconf("SC_CLK_TCK")


def _dockerd_seconds() -> float:
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        if fields[0].endswith("(dockerd"):
            utime, stime = fields[1].split()[11:13]
            total += int(utime) + int(stime)
    return total / _TICKS


def _machine_busy() -> float:
    """CPU-seconds every core of the machine has spent not idle since boot."""
    jiffies = [int(field) for field in Path("/proc/stat").read_text().split()[1:9]]
    idle_and_iowait = jiffies[3] + jiffies[4]
    return (sum(jiffies) - idle_and_iowait) / _TICKS


def _disks() -> set[str]:
    """The machine's physical disks (not partitions, loop, ram or device-mapper devices)."""
    return {path.name for path in Path("/sys/block").glob("*") if (path / "device").exists()}


_DISKS = _disks() if Path("/sys/block").is_dir() else set()


def _machine_disk() -> list[float]:
    """[seconds every core waited on I/O, bytes read, bytes written] since boot: whether a
    slow run waited on its disk (the torch layer, the base's load, the layer commits)."""
    iowait = int(Path("/proc/stat").read_text().split()[5]) / _TICKS
    read = written = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if fields[2] in _DISKS:
            read += int(fields[5]) * 512  # sectors of 512 bytes, whatever the disk's own
            written += int(fields[9]) * 512
    return [round(iowait, 2), read, written]


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    out = os.environ.get(PROFILE_ENV)
    if not out:
        yield
        return
    began, start = time.time(), time.monotonic()
    (own, children), dockerd, machine = _cpu(), _dockerd_seconds(), _machine_busy()
    disk = _machine_disk()
    yield
    own_after, children_after = _cpu()
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": began,
        "wall": round(time.monotonic() - start, 2),
        "self": round(own_after - own, 2),
        "children": round(children_after - children, 2),
        "dockerd": round(_dockerd_seconds() - dockerd, 2),
        "machine_busy": [round(machine, 2), round(_machine_busy(), 2)],
        "machine_disk": [disk, _machine_disk()],
    }
    with open(out, "a") as handle:  # one short write per line: lines of the workers never mix
        handle.write(json.dumps(line) + "\n")


_STEP = re.compile(r"^✓ (.+) \((\d+(?:\.\d+)?) s\)$", re.MULTILINE)


@contextlib.contextmanager
def span(kind: str, name: str):
    """One line for a piece of a test (a run-wide fixture made, a builder run): its wall and
    the CPU of this process and of the processes it waited for meanwhile. A builder run's
    own steps (its `✓ step (N s)` lines) are added by `note_steps` on the yielded dict."""
    out = os.environ.get(PROFILE_ENV)
    noted: dict = {}
    if not out:
        yield noted
        return
    start = time.monotonic()
    own, children = _cpu()
    try:
        yield noted
    finally:
        own_after, children_after = _cpu()
        line = {
            "span": kind,
            "name": name,
            "in": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "wall": round(time.monotonic() - start, 2),
            "self": round(own_after - own, 2),
            "children": round(children_after - children, 2),
            **noted,
        }
        with open(out, "a") as handle:
            handle.write(json.dumps(line) + "\n")


def note_steps(noted: dict, output: str) -> None:
    noted["steps"] = [[name, float(seconds)] for name, seconds in _STEP.findall(output)]


def _step_kind(name: str) -> str:
    """A step's name without what differs between runs of the same step: local version
    labels (`+sm120.g<commit>`), loopback addresses and long hex keys."""
    name = re.sub(r"\+\S+", "+…", name)
    name = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "HOST", name)
    return re.sub(r"[0-9a-f]{12,}", "…", name)[:90]


def _spans(rows: list[dict], top: int) -> list[str]:
    """The spans by kind and name: how often, wall and CPU (own and waited-for) in all."""
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for row in rows:
        total = totals[row["span"], row["name"]]
        total[0] += 1
        total[1] += row["wall"]
        total[2] += row["self"] + row["children"]
    lines = [f"\n{'runs':>5} {'wall':>7} {'cpu':>7}  span (run-wide fixtures, builder runs)"]
    for (kind, name), (runs, wall, cpu) in sorted(totals.items(), key=lambda t: -t[1][2])[:top]:
        lines.append(f"{runs:5d} {wall:7.1f} {cpu:7.1f}  {kind}: {name}")
    steps: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        for name, seconds in row.get("steps", []):
            step = steps[_step_kind(name)]
            step[0] += 1
            step[1] += seconds
    if steps:
        lines.append(f"\n{'runs':>5} {'wall':>7}  builder's own steps (their ✓ lines)")
        for name, (runs, wall) in sorted(steps.items(), key=lambda s: -s[1][1])[:top]:
            lines.append(f"{runs:5d} {wall:7.1f}  {name}")
    return lines


def summarize(path: Path, top: int = 25) -> str:
    every = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [row for row in every if "test" in row]
    lines = [f"{'wall':>7} {'self':>7} {'child':>7} {'dockerd':>7}  test"]
    for row in sorted(rows, key=lambda r: -r["wall"])[:top]:
        lines.append(
            f"{row['wall']:7.1f} {row['self']:7.1f} {row['children']:7.1f} "
            f"{row['dockerd']:7.1f}  {row['test']}"
        )
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for row in rows:
        xdist_group = row["test"].rsplit("@", 1)[1] if "@" in row["test"] else "-"
        group = row["test"].split("::")[0] + " @" + xdist_group
        for index, key in enumerate(("wall", "self", "children", "dockerd")):
            groups[group][index] += row[key]
    lines.append(f"\n{'wall':>7} {'self':>7} {'child':>7} {'dockerd':>7}  module @group")
    for group, (wall, own, children, dockerd) in sorted(groups.items(), key=lambda g: -g[1][0]):
        lines.append(f"{wall:7.1f} {own:7.1f} {children:7.1f} {dockerd:7.1f}  {group}")
    by_worker: dict[str, float] = defaultdict(float)
    for row in rows:
        by_worker[row["worker"]] += row["wall"]
    lines.append("\nper worker, wall: " + ", ".join(f"{w} {s:.0f} s" for w, s in by_worker.items()))
    if all("machine_busy" in row for row in rows):
        wall = max(r["start"] + r["wall"] for r in rows) - min(r["start"] for r in rows)
        busy = max(r["machine_busy"][1] for r in rows) - min(r["machine_busy"][0] for r in rows)
        cores = os.cpu_count() or 1
        lines.append(
            f"the machine: {busy / 60:.1f} CPU-minutes busy in {wall / 60:.1f} minutes of "
            f"tests on {cores} cores ({100 * busy / (wall * cores):.0f} %)"
        )
    if all("machine_disk" in row for row in rows):
        first = min(rows, key=lambda r: r["start"])["machine_disk"][0]
        last = max(rows, key=lambda r: r["start"] + r["wall"])["machine_disk"][1]
        iowait, read, written = (after - before for before, after in zip(first, last, strict=True))
        lines.append(
            f"the disk: {read / 1e9:.1f} GB read, {written / 1e9:.1f} GB written; the cores "
            f"waited on I/O {iowait / 60:.1f} CPU-minutes"
        )
    lines += _spans([row for row in every if "span" in row], top)
    return "\n".join(lines)


# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), then comp_t utime, stime, mem, io, rw, minflt, majflt, swaps, comm[16].
_ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_ACCT_HZ = 100


def _comp_t(value: int) -> int:
    """A comp_t: 13 bits of mantissa, 3 of base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def process_accounting(path: Path, top: int = 15) -> str:
    """CPU by command name from a process accounting file (`accton FILE` during the run,
    `accton off` after): every process of the machine, the engine's and containers' too."""
    by_command: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    data = path.read_bytes()
    for offset in range(0, len(data) - _ACCT_V3.size + 1, _ACCT_V3.size):
        fields = _ACCT_V3.unpack_from(data, offset)
        if fields[1] != 3:
            raise ValueError(f"{path}: not an acct v3 file (record at byte {offset})")
        command = fields[18].split(b"\0", 1)[0].decode(errors="replace")
        user, system = _comp_t(fields[10]) / _ACCT_HZ, _comp_t(fields[11]) / _ACCT_HZ
        by_command[command][0] += user
        by_command[command][1] += system
        by_command[command][2] += 1
    total = sum(user + system for user, system, _ in by_command.values())
    lines = [f"{'cpu s':>8} {'user':>8} {'sys':>8} {'runs':>6}  command (all: {total:.0f} CPU-s)"]
    ranked = sorted(by_command.items(), key=lambda item: -(item[1][0] + item[1][1]))
    for command, (user, system, runs) in ranked[:top]:
        lines.append(f"{user + system:8.1f} {user:8.1f} {system:8.1f} {runs:6d}  {command}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1])))
    if len(sys.argv) > 2:
        print()
        print(process_accounting(Path(sys.argv[2])))
