"""Commands that build: sources, patch, wheels, image (lock and publish: their own modules)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from builder.build.commands.common import add_wheelhouse, context, forks_and_wheels, wheelhouse_dir
from builder.build.commands.publish import (
    add_publish_options,
    check_publish_args,
    into_wheelhouse,
    publish_wheels,
)
from builder.core.cache import locked
from builder.core.errors import BuilderError, Unreachable
from builder.core.lazy import lazy_module
from builder.core.options import FETCH, PROJECT, add_command, emit, json_object
from builder.core.settings import KERNEL_REGISTRY_ENV, resolve_data_dir
from builder.spec.target import GENERATOR_RULE, is_flashinfer_call

docker_client = lazy_module("builder.core.docker_client")
image = lazy_module("builder.build.image")
image_plan = lazy_module("builder.build.image_plan")
launch = lazy_module("builder.spec.launch")
lock = lazy_module("builder.spec.lockfile")
manifest = lazy_module("builder.spec.manifest")
build_records = lazy_module("builder.build.records")
noop = lazy_module("builder.build.noop")
packs = lazy_module("builder.spec.jit.packs")
progress = lazy_module("builder.core.progress")
pipeline = lazy_module("builder.build.pipeline")
provenance = lazy_module("builder.build.provenance")
registry = lazy_module("builder.core.registry")
validate = lazy_module("builder.core.validate")


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
    wheelhouse = wheelhouse_dir(args, ctx)
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


def _image_options(args: argparse.Namespace, ctx: pipeline.Context) -> image_plan.ImageOptions:
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
        # The file is copied into the image as it is, comments included: an index URL with a
        # token anywhere in it is refused exactly like the same URL as --pip-extra-index-url.
        for number, line in enumerate(listed.text.splitlines(), 1):
            for word in line.replace("=", " ").replace("#", " ").split():
                if "://" in word:
                    provenance.refuse_credentials_in_build_args(f"{requirements}:{number}:", word)
    modules = (
        tuple(m.strip() for m in args.jit_modules.split(";") if m.strip())
        if args.jit_modules is not None
        else target.jit_modules
    )
    if not modules:
        raise BuilderError("--jit-modules: empty; name at least one generator")
    if args.jit_modules is not None:  # the target's own are checked when it is read
        for module in modules:
            if not is_flashinfer_call(module):
                raise BuilderError(
                    f"--jit-modules: '{module[:200]}' is not a FlashInfer call "
                    f"({GENERATOR_RULE}): refused"
                )
    options = image_plan.ImageOptions(
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


PLAN_BUILDS = (
    "plan: builds no image and compiles no kernel, but fetches the upstreams and builds the "
    "patched wheels (or takes them from the cache): the tag and every stage key hash the "
    "wheels' bytes"
)


def _plan_without_daemon(args, ctx, options: image_plan.ImageOptions, why: Unreachable) -> None:
    """`image --plan` with no daemon: what is known from this machine, and what is not."""
    _, wheels = forks_and_wheels(args, ctx)
    result = image_plan.local_plan(ctx.target, wheels, options)
    result["daemon"] = str(why)
    lock = result["runtime_lock"]
    provided = ", ".join(lock["base_provides"])
    beside = f", beside the base's {provided}" if provided else ""
    lines = [
        f"image {result['repository']}:<tag> (the tag hashes the base image's id: unknown "
        "without a Docker daemon; so is which stages and kernels are cached)",
        f"  base       {result['base_image']}",
        *(f"  wheel      {filename}" for filename in result["wheels"].values()),
        f"  runtime    {lock['packages']} packages from {lock['file']} (current){beside}",
        *(
            f"  kernel     {k['generator']}"
            + (f" (harvested: {k['harvested_from']})" if k["harvested_from"] else "")
            for k in result["kernels"]
        ),
        f"  no daemon: {why}",
    ]
    emit(args, result, lines)


def cmd_image(args: argparse.Namespace) -> None:
    check_publish_args(args)
    if args.push:
        validate.repository("--push", args.push)
    for human in args.tag:
        if not args.push:
            raise BuilderError(f"--tag {human}: needs --push REGISTRY/REPO (a tag of what?)")
        validate.human_tag("--tag", human)
    if args.save_context:
        image.check_save_context(Path(args.save_context))
    plain = not (
        args.plan or args.push or args.save_context
        or args.publish or args.publish_repository or args.publish_static
    )  # fmt: skip
    # Snapshotted before anything is read, for a later no-op run to be answered from.
    argv = getattr(args, "argv", [])
    inputs = noop.watch(argv, resolve_data_dir(args.data_dir), args.json) if plain else None
    ctx = context(args)
    target = ctx.target
    options = _image_options(args, ctx)
    if inputs:
        recipe_folder = target.image.dockerfile.parent  # its own entry: a file added there
        inputs.also([recipe_folder, target.image.lock, *image_plan.recipe_files(target)])
    if args.push and not args.plan:
        provenance.refuse_dirty_push(ctx.data_dir, args.allow_dirty)
    if args.plan:  # said first: the plan is not free, and the reader should know why
        progress.info(PLAN_BUILDS)
    try:
        client = docker_client.connect()
    except Unreachable as exc:
        if not args.plan:
            raise
        _plan_without_daemon(args, ctx, options, exc)
        return
    forks, wheels = forks_and_wheels(args, ctx)
    planned = image.plan(client, target, forks, wheels, options)

    if args.plan:
        result = {
            "reference": planned.reference,
            "inputs": planned.inputs_hash,
            "stages": {
                stage: {"key": planned.stage_keys[stage], "rebuild": why or None}
                for stage, why in planned.rebuild.items()
            },
            "buildargs": planned.buildargs,
        }
        lines = [f"image {planned.reference}"]
        for stage, why in planned.rebuild.items():
            lines.append(f"  {stage:<10} {'rebuild: ' + why if why else 'cached'}")
        result["kernels"] = image.kernel_plan(
            client, target, wheels, options, planned, ctx.cache_dir
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
    refused: set[str] = set()
    while True:
        try:
            result = image.build_image(
                client, target, forks, wheels, options, planned, ctx.cache_dir, save_context
            )
            break
        except packs.PackRefused as exc:
            # A harvested call the kernel build refused: moved aside, that pack fails no
            # later build, and this one goes on without it (gone already: another run's).
            if exc.pack in refused:
                raise
            refused.add(exc.pack)
            pack = packs.packs_dir(ctx.cache_dir) / exc.pack
            packs.reject(pack, f"{pack}: {exc.why}")
            planned = image.plan(client, target, forks, wheels, options)
    wheels = {**wheels, "kernels": into_wheelhouse(result.kernel_wheel, wheelhouse_dir(args, ctx))}
    if args.push:
        result.pushed = registry.push(client, result.reference, args.push, tuple(args.tag))
    publish_error = None
    try:
        published, own_wheel = publish_wheels(args, wheels, ctx.cache_dir)
    except BuilderError as exc:
        # The image and its push happened: record them, then report the failed publish.
        published, own_wheel, publish_error = None, None, exc
    image_record = result.to_json()
    reference = result.pushed["reference"] if result.pushed else result.reference
    record = build_records.build_manifest(
        target,
        forks,
        wheels,
        image=image_record,
        image_options=image_plan.options_record(options),
        published=published,
        launch=launch.all_recipes(target.file, reference),
        builder_wheel=own_wheel,
    )
    written = manifest.write(
        manifest.manifest_dir(ctx.data_dir, args.manifest_dir, target.name),
        record,
        planned.inputs_hash[:12],
        sbom=result.sbom,
    )
    if publish_error:
        raise BuilderError(f"{publish_error} (image manifest written: {written})")
    lines = [f"image {result.reference}  id={result.image_id[:19]}"]
    if result.pushed:
        layers = result.pushed["layers"]
        lines.append(
            f"pushed {result.pushed['reference']} ({layers['sent']} layers sent, "
            f"{layers['present']} already in the registry)"
        )
    lines += [f"published {r['url']}" for records in (published or {}).values() for r in records]
    lines.append(f"manifest {written}")
    output = {"target": target.name, "image": image_record, "manifest": str(written)}
    emit(args, output, lines)
    if inputs:
        noop.save(
            inputs,
            cache_dir=ctx.cache_dir,
            wheel_files=[wheel.path for wheel in wheels.values()],  # in the wheelhouse
            images={result.reference: result.image_id, options.base_image: result.base_image_id},
            manifest_dir=written.parent,
            manifest_tag=planned.inputs_hash[:12],
            manifest=record,
            sbom=result.sbom,
            output_json=json_object(output),
            lines=lines,
            written=written,
        )


def register(sub) -> None:
    add_command(
        sub,
        "sources",
        cmd_sources,
        "fetch upstreams at their pinned commits",
        "Fetch each upstream of the target into a cached bare mirror (only when the pinned commit "
        "is missing) and check it out, submodules included, into the target's work directory. "
        "The checked-out commit is verified against forks/<upstream>/pin.toml, and a pinned ref "
        "is read from the remote each time (cached commit or not): it must still name that "
        "commit.\n\n"
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
    add_wheelhouse(wheels)
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
    add_wheelhouse(image_cmd)
    image_cmd.add_argument("--base-image", metavar="REF", help="base image (default: the target's)")
    image_cmd.add_argument(
        "--push", metavar="REGISTRY/REPO", help="push the image there and print its digest"
    )
    image_cmd.add_argument(
        "--tag", action="append", default=[], metavar="NAME",
        help="with --push: also push the image as REGISTRY/REPO:NAME (e.g. a release name; "
        "the input tag is always pushed; the manifest records both, one digest)",
    )  # fmt: skip
    image_cmd.add_argument(
        "--allow-dirty",
        action="store_true",
        help="push even with uncommitted changes under images/ or forks/",
    )
    image_cmd.add_argument(
        "--plan", action="store_true",
        help="print what would be built and why; builds no image and compiles no kernel, but "
        "fetches the upstreams and builds the patched wheels (cached), whose bytes the tag hashes",
    )  # fmt: skip
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
    add_publish_options(image_cmd, "--publish")
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
