"""`builder`: command-line entry point. Turns BuilderError into one line and an exit code."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from builder import __version__, pipeline, progress
from builder.cache import locked
from builder.errors import BuilderError
from builder.settings import (
    CACHE_ENV,
    DATA_ENV,
    MIRRORS_ENV,
    config_file,
    resolve_cache_dir,
    resolve_data_dir,
    resolve_mirrors,
)
from builder.target import load_target

DEFAULT_TARGET = "sm120"

_EPILOG = f"""\
environment:
  {DATA_ENV}   project data (images/, forks/) to use instead of the checkout's;
                     copy them to try another pin or patch set without editing the repo
  {CACHE_ENV}  cache for mirrors, work trees and wheels (default: the user cache dir)
  {MIRRORS_ENV}    space-separated FROM=TO URL rewrites, after --mirror
config file: {config_file()} ([mirrors] table of "FROM" = "TO")
"""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help=f"target under images/ (default: {DEFAULT_TARGET})"
    )
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="NAME",
        help="work on this upstream only (repeatable; default: all of the target's)",
    )
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="rewrite URLs starting with FROM to start with TO, for pins and submodules alike "
        "(repeatable; like git's url.<TO>.insteadOf=<FROM>), e.g. "
        "--mirror https://github.com/=https://git.internal/github/",
    )
    parser.add_argument("--data-dir", help=f"project data directory (env {DATA_ENV})")
    parser.add_argument("--cache-dir", help=f"cache directory (env {CACHE_ENV})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def _context(args: argparse.Namespace) -> pipeline.Context:
    data_dir = resolve_data_dir(args.data_dir)
    return pipeline.Context(
        target=load_target(data_dir, args.target),
        data_dir=data_dir,
        cache_dir=resolve_cache_dir(args.cache_dir),
        mirrors=resolve_mirrors(args.mirror),
        only=tuple(args.upstream),
    )


def _emit(args: argparse.Namespace, result: dict, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print("\n".join(lines))


def cmd_sources(args: argparse.Namespace) -> None:
    ctx = _context(args)
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
    _emit(args, result, lines)


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
    ctx = _context(args)
    with locked(ctx.cache_dir):
        forks = pipeline.patch(ctx)
    result = {"target": ctx.target.name, "upstreams": {n: _fork_json(f) for n, f in forks.items()}}
    lines = [
        f"{name}: {fork.upstream_commit[:12]} + {len(fork.patches)} patches = "
        f"{fork.fork_commit} ({fork.branch})"
        for name, fork in forks.items()
    ]
    _emit(args, result, lines)


def cmd_wheels(args: argparse.Namespace) -> None:
    ctx = _context(args)
    wheelhouse = Path(args.wheelhouse or Path("wheelhouse") / ctx.target.name).resolve()
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
    _emit(args, result, lines)


def cmd_image(args: argparse.Namespace) -> None:
    from builder import docker_client, image, launch, manifest, provenance, registry

    ctx = _context(args)
    if ctx.only:
        raise BuilderError("--upstream: builder image needs every upstream of the target")
    target = ctx.target
    options = image.ImageOptions(
        base_image=args.base_image or target.image.base,
        pip_index_url=args.pip_index_url or target.image.pip_index_url,
        pip_extra_index_url=(
            target.image.pip_extra_index_url
            if args.pip_extra_index_url is None
            else args.pip_extra_index_url
        ),
        runtime_requirements=Path(args.runtime_requirements) if args.runtime_requirements else None,
        jit_modules=tuple(args.jit_modules.split(",")) if args.jit_modules else target.jit_modules,
        jit_jobs=args.jit_jobs,
        network_host=args.network_host,
    )
    if options.runtime_requirements and not options.runtime_requirements.is_file():
        raise BuilderError(f"--runtime-requirements {options.runtime_requirements}: no such file")
    provenance.refuse_credentials_in_build_args("--pip-index-url", options.pip_index_url)
    provenance.refuse_credentials_in_build_args(
        "--pip-extra-index-url", options.pip_extra_index_url
    )
    if args.push and not args.plan:
        provenance.refuse_dirty_push(ctx.data_dir, args.allow_dirty)
    client = docker_client.connect()
    wheelhouse = Path(args.wheelhouse or Path("wheelhouse") / target.name).resolve()
    with locked(ctx.cache_dir):
        built = pipeline.wheels(ctx, wheelhouse)
    forks = {name: fork for name, (fork, _) in built.items()}
    wheels = {name: wheel for name, (_, wheel) in built.items()}
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
        if args.push:
            lines.append(f"  then push to {args.push}")
        _emit(args, result, lines)
        return

    result = image.build_image(client, target, forks, wheels, options, image_plan)
    if args.push:
        result.pushed = registry.push(client, result.reference, args.push)
    publish_error = None
    try:
        published = _publish(args, wheels)
    except BuilderError as exc:
        # The image and its push happened: record them, then report the failed publish.
        published, publish_error = None, exc
    image_record = result.to_json()
    reference = result.pushed["reference"] if result.pushed else result.reference
    record = manifest.build_manifest(
        target,
        forks,
        wheels,
        image={k: v for k, v in image_record.items() if k != "jit_inventory"}
        | {"jit_inventory": result.jit_inventory},
        image_options=image.options_record(options),
        published=published,
        launch=launch.all_recipes(target.file, reference),
    )
    written = manifest.write(
        manifest.manifest_dir(ctx.data_dir, args.manifest_dir, target.name),
        record,
        image_plan.inputs_hash[:12],
    )
    if publish_error:
        raise BuilderError(f"{publish_error} (image manifest written: {written})")
    lines = [f"image {result.reference}  id={result.image_id[:19]}"]
    if result.pushed:
        lines.append(f"pushed {result.pushed['reference']}")
    lines += [f"published {r['url']}" for records in (published or {}).values() for r in records]
    lines.append(f"manifest {written}")
    _emit(
        args,
        {"target": target.name, "image": image_record, "manifest": str(written)},
        lines,
    )


def _recipe(args: argparse.Namespace):
    from builder import launch, manifest

    data_dir = resolve_data_dir(args.data_dir)
    target = load_target(data_dir, args.target)
    directory = manifest.manifest_dir(data_dir, args.manifest_dir, target.name)
    path = Path(args.manifest) if args.manifest else manifest.latest_with_image(directory)
    record = manifest.load(path)
    params = []
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuilderError(f"--set {item}: expected KEY=VALUE")
        params.append((key, value))
    overrides = launch.Overrides(
        model=args.model,
        port=args.port,
        params=tuple(params),
        extra_args=tuple(args.extra_arg),
        hf_cache=args.hf_cache,
        container_name=args.name,
    )
    recipe = launch.resolve(target.file, args.profile, manifest.image_reference(record), overrides)
    if recipe.experimental:
        progress.warn(f"profile {recipe.profile} is EXPERIMENTAL: {recipe.warning}")
    if not (record.get("image") or {}).get("pushed"):
        progress.warn(
            f"{path.name}: the image was not pushed; {recipe.image} exists only on the build host"
        )
    return target, recipe, path


def cmd_launch(args: argparse.Namespace) -> None:
    _, recipe, path = _recipe(args)
    if not args.run:
        _emit(args, {**recipe.to_json(), "manifest": str(path)}, [recipe.shell()])
        return
    from builder import docker_client

    client = docker_client.connect()
    command = recipe.docker_run()
    try:
        client.containers.get(recipe.container_name)
        raise BuilderError(
            f"a container named {recipe.container_name} exists: stop it with "
            f"`docker stop {recipe.container_name} && docker rm {recipe.container_name}` "
            "(graceful), or pass --name"
        )
    except docker_errors().NotFound:
        pass
    subprocess_run(command)
    progress.info(f"started {recipe.container_name}; waiting for it to be ready")
    _wait(args, recipe.url, recipe.container_name, recipe.expect, recipe.ready_deadline_minutes)


def docker_errors():
    from docker import errors

    return errors


def subprocess_run(command: list[str]) -> None:
    import os
    import subprocess

    expanded = [os.path.expandvars(part) for part in command]
    result = subprocess.run(expanded, capture_output=True, text=True)
    if result.returncode:
        raise BuilderError(f"docker run failed: {result.stderr.strip().splitlines()[-1]}")


def cmd_deploy_files(args: argparse.Namespace) -> None:
    from builder import launch

    _, recipe, path = _recipe(args)
    out = Path(args.out).resolve()
    from builder.cache import atomic_write_text

    compose = out / "compose.yaml"
    unit = out / f"sglang-{recipe.profile}.service"
    atomic_write_text(compose, launch.compose_file(recipe))
    atomic_write_text(unit, launch.systemd_unit(recipe, str(out)))
    result = {"compose": str(compose), "systemd_unit": str(unit), "manifest": str(path)}
    lines = [
        f"wrote {compose}",
        f"wrote {unit}",
        f"on the VM: cp {unit.name} /etc/systemd/system/ && systemctl daemon-reload && "
        f"systemctl enable --now {unit.stem}",
        f"then: builder wait-ready {recipe.url} --container {recipe.container_name}",
    ]
    _emit(args, result, lines)


def _wait(args, url: str, container: str | None, expect: dict, deadline_minutes: float) -> None:
    from builder import readiness

    client = None
    if container:
        from builder import docker_client

        client = docker_client.connect()
        try:
            client.containers.get(container)
        except docker_errors().NotFound:
            raise BuilderError(f"--container {container}: no such container") from None
    verdict = readiness.wait_ready(
        url,
        deadline_s=deadline_minutes * 60,
        expect=expect,
        container=container,
        docker_client=client,
        poll_s=args.poll,
    )
    if args.json:
        print(json.dumps(verdict.to_json(), indent=2, sort_keys=True))
    else:
        print(f"{verdict.state}: {verdict.message}")
        if verdict.log_tail:
            print("last log lines:\n" + verdict.log_tail.rstrip())
    if verdict.exit_code:
        raise SystemExit(verdict.exit_code)


def cmd_wait_ready(args: argparse.Namespace) -> None:
    expect: dict = {}
    deadline = args.deadline
    if args.profile:
        from builder import launch

        data_dir = resolve_data_dir(args.data_dir)
        target = load_target(data_dir, args.target)
        recipe = launch.resolve(target.file, args.profile, "-", launch.Overrides())
        expect = dict(recipe.expect)
        deadline = deadline or recipe.ready_deadline_minutes
    for item in args.expect:
        key, sep, value = item.partition("=")
        if not sep:
            raise BuilderError(f"--expect {item}: expected KEY=VALUE")
        expect[key] = value
    _wait(args, args.url, args.container, expect, deadline or 20)


def cmd_doctor(args: argparse.Namespace) -> None:
    from builder import doctor, launch

    data_dir = resolve_data_dir(args.data_dir)
    target = load_target(data_dir, args.target)
    recipe = launch.resolve(target.file, args.profile, args.image or "-", launch.Overrides())
    profiles, _ = launch.load_profiles(target.file)
    profile = profiles[recipe.profile]
    tp = _tp_size(recipe.args)
    compute_cap = target.arch_list[0].rstrip("af")

    gpu_text = doctor.run_command(doctor.GPU_QUERY)
    findings = []
    if gpu_text is None:
        findings.append(
            doctor.Finding(
                "gpus",
                False,
                "nvidia-smi not found or failed",
                "install the NVIDIA driver in the VM (and pass the GPUs through)",
            )
        )
    else:
        gpus = doctor.parse_gpus(gpu_text)
        memory = float(profile.get("min_gpu_memory_gib", 0))
        findings += doctor.check_gpus(gpus, compute_cap, tp, memory)
        findings.append(doctor.check_driver(gpus, target.cuda_version))
        topo = doctor.run_command(["nvidia-smi", "topo", "-m"])
        if topo:
            findings.append(doctor.check_topology(doctor.parse_topology(topo)))
    findings.append(doctor.check_shm(doctor.shm_free_bytes()))
    info = None
    client = None
    try:
        from builder import docker_client

        client = docker_client.connect()
        info = client.info()
    except BuilderError:
        pass
    findings.append(doctor.check_runtime(info))
    if args.image and client is not None:
        present = True
        try:
            client.images.get(args.image)
        except docker_errors().ImageNotFound:
            present = False
        findings.append(doctor.check_image(args.image, present))

    failed = [f for f in findings if not f.ok]
    if args.json:
        print(json.dumps([f.to_json() for f in findings], indent=2))
    else:
        for finding in findings:
            mark = "ok  " if finding.ok else "FAIL"
            print(f"{mark} {finding.check}: {finding.detail}")
            if finding.fix and (not finding.ok or args.verbose):
                print(f"     fix: {finding.fix}")
    if failed:
        raise SystemExit(1)


def _tp_size(args: tuple[str, ...]) -> int:
    for flag in ("--tp", "--tp-size", "--tensor-parallel-size"):
        if flag in args:
            return int(args[args.index(flag) + 1])
    return 1


def _publish(args: argparse.Namespace, wheels: dict) -> dict[str, list[dict]]:
    """Publish where the flags say; {wheel name: [verified records]}."""
    from builder import publish

    published: dict[str, list[dict]] = {name: [] for name in wheels}
    ordered = sorted(wheels.values(), key=lambda w: w.name != "flashinfer")  # deps first
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
    return published


def _publish_options(command: argparse.ArgumentParser, flag: str, static_flag: str) -> None:
    command.add_argument(
        flag,
        dest="publish",
        metavar="URL",
        help="upload the wheels to this index's upload URL (pypiserver, devpi, Artifactory); "
        "credentials from TWINE_USERNAME/TWINE_PASSWORD, keyring or ~/.pypirc",
    )
    command.add_argument(
        "--index-simple",
        dest="publish_simple",
        metavar="URL",
        help="the index's simple (PEP 503/691) URL, to check and verify (default: URL/simple/)",
    )
    command.add_argument(
        "--repository",
        dest="publish_repository",
        metavar="NAME",
        help="a ~/.pypirc section to take the upload URL and credentials from",
    )
    command.add_argument(
        static_flag,
        dest="publish_static",
        metavar="DIR",
        help="write/extend a static PEP 503 index (+ PEP 691 JSON) in DIR",
    )


def cmd_publish(args: argparse.Namespace) -> None:
    from builder import manifest

    if not (args.publish or args.publish_static or args.publish_repository):
        raise BuilderError("builder publish needs --index URL, --repository NAME or --static DIR")
    ctx = _context(args)
    wheelhouse = Path(args.wheelhouse or Path("wheelhouse") / ctx.target.name).resolve()
    with locked(ctx.cache_dir):
        built = pipeline.wheels(ctx, wheelhouse)
    forks = {name: fork for name, (fork, _) in built.items()}
    wheels = {name: wheel for name, (_, wheel) in built.items()}
    published = _publish(args, wheels)
    record = manifest.build_manifest(ctx.target, forks, wheels, published=published)
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
    _emit(args, {"published": published, "manifest": str(written)}, lines)


def cmd_patches_list(args: argparse.Namespace) -> None:
    from builder.patches import parse_patch_file

    data_dir = resolve_data_dir(args.data_dir)
    ctx = pipeline.Context(
        load_target(data_dir, args.target), data_dir, Path(), None, tuple(args.upstream)
    )
    result, lines = {}, []
    for name, use in ctx.selected().items():
        entries = []
        for path in use.fork.patch_files(use.series):
            patch = parse_patch_file(path)
            entries.append(
                {
                    "file": path.name,
                    "subject": patch.message.splitlines()[0],
                    "files": [f.path for f in patch.files],
                    "sha256": patch.sha256,
                }
            )
            lines.append(f"{name:<11} {path.name}")
            lines.append(f"{'':<11}   {', '.join(f.path for f in patch.files)}")
        result[name] = {
            "series": use.series,
            "pin": {"url": use.fork.url, "ref": use.fork.ref, "commit": use.fork.commit},
            "patches": entries,
        }
    _emit(args, result, lines)


def cmd_patches_check(args: argparse.Namespace) -> None:
    from builder import series

    ctx = _context(args)
    results = {}
    with locked(ctx.cache_dir):
        for name, use in ctx.selected().items():
            results[name] = series.check(
                ctx.cache_dir, ctx.target.name, use.fork, use.series, ctx.mirrors, args.onto
            )
    lines = []
    for name, result in results.items():
        lines.append(
            f"{name}: {result.base_commit[:12]} -> {args.onto} ({result.onto_commit[:12]})"
        )
        for patch in result.patches:
            lines.append(f"  {patch.status:<9} {patch.patch.path.name}")
            lines += [f"            {d}" for d in patch.details]
            for file, hunks in patch.conflicts.items():
                lines.append(f"            {file}: {'; '.join(hunks)}")
    _emit(args, {name: r.to_json() for name, r in results.items()}, lines)
    if not all(r.unattended for r in results.values()):
        raise SystemExit(2)


def cmd_patches_refresh(args: argparse.Namespace) -> None:
    from builder import series

    ctx = _context(args)
    if len(ctx.selected()) != 1:
        raise BuilderError("builder patches refresh works on one upstream: pass --upstream NAME")
    ((name, use),) = ctx.selected().items()
    with locked(ctx.cache_dir):
        result, written = series.refresh(
            ctx.cache_dir, ctx.target.name, use.fork, use.series, ctx.mirrors, args.onto
        )
    if written is None:
        conflict = next(p for p in result.patches if p.status == "conflict")
        path = series.refresh_dir(ctx.cache_dir, ctx.target.name, name)
        print(series.conflict_help(path, conflict, ctx.target.name, name), file=sys.stderr)
        if args.json:
            print(json.dumps({"refreshed": False, "check": result.to_json(), "workdir": str(path)}))
        raise SystemExit(2)
    dropped = [p.patch.path.name for p in result.patches if p.status == "upstream"]
    lines = [f"{name}: series moved onto {args.onto} ({result.onto_commit[:12]})"]
    lines += [f"  dropped (upstream): {d}" for d in dropped]
    lines += [f"  wrote {n}" for n in written["patches"]]
    lines.append(f"  pin: {written['pin']}")
    _emit(args, {"refreshed": True, "check": result.to_json(), **written}, lines)


def cmd_patches_export(args: argparse.Namespace) -> None:
    from builder import series

    ctx = _context(args)
    if len(ctx.selected()) != 1:
        raise BuilderError("builder patches export works on one upstream: pass --upstream NAME")
    ((name, use),) = ctx.selected().items()
    with locked(ctx.cache_dir):
        written = series.export(ctx.cache_dir, ctx.target.name, use.fork, use.series, ctx.mirrors)
    lines = [f"{name}: wrote {n}" for n in written["patches"]] + [f"  pin: {written['pin']}"]
    _emit(args, written, lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="builder",
        description="Turn pinned upstream sources plus a patch series into patched wheels and a "
        "ready-to-run CUDA image. Stages: sources -> patch -> wheels; each runs the ones before.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"builder {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable, help_text: str, description: str):
        command = sub.add_parser(
            name,
            help=help_text,
            description=description,
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _common(command)
        command.set_defaults(func=func)
        return command

    add(
        "sources",
        cmd_sources,
        "fetch upstreams at their pinned commits",
        "Fetch each upstream of the target into a cached bare mirror (only when the pinned commit "
        "is missing) and check it out, submodules included, into the target's work directory. "
        "The checked-out commit is verified against forks/<upstream>/pin.toml.\n\n"
        "example: builder sources --target sm120 --upstream flashinfer",
    )
    add(
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
    wheels = add(
        "wheels",
        cmd_wheels,
        "build the patched wheels (runs sources and patch first)",
        "Build each fork's wheel with `build` as <version>+<target>.g<fork sha7>, verify it "
        "(METADATA version, patched lines, required files such as cutlass headers), cache it by "
        "its inputs and copy it to the wheelhouse. Unchanged inputs are a cache hit.\n\n"
        "example: builder wheels --target sm120 --wheelhouse ./wheelhouse",
    )
    wheels.add_argument(
        "--wheelhouse", help="where the wheels are copied (default: ./wheelhouse/<target>)"
    )
    image_cmd = add(
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
    )
    image_cmd.add_argument(
        "--wheelhouse", help="where the wheels are copied (default: ./wheelhouse/<target>)"
    )
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
        help="extra index (default: the target's torch index)",
    )
    image_cmd.add_argument(
        "--runtime-requirements",
        metavar="FILE",
        help="install exactly these runtime requirements instead of the derived list "
        "(recorded in the image's inputs)",
    )
    image_cmd.add_argument(
        "--jit-modules",
        metavar="A,B",
        help="comma-separated FlashInfer generators to pre-compile (default: the target's list)",
    )
    image_cmd.add_argument(
        "--jit-jobs",
        type=int,
        default=0,
        help="parallel compile jobs (default 0: from cores and memory)",
    )
    _publish_options(image_cmd, "--publish", "--publish-static")
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

    patches_cmd = sub.add_parser(
        "patches",
        help="manage the patch series against a moving upstream (list, check, refresh, export)",
        description="A patch series is a branch of commits on the pinned upstream. `check` "
        "classifies each patch against a newer REF (clean, merged, conflict, upstream); "
        "`refresh` rebases the series onto REF and rewrites forks/ only if every patch made "
        "it; `export` writes the series back after a manual conflict fix.",
    )
    patches_sub = patches_cmd.add_subparsers(
        dest="patches_command", required=True, metavar="ACTION"
    )

    def add_patches(name: str, func: Callable, help_text: str, description: str, onto: bool):
        command = patches_sub.add_parser(
            name,
            help=help_text,
            description=description,
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _common(command)
        if onto:
            command.add_argument(
                "--onto", required=True, metavar="REF", help="upstream tag, branch or commit"
            )
        command.set_defaults(func=func)

    add_patches(
        "list",
        cmd_patches_list,
        "list the series of each upstream",
        "List each upstream's pin and patch files with the files they touch.",
        False,
    )
    add_patches(
        "check",
        cmd_patches_check,
        "classify every patch against a newer upstream REF",
        "Classify each patch against REF without changing anything: clean (applies as is), "
        "merged (3-way merge; moved hunks shown), conflict (files and hunks), upstream (REF "
        "already has it). Exit code 0: the series can move to REF unattended; 2: it cannot.\n\n"
        "example: builder patches check --upstream flashinfer --onto v0.6.16",
        True,
    )
    add_patches(
        "refresh",
        cmd_patches_refresh,
        "rebase the series onto REF and re-pin",
        "Rebase the series onto REF (3-way), drop patches REF already contains, then write the "
        "new patch files and pin. On a conflict, stop with the conflict marked in a work "
        "directory, say what to edit, and leave forks/ untouched (exit code 2).\n\n"
        "example: builder patches refresh --upstream flashinfer --onto v0.6.16",
        True,
    )
    add_patches(
        "export",
        cmd_patches_export,
        "write the patch files from the fork branch",
        "After a refresh stopped at a conflict and you edited the files: commit your fix as that "
        "patch, apply the rest and write forks/. Without a pending refresh: regenerate the "
        "patch files from the build work directory's fork branch.",
        False,
    )

    publish_cmd = add(
        "publish",
        cmd_publish,
        "publish the patched wheels to a private index (runs wheels first)",
        "Upload the wheels to a package index with twine, or write them into a static PEP 503 "
        "index. A file already on the index with the same sha256 is skipped; the same name "
        "with another sha256 is refused. Each wheel is resolved back from the index and its "
        "sha256 compared before it is recorded as published in the manifest.\n\n"
        "examples:\n"
        "  TWINE_USERNAME=ci TWINE_PASSWORD=... builder publish --index https://pypi.internal/\n"
        "  builder publish --static /srv/www/wheels   # then pip install --index-url "
        "https://host/wheels/simple/ sglang==0.5.9",
    )
    publish_cmd.add_argument(
        "--wheelhouse", help="where the wheels are copied (default: ./wheelhouse/<target>)"
    )
    _publish_options(publish_cmd, "--index", "--static")
    publish_cmd.add_argument("--manifest-dir", metavar="DIR", help="where manifests go")

    def launch_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--profile", help="launch profile (default: the target's default)")
        command.add_argument("--manifest", help="manifest to take the image from (default: latest)")
        command.add_argument("--manifest-dir", metavar="DIR", help="where manifests are")
        command.add_argument("--model", help="HF model id, or a local weights directory to mount")
        command.add_argument("--port", type=int, help="server port (default: the profile's)")
        command.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a profile param, e.g. --set kv_cache_dtype=bf16",
        )
        command.add_argument(
            "--extra-arg",
            action="append",
            default=[],
            metavar="ARG",
            help="append an argument to the sglang command line (repeatable)",
        )
        command.add_argument(
            "--hf-cache",
            default="$HOME/.cache/huggingface",
            help="host directory for the Hugging Face cache (default: $HOME/.cache/huggingface)",
        )
        command.add_argument("--name", help="container name (default: the profile's)")

    launch_cmd = add(
        "launch",
        cmd_launch,
        "print (or --run) the exact docker run for a launch profile",
        "Print the docker run that starts the server on a GPU VM: image by digest from the "
        "manifest, --gpus all, --ipc=host, shm size, model cache volume, port, environment and "
        "the sglang command line of the profile. With --run, start it and wait until it is "
        "ready (see wait-ready).\n\n"
        "examples:\n"
        "  builder launch --target sm120\n"
        "  builder launch --model /data/GLM-5-NVFP4 --set kv_cache_dtype=bf16\n"
        "  builder launch --profile glm5-nvfp4-tp8-fusion   # experimental, prints a warning",
    )
    launch_options(launch_cmd)
    launch_cmd.add_argument("--run", action="store_true", help="start it here and wait-ready")
    launch_cmd.add_argument("--poll", type=float, default=5.0, help=argparse.SUPPRESS)

    deploy = add(
        "deploy-files",
        cmd_deploy_files,
        "write a compose file and a systemd unit for the GPU VM",
        "Write compose.yaml (GPU reservation, host IPC, healthcheck with a start period that "
        "allows slow starts, no restart loop) and a systemd unit that runs it, for a launch "
        "profile and the image of a manifest.\n\n"
        "example: builder deploy-files --target sm120 --out deploy/",
    )
    launch_options(deploy)
    deploy.add_argument("--out", default="deploy", help="output directory (default: ./deploy)")

    wait = sub.add_parser(
        "wait-ready",
        help="wait until a server is ready; tell 'still loading' from 'crashed'",
        description="Wait in stages: port open, /health 200 (503 = still starting), "
        "/health_generate 200 (a real generation), /server_info shows the expected backends. "
        "With --container, a crash is the container exiting or restarting (exit code and log "
        "tail shown). Exit codes: 0 ready, 2 crashed, 3 deadline passed (still loading), "
        "4 up but with other backends than expected.\n\n"
        "example: builder wait-ready http://127.0.0.1:30000 --container sglang-glm5 "
        "--profile glm5-nvfp4-tp8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    wait.add_argument("url", help="server base URL, e.g. http://127.0.0.1:30000")
    wait.add_argument("--container", help="container name or id to watch for crashes")
    wait.add_argument("--deadline", type=float, help="minutes to wait (default: profile's, or 20)")
    wait.add_argument("--profile", help="take the expected backends and deadline from a profile")
    wait.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="/server_info must report this (repeatable)",
    )
    wait.add_argument("--target", default=DEFAULT_TARGET)
    wait.add_argument("--data-dir")
    wait.add_argument("--poll", type=float, default=2.0, help="seconds between checks")
    wait.add_argument("--json", action="store_true")
    wait.add_argument("--debug", action="store_true")
    wait.set_defaults(func=cmd_wait_ready)

    doctor_cmd = sub.add_parser(
        "doctor",
        help="check a GPU VM: driver, GPUs, memory, runtime, shm, topology, image",
        description="Check that this machine can run the target's image with a launch profile: "
        "NVIDIA driver new enough for the target's CUDA, GPU count and compute capability, "
        "memory per GPU, NVIDIA container runtime, /dev/shm, GPU topology (P2P over PCIe or "
        "NVLink) and, with --image, that the image is present. Each failing check says how "
        "to fix it; exit code 1 if any fails.",
    )
    doctor_cmd.add_argument("--target", default=DEFAULT_TARGET)
    doctor_cmd.add_argument("--profile")
    doctor_cmd.add_argument("--image", help="image reference that should be present")
    doctor_cmd.add_argument("--data-dir")
    doctor_cmd.add_argument("--verbose", action="store_true", help="show hints for passing checks")
    doctor_cmd.add_argument("--json", action="store_true")
    doctor_cmd.add_argument("--debug", action="store_true")
    doctor_cmd.set_defaults(func=cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except BuilderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the cache is consistent; run the command again", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
