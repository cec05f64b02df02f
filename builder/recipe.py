"""What an image promises, carried inside it (`/opt/builder/recipe.json`).

`builder image` writes the recipe into the build context and the image's last layer, so a
GPU VM with no checkout of this repository can launch, deploy, wait for and verify a server
from the image reference alone: the target, its launch profiles as they were at build
time, the pins and patch hashes, every wheel's version and sha256 (the kernel wheel too),
the lines each patch adds per installed file, and the JIT module list. The manifest on the
build host records the same facts (a test checks that they agree).
"""

from __future__ import annotations

import json
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound, NotFound

from builder import docker_client, launch, progress, registry
from builder.errors import BuilderError
from builder.identity import builder_identity
from builder.patches import ForkResult
from builder.target import Fork, Target
from builder.urls import redact
from builder.wheels import BuiltWheel, patched_lines

# Every label builder puts on an image starts with this.
LABEL_PREFIX = "io.builder."

RECIPE_PATH = "/opt/builder/recipe.json"
SCHEMA_VERSION = 1
# The part of the recipe a VM needs to launch (target, profiles), also as an image label:
# read from the registry's image config, it needs no pull and no Docker daemon.
LAUNCH_LABEL = "io.builder.launch"


def _made_from(fork: Fork) -> dict:
    """What the upstream commit was made of: a git ref, or a released wheel by sha256."""
    made = {"url": redact(fork.url), "ref": fork.ref}
    if fork.release:
        made["sha256"] = fork.release.sha256
    return made


def build_recipe(
    target: Target,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    jit_modules: tuple[str, ...],
) -> dict:
    return {
        **launch_facts(target),  # schema_version, target, profiles
        "upstreams": {
            name: {
                "made_from": _made_from(target.upstreams[name].fork),
                "commit": fork.upstream_commit,
                "fork_commit": fork.fork_commit,
                "series_sha256": fork.series_sha256,
                "patches": [{"file": p.path.name, "sha256": p.sha256} for p in fork.patches],
            }
            for name, fork in forks.items()
        },
        "wheels": {
            name: {
                "dist_name": wheel.dist_name,
                "version": wheel.version,
                "filename": wheel.filename,
                "sha256": wheel.sha256,
            }
            for name, wheel in wheels.items()
        },
        "patched_lines": {
            name: patched_lines(wheels[name].path, forks[name].patches)
            for name in forks
            if name in wheels
        },
        "jit_modules": list(jit_modules),
        "builder": builder_identity(),  # which builder made this image
    }


def launch_facts(target: Target) -> dict:
    """What `launch`, `deploy-files`, `wait-ready` and `doctor` read of an image."""
    profiles, default = launch.load_profiles(target.file)
    return {
        "schema_version": SCHEMA_VERSION,
        "target": {
            "name": target.name,
            "description": target.description,
            "cuda_version": str(target.cuda_version),
            "arch_list": list(target.arch_list),
        },
        "profiles": {"default": default, "profiles": profiles},
    }


def built_by_builder(image) -> bool:
    """Whether a Docker image carries builder's labels (and so its recipe)."""
    return any(key.startswith(LABEL_PREFIX) for key in image.labels or {})


def launch_recipe(reference: str) -> dict:
    """An image's target and launch profiles: from the local image when the engine has it,
    else from its registry's image config (no pull, no daemon needed), else pulled."""
    from builder import registry_api
    from builder.errors import Unreachable

    try:
        client = docker_client.connect()
    except Unreachable:
        client = None
    if client is not None:
        try:
            client.images.get(reference)
            return from_image(client, reference)
        except ImageNotFound:
            pass
    try:
        label = registry_api.labels(reference).get(LAUNCH_LABEL)
        if label:
            facts = json.loads(label)
            if facts.get("schema_version") == SCHEMA_VERSION:
                return facts
    except (BuilderError, ValueError) as exc:
        if client is None:
            raise BuilderError(
                f"--image {reference}: no Docker daemon here, and its registry did not give "
                f"its config ({exc})"
            ) from None
    if client is None:
        raise BuilderError(f"--image {reference}: its registry config has no {LAUNCH_LABEL}")
    return from_image(client, reference)


def write(recipe: dict, directory: Path) -> Path:
    path = directory / "builder-recipe.json"
    path.write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    return path


def _ensure_image(client: docker.DockerClient, reference: str) -> None:
    try:
        client.images.get(reference)
    except ImageNotFound:
        try:
            with progress.task(f"pull {reference}"):
                client.images.pull(reference, auth_config=registry.auth(reference))
        except (APIError, NotFound) as exc:
            reason = str(getattr(exc, "explanation", None) or exc).strip().splitlines()[0]
            raise BuilderError(
                f"--image {reference}: not here and cannot be pulled ({reason}); "
                "log in with `docker login` or `docker load -i` it"
            ) from None


def from_image(client: docker.DockerClient, reference: str) -> dict:
    """The recipe inside `reference`, pulling the image first when it is not here."""
    _ensure_image(client, reference)
    try:
        data = docker_client.read_file_from_image(client, reference, RECIPE_PATH)
    except (NotFound, APIError):
        raise BuilderError(
            f"--image {reference}: holds no {RECIPE_PATH} (not built by this builder version)"
        ) from None
    recipe = json.loads(data)
    if recipe.get("schema_version") != SCHEMA_VERSION:
        raise BuilderError(
            f"--image {reference}: recipe schema {recipe.get('schema_version')}, "
            f"this builder reads {SCHEMA_VERSION}"
        )
    return recipe


def profiles_of(recipe: dict, reference: str) -> launch.Profiles:
    """The launch profiles an image was built with, for `launch.resolve`."""
    return launch.Profiles(
        recipe["profiles"]["profiles"], recipe["profiles"]["default"], f"{reference}:{RECIPE_PATH}"
    )
