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

import json
import os
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


def summarize(path: Path, top: int = 25) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
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
