"""Each kernel compiled once: per-module keys, the kernel wheel, kernels shared through a
real registry and installed from a real index, on the real engine with real nvcc.

The module set is two cheap modules: `gelu_tanh_and_mul` (7 s of nvcc) and vllm's custom
all-reduce (`vllm_comm`, 13 s), which stands for the comm module (trtllm_comm takes minutes
per compile). A test that must compile one module again takes vllm_comm. The comm-only
change is a real patch on top of the series that edits the comm header only that module
includes.
"""

from __future__ import annotations

import atexit
import base64
import difflib
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import pygit2
import pytest
from packaging.utils import canonicalize_name

from builder.build.kernels import trust as kernel_trust
from builder.spec.lockfile import parse
from tests.build.test_image import image_args
from tests.conftest import (
    IMAGE_REPOSITORY,
    REGISTRY_PASSWORD,
    REGISTRY_USER,
    Builder,
    Upstreams,
    builder_in,
    container_events,
    fresh_second,
    pip_freeze,
    seed_cache,
)
from tests.services import IMAGE_RUNTIME_LOCK, build_test_base, start_dockerd, start_pypiserver

pytestmark = pytest.mark.docker

MODULES = "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='gelu_tanh');flashinfer.jit.comm:gen_vllm_comm_module"
COMM_HEADER = "include/flashinfer/comm/vllm_custom_all_reduce.cuh"
# The site's kernel signing key pair, as `builder jit keygen` makes it (one per test process,
# deleted when it ends).
_KEYS = tempfile.mkdtemp(prefix="builder-keys-")
atexit.register(shutil.rmtree, _KEYS, ignore_errors=True)
SITE_KEY, SITE_PUBLIC = kernel_trust.generate(Path(_KEYS))
KERNEL_TRUST_ENV = {
    kernel_trust.SIGNING_KEY_ENV: str(SITE_KEY),
    kernel_trust.TRUSTED_KEYS_ENV: str(SITE_PUBLIC),
}
REGISTRY_ENV = {
    "BUILDER_REGISTRY_USERNAME": REGISTRY_USER,
    "BUILDER_REGISTRY_PASSWORD": REGISTRY_PASSWORD,
    "BUILDER_REGISTRY_HOST": "127.0.0.1",  # the test registries, on loopback
    **KERNEL_TRUST_ENV,
}


# These tests share the engine with the other engine group, whose tests count the tags and
# containers of IMAGE_REPOSITORY (tests/conftest.py): these build under their own.
REPOSITORY = f"{IMAGE_REPOSITORY}-kernels"


def host(root: Path, github: Upstreams, docker_host: str, seed: Builder | None = None) -> Builder:
    """A build host's builder (its own data copy, cache and wheelhouse) on `docker_host`;
    with `seed`, its cache starts with that builder's mirrors and fork wheels (the kernel
    step is what these tests are about, and a kernel cache is never seeded)."""
    builder = builder_in(root, github, docker_host)
    if seed:
        seed_cache(builder, seed.cache_dir)
    target = builder.data_dir / "images/sm120-0.5.9/target.toml"
    text = target.read_text()
    assert "\n[image]\n" in text, target
    target.write_text(text.replace("\n[image]\n", f'\n[image]\nrepository = "{REPOSITORY}"\n', 1))
    return builder


def kernel_args(test_base: str, runtime_index, *extra: str, modules: str = MODULES) -> list[str]:
    args = image_args(test_base, runtime_index, "--json", *extra)
    args[args.index("--jit-modules") + 1] = modules
    return args


def by_name(record: dict) -> dict[str, dict]:
    return {m["name"]: m for m in record["modules"]}


def this_run(result: dict) -> dict[str, dict]:
    """Per module, how this `builder image` run got it (source, reason, key)."""
    return by_name(result["image"]["kernel_build"])


def registry_tags(registry: str, repository: str) -> list[str]:
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/tags/list")
    token = base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["tags"] or []


