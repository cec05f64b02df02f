"""Compiled kernel entries by key: in the local cache, and in an OCI registry that build
hosts share.

An entry is `<lookup key>.<key>.kernel.tar` (made by the image's jit_warmup.py): entry.json
(the module's key, every input file with its sha256, the .so's sha256) and the module's .so;
one lookup key can have several (one per header variant). In the registry the newest entry
of a lookup key is a one-layer image `REPO:<lookup key>` holding the tar, pushed and
pulled through the Docker engine with the credentials `builder image --push` uses: no
server of our own. Each holds the entry and its ed25519 signature (builder/kernels/trust.py):
an entry no trusted key signed is not used. The warm-up then checks every entry (sha256,
lookup key, key, inputs) before it reuses one, so a corrupt or foreign entry is compiled
again, never loaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tarfile
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from requests.exceptions import RequestException

from builder import progress, registry
from builder.cache import atomic_copy
from builder.errors import BuilderError
from builder.kernels import trust as kernel_trust
from builder.urls import redact

ENTRY_SUFFIX = ".kernel.tar"
_ENTRY_IN_IMAGE = "entry.tar"
_SIGNATURE_IN_IMAGE = "entry.tar.sig"  # ed25519 over entry.tar (builder/kernels/trust.py)
_LABEL = "io.builder.kernel-entry"


def local_dir(cache_dir: Path) -> Path:
    return cache_dir / "kernels"


def _entry_key(data: bytes) -> str:
    """The key an entry says it has (checked by the warm-up, not here), or "unreadable"."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return str(json.load(tar.extractfile("entry.json"))["key"])[:16]
    except (tarfile.TarError, KeyError, ValueError, TypeError, AttributeError):
        return "unreadable"


class SharedKernels:
    """Entries in `repository` (None: no sharing). The first failure to reach it is one
    warning line, then the build goes on with local entries and compiles the rest."""

    def __init__(self, client: docker.DockerClient, repository: str | None) -> None:
        self.client = client
        self.repository = repository
        self.down = False
        self._warned_once = threading.Lock()
        self.auth = registry.auth(repository) if repository else None  # once: it may warn
        self.trusted = kernel_trust.trusted_keys() if repository else []
        self.signer = kernel_trust.signing_key() if repository else None
        if repository and not self.trusted:
            progress.warn(
                f"kernel registry {redact(repository)} not used: no trusted signing keys "
                f"({kernel_trust.TRUSTED_KEYS_ENV}); every kernel is compiled here or local"
            )
            self.repository = None
        elif repository and self.signer is None:
            progress.warn(
                f"kernel registry {redact(repository)}: signed entries are taken, none is "
                f"shared (no {kernel_trust.SIGNING_KEY_ENV} to sign with)"
            )

    def _unreachable(self, error: Exception | str) -> None:
        with self._warned_once:
            if self.down:  # another pull running beside this one has said it
                return
            self.down = True
        text = str(getattr(error, "explanation", None) or error).strip().splitlines()
        progress.warn(
            f"kernel registry {redact(self.repository or '')} unreachable "
            f"({text[0] if text else 'no answer'}): building with local kernels only"
        )

    def fetch(self, lookup: str, into: Path) -> Path | None:
        """The registry's entry for `lookup`, written into `into`; None when it has none."""
        if not self.repository or self.down:
            return None
        reference = f"{self.repository}:{lookup}"
        try:
            self.client.images.pull(self.repository, tag=lookup, auth_config=self.auth)
        except NotFound:
            return None
        except (APIError, RequestException) as exc:
            if "not found" in str(exc).lower() or "manifest unknown" in str(exc).lower():
                return None
            self._unreachable(exc)
            return None
        try:
            container = self.client.containers.create(reference, command=["entry"])
            try:
                data = self._file(container, _ENTRY_IN_IMAGE)
                signature = self._file(container, _SIGNATURE_IN_IMAGE)
            finally:
                container.remove(force=True)
        except (APIError, RequestException) as exc:
            self._unreachable(exc)
            return None
        finally:
            with contextlib.suppress(ImageNotFound, APIError, RequestException):
                self.client.images.remove(reference, noprune=False)
        if (
            data is None
            or signature is None
            or not kernel_trust.verify(self.trusted, data, signature)
        ):
            progress.warn(
                f"kernel registry entry {reference} is not signed by a trusted key: "
                "not used, the module is compiled here"
            )
            return None
        into.mkdir(parents=True, exist_ok=True)
        path = into / f"{lookup}.{_entry_key(data)}{ENTRY_SUFFIX}"
        path.write_bytes(data)
        return path

    @staticmethod
    def _file(container, name: str) -> bytes | None:
        try:
            chunks, _ = container.get_archive(f"/{name}")
        except (NotFound, APIError):
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as outer:
            member = outer.extractfile(name)
            return member.read() if member else None

    def store(self, entry: Path) -> None:
        """Push one signed entry as `REPO:<lookup key>` (a new build of a module replaces it)."""
        if not self.repository or self.down or self.signer is None:
            return
        lookup = entry.name.split(".", 1)[0]
        reference = f"{self.repository}:{lookup}"
        with tempfile.TemporaryDirectory(prefix="builder-kernel-entry-") as tmp:
            shutil.copyfile(entry, Path(tmp) / _ENTRY_IN_IMAGE)
            signature = kernel_trust.sign(self.signer, entry.read_bytes())
            (Path(tmp) / _SIGNATURE_IN_IMAGE).write_bytes(signature)
            (Path(tmp) / "Dockerfile").write_text(
                f"FROM scratch\nCOPY {_ENTRY_IN_IMAGE} {_SIGNATURE_IN_IMAGE} /\n"
            )
            try:
                self.client.images.build(
                    path=tmp, tag=reference, labels={_LABEL: lookup}, rm=True, pull=False
                )
            except (APIError, docker.errors.BuildError) as exc:
                raise BuilderError(
                    f"kernel entry {entry.name}: cannot make its image: {exc}"
                ) from None
        try:
            registry.push(self.client, reference, self.repository)
        except BuilderError as exc:
            self._unreachable(exc)
        finally:
            with contextlib.suppress(ImageNotFound, APIError):
                self.client.images.remove(reference, noprune=False)


def gather(
    lookups: list[str], cache_dir: Path, shared: SharedKernels, into: Path
) -> dict[str, str]:
    """Put the entry of each lookup key into `into`, from the local cache or else the
    registry (then kept locally too); {lookup: "local" | "registry" | "none"}. Registry
    pulls run side by side: each is a small image, so a pull is mostly waiting."""
    into.mkdir(parents=True, exist_ok=True)
    found = {}
    for lookup in lookups:
        local = sorted(local_dir(cache_dir).glob(f"{lookup}.*{ENTRY_SUFFIX}"))
        for path in local:
            shutil.copyfile(path, into / path.name)
        found[lookup] = "local" if local else "none"
    missing = [lookup for lookup, where in found.items() if where == "none"]
    if missing:
        with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
            fetched = list(pool.map(lambda lookup: shared.fetch(lookup, into), missing))
        for lookup, entry in zip(missing, fetched, strict=True):
            if entry:
                atomic_copy(entry, local_dir(cache_dir) / entry.name)
                found[lookup] = "registry"
    return found


def keep(entries: list[Path], cache_dir: Path, shared: SharedKernels) -> None:
    """New entries into the local cache and, when one is configured, the registry."""
    for entry in entries:
        atomic_copy(entry, local_dir(cache_dir) / entry.name)
        shared.store(entry)
