"""The options of `vllm serve`, read from vLLM's source without importing it (stdlib ast,
through builder/upstream/pysource.py): what a sm120-vllm launch profile is held against.

Written against vLLM 0.34.0, where the parser is built like this (paths relative to the
`vllm` package; docs/research/vllm-0.34-b12x.md §1 has the line numbers):

* `entrypoints/common/cli_args.py` `make_arg_parser` adds the positional model and a few
  options by hand, then `FrontendArgs.add_cli_args` and `AsyncEngineArgs.add_cli_args`.
* `FrontendArgs` (and its base `BaseFrontendArgs`) registers every dataclass field as
  `--<name with - for _>`.
* `EngineArgs.add_cli_args` (`engine/arg_utils.py`) names each option by hand:
  `group.add_argument("--flag", [aliases], **x_kwargs["field"])` with
  `x_kwargs = get_kwargs(SomeConfig)`: the option takes the field's type.
* A field's type decides the option (`_compute_kwargs`): `bool` -> `--x` and `--no-x`
  (an `--enable-x`/`--disable-x` pair also takes the other's name); `Literal[...]` without
  `str` -> argparse choices; `Literal[...] | str` and an `Enum` -> any string, checked when
  the server starts (the Enum by member name, upper-cased); a config dataclass -> one JSON
  object whose keys are that class's fields; `list` -> one or more values.

`serve_flags(package)` repeats that on the AST; `check_args(flags, args)` holds a rendered
`vllm serve` command line to it and says every problem in one line each.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from builder.upstream.pysource import (
    ClassRef,
    Evaluator,
    ExtractionError,
    PackageFiles,
    SourceTree,
    Unresolvable,
    subscript_args,
)

TOP = "vllm"
_ARG_UTILS = "vllm.engine.arg_utils"
_CLI_ARGS = "vllm.entrypoints.common.cli_args"
# The registries of --tool-call-parser and --reasoning-parser names (dict keys).
_PARSER_REGISTRIES = {
    "--tool-call-parser": ("vllm.tool_parsers", "_TOOL_PARSERS_TO_REGISTER"),
    "--reasoning-parser": ("vllm.reasoning", "_REASONING_PARSERS_TO_REGISTER"),
}
# Options whose `type` add_cli_args replaces: lower-cased, `-` made `_` (arg_utils.py:1872-1884).
_LOWERED = {"--moe-backend", "--linear-backend", "--sparse-indexer-topk-backend"}


@dataclasses.dataclass(frozen=True)
class Option:
    """One option string of `vllm serve`."""

    option: str
    dest: str  # the field it fills ("" for a hand-made option)
    takes_value: bool
    choices: tuple[str, ...] | None = None  # the values that work (None: any)
    checked_at: str = ""  # argparse | start-up: who refuses a value outside `choices`
    upper: bool = False  # an Enum member name, looked up upper-cased
    json_fields: tuple[str, ...] | None = None  # a config object's keys
    json_choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    origin: str = ""


class _Reader:
    def __init__(self, package: PackageFiles | Any):
        self.tree = SourceTree(package, TOP)
        self.ev = Evaluator(self.tree)
        self.options: dict[str, Option] = {}

    # -- a field's type ------------------------------------------------------------------
    def field(self, cls: ClassRef, name: str) -> tuple[ast.AST, str] | None:
        """(annotation, module) of field `name` of `cls` or the first base that has it."""
        for stmt in cls.node.body:
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == name
            ):
                return stmt.annotation, cls.module
        for base in cls.node.bases:
            try:
                found = self.ev.eval(base, cls.module)
            except Unresolvable:
                continue
            if isinstance(found, ClassRef):
                inherited = self.field(found, name)
                if inherited:
                    return inherited
        return None

    def arms(self, node: ast.AST, module: str, depth: int = 0) -> list[tuple[str, Any]]:
        """The kinds a type allows, each ("literal", values) | ("enum", names) |
        ("config", ClassRef) | ("bool"|"str"|"list"|"other"|"none", None); aliases followed."""
        if depth > 12:
            raise ExtractionError(f"{module}: a type alias nested more than 12 deep")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.arms(node.left, module, depth + 1) + self.arms(
                node.right, module, depth + 1
            )
        if isinstance(node, ast.Constant) and node.value is None:
            return [("none", None)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted type
            return self.arms(ast.parse(node.value, mode="eval").body, module, depth + 1)
        if isinstance(node, ast.Subscript):
            name = self.ev.qualname(node.value, module)
            if name in ("typing.Literal", "typing_extensions.Literal"):
                return [("literal", self._literal_members(node, module, depth))]
            if name in ("typing.Optional", "typing.Union"):
                return [
                    arm for a in subscript_args(node) for arm in self.arms(a, module, depth + 1)
                ]
            if name in ("typing.Annotated", "typing_extensions.Annotated"):
                return self.arms(subscript_args(node)[0], module, depth + 1)
            if self.ev.is_list_type(node, module) or name in ("builtins.tuple", "builtins.set"):
                return [("list", None)]
            return [("other", None)]
        name = self.ev.qualname(node, module)
        if name in ("bool", "builtins.bool"):
            return [("bool", None)]
        if name in ("str", "builtins.str"):
            return [("str", None)]
        if name in ("list", "builtins.list", "builtins.tuple", "builtins.set"):
            return [("list", None)]
        if isinstance(node, ast.Name | ast.Attribute):
            try:
                found = self.ev.eval(node, module)
            except Unresolvable:  # a type alias's value is no constant: read it as a type
                found = None
            if isinstance(found, ClassRef):
                if self.ev.is_enum(found):
                    return [("enum", _enum_names(found))]
                return [("config", found)]
            alias = self._alias(node, module)
            if alias is not None:
                return self.arms(alias[0], alias[1], depth + 1)
        return [("other", None)]

    def _literal_members(self, node: ast.Subscript, module: str, depth: int) -> tuple:
        """A Literal's values; a member that names another Literal (an alias) gives its."""
        values: list = []
        for arg in subscript_args(node):
            if isinstance(arg, ast.Constant):
                values.append(arg.value)
                continue
            for kind, found in self.arms(arg, module, depth + 1):
                if kind != "literal":
                    raise ExtractionError(
                        f"{self.tree.rel(module, node.lineno)}: a Literal member that is no "
                        f"value ({ast.unparse(arg)[:60]})"
                    )
                values.extend(found)
        return tuple(values)

    def _alias(self, node: ast.AST, module: str) -> tuple[ast.AST, str] | None:
        """The expression a type alias (`MoEBackend = Literal[...]`) is bound to."""
        if not isinstance(node, ast.Name):
            return None
        try:
            binding = self.tree.definition(module, node.id)
        except Unresolvable:
            return None
        if getattr(binding, "kind", "") == "value":
            return binding.node, binding.module
        return None

    # -- options -----------------------------------------------------------------------
    def add(self, names: Sequence[str], dest: str, arms: list, origin: str) -> None:
        kinds = {kind for kind, _ in arms}
        primary = names[0]
        if kinds <= {"bool", "none"} and "bool" in kinds:
            self._boolean(names, dest, origin)
            return
        option = Option(primary, dest, True, origin=origin)
        literals = tuple(v for kind, values in arms if kind == "literal" for v in values)
        enums = tuple(v for kind, values in arms if kind == "enum" for v in values)
        configs = [found for kind, found in arms if kind == "config"]
        if literals and not enums:
            option = dataclasses.replace(
                option,
                choices=tuple(str(v) for v in literals),
                checked_at="start-up" if "str" in kinds else "argparse",
            )
        elif enums:
            option = dataclasses.replace(
                option, choices=enums + tuple(map(str, literals)), checked_at="start-up", upper=True
            )
        elif configs:
            option = dataclasses.replace(option, **self._config_keys(configs[0]))
        for name in names:
            self.options.setdefault(name, dataclasses.replace(option, option=name))

    def _boolean(self, names: Sequence[str], dest: str, origin: str) -> None:
        """BooleanOptionalAction (--x, --no-x); an enable/disable pair also answers to the
        other word (utils/argparse_utils.py:120-145)."""
        for name in names:
            if not name.startswith("--"):
                self.options.setdefault(name, Option(name, dest, False, origin=origin))
                continue
            stem = name[2:]
            spellings = [name, f"--no-{stem}"]
            for yes, no in (("enable-", "disable-"), ("disable-", "enable-")):
                if stem.startswith(yes):
                    spellings.append(f"--{no}{stem.removeprefix(yes)}")
            for spelling in spellings:
                self.options.setdefault(spelling, Option(spelling, dest, False, origin=origin))

    def _config_keys(self, cls: ClassRef) -> dict:
        """A JSON object option's keys (the config class's fields and their bases') and the
        values its Literal / Enum fields take."""
        fields: list[str] = []
        choices: dict[str, tuple[str, ...]] = {}
        seen: set[str] = set()
        pending = [cls]
        while pending:
            current = pending.pop(0)
            if current.qualname in seen:
                continue
            seen.add(current.qualname)
            for stmt in current.node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    name = stmt.target.id
                    if name.startswith("_") or name in fields:
                        continue
                    fields.append(name)
                    try:
                        arms = self.arms(stmt.annotation, current.module)
                    except (Unresolvable, ExtractionError):
                        continue
                    values = [v for kind, vs in arms if kind in ("literal", "enum") for v in vs]
                    if values and "str" not in {kind for kind, _ in arms}:
                        choices[name] = tuple(map(str, values))
            for base in current.node.bases:
                try:
                    found = self.ev.eval(base, current.module)
                except Unresolvable:
                    continue
                if isinstance(found, ClassRef):
                    pending.append(found)
        return {"json_fields": tuple(fields), "json_choices": choices}