def comm_only_patch(github: Upstreams, data_dir: Path) -> Path:
    """A patch after the series that appends a line to the vllm comm header."""
    repository = pygit2.Repository(str(github.root / "flashinfer-ai" / "flashinfer.git"))
    tree = repository[github.commits["flashinfer"]].peel(pygit2.Commit).tree
    old = (tree / COMM_HEADER).data.decode()
    new = old + "// builder tests: a comm-only change\n"
    diff = "".join(
        difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), f"a/{COMM_HEADER}", f"b/{COMM_HEADER}"
        )
    )
    patch = data_dir / "forks/flashinfer-0.6.3/patches/sm120/0004-comm-only-change.patch"
    patch.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: builder tests <tests@example.invalid>\n"
        "Date: Thu, 19 Feb 2026 00:00:00 +0000\n"
        "Subject: [PATCH] comm: a comment in the vllm all-reduce header\n\n"
        f"---\ndiff --git a/{COMM_HEADER} b/{COMM_HEADER}\n{diff}--\n2.43.0\n"
    )
    return patch


def forget_kernel_wheels(builder: Builder) -> None:
    """The kernel wheel cache short-cuts the kernel step; these tests need the step."""
    for wheel_folder in (builder.cache_dir / "kernel-wheels").glob("*"):
        for path in wheel_folder.iterdir():
            path.unlink()
        wheel_folder.rmdir()


@pytest.fixture(scope="module")
def host_a(
    tmp_path_factory, github: Upstreams, docker_host, test_base, runtime_index, registry,
    built_image,
):  # fmt: skip
    builder = host(tmp_path_factory.mktemp("host-a"), github, docker_host, seed=built_image[0])
    shared = f"{registry}/kernels"
    result = builder.run(
        *kernel_args(test_base, runtime_index, "--kernel-registry", shared), env=REGISTRY_ENV
    )
    return builder, json.loads(result.stdout), shared, result.stderr


def test_first_build_compiles_each_module_once_and_shares_it(host_a, registry) -> None:
    builder, result, shared, _ = host_a
    modules = this_run(result)
    assert set(modules) == {"gelu_tanh_and_mul", "vllm_comm"}
    assert set(by_name(result["image"]["jit_inventory"])) == {"gelu_tanh_and_mul", "vllm_comm"}
    assert {m["source"] for m in modules.values()} == {"compiled"}
    local = {p.name for p in (builder.cache_dir / "kernels").glob("*.kernel.tar")}
    assert local == {f"{m['lookup']}.{m['key'][:16]}.kernel.tar" for m in modules.values()}
    tags = registry_tags(registry, shared.split("/", 1)[1])
    assert sorted(tags) == sorted(m["lookup"] for m in modules.values())


