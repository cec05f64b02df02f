"""The image's SBOM: CycloneDX 1.6 JSON of its Python environment and builder's own wheels.

Runtime packages come from pip's installation report of the runtime stage (each with the
sha256 of the very file pip installed); packages of the base image's Python that the venv
uses (a lock with `base provides`) from pip's inventory of it, by name, version and
location (no file to hash: they came with the base); builder's wheels carry their upstream and fork
commits and the patch series hashes as properties. The SBOM is validated against the
CycloneDX schema before it goes into the image and beside the manifest.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING
from urllib.parse import quote

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from builder.build.patches import ForkResult
from builder.build.wheels import BuiltWheel
from builder.core.errors import BuilderError
from builder.core.identity import builder_identity
from builder.core.urls import redact

if TYPE_CHECKING:
    from cyclonedx.validation.json import JsonStrictValidator

PATH_IN_IMAGE = "/opt/builder/sbom.cdx.json"
REPORT_IN_IMAGE = "/opt/builder/runtime-install.json"  # pip install --report, runtime stage
BASE_PACKAGES_IN_IMAGE = "/opt/builder/base-packages.json"  # pip inspect, the same stage
VENV = "/opt/venv/"  # the Dockerfile's VIRTUAL_ENV
_PROPERTY = "builder:"


def _sha256_of(item: dict) -> str | None:
    archive = (item.get("download_info") or {}).get("archive_info") or {}
    if "sha256" in (archive.get("hashes") or {}):
        return archive["hashes"]["sha256"]
    algorithm, _, value = (archive.get("hash") or "").partition("=")
    return value if algorithm == "sha256" else None


def _pypi_component(item: dict, hashes: list[HashType], properties: list[Property]) -> Component:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    return Component(
        name=name,
        version=version,
        type=ComponentType.LIBRARY,
        bom_ref=f"pypi:{canonicalize_name(name)}",
        purl=PackageURL(type="pypi", name=canonicalize_name(name), version=version),
        hashes=hashes,
        properties=properties,
    )


def _runtime_component(item: dict) -> Component:
    sha256 = _sha256_of(item)
    url = (item.get("download_info") or {}).get("url", "")
    return _pypi_component(
        item,
        [HashType(alg=HashAlgorithm.SHA_256, content=sha256)] if sha256 else [],
        [Property(name=f"{_PROPERTY}installed-from", value=redact(url))] if url else [],
    )


def _base_component(item: dict) -> Component:
    return _pypi_component(
        item,
        [],
        [
            Property(name=f"{_PROPERTY}provided-by", value="base image"),
            Property(name=f"{_PROPERTY}location", value=item.get("metadata_location", "")),
        ],
    )


def _wheel_component(name: str, wheel: BuiltWheel, fork: ForkResult | None) -> Component:
    properties = [Property(name=f"{_PROPERTY}wheel", value=wheel.filename)]
    if fork is not None:
        properties += [
            Property(name=f"{_PROPERTY}upstream-commit", value=fork.upstream_commit),
            Property(name=f"{_PROPERTY}fork-commit", value=fork.fork_commit),
            Property(name=f"{_PROPERTY}patch-series-sha256", value=fork.series_sha256),
        ]
        properties += [
            Property(name=f"{_PROPERTY}patch:{patch.path.name}", value=patch.sha256)
            for patch in fork.patches
        ]
    dist = canonicalize_name(wheel.dist_name)
    return Component(
        name=wheel.dist_name,
        version=wheel.version,
        type=ComponentType.LIBRARY,
        bom_ref=f"builder:{name}",
        purl=PackageURL(type="pypi", name=dist, version=wheel.version),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=wheel.sha256)],
        properties=properties,
        description=f"built by builder ({name})",
    )


def build_sbom(
    image_name: str,
    image_tag: str,
    report: dict,
    wheels: dict[str, BuiltWheel],
    forks: dict[str, ForkResult],
    lock_sha256: str,
    base_packages: dict | None = None,
) -> str:
    """The SBOM as JSON text, validated. Its serial number is derived from the image and
    its packages: the same image described again keeps its serial number. `base_packages`
    is pip's inventory of the runtime venv (`pip inspect`): those outside the venv, and not
    shadowed by one pip installed into it, came with the base."""
    ours = {canonicalize_name(wheel.dist_name) for wheel in wheels.values()}
    runtime = [
        _runtime_component(item)
        for item in report.get("install", [])
        if canonicalize_name(item["metadata"]["name"]) not in ours
    ]
    taken = ours | {
        canonicalize_name(item["metadata"]["name"]) for item in report.get("install", [])
    }
    for item in (base_packages or {}).get("installed", []):
        name = canonicalize_name(item["metadata"]["name"])
        if name not in taken and not item.get("metadata_location", "").startswith(VENV):
            runtime.append(_base_component(item))
            taken.add(name)
    components = [*runtime, *(_wheel_component(n, w, forks.get(n)) for n, w in wheels.items())]
    components.sort(key=lambda c: (str(c.bom_ref), c.version or ""))
    identity = builder_identity()
    metadata_properties = [
        Property(name=f"{_PROPERTY}version", value=identity["version"]),
        Property(name=f"{_PROPERTY}commit", value=identity["commit"] or "unknown"),
        Property(name=f"{_PROPERTY}dirty", value=str(identity["dirty"]).lower()),
        Property(name=f"{_PROPERTY}runtime-lock-sha256", value=lock_sha256),
        Property(name=f"{_PROPERTY}python", value=report.get("environment", {}).get(
            "python_full_version", "unknown")),
    ]  # fmt: skip
    content = hashlib.sha256(
        json.dumps(
            [[str(c.bom_ref), c.version, [h.content for h in c.hashes]] for c in components]
            + [[p.name, p.value] for p in metadata_properties]
            + [[image_name, image_tag]]
        ).encode()
    ).hexdigest()
    image = Component(
        name=image_name, version=image_tag, type=ComponentType.CONTAINER,
        bom_ref=f"image:{image_name}",
    )  # fmt: skip
    bom = Bom(
        components=components,
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"builder-sbom:{content}"),
        metadata=BomMetaData(
            component=image,
            properties=metadata_properties,
            timestamp=datetime.now(timezone.utc).replace(microsecond=0),
        ),
    )  # fmt: skip
    bom.register_dependency(image, components)  # the image holds every one of them
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    validate(text, "the generated SBOM")
    return text + "\n"


def validate(text: str, what: str) -> None:
    """CycloneDX 1.6 JSON schema validation (strict) by cyclonedx-python-lib."""
    error = _strict_validator().validate_str(text)
    if error is not None:
        raise BuilderError(f"{what} is not valid CycloneDX 1.6: {str(error)[:300]}")


def _strict_validator() -> JsonStrictValidator:
    """cyclonedx-python-lib's strict validator, without the 3.5 s of CPU its jsonschema would
    spend at import building rfc3987-syntax's lark grammars, for one format: an
    "iri-reference" is checked instead as RFC 3987 section 3.1 maps it onto a URI reference
    (non-ASCII characters percent-encoded), by rfc3986-validator from the same extra."""
    # Imported here, not at the top: every builder command (`--help` and a no-op `image`
    # included) would pay for them otherwise.
    sys.modules.setdefault("rfc3987_syntax", None)  # jsonschema then leaves that format out
    from cyclonedx.validation.json import JsonStrictValidator
    from jsonschema import Draft7Validator  # the draft cyclonedx-python-lib validates with
    from rfc3986_validator import validate_rfc3986

    checker = Draft7Validator.FORMAT_CHECKER
    if "iri-reference" not in checker.checkers:

        @checker.checks("iri-reference")
        def _iri_reference(instance: object) -> bool:
            if not isinstance(instance, str):
                return True
            as_uri = "".join(c if c.isascii() else quote(c, safe="") for c in instance)
            return bool(validate_rfc3986(as_uri, rule="URI_reference"))

    return JsonStrictValidator(SchemaVersion.V1_6)
