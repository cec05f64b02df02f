"""Image benchmarks, measured side by side in one run (ratios, not absolute promises):

1. a no-op `builder image` (inputs unchanged) vs a no-op `docker build` of the same
   Dockerfile and context (every step cached);
2. the JIT warm-up with one job vs the job budget from cores and memory, same modules,
   inside the built image;
3. the image's size with and without its kernel wheel layer.

Needs what the tests need (Debian's docker.io, debootstrap, PyPI): it builds the same
offline test base and fixture upstreams. `BUILDER_TEST_DOCKER_HOST` reuses a running engine.

    .venv/bin/python bench/image_bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import docker  # noqa: E402

from builder.build import image  # noqa: E402
from tests import services  # noqa: E402
from tests.conftest import STACK_TARGET as TARGET  # noqa: E402
from tests.conftest import WARM_MODULES, make_data_dir, serve_upstreams  # noqa: E402

NOOP_TAG = "builder-bench-noop:latest"  # not builder's tag: a cache miss cannot replace it


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def noop_builds(client, command: list[str], env: dict, context: Path, repeat: int) -> dict:
    """A no-op `builder image` (`command`, inputs unchanged) against a no-op `docker build`
    of the very context and arguments builder's last build used (`--save-context`), each
    `repeat` times, alternating; the medians and their ratio."""
    saved = json.loads((context / image.SAVED_BUILD).read_text())

    def docker_build() -> None:
        for chunk in client.api.build(
            path=str(context), tag=NOOP_TAG, buildargs=saved["buildargs"],
            labels=saved["labels"], network_mode=saved["network_mode"], decode=True, rm=True,
        ):  # fmt: skip
            if "error" in chunk:
                raise RuntimeError(chunk["error"])

    replayed = []

    def builder_noop() -> None:
        run = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        if json.loads(run.stdout)["image"]["skipped"] is not True:
            raise RuntimeError("the no-op `builder image` built something")
        replayed.append("no input changed since" in run.stderr)  # builder/build/noop.py answered

    # Each side once before timing: the classic builder's cache for this context holds every
    # step already; builder's first no-op after a --save-context build records its inputs.
    docker_build()
    builder_noop()
    builder_s, docker_s = [], []
    for _ in range(repeat):
        builder_s.append(timed(builder_noop))
        docker_s.append(timed(docker_build))
    b, d = statistics.median(builder_s), statistics.median(docker_s)
    return {
        "noop_builder_s": builder_s,
        "noop_docker_build_s": docker_s,
        "noop_ratio": b / d,
        "noop_builder_replayed": replayed[1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="builder-bench-"))
    daemon = services.start_dockerd(work / "dockerd")
    index = git_daemon = None
    try:
        client = docker.DockerClient(base_url=daemon.host, timeout=900)
        base = services.build_test_base(client, work)
        index, port = services.start_pypiserver(services.runtime_wheelhouse(), work / "pypi.log")
        fixture, git_daemon = serve_upstreams(work / "github")
        data = make_data_dir(work / "data", fixture)
        command = [
            sys.executable, "-m", "builder.cli.main", "image", "--json",
            "--data-dir", str(data), "--cache-dir", str(work / "cache"),
            "--mirror", fixture.mirror,
            "--wheelhouse", str(work / "wheelhouse"), "--base-image", base,
            "--pip-index-url", f"http://127.0.0.1:{port}/simple/", "--pip-extra-index-url=",
            "--runtime-requirements", str(services.IMAGE_RUNTIME_LOCK), "--network-host",
            "--jit-modules", WARM_MODULES,
        ]  # fmt: skip
        env = {"DOCKER_HOST": daemon.host, "PATH": "/usr/bin:/bin", "BUILDER_TARGET": TARGET}
        context = work / "context"
        first = json.loads(
            subprocess.run(
                [*command, "--save-context", str(context)],
                env=env, check=True, capture_output=True, text=True,
            ).stdout
        )  # fmt: skip
        reference = first["image"]["reference"]
        print(f"built {reference}", flush=True)

        noop = noop_builds(client, command, env, context, args.repeat)
        b = statistics.median(noop["noop_builder_s"])
        d = statistics.median(noop["noop_docker_build_s"])
        print(f"no-op: builder image {b:.2f} s, docker build {d:.2f} s, ratio {b / d:.2f}")

        def warmup(jobs: int) -> float:
            modules = shlex.quote(json.dumps(WARM_MODULES.split(";")))
            script = (
                "rm -rf /tmp/ws && FLASHINFER_WORKSPACE_BASE=/tmp/ws python /opt/builder/jit_warmup.py"
                f" --modules {modules} --jobs {jobs} --inventory /tmp/inv.json"
            )
            return timed(
                lambda: client.containers.run(
                    reference, ["-c", script], entrypoint=["sh"], remove=True
                )
            )

        cores = len(os.sched_getaffinity(0))
        serial, parallel = warmup(1), warmup(0)
        print(
            f"JIT warm-up (2 modules, {cores} cores): 1 job {serial:.0f} s, auto {parallel:.0f} s, ratio {parallel / serial:.2f}"
        )

        history = client.images.get(reference).history()
        jit_layer = sum(h["Size"] for h in history if "jit_warmup.py --check" in h["CreatedBy"])
        total = client.images.get(reference).attrs["Size"]
        print(
            f"image size: {total / 1e6:.0f} MB with the kernel wheel, {(total - jit_layer) / 1e6:.0f} MB "
            f"without; its layer is {jit_layer / 1e6:.1f} MB "
            f"({len(first['image']['jit_inventory']['modules'])} modules)"
        )
        result = {
            **noop,
            "jit_serial_s": serial, "jit_parallel_s": parallel, "jit_ratio": parallel / serial,
            "cores": cores, "image_bytes": total, "jit_layer_bytes": jit_layer,
        }  # fmt: skip
        (REPO / "bench" / "results").mkdir(exist_ok=True)
        (REPO / "bench" / "results" / "image-bench.json").write_text(
            json.dumps(result, indent=2) + "\n"
        )
    finally:
        for process in (index, git_daemon):
            if process:
                process.terminate()
        daemon.stop(remove_data=True)  # its images are gigabytes
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
