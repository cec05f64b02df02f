"""Commands that build and ship: sources, patch, wheels, lock, image, publish."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from builder import (
    docker_client,
    image,
    launch,
    lock,
    manifest,
    pipeline,
    progress,
    provenance,
    publish,
    registry,
    self_wheel,
    validate,
)
from builder import wheels as wheels_stage
from builder.cache import atomic_copy, locked, sha256_file
from builder.commands.common import FETCH, PROJECT, add_command, context, emit
from builder.errors import BuilderError, Unreachable
from builder.kernels import packs
from builder.kernels import wheel as kernel_wheel
from builder.urls import has_credentials, redact
from builder.wheels import BuiltWheel

KERNEL_REGISTRY_ENV = "BUILDER_KERNEL_REGISTRY"


def _wheelhouse(args: argparse.Namespace, ctx: pipeline.Context) -> Path:
    return Path(args.wheelhouse or Path("wheelhouse") / ctx.target.name).resolve()


def _add_wheelhouse(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--wheelhouse", help="where the wheels are copied (default: ./wheelhouse/<target>)"
    )


def _forks_and_wheels(args: argparse.Namespace, ctx: pipeline.Context):
    """Run sources -> patch -> wheels under the cache lock; ({name: fork}, {name: wheel})."""
    with locked(ctx.cache_dir):
        built = pipeline.wheels(ctx, _wheelhouse(args, ctx))
    return (
        {name: fork for name, (fork, _) in built.items()},
        {name: wheel for name, (_, wheel) in built.items()},
    )


def cmd_sources(args: argparse.Namespace) -> None:
    ctx = context(args)
    with locked(ctx.cache_dir):
        checkouts = pipeline.sources(ctx)
    result = {
        "target": ctx.target.name,
        "upstreams": {
            name: {
                "commit": co.commit,
                "path": str(co.path),
                "submodules": {s.path: {"url": s.url, "commit": s.commit} for s in co.submodules},
            }
            for name, co in checkouts.items()
        },
    }
    lines = [f"{name}: {co.commit} at {co.path}" for name, co in checkouts.items()]
    emit(args, result, lines)


def _fork_json(fork) -> dict:
    return {
        "upstream_commit": fork.upstream_commit,
        "fork_commit": fork.fork_commit,
        "branch": fork.branch,
        "path": str(fork.checkout.path),
        "series_sha256": fork.series_sha256,
        "patches": [{"file": p.path.name, "sha256": p.sha256} for p in fork.patches],
    }


def cmd_patch(args: argparse.Namespace) -> None:
    ctx = context(args)
    with locked(ctx.cache_dir):
        forks = pipeline.patch(ctx)
    result = {"target": ctx.target.name, "upstreams": {n: _fork_json(f) for n, f in forks.items()}}
    lines = [
        f"{name}: {fork.upstream_commit[:12]} + {len(fork.patches)} patches = "
        f"{fork.fork_commit} ({fork.branch})"
        for name, fork in forks.items()
    ]
    emit(args, result, lines)


def cmd_wheels(args: argparse.Namespace) -> None:
    ctx = context(args)
    wheelhouse = _wheelhouse(args, ctx)
    with locked(ctx.cache_dir):
        built = pipeline.wheels(ctx, wheelhouse)
    result = {
        "target": ctx.target.name,
        "wheelhouse": str(wheelhouse),
        "upstreams": {
            name: {**_fork_json(fork), "wheel": wheel.to_json()}
            for name, (fork, wheel) in built.items()
        },
    }
    lines = [
        f"{wheel.path}  sha256={wheel.sha256[:16]}…{'  (cached)' if wheel.cached else ''}"
        for _, wheel in built.values()
    ]
    emit(args, result, lines)


def _image_options(args: argparse.Namespace, ctx: pipeline.Context) -> image.ImageOptions:
    """Every `builder image` choice resolved in one place (flag, else environment, else the
    target's data) and validated before anything is fetched or built."""
    target = ctx.target
    kernel_registry = args.kernel_registry or os.environ.get(KERNEL_REGISTRY_ENV) or None
    if kernel_registry:
        validate.repository(f"--kernel-registry (or {KERNEL_REGISTRY_ENV})", kernel_registry)
    if args.jit_jobs < 0:
        raise BuilderError(f"--jit-jobs {args.jit_jobs}: must be 0 (from cores and memory) or more")
    requirements = Path(args.runtime_requirements) if args.runtime_requirements else None
    if requirements and not requirements.is_file():
        raise BuilderError(f"--runtime-requirements {requirements}: no such file")
    if requirements:
        listed = lock.parse(requirements)
        lock.refuse_excluded(listed, target.image.exclude_requirements)
        # The file is copied into the image: an index URL with a token in it is refused
        # exactly like the same URL given as --pip-extra-index-url.
        for number, line in lock.requirement_lines(listed.text):
            for word in line.replace("=", " ").split():
                if "://" in word:
                    provenance.refuse_credentials_in_build_args(f"{requirements}:{number}:", word)
    modules = (
        tuple(m.strip() for m in args.jit_modules.split(";") if m.strip())
        if args.jit_modules is not None
        else target.jit_modules
    )
    if not modules:
        raise BuilderError("--jit-modules: empty; name at least one generator")
    options = image.ImageOptions(
        base_image=args.base_image or target.image.base,
        pip_index_url=args.pip_index_url or target.image.pip_index_url,
        pip_extra_index_url=(
            target.image.pip_extra_index_url
            if args.pip_extra_index_url is None
            else args.pip_extra_index_url
        ),
        runtime_requirements=requirements,
        jit_modules=modules,
        jit_jobs=args.jit_jobs,
        network_host=args.network_host,
        kernel_packs_dir=packs.packs_dir(ctx.cache_dir),
        kernel_registry=kernel_registry,
    )
    provenance.refuse_credentials_in_build_args("--pip-index-url", options.pip_index_url)
    provenance.refuse_credentials_in_build_args(
        "--pip-extra-index-url", options.pip_extra_index_url
    )
    return options


def _plan_without_daemon(args, ctx, options: image.ImageOptions, why: Unreachable) -> None:
    """`image --plan` with no daemon: what is known from this machine, and what is not."""
    _, wheels = _forks_and_wheels(args, ctx)
    result = image.local_plan(ctx.target, wheels, options)
    result["daemon"] = str(why)
    lock = result["runtime_lock"]
    lines = [
        f"image {result['repository']}:<tag> (the tag hashes the base image's id: unknown "
        "without a Docker daemon; so is which stages and kernels are cached)",
        f"  base       {result['base_image']}",
        *(f"  wheel      {filename}" for filename in result["wheels"].values()),
        f"  runtime    {lock['packages']} packages from {lock['file']} (current)",
        *(
            f"  kernel     {k['generator']}"
            + (f" (harvested: {k['harvested_from']})" if k["harvested_from"] else "")
            for k in result["kernels"]
        ),
        f"  no daemon: {why}",
    ]
    emit(args, result, lines)


def cmd_image(args: argparse.Namespace) -> None:
    _check_publish_args(args)
    if args.push:
        validate.repository("--push", args.push)
    if args.save_context:
        image.check_save_context(Path(args.save_context))
    ctx = context(args)
    target = ctx.target
    options = _image_options(args, ctx)
    if args.push and not args.plan:
        provenance.refuse_dirty_push(ctx.data_dir, args.allow_dirty)
    try:
        client = docker_client.connect()
    except Unreachable as exc:
        if not args.plan:
            raise
        _plan_without_daemon(args, ctx, options, exc)
        return
    forks, wheels = _forks_and_wheels(args, ctx)
    image_plan = image.plan(client, target, forks, wheels, options)

    if args.plan:
        result = {
            "reference": image_plan.reference,
            "inputs": image_plan.inputs_hash,
            "stages": {
                stage: {"key": image_plan.stage_keys[stage], "rebuild": why or None}
                for stage, why in image_plan.rebuild.items()
            },
            "buildargs": image_plan.buildargs,
        }
        lines = [f"image {image_plan.reference}"]
        for stage, why in image_plan.rebuild.items():
            lines.append(f"  {stage:<10} {'rebuild: ' + why if why else 'cached'}")
        result["kernels"] = image.kernel_plan(
            client, target, wheels, options, image_plan, ctx.cache_dir
        )
        for module in result["kernels"]:
            lines.append(
                f"  kernel     {module['name'][:48]}: {module['reason']} (entry: {module['entry']})"
            )
        if args.push:
            lines.append(f"  then push to {args.push}")
        emit(args, result, lines)
        return

    save_context = Path(args.save_context).resolve() if args.save_context else None
    result = image.build_image(
        client, target, forks, wheels, options, image_plan, ctx.cache_dir, save_context
    )
    wheels = {**wheels, "kernels": _into_wheelhouse(result.kernel_wheel, _wheelhouse(args, ctx))}
    if args.push:
        result.pushed = registry.push(client, result.reference, args.push)
    publish_error = None
    try:
        published, own_wheel = _publish(args, wheels, ctx.cache_dir)
    except BuilderError as exc:
        # The image and its push happened: record them, then report the failed publish.
        published, own_wheel, publish_error = None, None, exc
    image_record = result.to_json()
    reference = result.pushed["reference"] if result.pushed else result.reference
    record = manifest.build_manifest(
        target,
        forks,
        wheels,
        image=image_record,
        image_options=image.options_record(options),
        published=published,
        launch=launch.all_recipes(target.file, reference),
        builder_wheel=own_wheel,
    )
    written = manifest.write(
        manifest.manifest_dir(ctx.data_dir, args.manifest_dir, target.name),
        record,
        image_plan.inputs_hash[:12],
        sbom=result.sbom,
    )
    if publish_error:
        raise BuilderError(f"{publish_error} (image manifest written: {written})")
    lines = [f"image {result.reference}  id={result.image_id[:19]}"]
    if result.pushed:
        lines.append(f"pushed {result.pushed['reference']}")
    lines += [f"published {r['url']}" for records in (published or {}).values() for r in records]
    lines.append(f"manifest {written}")
    emit(
        args,
        {"target": target.name, "image": image_record, "manifest": str(written)},
        lines,
    )


def _declared_requirements(ctx: pipeline.Context) -> dict[str, list]:
    """{distribution: Requires-Dist} of each patched upstream, read from its sources (or
    its cached wheel): a lock, and above all `lock --check` in CI, builds no wheel."""
    with locked(ctx.cache_dir):
        forks = pipeline.patch(ctx)
        return {
            use.fork.wheel.dist_name: lock.metadata_requirements(
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
    if args.runtime_requirements:
        source = Path(args.runtime_requirements)
        if not source.is_file():
            raise BuilderError(f"--runtime-requirements {source}: no such file")
        listed = lock.parse(source)
        lock.refuse_excluded(listed, target.image.exclude_requirements)
        requirements = [
            lock.requirement_of(source, number, line)
            for number, line in lock.requirement_lines(listed.text)
            if not line.startswith("-")
        ]
        ours: set[str] = set()
    else:
        requires = _declared_requirements(ctx)
        requirements = image.runtime_inputs(target, requires)
        ours = set(requires)
    if args.check:
        if not output.is_file():
            raise BuilderError(f"{output}: no such lock (run `builder lock` without --check)")
        lock.refuse_stale(
            lock.parse(output), target=target.name, python=python, platform=platform,
            requirements=requirements,
        )  # fmt: skip
        emit(args, {"lock": str(output), "stale": False}, [f"{output}: up to date"])
        return
    try:
        before = lock.parse(output).packages if output.is_file() else {}
    except BuilderError as exc:
        progress.warn(f"the current lock does not parse ({exc}): replaced")
        before = {}
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


def _manifest_kernel_wheel(
    directory: Path, wheelhouse: Path, flashinfer: BuiltWheel | None
) -> BuiltWheel | None:
    """The kernel wheel the newest image manifest of this flashinfer build names, from the
    wheelhouse and with the manifest's sha256: the one that image was built and checked
    with, never merely the newest file that matches a pattern."""
    if flashinfer is None:
        return None
    for path, record in manifest.with_images(directory):
        recorded = record.get("wheels") or {}
        if "kernels" not in recorded:
            continue
        if (recorded.get("flashinfer") or {}).get("sha256") != flashinfer.sha256:
            continue
        named = recorded["kernels"]
        wheel = wheelhouse / named["filename"]
        if not wheel.is_file():
            raise BuilderError(
                f"{path.name} names the kernel wheel {named['filename']}, which is not in "
                f"{wheelhouse} (run `builder image` again to make it)"
            )
        if sha256_file(wheel) != named["sha256"]:
            raise BuilderError(
                f"{wheel}: not the kernel wheel {path.name} records (sha256 differs): not "
                "published; run `builder image` again"
            )
        return BuiltWheel(
            name="kernels",
            dist_name=kernel_wheel.DIST_NAME,
            version=named["version"],
            filename=wheel.name,
            sha256=named["sha256"],
            size=wheel.stat().st_size,
            cache_key=named["version"],
            cached=True,
            path=wheel,
        )
    return None


def _into_wheelhouse(wheel: BuiltWheel, wheelhouse: Path) -> BuiltWheel:
    """The kernel wheel beside the others, so `builder publish` ships it too."""
    destination = wheelhouse / wheel.filename
    if not destination.is_file() or sha256_file(destination) != wheel.sha256:
        atomic_copy(wheel.path, destination)
    return dataclasses.replace(wheel, path=destination)


def _check_publish_args(args: argparse.Namespace) -> None:
    """Where to publish, checked before anything is built."""
    if args.publish:
        validate.http_url("--publish-index", args.publish)
        if has_credentials(args.publish):
            raise BuilderError(
                f"--publish-index {redact(args.publish)}: credentials go in TWINE_USERNAME/"
                "TWINE_PASSWORD, keyring or ~/.pypirc (--publish-repository), not in the URL"
            )
    if args.publish_simple:
        validate.http_url("--publish-simple", args.publish_simple)
        if has_credentials(args.publish_simple):
            raise BuilderError(
                f"--publish-simple {redact(args.publish_simple)}: builder reads the index "
                "back without credentials; give its public (read-only) URL"
            )
    if args.publish_static:
        validate.writable_dir("--publish-static", args.publish_static)


def _publish(
    args: argparse.Namespace, wheels: dict, cache_dir: Path
) -> tuple[dict[str, list[dict]], BuiltWheel | None]:
    """Publish where the flags say, builder's own wheel too (the VM installs builder from
    the same index); ({wheel name: [verified records]}, builder's wheel or None)."""
    if not (args.publish or args.publish_repository or args.publish_static):
        return {name: [] for name in wheels}, None
    own = self_wheel.build(cache_dir)
    if own is None:
        progress.warn(
            "builder runs from an installed wheel, not a checkout: its own wheel is not "
            "published (publish from a checkout, or upload that wheel yourself)"
        )
    everything = {**wheels, **({"builder": own} if own else {})}
    published: dict[str, list[dict]] = {name: [] for name in everything}
    ordered = list(everything.values())
    upload_url = args.publish
    if args.publish_repository and not upload_url:
        upload_url = publish.pypirc_url(args.publish_repository)
    if upload_url:
        simple = args.publish_simple or publish.default_simple_url(upload_url)
        for name, record in publish.publish_to_index(
            ordered, upload_url, simple, args.publish_repository
        ).items():
            published[name].append(record)
    if args.publish_static:
        for name, record in publish.publish_static(ordered, Path(args.publish_static)).items():
            published[name].append(record)
    return published, own


def _publish_options(command: argparse.ArgumentParser, *old_names: str) -> None:
    """The same four publishing options, by the same names, on `image` and `publish`;
    `old_names` (earlier spellings: --publish, --index, --static) keep working, unlisted."""
    command.add_argument(
        "--publish-index",
        dest="publish",
        metavar="URL",
        help="upload the wheels to this index's upload URL (pypiserver, devpi, Artifactory); "
        "credentials from TWINE_USERNAME/TWINE_PASSWORD, keyring or ~/.pypirc",
    )
    command.add_argument(
        "--publish-simple",
        dest="publish_simple",
        metavar="URL",
        help="the index's simple (PEP 503/691) URL, to check and verify (default: URL/simple/)",
    )
    command.add_argument(
        "--publish-repository",
        dest="publish_repository",
        metavar="NAME",
        help="a ~/.pypirc section to take the upload URL and credentials from",
    )
    command.add_argument(
        "--publish-static",
        dest="publish_static",
        metavar="DIR",
        help="write/extend a static PEP 503 index (+ PEP 691 JSON) in DIR",
    )
    hidden = {"--index-simple": "publish_simple", "--repository": "publish_repository"}
    hidden.update({name: _OLD_NAMES[name] for name in old_names})
    for name, dest in hidden.items():
        command.add_argument(name, dest=dest, help=argparse.SUPPRESS)


_OLD_NAMES = {"--publish": "publish", "--index": "publish", "--static": "publish_static"}


def cmd_publish(args: argparse.Namespace) -> None:
    if not (args.publish or args.publish_static or args.publish_repository):
        raise BuilderError(
            "builder publish needs --publish-index URL, --publish-repository NAME or "
            "--publish-static DIR"
        )
    _check_publish_args(args)
    ctx = context(args)
    forks, wheels = _forks_and_wheels(args, ctx)
    directory = manifest.manifest_dir(ctx.data_dir, args.manifest_dir, ctx.target.name)
    kernels_wheel = _manifest_kernel_wheel(
        directory, _wheelhouse(args, ctx), wheels.get("flashinfer")
    )
    if kernels_wheel:
        wheels["kernels"] = kernels_wheel
    elif "flashinfer" in wheels:
        progress.warn(
            "no image manifest of this flashinfer build names a kernel wheel yet (`builder "
            "image` makes one): publishing without kernels, so a plain venv compiles them"
        )
    published, own_wheel = _publish(args, wheels, ctx.cache_dir)
    record = manifest.build_manifest(
        ctx.target, forks, wheels, published=published, builder_wheel=own_wheel
    )
    tag = "publish-" + "-".join(f.fork_commit[:7] for f in forks.values())
    written = manifest.write(
        manifest.manifest_dir(ctx.data_dir, args.manifest_dir, ctx.target.name), record, tag
    )
    lines = [
        f"{r['action']:<16} {r['url']}  sha256={r['sha256'][:16]}…"
        for records in published.values()
        for r in records
    ]
    lines.append(f"manifest {written}")
    emit(args, {"published": published, "manifest": str(written)}, lines)


def register(sub) -> None:
    add_command(
        sub,
        "sources",
        cmd_sources,
        "fetch upstreams at their pinned commits",
        "Fetch each upstream of the target into a cached bare mirror (only when the pinned commit "
        "is missing) and check it out, submodules included, into the target's work directory. "
        "The checked-out commit is verified against forks/<upstream>/pin.toml.\n\n"
        "example: builder sources --target sm120 --upstream flashinfer",
    )
    add_command(
        sub,
        "patch",
        cmd_patch,
        "apply the target's patch series (runs sources first)",
        "Apply forks/<upstream>/patches/<series>/*.patch in order with pygit2, one commit each on "
        "the branch builder/<series>. Commits get a fixed committer and a time derived from the "
        "upstream commit, so the fork SHA is the same on every machine. A patch that does not "
        "apply is named with its file and hunk, and the work tree is left at the upstream "
        "commit.\n\n"
        "example: builder patch --target sm120",
    )
    wheels = add_command(
        sub,
        "wheels",
        cmd_wheels,
        "build the patched wheels (runs sources and patch first)",
        "Build each fork's wheel with `build` as <version>+<target>.g<fork sha7>, verify it "
        "(METADATA version, patched lines, required files such as cutlass headers), cache it by "
        "its inputs and copy it to the wheelhouse. Unchanged inputs are a cache hit.\n\n"
        "example: builder wheels --target sm120 --wheelhouse ./wheelhouse",
    )
    _add_wheelhouse(wheels)
    image_cmd = add_command(
        sub,
        "image",
        cmd_image,
        "build the server image with pre-compiled FlashInfer kernels (runs wheels first)",
        "Build the target's image with the Docker SDK: runtime dependencies, the patched "
        "flashinfer wheel with its JIT modules compiled for the target arch (no GPU needed), "
        "then the patched sglang wheel. The tag says what is inside and ends in a hash of all "
        "inputs; an image whose inputs are unchanged is not rebuilt. Labels record upstream and "
        "fork commits, patch series and wheel hashes.\n\n"
        "examples:\n"
        "  builder image --target sm120 --plan\n"
        "  builder image --target sm120 --push registry.example.com/ml/sglang-sm120\n"
        "  builder image --base-image my-cuda:12.8 --pip-index-url https://pypi.internal/simple",
        uses=(PROJECT, FETCH),
    )
    _add_wheelhouse(image_cmd)
    image_cmd.add_argument("--base-image", metavar="REF", help="base image (default: the target's)")
    image_cmd.add_argument(
        "--push", metavar="REGISTRY/REPO", help="push the image there and print its digest"
    )
    image_cmd.add_argument(
        "--allow-dirty",
        action="store_true",
        help="push even with uncommitted changes under images/ or forks/",
    )
    image_cmd.add_argument(
        "--plan", action="store_true", help="print what would be built and why; build nothing"
    )
    image_cmd.add_argument("--pip-index-url", metavar="URL", help="package index for the build")
    image_cmd.add_argument(
        "--pip-extra-index-url",
        metavar="URL",
        help="extra index (default: the target's, if any)",
    )
    image_cmd.add_argument(
        "--runtime-requirements",
        metavar="FILE",
        help="install these runtime requirements instead of the target's lock, as given "
        "(with --hash on every entry: installed with --require-hashes); recorded in the "
        "image's inputs",
    )
    image_cmd.add_argument(
        "--jit-modules",
        metavar="A;B",
        help="';'-separated FlashInfer generators to pre-compile, e.g. "
        "'flashinfer.jit.norm:gen_norm_module' (default: the target's [[jit.modules]])",
    )
    image_cmd.add_argument(
        "--kernel-registry",
        metavar="REGISTRY/REPO",
        help="share compiled kernels with other build hosts through this OCI repository: "
        "entries are pulled by key before compiling and new ones pushed (credentials as for "
        f"--push; env {KERNEL_REGISTRY_ENV}; default: this host's cache only)",
    )
    image_cmd.add_argument(
        "--jit-jobs",
        type=int,
        default=0,
        help="parallel compile jobs (default 0: from cores and memory)",
    )
    _publish_options(image_cmd, "--publish")
    image_cmd.add_argument(
        "--manifest-dir",
        metavar="DIR",
        help="where manifests go (default: manifests/ of the data directory), one per build",
    )
    image_cmd.add_argument(
        "--network-host",
        action="store_true",
        help="build with host networking (to reach an index or proxy on the host's loopback)",
    )
    image_cmd.add_argument(
        "--save-context",
        metavar="DIR",
        help="also write the exact Docker build context of a build to DIR, with its build "
        "arguments and labels in DIR/docker-build.json (to audit it, or `docker build` it by hand)",
    )

    lock_cmd = add_command(
        sub,
        "lock",
        cmd_lock,
        "resolve the image's runtime lock: every package pinned with its sha256",
        "Resolve the runtime requirements (the target's pins and the patched upstreams' own "
        "requirements, read from their sources: no wheel is built) with uv, once, for the "
        "image's Python and platform, from the target's index. Every package gets "
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

    publish_cmd = add_command(
        sub,
        "publish",
        cmd_publish,
        "publish the patched wheels to a private index (runs wheels first)",
        "Upload the wheels to a package index with twine, or write them into a static PEP 503 "
        "index. A file already on the index with the same sha256 is skipped; the same name "
        "with another sha256 is refused. Each wheel is resolved back from the index and its "
        "sha256 compared before it is recorded as published in the manifest.\n\n"
        "examples:\n"
        "  TWINE_USERNAME=ci TWINE_PASSWORD=... builder publish --publish-index https://pypi.internal/\n"
        "  builder publish --publish-static /srv/www/wheels   # then pip install --index-url "
        "https://host/wheels/simple/ sglang==0.5.9",
    )
    _add_wheelhouse(publish_cmd)
    _publish_options(publish_cmd, "--index", "--static")
    publish_cmd.add_argument("--manifest-dir", metavar="DIR", help="where manifests go")
