"""What every command shares: common options, the pipeline context, result output."""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections.abc import Callable

from builder.core.settings import (
    CACHE_ENV,
    DATA_ENV,
    DEFAULT_TARGET,
    ENVIRONMENT,
    TARGET_ENV,
    config_file,
)
from builder.core.validate import UNITS as UNITS  # every time flag's rule, for the --help texts


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions wrapped to the terminal, paragraph by paragraph; a paragraph whose lines
    are indented (commands, tables) or start with `example`/`exit codes` is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            as_written = any(line.startswith(" ") for line in lines[1:]) or (
                lines and lines[0].lower().startswith(("example", "exit codes", "environment"))
            )
            if as_written or not lines:
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(" ".join(lines), width, initial_indent=indent,
                                  subsequent_indent=indent, break_on_hyphens=False)
                )  # fmt: skip
        return "\n\n".join(paragraphs)


def _environment_lines() -> str:
    lines = []
    for name, meaning in ENVIRONMENT:
        wrapped = textwrap.wrap(meaning, 80 - 31) or [""]
        lines.append(f"  {name:<28} {wrapped[0]}")
        lines += [f"  {'':<28} {more}" for more in wrapped[1:]]
    return "\n".join(lines)


EPILOG = f"""\
environment:
{_environment_lines()}
config file: {config_file()}
  ([mirrors] table of "FROM" = "TO")
"""


DEADLINE_MINUTES = 20  # how long a server may take to be ready, where no profile says


# Options by concern: each command takes exactly the ones it uses.
PROJECT = "project"  # --target, --data-dir
SELECTION = "selection"  # --upstream
FETCH = "fetch"  # --mirror, --cache-dir
BUILD_COMMAND = (PROJECT, SELECTION, FETCH)


def add_project_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=os.environ.get(TARGET_ENV) or DEFAULT_TARGET,
        help=f"target under images/ (default: env {TARGET_ENV}, or {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--data-dir", help=f"project data directory (default: env {DATA_ENV}, or the checkout)"
    )


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="NAME",
        help="work on this upstream only (repeatable; default: all of the target's)",
    )


def add_fetch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="rewrite URLs starting with FROM to start with TO, for pins and submodules alike "
        "(repeatable; like git's url.<TO>.insteadOf=<FROM>), e.g. "
        "--mirror https://github.com/=https://git.internal/github/",
    )
    add_cache_option(parser)


def add_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir", help=f"cache directory (default: env {CACHE_ENV}, or the user cache dir)"
    )


# -q, -v and --json go before or after the command (`builder -v doctor`, `builder doctor
# -v`). The top parser declares them with their defaults; each command declares them again
# with default=SUPPRESS, since argparse copies every value a subcommand's parser sets over
# the top parser's: a default there would undo `builder -v doctor`.
QUIET_HELP = "no progress lines: only results, warnings and errors"
VERBOSE_HELP = "tracebacks on errors, as --debug"
JSON_HELP = "print the result as JSON on stdout"


def add_global_flags(
    parser: argparse.ArgumentParser, top: bool = False, verbose_help: str = VERBOSE_HELP
) -> None:
    """-q and -v (and, on the top parser, --json), each unless the parser has it already."""
    default = False if top else argparse.SUPPRESS
    taken = parser._option_string_actions
    if "-q" not in taken:
        parser.add_argument("-q", "--quiet", action="store_true", default=default, help=QUIET_HELP)
    if "-v" not in taken:
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=default, help=verbose_help
        )
    if top:
        parser.add_argument("--json", action="store_true", default=default, help=JSON_HELP)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


JSON_VERSION = 1  # keys may be added within a version; a removal or new meaning bumps it


def json_object(result: dict, ok: bool = True) -> dict:
    """A command's JSON result, with `ok` and `json_version` always in it."""
    return {"ok": ok, **result, "json_version": JSON_VERSION}


def print_json(result: dict, ok: bool = True) -> None:
    """One JSON object on stdout."""
    print(json.dumps(json_object(result, ok), indent=2, sort_keys=True))


def emit(args: argparse.Namespace, result: dict, lines: list[str], ok: bool = True) -> None:
    """The result: one JSON object with --json (`ok` false when the command then exits
    non-zero), else lines of text."""
    if args.json:
        print_json(result, ok)
    else:
        print("\n".join(lines))


def add_command(
    sub,
    name: str,
    func: Callable,
    help_text: str,
    description: str,
    uses: tuple[str, ...] = BUILD_COMMAND,
):
    """A subcommand with the option groups it `uses` (and --json, --debug), and a help page
    that teaches its use."""
    command = sub.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    if PROJECT in uses:
        add_project_options(command)
    if SELECTION in uses:
        add_selection_options(command)
    if FETCH in uses:
        add_fetch_options(command)
    add_output_options(command)
    command.set_defaults(func=func)
    return command


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
