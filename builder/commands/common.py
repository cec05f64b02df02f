"""What every command shares: common options, the pipeline context, result output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from builder import pipeline, validate
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

EPILOG = f"""\
environment:
  {DATA_ENV}   project data (images/, forks/) to use instead of the checkout's;
                     copy them to try another pin or patch set without editing the repo
  {CACHE_ENV}  cache for mirrors, work trees and wheels (default: the user cache dir)
  {MIRRORS_ENV}    space-separated FROM=TO URL rewrites, after --mirror
config file: {config_file()} ([mirrors] table of "FROM" = "TO")
"""


def add_common(parser: argparse.ArgumentParser) -> None:
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


def context(args: argparse.Namespace) -> pipeline.Context:
    data_dir = resolve_data_dir(args.data_dir)
    return pipeline.Context(
        target=load_target(data_dir, args.target),
        data_dir=data_dir,
        cache_dir=validate.writable_dir(
            "--cache-dir (or BUILDER_CACHE_DIR)", str(resolve_cache_dir(args.cache_dir))
        ),
        mirrors=resolve_mirrors(args.mirror),
        only=tuple(args.upstream),
    )


def emit(args: argparse.Namespace, result: dict, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print("\n".join(lines))


def add_command(sub, name: str, func: Callable, help_text: str, description: str):
    """A subcommand with the common options and a help page that teaches its use."""
    command = sub.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(command)
    command.set_defaults(func=func)
    return command
