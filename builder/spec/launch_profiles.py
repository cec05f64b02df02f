"""A target's launch profiles as data: its profiles.toml (or the profiles an image's
recipe carries), each flattened through `extends`, its shape checked, its `fallback` and
`derived` params, and which `--set` items are a profile's own. builder/spec/launch.py
resolves one into the recipe a server is started with.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import BuilderError
from builder.core.tomlfile import load_toml
from builder.spec import engines
from builder.spec.target import engine_of


@dataclass(frozen=True)
class Profiles:
    """A target's launch profiles: from its profiles.toml, or the recipe inside an image."""

    profiles: dict[str, dict]
    default: str
    where: str  # named in errors
    engine: str = engines.DEFAULT  # the engine whose server the profiles start

    @classmethod
    def of(cls, target_file: Path) -> Profiles:
        profiles, default = load_profiles(target_file)
        return cls(profiles, default, str(profiles_file(target_file)), engine_of(target_file))


def profiles_file(target_file: Path) -> Path:
    return target_file.parent / "profiles.toml"


def load_profiles(target_file: Path) -> tuple[dict[str, dict], str]:
    path = profiles_file(target_file)
    data = load_toml(path)
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise BuilderError(f"{path}: field 'profiles' must hold at least one profile")
    default = data.get("default", next(iter(profiles)))
    if not isinstance(default, str) or default not in profiles:
        raise BuilderError(f"{path}: field 'default' names unknown profile '{default}'")
    for name in profiles:
        profile = flatten(profiles, name, path)
        fallback(profile, name, path)
        derivations(profile, name, path)
    return profiles, default


def flatten(profiles: dict[str, dict], name: str, path: Path | str, seen: tuple = ()) -> dict:
    if name not in profiles:
        known = ", ".join(profiles)
        raise BuilderError(f"{path}: unknown profile '{name}' (profiles: {known})")
    if name in seen:
        raise BuilderError(f"{path}: profile '{name}' extends itself")
    profile = dict(_checked_shape(profiles[name], name, path))
    parent_name = profile.pop("extends", None)
    if not parent_name:
        return profile
    parent = flatten(profiles, parent_name, path, (*seen, name))
    merged = {**parent, **profile}
    for table in ("params", "env", "expect", "fallback", "derived"):
        merged[table] = {**parent.get(table, {}), **profile.get(table, {})}
    merged["args"] = [*parent.get("args", []), *profile.get("extra_args", [])]
    merged.pop("extra_args", None)
    # A profile adds refusals and sglang-chosen keys to its parent's, never drops one.
    for listed in ("refuse", "chosen_by_sglang"):
        if listed in parent and listed in profile:
            merged[listed] = [*parent[listed], *profile[listed]]
    return merged


_SCALAR = (str, int, float, bool)
# Each field a profile may hold, and what it must be: a profile is read from profiles.toml or
# from an image's recipe (whoever pushed the image wrote that one).
_FIELDS: dict[str, str] = {
    "args": "strings", "extra_args": "strings", "chosen_by_sglang": "strings",
    "params": "table", "env": "table", "expect": "table", "fallback": "table",
    "derived": "table",
    "volumes": "volumes", "refuse": "refusals",
    "description": "string", "warning": "string", "container_name": "string",
    "shm_size": "string", "extends": "string",
    "experimental": "bool", "needs_peer_access": "bool",
    "ready_deadline_minutes": "number", "min_gpu_memory_gib": "number",
}  # fmt: skip


_SHAPE_NAMES = {
    "strings": "a list of strings",
    "table": "a table of plain values",
    "volumes": "a list of {host, container} tables",
    "refusals": "a list of {flag, values, why} tables",
}


def _shape_ok(kind: str, value: object) -> bool:
    if kind == "strings":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == "table":
        return isinstance(value, dict) and all(isinstance(v, _SCALAR) for v in value.values())
    if kind == "volumes":
        return isinstance(value, list) and all(
            isinstance(v, dict) and isinstance(v.get("host"), str)
            and isinstance(v.get("container"), str) for v in value
        )  # fmt: skip
    if kind == "refusals":
        keys = ("flag", "values", "why")
        return isinstance(value, list) and all(
            isinstance(v, dict) and all(isinstance(v.get(k), str) for k in keys) for v in value
        )
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def _checked_shape(profile: object, name: str, path: Path | str) -> dict:
    """A profile whose every known field has the type builder uses it as; one line naming
    the first that does not (an unknown field is left alone, as a newer builder's)."""
    if not isinstance(profile, dict):
        raise BuilderError(f"{path}: profile '{name}' must be a table")
    for key, kind in _FIELDS.items():
        if key in profile and not _shape_ok(kind, profile[key]):
            shown = _SHAPE_NAMES.get(kind, f"a {kind}")
            raise BuilderError(f"{path}: profile '{name}' field '{key}' must be {shown}")
    if "args" not in profile and not profile.get("extends"):
        raise BuilderError(f"{path}: profile '{name}' has no 'args' (and extends no profile)")
    return profile