def test_a_fresh_host_takes_every_kernel_from_the_registry(
    host_a, tmp_path_factory, github: Upstreams, runtime_index, docker_client, fork_wheels
) -> None:
    """Host B: its own Docker engine (fresh data root) and cache, the same data. Its image
    is a second, independent build from the same runtime lock: the same packages. Its cache
    starts with the run's fork wheels and mirrors only (that they build the same bytes on
    any host is test_wheels_real_upstream's): no kernel, no image layer."""
    _, first, shared, _ = host_a
    engine = start_dockerd(tmp_path_factory.mktemp("host-b-engine"), second=True)
    try:
        import docker

        client_b = docker.DockerClient(base_url=engine.host, timeout=900)
        base_b = build_test_base(client_b, tmp_path_factory.mktemp("host-b-base"))
        builder = host(tmp_path_factory.mktemp("host-b"), github, engine.host)
        seed_cache(builder, fork_wheels)
        since = fresh_second()
        result = builder.run(
            *kernel_args(base_b, runtime_index, "--kernel-registry", shared), env=REGISTRY_ENV
        )
        kernel_step_starts = [
            event
            for event in container_events(client_b, "start", since)
            if ":kernel-builder-" in event["Actor"]["Attributes"].get("image", "")
        ]
        second = json.loads(result.stdout)
        installed_b = pip_freeze(client_b, second["image"]["reference"])
    finally:
        engine.stop(remove_data=True)
    installed_a = pip_freeze(docker_client, first["image"]["reference"])
    assert installed_a == installed_b
    frozen = dict(line.split("==") for line in installed_a if "==" in line)
    frozen = {canonicalize_name(name): version for name, version in frozen.items()}
    locked = {name: package.version for name, package in parse(IMAGE_RUNTIME_LOCK).packages.items()}
    assert locked.items() <= frozen.items()
    modules = this_run(second)
    assert {m["source"] for m in modules.values()} == {"reused"}
    assert "2 of 2 modules have an entry (2 from the registry)" in result.stderr
    assert "0 to compile" in result.stderr, "no nvcc call on the fresh host"
    assert len(kernel_step_starts) == 1, "nothing compiles: the kernel step is one container"
    # Same kernels, same wheel bytes: the kernel wheel is reproducible across hosts.
    wheel_a, wheel_b = first["image"]["kernel_wheel"], second["image"]["kernel_wheel"]
    assert wheel_a == wheel_b
    assert (builder.wheelhouse / wheel_b).read_bytes() == (
        host_a[0].wheelhouse / wheel_a
    ).read_bytes()


def test_a_comm_only_change_recompiles_only_the_comm_module(
    host_a, github: Upstreams, test_base, runtime_index
) -> None:
    builder, first, _, _ = host_a
    patch = comm_only_patch(github, builder.data_dir)
    try:
        # The site's keys, as host A's build had: its entries are signed by the site's key.
        plan = builder.run(*kernel_args(test_base, runtime_index, "--plan"), env=KERNEL_TRUST_ENV)
        planned = json.loads(plan.stdout)["kernels"]
        decisions = {m["name"]: m["reason"] for m in planned}
        assert decisions["gelu_tanh_and_mul"].startswith("reuse:")
        assert decisions["vllm_comm"].startswith("compile: 1 input(s) changed")
        assert COMM_HEADER.rsplit("/", 1)[1] in decisions["vllm_comm"]

        result = builder.run(*kernel_args(test_base, runtime_index), env=KERNEL_TRUST_ENV)
        rebuilt = json.loads(result.stdout)["image"]
        modules, before = this_run({"image": rebuilt}), this_run(first)
        assert modules["gelu_tanh_and_mul"]["source"] == "reused"
        assert (
            by_name(rebuilt["jit_inventory"])["gelu_tanh_and_mul"]["sha256"]
            == by_name(first["image"]["jit_inventory"])["gelu_tanh_and_mul"]["sha256"]
        )
        assert modules["vllm_comm"]["source"] == "compiled"
        assert modules["vllm_comm"]["key"] != before["vllm_comm"]["key"]
        assert modules["vllm_comm"]["lookup"] == before["vllm_comm"]["lookup"]
        assert "1 reused, 1 compiled: vllm_comm" in result.stderr
    finally:
        patch.unlink()


def entry_of(builder: Builder, module: dict) -> Path:
    """The local kernel entry of `module` as a build recorded it (the comm-only change left
    a second entry under the same lookup)."""
    return builder.cache_dir / "kernels" / f"{module['lookup']}.{module['key'][:16]}.kernel.tar"


