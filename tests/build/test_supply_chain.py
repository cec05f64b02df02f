"""Supply chain (issue 14) on the real engine and a real index: the image installs exactly
its hashed runtime lock, describes itself in a CycloneDX SBOM, and records which builder
made it; a stale lock, an excluded package or a tampered wheel stops the build."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packaging.utils import canonicalize_name

from builder.core.docker_client import read_file_from_image
from builder.spec.lockfile import parse
from tests.conftest import (
    REPO_ROOT,
    Builder,
    Upstreams,
    image_args,
    installed_versions,
    make_data_dir,
    repository_tags,
)
from tests.services import IMAGE_RUNTIME_LOCK, runtime_wheelhouse, start_pypiserver

pytestmark = pytest.mark.docker

OURS = {"sglang", "flashinfer-python", "flashinfer-jit-cache"}
VENV_SEED = {"pip", "setuptools"}  # put in by `python -m venv`, not by the lock


def test_the_image_holds_exactly_the_lock(built_image, docker_client) -> None:
    _, image, _ = built_image
    installed = installed_versions(docker_client, image["reference"])
    locked = parse(IMAGE_RUNTIME_LOCK).packages
    runtime = {n: v for n, v in installed.items() if n not in OURS | VENV_SEED}
    assert runtime == {p.name: p.version for p in locked.values()}
    assert set(installed) >= OURS
    assert image["runtime_lock"]["hashed"] is True
    lock_sha256 = hashlib.sha256(IMAGE_RUNTIME_LOCK.read_bytes()).hexdigest()
    assert image["runtime_lock"]["sha256"] == lock_sha256
    # torch is the base's (the lock leaves it there): the venv sees it, and pip put none in.
    assert image["runtime_lock"]["base_provides"] == ["torch"]
    assert "torch" not in installed
    seen = installed_versions(docker_client, image["reference"], local=False)
    assert seen["torch"].startswith("2.6.0"), seen.get("torch")


def test_the_sbom_validates_and_lists_what_is_installed(built_image, docker_client) -> None:
    _, image, manifest_path = built_image
    manifest = json.loads(manifest_path.read_text())
    beside = manifest_path.parent / manifest["sbom"]["file"]
    text = beside.read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == manifest["sbom"]["sha256"]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    in_image = read_file_from_image(docker_client, image["reference"], "/opt/builder/sbom.cdx.json")
    assert in_image.decode() == text

    sbom = json.loads(text)
    components = {c["purl"].split("@")[0].removeprefix("pkg:pypi/"): c for c in sbom["components"]}
    locked = parse(IMAGE_RUNTIME_LOCK).packages
    for name, version in installed_versions(docker_client, image["reference"]).items():
        if name in VENV_SEED:
            continue
        assert components[name]["version"] == version, name
        (digest,) = [h["content"] for h in components[name]["hashes"] if h["alg"] == "SHA-256"]
        if name in locked:  # the very file pip installed is one the lock allows
            assert digest in locked[name].hashes, name
    # The base's torch is named with where it lies; no hash: no file of it was installed.
    seen = installed_versions(docker_client, image["reference"], local=False)
    torch = components["torch"]
    assert torch["version"] == seen["torch"] and not torch.get("hashes")
    properties = {p["name"]: p["value"] for p in torch["properties"]}
    assert properties["builder:provided-by"] == "base image"
    assert properties["builder:location"].startswith("/usr/lib/python3/dist-packages/")
    for key, wheel in manifest["wheels"].items():
        component = components[canonicalize_name(wheel["dist_name"])]
        assert component["hashes"][0]["content"] == wheel["sha256"]
        if key in manifest["upstreams"]:
            properties = {p["name"]: p["value"] for p in component["properties"]}
            upstream = manifest["upstreams"][key]
            assert properties["builder:patch-series-sha256"] == upstream["series_sha256"]
            for patch in upstream["patches"]:
                assert properties[f"builder:patch:{patch['file']}"] == patch["sha256"]


def test_the_manifest_names_the_builder_commit(built_image) -> None:
    _, _, manifest_path = built_image
    recorded = json.loads(manifest_path.read_text())["builder"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert recorded["commit"] == head
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if dirty:
        assert recorded["dirty"] is True
    assert isinstance(recorded["dirty"], bool)


def _fresh_data(built_image, tmp_path: Path, github: Upstreams) -> Builder:
    """The built image's cache (wheels cached), another data folder to change."""
    builder, _, _ = built_image
    return Builder(
        make_data_dir(tmp_path / "data", github), builder.cache_dir, github.mirror,
        tmp_path / "wheelhouse", env=builder.env,
    )  # fmt: skip


