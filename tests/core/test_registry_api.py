"""Image labels read straight from a real registry (Debian's docker-registry, htpasswd on
127.0.0.1): the manifest and config are pushed here with the distribution API itself, so
this runs without a Docker engine, as `launch --image` on a daemon-less VM does."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request

import pytest

from builder.core import registry_api
from builder.core.errors import BuilderError
from tests.conftest import REGISTRY_PASSWORD, REGISTRY_USER

AUTH = "Basic " + base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()
CREDS = {
    "BUILDER_REGISTRY_USERNAME": REGISTRY_USER,
    "BUILDER_REGISTRY_PASSWORD": REGISTRY_PASSWORD,
    "BUILDER_REGISTRY_HOST": "127.0.0.1",
}


def _request(method: str, url: str, data: bytes | None = None, content_type: str = ""):
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", AUTH)
    if content_type:
        request.add_header("Content-Type", content_type)
    return urllib.request.urlopen(request, timeout=10)


def _push_blob(registry: str, repository: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _request("POST", f"http://{registry}/v2/{repository}/blobs/uploads/") as started:
        location = started.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    separator = "&" if "?" in location else "?"
    _request("PUT", f"{location}{separator}digest={digest}", data, "application/octet-stream")
    return digest


def _push_image(registry: str, repository: str, tag: str, labels: dict) -> str:
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()  # fmt: skip
    layer = b""  # an empty layer blob keeps the manifest a plain image manifest
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _push_blob(registry, repository, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _push_blob(registry, repository, layer), "size": 0}],
    }).encode()  # fmt: skip
    _request("PUT", f"http://{registry}/v2/{repository}/manifests/{tag}", manifest,
             "application/vnd.oci.image.manifest.v1+json")  # fmt: skip
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def test_labels_come_from_the_registry_by_tag_and_by_digest(registry, monkeypatch) -> None:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    labels = {"io.builder.launch": json.dumps({"schema_version": 1}), "x": "y"}
    digest = _push_image(registry, "vm/labels", "v1", labels)
    assert registry_api.labels(f"{registry}/vm/labels:v1") == labels
    assert registry_api.labels(f"{registry}/vm/labels@{digest}") == labels
    with pytest.raises(BuilderError, match="answered 404"):
        registry_api.labels(f"{registry}/vm/labels:absent")


def test_content_that_is_not_its_digest_is_refused() -> None:
    """What a registry (or a proxy in between) serves must be the digest asked for."""
    with pytest.raises(BuilderError, match="its content is not sha256:0000"):
        registry_api._checked(b"{}", "sha256:" + "0" * 64, "manifest")
    assert registry_api._checked(b"{}", "sha256:" + hashlib.sha256(b"{}").hexdigest(), "m")


def test_without_credentials_a_protected_registry_is_one_clear_line(registry, monkeypatch):
    for key in CREDS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    with pytest.raises(BuilderError, match="the registry wants credentials"):
        registry_api.labels(f"{registry}/vm/labels:v1")


_GOOD_FACTS = {
    "schema_version": 1,
    "target": {"name": "sm120", "description": "d", "cuda_version": "13.0.1", "arch_list": ["12.0f"]},
    "profiles": {"default": "p", "profiles": {"p": {"args": ["--port", "{port}"],
                                                     "params": {"port": "30000"}}}},
}  # fmt: skip


@pytest.mark.parametrize(
    ("label", "words"),
    [
        ("not json", "not a JSON object"),
        (json.dumps([1, 2]), "not a JSON object"),
        (json.dumps({**_GOOD_FACTS, "target": "sm120"}), "target is not an object"),
        (
            json.dumps({**_GOOD_FACTS, "target": {**_GOOD_FACTS["target"], "name": "\x1b[2J\x1b]0;x\x07"}}),
            "a control character in target.name",
        ),
        (json.dumps({**_GOOD_FACTS, "profiles": {"default": "q", "profiles": {"p": {}}}}), "names no profile"),
        ("[" * 50_000, "not a JSON object"),
    ],
)  # fmt: skip
def test_a_launch_label_that_is_not_a_recipe_is_one_line_on_a_daemon_less_vm(
    registry, builder, label: str, words: str
) -> None:
    """Whoever can push a tag writes the image's labels: `launch --image` checks what it
    reads (it exited 2 or printed escape sequences before)."""
    _push_image(registry, "vm/forged", "v1", {"io.builder.launch": label})
    env = {**CREDS, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = builder.run("launch", "--image", f"{registry}/vm/forged:v1", env=env, check=False)
    assert result.returncode == 1, result.stderr
    assert "not a recipe builder wrote" in result.stderr and words in result.stderr
    assert "\x1b" not in result.stdout + result.stderr and "internal error" not in result.stderr


def test_a_good_label_launches_on_a_daemon_less_vm(registry, builder) -> None:
    _push_image(registry, "vm/good", "v1", {"io.builder.launch": json.dumps(_GOOD_FACTS)})
    env = {**CREDS, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = builder.run("launch", "--image", f"{registry}/vm/good:v1", env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "--port 30000" in result.stdout
