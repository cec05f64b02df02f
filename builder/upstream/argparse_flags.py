"""The options an argparse parser accepts, as builder's static readers of an upstream's
source report them (``sglang_parser`` for sglang's ``launch_server``): one ``Flag`` per
option string, collected in a ``FlagTable`` that refuses a second registration of a string
as argparse would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from builder.upstream.pysource import ExtractionError


@dataclasses.dataclass(frozen=True)
class Flag:
    """One option string accepted by the server's argument parser."""

    option: str  # the option string this entry is keyed by
    option_strings: tuple[str, ...]  # all option strings of the same argparse action
    dest: str  # argparse dest (the field of the server's arguments it fills)
    kind: str  # store_true | value | list | boolean_optional | action | help
    takes_value: bool  # whether this option string consumes a value
    choices: tuple[Any, ...] | None = None  # literal choices, when known
    nargs: str | None = None
    required: bool = False
    deprecated: bool = False
    negated: bool = False  # the --no-... half of a BooleanOptionalAction
    conditional_choices: tuple[Any, ...] = ()  # extra choices added only under a runtime condition
    origin: str = ""  # "relative/path.py:line" of the declaration
    source: str = ""  # "field" (dataclass field) | "manual" (parser.add_argument) | "argparse"
    unresolved: str = ""  # why choices could not be resolved, if they could not


class FlagTable:
    """Each option string of one parser -> its Flag, in registration order."""

    def __init__(self):
        self.flags: dict[str, Flag] = {}

    def add(self, option_strings: list[str], **kw) -> None:
        """One argparse action's option strings (``Flag``'s other fields as keywords)."""
        for opt in option_strings:
            if opt in self.flags:
                raise ExtractionError(
                    f"option {opt} registered twice ({self.flags[opt].origin} and "
                    f"{kw.get('origin')}); argparse would raise a conflict"
                )
        for opt in option_strings:
            self.flags[opt] = Flag(option=opt, option_strings=tuple(option_strings), **kw)