def test_a_stale_target_lock_is_refused_before_the_build(
    built_image, docker_client, test_base, tmp_path, github: Upstreams
) -> None:
    builder = _fresh_data(built_image, tmp_path, github)
    lock = builder.data_dir / "images/sm120-0.5.9/runtime-lock.txt"
    lock.write_text(lock.read_text().replace("\ntorch==2.9.1 ", "\ntorch==2.8.0 "))
    before = repository_tags(docker_client)
    result = builder.run("image", "--base-image", test_base, "--network-host", check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {lock}: stale lock: torch==2.9.1 is not met by its torch==2.8.0; "
        "run `builder lock --target sm120-0.5.9` and review the change"
    )
    assert "docker build" not in result.stderr
    assert repository_tags(docker_client) == before


def test_flashinfer_jit_cache_is_refused_from_a_users_file(built_image, tmp_path) -> None:
    builder, _, _ = built_image
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch==2.9.1\nflashinfer-jit-cache==0.6.3\n")
    result = builder.run("image", "--runtime-requirements", str(requirements), check=False)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {requirements}:2: lists flashinfer-jit-cache")
    assert "build wheel" not in result.stderr  # refused before any work


def test_a_tampered_wheel_on_the_index_fails_the_install(
    built_image, docker_client, test_base, tmp_path
) -> None:
    """A mirror serving other bytes under a locked file name: pip --require-hashes refuses
    it, the build stops at the runtime step, nothing is tagged and no manifest is written."""
    builder, _, _ = built_image
    tabulate = parse(IMAGE_RUNTIME_LOCK).packages["tabulate"]
    lock = tmp_path / "lock.txt"
    lock.write_text(
        f"tabulate=={tabulate.version} "
        + " ".join(f"--hash=sha256:{digest}" for digest in tabulate.hashes)
        + "\n"
    )
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (original,) = runtime_wheelhouse().glob(f"tabulate-{tabulate.version}-*.whl")
    shutil.copy(original, mirror / original.name)
    with (mirror / original.name).open("ab") as wheel:
        wheel.write(b"\0 tampered")
    server, port = start_pypiserver(mirror, tmp_path / "pypi.log")
    manifests = builder.data_dir / "manifests"
    before_manifests = set(manifests.rglob("*.json"))
    before = repository_tags(docker_client)
    try:
        result = builder.run(
            *image_args(test_base, (f"http://127.0.0.1:{port}/simple/", lock)), check=False
        )
    finally:
        server.terminate()
    assert result.returncode == 1
    assert "image build failed at step" in result.stderr
    assert "DO NOT MATCH THE HASHES" in result.stderr
    assert repository_tags(docker_client) == before
    assert set(manifests.rglob("*.json")) == before_manifests


def test_a_base_without_what_the_lock_leaves_to_it_stops_the_build(
    built_image, docker_client, test_base, runtime_index, tmp_path
) -> None:
    """A lock that leaves a package to the base (`base provides`) on a base that lacks it:
    the runtime step stops, naming the package, before pip installs anything."""
    builder, _, _ = built_image
    index_url, _ = runtime_index
    lock = tmp_path / "lock.txt"
    text = IMAGE_RUNTIME_LOCK.read_text()
    assert "\n# base provides: torch\n" in text
    lock.write_text(text.replace("\n# base provides: torch\n", "\n# base provides: torch,vllm\n"))
    before = repository_tags(docker_client)
    result = builder.run(*image_args(test_base, (index_url, lock)), check=False)
    assert result.returncode == 1
    assert "image build failed at step" in result.stderr
    assert "the base image has no vllm, which the runtime lock leaves to it" in result.stderr
    assert "Collecting" not in result.stderr
    assert repository_tags(docker_client) == before
