"""Image labels read straight from a real registry (Debian's docker-registry, htpasswd on
127.0.0.1): the manifest and config are pushed here with the distribution API itself, so
this runs without a Docker engine, as `launch --image` on a daemon-less VM does."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request

import pytest

from builder import registry_api
from builder.errors import BuilderError
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
