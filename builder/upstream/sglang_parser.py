"""List the command-line options of sglang's ``launch_server`` / ``sglang serve``
from the sglang source tree, without importing sglang (stdlib ``ast`` only): what
``builder upstream check`` holds each launch profile against, for the pinned release and
the next one (it was tests/sglang_flags.py).

Written against sglang 0.5.23, where the parser is built like this
(paths relative to the ``sglang`` package directory):

* ``srt/server_args.py`` ``prepare_server_args`` creates
  ``argparse.ArgumentParser(prog="sglang serve")`` (so ``-h/--help`` exist and
  ``allow_abbrev`` is on) and calls ``ServerArgs.add_cli_args(parser)``.
* ``ServerArgs.add_cli_args`` first calls
  ``add_cli_args_from_dataclass(parser, ServerArgs)`` and then registers a few
  options by hand with ``parser.add_argument`` (dynamic choices, ``--config``,
  deprecated flags).
* ``ServerArgs``'s fields are the fields of the msgspec Structs listed in
  ``_INPUT_NAMESPACES`` (``srt/arg_groups/fields/*.py``).
* ``srt/arg_groups/arg_utils.py`` ``add_cli_args_from_dataclass`` turns a field
  into an option only when its annotation is ``A[T, "help"]`` or
  ``A[T, Arg(...)]`` (``A`` = ``typing.Annotated``) and ``Arg.no_cli`` is not
  set. The option is ``Arg.cli_name`` or ``"--" + name.replace("_", "-")``,
  plus ``Arg.aliases``. Then: a custom ``action`` wins (``argparse.BooleanOptionalAction``
  also adds ``--no-...``); ``Literal[...]`` gives choices (``Arg.choices``
  wins); ``List[X]`` gives ``nargs="+"``; ``bool`` gives ``store_true``;
  anything else takes a value, with ``Arg.choices`` if given.

``server_flags(package_dir)`` repeats that procedure on the AST. It evaluates
choice expressions (literals, names imported from other sglang modules, class
attributes, enum iteration, ``+``, ``list()``/``set()``, simple
comprehensions and small helper functions) and leaves ``choices=None`` with a
note in ``Flag.unresolved`` when it cannot. Anything the procedure does not
recognise raises ``ExtractionError`` rather than guessing.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import pathlib
from collections.abc import Iterable
from typing import Any, Protocol

from builder.core.errors import BuilderError

__all__ = [
    "ExtractionError",
    "Flag",
    "match_option",
    "parser_settings",
    "server_args_fields",
    "server_flags",
]


class ExtractionError(BuilderError):
    """The source tree does not have the shape this extractor understands."""


class _Unresolvable(Exception):
    """An expression could not be evaluated statically."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """One option string accepted by the server's argument parser."""

    option: str  # the option string this entry is keyed by
    option_strings: tuple[str, ...]  # all option strings of the same argparse action
    dest: str  # argparse dest (the ServerArgs field it fills)
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


# ---------------------------------------------------------------------------
# Static evaluation
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Ext:
    """A reference to something outside the sglang tree (e.g. argparse.X)."""

    qualname: str


@dataclasses.dataclass(frozen=True)
class _ClassRef:
    module: str
    node: ast.ClassDef


@dataclasses.dataclass(frozen=True)
class _FuncRef:
    module: str
    node: ast.FunctionDef


@dataclasses.dataclass(frozen=True)
class _ModRef:
    module: str


@dataclasses.dataclass(frozen=True)
class _EnumMember:
    cls: str
    name: str
    value: Any


@dataclasses.dataclass(frozen=True)
class _Bound:
    obj: Any
    attr: str


_BUILTIN_CALLS = {
    "list": lambda *a: list(*a),
    "tuple": lambda *a: tuple(*a),
    "set": lambda *a: set(*a),
    "frozenset": lambda *a: frozenset(*a),
    "sorted": lambda *a: sorted(*a),
}
_STR_METHODS = {"lower", "upper", "replace", "strip"}
_ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum", "enum.Flag", "enum.IntFlag"}


class PackageFiles(Protocol):
    """The ``sglang`` package's files by path relative to it (``srt/server_args.py``):
    a folder, or a release's files read where they are (a git tree, an archive)."""

    def is_file(self, relative: str) -> bool: ...

    def read(self, relative: str) -> str: ...


class _Folder:
    def __init__(self, path: pathlib.Path):
        self.path = pathlib.Path(path)

    def is_file(self, relative: str) -> bool:
        return (self.path / relative).is_file()

    def read(self, relative: str) -> str:
        return (self.path / relative).read_text(encoding="utf-8")

    def __str__(self) -> str:
        return str(self.path)


