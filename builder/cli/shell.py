"""Commands about builder's own command line: `help` (a command's page) and `completion`
(a shell's completion script). Both read the whole parser, so they take it as `root`."""

from __future__ import annotations

import argparse
import functools

from builder.cli.completion import SHELLS  # the standard library only: no cost at start-up
from builder.cli.tree import subcommands, suggestion
from builder.core.errors import BuilderError
from builder.core.options import HelpFormatter

# What main() answers `--json` with on these two (their output is text by nature).
HELP_IS_TEXT = "prints a help page, which is text"
SCRIPT_IS_TEXT = "prints a shell script, which is text"


def cmd_help(root: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The page of `builder NAMES... --help`; an unknown name is refused in one line, with
    the name it is closest to."""
    parser, named = root, ["builder"]
    for name in args.names:
        children = subcommands(parser)
        if not children:
            raise BuilderError(f"builder help: `{' '.join(named)}` has no actions ({name!r} given)")
        if name not in children:
            where = "no command" if parser is root else f"`{' '.join(named)}` has no action"
            raise BuilderError(f"builder help: {where} {name!r}" + suggestion(name, list(children)))
        parser, named = children[name], [*named, name]
    parser.print_help()


def cmd_completion(root: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from builder import __version__
    from builder.cli import completion

    print(completion.script(args.shell, root, __version__), end="")


def _refuse_json(parser: argparse.ArgumentParser, why: str) -> None:
    """--json after the command is taken (and refused by main(), as before it), not a usage
    error: the same one line whichever side it stands on."""
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.set_defaults(json_refused=why)


def register(sub, root: argparse.ArgumentParser) -> None:
    helper = sub.add_parser(
        "help",
        help="show a command's help page (as COMMAND --help)",
        description="Print the help page of builder, of a command, or of a command's action "
        "(`builder help patches check` is `builder patches check --help`). An unknown name "
        "is refused in one line that names the closest one (exit code 1).\n\n"
        "examples:\n"
        "  builder help\n"
        "  builder help wait-ready\n"
        "  builder help patches check",
        formatter_class=HelpFormatter,
    )
    helper.add_argument(
        "names", nargs="*", metavar="COMMAND",
        help="a command, and its action where it has some (patches check)",
    )  # fmt: skip
    _refuse_json(helper, HELP_IS_TEXT)
    helper.set_defaults(func=functools.partial(cmd_help, root))

    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="Print a script that completes builder's commands, actions, options and "
        "the values an option names, generated from builder's own parser: generate it again "
        "after an upgrade. Option values that are files complete as file names.\n\n"
        "examples:\n"
        "  source <(builder completion bash)    # this bash only\n"
        "  builder completion bash > ~/.local/share/bash-completion/completions/builder\n"
        "  builder completion zsh > ~/.zfunc/_builder   # a folder in $fpath, before compinit\n"
        "  builder completion fish > ~/.config/fish/completions/builder.fish",
        formatter_class=HelpFormatter,
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell")
    _refuse_json(completion, SCRIPT_IS_TEXT)
    completion.set_defaults(func=functools.partial(cmd_completion, root))
