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
choice expressions with ``builder.upstream.pysource`` (literals, names imported from
other sglang modules, class attributes, enum iteration, ``+``, ``list()``/``set()``,
simple comprehensions and small helper functions) and leaves ``choices=None`` with a
note in ``Flag.unresolved`` when it cannot. Anything the procedure does not
recognise raises ``ExtractionError`` rather than guessing. This module holds sglang's
conventions only: the reading is pysource's, the options' model
``builder.upstream.argparse_flags``'s.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from typing import Any

from builder.upstream.argparse_flags import Flag, FlagTable
from builder.upstream.pysource import (
    ANNOTATED,
    ClassRef,
    Evaluator,
    External,
    ExtractionError,
    FunctionRef,
    PackageFiles,
    SourceTree,
    Unresolvable,
    package_files,
    subscript_args,
)

__all__ = [
    "ExtractionError",
    "parser_settings",
    "server_args_fields",
    "server_flags",
]

TOP = "sglang"
ARG_UTILS = "sglang.srt.arg_groups.arg_utils"
ARG_UTILS_ADD = f"{ARG_UTILS}.add_cli_args_from_dataclass"
ARG_UTILS_ARG = f"{ARG_UTILS}.Arg"


# ---------------------------------------------------------------------------
# Field -> option translation (mirrors arg_utils.add_cli_args_from_dataclass)
# ---------------------------------------------------------------------------

_MISSING = object()


def _is_annotated(ev: Evaluator, node: ast.AST, module: str) -> bool:
    if not isinstance(node, ast.Name) and not isinstance(node, ast.Attribute):
        return False
    q = ev.qualname(node, module)
    if q in ANNOTATED:
        return True
    # arg_utils.A = Annotated
    return q == f"{ARG_UTILS}.A"


