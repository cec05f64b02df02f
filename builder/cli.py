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
