"""Stage 5a: push the image with the Docker SDK and read its digest from the push stream.

Credentials come from the Docker config (`docker login`), or from BUILDER_REGISTRY_USERNAME
and BUILDER_REGISTRY_PASSWORD for the one registry BUILDER_REGISTRY_HOST names; they are
passed to the engine for that registry only, and never printed or stored.
A failed push removes the registry tag it created, so nothing claims to be pushed.
"""

from __future__ import annotations

import contextlib
import os
import re

import docker
from docker.errors import APIError

from builder.core import progress
from builder.core.errors import BuilderError
from builder.core.settings import (
    REGISTRY_HOST_ENV,
    REGISTRY_PASSWORD_ENV,
    REGISTRY_USERNAME_ENV,
)

USERNAME_ENV = REGISTRY_USERNAME_ENV
PASSWORD_ENV = REGISTRY_PASSWORD_ENV
HOST_ENV = REGISTRY_HOST_ENV  # the registry those credentials are for


def registry_host(reference: str) -> str:
    """The registry a reference names (`docker.io` when its first part is no host)."""
    first, sep, _ = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def auth(reference: str) -> dict | None:
    """Credentials from the environment for `reference`'s registry, and only that one
    (BUILDER_REGISTRY_HOST: `host` for any port, or `host:port`); None: the Docker config's
    own, per registry, as `docker login` stored them."""
    username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if not (username and password):
        return None
    allowed = os.environ.get(HOST_ENV, "").strip()
    if not allowed:
        progress.warn(
            f"{USERNAME_ENV}/{PASSWORD_ENV} are set without {HOST_ENV}: sent to no registry "
            f"(set {HOST_ENV} to the registry host they are for)"
        )
        return None
    host = registry_host(reference)
    if host == allowed or (":" not in allowed and host.split(":")[0] == allowed):
        return {"username": username, "password": password}
    return None


def _redact(message: str) -> str:
    password = os.environ.get(PASSWORD_ENV)
    return message.replace(password, "***") if password else message


def push(
    client: docker.DockerClient,
    local_reference: str,
    repository: str,
    human_tags: tuple[str, ...] = (),
) -> dict:
    """Push `local_reference` as `repository:<same tag>` (the input tag), then under each of
    `human_tags` (`--tag release-3`: the same digest); return its reference by digest."""
    if ":" in repository.rsplit("/", 1)[-1] or "@" in repository:
        raise BuilderError(f"--push {repository}: give REGISTRY/REPO without a tag or digest")
    tag = local_reference.rsplit(":", 1)[1]
    pushed = _push_tag(client, local_reference, repository, tag)
    for human in human_tags:
        again = _push_tag(client, local_reference, repository, human)
        if again["digest"] != pushed["digest"]:  # one image, one manifest: never seen, checked
            raise BuilderError(
                f"push to {repository}:{human} gave {again['digest']}, not {pushed['digest']}"
            )
    return {**pushed, "tags": [tag, *human_tags]}


# What the engine says of a layer once its push is settled: sent, or found in the registry
# (already there, or mounted from another repository of it).
_LAYER_DONE = ("Pushed", "Layer already exists", "Mounted from")


def _push_tag(client: docker.DockerClient, local_reference: str, repository: str, tag: str) -> dict:
    image = client.images.get(local_reference)
    image.tag(repository, tag)
    digest = None
    error = None
    layers: dict[str, str] = {}  # layer id -> the last word the engine said of it
    try:
        with progress.task(f"push {repository}:{tag}"):
            for chunk in client.images.push(
                repository, tag=tag, stream=True, decode=True, auth_config=auth(repository)
            ):
                if "error" in chunk or "errorDetail" in chunk:
                    error = chunk.get("error") or chunk["errorDetail"].get("message", "")
                    break
                aux = chunk.get("aux") or {}
                if aux.get("Digest"):
                    digest = aux["Digest"]
                status = str(chunk.get("status") or "")
                if chunk.get("id") and status.startswith(_LAYER_DONE):
                    layers[str(chunk["id"])] = status
    except APIError as exc:
        error = str(exc.explanation or exc)
    if error or not digest:
        with contextlib.suppress(APIError):
            client.images.remove(f"{repository}:{tag}", noprune=True)
        reason = _redact(error or "the registry reported no digest")
        hint = ""
        if re.search(r"unauthorized|authentication required|denied", reason, re.I):
            hint = (
                f" (log in with `docker login`, or set {USERNAME_ENV}/{PASSWORD_ENV} and "
                f"{HOST_ENV}={registry_host(repository)})"
            )
        raise BuilderError(f"push to {repository} failed: {reason.strip()}{hint}")
    sent = sum(1 for status in layers.values() if status == "Pushed")
    return {
        "repository": repository,
        "tag": tag,
        "digest": digest,
        "reference": f"{repository}@{digest}",
        "layers": {"sent": sent, "present": len(layers) - sent},
    }
