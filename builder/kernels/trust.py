"""Which shared kernel entries a site trusts: ed25519 signatures by keys the site controls.

An entry in the kernel registry is native code that every build host would put into its
image. Anyone who can push to the registry could replace it, so an entry is reused only
with a signature by one of the site's trusted public keys (`BUILDER_KERNEL_TRUSTED_KEYS`: a
file, one base64 key a line). New entries are signed with the private key in
`BUILDER_KERNEL_SIGNING_KEY` (a PEM file, never an argument); a host without it still
takes signed entries but shares none. No trusted key: the registry is not used at all.
The signature covers the whole entry file (its entry.json names the .so's sha256, and the
warm-up checks the key against this build's inputs before reuse).
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from builder.errors import BuilderError

SIGNING_KEY_ENV = "BUILDER_KERNEL_SIGNING_KEY"
TRUSTED_KEYS_ENV = "BUILDER_KERNEL_TRUSTED_KEYS"
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


def verify(keys: list[Ed25519PublicKey], data: bytes, signature: bytes) -> bool:
    for key in keys:
        try:
            key.verify(signature, data)
            return True
        except InvalidSignature:
            continue
    return False


def generate(directory: Path) -> tuple[Path, Path]:
    """A new key pair: `kernel-signing.key` (PEM, mode 0600) and `kernel-signing.pub`."""
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / "kernel-signing.key", directory / "kernel-signing.pub"
    for path in (private, public):
        if path.exists():
            raise BuilderError(f"{path}: exists; not overwritten (move it away first)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    public.write_text(f"{public_text(key.public_key())}  # builder kernel signing key\n")
    return private, public
