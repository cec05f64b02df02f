"""Stage 5a: push the image with the Docker SDK and read its digest from the push stream.

Credentials come from the Docker config (`docker login`), or from BUILDER_REGISTRY_USERNAME
and BUILDER_REGISTRY_PASSWORD; they are passed to the engine and never printed or stored.
A failed push removes the registry tag it created, so nothing claims to be pushed.
"""

from __future__ import annotations

import contextlib
import os
import re

import docker
from docker.errors import APIError

from builder import progress
from builder.errors import BuilderError

USERNAME_ENV = "BUILDER_REGISTRY_USERNAME"
PASSWORD_ENV = "BUILDER_REGISTRY_PASSWORD"


def auth() -> dict | None:
    """Registry credentials from the environment for the engine (None: the Docker config)."""
    username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if username and password:
        return {"username": username, "password": password}
    return None


def _redact(message: str) -> str:
    password = os.environ.get(PASSWORD_ENV)
    return message.replace(password, "***") if password else message


def push(client: docker.DockerClient, local_reference: str, repository: str) -> dict:
    """Push `local_reference` as `repository:<same tag>`; return its reference by digest."""
    if ":" in repository.rsplit("/", 1)[-1] or "@" in repository:
        raise BuilderError(f"--push {repository}: give REGISTRY/REPO without a tag or digest")
    tag = local_reference.rsplit(":", 1)[1]
    image = client.images.get(local_reference)
    image.tag(repository, tag)
    digest = None
    error = None
    try:
        with progress.task(f"push {repository}:{tag}"):
            for chunk in client.images.push(
                repository, tag=tag, stream=True, decode=True, auth_config=auth()
            ):
                if "error" in chunk or "errorDetail" in chunk:
                    error = chunk.get("error") or chunk["errorDetail"].get("message", "")
                    break
                aux = chunk.get("aux") or {}
                if aux.get("Digest"):
                    digest = aux["Digest"]
    except APIError as exc:
        error = str(exc.explanation or exc)
    if error or not digest:
        with contextlib.suppress(APIError):
            client.images.remove(f"{repository}:{tag}", noprune=True)
        reason = _redact(error or "the registry reported no digest")
        hint = ""
        if re.search(r"unauthorized|authentication required|denied", reason, re.I):
            hint = f" (log in with `docker login`, or set {USERNAME_ENV}/{PASSWORD_ENV})"
        raise BuilderError(f"push to {repository} failed: {reason.strip()}{hint}")
    return {
        "repository": repository,
        "tag": tag,
        "digest": digest,
        "reference": f"{repository}@{digest}",
    }
