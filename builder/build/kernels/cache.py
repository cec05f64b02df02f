"""Compiled kernel entries by key: in the local cache, and in an OCI registry that build
hosts share.

An entry is `<lookup key>.<key>.kernel.tar` (made by the image's jit_warmup.py): entry.json
(the module's key, every input file with its sha256, the .so's sha256) and the module's .so;
one lookup key can have several (one per header variant). Beside each, in the local cache,
its signature (`<entry>.sig`, builder/build/kernels/trust.py), checked against today's keys each
time the entry is brought to a kernel build: an entry that fails is not used (one warning
line; the module compiles again). In the registry the newest entry of a lookup key is a
one-layer image `REPO:<lookup key>` holding the tar and its signature, pushed and pulled
through the Docker engine with the credentials `builder image --push` uses: no server of
our own. The warm-up then checks every entry (sha256, lookup key, key, inputs) before it
reuses one, so a corrupt or foreign entry is compiled again, never loaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tarfile
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from requests.exceptions import RequestException

from builder.build.kernels import trust as kernel_trust
from builder.core import progress, registry
from builder.core.cache import partial_beside, read_limited
from builder.core.errors import BuilderError
from builder.core.urls import redact

ENTRY_SUFFIX = ".kernel.tar"
_ENTRY_IN_IMAGE = "entry.tar"
_SIGNATURE_IN_IMAGE = "entry.tar.sig"  # ed25519 over entry.tar (builder/build/kernels/trust.py)
_LABEL = "io.builder.kernel-entry"
# An entry is one module's .so and its record: tens of MB at most. Anything larger, or not
# a regular file, is refused before it is read whole (the signature covers the whole file).
ENTRY_LIMIT = 1 << 30
_LOOKUP = re.compile(r"[0-9a-f]{64}")


def local_dir(cache_dir: Path) -> Path:
    return cache_dir / "kernels"


def _entry_key(data: bytes) -> str:
    """The key an entry says it has (checked by the warm-up, not here), or "unreadable"."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            key = str(json.load(tar.extractfile("entry.json"))["key"])[:16]
    except (tarfile.TarError, KeyError, ValueError, TypeError, AttributeError):
        return "unreadable"
    return key if re.fullmatch(r"[0-9a-f]{16}", key) else "unreadable"  # part of a file name


def read_entry(path: Path) -> bytes:
    """An entry file's bytes: a regular file (never a link), at most ENTRY_LIMIT bytes, a tar
    with an entry.json; ValueError says why not, in words that follow its name."""
    data = read_limited(path, ENTRY_LIMIT)
    if _entry_key(data) == "unreadable":
        raise ValueError("is not a kernel entry (no tar with an entry.json)")
    return data


def _write_entry(
    directory: Path, name: str, data: bytes, signature: kernel_trust.Signature
) -> Path:
    """An entry and then its signature, each written whole under a temporary name."""
    path = directory / name
    with partial_beside(path) as partial:
        partial.write_bytes(data)
    kernel_trust.write_signature(path, signature)
    return path