def _enum_names(ref: ClassRef) -> tuple[str, ...]:
    """An Enum's member names, read without evaluating their values (CUDAGraphMode's
    refer to other members)."""
    names = []
    for stmt in ref.node.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        for target in targets:
            if isinstance(target, ast.Name) and not target.id.startswith("_"):
                names.append(target.id)
    return tuple(names)


def _kwargs_class(reader: _Reader, call: ast.AST, module: str) -> ClassRef | None:
    """`get_kwargs(SomeConfig)` -> SomeConfig."""
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "get_kwargs"
        and call.args
    ):
        try:
            found = reader.ev.eval(call.args[0], module)
        except Unresolvable:
            return None
        return found if isinstance(found, ClassRef) else None
    return None


def _field_of(value: ast.AST, sources: dict, fields: dict) -> tuple[ClassRef, str] | None:
    """(config class, field) that `**value` spreads: `x_kwargs["f"]`, a name bound to one,
    or `{**x_kwargs["f"], ...}`."""
    if isinstance(value, ast.Dict):
        spread = next((v for k, v in zip(value.keys, value.values, strict=True) if k is None), None)
        return _field_of(spread, sources, fields) if spread is not None else None
    if isinstance(value, ast.Name):
        return fields.get(value.id)
    if (
        isinstance(value, ast.Subscript)
        and isinstance(value.value, ast.Name)
        and value.value.id in sources
        and isinstance(value.slice, ast.Constant)
    ):
        return sources[value.value.id], value.slice.value
    return None


