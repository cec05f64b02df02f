"""A kernel the server compiles at start-up is reported, harvested and baked into the next
image, whose next start compiles nothing: real image, real flashinfer and nvcc, real engine.

No GPU exists here: the stand-in server (tests/standin_sglang.py, JIT_AT_START) builds a
FlashInfer module missing from the image's list exactly as FlashInfer's JIT does at first
use (`JitSpec.build`: its ninja file, nvcc for sm_120a), without loading it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from builder.kernels import packs
from tests.conftest import REPO_ROOT, Builder, Upstreams, builder_in
from tests.services import free_port
from tests.test_image import image_args
from tests.test_readiness import GOOD_INFO, STANDIN

pytestmark = pytest.mark.docker

MISSING_MODULE = "silu_and_mul"  # gen_act_and_mul_module("silu"): not in the image's list


def _start(docker_client, reference: str) -> tuple[str, str]:
    port, name = free_port(), f"jit-standin-{uuid.uuid4().hex[:8]}"
    docker_client.containers.run(
        reference,
        [str(port)],
        entrypoint=["python", "/standin.py"],
        name=name,
        detach=True,
        network_mode="host",
        environment={"SERVER_INFO": json.dumps(GOOD_INFO), "JIT_AT_START": "silu"},
        volumes={str(STANDIN): {"bind": "/standin.py", "mode": "ro"}},
    )
    return f"http://127.0.0.1:{port}", name


def _wait_ready(builder: Builder, docker_host: str, url: str, name: str) -> dict:
    result = builder.run(
        "wait-ready", url, "--container", name, "--poll", "0.5", "--json",
        env={"DOCKER_HOST": docker_host}, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def _harvest(builder: Builder, docker_host: str, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "builder.cli", "jit", "harvest", "--container", name,
         "--cache-dir", str(builder.cache_dir), "--json"],
        capture_output=True, text=True, cwd=REPO_ROOT,
        env={**os.environ, "DOCKER_HOST": docker_host},
    )  # fmt: skip


def test_a_module_compiled_at_start_is_reported_harvested_and_baked_in(
    tmp_path: Path,
    github: Upstreams,
    docker_host,
    docker_client,
    test_base,
    runtime_index,
    built_image,
) -> None:
    builder = builder_in(tmp_path, github, docker_host)
    # A build host whose kernel cache holds the session image's modules: its first build
    # is that image (no compile); the pack this test harvests goes into its own cache only.
    shutil.copytree(built_image[0].cache_dir / "kernels", builder.cache_dir / "kernels")
    first = json.loads(builder.run(*image_args(test_base, runtime_index, "--json")).stdout)
    reference = first["image"]["reference"]
    assert MISSING_MODULE not in {m["name"] for m in first["image"]["jit_inventory"]["modules"]}

    containers = []
    try:
        url, name = _start(docker_client, reference)
        containers.append(name)
        verdict = _wait_ready(builder, docker_host, url, name)
        assert verdict["flashinfer_compiled_at_start"] == [MISSING_MODULE]

        doctor = builder.run(
            "doctor", "--container", name, "--json", env={"DOCKER_HOST": docker_host},
            check=False,
        )  # fmt: skip
        findings = json.loads(doctor.stdout)["findings"]
        jit = next(f for f in findings if f["check"] == "jit")
        assert not jit["ok"] and MISSING_MODULE in jit["detail"]
        others = next(f for f in findings if f["check"] == "other jit")
        assert others["ok"] and "DeepGEMM 0, sglang JIT 0, Triton 0" in others["detail"]
        assert f"builder jit harvest --container {name}" in jit["fix"]

        harvested = _harvest(builder, docker_host, name)
        assert harvested.returncode == 0, harvested.stderr
        pack = Path(json.loads(harvested.stdout)["pack"])
        assert pack.parent == builder.cache_dir / "kernel-packs"
        with tarfile.open(pack) as tar:
            record = json.load(tar.extractfile("pack.json"))
            names = tar.getnames()
        assert record["modules"] == [MISSING_MODULE]
        assert record["flashinfer_version"].startswith("0.6.3+sm120.g")
        assert record["arch"] == "120a"
        assert f"cached_ops/{MISSING_MODULE}/{MISSING_MODULE}.so" in names
        assert f"cached_ops/{MISSING_MODULE}/.ninja_log" in names
        assert "generated/silu_and_mul.cu" in names  # its generated source, named by build.ninja

        plan = json.loads(
            builder.run(*image_args(test_base, runtime_index, "--plan", "--json")).stdout
        )
        assert plan["stages"]["runtime"]["rebuild"] is None
        assert "kernel packs" in plan["stages"]["flashinfer"]["rebuild"]

        second = json.loads(builder.run(*image_args(test_base, runtime_index, "--json")).stdout)
        assert second["image"]["reference"] != reference
        baked = {m["name"]: m for m in second["image"]["jit_inventory"]["modules"]}
        assert baked[MISSING_MODULE]["arch"] == ["sm_120a"]
        this_run = {m["name"]: m for m in second["image"]["kernel_build"]["modules"]}
        assert this_run[MISSING_MODULE]["source"] == f"pack:{pack.name}"

        url, name = _start(docker_client, second["image"]["reference"])
        containers.append(name)
        verdict = _wait_ready(builder, docker_host, url, name)
        assert verdict["flashinfer_compiled_at_start"] == []
        assert json.loads(_harvest(builder, docker_host, name).stdout)["pack"] is None
    finally:
        for name in containers:
            docker_client.containers.get(name).remove(force=True)


def test_a_tampered_kernel_pack_fails_the_build_and_names_the_file(
    tmp_path: Path, github: Upstreams, docker_host, docker_client, test_base, runtime_index
) -> None:
    builder = builder_in(tmp_path, github, docker_host)
    wheels = json.loads(builder.run("wheels", "--json").stdout)["upstreams"]
    version = wheels["flashinfer"]["wheel"]["version"]
    pack_dir = builder.cache_dir / "kernel-packs"
    module = packs.CompiledModule(version, "120a", "norm", "/unused")
    made = packs.write_pack(
        [module], {"cached_ops/norm/norm.so": (b"the bytes that were hashed", 0o644, 0)},
        tmp_path / "made", "test",
    )  # fmt: skip
    # Same name and pack.json, other bytes for the module: as if altered on the way.
    pack = pack_dir / made.name
    pack_dir.mkdir(parents=True)
    with tarfile.open(made) as source, tarfile.open(pack, "w") as tar:
        for member in source:
            data = source.extractfile(member).read()
            if member.name.endswith("norm.so"):
                data = b"not the bytes that were hashed"
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    planned = json.loads(
        builder.run(*image_args(test_base, runtime_index, "--plan", "--json")).stdout
    )
    result = builder.run(*image_args(test_base, runtime_index), check=False)
    assert result.returncode == 1
    assert "cached_ops/norm/norm.so does not match its sha256" in result.stderr
    with pytest.raises(ImageNotFound):
        docker_client.images.get(planned["reference"])


def _workspace(root: Path, ninja_extra: str = "") -> Path:
    """A FlashInfer workspace as a server leaves it (files only: what harvest reads)."""
    arch_root = root / ".cache/flashinfer/0.7.2+sm120.gabc1234/120f"
    module = arch_root / "cached_ops/norm"
    module.mkdir(parents=True)
    (module / "norm.so").write_bytes(b"\x7fELF not really")
    (arch_root / "generated").mkdir()
    (arch_root / "generated/norm_inst.cu").write_text("// generated\n")
    (module / "build.ninja").write_text(
        f"build norm.cuda.o: compile {arch_root}/generated/norm_inst.cu{ninja_extra}\n"
    )
    return module


def test_harvest_takes_the_module_s_build_folders_only(tmp_path: Path) -> None:
    _workspace(tmp_path / "ws")
    modules, pack = packs.harvest_workspace(tmp_path / "ws", tmp_path / "packs")
    assert [m.name for m in modules] == ["norm"]
    record = packs.pack_record(pack)
    assert set(record["files"]) == {
        "cached_ops/norm/norm.so", "cached_ops/norm/build.ninja", "generated/norm_inst.cu"
    }


def test_harvest_never_reads_outside_the_workspace(tmp_path: Path) -> None:
    """A network-facing server's workspace is not trusted: a link out of it, or a
    build.ninja naming `generated/../../..`, is refused and no pack is written."""
    from builder.errors import BuilderError

    module = _workspace(tmp_path / "link")
    (module / "stolen").symlink_to("/etc/hostname")
    with pytest.raises(BuilderError, match="links or leads outside"):
        packs.harvest_workspace(tmp_path / "link", tmp_path / "packs")

    module = _workspace(tmp_path / "ninja")
    arch_root = module.parent.parent
    escape = f"{arch_root}/generated/" + "../" * len(arch_root.parts) + "etc/hostname"
    (module / "build.ninja").write_text(f"build norm.cuda.o: compile {escape}\n")
    with pytest.raises(BuilderError, match="outside"):
        packs.harvest_workspace(tmp_path / "ninja", tmp_path / "packs")
    assert not (tmp_path / "packs").exists() or not list((tmp_path / "packs").iterdir())
