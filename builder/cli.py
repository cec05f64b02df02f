"""`builder`: command-line entry point. Turns BuilderError into one line and an exit code."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from builder import __version__, pipeline
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
    from builder import docker_client, image, registry

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
    lines = [f"image {result.reference}  id={result.image_id[:19]}"]
    if result.pushed:
        lines.append(f"pushed {result.pushed['reference']}")
    _emit(args, {"target": target.name, "image": result.to_json()}, lines)


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
    image_cmd.add_argument(
        "--network-host",
        action="store_true",
        help="build with host networking (to reach an index or proxy on the host's loopback)",
    )
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
