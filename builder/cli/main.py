"""`builder`: command-line entry point. Turns BuilderError into one line and an exit code."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback

from builder.cli.tree import subcommands, suggestion
from builder.core.errors import EXIT_CODES, EXIT_CODES_HELP, BuilderError, Unreachable
from builder.core.urls import scrub

_json_asked = False  # set by main() before parsing: a usage error cannot read args


class _Parser(argparse.ArgumentParser):
    """A usage error is bad input: exit code 1 as in the table (argparse's own is 2, which
    here means an internal error). Every command's page wraps its prose and keeps its
    examples as written (subcommands are made with the parser's own class)."""

    def __init__(self, *args, **kwargs) -> None:
        from builder.core.options import HelpFormatter

        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        from builder.core.options import print_json

        message += _did_you_mean(self, message)
        self.print_usage(sys.stderr)
        if _json_asked:  # the --json contract holds for a usage error too
            print_json(
                {"error": f"{self.prog}: {message}", "exit_code": EXIT_CODES["error"]}, ok=False
            )
        self.exit(EXIT_CODES["error"], f"error: {self.prog}: {message}\n")


COMPLETION_HELP = """\
completion: builder completion bash|zsh|fish prints the shell's script
  (source <(builder completion bash); builder help completion: where to save it)
"""


class _Version(argparse.Action):
    """`builder 0.1.0 (commit 1a2b3c4d5e6f, dirty)`: the identity manifests record, read
    only when asked (it looks at the checkout)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from builder.core.identity import builder_identity

        identity = builder_identity()
        version = identity["version"]
        if identity["commit"]:
            where = f"commit {identity['commit'][:12]}" + (", dirty" if identity["dirty"] else "")
        else:
            import importlib.metadata
            import importlib.util

            from builder.core.identity import PACKAGE

            in_checkout = (PACKAGE.parent / ".git").exists()
            if in_checkout and importlib.util.find_spec("pygit2") is None:
                where = "commit unknown: pygit2, of the build extra, is not installed"
            else:  # a wheel (builder's own, `0.1.0+src…`): its local version names the sources
                with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                    version = importlib.metadata.version("builder")
                where = "installed, no git checkout: the version names its sources"
        print(f"builder {version} ({where})")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    # The commands (and the Docker SDK, pygit2, rich... with them) are imported here, after a
    # no-op `builder image` has had its chance to be answered without them (builder/build/noop.py).
    from builder.build.commands import build, keygen, lock, publish
    from builder.cli import shell
    from builder.core.options import EPILOG, HelpFormatter, add_global_flags
    from builder.site.commands import check, deploy_files, jit, launch, qualify, wait_ready
    from builder.upstream.commands import patches, upstream

    parser = _Parser(
        prog="builder",
        description="Turn pinned upstream sources plus a patch series into patched wheels and a "
        "ready-to-run CUDA image. Stages: sources -> patch -> wheels -> image (-> push, "
        "publish, manifest); each runs the ones before. Then launch it on a GPU VM.",
        epilog=EPILOG + "\n" + COMPLETION_HELP + "\n" + EXIT_CODES_HELP,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0,
        help="builder's version and the git commit it runs from, then exit",
    )  # fmt: skip
    add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build.register(sub)
    lock.register(sub)
    publish.register(sub)
    patches.register(sub)
    upstream.register(sub)
    keygen.register(jit.register(sub))
    launch.register(sub)
    deploy_files.register(sub)
    wait_ready.register(sub)
    check.register(sub)
    qualify.register(sub)
    shell.register(sub, parser)
    _global_flags_after_the_command(parser)
    return parser


def _global_flags_after_the_command(parser: argparse.ArgumentParser) -> None:
    """-q and -v on every command, --json on each that groups others (`builder patches
    --json list`); a leaf's --json is its own (add_output_options), where it has a result."""
    from builder.core.options import JSON_HELP, add_global_flags

    for child in subcommands(parser).values():
        add_global_flags(child)
        if subcommands(child) and "--json" not in child._option_string_actions:
            child.add_argument(
                "--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP
            )
        _global_flags_after_the_command(child)


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """`; did you mean X?` for an unknown command or option, from the command's own
    choices and options (argparse suggests only from Python 3.14)."""
    import re

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        wrong, known = choice[1], re.findall(r"'([^']*)'", choice[2])
    else:
        unknown = re.search(r"unrecognized arguments: (.*)", message)
        words = [w.split("=", 1)[0] for w in (unknown[1].split() if unknown else [])]
        wrong = next((w for w in words if w.startswith("--")), "")
        if not wrong:
            return ""
        known = [o for a in _command_parser(parser)._actions for o in a.option_strings]
    return suggestion(wrong, known)


def _command_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The deepest subcommand the command line named (unknown options are reported by the
    top parser, but belong to it)."""
    for word in _argv:
        parser = subcommands(parser).get(word, parser)
    return parser


_argv: list[str] = []


# The build host's commands, and the modules of the `build` extra they import: a GPU VM's
# install (launch, deploy-files, doctor, wait-ready, verify, qualify, jit harvest) has none.
BUILD_COMMANDS = ("sources", "patch", "wheels", "image", "lock", "publish", "patches", "upstream")
BUILD_MODULES = ("pygit2", "build", "uv", "cyclonedx", "cryptography", "tomlkit", "twine")


def _build_side_missing(args: argparse.Namespace) -> list[str]:
    import importlib.util

    keygen = args.command == "jit" and getattr(args, "jit_command", None) == "keygen"
    if args.command not in BUILD_COMMANDS and not keygen:
        return []
    needed = ("cryptography",) if keygen else BUILD_MODULES
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _stdout_to_devnull() -> None:
    """No second BrokenPipeError when the interpreter flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    global _json_asked
    arguments = sys.argv[1:] if argv is None else list(argv)
    if "image" in arguments:  # only `image` is replayed: its reader's imports are not free
        from builder.build import noop

        replayed = noop.replay(arguments)
        if replayed is not None:
            return replayed
    from builder.core import progress
    from builder.core.options import print_json

    _json_asked = "--json" in arguments
    _argv[:] = arguments
    parser = build_parser()
    if not arguments:  # the overview, as `builder --help` gives it
        parser.print_help()
        return 0
    args = parser.parse_args(arguments)
    args.argv = arguments
    refused = getattr(args, "json_refused", None)
    if args.json and refused:  # a help page or a script: text, never JSON
        message = f"builder {args.command} --json: it {refused}; run it without --json"
        print(f"error: {message}", file=sys.stderr)
        print_json({"error": message, "exit_code": EXIT_CODES["error"]}, ok=False)
        return EXIT_CODES["error"]
    missing = _build_side_missing(args)
    if missing:
        message = (
            f"builder {args.command} runs on a build host: this install lacks {', '.join(missing)}"
            " (a GPU VM's `pip install builder` leaves them out); pip install 'builder[build]'"
        )
        print(f"error: {message}", file=sys.stderr)
        if getattr(args, "json", False):
            print_json({"error": message, "exit_code": EXIT_CODES["error"]}, ok=False)
        return EXIT_CODES["error"]
    progress.set_quiet(args.quiet)
    args.debug = getattr(args, "debug", False) or args.verbose
    try:
        args.func(args)
    except BrokenPipeError:  # `builder … | head`: the reader has what it wanted
        _stdout_to_devnull()
        return EXIT_CODES["pipe_closed"]
    except BuilderError as exc:
        code = EXIT_CODES["unreachable" if isinstance(exc, Unreachable) else "error"]
        message = scrub(str(exc))
        print(f"error: {message}", file=sys.stderr)
        if getattr(args, "json", False):
            print_json({"error": message, "exit_code": code}, ok=False)
        return code
    except KeyboardInterrupt:
        message = "interrupted: the cache is consistent; run the command again"
        print(message, file=sys.stderr)
        if getattr(args, "json", False):
            print_json({"error": message, "exit_code": EXIT_CODES["interrupted"]}, ok=False)
        return EXIT_CODES["interrupted"]
    except Exception as exc:
        message = scrub(f"internal error: {type(exc).__name__}: {exc}")
        if args.debug:  # the traceback quotes values as they were: not scrubbed, hence opt-in
            traceback.print_exc()
            print(message, file=sys.stderr)
        else:
            print(f"{message} (rerun with --debug)", file=sys.stderr)
        if getattr(args, "json", False):
            print_json({"error": message, "exit_code": EXIT_CODES["internal"]}, ok=False)
        return EXIT_CODES["internal"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
