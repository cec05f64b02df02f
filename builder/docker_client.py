"""The Docker engine connection, with a clear error when it is not there."""

from __future__ import annotations

import os

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