def _arg_kwargs(
    ev: Evaluator, call: ast.Call, module: str
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
        except Unresolvable as exc:
            failed[kw.arg] = f"{ast.unparse(kw.value)[:80]}: {exc}"
            values[kw.arg] = _MISSING
    return values, failed


_NEEDS_LITERAL = ("no_cli", "cli_name", "aliases", "action", "action_kwargs", "nargs", "required")


def _field_flags(ev: Evaluator, reg: FlagTable, ref: ClassRef) -> None:
    for base in ref.node.bases:
        q = ev.qualname(base, ref.module)
        if q == "msgspec.Struct":
            continue
        val = ev.eval(base, ref.module)
        if isinstance(val, ClassRef):  # inherited Struct fields come first
            _field_flags(ev, reg, val)
        else:
            raise ExtractionError(f"unexpected base {q} of {ref.node.name}")
    for stmt in ref.node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        origin = ev.tree.rel(ref.module, stmt.lineno)
        found = _cli_metadata(ev, stmt.annotation, ref.module, origin)
        if found is None:
            continue
        raw_type, arg, failed = found
        if arg.get("no_cli") is True:
            continue
        name = stmt.target.id
        cli_name = arg.get("cli_name") or "--" + name.replace("_", "-")
        names = [cli_name, *list(arg.get("aliases") or [])]
        common = dict(dest=name, origin=origin, source="field")
        if arg.get("action") is not None:
            _action_option(reg, names, arg, common)
            continue
        has_default = stmt.value is not None
        option = _typed_option(ev, raw_type, ref.module, arg, failed, names, has_default)
        reg.add(names, **option, **common)


def _cli_metadata(
    ev: Evaluator, ann: ast.expr, module: str, origin: str
) -> tuple[ast.AST, dict[str, Any], dict[str, str]] | None:
    """(the field's type, its Arg(...) keywords, the keywords not evaluated) of an
    ``A[T, Arg(...)]`` or ``A[T, "help"]`` annotation; None for a field that is no option."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        raise ExtractionError(f"string annotation at {origin}")
    if ev.qualname(ann, module) == "typing.ClassVar" or (
        isinstance(ann, ast.Subscript) and ev.qualname(ann.value, module) == "typing.ClassVar"
    ):
        return None
    # Only a top-level Annotated[...] carries CLI metadata (get_origin(hint) is Annotated).
    if not (isinstance(ann, ast.Subscript) and _is_annotated(ev, ann.value, module)):
        return None
    raw_type, *metas = subscript_args(ann)
    for m in metas:
        if isinstance(m, ast.Call) and ev.qualname(m.func, module) == ARG_UTILS_ARG:
            arg, failed = _arg_kwargs(ev, m, module)
            bad = [k for k in _NEEDS_LITERAL if k in failed]
            if bad:
                raise ExtractionError(
                    f"cannot evaluate Arg({', '.join(bad)}) at {origin}: {failed}"
                )
            return raw_type, arg, failed
        if isinstance(m, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            if isinstance(m, ast.Constant) and not isinstance(m.value, str):
                continue
            return raw_type, {}, {}  # a bare help string
    return None


def _action_option(reg: FlagTable, names: list[str], arg: dict[str, Any], common: dict) -> None:
    """A field whose Arg names an argparse action."""
    action = arg["action"]
    aq = action.qualname if isinstance(action, External | ClassRef) else repr(action)
    if aq == "argparse.BooleanOptionalAction":
        # argparse adds "--no-X" for every "--X"; all are one action.
        neg = ["--no-" + n[2:] for n in names if n.startswith("--")]
        reg.add(names + neg, kind="boolean_optional", takes_value=False, **common)
        for n in neg:
            reg.flags[n] = dataclasses.replace(reg.flags[n], negated=True)
        return
    nargs = (arg.get("action_kwargs") or {}).get("nargs")
    reg.add(
        names,
        kind="action",
        takes_value=nargs != 0,
        nargs=None if nargs is None else str(nargs),
        **common,
    )


def _typed_option(
    ev: Evaluator,
    raw_type: ast.AST,
    module: str,
    arg: dict[str, Any],
    failed: dict[str, str],
    names: list[str],
    has_default: bool,
) -> dict[str, Any]:
    """A field's option from its type: Literal gives choices, a list nargs="+", bool
    store_true; anything else takes a value."""
    inner = ev.unwrap_optional(raw_type, module)
    choices_unresolved = failed.get("choices", "")
    arg_choices = arg.get("choices")
    if arg_choices is _MISSING:
        arg_choices = None
    given = tuple(arg_choices) if arg_choices else None
    literal = ev.literal_values(inner, module)
    if literal is not None:
        # `arg_meta.choices or literal_vals`
        if choices_unresolved:
            return dict(kind="value", takes_value=True, unresolved=choices_unresolved)
        return dict(kind="value", takes_value=True, choices=tuple(arg_choices or literal))
    if ev.is_list_type(inner, module) and "type_parser" not in arg:
        nargs = arg.get("nargs") or "+"
        return dict(
            kind="list", takes_value=True, nargs=nargs, choices=given, unresolved=choices_unresolved
        )
    if ev.is_bool_type(inner, module):
        return dict(kind="store_true", takes_value=False)
    required = arg.get("required")
    is_required = (required is True or (required is None and not has_default)) and any(
        n.startswith("-") for n in names
    )
    return dict(
        kind="value",
        takes_value=True,
        nargs=arg.get("nargs"),
        choices=given,
        required=is_required,
        unresolved=choices_unresolved,
    )


# ---------------------------------------------------------------------------
# ServerArgs / add_cli_args
# ---------------------------------------------------------------------------

SERVER_ARGS_MODULE = "sglang.srt.server_args"


def _server_args(ev: Evaluator) -> ClassRef:
    """The ``class ServerArgs`` statement: the module rebinds the name afterwards, to a
    ``msgspec.defstruct`` of its fields and the namespaces'."""
    for stmt in ev.tree.module_ast(SERVER_ARGS_MODULE).body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == "ServerArgs":
            return ClassRef(SERVER_ARGS_MODULE, stmt)
    raise ExtractionError("class ServerArgs not found")


def _input_namespaces(ev: Evaluator) -> list[ClassRef]:
    b = ev.tree.bindings(SERVER_ARGS_MODULE).get("_INPUT_NAMESPACES")
    if b is None or b.kind != "value" or not isinstance(b.node, ast.List):
        raise ExtractionError("_INPUT_NAMESPACES list not found in srt/server_args.py")
    out = []
    for elt in b.node.elts:
        val = ev.eval(elt, SERVER_ARGS_MODULE)
        if not isinstance(val, ClassRef):
            raise ExtractionError(f"namespace {ast.unparse(elt)} is not a class in the tree")
        out.append(val)
    # ServerArgs' own annotated fields (merged after the namespaces) -- none in 0.5.23.
    server_args = _server_args(ev)
    if any(isinstance(s, ast.AnnAssign) for s in server_args.node.body):
        out.append(server_args)
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
    ev: Evaluator,
    reg: FlagTable,
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
    elif isinstance(action, External | ClassRef):
        aq = action.qualname
    help_node = kw.get("help")
    help_text = ""
    if help_node is not None:
        try:
            help_text = ev.eval(help_node, module, local)
        except Unresolvable:
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
        except Unresolvable as exc:
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
    ev: Evaluator, reg: FlagTable, fn: ast.FunctionDef, namespaces: list[ClassRef]
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
                ev.assign_into(stmt, module, local)
            elif isinstance(stmt, (ast.ImportFrom, ast.Import)):
                ev.import_into(stmt, module, local)
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
                except Unresolvable:
                    func = None
                if isinstance(func, FunctionRef) and func.qualname == ARG_UTILS_ADD:
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
    tree = SourceTree(package_dir, TOP)
    mod = tree.module_ast(SERVER_ARGS_MODULE)
    for stmt in mod.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "prepare_server_args":
            for node in ast.walk(stmt):
                if (
                    isinstance(node, ast.Call)
                    and ast.unparse(node.func) == "argparse.ArgumentParser"
                ):
                    out = {"add_help": True, "allow_abbrev": True, "prefix_chars": "-"}
                    origin = tree.rel(SERVER_ARGS_MODULE, node.lineno)
                    for k in node.keywords:
                        try:
                            out[k.arg] = ast.literal_eval(k.value)
                        except ValueError:
                            # formatter_class=argparse.RawTextHelpFormatter, **kwargs...: a
                            # setting the flag table needs must be a literal; the rest are not
                            # read.
                            if k.arg in out:
                                raise ExtractionError(
                                    f"{origin}: ArgumentParser({k.arg}=...) is not a literal"
                                ) from None
                    out["origin"] = origin
                    return out
    raise ExtractionError("prepare_server_args / ArgumentParser not found")


def server_flags(package_dir: pathlib.Path | PackageFiles) -> dict[str, Flag]:
    """Every option string ``launch_server`` accepts, mapped to a ``Flag``.

    ``package_dir`` is the ``sglang`` package folder (the one holding ``srt/``), or
    its files as ``PackageFiles``.
    Keys include aliases, ``--no-...`` forms of BooleanOptionalAction options,
    and ``-h``/``--help``. Abbreviations (argparse ``allow_abbrev``) are not keys.
    """
    files = package_files(package_dir)
    if not files.is_file("srt/server_args.py"):
        raise ExtractionError(f"{files} does not hold srt/server_args.py")
    tree = SourceTree(files, TOP)
    ev = Evaluator(tree)
    reg = FlagTable()
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
    try:
        add_cli_args = ev.find_method(_server_args(ev), "add_cli_args")
    except Unresolvable as exc:
        raise ExtractionError(str(exc)) from None
    namespaces = _input_namespaces(ev)
    _walk_add_cli_args(ev, reg, add_cli_args.node, namespaces)
    return dict(sorted(reg.flags.items()))


def server_args_fields(package_dir: pathlib.Path | PackageFiles) -> list[str]:
    """Names of all ServerArgs fields (CLI or not), in declaration order.

    ``GET /server_info`` reports each of them (``ServerArgs.resolved_dict``,
    srt/server_args.py), plus ``launch_command``, the scheduler handshake keys,
    ``kv_events``, ``startup_time``, ``internal_states``, ``version``, ``frontend``.
    """
    tree = SourceTree(package_dir, TOP)
    ev = Evaluator(tree)
    names: list[str] = []

    def walk(ref: ClassRef) -> None:
        for base in ref.node.bases:
            val = (
                ev.eval(base, ref.module)
                if ev.qualname(base, ref.module) != "msgspec.Struct"
                else None
            )
            if isinstance(val, ClassRef):
                walk(val)
        for stmt in ref.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ann = stmt.annotation
                if (
                    isinstance(ann, ast.Subscript)
                    and ev.qualname(ann.value, ref.module) == "typing.ClassVar"
                ):
                    continue
                if stmt.target.id not in names:
                    names.append(stmt.target.id)

    for ns in _input_namespaces(ev):
        walk(ns)
    return names


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
