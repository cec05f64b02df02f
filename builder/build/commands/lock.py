"""`builder lock`: the image's runtime lock, resolved once and reviewed; `--check` for CI."""

from __future__ import annotations

import argparse
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.build.commands.common import context
from builder.core.cache import locked
from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import FETCH, PROJECT, add_command, emit

image_plan = lazy_module("builder.build.image_plan")
lockfile = lazy_module("builder.spec.lockfile")
lock = lazy_module("builder.build.lock")
pipeline = lazy_module("builder.build.pipeline")
progress = lazy_module("builder.core.progress")
validate = lazy_module("builder.core.validate")
wheels_stage = lazy_module("builder.build.wheels")


def _declared_requirements(ctx: pipeline.Context) -> dict[str, list]:
    """{distribution: Requires-Dist} of each patched upstream, read from its sources (or
    its cached wheel): a lock, and above all `lock --check` in CI, builds no wheel."""
    with locked(ctx.cache_dir):
        forks = pipeline.patch(ctx)
        return {
            use.fork.wheel.dist_name: lockfile.metadata_requirements(
                wheels_stage.declared_metadata(
                    ctx.cache_dir, forks[name], use.fork, ctx.target.local_label
                )
            )
            for name, use in ctx.selected().items()
        }


def cmd_lock(args: argparse.Namespace) -> None:
    ctx = context(args)
    target = ctx.target
    output = Path(args.output).resolve() if args.output else target.image.lock
    python = args.python_version or target.image.python
    platform = args.python_platform or target.image.platform
    validate.python_version("--python-version", python)
    validate.python_platform("--python-platform", platform)
    base_provides = tuple(
        validate.distribution_name("--base-provides", name) for name in args.base_provides
    )
    if args.runtime_requirements:
        source = Path(args.runtime_requirements)
        if not source.is_file():
            raise BuilderError(f"--runtime-requirements {source}: no such file")
        listed = lockfile.parse(source)
        lockfile.refuse_excluded(listed, target.image.exclude_requirements)
        requirements = [
            lockfile.requirement_of(source, number, line)
            for number, line in lockfile.requirement_lines(listed.text)
            if not line.startswith("-")
        ]
        ours: set[str] = set()
    else:
        requires = _declared_requirements(ctx)
        requirements = image_plan.runtime_inputs(target, requires)
        ours = set(requires)
    if args.check:
        if not output.is_file():
            raise BuilderError(f"{output}: no such lock (run `builder lock` without --check)")
        lockfile.refuse_stale(
            lockfile.parse(output), target=target.name, python=python, platform=platform,
            requirements=requirements, build_from_source=target.image.build_from_source,
        )  # fmt: skip
        emit(args, {"lock": str(output), "stale": False}, [f"{output}: up to date"])
        return
    try:
        before = lockfile.parse(output).packages if output.is_file() else {}
    except BuilderError as exc:
        progress.warn(f"the current lock does not parse ({exc}): replaced")
        before = {}
    for name in base_provides:
        if name in {canonicalize_name(n) for n in ours}:
            raise BuilderError(
                f"--base-provides {name}: builder builds it; it cannot come from the base"
            )
    refused = {name: "builder builds itself" for name in ours}
    refused.update({name: "the target excludes" for name in target.image.exclude_requirements})
    resolved = lock.resolve(
        [str(r) for r in requirements],
        target=target.name,
        python=python,
        platform=platform,
        index_url=args.pip_index_url or target.image.pip_index_url,
        extra_index_url=(
            target.image.pip_extra_index_url
            if args.pip_extra_index_url is None
            else args.pip_extra_index_url
        ),
        output=output,
        cache_dir=ctx.cache_dir,
        refused=refused,
        base_provides=base_provides,
        build_from_source=target.image.build_from_source,
    )
    after = resolved.packages
    changes = {
        "added": sorted(f"{n}=={after[n].version}" for n in after.keys() - before.keys()),
        "removed": sorted(f"{n}=={before[n].version}" for n in before.keys() - after.keys()),
        "changed": sorted(
            f"{n} {before[n].version} -> {after[n].version}"
            for n in after.keys() & before.keys()
            if before[n].version != after[n].version
        ),
    }
    lines = [f"{output}: {len(after)} packages for python {python} on {platform}"]
    lines += [f"  {kind} {item}" for kind, items in changes.items() for item in items]
    emit(args, {"lock": str(output), "packages": len(after), **changes}, lines)


def register(sub) -> None:
    lock_cmd = add_command(
        sub,
        "lock",
        cmd_lock,
        "resolve the image's runtime lock: every package pinned with its sha256",
        "Resolve the runtime requirements (the target's pins and the patched upstreams' own "
        "requirements, read from their sources: no wheel is built) with uv, once, for the "
        "image's Python and platform, from the target's index, from wheels only: a "
        "requirement with no wheel is refused in one line naming it (reading a source "
        "distribution runs its build code), unless the target's [image] build_from_source "
        "allows it, which the lock records. Every package gets "
        "name==version and the sha256 of each of its files. The lock goes to "
        "images/<target>/runtime-lock.txt, to review and commit; `builder image` installs "
        "from it with --require-hashes and refuses it, in one line, once it no longer "
        "satisfies the wheels' requirements. Prints what changed.\n\n"
        "examples:\n"
        "  builder lock --target sm120            # re-resolve, then git diff the lock\n"
        "  builder lock --target sm120 --check    # exit 1 when the lock is stale (for CI)",
        uses=(PROJECT, FETCH),  # every upstream: a lock for part of the image is no lock
    )
    lock_cmd.add_argument(
        "--check",
        action="store_true",
        help="only check the lock against what the patched sources require; write nothing",
    )
    lock_cmd.add_argument(
        "--out",
        dest="output",
        metavar="FILE",
        help="where to write it (default: the target's [image] lock)",
    )
    lock_cmd.add_argument("--output", dest="output", help=argparse.SUPPRESS)  # its old name
    lock_cmd.add_argument(
        "--runtime-requirements",
        metavar="FILE",
        help="resolve these top-level requirements instead of the wheels' (no wheels are built)",
    )
    lock_cmd.add_argument(
        "--base-provides",
        metavar="NAME",
        action="append",
        default=[],
        help="a distribution the base image's Python already has (torch on an NGC PyTorch or "
        "Debian base), left out of the lock with what only it requires; the image's venv "
        "then sees the base's packages, and its build stops if the base lacks it "
        "(repeatable)",
    )
    lock_cmd.add_argument(
        "--pip-index-url", metavar="URL", help="index to resolve from (default: the target's)"
    )
    lock_cmd.add_argument(
        "--pip-extra-index-url", metavar="URL", help="extra index (default: the target's, if any)"
    )
    lock_cmd.add_argument(
        "--python-version",
        metavar="X.Y",
        help="the image's Python (default: the target's [image] python)",
    )
    lock_cmd.add_argument(
        "--python-platform",
        metavar="PLATFORM",
        help="uv's platform, e.g. x86_64-manylinux_2_39 (default: the target's [image] platform)",
    )
    # It built the wheels once; it reads their requirements from the sources now.
    lock_cmd.add_argument("--wheelhouse", help=argparse.SUPPRESS)
