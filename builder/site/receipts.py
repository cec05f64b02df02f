"""A qualify receipt beside its image in the registry, tied to the image's digest.

The receipt travels as a one-file image (`FROM scratch`, /receipt.json, and the same JSON
in its config's labels, so it is read without a pull or a daemon) tagged
`REPO:sha256-<image digest hex>.receipt` in the image's own repository: the convention
cosign uses for signatures, so a registry keeps it with the image, any registry serves it,
and the name says which image it describes. Its label names the digest as well, and a
receipt whose recorded image is another one is refused when read, so it cannot drift.
Credentials are the push's own (registry.auth).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound

from builder.core import registry, registry_api
from builder.core.errors import BuilderError
from builder.spec.recipe import LABEL_PREFIX

RECEIPT_IN_IMAGE = "receipt.json"
SUBJECT_LABEL = f"{LABEL_PREFIX}receipt.subject"
# The receipt itself, compact, in the config: read without pulling (registry_api).
RECEIPT_LABEL = f"{LABEL_PREFIX}receipt"


def receipt_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".receipt"


def _split_repo_digest(repo_digest: str) -> tuple[str, str]:
    repository, _, digest = repo_digest.partition("@")
    return repository, digest


def subject_of(receipt: dict) -> str:
    """The registry reference (REPO@sha256:...) of the image a receipt describes."""
    digests = ((receipt.get("server") or {}).get("image") or {}).get("repo_digests") or []
    if not digests:
        raise BuilderError(
            "--push-receipt: the server's image has no registry digest (run an image pulled "
            "from, or pushed to, a registry: `builder launch --image REGISTRY/REPO@sha256:...`)"
        )
    return digests[0]


def push(client: docker.DockerClient, receipt_path: Path) -> str:
    """Push the receipt next to its image; returns the receipt's own reference."""
    receipt = json.loads(receipt_path.read_text())
    repository, digest = _split_repo_digest(subject_of(receipt))
    local = f"builder-receipt:{receipt_tag(digest)}"
    with tempfile.TemporaryDirectory(prefix="builder-receipt-") as tmp:
        (Path(tmp) / RECEIPT_IN_IMAGE).write_bytes(receipt_path.read_bytes())
        (Path(tmp) / "Dockerfile").write_text(f"FROM scratch\nCOPY {RECEIPT_IN_IMAGE} /\n")
        try:
            compact = json.dumps(receipt, sort_keys=True, separators=(",", ":"))
            client.images.build(
                path=tmp, tag=local, labels={SUBJECT_LABEL: digest, RECEIPT_LABEL: compact},
                rm=True, pull=False,
            )  # fmt: skip
        except (APIError, docker.errors.BuildError) as exc:
            raise BuilderError(f"receipt {receipt_path}: cannot make its image: {exc}") from None
    try:
        pushed = registry.push(client, local, repository)
    finally:
        for tag in (local, f"{repository}:{receipt_tag(digest)}"):  # pushed: not kept here
            with contextlib.suppress(ImageNotFound, APIError):
                client.images.remove(tag, noprune=False)
    return pushed["reference"]


def fetch(image_reference: str, client: docker.DockerClient | None = None) -> dict | None:
    """The receipt pushed for this image, read from the registry's image config of the
    receipt (no pull, no daemon), or None when there is none or the image's registry digest
    is unknown (a reference by tag of an image this engine does not have). One that
    describes another image is refused."""
    digests = [image_reference] if "@sha256:" in image_reference else []
    if not digests and client is not None:
        try:
            digests = client.images.get(image_reference).attrs.get("RepoDigests") or []
        except (ImageNotFound, APIError):
            digests = []
    for repo_digest in digests:
        repository, digest = _split_repo_digest(repo_digest)
        reference = f"{repository}:{receipt_tag(digest)}"
        try:
            label = registry_api.labels(reference).get(RECEIPT_LABEL)
        except BuilderError:  # none pushed (404), or the registry is out of reach
            continue
        if not label:
            continue
        try:
            receipt = json.loads(label)
            described = receipt["server"]["image"]["repo_digests"]
        except (ValueError, RecursionError, KeyError, TypeError):
            raise BuilderError(
                f"receipt {reference}: not a receipt builder qualify wrote"
            ) from None
        if not isinstance(described, list) or not all(isinstance(d, str) for d in described):
            raise BuilderError(f"receipt {reference}: not a receipt builder qualify wrote")
        if not any(d.endswith(f"@{digest}") for d in described):
            raise BuilderError(
                f"receipt {reference} describes another image ({', '.join(described) or 'none'})"
            )
        return receipt
    return None


def summary(receipt: dict) -> str:
    """One line: when, on what, whether it qualified, and the highest level's figure."""
    result = receipt.get("result") or {}
    if result.get("ok"):
        verdict = "qualified"
    elif result.get("verdict") == "partial":
        verdict = "partial (a required check did not run)"
    else:
        verdict = f"NOT qualified ({result.get('failed_at')})"
    gpus = (receipt.get("gpus") or {}).get("devices") or []
    on = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "GPUs unknown"
    levels = (receipt.get("throughput") or {}).get("levels") or []
    speed = ""
    if levels:
        top = levels[-1]
        speed = f", {top['output_throughput']} output tok/s at concurrency {top['concurrency']}"
    profile = (receipt.get("server") or {}).get("profile") or "profile not given"
    return f"receipt {receipt.get('created')}: {verdict} on {on}, {profile}{speed}"
