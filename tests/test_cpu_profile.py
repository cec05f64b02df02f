"""The suite's own profile (tests/cpu_profile.py): spans of run-wide fixtures and builder
runs, with builder's step lines, land in the profile and in its summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import cpu_profile


def test_a_span_records_its_waited_for_cpu_and_the_builder_steps(tmp_path, monkeypatch) -> None:
    out = tmp_path / "profile.jsonl"
    monkeypatch.setenv(cpu_profile.PROFILE_ENV, str(out))
    spin = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    with cpu_profile.span("builder", "image") as noted:
        subprocess.run([sys.executable, "-c", spin], check=True)
        cpu_profile.note_steps(
            noted,
            "… docker build image\n✓ docker build image (12.5 s)\n✓ patch sglang (2 patches) (0.1 s)\n",
        )
    (line,) = out.read_text().splitlines()
    row = json.loads(line)
    assert row["span"] == "builder" and row["name"] == "image"
    assert row["children"] >= 0.25, row  # the child's CPU, which the wall alone would hide
    assert row["steps"] == [["docker build image", 12.5], ["patch sglang (2 patches)", 0.1]]


def test_no_profile_asked_for_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(cpu_profile.PROFILE_ENV, raising=False)
    with cpu_profile.span("fixture", "test-base"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_summary_adds_spans_and_steps_beside_the_tests(tmp_path: Path) -> None:
    test = {"test": "tests/test_a.py::test_x@g", "worker": "gw0", "start": 0.0, "wall": 5.0,
            "self": 1.0, "children": 2.0, "dockerd": 0.5}  # fmt: skip
    spans = [
        {"span": "builder", "name": "wheels", "wall": 10.0, "self": 0.1, "children": 8.0,
         "steps": [["build wheel sglang 0.5.9+sm120.g9d58e5a", 6.0]]},
        {"span": "builder", "name": "wheels", "wall": 12.0, "self": 0.1, "children": 9.0,
         "steps": [["build wheel sglang 0.5.9+sm120.g1234abc", 7.0]]},
        {"span": "fixture", "name": "test-base", "wall": 40.0, "self": 1.0, "children": 3.0},
    ]  # fmt: skip
    profile = tmp_path / "profile.jsonl"
    profile.write_text("".join(json.dumps(row) + "\n" for row in [test, *spans]))
    summary = cpu_profile.summarize(profile)
    assert "tests/test_a.py::test_x@g" in summary
    assert "    2    22.0    17.2  builder: wheels" in summary
    assert "    1    40.0     4.0  fixture: test-base" in summary
    # one line for both builds: the fork commits in their local versions are folded away
    assert "    2    13.0  build wheel sglang 0.5.9+…" in summary
