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
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from builder import registry
from builder.errors import BuilderError, Unreachable
from builder.readiness import NO_REDIRECTS

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
        for _ in range(2):
            request = urllib.request.Request(f"{self.base}{path}", headers={"Accept": accept})
            if self.authorization:
                request.add_header("Authorization", self.authorization)
            try:
                with NO_REDIRECTS.open(request, timeout=_TIMEOUT_S) as response:
                    return response.read(_MAX_BYTES + 1)
            except urllib.error.HTTPError as exc:
                if exc.code in (301, 302, 307, 308) and path.startswith("/blobs/"):
                    return self._redirected_blob(exc.headers.get("Location", ""))
                if exc.code == 401 and self.authorization is None:
                    self.authorization = self._authorize(exc.headers.get("WWW-Authenticate", ""))
                    continue
                raise BuilderError(f"{self.reference}: the registry answered {exc.code}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise Unreachable(f"{self.reference}: registry {self.host} ({reason})") from None
        raise BuilderError(f"{self.reference}: the registry refused the credentials (401)")

    def _redirected_blob(self, location: str) -> bytes:
        """Blobs are often served from storage elsewhere: fetched without credentials."""
        if not location.startswith("https://"):
            raise BuilderError(f"{self.reference}: a blob redirect to {location[:40]!r} refused")
        with urllib.request.urlopen(location, timeout=_TIMEOUT_S) as response:
            return response.read(_MAX_BYTES + 1)

    def _authorize(self, challenge: str) -> str:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.basic:
                raise BuilderError(
                    f"{self.reference}: the registry wants credentials (docker login, or "
                    f"{registry.USERNAME_ENV}/{registry.PASSWORD_ENV} with {registry.HOST_ENV})"
                )
            token = base64.b64encode(":".join(self.basic).encode()).decode()
            return f"Basic {token}"
        if scheme.lower() != "bearer":
            raise BuilderError(f"{self.reference}: unknown registry auth {scheme!r}")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = {"service": fields.get("service", "")}
        query["scope"] = fields.get("scope") or f"repository:{self.repository}:pull"
        url = f"{fields.get('realm', '')}?{urllib.parse.urlencode(query)}"
        if not url.startswith("https://"):
            raise BuilderError(f"{self.reference}: token realm {url[:40]!r} is not https")
        request = urllib.request.Request(url)
        if self.basic:
            token = base64.b64encode(":".join(self.basic).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                answer = json.loads(response.read(_MAX_BYTES))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise Unreachable(f"{self.reference}: no registry token ({exc})") from None
        return f"Bearer {answer.get('token') or answer.get('access_token')}"


def _checked(data: bytes, digest: str, what: str) -> bytes:
    if len(data) > _MAX_BYTES:
        raise BuilderError(f"{what}: larger than {_MAX_BYTES} bytes")
    algorithm, _, expected = digest.partition(":")
    if algorithm != "sha256" or hashlib.sha256(data).hexdigest() != expected:
        raise BuilderError(f"{what}: its content is not {digest}")
    return data


def image_config(reference: str) -> dict:
    """The image config (labels under `config.Labels`) of `reference`, from its registry."""
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


def labels(reference: str) -> dict[str, str]:
    return (image_config(reference).get("config") or {}).get("Labels") or {}