class SharedKernels:
    """Entries in `repository` (None: no sharing). The first failure to reach it is one
    warning line, then the build goes on with local entries and compiles the rest."""

    def __init__(
        self, client: docker.DockerClient, repository: str | None, trust: kernel_trust.Trust
    ) -> None:
        self.client = client
        self.repository = repository
        self.down = False
        self._warned_once = threading.Lock()
        self.auth = registry.auth(repository) if repository else None  # once: it may warn
        self.trusted = trust.trusted if repository else []
        self.signer = trust.signer if repository else None
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

    def fetch(self, lookup: str) -> tuple[bytes, kernel_trust.Signature] | None:
        """The registry's entry for `lookup` and its signature by a trusted site key; None
        when it has none (or none that a trusted key signed: one warning line)."""
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
                data = self._file(container, _ENTRY_IN_IMAGE, ENTRY_LIMIT)
                signature = self._file(container, _SIGNATURE_IN_IMAGE, 1024)
            finally:
                container.remove(force=True)
        except (APIError, RequestException) as exc:
            self._unreachable(exc)
            return None
        finally:
            with contextlib.suppress(ImageNotFound, APIError, RequestException):
                self.client.images.remove(reference, noprune=False)
        key = (
            kernel_trust.verify(self.trusted, data, signature)
            if isinstance(data, bytes) and isinstance(signature, bytes)
            else None
        )
        if key is None or _entry_key(data) == "unreadable":
            why = (
                data if isinstance(data, str)
                else "is not signed by a trusted key" if key is None
                else "is not a kernel entry"
            )  # fmt: skip
            progress.warn(
                f"kernel registry entry {reference} {why}: not used, the module is compiled here"
            )
            return None
        return data, kernel_trust.Signature(kernel_trust.public_text(key), signature)

    @staticmethod
    def _file(container, name: str, limit: int) -> bytes | str | None:
        """A file of the entry's image, or why it is refused (a link, a folder, too large:
        asked before a byte of it is read); None when the image has no such file."""
        try:
            chunks, stat = container.get_archive(f"/{name}")
        except (NotFound, APIError):
            return None
        if stat.get("size", 0) > limit:
            return f"holds a {name} over {limit} bytes"
        archive = bytearray()
        for chunk in chunks:
            archive += chunk
            if len(archive) > limit + (1 << 20):  # the tar's own headers beside the file
                return f"holds a {name} over {limit} bytes"
        try:
            with tarfile.open(fileobj=io.BytesIO(bytes(archive))) as outer:
                member = outer.getmember(name)
                if not member.isfile() or member.size > limit:
                    return f"holds a {name} that is not a regular file of at most {limit} bytes"
                return outer.extractfile(member).read()
        except (tarfile.TarError, KeyError):
            return f"holds no readable {name}"

    def store(self, entry: Path, data: bytes) -> None:
        """Push one signed entry as `REPO:<lookup key>` (a new build of a module replaces it)."""
        if not self.repository or self.down or self.signer is None:
            return
        lookup = entry.name.split(".", 1)[0]
        reference = f"{self.repository}:{lookup}"
        with tempfile.TemporaryDirectory(prefix="builder-kernel-entry-") as tmp:
            (Path(tmp) / _ENTRY_IN_IMAGE).write_bytes(data)
            signature = kernel_trust.sign(self.signer, data)
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
    lookups: list[str],
    cache_dir: Path,
    shared: SharedKernels,
    trust: kernel_trust.Trust,
    into: Path,
) -> tuple[dict[str, str], dict[str, str]]:
    """Put the entries of each lookup key into `into`, from the local cache or else the
    registry (then kept locally too, with its signature): ({lookup: "local" | "registry" |
    "refused" | "none"}, {entry file name: its signer}). A local entry goes in only as the
    bytes whose signature a key trusted today verified, read once; the others are one
    warning line (their modules compile). Registry pulls run side by side: each is a small
    image, so a pull is mostly waiting."""
    for lookup in lookups:
        if not _LOOKUP.fullmatch(str(lookup)):
            raise BuilderError(f"kernel build: {str(lookup)[:80]!r} is not a lookup key")
    into.mkdir(parents=True, exist_ok=True)
    found: dict[str, str] = {}
    signers: dict[str, str] = {}
    refused: list[tuple[Path, str]] = []
    for lookup in lookups:
        found[lookup] = "none"
        for path in sorted(local_dir(cache_dir).glob(f"{lookup}.*{ENTRY_SUFFIX}")):
            try:
                data = read_entry(path)
            except ValueError as exc:
                data, signature, why = b"", "", str(exc)
            else:
                signature = kernel_trust.read_signature(path)
                why = trust.check(data, signature)
            if why or not isinstance(signature, kernel_trust.Signature):
                refused.append((path, why))
                found[lookup] = "local" if found[lookup] == "local" else "refused"
                continue
            (into / path.name).write_bytes(data)
            signers[path.name] = signature.signer
            found[lookup] = "local"
    if refused:  # one line, however many (a cache restored from another host: all of them)
        (path, why), more = refused[0], len(refused) - 1
        also = f" (and {more} more local entries not used)" if more else ""
        progress.warn(f"kernel entry {path} {why}: not used, its module compiles here{also}")
    missing = [lookup for lookup, where in found.items() if where != "local"]
    if missing:
        with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
            fetched = list(pool.map(shared.fetch, missing))
        for lookup, got in zip(missing, fetched, strict=True):
            if got:
                data, signature = got
                name = f"{lookup}.{_entry_key(data)}{ENTRY_SUFFIX}"
                (into / name).write_bytes(data)
                _write_entry(local_dir(cache_dir), name, data, signature)
                signers[name] = signature.signer
                found[lookup] = "registry"
    return found, signers


def keep(
    entries: list[Path], cache_dir: Path, shared: SharedKernels, trust: kernel_trust.Trust
) -> dict[str, str]:
    """New entries, compiled by this run, into the local cache signed (the site's signing
    key, else this host's) and, when one is configured, the registry; {name: signer}."""
    signers = {}
    for entry in entries:
        try:
            data = read_entry(entry)
        except ValueError as exc:
            raise BuilderError(f"kernel build: its new entry {entry.name} {exc}") from None
        signature = trust.sign(data)
        _write_entry(local_dir(cache_dir), entry.name, data, signature)
        signers[entry.name] = signature.signer
        shared.store(entry, data)
    return signers