def profile_number(profile: dict, key: str, default: float, where: str) -> float:
    """A profile's numeric field: a finite number, 0 or more (TOML has `nan` and `inf`)."""
    value = profile.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BuilderError(f"{where} field '{key}' must be a number, not {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise BuilderError(f"{where} field '{key}' is {value}: must be a finite number, 0 or more")
    return value


def flattened(known: Profiles, name: str) -> dict:
    """One profile with what it inherits (`extends`), as written (params not filled in)."""
    return flatten(known.profiles, name, known.where)


FALLBACK_WHY = "why"


def fallback(profile: dict, name: str, path: Path | str) -> tuple[tuple[str, str], ...]:
    """A profile's `[profiles.NAME.fallback]`: params to `--set` for one more try when a
    start stalls where the `why` says (qualify --sweep uses it). Each key must be a param
    of the profile, with a value other than its default."""
    table = profile.get("fallback", {})
    where = f"{path}: profile '{name}' fallback"
    if not isinstance(table, dict):
        raise BuilderError(f"{where} must be a table of params and a '{FALLBACK_WHY}'")
    params = profile.get("params", {})
    pairs = []
    for key, value in table.items():
        if key == FALLBACK_WHY:
            continue
        if key not in params:
            raise BuilderError(
                f"{where}: '{key}' is not a param of the profile (params: "
                f"{', '.join(sorted(params))})"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise BuilderError(f"{where}: '{key}' must be a string or a number")
        if str(value) == str(params[key]):
            raise BuilderError(f"{where}: '{key}' = {value!r} is already the param's default")
        pairs.append((key, str(value)))
    why = table.get(FALLBACK_WHY, "")
    if pairs and not (isinstance(why, str) and why.strip()):
        raise BuilderError(f"{where}: '{FALLBACK_WHY}' must say when the fallback applies")
    if not pairs and why:
        raise BuilderError(f"{where}: a '{FALLBACK_WHY}' without any param to set")
    return tuple(pairs)


def fallback_params(known: Profiles, name: str) -> tuple[tuple[str, str], ...]:
    """The params (key, value) a profile declares to `--set` once when a start stalls at
    CUDA-graph capture; () when it declares none."""
    return fallback(flattened(known, name), name, known.where)


def fallback_why(known: Profiles, name: str) -> str:
    """Why the profile's fallback exists (its table's `why`); '' when it declares none."""
    profile = flattened(known, name)
    fallback(profile, name, known.where)
    return str(profile.get("fallback", {}).get(FALLBACK_WHY, ""))


# `[profiles.NAME.derived]`: a param builder fills in from another one the operator set,
# where the engine accepts one value only (sglang: draft tokens = steps + 1 with topk 1):
# `KEY = "SOURCE + N"` (or `- N`, or `SOURCE`), matched by this pattern, never evaluated.
_DERIVATION = re.compile(r"\s*([a-z_][a-z0-9_]*)\s*(?:([+-])\s*(\d{1,9}))?\s*")


@dataclass(frozen=True)
class Derivation:
    key: str
    source: str
    offset: int
    rule: str  # as profiles.toml writes it


def derivations(profile: dict, name: str, path: Path | str) -> tuple[Derivation, ...]:
    """A profile's `derived` table, each rule checked: `SOURCE`, `SOURCE + N` or
    `SOURCE - N`, both params of the profile."""
    where = f"{path}: profile '{name}' derived"
    params = profile.get("params", {})
    found = []
    for key, rule in profile.get("derived", {}).items():
        match = _DERIVATION.fullmatch(rule) if isinstance(rule, str) else None
        if not match:
            raise BuilderError(
                f'{where}: \'{key}\' must be "PARAM + N" or "PARAM - N" (N a whole number)'
            )
        source, sign, number = match.groups()
        for param in (key, source):
            if param not in params:
                raise BuilderError(
                    f"{where}: '{param}' is not a param of the profile (params: "
                    f"{', '.join(sorted(params))})"
                )
        if source == key:
            raise BuilderError(f"{where}: '{key}' is derived from itself")
        offset = int(number or 0) * (-1 if sign == "-" else 1)
        found.append(Derivation(key, source, offset, rule.strip()))
    return tuple(found)


def derive(
    rules: tuple[Derivation, ...], params: dict[str, str], set_here: set[str], name: str
) -> tuple[str, ...]:
    """Each derived param the operator left alone, filled in from its source they set (in
    `params`); a line per param saying so. Both set: theirs, checked as given."""
    said = []
    for rule in rules:
        if rule.source not in set_here or rule.key in set_here:
            continue
        value = params[rule.source]
        if not value.isdigit():
            raise BuilderError(
                f"--set {rule.source}={value}: not a whole number, and profile '{name}' derives "
                f"{rule.key} from it ({rule.rule})"
            )
        params[rule.key] = str(int(value) + rule.offset)
        said.append(
            f"{rule.key}={params[rule.key]}: derived from {rule.source}={value} (profile "
            f"'{name}': {rule.key} = {rule.rule})"
        )
    return tuple(said)


def split_profile_key(key: str) -> tuple[str | None, str]:
    """`--set PROFILE:KEY=VALUE` sets a param of that profile alone (one of a sweep's):
    (PROFILE, KEY); a plain KEY applies to every profile: (None, KEY)."""
    profile, colon, bare = key.partition(":")
    return (profile, bare) if colon else (None, key)


def params_for(
    pairs: tuple[tuple[str, str], ...] | list[tuple[str, str]], profile: str
) -> tuple[tuple[str, str], ...]:
    """The `--set` (key, value) pairs that apply to `profile`: every plain one, then those
    given as PROFILE:KEY for this profile, which win; one for another profile is refused."""
    plain, own = [], []
    for key, value in pairs:
        named, bare = split_profile_key(key)
        if named is None:
            plain.append((key, value))
        elif named == profile:
            own.append((bare, value))
        else:
            raise BuilderError(
                f"--set {key}={value}: for profile {named}, but this is profile {profile}"
            )
    return (*plain, *own)