def _package(package: pathlib.Path | PackageFiles) -> PackageFiles:
    if isinstance(package, pathlib.PurePath | str):
        return _Folder(pathlib.Path(package))
    return package


class _Tree:
    """Parsed modules of one sglang package."""

    def __init__(self, package: pathlib.Path | PackageFiles):
        self.files = _package(package)
        self.top = "sglang"
        self._ast: dict[str, ast.Module] = {}
        self._bindings: dict[str, dict[str, ast.AST]] = {}

    # -- modules -----------------------------------------------------------
    def path_of(self, module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != self.top:
            return None
        base = "/".join(parts[1:])
        for cand in (f"{base}.py", f"{base}/__init__.py".lstrip("/")):
            if self.files.is_file(cand):
                return cand
        return None

    def rel(self, module: str, line: int) -> str:
        return f"{self.path_of(module) or module}:{line}"

    def module_ast(self, module: str) -> ast.Module:
        if module not in self._ast:
            path = self.path_of(module)
            if path is None:
                raise _Unresolvable(f"module {module} not in the source tree")
            try:
                self._ast[module] = ast.parse(self.files.read(path), path)
            except (SyntaxError, ValueError) as exc:  # newer Python than this builder's
                raise ExtractionError(f"{path}: cannot be parsed by this Python ({exc})") from None
            except (RecursionError, MemoryError):  # the parser's answer to deep nesting
                raise ExtractionError(f"{path}: nested too deeply to parse") from None
        return self._ast[module]

    def is_internal(self, module: str) -> bool:
        return module.split(".")[0] == self.top and self.path_of(module) is not None

    def bindings(self, module: str) -> dict[str, ast.AST]:
        """Top-level name -> binding node (Import alias, Assign value, class, def).

        The first top-level binding wins except that later plain assignments
        replace earlier ones (module execution order)."""
        if module in self._bindings:
            return self._bindings[module]
        out: dict[str, ast.AST] = {}
        for stmt in self.module_ast(module).body:
            _collect_binding(stmt, module, out)
        self._bindings[module] = out
        return out


def _resolve_relative(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _collect_binding(stmt: ast.stmt, module: str, out: dict[str, ast.AST]) -> None:
    if isinstance(stmt, ast.ImportFrom):
        for alias in stmt.names:
            out[alias.asname or alias.name] = ("from", module, stmt, alias.name)
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.asname:
                out[alias.asname] = ("import", alias.name)
            else:
                top = alias.name.split(".")[0]
                out[top] = ("import", top)
    elif isinstance(stmt, ast.Assign):
        for tgt in stmt.targets:
            if isinstance(tgt, ast.Name):
                out[tgt.id] = ("value", module, stmt.value)
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        if stmt.value is not None:
            out[stmt.target.id] = ("value", module, stmt.value)
    elif isinstance(stmt, ast.ClassDef):
        out[stmt.name] = ("class", module, stmt)
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        out[stmt.name] = ("def", module, stmt)
    elif isinstance(stmt, ast.Try):
        # `try: from x import y except ImportError: ...` -- take the try branch.
        for sub in stmt.body:
            _collect_binding(sub, module, out)


class _Evaluator:
    def __init__(self, tree: _Tree):
        self.tree = tree

    # -- names -------------------------------------------------------------
    def lookup(self, module: str, name: str, local: dict[str, Any] | None = None) -> Any:
        if local is not None and name in local:
            val = local[name]
            if isinstance(val, _Unresolvable):
                raise val
            return val
        b = self.tree.bindings(module).get(name)
        if b is None:
            if hasattr(builtins, name):
                return _Ext("builtins." + name)
            raise _Unresolvable(f"name {name!r} not bound in {module}")
        return self.binding_value(b, name)

    def binding_value(self, b: tuple, name: str) -> Any:
        kind = b[0]
        if kind == "import":
            mod = b[1]
            return _ModRef(mod) if self.tree.is_internal(mod) else _Ext(mod)
        if kind == "from":
            _, module, node, orig = b
            is_pkg = (self.tree.path_of(module) or "x.py").rsplit("/", 1)[-1] == "__init__.py"
            src = _resolve_relative(module, node, is_pkg)
            if not self.tree.is_internal(src):
                return _Ext(f"{src}.{orig}")
            if orig in self.tree.bindings(src):
                return self.lookup(src, orig)
            sub = f"{src}.{orig}"
            if self.tree.is_internal(sub):
                return _ModRef(sub)
            raise _Unresolvable(f"{orig!r} not found in {src}")
        if kind == "value":
            return self.eval(b[2], b[1])
        if kind == "class":
            return _ClassRef(b[1], b[2])
        if kind == "def":
            return _FuncRef(b[1], b[2])
        raise _Unresolvable(f"binding kind {kind}")

    # -- classes -----------------------------------------------------------
    def class_attr(self, ref: _ClassRef, attr: str) -> Any:
        local: dict[str, Any] = {}
        found = False
        for stmt in ref.node.body:
            if isinstance(stmt, ast.Assign):
                for tgt in stmt.targets:
                    if isinstance(tgt, ast.Name):
                        try:
                            local[tgt.id] = self.eval(stmt.value, ref.module, local)
                        except _Unresolvable as exc:
                            local[tgt.id] = exc
                        found = found or tgt.id == attr
        if self.is_enum(ref):
            members = self.enum_members(ref)
            for m in members:
                if m.name == attr:
                    return m
        if attr in local:
            val = local[attr]
            if isinstance(val, _Unresolvable):
                raise val
            return val
        raise _Unresolvable(f"{ref.node.name}.{attr} not found")

    def base_names(self, ref: _ClassRef) -> list[str]:
        names = []
        for base in ref.node.bases:
            try:
                val = self.eval(base, ref.module)
            except _Unresolvable:
                names.append(ast.unparse(base))
                continue
            if isinstance(val, _Ext):
                names.append(val.qualname)
            elif isinstance(val, _ClassRef):
                names.append(f"{val.module}.{val.node.name}")
            else:
                names.append(ast.unparse(base))
        return names

    def is_enum(self, ref: _ClassRef) -> bool:
        return any(n in _ENUM_BASES for n in self.base_names(ref))

    def enum_members(self, ref: _ClassRef) -> list[_EnumMember]:
        members: list[_EnumMember] = []
        seen_values = []
        auto = 0
        for stmt in ref.node.body:
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            tgt = stmt.targets[0]
            if not isinstance(tgt, ast.Name) or tgt.id.startswith("_"):
                continue
            if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) in (
                "auto",
                "enum.auto",
            ):
                auto += 1
                value = auto
            else:
                value = self.eval(stmt.value, ref.module)
                if isinstance(value, int):
                    auto = value
            if value in seen_values:  # an alias, not a member of iteration
                continue
            seen_values.append(value)
            members.append(_EnumMember(ref.node.name, tgt.id, value))
        return members

    # -- functions ---------------------------------------------------------
    def call_function(self, ref: _FuncRef, args: list) -> Any:
        """Evaluate a small helper: function-level imports, then the last return.

        The earlier returns of such helpers in sglang are plugin hooks
        (``sys.modules`` look-ups), so the unconditional final return is the
        stock answer."""
        fn = ref.node
        if args or fn.args.args:
            raise _Unresolvable(f"call of {fn.name} with arguments")
        local: dict[str, Any] = {}
        last_return = None
        for stmt in fn.body:
            if isinstance(stmt, (ast.ImportFrom, ast.Import)):
                tmp: dict[str, ast.AST] = {}
                _collect_binding(stmt, ref.module, tmp)
                for name, b in tmp.items():
                    try:
                        local[name] = self.binding_value(b, name)
                    except _Unresolvable as exc:
                        local[name] = exc
            elif isinstance(stmt, ast.Return):
                last_return = stmt
        if last_return is None or last_return.value is None:
            raise _Unresolvable(f"{fn.name} has no final return")
        return self.eval(last_return.value, ref.module, local)

    # -- expressions -------------------------------------------------------
    def eval(self, node: ast.AST, module: str, local: dict[str, Any] | None = None) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    items.extend(self.eval(elt.value, module, local))
                else:
                    items.append(self.eval(elt, module, local))
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            return {
                self.eval(k, module, local): self.eval(v, module, local)
                for k, v in zip(node.keys, node.values, strict=False)
                if k is not None
            }
        if isinstance(node, ast.JoinedStr):
            raise _Unresolvable("f-string")
        if isinstance(node, ast.Name):
            return self.lookup(module, node.id, local)
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value, module, local)
            return self.attribute(base, node.attr)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.BitOr)):
            left = self.eval(node.left, module, local)
            right = self.eval(node.right, module, local)
            if isinstance(node.op, ast.Add):
                if isinstance(left, list) and isinstance(right, tuple):
                    raise _Unresolvable("list + tuple")
                return left + right
            if isinstance(left, (set, frozenset)) and isinstance(right, (set, frozenset)):
                return left | right
            raise _Unresolvable("| on non-sets")
        if isinstance(node, ast.Call):
            func = self.eval(node.func, module, local)
            if node.keywords:
                raise _Unresolvable("call with keywords")
            args = [self.eval(a, module, local) for a in node.args]
            return self.call(func, args)
        if isinstance(node, (ast.ListComp, ast.SetComp)):
            if len(node.generators) != 1:
                raise _Unresolvable("nested comprehension")
            gen = node.generators[0]
            if not isinstance(gen.target, ast.Name) or gen.is_async:
                raise _Unresolvable("comprehension target")
            out = []
            for item in self.iterate(self.eval(gen.iter, module, local)):
                inner = dict(local or {})
                inner[gen.target.id] = item
                if all(self.eval(cond, module, inner) for cond in gen.ifs):
                    out.append(self.eval(node.elt, module, inner))
            return out if isinstance(node, ast.ListComp) else set(out)
        raise _Unresolvable(f"unsupported expression {ast.unparse(node)[:60]!r}")

    def attribute(self, base: Any, attr: str) -> Any:
        if isinstance(base, _ClassRef):
            return self.class_attr(base, attr)
        if isinstance(base, _ModRef):
            return self.lookup(base.module, attr)
        if isinstance(base, _Ext):
            return _Ext(f"{base.qualname}.{attr}")
        if isinstance(base, _EnumMember):
            if attr == "name":
                return base.name
            if attr == "value":
                return base.value
        if isinstance(base, str) and attr in _STR_METHODS:
            return _Bound(base, attr)
        raise _Unresolvable(f"attribute {attr!r} of {type(base).__name__}")

    def iterate(self, value: Any) -> Iterable:
        if isinstance(value, _ClassRef) and self.is_enum(value):
            return self.enum_members(value)
        if isinstance(value, (list, tuple, set, frozenset, dict, str)):
            return value
        raise _Unresolvable(f"iteration over {type(value).__name__}")

    def call(self, func: Any, args: list) -> Any:
        if isinstance(func, _Ext) and func.qualname.startswith("builtins."):
            name = func.qualname.split(".", 1)[1]
            if name in _BUILTIN_CALLS:
                return _BUILTIN_CALLS[name](
                    *[list(self.iterate(a)) if isinstance(a, _ClassRef) else a for a in args]
                )
        if isinstance(func, _Bound) and isinstance(func.obj, str):
            return getattr(func.obj, func.attr)(*args)
        if isinstance(func, _FuncRef):
            return self.call_function(func, args)
        raise _Unresolvable(f"call of {func!r}")


