"""The Docker engine connection, with a clear error when it is not there."""

from __future__ import annotations

import io
import os
import tarfile
from datetime import datetime

import docker
from docker.errors import DockerException

from builder.errors import Unreachable


def connect() -> docker.DockerClient:
    """A client for DOCKER_HOST (or the default socket), checked with a ping."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        raise Unreachable(
            f"cannot reach the Docker daemon at {where} ({exc.__class__.__name__}): "
            "start one (`systemctl start docker`; without systemd: `sudo dockerd &`; not "
            "installed: `apt-get install docker.io`) or set DOCKER_HOST to a running one's socket"
        ) from None
    return client


def timestamp(stamp: str) -> datetime:
    """Docker's RFC 3339 UTC time (nanoseconds, `Z`), to microseconds; ValueError if not one."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]:0<6}+00:00")


def started_at(container) -> datetime:
    """When the container last started (its State.StartedAt)."""
    return timestamp(container.attrs["State"].get("StartedAt", ""))


def read_file_from_image(client: docker.DockerClient, reference: str, path: str) -> bytes:
    """One file of an image, read from a created (never started) container."""
    container = client.containers.create(reference, entrypoint=["true"])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            return archive.extractfile(archive.getmembers()[0]).read()
    finally:
        container.remove(force=True)
