"""The build's records written from what it made: the recipe an image carries and the
manifest the build host keeps (their readers, which a GPU VM uses: builder/spec/recipe.py,
builder/spec/manifest.py)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from builder import __version__
from builder.core.identity import builder_identity
from builder.core.urls import redact
from builder.spec.manifest import SCHEMA_VERSION
from builder.spec.recipe import launch_facts
from builder.spec.target import Fork, Target

if TYPE_CHECKING:  # the build side's (pygit2, build): a GPU VM reads recipes without them
    from builder.build.patches import ForkResult
    from builder.build.wheels import BuiltWheel


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
    from builder.build.wheels import patched_lines

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


def build_manifest(
    target: Target,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    *,
    image: dict | None = None,
    image_options: dict | None = None,
    published: dict[str, list[dict]] | None = None,
    launch: dict[str, dict] | None = None,
    created: str | None = None,
    builder_wheel: BuiltWheel | None = None,
) -> dict:
    from builder.core.identity import builder_identity

    upstreams = {}
    for name, fork in forks.items():
        use = target.upstreams[name]
        upstreams[name] = {
            "source": "release" if use.fork.release else "git",
            "url": redact(use.fork.url),
            "ref": use.fork.ref,
            **({"release_sha256": use.fork.release.sha256} if use.fork.release else {}),
            "commit": fork.upstream_commit,
            "version": use.fork.version,
            "series": use.series,
            "series_sha256": fork.series_sha256,
            "patches": [{"file": p.path.name, "sha256": p.sha256} for p in fork.patches],
            "fork_commit": fork.fork_commit,
            "fork_branch": fork.branch,
            "submodules": {s.path: s.commit for s in fork.checkout.submodules},
        }

    def wheel_record(name: str, wheel: BuiltWheel) -> dict:
        return {
            "filename": wheel.filename,
            "dist_name": wheel.dist_name,
            "version": wheel.version,
            "sha256": wheel.sha256,
            "size": wheel.size,
            "published": (published or {}).get(name, []),
        }

    own = {"builder_wheel": wheel_record("builder", builder_wheel)} if builder_wheel else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "created": created or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "builder_version": __version__,
        "builder": builder_identity(),
        "python": sys.version.split()[0],
        "target": {
            "name": target.name,
            "description": target.description,
            "cuda_version": str(target.cuda_version),
            "arch_list": list(target.arch_list),
        },
        "upstreams": upstreams,
        "wheels": {name: wheel_record(name, wheel) for name, wheel in wheels.items()},
        **own,
        "image": image,
        "image_options": image_options,
        "jit_cache": (image or {}).get("jit_inventory"),
        "launch": launch,
    }