def _walk_add_cli_args(reader: _Reader, module: str, function: ast.FunctionDef) -> None:
    sources: dict[str, ClassRef] = {}  # x_kwargs -> the config class get_kwargs read
    fields: dict[str, tuple[ClassRef, str]] = {}  # y_kwargs = x_kwargs["f"]
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if not isinstance(target, ast.Name):
                continue
            cls = _kwargs_class(reader, node.value, module)
            if cls is not None:
                sources[target.id] = cls
            elif (found := _field_of(node.value, sources, fields)) is not None:
                fields[target.id] = found
    for node in ast.walk(function):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if not names or not all(isinstance(n, str) for n in names):
            continue
        origin = reader.tree.rel(module, node.lineno)
        if not names[0].startswith("-"):
            continue  # the positional model_tag
        spread = next((k.value for k in node.keywords if k.arg is None), None)
        found = _field_of(spread, sources, fields) if spread is not None else None
        if found is None:
            _manual(reader, names, node, origin)
            continue
        cls, field = found
        typed = reader.field(cls, field)
        if typed is None:
            raise ExtractionError(f"{origin}: {cls.node.name} has no field {field!r}")
        arms = reader.arms(*typed)
        if names[0] == "--all2all-backend":  # arg_utils.py:1173-1176 takes it out
            arms = [(k, tuple(v for v in vs if v != "passthrough")) if k == "literal" else (k, vs)
                    for k, vs in arms]  # fmt: skip
        # --speculative-config's `type` is reset to json.loads (arg_utils.py:1895-1910): its
        # keys are still SpeculativeConfig's fields, as the arms already say.
        reader.add(names, field, arms, origin)


def _manual(reader: _Reader, names: list[str], call: ast.Call, origin: str) -> None:
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    action = keywords.get("action")
    flag = action is not None and isinstance(action, ast.Constant) and action.value in (
        "store_true", "store_false"
    )  # fmt: skip
    for name in names:
        reader.options.setdefault(name, Option(name, "", not flag, origin=origin))


