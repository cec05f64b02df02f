"""An image's config read straight from its registry (the OCI distribution API): its
labels without pulling a layer or needing a Docker daemon, for the commands that only print
or plan (`launch --image`, `deploy-files --image`).

The manifest is fetched by the reference (an index resolves to its linux/amd64 entry) and
checked against the digest when the reference names one; the config blob is checked
against the manifest's digest for it. Credentials: the same as pushes (`registry.auth`:
BUILDER_REGISTRY_* for its host), else `docker login`'s from ~/.docker/config.json; Basic
or the Bearer token flow, whichever the registry asks for. Plain HTTP only for loopback,
as Docker's own default.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path

from builder.core import http_client, registry
from builder.core.errors import BuilderError

_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_MAX_BYTES = 4 << 20  # a manifest or config; more is not one
_TIMEOUT_S = 30


def _split(reference: str) -> tuple[str, str, str]:
    """(registry host, repository, tag or digest)."""
    host = registry.registry_host(reference)
    rest = reference[len(host) + 1 :] if reference.startswith(f"{host}/") else reference
    if host == "docker.io":
        host = "registry-1.docker.io"
        rest = rest if "/" in rest.split("@")[0].split(":")[0] else f"library/{rest}"
    name, at, digest = rest.partition("@")
    if at:
        return host, name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name, digest
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = name.rsplit(":", 1)
        return host, repository, tag
    return host, name, "latest"


def _docker_config_auth(host: str) -> tuple[str, str] | None:
    path = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(path.read_text()).get("auths") or {}
    except (OSError, ValueError):
        return None
    for key, entry in auths.items():
        if urllib.parse.urlsplit(key if "://" in key else f"//{key}").netloc == host:
            user, _, password = base64.b64decode(entry.get("auth", "")).decode().partition(":")
            if user:
                return user, password
    return None


class _Client:
    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.host, self.repository, self.ref = _split(reference)
        loopback = self.host.split(":")[0] in ("localhost", "127.0.0.1", "[::1]")
        self.base = f"{'http' if loopback else 'https'}://{self.host}/v2/{self.repository}"
        creds = registry.auth(reference)
        self.basic = (
            (creds["username"], creds["password"]) if creds else _docker_config_auth(self.host)
        )
        self.authorization: str | None = None

    def get(self, path: str, accept: str = "*/*") -> bytes:
        what = f"{self.reference}: registry {self.host}"
        for _ in range(2):
            headers = {"Accept": accept}
            if self.authorization:
                headers["Authorization"] = self.authorization
            # Not followed: the registry's credentials go to the registry alone.
            answer = http_client.get(
                f"{self.base}{path}", what, headers=headers, timeout=_TIMEOUT_S,
                max_bytes=_MAX_BYTES, follow_redirects=False,
            )  # fmt: skip
            if answer.status == 200:
                return answer.body
            if answer.status in (301, 302, 307, 308) and path.startswith("/blobs/"):
                return self._redirected_blob(answer.headers.get("Location", ""))
            if answer.status == 401 and self.authorization is None:
                self.authorization = self._authorize(answer.headers.get("WWW-Authenticate", ""))
                continue
            raise BuilderError(f"{self.reference}: the registry answered {answer.status}")
        raise BuilderError(f"{self.reference}: the registry refused the credentials (401)")

    def _redirected_blob(self, location: str) -> bytes:
        """Blobs are often served from storage elsewhere: fetched without credentials."""
        if not location.startswith("https://"):
            raise BuilderError(f"{self.reference}: a blob redirect to {location[:40]!r} refused")
        answer = http_client.get(
            location, f"{self.reference}: blob storage", timeout=_TIMEOUT_S, max_bytes=_MAX_BYTES
        )
        if answer.status != 200:
            raise BuilderError(f"{self.reference}: blob storage answered {answer.status}")
        return answer.body

    def _authorize(self, challenge: str) -> str:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.basic:
                raise BuilderError(
                    f"{self.reference}: the registry wants credentials (docker login, or "
                    f"{registry.USERNAME_ENV}/{registry.PASSWORD_ENV} with {registry.HOST_ENV})"
                )
            return http_client.basic(*self.basic)
        if scheme.lower() != "bearer":
            raise BuilderError(f"{self.reference}: unknown registry auth {scheme[:40]!r}")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = {"service": fields.get("service", "")}
        query["scope"] = fields.get("scope") or f"repository:{self.repository}:pull"
        url = f"{fields.get('realm', '')}?{urllib.parse.urlencode(query)}"
        if not url.startswith("https://"):
            raise BuilderError(f"{self.reference}: token realm {url[:40]!r} is not https")
        # The Basic credentials go to the realm's origin only: a redirect elsewhere (or to
        # plain http) is followed without them (builder/core/http_client.py).
        answer = http_client.get(
            url, f"{self.reference}: registry token", timeout=_TIMEOUT_S,
            max_bytes=_MAX_BYTES, credentials=self.basic,
        )  # fmt: skip
        if answer.status != 200:
            raise BuilderError(f"{self.reference}: the token service answered {answer.status}")
        try:
            token = json.loads(answer.body)
            bearer = token.get("token") or token.get("access_token")
        except (ValueError, AttributeError):
            bearer = None
        if not isinstance(bearer, str) or not bearer.isprintable():
            raise BuilderError(f"{self.reference}: the token service gave no token")
        return f"Bearer {bearer}"


def _checked(data: bytes, digest: str, what: str) -> bytes:
    if len(data) > _MAX_BYTES:
        raise BuilderError(f"{what}: larger than {_MAX_BYTES} bytes")
    algorithm, _, expected = digest.partition(":")
    if algorithm != "sha256" or hashlib.sha256(data).hexdigest() != expected:
        raise BuilderError(f"{what}: its content is not {digest}")
    return data


def image_config(reference: str) -> dict:
    """The image config (labels under `config.Labels`) of `reference`, from its registry;
    whatever it answers that is not an OCI image manifest and config is one error line."""
    try:
        return _image_config(reference)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise BuilderError(
            f"{reference}: the registry's answer is not an image manifest and config"
        ) from None


def _image_config(reference: str) -> dict:
    client = _Client(reference)
    digest = client.ref if client.ref.startswith("sha256:") else None
    body = client.get(f"/manifests/{client.ref}", _ACCEPT)
    if digest:
        _checked(body, digest, f"{reference}: manifest")
    manifest = json.loads(body)
    if "manifests" in manifest:  # an index: this machine's platform
        chosen = next(
            (
                entry
                for entry in manifest["manifests"]
                if (entry.get("platform") or {}).get("os") == "linux"
                and (entry.get("platform") or {}).get("architecture") == "amd64"
            ),
            None,
        )
        if chosen is None:
            raise BuilderError(f"{reference}: no linux/amd64 image in its index")
        body = _checked(
            client.get(f"/manifests/{chosen['digest']}", _ACCEPT), chosen["digest"], reference
        )
        manifest = json.loads(body)
    config = manifest["config"]["digest"]
    return json.loads(_checked(client.get(f"/blobs/{config}"), config, f"{reference}: config"))


def manifest_digest(reference: str) -> str:
    """The digest of what `reference` (a tag) names in its registry now: its manifest's, or
    an index's own, as `docker pull` resolves it; what `REPO@sha256:...` pins."""
    client = _Client(reference)
    return "sha256:" + hashlib.sha256(client.get(f"/manifests/{client.ref}", _ACCEPT)).hexdigest()


def labels(reference: str) -> dict[str, str]:
    config = image_config(reference)
    found = (config.get("config") or {}).get("Labels") or {} if isinstance(config, dict) else None
    if not isinstance(found, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in found.items()
    ):
        raise BuilderError(f"{reference}: the image config's labels are not strings")
    return found
