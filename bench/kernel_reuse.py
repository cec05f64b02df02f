"""Kernel reuse benchmarks (issue 11), measured side by side in one run:

(a) after a comm-only patch change, the kernel step with the earlier build's entries
    (only the changed module compiles) against today's full rebuild of the same module set
    (an empty kernel cache), both on the changed source;
(b) a fresh host (its own Docker engine and an empty cache) taking the kernels from a
    registry that another host filled, against the same fresh host building cold.

The kernel step is what `builder image` reports as `kernel_build.seconds`: the key lookup,
fetching entries, reusing or compiling, and the kernel wheel (not the Docker stages around
it). The module set: four of the GLM-5 server's unchanged-by-comm modules that compile in
minutes here (norm, fp4_quantization_120, the MLA decode and the ragged prefill attention;
fused_moe_120 and the fp4 GEMM take hours on 2 cores), and vllm_comm as the comm module
the change touches (trtllm_comm itself takes minutes per compile here).

Needs what the tests need (Debian's docker.io, docker-registry, debootstrap, PyPI).

    .venv/bin/python bench/kernel_reuse.py [--out bench/results/kernel-reuse.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import docker  # noqa: E402

from builder.build.kernels import trust as kernel_trust  # noqa: E402
from tests import services  # noqa: E402
from tests.build.test_kernels_shared import comm_only_patch  # noqa: E402
from tests.conftest import (  # noqa: E402
    REGISTRY_PASSWORD,
    REGISTRY_USER,
    STACK_TARGET,
    make_data_dir,
    serve_upstreams,
)

MODULES = (
    "flashinfer.jit.norm:gen_norm_module;"
    "flashinfer.jit.fp4_quantization:gen_fp4_quantization_sm120_module;"
    "flashinfer.jit.attention.modules:gen_batch_mla_module('fa2', torch.bfloat16, "
    "torch.bfloat16, torch.bfloat16, torch.int32, 512, 64, False);"
    "flashinfer.jit.attention.modules:gen_batch_prefill_module('fa2', torch.bfloat16, "
    "torch.bfloat16, torch.bfloat16, torch.int32, 256, 256, 0, False, False, False);"
    "flashinfer.jit.comm:gen_vllm_comm_module"
)
SIGNING: dict[str, str] = {}
CREDENTIALS = {
    "BUILDER_REGISTRY_USERNAME": REGISTRY_USER,
    "BUILDER_REGISTRY_PASSWORD": REGISTRY_PASSWORD,
    "BUILDER_REGISTRY_HOST": "127.0.0.1",  # credentials go only to this registry host
}


class Host:
    """One build host: an engine, a cache folder and a wheelhouse."""

    def __init__(self, name: str, work: Path, engine: str, base: str, common: list[str]) -> None:
        self.name, self.engine, self.base = name, engine, base
        self.cache = work / ("cache-" + "".join(c if c.isalnum() else "-" for c in name))
        self.common = common

    def image(self, *extra: str) -> dict:
        command = [
            sys.executable, "-m", "builder.cli.main", "image", "--json", "--cache-dir", str(self.cache),
            "--base-image", self.base, *self.common, *extra,
        ]  # fmt: skip
        env = {"DOCKER_HOST": self.engine, "PATH": "/usr/bin:/bin", **CREDENTIALS, **SIGNING}
        run = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
        if run.returncode:
            raise SystemExit(f"{self.name}: builder image failed:\n{run.stderr[-3000:]}")
        record = json.loads(run.stdout)["image"]["kernel_build"]
        compiled = [m["name"] for m in record["modules"] if m["source"] != "reused"]
        print(f"{self.name}: kernel step {record['seconds']} s, compiled {compiled}", flush=True)
        return {"seconds": record["seconds"], "compiled": compiled, "entries": record["entries"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/kernel-reuse.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="builder-kernel-bench-"))
    # Registry entries are used only when a trusted key signed them (builder jit keygen).
    private, public = kernel_trust.generate(work / "keys")
    SIGNING.update({kernel_trust.SIGNING_KEY_ENV: str(private),
                    kernel_trust.TRUSTED_KEYS_ENV: str(public)})  # fmt: skip
    engines = [services.start_dockerd(work / "engine-a")]
    processes = []
    try:
        client_a = docker.DockerClient(base_url=engines[0].host, timeout=900)
        base_a = services.build_test_base(client_a, work / "base-a")
        index, port = services.start_pypiserver(services.runtime_wheelhouse(), work / "pypi.log")
        registry, registry_port = services.start_registry(
            work / "registry", REGISTRY_USER, REGISTRY_PASSWORD
        )
        processes += [index, registry]
        fixture, git_daemon = serve_upstreams(work / "github")
        processes.append(git_daemon)
        data = make_data_dir(work / "data", fixture)
        common = [
            # The fixture's sources are the sm120-0.5.9 stack's (flashinfer 0.6.3 on PyPI).
            "--target", STACK_TARGET, "--data-dir", str(data), "--mirror", fixture.mirror,
            "--wheelhouse", str(work / "wheelhouse"),
            "--pip-index-url", f"http://127.0.0.1:{port}/simple/", "--pip-extra-index-url=",
            "--runtime-requirements", str(services.IMAGE_RUNTIME_LOCK),
            "--network-host", "--jit-modules", MODULES,
        ]  # fmt: skip
        shared = f"127.0.0.1:{registry_port}/sm120-kernels"

        # (a) host A builds, the comm-only change lands, host A rebuilds with its entries;
        # then the same changed source with an empty kernel cache (today's full rebuild).
        host_a = Host("host A", work, engines[0].host, base_a, common)
        first = host_a.image("--kernel-registry", shared)
        comm_patch = comm_only_patch(fixture, data)
        warm = host_a.image()
        full = Host("host A, empty kernel cache", work, engines[0].host, base_a, common).image()
        comm_patch.unlink()  # back to the source host A shared in its first build

        # (b) host B: its own engine (fresh data root) and caches; shared vs cold.
        engines.append(services.start_dockerd(work / "engine-b", second=True))
        client_b = docker.DockerClient(base_url=engines[1].host, timeout=900)
        base_b = services.build_test_base(client_b, work / "base-b")
        from_registry = Host("host B, shared", work, engines[1].host, base_b, common).image(
            "--kernel-registry", shared
        )
        cold = Host("host B, cold", work, engines[1].host, base_b, common).image()

        results = {
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, no GPU",
            "modules": MODULES.split(";"),
            "first_build": first,
            "a_comm_only_change": {
                "reuse": warm,
                "full_rebuild": full,
                "ratio": round(full["seconds"] / warm["seconds"], 1),
                "goal": "only the changed module compiles; ratio >= 5",
            },
            "b_fresh_host": {
                "shared": from_registry,
                "cold": cold,
                "ratio": round(cold["seconds"] / from_registry["seconds"], 1),
                "goal": "no nvcc call (nothing compiled); ratio >= 10",
            },
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps({k: v for k, v in results.items() if k[:2] in ("a_", "b_")}, indent=2))
    finally:
        for process in processes:
            process.terminate()
        for engine in engines:
            engine.stop()
        shutil.rmtree(work, ignore_errors=True)  # two engines' data: gigabytes


if __name__ == "__main__":
    main()
