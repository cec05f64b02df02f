"""Cold fetch of the flashinfer pin with its submodules: `builder sources` against git's own
shallow clone, side by side in one run, over loopback.

The upstream is the tests' fixture (flashinfer 0.6.3's sdist as a git repository with cutlass
and spdlog as real submodules, laid out like GitHub), served by `git daemon` on 127.0.0.1
with `uploadpack.allowAnySHA1InWant` (as GitHub allows a submodule's commit to be asked for
by id). Each round, in alternating order, from nothing:

  git    git clone --depth 1 --branch <pin's tag> --recurse-submodules --shallow-submodules
  builder builder sources --upstream flashinfer, an empty cache, --mirror to the daemon

and the ratio of the medians. Needs git (scripts/setup --test installs it) and PyPI for the
sdist (cached, as the tests do).

    .venv/bin/python bench/fetch_bench.py [--repeat 5] [--out bench/results/fetch-bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import make_data_dir, serve_upstreams  # noqa: E402


# For git's clone (its submodule clones too): github.com's URLs in .gitmodules rewritten to
# the daemon, as --mirror does for builder.
def _git_env(config: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_NOSYSTEM"], env["HOME"] = "1", "/nonexistent"
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for number, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{number}"], env[f"GIT_CONFIG_VALUE_{number}"] = key, value
    return env


def _timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/fetch-bench.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="builder-fetch-bench-"))
    daemon = None
    try:
        fixture, daemon = serve_upstreams(work / "github", allow_any_sha=True)
        served = fixture.served
        data = make_data_dir(work / "data", fixture)
        pin = tomllib.loads((data / "forks/flashinfer-0.6.3/pin.toml").read_text())
        clone_env = _git_env({f"url.{served}.insteadOf": "https://github.com/"})
        tag = pin["ref"].removeprefix("refs/tags/")
        times: dict[str, list[float]] = {"git": [], "builder": []}
        for round_number in range(args.repeat):
            order = ["git", "builder"] if round_number % 2 == 0 else ["builder", "git"]
            for tool in order:
                destination = work / f"{tool}-{round_number}"
                if tool == "git":
                    command = [
                        "git", "clone", "-q", "--depth", "1", "--branch", tag,
                        "--recurse-submodules", "--shallow-submodules",
                        f"{served}flashinfer-ai/flashinfer.git", str(destination),
                    ]  # fmt: skip
                    times[tool].append(_timed(command, clone_env))
                else:
                    command = [
                        sys.executable, "-m", "builder.cli.main", "-q", "sources", "--target",
                        "sm120-0.5.9", "--upstream", "flashinfer", "--data-dir", str(data),
                        "--cache-dir", str(destination), "--mirror",
                        f"https://github.com/={served}",
                    ]  # fmt: skip
                    times[tool].append(_timed(command, {**os.environ, "HOME": str(work)}))
                shutil.rmtree(destination)
            print(f"round {round_number + 1}: " + ", ".join(
                f"{tool} {times[tool][-1]:.2f} s" for tool in times
            ), flush=True)  # fmt: skip
        medians = {tool: statistics.median(values) for tool, values in times.items()}
        result = {
            "machine": f"{os.cpu_count()} cores, {platform.machine()}",
            "upstream": "flashinfer 0.6.3 (tests' fixture) with cutlass and spdlog as submodules",
            "transport": "git daemon on 127.0.0.1, uploadpack.allowAnySHA1InWant",
            "git": "git clone --depth 1 --recurse-submodules --shallow-submodules",
            "builder": "builder sources --upstream flashinfer (empty cache)",
            "seconds": {tool: [round(v, 3) for v in values] for tool, values in times.items()},
            "median_s": {tool: round(value, 2) for tool, value in medians.items()},
            "ratio_builder_to_git": round(medians["builder"] / medians["git"], 2),
            "goal": "<= 1.0",
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k] for k in ("median_s", "ratio_builder_to_git")}))
    finally:
        if daemon:
            daemon.terminate()
            daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
