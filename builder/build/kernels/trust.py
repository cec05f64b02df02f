"""Which kernel entries a host uses: ed25519 signatures by keys the site controls, checked
every time an entry goes into a kernel wheel.

An entry is native code that goes into every image; anyone who can push to the kernel
registry, or write a cache that is restored onto a build host, could replace one. So every
entry in the local cache keeps its signature beside it (`<entry>.sig`: the signer's public
key and the signature over the whole entry file), and is used only while that signature
verifies with a key this host trusts *today*:
- the site's keys (`BUILDER_KERNEL_TRUSTED_KEYS`: a file, one base64 key a line);
- this host's own key (`kernel_host_key()`: made on first use, in the user state folder,
  never in the cache), which signs what this host compiled when no site signing key is
  configured, and the kernel wheels it caches.
New entries are signed with the site's private key (`BUILDER_KERNEL_SIGNING_KEY`, a PEM
file, never an argument) when there is one, else with the host key. The registry is used
only with trusted site keys (a host without them compiles what it has not compiled
itself). An entry signed by a key since removed from the trusted file, an entry changed
since it was signed, and a cache restored from another host without a site key's
signature are not used: one warning line, and the module compiles again.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from builder.core.cache import partial_beside, read_limited
from builder.core.errors import BuilderError
from builder.core.settings import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, kernel_host_key

_MAX_KEY_FILE = 64 << 10  # a key file is small; a larger one is a mistake


def _read_small(path_text: str, what: str) -> bytes:
    path = Path(path_text).expanduser()
    try:
        if not path.is_file():  # /dev/zero has size 0 and no end
            raise BuilderError(f"{what} {path}: not a regular file, not a key file")
        with path.open("rb") as handle:
            data = handle.read(_MAX_KEY_FILE + 1)
        if len(data) > _MAX_KEY_FILE:
            raise BuilderError(f"{what} {path}: larger than {_MAX_KEY_FILE} bytes, not a key file")
        return data
    except OSError as exc:
        raise BuilderError(f"{what} {path}: cannot read it ({exc.strerror})") from None


def public_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def trusted_keys() -> list[Ed25519PublicKey]:
    """The site's trusted public keys (empty when none is configured)."""
    path = os.environ.get(TRUSTED_KEYS_ENV)
    if not path:
        return []
    keys = []
    text = _read_small(path, TRUSTED_KEYS_ENV).decode(errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            keys.append(Ed25519PublicKey.from_public_bytes(base64.b64decode(line, validate=True)))
        except (binascii.Error, ValueError):
            raise BuilderError(
                f"{TRUSTED_KEYS_ENV} {path}:{number}: not a base64 ed25519 public key"
            ) from None
    return keys


def signing_key() -> Ed25519PrivateKey | None:
    path = os.environ.get(SIGNING_KEY_ENV)
    if not path:
        return None
    try:
        key = serialization.load_pem_private_key(_read_small(path, SIGNING_KEY_ENV), None)
    except (ValueError, TypeError):
        raise BuilderError(
            f"{SIGNING_KEY_ENV} {path}: not an unencrypted PEM private key"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BuilderError(f"{SIGNING_KEY_ENV} {path}: not an ed25519 key")
    return key


def sign(key: Ed25519PrivateKey, data: bytes) -> bytes:
    return key.sign(data)


def verify(keys: list[Ed25519PublicKey], data: bytes, signature: bytes) -> Ed25519PublicKey | None:
    """The key in `keys` whose signature `signature` is over `data`, or None."""
    for key in keys:
        try:
            key.verify(signature, data)
            return key
        except InvalidSignature:
            continue
    return None


def generate(directory: Path) -> tuple[Path, Path]:
    """A new key pair: `kernel-signing.key` (PEM, mode 0600) and `kernel-signing.pub`."""
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / "kernel-signing.key", directory / "kernel-signing.pub"
    for path in (private, public):
        if path.exists():
            raise BuilderError(f"{path}: exists; not overwritten (move it away first)")
    key = Ed25519PrivateKey.generate()
    pem = _private_pem(key)
    descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    public.write_text(f"{public_text(key.public_key())}  # builder kernel signing key\n")
    return private, public


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def host_key(path: Path | None = None) -> Ed25519PrivateKey:
    """This host's own key, made on first use (mode 0600, its folder 0700). Two runs that
    make it at once agree on one: the file is linked into place, never overwritten."""
    path = path or kernel_host_key()
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            descriptor, name = tempfile.mkstemp(prefix=".kernel-host.", dir=path.parent)
            try:
                with os.fdopen(descriptor, "wb") as handle:
                    handle.write(_private_pem(Ed25519PrivateKey.generate()))
                with contextlib.suppress(FileExistsError):  # another run's, made meanwhile
                    os.link(name, path)
            finally:
                os.unlink(name)
        except OSError as exc:
            raise BuilderError(
                f"kernel host key {path}: cannot make it ({exc.strerror}); set XDG_STATE_HOME "
                "to a folder of yours"
            ) from None
    try:
        key = serialization.load_pem_private_key(_read_small(str(path), "kernel host key"), None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise BuilderError(f"kernel host key {path}: not an ed25519 PEM key (move it away)")
    return key


SIGNATURE_SUFFIX = ".sig"
_SIGNATURE_LIMIT = 4096  # a key and a signature in base64: a larger file is not one


@dataclass(frozen=True)
class Signature:
    """Who signed an entry (base64 public key) and the ed25519 signature over its bytes."""

    signer: str
    value: bytes

    def body(self) -> str:
        value = base64.b64encode(self.value).decode()
        return json.dumps({"signer": self.signer, "signature": value}, sort_keys=True) + "\n"


def signature_path(entry: Path) -> Path:
    return entry.with_name(entry.name + SIGNATURE_SUFFIX)


def read_signature(entry: Path) -> Signature | str:
    """The signature kept beside `entry`, or why there is none that can be read."""
    path = signature_path(entry)
    if not os.path.lexists(path):
        return "has no signature"
    try:
        record = json.loads(read_limited(path, _SIGNATURE_LIMIT))
        return Signature(
            str(record["signer"]), base64.b64decode(record["signature"], validate=True)
        )
    except (ValueError, KeyError, TypeError, binascii.Error):
        return f"has an unreadable signature ({path.name})"


def write_signature(entry: Path, signature: Signature) -> None:
    with partial_beside(signature_path(entry)) as partial:
        partial.write_text(signature.body())


class Trust:
    """Today's keys: the site's trusted ones, its signing key (if this host has it) and this
    host's own. Made once per kernel step."""

    def __init__(
        self,
        trusted: list[Ed25519PublicKey],
        signer: Ed25519PrivateKey | None,
        host: Ed25519PrivateKey,
    ) -> None:
        self.trusted = trusted
        self.signer = signer
        self.host = host
        self.host_public = public_text(host.public_key())
        self.accepted = {public_text(key): key for key in trusted}
        self.accepted.setdefault(self.host_public, host.public_key())

    def sign(self, data: bytes) -> Signature:
        """An entry compiled here: the site's signing key when configured, else this host's."""
        key = self.signer or self.host
        return Signature(public_text(key.public_key()), key.sign(data))

    def sign_as_host(self, data: bytes) -> Signature:
        return Signature(self.host_public, self.host.sign(data))

    def check(self, data: bytes, signature: Signature | str, *, host_only: bool = False) -> str:
        """Why `signature` does not let `data` be used (in words that follow the file's
        name), or "" when a key trusted today signed it (only this host's: `host_only`)."""
        if isinstance(signature, str):
            return signature
        if host_only:
            key = self.host.public_key() if signature.signer == self.host_public else None
        else:
            key = self.accepted.get(signature.signer)
        if key is None:
            whose = "another host's key" if host_only else "a key"
            return f"is signed by {whose} ({signature.signer[:12]}…), not trusted now"
        try:
            key.verify(signature.value, data)
        except InvalidSignature:
            return "does not match its signature (changed since it was signed)"
        return ""

    def still_trusted(self, signer: str) -> bool:
        return signer in self.accepted


def load() -> Trust:
    """The keys as configured now; a signing key whose public key is not trusted here is a
    warning (what it signs, this host would not use)."""
    from builder.core import progress

    trusted, signer = trusted_keys(), signing_key()
    if signer and public_text(signer.public_key()) not in {public_text(k) for k in trusted}:
        progress.warn(
            f"{SIGNING_KEY_ENV}'s public key is not in {TRUSTED_KEYS_ENV}: the kernel entries "
            "it signs are not used on this host"
        )
    return Trust(trusted, signer, host_key())