def test_a_tampered_entry_is_refused_and_compiled_again(host_a, test_base, runtime_index) -> None:
    """Its signature, kept beside it, no longer verifies: builder refuses it before the kernel
    build sees it (one line naming it), the module compiles, the other is reused."""
    builder, first, _, _ = host_a
    entry = entry_of(builder, this_run(first)["vllm_comm"])
    with tarfile.open(entry) as tar:
        members = {m.name: (m, tar.extractfile(m).read()) for m in tar}
    library = members["vllm_comm.so"][1]
    tampered = bytearray(library)
    tampered[len(tampered) // 2] ^= 0xFF
    with tarfile.open(entry, "w") as tar:
        for name, (member, data) in members.items():
            body = bytes(tampered) if name == "vllm_comm.so" else data
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
    forget_kernel_wheels(builder)

    result = builder.run(*kernel_args(test_base, runtime_index), env=KERNEL_TRUST_ENV)
    image = json.loads(result.stdout)["image"]
    modules = this_run({"image": image})
    refused = [line for line in result.stderr.splitlines() if "kernel entry" in line]
    assert len(refused) == 1, result.stderr
    assert (
        f"kernel entry {entry} does not match its signature (changed since it was signed)"
        in (refused[0])
    )
    assert "not used, its module compiles here" in refused[0]
    assert modules["vllm_comm"]["source"] == "compiled"
    rebuilt = by_name(image["jit_inventory"])["vllm_comm"]["sha256"]
    assert rebuilt != hashlib.sha256(bytes(tampered)).hexdigest(), "the tampered .so never ships"
    assert modules["gelu_tanh_and_mul"]["source"] == "reused"


def test_an_unreachable_registry_is_one_line_and_a_local_build(
    tmp_path, github: Upstreams, docker_host, test_base, runtime_index, built_image
) -> None:
    """Both modules ask the registry side by side: still one line. The plan shows the
    decision a build acts on (compiling both here would prove nothing more)."""
    builder = host(tmp_path, github, docker_host, seed=built_image[0])
    result = builder.run(
        *kernel_args(
            test_base, runtime_index, "--kernel-registry", "127.0.0.1:9/kernels", "--plan"
        ),
        env=KERNEL_TRUST_ENV,
    )
    lines = [line for line in result.stderr.splitlines() if "127.0.0.1:9" in line]
    assert len(lines) == 1, result.stderr
    assert "kernel registry 127.0.0.1:9/kernels unreachable" in lines[0]
    assert "building with local kernels only" in lines[0]
    planned = json.loads(result.stdout)["kernels"]
    assert {m["name"] for m in planned} == {"gelu_tanh_and_mul", "vllm_comm"}
    assert all(m["reason"].startswith("compile:") and m["entry"] == "none" for m in planned)


def test_a_forged_registry_entry_is_not_used_and_the_module_compiles(
    host_a, tmp_path, github: Upstreams, docker_host, docker_client, test_base, runtime_index,
    monkeypatch, built_image,
) -> None:  # fmt: skip
    """Someone who can push to the kernel registry but holds no site key replaces
    vllm_comm's entry (here: host A's own bytes, so only the signature is wrong). A fresh
    host does not use it: one warning names the entry and its plan compiles vllm_comm;
    gelu_tanh_and_mul, signed by the site, still comes from the registry. Without a trusted
    key the registry is not used at all. Plans are enough here: a build acts on the
    decisions its plan shows (host A compiled what its plan said, and the tampered entry's
    test builds), and compiling vllm_comm again would prove nothing more."""
    from builder.build.kernels import cache as kernel_cache

    builder_a, first, shared, _ = host_a
    forged = this_run(first)["vllm_comm"]
    entry = entry_of(builder_a, forged)
    attacker_key, attacker_public = kernel_trust.generate(tmp_path / "attacker")
    for key, value in {**REGISTRY_ENV, kernel_trust.SIGNING_KEY_ENV: str(attacker_key),
                       kernel_trust.TRUSTED_KEYS_ENV: str(attacker_public)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    kernel_cache.SharedKernels(docker_client, shared, kernel_trust.load()).store(
        entry, entry.read_bytes()
    )
    monkeypatch.undo()  # the builder runs below see only the environment each one is given

    builder = host(tmp_path / "host-c", github, docker_host, seed=built_image[0])
    result = builder.run(
        *kernel_args(test_base, runtime_index, "--kernel-registry", shared, "--plan"),
        env=REGISTRY_ENV,
    )
    planned = {m["name"]: m for m in json.loads(result.stdout)["kernels"]}
    refused = [line for line in result.stderr.splitlines() if "not signed by a trusted" in line]
    assert len(refused) == 1 and f"{shared}:{forged['lookup']}" in refused[0], result.stderr
    assert planned["vllm_comm"]["reason"].startswith("compile:"), planned
    assert planned["vllm_comm"]["entry"] == "none"
    assert planned["gelu_tanh_and_mul"]["reason"].startswith("reuse:"), planned
    assert planned["gelu_tanh_and_mul"]["entry"] == "registry"

    untrusting = host(tmp_path / "host-d", github, docker_host, seed=built_image[0])
    env = {k: v for k, v in REGISTRY_ENV.items() if k != kernel_trust.TRUSTED_KEYS_ENV}
    result = untrusting.run(
        *kernel_args(test_base, runtime_index, "--kernel-registry", shared, "--plan"), env=env
    )
    assert f"kernel registry {shared} not used: no trusted signing keys" in result.stderr
    planned = {m["name"]: m for m in json.loads(result.stdout)["kernels"]}
    assert set(planned) == {"gelu_tanh_and_mul", "vllm_comm"}
    assert all(m["reason"].startswith("compile:") for m in planned.values()), planned
    assert {m["entry"] for m in planned.values()} == {"none"}, "no registry entry was taken"


def test_a_plain_venv_loads_the_kernels_from_the_index_without_compiling(
    host_a, docker_client, test_base, runtime_index, tmp_path
) -> None:
    """A bare-metal user: a venv, pip from the private index, no image."""
    builder = host_a[0]
    packages = tmp_path / "packages"
    packages.mkdir()
    process, port = start_pypiserver(packages, tmp_path / "index.log", auth=("ci", "pw"))
    try:
        builder.run(
            "publish", "--publish-index", f"http://127.0.0.1:{port}/",
            env={"TWINE_USERNAME": "ci", "TWINE_PASSWORD": "pw"},
        )  # fmt: skip
        # The newest build's pair (the tamper test recompiled vllm_comm: nvcc gives other bytes).
        latest = builder.data_dir / "manifests" / "sm120-0.5.9" / "latest.json"
        wheels = json.loads(latest.read_text())["wheels"]
        kernel_version = wheels["kernels"]["version"]
        index_url, requirements = runtime_index
        # Another flashinfer build: the one the comm-only change made (in the wheel cache).
        others = [
            p
            for p in builder.cache_dir.glob("wheels/*/flashinfer_python-*.whl")
            if p.name != wheels["flashinfer"]["filename"]
        ]
        assert others, "the comm-only change left a second flashinfer build"
        # uv, not pip, installs: the same packages from the same indexes (uv is builder's own
        # dependency, mounted in).
        script = f"""
set -e
# The runtime lock leaves torch to the base (Debian's): the venv sees the system's packages.
/uv venv -q --system-site-packages --python /usr/bin/python3 /venv && . /venv/bin/activate
install() {{ /uv pip install -q --no-cache --python /venv/bin/python "$@"; }}
install --no-deps --index-url {index_url} -r /reqs.txt  # whole but for the base's torch
# --no-deps: the reduced test runtime lacks some of flashinfer's own requirements (e.g.
# nvidia-cudnn-frontend); the pair is named exactly, as the manifest records it.
install --no-deps --index-url http://127.0.0.1:{port}/simple/ \
    flashinfer-jit-cache=={kernel_version} flashinfer-python=={wheels["flashinfer"]["version"]}
rm -f "$(command -v ninja)"
# No GPU here to detect the arch from (a GPU host needs no FLASHINFER_CUDA_ARCH_LIST).
FLASHINFER_CUDA_ARCH_LIST=12.0a FLASHINFER_DISABLE_JIT=1 python -c '
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.jit.comm import gen_vllm_comm_module
for spec in (gen_act_and_mul_module("gelu_tanh"), gen_vllm_comm_module()):
    spec.build_and_load(); print("loaded", spec.name, spec.aot_path)
'
install --no-deps --reinstall /other/{others[0].name}
python -c 'import flashinfer' 2>&1 | tail -1
"""
        container = docker_client.containers.run(
            test_base, ["sh", "-c", script], network_mode="host", detach=True,
            volumes={
                str(requirements): {"bind": "/reqs.txt", "mode": "ro"},
                str(others[0].parent): {"bind": "/other", "mode": "ro"},
                str(Path(sys.executable).with_name("uv")): {"bind": "/uv", "mode": "ro"},
            },
        )  # fmt: skip
        try:
            code = container.wait(timeout=900)["StatusCode"]
            output = container.logs().decode()
        finally:
            container.remove(force=True)
    finally:
        process.terminate()
    assert code == 0, output
    loaded = [line.split() for line in output.splitlines() if line.startswith("loaded ")]
    assert [name for _, name, _ in loaded] == ["gelu_tanh_and_mul", "vllm_comm"]
    assert all("/site-packages/flashinfer_jit_cache/jit_cache/" in path for *_, path in loaded)
    assert (
        f"RuntimeError: flashinfer-jit-cache {kernel_version} holds kernels built for "
        "flashinfer-python" in output
    )
    assert os.path.exists(builder.wheelhouse / wheels["kernels"]["filename"])


def test_no_secret_of_these_runs_is_in_any_output_or_file(host_a, docker_client) -> None:
    """The runs above used registry credentials, a signing key and an index password: none
    of them is in their output, in any file under the cache, data or wheelhouse they wrote
    (kernel entries, wheels, logs, manifests, SBOMs), nor in the image's labels or config."""
    builder, result, _, stderr = host_a
    secrets = [REGISTRY_PASSWORD.encode(), SITE_KEY.read_bytes().strip().splitlines()[1]]
    assert not any(s in (json.dumps(result) + stderr).encode() for s in secrets)
    for root in (builder.cache_dir, builder.data_dir, builder.wheelhouse):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                for secret in secrets:
                    assert secret not in data, f"{secret[:4]!r}... in {path}"
    inspected = json.dumps(docker_client.images.get(result["image"]["reference"]).attrs)
    assert REGISTRY_PASSWORD not in inspected


def test_kernels_signed_by_a_key_since_removed_are_not_used(
    host_a, tmp_path, test_base, runtime_index
) -> None:
    """The site rotates its key: the old one leaves the trusted file. What it signed, in this
    host's cache (the entries, and the kernel wheel made of them), is not used any more:
    one line each, and every module compiles again, signed by the new key."""
    builder = host_a[0]
    new_key, new_public = kernel_trust.generate(tmp_path / "rotated")
    rotated = {
        kernel_trust.SIGNING_KEY_ENV: str(new_key),
        kernel_trust.TRUSTED_KEYS_ENV: str(new_public),
    }
    result = builder.run(*kernel_args(test_base, runtime_index), env=rotated)
    modules = this_run(json.loads(result.stdout))
    wheel = [line for line in result.stderr.splitlines() if "cached kernel wheel" in line]
    assert len(wheel) == 1 and "holds kernels signed by a key (" in wheel[0], result.stderr
    assert wheel[0].endswith("not trusted now: made again")
    entries = [line for line in result.stderr.splitlines() if "kernel entry" in line]
    assert len(entries) == 1 and "is signed by a key (" in entries[0], result.stderr
    assert "not trusted now: not used, its module compiles here (and " in entries[0]
    assert {m["source"] for m in modules.values()} == {"compiled"}
    new = new_public.read_text().split()[0]
    for module in modules.values():
        signature = Path(f"{entry_of(builder, module)}.sig").read_text()
        assert json.loads(signature)["signer"] == new
