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
import re
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound, NotFound

from builder.core import docker_client, progress, registry
from builder.core.errors import BuilderError
from builder.spec import engines, launch_profiles
from builder.spec.target import Target

# Every label builder puts on an image starts with this.
LABEL_PREFIX = "io.builder."

RECIPE_PATH = "/opt/builder/recipe.json"
SCHEMA_VERSION = 1
# The part of the recipe a VM needs to launch (target, profiles), also as an image label:
# read from the registry's image config, it needs no pull and no Docker daemon.
LAUNCH_LABEL = "io.builder.launch"


def launch_facts(target: Target) -> dict:
    """What `launch`, `deploy-files`, `wait-ready` and `doctor` read of an image."""
    profiles, default = launch_profiles.load_profiles(target.file)
    return {
        "schema_version": SCHEMA_VERSION,
        "target": {
            "name": target.name,
            "description": target.description,
            "cuda_version": str(target.cuda_version),
            "arch_list": list(target.arch_list),
            # Named only when not sglang: an sglang image's recipe stays what it was.
            **({"engine": target.engine} if target.engine != engines.DEFAULT else {}),
        },
        "profiles": {"default": default, "profiles": profiles},
    }


def built_by_builder(image) -> bool:
    """Whether a Docker image carries builder's labels (and so its recipe)."""
    return any(key.startswith(LABEL_PREFIX) for key in image.labels or {})


def launch_recipe(reference: str) -> dict:
    """An image's target and launch profiles: from the local image when the engine has it,
    else from its registry's image config (no pull, no daemon needed), else pulled."""
    from builder.core import registry_api
    from builder.core.errors import Unreachable

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
    except BuilderError as exc:  # the engine may still pull it (its own login, a mirror)
        if client is None:
            kind = Unreachable if isinstance(exc, Unreachable) else BuilderError
            raise kind(
                f"--image {reference}: no Docker daemon here, and its registry did not give "
                f"its config ({exc})"
            ) from None
        label = None
    if label:
        try:
            facts = json.loads(label)
        except (ValueError, RecursionError):
            facts = None
        return checked_facts(facts, f"--image {reference}: label {LAUNCH_LABEL}")
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
    try:
        recipe = json.loads(data)
    except (ValueError, RecursionError):
        recipe = None
    return checked_facts(recipe, f"--image {reference}: {RECIPE_PATH}")


_CUDA_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")
_ARCH = re.compile(r"\d+\.\d+[af]?")


def checked_facts(facts: object, where: str) -> dict:
    """A recipe (or its launch label) as builder writes it, or one line saying what is not:
    whoever can push a tag writes these bytes, and `launch`, `deploy-files`, `doctor` and
    `verify` print and act on them."""

    def fail(what: str) -> BuilderError:
        return BuilderError(f"{where}: not a recipe builder wrote ({what})")

    if not isinstance(facts, dict):
        raise fail("not a JSON object")
    try:
        _printable_everywhere(facts, "")
    except RecursionError:
        raise fail("nested too deep") from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    if facts.get("schema_version") != SCHEMA_VERSION:
        raise BuilderError(
            f"{where}: recipe schema {str(facts.get('schema_version'))[:20]}, this builder "
            f"reads {SCHEMA_VERSION}"
        )
    target = facts.get("target")
    if not isinstance(target, dict):
        raise fail("target is not an object")
    for key in ("name", "description", "cuda_version"):
        if not isinstance(target.get(key), str):
            raise fail(f"target.{key} is not a string")
    if not _CUDA_VERSION.fullmatch(target["cuda_version"]):
        raise fail("target.cuda_version is not a CUDA version")
    arch_list = target.get("arch_list")
    if not (isinstance(arch_list, list) and arch_list) or not all(
        isinstance(arch, str) and _ARCH.fullmatch(arch) for arch in arch_list
    ):
        raise fail("target.arch_list is not a list of archs such as 12.0f")
    if target.get("engine", engines.DEFAULT) not in engines.NAMES:
        raise fail(f"target.engine is not one of {', '.join(engines.NAMES)}")
    profiles = facts.get("profiles")
    if not isinstance(profiles, dict) or not isinstance(profiles.get("profiles"), dict):
        raise fail("profiles is not an object of profiles")
    known = profiles["profiles"]
    if not known or not all(isinstance(p, dict) for p in known.values()):
        raise fail("profiles.profiles holds something that is not a profile")
    if not isinstance(profiles.get("default"), str) or profiles["default"] not in known:
        raise fail("profiles.default names no profile")
    return facts


def _printable_everywhere(value: object, at: str) -> None:
    """Every key and string printable: no escape sequence or line break reaches a terminal
    or a generated file from a recipe."""
    if isinstance(value, str):
        if not value.isprintable():
            raise ValueError(f"a control character in {at or 'a value'}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _printable_everywhere(key, at)
            _printable_everywhere(item, f"{at}.{key}" if at else str(key))
    elif isinstance(value, list):
        for item in value:
            _printable_everywhere(item, at)


def profiles_of(recipe: dict, reference: str) -> launch_profiles.Profiles:
    """The launch profiles an image was built with, for `launch.resolve`."""
    return launch_profiles.Profiles(
        recipe["profiles"]["profiles"],
        recipe["profiles"]["default"],
        f"{reference}:{RECIPE_PATH}",
        recipe["target"].get("engine", engines.DEFAULT),
    )
