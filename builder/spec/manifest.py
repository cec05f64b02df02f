"""The manifest: one JSON file per build, the single source of truth for what was built.

Provenance (pins, fork commits, patch hashes, wheels), what was published and pushed (only
what really happened), the JIT cache inventory and the launch recipes. Files are written
atomically under `manifests/<target>/<UTC time>-<inputs>.json` and never overwritten;
`latest.json` is a symlink to the newest. The schema is `manifests/schema-v1.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from builder.core import validate
from builder.core.cache import atomic_write_text
from builder.core.errors import BuilderError

SCHEMA_VERSION = 1
LATEST = "latest.json"
SBOM_SUFFIX = ".cdx.json"


def manifest_dir(data_dir: Path, flag: str | None, target: str) -> Path:
    return (Path(flag) if flag else data_dir / "manifests") / target


def write(directory: Path, manifest: dict, tag: str, sbom: str | None = None) -> Path:
    """A new history file (never an existing one) and the `latest.json` link to it; the
    image's SBOM beside it (`<same name>.cdx.json`), its sha256 in the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = manifest["created"].replace("-", "").replace(":", "")
    path = directory / f"{stamp}-{tag}.json"
    counter = 1
    while path.exists() or path.with_suffix(SBOM_SUFFIX).exists():
        counter += 1
        path = directory / f"{stamp}-{tag}-{counter}.json"
    if sbom is not None:
        sbom_path = path.with_suffix(SBOM_SUFFIX)
        atomic_write_text(sbom_path, sbom)
        manifest = {
            **manifest,
            "sbom": {"file": sbom_path.name, "sha256": hashlib.sha256(sbom.encode()).hexdigest()},
        }
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    link = directory / f".{LATEST}.{os.getpid()}.{path.stem}"  # this writer's own
    link.unlink(missing_ok=True)
    link.symlink_to(path.name)
    os.replace(link, directory / LATEST)
    return path


def load(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuilderError(f"{path}: no such manifest (run `builder image` first)") from None
    except json.JSONDecodeError as exc:
        raise BuilderError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("image") or {}, dict):
        raise BuilderError(f"{path}: not a builder manifest (a JSON object with an image object)")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise BuilderError(
            f"{path}: schema_version {manifest.get('schema_version')!r}, "
            f"this builder reads {SCHEMA_VERSION}"
        )
    return manifest


def with_images(directory: Path) -> Iterator[tuple[Path, dict]]:
    """(path, manifest) of the target's manifests that record an image, newest first."""
    candidates = sorted(
        (
            p
            for p in directory.glob("*.json")
            if p.name != LATEST and not p.name.endswith(SBOM_SUFFIX)
        ),
        reverse=True,
    )
    for path in candidates:
        record = load(path)
        if (record.get("image") or {}).get("reference"):
            yield path, record


def latest_with_image(directory: Path) -> Path:
    """The newest manifest of the target that records an image."""
    for path, _ in with_images(directory):
        return path
    raise BuilderError(f"{directory}: no manifest with an image yet (run `builder image` first)")


def image_reference(manifest: dict, where: str = "the manifest") -> str:
    """The pushed reference by digest when there is one, else the local tag."""
    image = manifest.get("image") or {}
    pushed = image.get("pushed")
    if pushed and not isinstance(pushed, dict):
        raise BuilderError(f"{where}: field 'image.pushed' must be an object")
    reference = pushed.get("reference") if pushed else image.get("reference")
    if not reference:
        raise BuilderError("the manifest records no image (run `builder image` first)")
    if not isinstance(reference, str):
        raise BuilderError(f"{where}: the image reference must be a string")
    # It goes into compose files, units and commands: a reference and nothing else.
    return validate.image_reference(f"{where}: image", reference)
