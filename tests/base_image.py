"""The test base as a registry image: its one layer gzipped once per machine, served for the
run by a loopback registry, and pulled from there by each engine.

Why not `docker import`: an engine knows a layer's compressed digest only for layers it
pulled. The first push of an image built on an imported base compresses the base's 1.3 GB
again (two CPU-minutes of dockerd's gzip here); on a pulled base, the push asks the
registry whether it has that digest, as it does for any site's base image, and
`seed_layer` puts the layer where a push test's repository has it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

CHUNK = 1 << 20
USER, PASSWORD = "base-reader", "base-reader-password"  # the run's own loopback registry
REPOSITORY = "builder-test-base"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


def gzipped_layer(archive: Path) -> dict:
    """The archive as one gzip layer (level 1: the layer is written once per machine and
    read back on loopback, so speed beats size), kept beside it: {path, digest, diff_id,
    size}."""
    layer = archive.with_name(archive.name + ".gz")
    facts = archive.with_name(archive.name + ".gz.json")
    if layer.is_file() and facts.is_file():
        return json.loads(facts.read_text())
    plain, packed = hashlib.sha256(), hashlib.sha256()
    partial = layer.with_name(layer.name + ".partial")

    class Hashing:
        def __init__(self, handle) -> None:
            self.handle = handle

        def write(self, data: bytes) -> int:
            packed.update(data)
            return self.handle.write(data)

        def flush(self) -> None:
            self.handle.flush()

    with (
        archive.open("rb") as source,
        partial.open("wb") as out,
        gzip.GzipFile(fileobj=Hashing(out), mode="wb", compresslevel=1, mtime=0) as zipped,
    ):
        while chunk := source.read(CHUNK):
            plain.update(chunk)
            zipped.write(chunk)
    made = {
        "path": str(layer),
        "digest": f"sha256:{packed.hexdigest()}",
        "diff_id": f"sha256:{plain.hexdigest()}",
        "size": partial.stat().st_size,
    }
    partial.replace(layer)
    facts.write_text(json.dumps(made))
    return made


def _request(url: str, method: str, data=None, headers: dict | None = None, auth=(USER, PASSWORD)):
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    return urllib.request.urlopen(request, timeout=600)


def _upload(registry: str, repository: str, data, size: int, digest: str, auth) -> None:
    """One blob into `repository`, in one PUT (the registry API's monolithic upload)."""
    base = f"http://{registry}/v2/{repository}/blobs"
    try:
        with _request(f"{base}/{digest}", "HEAD", auth=auth):
            return
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
    with _request(f"{base}/uploads/", "POST", data=b"", auth=auth) as response:
        location = response.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    separator = "&" if "?" in location else "?"
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
    with _request(f"{location}{separator}digest={digest}", "PUT", data, headers, auth):
        pass


def publish(registry: str, tag: str, layer: dict, env: list[str]) -> str:
    """The base as `registry`/REPOSITORY:`tag`: the layer, a config with `env`, a manifest."""
    with open(layer["path"], "rb") as handle:
        _upload(registry, REPOSITORY, handle, layer["size"], layer["digest"], (USER, PASSWORD))
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": env},
            "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"]]},
            "history": [{"created_by": "builder tests: the test base (tests/services.py)"}],
        },
        sort_keys=True,
    ).encode()
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    _upload(registry, REPOSITORY, config, len(config), config_digest, (USER, PASSWORD))
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": config_digest},
            "layers": [{"mediaType": LAYER_TYPE, "size": layer["size"], "digest": layer["digest"]}],
        }
    ).encode()
    url = f"http://{registry}/v2/{REPOSITORY}/manifests/{tag}"
    with _request(url, "PUT", manifest, {"Content-Type": MANIFEST_TYPE}):
        pass
    return f"{registry}/{REPOSITORY}:{tag}"


def seed_layer(layer: dict, registry: str, repository: str, auth: tuple[str, str]) -> None:
    """The base's layer into `repository` of another registry, as a site's registry holds
    its base image's layers once anything built on it has been pushed there."""
    with open(layer["path"], "rb") as handle:
        _upload(registry, repository, handle, layer["size"], layer["digest"], auth)
