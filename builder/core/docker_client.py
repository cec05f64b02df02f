"""The Docker engine connection, with a clear error when it is not there."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable
from datetime import datetime

import docker
from docker.errors import DockerException

from builder.core.errors import BuilderError, Unreachable

_PING_SECONDS = 10
_CALL_SECONDS = 600  # a build step or a push can be slow; answering a ping is not


def connect() -> docker.DockerClient:
    """A client for DOCKER_HOST (or the default socket), checked with a short ping."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=_PING_SECONDS)
        client.ping()
    except DockerException as exc:
        raise Unreachable(
            f"cannot reach the Docker daemon at {where}: {_cause(exc, where)}"
        ) from None
    client.api.timeout = _CALL_SECONDS
    return client


def _cause(exc: DockerException, where: str) -> str:
    """What went wrong, and the fix for that, not for every possible case."""
    text = str(exc)
    socket = where.removeprefix("unix://")
    if "FileNotFoundError" in text or "No such file" in text:
        return (
            f"no socket at {socket}, so no daemon is running: start one (`systemctl start "
            "docker`; without systemd: `sudo dockerd &`; not installed: `apt-get install "
            "docker.io`) or set DOCKER_HOST to a running one's socket"
        )
    if "PermissionError" in text or "Permission denied" in text:
        return (
            f"permission denied on {socket}: run as a member of its group (`sudo usermod -aG "
            "docker $USER`, then log in again) or as root"
        )
    if "ConnectionRefusedError" in text or "Connection refused" in text:
        return "nothing answers there (the daemon stopped, or DOCKER_HOST names the wrong place)"
    if "timed out" in text.lower() or "Timeout" in text:
        return f"no answer within {_PING_SECONDS} s (the daemon is hung or overloaded)"
    return f"{exc.__class__.__name__}: {text.splitlines()[0][:200] if text else ''}"


def timestamp(stamp: str) -> datetime:
    """Docker's RFC 3339 UTC time (nanoseconds, `Z`), to microseconds; ValueError if not one."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]:0<6}+00:00")


def started_at(container) -> datetime:
    """When the container last started (its State.StartedAt)."""
    return timestamp(container.attrs["State"].get("StartedAt", ""))


IMAGE_FILE_LIMIT = 64 << 20  # an image's recipe, SBOM, pip report: kilobytes to a few MB
_ARCHIVE_SLACK = 1 << 20  # a tar's own headers and padding around its one file


def read_file_from_image(
    client: docker.DockerClient, reference: str, path: str, limit: int = IMAGE_FILE_LIMIT
) -> bytes:
    """One regular file of an image, at most `limit` bytes, read from a created (never
    started) container; a larger one, a folder or a link is a one-line BuilderError."""
    container = client.containers.create(reference, entrypoint=["true"])
    try:
        stream, _ = container.get_archive(path)
        return file_from_archive(stream, f"{reference}: {path}", limit)
    finally:
        container.remove(force=True)


def file_from_archive(chunks: Iterable[bytes], what: str, limit: int) -> bytes:
    """The one regular file of a `get_archive` stream, holding no more than `limit` bytes
    and the tar's headers in memory: whoever made the image or runs the container chose
    what is at that path (a folder would bring its whole tree). A larger file, a folder or
    a link is a one-line BuilderError naming `what`."""
    archive = bytearray()
    for chunk in chunks:
        archive += chunk
        if len(archive) > limit + _ARCHIVE_SLACK:
            raise BuilderError(f"{what}: larger than {limit} bytes: not read")
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(archive))) as tar:
            members = tar.getmembers()
            if len(members) != 1 or not members[0].isfile():
                raise BuilderError(f"{what}: not a regular file: not read")
            if members[0].size > limit:
                raise BuilderError(f"{what}: larger than {limit} bytes: not read")
            return tar.extractfile(members[0]).read()
    except tarfile.TarError as exc:
        raise BuilderError(f"{what}: not a readable archive ({exc})") from None
