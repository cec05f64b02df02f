"""builder's command tree as argparse holds it: the subcommands of a parser, every command
path, and the name a mistyped one is closest to. The CLI, `builder help` and the completion
scripts all walk it; none of them imports another for it."""

from __future__ import annotations

import argparse


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name ({} for a leaf)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_paths(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command path of the parser ("" for builder itself, "patches check"), parents
    before their children."""
    found = {"": parser}
    for name, child in subcommands(parser).items():
        found.update(
            {f"{name} {path}".strip(): below for path, below in command_paths(child).items()}
        )
    return found


def suggestion(wrong: str, known: list[str]) -> str:
    """`; did you mean X?`: the one name that `wrong` begins (`wait` for wait-ready, too
    short for a close match), else the closest name; "" when none is near."""
    import difflib

    starting = [name for name in known if wrong and name.startswith(wrong)]
    if len(starting) == 1:
        return f"; did you mean {starting[0]}?"
    close = difflib.get_close_matches(wrong, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
