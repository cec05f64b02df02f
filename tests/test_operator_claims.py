"""Every claim builder prints is one it checked (issue #42): qualify's verdict names what it
did not check, doctor prints every check it could not run, and the examples in README.md and
every `--help` parse and resolve with the real parser and profiles.

No Docker engine, network or GPU: the server is the stand-in (tests/standin_sglang.py) run
as a local process, and the daemon is a socket nobody listens on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.test_gates import local_standin  # noqa: F401  (the fixture)

NO_DAEMON = "unix:///nonexistent/docker.sock"


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DOCKER_HOST": NO_DAEMON, "BUILDER_CONFIG": "/nonexistent", **env}
    return subprocess.run(
        [sys.executable, "-m", "builder.cli", *args],
        capture_output=True, text=True, cwd=cwd or REPO_ROOT, env=environ, timeout=300,
    )  # fmt: skip


QUICK = ["--gsm8k", "none", "--concurrency", "1", "--prompts", "2", "--input-len", "16",
         "--output-len", "4", "--prefill-lens", "64", "--needles", "4096",
         "--arithmetic", "2"]  # fmt: skip


def test_qualify_without_image_or_profile_is_partial_not_qualified(
    local_standin,  # noqa: F811
    tmp_path: Path,
) -> None:
    server = local_standin()
    out = tmp_path / "q"
    result = cli("qualify", server.url, *QUICK, "--out", str(out))
    assert result.returncode == 8, result.stdout + result.stderr
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["result"]["ok"] is False and receipt["result"]["verdict"] == "partial"
    unchecked = {n["what"]: n["why"] for n in receipt["not_checked"]}
    assert unchecked["verify"] == "the image is not known (no --image, no --container)"
    assert unchecked["backends"] == "no --profile"
    assert unchecked["compiled at start-up"] == "no --container to look into"
    assert "NVML" in unchecked["GPU state"]
    last = [line for line in result.stdout.splitlines() if line.startswith("partial")]
    assert last == [
        "partial, not qualified: every check that ran passed; skipped: gsm8k; not checked: "
        "verify (the image is not known (no --image, no --container)); backends (no --profile)"
    ]
    assert "qualified: every check passed" not in result.stdout
    # --allow-partial: exit 0, the receipt still says partial.
    allowed = cli("qualify", server.url, *QUICK, "--out", str(out), "--allow-partial", "--json")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    shown = json.loads(allowed.stdout)
    assert shown["ok"] is True and shown["result"]["verdict"] == "partial"
    # --no-throughput leaves throughput out: partial too, named.
    short = cli("qualify", server.url, *QUICK, "--out", str(out), "--no-throughput")
    assert short.returncode == 8
    assert "throughput (--no-throughput)" in short.stdout
