"""Every flag a launch profile renders, held against an sglang release's own argument parser
(read from its source by `builder.upstream.sglang_parser`): a flag the release no longer has, a
value
outside an option's choices and a readiness key that is no ServerArgs field are problems; a
flag whose definition changed between two releases (choices, deprecation, what it takes)
is named for the reviewer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.spec import launch, launch_profiles
from builder.upstream.argparse_flags import Flag

_IMAGE = "image@sha256:" + "0" * 64  # a recipe needs an image; the flags do not depend on it


@dataclass(frozen=True)
class ProfileCheck:
    target: str
    profile: str
    flags: tuple[str, ...]  # the option strings it renders
    problems: tuple[str, ...]  # each stops a move
    changed: tuple[str, ...]  # flags it renders whose definition changed

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "profile": self.profile,
            "flags": len(self.flags),
            "problems": list(self.problems),
            "changed": list(self.changed),
        }


def _values(args: tuple[str, ...], flags: dict[str, Flag]):
    """(option, its value or None) for each option word of a rendered command."""
    for position, word in enumerate(args):
        if not word.startswith("--"):
            continue
        option, equals, inline = word.partition("=")
        flag = flags.get(option)
        if equals:
            yield option, inline
        elif flag is not None and flag.takes_value and position + 1 < len(args):
            yield option, args[position + 1]
        else:
            yield option, None


def _difference(option: str, old: Flag, new: Flag) -> str:
    notes = []
    if old.takes_value != new.takes_value or old.kind != new.kind:
        notes.append(f"was {old.kind}, now {new.kind}")
    if old.choices is not None and new.choices is not None and old.choices != new.choices:
        added = [str(c) for c in new.choices if c not in old.choices]
        removed = [str(c) for c in old.choices if c not in new.choices]
        if added:
            notes.append(f"choices + {', '.join(added)}")
        if removed:
            notes.append(f"choices - {', '.join(removed)}")
    elif (old.choices is None) != (new.choices is None):
        notes.append("now with choices" if new.choices is not None else "choices dropped")
    if new.deprecated and not old.deprecated:
        notes.append("now deprecated")
    return f"{option}: {'; '.join(notes)}" if notes else ""


def check_profile(
    target: str,
    target_file: Path,
    profile: str,
    new: dict[str, Flag],
    new_fields: set[str],
    old: dict[str, Flag] | None = None,
    version: str = "the new release",
) -> ProfileCheck:
    """One profile's rendered flags against the `new` parser (and what changed since `old`)."""
    recipe = launch.resolve(target_file, profile, _IMAGE, launch.Overrides())
    problems, changed, seen = [], [], []
    for option, value in _values(recipe.args, {**(old or {}), **new}):
        seen.append(option)
        flag = new.get(option)
        if flag is None:
            had = old is not None and option in old
            why = "was in the pinned release" if had else "not in the pinned release either"
            problems.append(f"{option} is not an option of sglang {version} ({why})")
            continue
        choices = [str(c) for c in flag.choices] if flag.choices is not None else None
        if flag.takes_value and value is not None and choices is not None and value not in choices:
            problems.append(f"{option} {value}: not among sglang {version}'s choices")
        if flag.deprecated:
            changed.append(f"{option}: deprecated in sglang {version}")
        elif old is not None and option in old:
            note = _difference(option, old[option], flag)
            if note:
                changed.append(note)
    for key in sorted(set(recipe.expect) - new_fields):
        problems.append(
            f"expects /server_info key {key}, which is no ServerArgs field in {version}"
        )
    return ProfileCheck(target, profile, tuple(seen), tuple(problems), tuple(changed))


def check_target(
    target: str,
    target_file: Path,
    new: dict[str, Flag],
    new_fields: set[str],
    old: dict[str, Flag] | None = None,
    version: str = "the new release",
) -> list[ProfileCheck]:
    profiles, _ = launch_profiles.load_profiles(target_file)
    return [
        check_profile(target, target_file, name, new, new_fields, old, version) for name in profiles
    ]