def serve_flags(package: PackageFiles | Any) -> dict[str, Option]:
    """Every option string `vllm serve` accepts, with what it takes."""
    reader = _Reader(package)
    try:
        make = reader.ev.find_function(_CLI_ARGS, "make_arg_parser")
        _walk_add_cli_args(reader, _CLI_ARGS, make.node)
        for name in ("BaseFrontendArgs", "FrontendArgs"):
            cls = reader.ev.find_class(_CLI_ARGS, name)
            for stmt in cls.node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    field = stmt.target.id
                    arms = reader.arms(stmt.annotation, cls.module)
                    origin = reader.tree.rel(cls.module, stmt.lineno)
                    reader.add([f"--{field.replace('_', '-')}"], field, arms, origin)
        for name in ("EngineArgs", "AsyncEngineArgs"):
            cls = reader.ev.find_class(_ARG_UTILS, name)
            method = reader.ev.find_method(cls, "add_cli_args")
            _walk_add_cli_args(reader, cls.module, method.node)
    except Unresolvable as exc:
        raise ExtractionError(f"vllm serve's parser: {exc}") from None
    for option in _LOWERED:
        if option not in reader.options:
            raise ExtractionError(f"vllm serve's parser: no {option} (the reader is out of date)")
    return reader.options


def registered_parsers(package: PackageFiles | Any) -> dict[str, tuple[str, ...]]:
    """The tool-call and reasoning parser names vLLM registers (its registries' keys)."""
    reader = _Reader(package)
    found = {}
    for flag, (module, name) in _PARSER_REGISTRIES.items():
        try:
            registry = reader.ev.lookup(module, name)
        except Unresolvable as exc:
            raise ExtractionError(f"{flag}'s registry {module}.{name}: {exc}") from None
        if not isinstance(registry, dict):
            raise ExtractionError(f"{flag}'s registry {module}.{name} is not a dict")
        found[flag] = tuple(str(key) for key in registry)
    return found


def _accepted(option: Option, value: str) -> bool:
    if option.choices is None:
        return True
    if option.option in _LOWERED:
        value = value.lower().replace("-", "_")
    if option.upper:
        return value.upper() in option.choices or value in option.choices
    return value in option.choices


def check_args(
    options: dict[str, Option], args: Sequence[str], parsers: dict[str, tuple[str, ...]]
) -> list[str]:
    """Each problem of a `vllm serve ARGS` command line against `options`, one line each:
    an option vLLM does not have, a value outside its choices, a JSON object that is not
    one, with a key the config has not, or a value its Literal / Enum does not take."""
    problems = []
    at = 1 if args and not args[0].startswith("-") else 0  # the positional model
    while at < len(args):
        word = args[at]
        flag, inline, given = word.partition("=")
        option = options.get(flag)
        if not word.startswith("-"):
            problems.append(f"{word!r}: a stray value where an option should be")
            at += 1
            continue
        if option is None:
            problems.append(f"{flag}: not an option of vllm serve")
            # its value, if it has one, is no second problem
            at += 2 if not inline and at + 1 < len(args) and not args[at + 1].startswith("-") else 1
            continue
        if not option.takes_value:
            at += 1
            continue
        value = given if inline else (args[at + 1] if at + 1 < len(args) else None)
        at += 1 if inline else 2
        if value is None:
            problems.append(f"{flag}: takes a value, none given")
            continue
        if not _accepted(option, value):
            who = "argparse refuses" if option.checked_at == "argparse" else "refused at start-up"
            problems.append(f"{flag} {value}: {who} (takes {', '.join(option.choices or ())})")
        if flag in parsers and value not in parsers[flag]:
            problems.append(
                f"{flag} {value}: no such parser registered ({', '.join(parsers[flag])})"
            )
        if option.json_fields is not None:
            problems += _json_problems(flag, option, value)
    return problems


def _json_problems(flag: str, option: Option, value: str) -> list[str]:
    try:
        settings = json.loads(value)
    except ValueError as exc:
        return [f"{flag}: not JSON ({exc})"]
    if not isinstance(settings, dict):
        return [f"{flag}: not a JSON object"]
    problems = []
    for key, setting in settings.items():
        if key not in (option.json_fields or ()):
            problems.append(f"{flag}: {key!r} is not a field of its config")
            continue
        allowed = option.json_choices.get(key)
        if allowed and str(setting) not in allowed and str(setting).upper() not in allowed:
            problems.append(f"{flag}: {key}={setting!r} is not one of {', '.join(allowed)}")
    return problems
