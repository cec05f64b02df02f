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

from builder import image  # noqa: E402
from builder.target import load_target  # noqa: E402
from tests import services, upstreams  # noqa: E402
from tests.conftest import Upstreams, make_data_dir  # noqa: E402
from tests.test_image import WARM_MODULES  # noqa: E402


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="builder-bench-"))
    daemon = services.start_dockerd(work / "dockerd")
    index = None
    try:
        client = docker.DockerClient(base_url=daemon.host, timeout=900)
        base = services.build_test_base(client, work)
        index, port = services.start_pypiserver(services.runtime_wheelhouse(), work / "pypi.log")
        requirements = services.IMAGE_RUNTIME_REQUIREMENTS
        github = work / "github"
        commits = upstreams.build_all(github)
        data = make_data_dir(work / "data", Upstreams(github, commits))
        command = [
            sys.executable, "-m", "builder.cli", "image", "--json",
            "--data-dir", str(data), "--cache-dir", str(work / "cache"),
            "--mirror", f"https://github.com/=file://{github}/",
            "--wheelhouse", str(work / "wheelhouse"), "--base-image", base,
            "--pip-index-url", f"http://127.0.0.1:{port}/simple/", "--pip-extra-index-url=",
            "--runtime-requirements", str(requirements), "--network-host",
            "--jit-modules", WARM_MODULES,
        ]  # fmt: skip
        env = {"DOCKER_HOST": daemon.host, "PATH": "/usr/bin:/bin"}
        first = json.loads(
            subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
        )
        reference = first["image"]["reference"]
        print(f"built {reference}", flush=True)

        # The same context and build arguments builder used, for the plain docker build.
        target = load_target(data, "sm120")
        labels = client.images.get(reference).labels
        context = work / "context"
        context.mkdir()
        shutil.copy(requirements, context / "requirements-runtime.txt")
        for item in image.recipe_files(target):
            shutil.copy(item, context / item.name)
        for name in ("sglang", "flashinfer", "kernels"):
            (context / "wheels" / name).mkdir(parents=True)
            shutil.copy(
                work / "wheelhouse" / labels[f"io.builder.{name}.wheel"], context / "wheels" / name
            )
        buildargs = {
            "BASE_IMAGE": base, "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple/",
            "PIP_EXTRA_INDEX_URL": "", "JIT_ARCH_LIST": "12.0a",
            "JIT_MODULES": json.dumps(WARM_MODULES.split(";")),
        }  # fmt: skip

        def docker_build() -> None:
            for chunk in client.api.build(
                path=str(context), tag="bench-noop:latest", buildargs=buildargs, decode=True,
                rm=True, network_mode="host",
            ):  # fmt: skip
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])

        def builder_noop() -> None:
            out = subprocess.run(
                command, env=env, check=True, capture_output=True, text=True
            ).stdout
            assert json.loads(out)["image"]["skipped"] is True

        docker_build()  # prime the classic builder's cache for this context
        noop_builder = [timed(builder_noop) for _ in range(args.repeat)]
        noop_docker = [timed(docker_build) for _ in range(args.repeat)]
        b, d = statistics.median(noop_builder), statistics.median(noop_docker)
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
            "noop_builder_s": noop_builder, "noop_docker_build_s": noop_docker, "noop_ratio": b / d,
            "jit_serial_s": serial, "jit_parallel_s": parallel, "jit_ratio": parallel / serial,
            "cores": cores, "image_bytes": total, "jit_layer_bytes": jit_layer,
        }  # fmt: skip
        (REPO / "bench" / "results").mkdir(exist_ok=True)
        (REPO / "bench" / "results" / "image-bench.json").write_text(
            json.dumps(result, indent=2) + "\n"
        )
    finally:
        if index:
            index.terminate()
        daemon.stop()


if __name__ == "__main__":
    main()
