"""What `builder image` would build, decided without a Docker daemon.

The runtime lock (the target's, checked current, or the user's file), the kernel modules, the
files the build context takes from the Dockerfile's folder, the build arguments, the labels,
the per-stage keys and the tag: every input hashed, so an unchanged `builder image` only
checks keys. builder/build/image.py asks the daemon what it has (the base image, earlier
builds' keys) and builds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from builder import __version__
from builder.build.patches import ForkResult
from builder.build.wheels import BuiltWheel, wheel_metadata
from builder.core import progress
from builder.core.cache import content_key, sha256_file
from builder.core.errors import BuilderError
from builder.core.identity import code_key
from builder.core.urls import redact
from builder.spec import launch_profiles, lockfile, recipe
from builder.spec.cuda import sm_name
from builder.spec.jit import packs
from builder.spec.lockfile import Lock
from builder.spec.recipe import LABEL_PREFIX
from builder.spec.target import Target

STAGES = ("runtime", "flashinfer", "server")


@dataclass(frozen=True)
class ImageOptions:
    """Command-line choices that change the product (all recorded in labels/manifest)."""

    base_image: str
    pip_index_url: str
    pip_extra_index_url: str
    runtime_requirements: Path | None  # replaces the target's lock (offline/test builds)
    jit_modules: tuple[str, ...]
    jit_jobs: int
    network_host: bool
    # Kernel packs (`builder jit harvest`) for this flashinfer build: their modules compile too.
    kernel_packs_dir: Path | None = None
    # An OCI repository where build hosts share compiled kernel entries (None: local only).
    kernel_registry: str | None = None


@dataclass(frozen=True, kw_only=True)
class ImageInputs:
    """What goes into the image, every input hashed: the tag, the stage keys, the labels
    and the build arguments."""

    tag: str
    repository: str
    inputs_hash: str
    stage_keys: dict[str, str]
    buildargs: dict[str, str]
    labels: dict[str, str]
    runtime_lock: Lock  # what the runtime stage installs (requirements-runtime.txt)
    kernel_builder: str  # the Dockerfile's kernel-builder stage, tagged by its inputs
    # The target's modules, then those kernel packs found a server compiling (by call).
    jit_modules: tuple[str, ...] = ()
    harvested: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True, kw_only=True)
class ImagePlan(ImageInputs):
    """The inputs, and what the daemon has of them: the base image, and which stages rebuild."""

    rebuild: dict[str, str]  # stage -> why it rebuilds ("" = cached)
    exists: bool
    base_id: str
    base_digest: str | None


def options_record(options: ImageOptions) -> dict:
    """The build choices for the manifest (index URLs without credentials)."""
    requirements = options.runtime_requirements
    return {
        "base_image": options.base_image,
        "pip_index_url": redact(options.pip_index_url),
        "pip_extra_index_url": redact(options.pip_extra_index_url),
        "runtime_requirements": (
            {"file": str(requirements), "sha256": sha256_file(requirements)}
            if requirements
            else "target lock"
        ),
        "jit_modules": list(options.jit_modules),
        "jit_jobs": options.jit_jobs,
        "kernel_packs_dir": str(options.kernel_packs_dir) if options.kernel_packs_dir else None,
        "kernel_registry": options.kernel_registry,
        "network_host": options.network_host,
    }


def wheels_requirements(wheels: dict[str, BuiltWheel]) -> dict[str, list[Requirement]]:
    """{distribution: its Requires-Dist} of built wheels."""
    return {
        wheel.dist_name: lockfile.metadata_requirements(wheel_metadata(wheel.path))
        for wheel in wheels.values()
    }


def runtime_inputs(target: Target, requires: dict[str, list[Requirement]]) -> list[Requirement]:
    """The target's pins, then each of our distributions' own requirements for what the
    target does not pin (all of them: uv intersects two wheels' ranges for one package), none
    of ours or excluded: what the runtime lock is resolved from and must satisfy."""
    ours = {canonicalize_name(name) for name in requires}
    excluded = {canonicalize_name(n) for n in target.image.exclude_requirements}
    pinned = [Requirement(text) for text in target.image.requirements]
    taken = {canonicalize_name(r.name) for r in pinned} | ours | excluded
    chosen = {str(r): r for r in pinned}
    for name in sorted(requires):
        for requirement in requires[name]:
            if canonicalize_name(requirement.name) not in taken:
                chosen.setdefault(str(requirement), requirement)
    return sorted(chosen.values(), key=lambda r: (canonicalize_name(r.name), str(r)))


def _runtime_lock(target: Target, wheels: dict[str, BuiltWheel], options: ImageOptions) -> Lock:
    """What the runtime stage installs: the user's file as given, or the target's lock once
    it is known to be current (hashed, for the image's Python and platform, resolved from
    the wheels' requirements now). Either way nothing the target excludes."""
    if options.runtime_requirements:
        chosen = lockfile.parse(options.runtime_requirements)
    else:
        path = target.image.lock
        if not path.is_file():
            raise BuilderError(
                f"{path}: target {target.name} has no runtime lock yet: run "
                f"`builder lock --target {target.name}` and commit the file"
            )
        chosen = lockfile.parse(path)
        lockfile.refuse_stale(
            chosen,
            target=target.name,
            python=target.image.python,
            platform=target.image.platform,
            requirements=runtime_inputs(target, wheels_requirements(wheels)),
            build_from_source=target.image.build_from_source,
        )
    lockfile.refuse_excluded(chosen, target.image.exclude_requirements)
    return chosen


def _jit_modules(
    target: Target, wheels: dict[str, BuiltWheel], options: ImageOptions
) -> tuple[tuple[str, ...], dict[str, dict[str, str]]]:
    """The target's modules, then the calls kernel packs name (a server compiled them)."""
    kernel_packs = (
        packs.packs_for(options.kernel_packs_dir, wheels["flashinfer"].version, target.arch_list)
        if options.kernel_packs_dir and options.kernel_packs_dir.is_dir()
        else []
    )
    harvested, unresolved = packs.harvested_modules(kernel_packs)
    for problem in unresolved:
        progress.warn(problem)
    listed = options.jit_modules
    return (*listed, *(call for call in harvested if call not in listed)), harvested


def local_plan(target: Target, wheels: dict[str, BuiltWheel], options: ImageOptions) -> dict:
    """What a build would take, from this machine alone (no Docker daemon): the wheels, the
    runtime lock (checked current) and the kernel modules. The tag and what rebuilds are
    not known without a daemon: the tag hashes the base image's id, and reuse of each
    kernel is decided in a container of the kernel-builder stage."""
    runtime_lock = _runtime_lock(target, wheels, options)
    modules, harvested = _jit_modules(target, wheels, options)
    return {
        "reference": None,
        "repository": target.image.repository,
        "base_image": options.base_image,
        "wheels": {name: wheel.filename for name, wheel in wheels.items()},
        "runtime_lock": {
            "file": str(options.runtime_requirements or target.image.lock),
            "packages": len(runtime_lock.packages),
            "base_provides": list(runtime_lock.base_provides),
            "builds_from_source": list(runtime_lock.builds_from_source),
        },
        "kernels": [
            {"generator": call, "harvested_from": harvested.get(call, {}).get("pack")}
            for call in modules
        ],
    }


def hashed_inputs(
    target: Target,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
    base_id: str,
) -> ImageInputs:
    """Every input hashed, over the base image's id: the tag, the per-stage keys, the labels
    and the build arguments."""
    runtime_lock = _runtime_lock(target, wheels, options)
    recipe = {p.name: sha256_file(p) for p in recipe_files(target)}
    runtime_key = content_key(
        {
            "base_id": base_id,
            "recipe": recipe,
            "requirements": runtime_lock.text,
            "pip": [options.pip_index_url, options.pip_extra_index_url],
        }
    )
    jit_modules, harvested = _jit_modules(target, wheels, options)
    flashinfer_key = content_key(
        {
            "runtime": runtime_key,
            "wheel": wheels["flashinfer"].sha256,
            "arch": target.arch_list,
            "modules": jit_modules,
            "harvested": harvested,
            "builder": code_key(
                "build/kernels/build",
                "build/kernels/cache",
                "build/kernels/wheel",
                "build/wheelfiles",
            ),
        }
    )
    kernel_builder_key = content_key(
        {"runtime": runtime_key, "wheel": wheels["flashinfer"].sha256, "arch": target.arch_list}
    )
    # The launch profiles travel in the image's recipe (its last layer).
    profiles = launch_profiles.Profiles.of(target.file)
    server_key = content_key(
        {
            "flashinfer": flashinfer_key,
            "wheel": wheels[target.engine].sha256,
            "profiles": [profiles.profiles, profiles.default],
        }
    )
    stage_keys = {"runtime": runtime_key, "flashinfer": flashinfer_key, "server": server_key}
    builder_code = code_key(
        "build/image",
        "build/image_plan",
        "spec/recipe",
        "build/sbom",
        "spec/lockfile",
        "build/kernels/build",
        "build/kernels/wheel",
        "build/wheelfiles",
    )
    inputs_hash = content_key({"stages": stage_keys, "builder": builder_code})

    server_version = wheels[target.engine].version.split("+")[0]
    fi_version = wheels["flashinfer"].version.split("+")[0]
    tag = f"{target.engine}{server_version}-fi{fi_version}-{target.name}-{inputs_hash[:12]}"
    labels = _labels(target, forks, wheels, options, jit_modules, stage_keys, inputs_hash)
    buildargs = {
        "BASE_IMAGE": options.base_image,
        "PIP_INDEX_URL": options.pip_index_url,
        "PIP_EXTRA_INDEX_URL": options.pip_extra_index_url,
        "JIT_ARCH_LIST": " ".join(target.arch_list),
        "JIT_MODULES": json.dumps(list(jit_modules)),
        "RUNTIME_REQUIRE_HASHES": "1" if runtime_lock.hashed else "",
        "BASE_PROVIDES": " ".join(runtime_lock.base_provides),
        "RUNTIME_ONLY_BINARY": ":all:" if runtime_lock.made_by_builder else "",
        "RUNTIME_NO_BINARY": ",".join(runtime_lock.builds_from_source),
    }
    return ImageInputs(
        tag=tag,
        repository=target.image.repository,
        inputs_hash=inputs_hash,
        stage_keys=stage_keys,
        buildargs=buildargs,
        labels=labels,
        runtime_lock=runtime_lock,
        kernel_builder=f"{target.image.repository}:kernel-builder-{kernel_builder_key[:12]}",
        jit_modules=jit_modules,
        harvested=harvested,
    )


def rebuild_reasons(
    stage_keys: dict[str, str], exists: bool, previous: dict[str, set[str]], engine: str
) -> dict[str, str]:
    """Per stage, why it rebuilds ("" = cached): none when this very image exists; else a
    stage whose key an earlier image carries is cached, and every stage after the first that
    rebuilds follows it. `previous`: each stage's keys of this target's earlier images."""
    rebuild: dict[str, str] = {}
    upstream_changed = ""
    reasons = {
        "runtime": "base image, Dockerfile folder, requirements or package index changed",
        "flashinfer": "flashinfer wheel, JIT modules, kernel packs or arch changed",
        "server": f"{engine} wheel or launch profiles changed",
    }
    for stage in STAGES:
        if exists:
            rebuild[stage] = ""
        elif upstream_changed:
            rebuild[stage] = f"follows {upstream_changed}"
        elif stage_keys[stage] in previous.get(stage, set()):
            rebuild[stage] = ""
        else:
            rebuild[stage] = reasons[stage] if previous else "no earlier image for this target"
            upstream_changed = stage
    return rebuild


def _labels(
    target: Target,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
    jit_modules: tuple[str, ...],
    stage_keys: dict[str, str],
    inputs_hash: str,
) -> dict[str, str]:
    server = forks[target.engine]
    labels = {
        "org.opencontainers.image.source": redact(target.upstreams[target.engine].fork.url),
        "org.opencontainers.image.revision": server.fork_commit,
        "org.opencontainers.image.version": wheels[target.engine].version,
        "org.opencontainers.image.title": f"{target.engine} {target.name}",
        "org.opencontainers.image.description": target.description,
        f"{LABEL_PREFIX}builder-version": __version__,
        f"{LABEL_PREFIX}target": target.name,
        f"{LABEL_PREFIX}inputs": inputs_hash,
        f"{LABEL_PREFIX}jit.arch": " ".join(sm_name(a) for a in target.arch_list),
        f"{LABEL_PREFIX}jit.modules": json.dumps(list(jit_modules)),
        f"{LABEL_PREFIX}base-image": options.base_image,
        recipe.LAUNCH_LABEL: json.dumps(
            recipe.launch_facts(target), sort_keys=True, separators=(",", ":")
        ),
    }
    for name, fork in forks.items():
        labels[f"{LABEL_PREFIX}{name}.upstream-commit"] = fork.upstream_commit
        labels[f"{LABEL_PREFIX}{name}.fork-commit"] = fork.fork_commit
        labels[f"{LABEL_PREFIX}{name}.patch-series-sha256"] = fork.series_sha256
    for name, wheel in wheels.items():
        labels[f"{LABEL_PREFIX}{name}.wheel"] = wheel.filename
        labels[f"{LABEL_PREFIX}{name}.wheel-sha256"] = wheel.sha256
    for stage, key in stage_keys.items():
        labels[f"{LABEL_PREFIX}key.{stage}"] = key
    return labels


def recipe_files(target: Target) -> list[Path]:
    """What goes from the Dockerfile's folder into the context, and the target's
    `context_files` from elsewhere: not the target's data files, so editing a launch profile
    does not change the image. A name in both is refused: one file of that name goes in."""
    folder = target.image.dockerfile.parent
    data = {target.image.lock.name}  # installed as requirements-runtime.txt
    own = [
        p for p in folder.iterdir() if p.is_file() and p.suffix != ".toml" and p.name not in data
    ]
    names = {p.name for p in own}
    for shared in target.image.context_files:
        if shared.name in names:
            raise BuilderError(
                f"{target.file}: field 'image.context_files' names {shared.name}, which "
                f"{folder} has too: one file of a name goes into the context"
            )
        names.add(shared.name)
    return sorted([*own, *target.image.context_files], key=lambda p: (p.name, str(p)))
