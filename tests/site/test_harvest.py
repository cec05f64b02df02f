"""A kernel the server compiles at start-up is reported, harvested (its generator call, as
the image's JIT journal noted it, never its compiled file) and compiled into the next image,
whose next start compiles nothing: real image, real flashinfer and nvcc, real engine.

No GPU exists here: the stand-in server (tests/standin_sglang.py, JIT_AT_START) builds a
FlashInfer module missing from the image's list exactly as FlashInfer's JIT does at first
use (`JitSpec.build`: its ninja file, nvcc for sm_120a), without loading it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from builder.spec.jit import packs
from tests.build.test_image import image_args
from tests.conftest import REPO_ROOT, Builder, Upstreams, builder_in, seed_cache
from tests.services import free_port
from tests.site.test_readiness import GOOD_INFO, STANDIN

pytestmark = pytest.mark.docker

MISSING_MODULE = "silu_and_mul"  # gen_act_and_mul_module("silu"): not in the image's list
MISSING_CALL = "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='silu')"


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
        [sys.executable, "-m", "builder.cli.main", "jit", "harvest", "--container", name,
         "--cache-dir", str(builder.cache_dir), "--json"],
        capture_output=True, text=True, cwd=REPO_ROOT,
        env={**os.environ, "DOCKER_HOST": docker_host},
    )  # fmt: skip


def test_a_module_compiled_at_start_is_reported_harvested_and_compiled_into_the_next_image(
    tmp_path: Path,
    github: Upstreams,
    built_image,  # first: the run's first engine test builds the fork wheels before the base
    docker_host,
    docker_client,
    test_base,
    runtime_index,
) -> None:
    builder = builder_in(tmp_path, github, docker_host)
    # A build host whose kernel cache holds the session image's modules: its first build
    # is that image (no compile); the pack this test harvests goes into its own cache only.
    shutil.copytree(built_image[0].cache_dir / "kernels", builder.cache_dir / "kernels")
    seed_cache(builder, built_image[0].cache_dir)
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
        record = packs.pack_record(pack)
        assert record["modules"] == {MISSING_MODULE: MISSING_CALL}  # from the JIT journal
        assert record["flashinfer_version"].startswith("0.6.3+sm120.g")
        assert record["arch"] == "120a"
        compiled = docker_client.containers.get(name).get_archive(
            f"/opt/flashinfer/.cache/flashinfer/{record['flashinfer_version']}/120a/"
            f"cached_ops/{MISSING_MODULE}/{MISSING_MODULE}.so"
        )[0]
        assert b"".join(compiled)[-4096:] not in pack.read_bytes()  # names, never the .so

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
        assert this_run[MISSING_MODULE]["source"] == "compiled"  # here, from our own source
        assert this_run[MISSING_MODULE]["harvested_from"] == pack.name

        url, name = _start(docker_client, second["image"]["reference"])
        containers.append(name)
        verdict = _wait_ready(builder, docker_host, url, name)
        assert verdict["flashinfer_compiled_at_start"] == []
        assert json.loads(_harvest(builder, docker_host, name).stdout)["pack"] is None
    finally:
        for name in containers:
            docker_client.containers.get(name).remove(force=True)


def test_a_pack_whose_call_the_kernel_build_refuses_is_moved_aside_and_the_build_goes_on(
    tmp_path: Path, github: Upstreams, docker_host, docker_client, test_base, runtime_index,
    built_image,
) -> None:  # fmt: skip
    """Whoever writes a pack can give it a matching name: what it asks for is checked. A
    FlashInfer call that makes another module than the pack names is refused by the kernel
    build (a call that is not a FlashInfer generator never gets there: see the test below);
    the pack is named and moved aside, and this build goes on without it: the test image,
    whose kernels this host already has (its cache seeded with them)."""
    builder = builder_in(tmp_path, github, docker_host)
    seed_cache(builder, built_image[0].cache_dir, ("mirrors", "wheels", "kernels", "kernel-wheels"))
    wheels = json.loads(builder.run("wheels", "--json").stdout)["upstreams"]
    version = wheels["flashinfer"]["wheel"]["version"]
    pack_dir = builder.cache_dir / "kernel-packs"
    module = packs.CompiledModule(version, "120a", "norm", "/unused")
    wrong = "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='gelu')"
    forged = packs.write_pack([module], {"norm": wrong}, pack_dir, "t")

    result = builder.run(*image_args(test_base, runtime_index, "--json"))
    named = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(named) == 1 and forged.name in named[0], result.stderr
    assert f"{forged}: {wrong} makes module gelu_and_mul, not norm: refused" in named[0]
    assert f"(kernel pack skipped: moved aside to {forged.name}.rejected)" in named[0]
    assert not forged.exists() and (pack_dir / f"{forged.name}.rejected").is_file()
    image = json.loads(result.stdout)["image"]
    assert image["reference"] == built_image[1]["reference"], "the image without the pack"
    assert wrong not in json.dumps(image["jit_inventory"])
    again = builder.run(*image_args(test_base, runtime_index))
    assert "kernel pack" not in again.stderr


def test_a_bad_kernel_pack_is_named_moved_aside_and_fails_no_build(
    builder: Builder, fork_wheels: Path
) -> None:
    """A pack in the cache that is not one (unreadable, renamed, a refused call, a link to
    an endless file) is one warning line naming it and goes aside as `.rejected`: the plan
    (and the build) goes on with the good packs, and the next run says nothing of them."""
    seed_cache(builder, fork_wheels)
    wheels = json.loads(builder.run("wheels", "--json").stdout)["upstreams"]
    version = wheels["flashinfer"]["wheel"]["version"]
    pack_dir = builder.cache_dir / "kernel-packs"
    good = packs.write_pack(
        [packs.CompiledModule(version, "120a", "norm", "/unused")], {"norm": NORM_CALL},
        pack_dir, "t",
    )  # fmt: skip
    forged = packs.write_pack(
        [packs.CompiledModule(version, "120a", "rms", "/unused")],
        {"rms": "os:system('touch /pwned')"}, pack_dir, "t",
    )  # fmt: skip
    renamed = packs.write_pack(
        [packs.CompiledModule(version, "120a", "silu", "/unused")], {}, pack_dir, "t"
    ).rename(pack_dir / f"flashinfer-{version}-120a-000000000000.kernel-pack.json")
    broken = pack_dir / f"flashinfer-{version}-120a-111111111111.kernel-pack.json"
    broken.write_text('{"schema_version": 2, "modules": ')
    endless = pack_dir / "endless.kernel-pack.json"
    endless.symlink_to("/dev/zero")
    no_daemon = {"DOCKER_HOST": "unix:///nonexistent.sock"}

    result = builder.run("image", "--plan", "--json", env=no_daemon)
    kernels = json.loads(result.stdout)["kernels"]
    assert kernels[-1] == {"generator": NORM_CALL, "harvested_from": good.name}
    assert "pwned" not in result.stdout
    for bad, why in [
        (forged, "is not a FlashInfer call: refused"),
        (renamed, "its name does not match its content"),
        (broken, "not a kernel pack"),
        (endless, "is a symbolic link, not a kernel pack"),
    ]:
        named = [line for line in result.stderr.splitlines() if str(bad) in line]
        assert len(named) == 1 and why in named[0], result.stderr
        assert f"(kernel pack skipped: moved aside to {bad.name}.rejected)" in named[0]
        assert not os.path.lexists(bad) and os.path.lexists(f"{bad}.rejected")
    assert good.is_file()
    again = builder.run("image", "--plan", "--json", env=no_daemon)
    assert "kernel pack" not in again.stderr
    assert json.loads(again.stdout)["kernels"] == kernels


def _workspace(root: Path, journal: str = "") -> Path:
    """A FlashInfer workspace as a server leaves it (files only: what harvest reads)."""
    arch_root = root / ".cache/flashinfer/0.7.2+sm120.gabc1234/120f"
    module = arch_root / "cached_ops/norm"
    module.mkdir(parents=True)
    (module / "norm.so").write_bytes(b"\x7fELF the server's own bytes")
    (module / "build.ninja").write_text("build norm.cuda.o: compile norm.cu\n")
    if journal:
        (arch_root / packs.JOURNAL).write_text(journal)
    return module


NORM_CALL = "flashinfer.jit.norm:gen_norm_module()"


def test_harvest_keeps_each_module_s_call_never_its_files(tmp_path: Path) -> None:
    journal = "\n".join([
        "not json",
        json.dumps({"name": "norm", "generator": NORM_CALL}),
        json.dumps({"name": "other", "generator": "flashinfer.jit.x:gen_y(1, torch.float16)"}),
        json.dumps({"name": ["odd"], "generator": NORM_CALL}),
    ])  # fmt: skip
    _workspace(tmp_path / "ws", journal)
    modules, pack = packs.harvest_workspace(tmp_path / "ws", tmp_path / "packs")
    assert [m.name for m in modules] == ["norm"]
    assert packs.pack_record(pack)["modules"] == {"norm": NORM_CALL}
    assert b"the server's own bytes" not in pack.read_bytes()
    calls, problems = packs.harvested_modules([pack])
    assert calls == {NORM_CALL: {"name": "norm", "pack": pack.name}} and problems == []

    # No journal (bare metal, or a server outside builder's image): named, not guessed.
    _workspace(tmp_path / "bare")
    _, pack = packs.harvest_workspace(tmp_path / "bare", tmp_path / "packs2")
    assert packs.pack_record(pack)["modules"] == {"norm": None}
    calls, problems = packs.harvested_modules([pack])
    assert calls == {} and "module norm was compiled at run time, but no journal" in problems[0]


@pytest.mark.parametrize(
    "call",
    [
        "os:system('id')",
        "flashinfer.jit.norm:gen_norm_module(__import__('os').system('id'))",
        "flashinfer.jit.norm:gen_norm_module(torch.load('x'))",
        "flashinfer.jit.norm:gen_norm_module(**{'a': 1})",
        "flashinfer.jit.norm:run_anything()",
        "flashinfer.jit.norm:gen_norm_module() or print(1)",
        "flashinfer.jit.norm:gen_norm_module(b'bytes')",
        "flashinfer.utils:gen_anything()",  # not a flashinfer.jit generator module
        # Takes C++ source and picks the module's name: the server's own code, compiled here.
        "flashinfer.jit.attention.modules:gen_customize_single_decode_module("
        "uri='norm', variant_decl='struct V { }; // the server writes this')",
        "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='silu; rm -rf /')",
    ],
)
def test_a_journal_line_that_asks_for_more_than_a_plain_flashinfer_call_is_skipped(
    tmp_path: Path, call: str, capsys
) -> None:
    """A network-facing server writes the journal: it may name a module and plain arguments
    (numbers, identifiers, dtypes), nothing that runs or is compiled as given. Such a line
    is skipped with a warning; the module is harvested without a call."""
    _workspace(tmp_path / "ws", json.dumps({"name": "norm", "generator": call}))
    _, pack = packs.harvest_workspace(tmp_path / "ws", tmp_path / "packs")
    assert packs.pack_record(pack)["modules"] == {"norm": None}
    assert "is not a FlashInfer call: refused (skipped)" in capsys.readouterr().err


def test_plain_arguments_of_every_kind_are_kept(tmp_path: Path) -> None:
    """What the image's journal writes for a real generator (negative window, float scale,
    bool, None, a dtype) comes back as written."""
    call = ("flashinfer.jit.attention.modules:gen_batch_prefill_module(backend='fa2', "
            "dtype_q=torch.bfloat16, window_left=-1, scale=1.5, use_fp16_qk_reduction=False, "
            "extra=None)")  # fmt: skip
    _workspace(tmp_path / "ws", json.dumps({"name": "norm", "generator": call}))
    _, pack = packs.harvest_workspace(tmp_path / "ws", tmp_path / "packs")
    assert packs.pack_record(pack)["modules"] == {"norm": call}
    assert packs.harvested_modules([pack])[0] == {call: {"name": "norm", "pack": pack.name}}


def test_a_linked_journal_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps({"name": "norm", "generator": NORM_CALL}))
    module = _workspace(tmp_path / "ws")
    (module.parent.parent / packs.JOURNAL).symlink_to(elsewhere)
    _, pack = packs.harvest_workspace(tmp_path / "ws", tmp_path / "packs")
    assert packs.pack_record(pack)["modules"] == {"norm": None}