# ---------------------------------------------------------------------------
# Field -> option translation (mirrors arg_utils.add_cli_args_from_dataclass)
# ---------------------------------------------------------------------------

_ANNOTATED = {"typing.Annotated", "typing_extensions.Annotated"}
_MISSING = object()


def _qual(ev: _Evaluator, node: ast.AST, module: str) -> str:
    """Qualified name of a type-ish node ('typing.Optional', 'builtins.bool', ...)."""
    try:
        val = ev.eval(node, module)
    except _Unresolvable:
        return ast.unparse(node)
    if isinstance(val, _Ext):
        return val.qualname
    if isinstance(val, _ClassRef):
        return f"{val.module}.{val.node.name}"
    if val is None:
        return "None"
    return ast.unparse(node)


def _is_annotated(ev: _Evaluator, node: ast.AST, module: str) -> bool:
    if not isinstance(node, ast.Name) and not isinstance(node, ast.Attribute):
        return False
    q = _qual(ev, node, module)
    if q in _ANNOTATED:
        return True
    # arg_utils.A = Annotated
    return q == "sglang.srt.arg_groups.arg_utils.A"


def _subscript_args(node: ast.Subscript) -> list[ast.AST]:
    sl = node.slice
    return list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]


def _unwrap_optional(ev: _Evaluator, node: ast.AST, module: str) -> ast.AST:
    """Optional[X] / Union[X, None] / X | None -> X (only with exactly one non-None arm)."""
    if isinstance(node, ast.Subscript):
        q = _qual(ev, node.value, module)
        args = _subscript_args(node)
        if q == "typing.Optional" and len(args) == 1:
            return args[0]
        if q == "typing.Union":
            non_none = [a for a in args if not (isinstance(a, ast.Constant) and a.value is None)]
            if len(non_none) == 1:
                return non_none[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        arms = []

        def flat(n):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
                flat(n.left)
                flat(n.right)
            else:
                arms.append(n)

        flat(node)
        non_none = [a for a in arms if not (isinstance(a, ast.Constant) and a.value is None)]
        if len(non_none) == 1:
            return non_none[0]
    return node


def _literal_values(ev: _Evaluator, node: ast.AST, module: str) -> list | None:
    if isinstance(node, ast.Subscript) and _qual(ev, node.value, module) in (
        "typing.Literal",
        "typing_extensions.Literal",
    ):
        return [ev.eval(a, module) for a in _subscript_args(node)]
    return None


def _is_list(ev: _Evaluator, node: ast.AST, module: str) -> bool:
    target = node.value if isinstance(node, ast.Subscript) else node
    return _qual(ev, target, module) in ("typing.List", "builtins.list", "list")


def _is_bool(ev: _Evaluator, node: ast.AST, module: str) -> bool:
    return (
        isinstance(node, ast.Name)
        and node.id == "bool"
        and _qual(ev, node, module) in ("bool", "builtins.bool")
    )


class _Registry:
    def __init__(self):
        self.flags: dict[str, Flag] = {}

    def add(self, option_strings: list[str], **kw) -> None:
        for opt in option_strings:
            if opt in self.flags:
                raise ExtractionError(
                    f"option {opt} registered twice ({self.flags[opt].origin} and "
                    f"{kw.get('origin')}); argparse would raise a conflict"
                )
        for opt in option_strings:
            self.flags[opt] = Flag(option=opt, option_strings=tuple(option_strings), **kw)


def _arg_kwargs(
    ev: _Evaluator, call: ast.Call, module: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """Evaluate Arg(...) keywords; returns (values, unresolved reasons)."""
    if call.args:
        raise ExtractionError(
            f"Arg(...) with positional args at {ev.tree.rel(module, call.lineno)}"
        )
    values: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ExtractionError(f"Arg(**...) at {ev.tree.rel(module, call.lineno)}")
        if kw.arg == "help":
            continue
        try:
            values[kw.arg] = ev.eval(kw.value, module)
        except _Unresolvable as exc:
            failed[kw.arg] = f"{ast.unparse(kw.value)[:80]}: {exc}"
            values[kw.arg] = _MISSING
    return values, failed


_NEEDS_LITERAL = ("no_cli", "cli_name", "aliases", "action", "action_kwargs", "nargs", "required")


def _field_flags(ev: _Evaluator, reg: _Registry, ref: _ClassRef) -> None:
    tree = ev.tree
    for base in ref.node.bases:
        q = _qual(ev, base, ref.module)
        if q == "msgspec.Struct":
            continue
        val = ev.eval(base, ref.module)
        if isinstance(val, _ClassRef):  # inherited Struct fields come first
            _field_flags(ev, reg, val)
        else:
            raise ExtractionError(f"unexpected base {q} of {ref.node.name}")
    for stmt in ref.node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        name = stmt.target.id
        ann = stmt.annotation
        origin = tree.rel(ref.module, stmt.lineno)
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            raise ExtractionError(f"string annotation at {origin}")
        if _qual(ev, ann, ref.module) == "typing.ClassVar" or (
            isinstance(ann, ast.Subscript) and _qual(ev, ann.value, ref.module) == "typing.ClassVar"
        ):
            continue
        # Only a top-level Annotated[...] carries CLI metadata (get_origin(hint) is Annotated).
        if not (isinstance(ann, ast.Subscript) and _is_annotated(ev, ann.value, ref.module)):
            continue
        parts = _subscript_args(ann)
        raw_type, metas = parts[0], parts[1:]
        meta: ast.AST | None = None
        for m in metas:
            if (
                isinstance(m, ast.Call)
                and _qual(ev, m.func, ref.module) == "sglang.srt.arg_groups.arg_utils.Arg"
            ):
                meta = m
                break
            if isinstance(m, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                if isinstance(m, ast.Constant) and not isinstance(m.value, str):
                    continue
                meta = m  # bare help string
                break
        if meta is None:
            continue
        if isinstance(meta, ast.Call):
            arg, failed = _arg_kwargs(ev, meta, ref.module)
            bad = [k for k in _NEEDS_LITERAL if k in failed]
            if bad:
                raise ExtractionError(
                    f"cannot evaluate Arg({', '.join(bad)}) at {origin}: {failed}"
                )
        else:
            arg, failed = {}, {}
        if arg.get("no_cli") is True:
            continue
        cli_name = arg.get("cli_name") or "--" + name.replace("_", "-")
        names = [cli_name, *list(arg.get("aliases") or [])]
        has_default = stmt.value is not None
        common = dict(dest=name, origin=origin, source="field")

        action = arg.get("action")
        if action is not None:
            aq = (
                action.qualname
                if isinstance(action, _Ext)
                else (
                    f"{action.module}.{action.node.name}"
                    if isinstance(action, _ClassRef)
                    else repr(action)
                )
            )
            akw = arg.get("action_kwargs") or {}
            if aq == "argparse.BooleanOptionalAction":
                # argparse adds "--no-X" for every "--X"; all are one action.
                neg = ["--no-" + n[2:] for n in names if n.startswith("--")]
                reg.add(names + neg, kind="boolean_optional", takes_value=False, **common)
                for n in neg:
                    reg.flags[n] = dataclasses.replace(reg.flags[n], negated=True)
            else:
                nargs = akw.get("nargs")
                reg.add(
                    names,
                    kind="action",
                    takes_value=nargs != 0,
                    nargs=None if nargs is None else str(nargs),
                    **common,
                )
            continue

        inner = _unwrap_optional(ev, raw_type, ref.module)
        choices_unresolved = failed.get("choices", "")
        arg_choices = arg.get("choices")
        if arg_choices is _MISSING:
            arg_choices = None
        literal = _literal_values(ev, inner, ref.module)
        if literal is not None:
            # `arg_meta.choices or literal_vals`
            if choices_unresolved:
                choices, why = None, choices_unresolved
            else:
                choices, why = (arg_choices or literal), ""
            reg.add(
                names,
                kind="value",
                takes_value=True,
                choices=None if choices is None else tuple(choices),
                unresolved=why,
                **common,
            )
            continue
        if _is_list(ev, inner, ref.module) and "type_parser" not in arg:
            reg.add(
                names,
                kind="list",
                takes_value=True,
                nargs=arg.get("nargs") or "+",
                choices=tuple(arg_choices) if arg_choices else None,
                unresolved=choices_unresolved,
                **common,
            )
            continue
        if _is_bool(ev, inner, ref.module):
            reg.add(names, kind="store_true", takes_value=False, **common)
            continue
        required = arg.get("required")
        is_required = (required is True or (required is None and not has_default)) and any(
            n.startswith("-") for n in names
        )
        reg.add(
            names,
            kind="value",
            takes_value=True,
            nargs=arg.get("nargs"),
            choices=tuple(arg_choices) if arg_choices else None,
            required=is_required,
            unresolved=choices_unresolved,
            **common,
        )


# ---------------------------------------------------------------------------
# ServerArgs / add_cli_args
# ---------------------------------------------------------------------------

SERVER_ARGS_MODULE = "sglang.srt.server_args"
ARG_UTILS_ADD = "sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass"


def _find_class(mod: ast.Module, name: str) -> ast.ClassDef:
    for stmt in mod.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return stmt
    raise ExtractionError(f"class {name} not found")


def _find_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    raise ExtractionError(f"{cls.name}.{name} not found")


def _input_namespaces(ev: _Evaluator) -> list[_ClassRef]:
    b = ev.tree.bindings(SERVER_ARGS_MODULE).get("_INPUT_NAMESPACES")
    if b is None or b[0] != "value" or not isinstance(b[2], ast.List):
        raise ExtractionError("_INPUT_NAMESPACES list not found in srt/server_args.py")
    out = []
    for elt in b[2].elts:
        val = ev.eval(elt, SERVER_ARGS_MODULE)
        if not isinstance(val, _ClassRef):
            raise ExtractionError(f"namespace {ast.unparse(elt)} is not a class in the tree")
        out.append(val)
    # ServerArgs' own annotated fields (merged after the namespaces) -- none in 0.5.23.
    cls = _find_class(ev.tree.module_ast(SERVER_ARGS_MODULE), "ServerArgs")
    if any(isinstance(s, ast.AnnAssign) for s in cls.body):
        out.append(_ClassRef(SERVER_ARGS_MODULE, cls))
    return out


def _is_parser_add_argument(node: ast.AST, parser_name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == parser_name
    )


def _manual_flag(
    ev: _Evaluator,
    reg: _Registry,
    call: ast.Call,
    local: dict[str, Any],
    extras: dict[str, list],
) -> None:
    module = SERVER_ARGS_MODULE
    origin = ev.tree.rel(module, call.lineno)
    names = []
    for a in call.args:
        if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
            raise ExtractionError(f"non-literal option string at {origin}")
        names.append(a.value)
    kw = {k.arg: k.value for k in call.keywords}
    if None in kw:
        raise ExtractionError(f"add_argument(**...) at {origin}")
    long = next((n for n in names if n.startswith("--")), names[0])
    dest = kw["dest"].value if "dest" in kw else long.lstrip("-").replace("-", "_")
    action = None
    if "action" in kw:
        action = ev.eval(kw["action"], module, local)
    aq = ""
    if isinstance(action, str):
        aq = action
    elif isinstance(action, _Ext):
        aq = action.qualname
    elif isinstance(action, _ClassRef):
        aq = f"{action.module}.{action.node.name}"
    help_node = kw.get("help")
    help_text = ""
    if help_node is not None:
        try:
            help_text = ev.eval(help_node, module, local)
        except _Unresolvable:
            help_text = ""
    deprecated = aq.rsplit(".", 1)[-1].startswith("Deprecated") or str(help_text).lstrip(
        "("
    ).startswith("Deprecated")
    choices = None
    unresolved = ""
    conditional: tuple[Any, ...] = ()
    if "choices" in kw:
        try:
            choices = ev.eval(kw["choices"], module, local)
            choices = tuple(sorted(choices) if isinstance(choices, (set, frozenset)) else choices)
        except _Unresolvable as exc:
            unresolved = f"{ast.unparse(kw['choices'])}: {exc}"
        if isinstance(kw["choices"], ast.Name):
            conditional = tuple(extras.get(kw["choices"].id, ()))
    nargs = kw["nargs"].value if "nargs" in kw and isinstance(kw["nargs"], ast.Constant) else None
    if aq in ("store_true", "store_false", "store_const", "count", "help", "version"):
        takes_value = False
        kind = "store_true" if aq == "store_true" else "action"
    elif aq in ("", "store", "append", "extend"):
        takes_value, kind = True, "value"
    elif aq.endswith("DeprecatedStoreTrueAction") or aq.endswith("DeprecatedAction"):
        takes_value, kind = nargs not in (None, 0), "store_true"
    elif aq.endswith("DeprecatedStoreConstAction"):
        # nargs defaults to 0 in the action's __init__; `nargs=None` makes it take one value.
        takes_value = "nargs" in kw and nargs != 0
        kind = "value" if takes_value else "store_true"
    else:
        takes_value, kind = True, "action"
    reg.add(
        names,
        dest=dest,
        kind=kind,
        takes_value=takes_value,
        choices=choices,
        nargs=None if nargs is None else str(nargs),
        deprecated=deprecated,
        conditional_choices=conditional,
        origin=origin,
        source="manual",
        unresolved=unresolved,
        required=bool(isinstance(kw.get("required"), ast.Constant) and kw["required"].value),
    )


def _walk_add_cli_args(
    ev: _Evaluator, reg: _Registry, fn: ast.FunctionDef, namespaces: list[_ClassRef]
) -> None:
    module = SERVER_ARGS_MODULE
    if not fn.args.args:
        raise ExtractionError("add_cli_args has no parser parameter")
    parser_name = fn.args.args[0].arg
    local: dict[str, Any] = {}
    extras: dict[str, list] = {}  # local name -> values added under a condition

    def run(stmts: list[ast.stmt], conditional: bool) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.Assign):
                for tgt in stmt.targets:
                    if isinstance(tgt, ast.Name):
                        try:
                            local[tgt.id] = ev.eval(stmt.value, module, local)
                        except _Unresolvable as exc:
                            local[tgt.id] = exc
            elif isinstance(stmt, (ast.ImportFrom, ast.Import)):
                tmp: dict[str, ast.AST] = {}
                _collect_binding(stmt, module, tmp)
                for name, b in tmp.items():
                    try:
                        local[name] = ev.binding_value(b, name)
                    except _Unresolvable as exc:
                        local[name] = exc
            elif isinstance(stmt, ast.If):
                run(stmt.body, True)
                run(stmt.orelse, True)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value
                if _is_parser_add_argument(call, parser_name):
                    if conditional:
                        raise ExtractionError(
                            f"conditional add_argument at {ev.tree.rel(module, call.lineno)}"
                        )
                    _manual_flag(ev, reg, call, local, extras)
                    continue
                try:
                    func = ev.eval(call.func, module, local)
                except _Unresolvable:
                    func = None
                if (
                    isinstance(func, _FuncRef)
                    and f"{func.module}.{func.node.name}" == ARG_UTILS_ADD
                ):
                    if conditional or len(call.args) != 2 or call.keywords:
                        raise ExtractionError("unexpected add_cli_args_from_dataclass call")
                    if ast.unparse(call.args[1]) != "ServerArgs":
                        raise ExtractionError(
                            "add_cli_args_from_dataclass on a class other than ServerArgs"
                        )
                    for ns in namespaces:
                        _field_flags(ev, reg, ns)
                    continue
                # `local.add(x)` / `.append(x)` / `.extend(x)` under a condition
                f = call.func
                if (
                    isinstance(f, ast.Attribute)
                    and isinstance(f.value, ast.Name)
                    and f.value.id in local
                    and f.attr in ("add", "append", "extend")
                ):
                    vals = [ev.eval(a, module, local) for a in call.args]
                    if f.attr == "extend":
                        vals = list(vals[0])
                    if conditional:
                        extras.setdefault(f.value.id, []).extend(vals)
                    else:
                        target = local[f.value.id]
                        if isinstance(target, set):
                            target.update(vals)
                        else:
                            target.extend(vals)
                    continue
                raise ExtractionError(
                    "unrecognised statement in add_cli_args at "
                    f"{ev.tree.rel(module, stmt.lineno)}: {ast.unparse(stmt)[:80]}"
                )
            elif isinstance(stmt, (ast.Pass,)) or (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            ):
                continue
            else:
                raise ExtractionError(
                    "unrecognised statement in add_cli_args at "
                    f"{ev.tree.rel(module, stmt.lineno)}: {type(stmt).__name__}"
                )

    run(fn.body, False)


def parser_settings(package_dir: pathlib.Path | PackageFiles) -> dict[str, Any]:
    """Keywords of the ``argparse.ArgumentParser(...)`` call in ``prepare_server_args``."""
    tree = _Tree(package_dir)
    mod = tree.module_ast(SERVER_ARGS_MODULE)
    for stmt in mod.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "prepare_server_args":
            for node in ast.walk(stmt):
                if (
                    isinstance(node, ast.Call)
                    and ast.unparse(node.func) == "argparse.ArgumentParser"
                ):
                    out = {"add_help": True, "allow_abbrev": True, "prefix_chars": "-"}
                    for k in node.keywords:
                        out[k.arg] = ast.literal_eval(k.value)
                    out["origin"] = tree.rel(SERVER_ARGS_MODULE, node.lineno)
                    return out
    raise ExtractionError("prepare_server_args / ArgumentParser not found")


def server_flags(package_dir: pathlib.Path | PackageFiles) -> dict[str, Flag]:
    """Every option string ``launch_server`` accepts, mapped to a ``Flag``.

    ``package_dir`` is the ``sglang`` package folder (the one holding ``srt/``), or
    its files as ``PackageFiles``.
    Keys include aliases, ``--no-...`` forms of BooleanOptionalAction options,
    and ``-h``/``--help``. Abbreviations (argparse ``allow_abbrev``) are not
    keys; use ``match_option`` for those.
    """
    files = _package(package_dir)
    if not files.is_file("srt/server_args.py"):
        raise ExtractionError(f"{files} does not hold srt/server_args.py")
    tree = _Tree(files)
    ev = _Evaluator(tree)
    reg = _Registry()
    settings = parser_settings(files)
    if settings.get("add_help", True):
        reg.add(
            ["-h", "--help"],
            dest="help",
            kind="help",
            takes_value=False,
            source="argparse",
            origin=settings["origin"],
        )
    mod = tree.module_ast(SERVER_ARGS_MODULE)
    cls = _find_class(mod, "ServerArgs")
    fn = _find_method(cls, "add_cli_args")
    namespaces = _input_namespaces(ev)
    _walk_add_cli_args(ev, reg, fn, namespaces)
    return dict(sorted(reg.flags.items()))


def server_args_fields(package_dir: pathlib.Path | PackageFiles) -> list[str]:
    """Names of all ServerArgs fields (CLI or not), in declaration order.

    ``GET /server_info`` reports each of them (``ServerArgs.resolved_dict``,
    srt/server_args.py), plus ``launch_command``, the scheduler handshake keys,
    ``kv_events``, ``startup_time``, ``internal_states``, ``version``, ``frontend``.
    """
    tree = _Tree(package_dir)
    ev = _Evaluator(tree)
    names: list[str] = []

    def walk(ref: _ClassRef) -> None:
        for base in ref.node.bases:
            val = (
                ev.eval(base, ref.module)
                if _qual(ev, base, ref.module) != "msgspec.Struct"
                else None
            )
            if isinstance(val, _ClassRef):
                walk(val)
        for stmt in ref.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ann = stmt.annotation
                if (
                    isinstance(ann, ast.Subscript)
                    and _qual(ev, ann.value, ref.module) == "typing.ClassVar"
                ):
                    continue
                if stmt.target.id not in names:
                    names.append(stmt.target.id)

    for ns in _input_namespaces(ev):
        walk(ns)
    return names


def match_option(token: str, flags: dict[str, Flag], allow_abbrev: bool = True) -> list[str]:
    """Which option string(s) argparse would match ``token`` (e.g. ``--tp``) to.

    Exact matches (also ``--opt=value``) win; otherwise, with ``allow_abbrev``,
    every option string starting with the token (Python 3.11/3.12 argparse
    rule). One result = accepted; several = argparse reports "ambiguous option";
    none = "unrecognized arguments".
    """
    opt = token.split("=", 1)[0] if token.startswith("--") else token
    if opt in flags:
        return [opt]
    if not allow_abbrev or not opt.startswith("--"):
        return []
    return sorted(o for o in flags if o.startswith(opt))


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    result = server_flags(pathlib.Path(sys.argv[1]))
    print(
        json.dumps(
            {
                k: {
                    "dest": v.dest,
                    "kind": v.kind,
                    "choices": v.choices,
                    "deprecated": v.deprecated,
                    "origin": v.origin,
                }
                for k, v in result.items()
            },
            indent=1,
            default=list,
        )
    )
