"""Read a Python package's source without importing it (stdlib ``ast`` only): the one static
reader of upstream releases, which builder reads where torch and CUDA are not and never runs
(sglang's argument parser in ``sglang_parser``, FlashInfer's JIT generators in ``jit_generators``).

* ``PackageFiles``: the package's files by path relative to its folder (a ``Folder``, a git
  tree, a wheel's members).
* ``SourceTree(files, top)``: the modules of the package named ``top``, parsed; their top-level
  bindings (the first branch of ``try``/``except ImportError``, ``with`` and ``if`` blocks);
  ``definition`` follows imports and re-exports across modules to where a name is defined.
* ``Evaluator(tree)``: classes, functions and methods by module and name; constant expressions
  (literals, names across modules, class attributes, enum members, ``+``, ``|``, ``list()``,
  ``sorted()``, simple comprehensions, helpers without arguments); annotations as types
  (``Optional``, ``X | None``, ``Literal[...]`` members, ``list``, ``bool``).

What cannot be evaluated raises ``Unresolvable`` with the reason, for the caller to note or
refuse; a file this Python cannot parse is an ``ExtractionError`` in one line naming it
(``flashinfer/jit/mla.py: nested too deeply to parse``). Names from outside the package are
``External``, never read.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import pathlib
from collections.abc import Iterable
from typing import Any, Protocol

from builder.core.errors import BuilderError

ANNOTATED = frozenset({"typing.Annotated", "typing_extensions.Annotated"})
_LITERAL = frozenset({"typing.Literal", "typing_extensions.Literal"})
_AUTO = ("auto", "enum.auto")
_ENUM_BASES = frozenset({"enum.Enum", "enum.IntEnum", "enum.StrEnum", "enum.Flag", "enum.IntFlag"})
_BUILTIN_CALLS = {f.__name__: f for f in (list, tuple, set, frozenset, sorted)}
_STR_METHODS = frozenset({"lower", "upper", "replace", "strip"})


class ExtractionError(BuilderError):
    """The source does not have the shape its reader understands, or this Python cannot
    parse one of its files."""


class Unresolvable(Exception):
    """An expression or name could not be evaluated statically (the message says why)."""


class PackageFiles(Protocol):
    """A package's files by path relative to its folder (``srt/server_args.py``): a folder,
    or a release's files read where they are (a git tree, a wheel)."""

    def is_file(self, relative: str) -> bool: ...

    def read(self, relative: str) -> str: ...


class Folder:
    """A package folder on disk."""

    def __init__(self, path: pathlib.Path):
        self.path = pathlib.Path(path)

    def is_file(self, relative: str) -> bool:
        return (self.path / relative).is_file()

    def read(self, relative: str) -> str:
        return (self.path / relative).read_text(encoding="utf-8")

    def __str__(self) -> str:
        return str(self.path)


def package_files(package: pathlib.Path | str | PackageFiles) -> PackageFiles:
    """``package`` as PackageFiles: a path is a folder on disk."""
    if isinstance(package, pathlib.PurePath | str):
        return Folder(pathlib.Path(package))
    return package


def resolve_relative(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a ``from`` import in ``module`` names (``from ..x import y``);
    one that climbs above the top package names no package (as Python refuses it)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: max(0, len(parts) - (node.level - 1))]
    return ".".join(parts + ([node.module] if node.module else []))


def subscript_args(node: ast.Subscript) -> list[ast.AST]:
    """The arguments of ``X[a, b]`` (``[a]`` for ``X[a]``)."""
    sl = node.slice
    return list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]


# -- what names are bound to ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Binding:
    """The statement that binds a name in a module's source."""

    kind: str  # from | import | value (an assignment) | class | def
    module: str  # the module whose source holds it
    node: ast.AST  # the ImportFrom or Import, the assigned expression, the ClassDef or def
    imported: str = ""  # from: the name imported; import: the module imported


@dataclasses.dataclass(frozen=True)
class External:
    """A name from outside the package (``argparse.BooleanOptionalAction``), not read."""

    qualname: str


@dataclasses.dataclass(frozen=True)
class ModuleRef:
    module: str


@dataclasses.dataclass(frozen=True)
class _Definition:
    module: str
    node: Any

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.node.name}"


@dataclasses.dataclass(frozen=True)
class ClassRef(_Definition):
    node: ast.ClassDef


@dataclasses.dataclass(frozen=True)
class FunctionRef(_Definition):
    node: ast.FunctionDef


@dataclasses.dataclass(frozen=True)
class EnumMember:
    cls: str
    name: str
    value: Any


@dataclasses.dataclass(frozen=True)
class _StrMethod:
    obj: str
    attr: str


def _add_bindings(stmt: ast.stmt, module: str, out: dict[str, Binding]) -> None:
    """The names ``stmt`` binds, into ``out``: a later statement replaces an earlier one, as
    when the module runs."""
    if isinstance(stmt, ast.ImportFrom):
        for alias in stmt.names:
            out[alias.asname or alias.name] = Binding("from", module, stmt, alias.name)
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.asname:
                out[alias.asname] = Binding("import", module, stmt, alias.name)
            else:  # `import a.b` binds `a`
                top = alias.name.split(".")[0]
                out[top] = Binding("import", module, stmt, top)
    elif isinstance(stmt, ast.Assign):
        for tgt in stmt.targets:
            if isinstance(tgt, ast.Name):
                out[tgt.id] = Binding("value", module, stmt.value)
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        if stmt.value is not None:
            out[stmt.target.id] = Binding("value", module, stmt.value)
    elif isinstance(stmt, ast.ClassDef):
        out[stmt.name] = Binding("class", module, stmt)
    elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        out[stmt.name] = Binding("def", module, stmt)
    elif isinstance(stmt, ast.Try | ast.With):
        # `try: from x import y except ImportError: ...`: the try branch, as it reads;
        # `with contextlib.suppress(ImportError): from x import y` the same
        for sub in stmt.body:
            _add_bindings(sub, module, out)
    elif isinstance(stmt, ast.If):
        # `if is_available(): from .x import y` (or `if TYPE_CHECKING:`): the first branch;
        # the other binds only what the first does not (`else: y = None` leaves y the import)
        first: dict[str, Binding] = {}
        for sub in stmt.body:
            _add_bindings(sub, module, first)
        for sub in stmt.orelse:
            _add_bindings(sub, module, out)
        out.update(first)


class SourceTree:
    """The parsed modules of the package ``top`` whose files ``package`` holds."""

    def __init__(self, package: pathlib.Path | str | PackageFiles, top: str):
        self.files = package_files(package)
        self.top = top
        self._ast: dict[str, ast.Module] = {}
        self._bindings: dict[str, dict[str, Binding]] = {}

    def path_of(self, module: str) -> str | None:
        """The file of ``module`` relative to the package (None when not in the package)."""
        parts = module.split(".")
        if parts[0] != self.top:
            return None
        base = "/".join(parts[1:])
        for cand in (f"{base}.py", f"{base}/__init__.py".lstrip("/")):
            if self.files.is_file(cand):
                return cand
        return None

    def is_internal(self, module: str) -> bool:
        return self.path_of(module) is not None

    def is_package(self, module: str) -> bool:
        return (self.path_of(module) or "").rsplit("/", 1)[-1] == "__init__.py"

    def rel(self, module: str, line: int) -> str:
        """``path:line`` of a line of ``module``, for origins and errors."""
        return f"{self.path_of(module) or module}:{line}"

    def module_ast(self, module: str) -> ast.Module:
        if module not in self._ast:
            path = self.path_of(module)
            if path is None:
                raise Unresolvable(f"module {module} not in the source tree")
            shown = f"{self.top}/{path}"
            try:
                self._ast[module] = ast.parse(self.files.read(path), shown)
            except (SyntaxError, ValueError) as exc:  # newer Python than this builder's
                raise ExtractionError(f"{shown}: cannot be parsed by this Python ({exc})") from None
            except (RecursionError, MemoryError):  # the parser's answer to deep nesting
                raise ExtractionError(f"{shown}: nested too deeply to parse") from None
        return self._ast[module]

    def bindings(self, module: str) -> dict[str, Binding]:
        """Each top-level name of ``module`` -> the last statement binding it."""
        if module not in self._bindings:
            out: dict[str, Binding] = {}
            for stmt in self.module_ast(module).body:
                _add_bindings(stmt, module, out)
            self._bindings[module] = out
        return self._bindings[module]

    def definition(self, module: str, name: str) -> Binding | External | ModuleRef:
        """Where ``name`` of ``module`` is defined: see ``follow``."""
        binding = self.bindings(module).get(name)
        if binding is None:
            raise Unresolvable(f"name {name!r} not bound in {module}")
        return self.follow(binding)

    def follow(self, binding: Binding) -> Binding | External | ModuleRef:
        """The binding an import leads to, through re-exports: a value, class or def of the
        package, a module of it, or an External. Other bindings are their own answer."""
        seen: set[tuple[str, str]] = set()
        while binding.kind in ("from", "import"):
            if binding.kind == "import":
                mod = binding.imported
                return ModuleRef(mod) if self.is_internal(mod) else External(mod)
            assert isinstance(binding.node, ast.ImportFrom)
            src = resolve_relative(binding.module, binding.node, self.is_package(binding.module))
            name = binding.imported
            if not self.is_internal(src):
                return External(f"{src}.{name}")
            if (src, name) in seen:
                raise Unresolvable(f"{name!r}: imports in a circle through {src}")
            seen.add((src, name))
            found = self.bindings(src).get(name)
            if found is None:
                if self.is_internal(f"{src}.{name}"):
                    return ModuleRef(f"{src}.{name}")
                raise Unresolvable(f"{name!r} not found in {src}")
            binding = found
        return binding


class Evaluator:
    """Static answers about one SourceTree: see the module's docstring."""

    def __init__(self, tree: SourceTree):
        self.tree = tree

    # -- names -------------------------------------------------------------------------
    def lookup(self, module: str, name: str, local: dict[str, Any] | None = None) -> Any:
        """What ``name`` means in ``module`` (``local`` first: a function's or class's own
        names, an Unresolvable among them re-raised); builtins are External."""
        if local is not None and name in local:
            val = local[name]
            if isinstance(val, Unresolvable):
                raise val
            return val
        if name not in self.tree.bindings(module) and hasattr(builtins, name):
            return External("builtins." + name)
        return self.value_of(self.tree.definition(module, name))

    def value_of(self, found: Binding | External | ModuleRef) -> Any:
        """A binding as a value: evaluated, or a ClassRef / FunctionRef / ModuleRef / External."""
        if isinstance(found, Binding):
            found = self.tree.follow(found)
        if isinstance(found, External | ModuleRef):
            return found
        if found.kind == "value":
            return self.eval(found.node, found.module)
        if found.kind == "class":
            return ClassRef(found.module, found.node)  # type: ignore[arg-type]
        return FunctionRef(found.module, found.node)  # type: ignore[arg-type]

    def import_into(self, stmt: ast.Import | ast.ImportFrom, module: str, local: dict) -> None:
        """A function-level import: its names into ``local`` (an Unresolvable kept as such)."""
        bound: dict[str, Binding] = {}
        _add_bindings(stmt, module, bound)
        for name, binding in bound.items():
            try:
                local[name] = self.value_of(binding)
            except Unresolvable as exc:
                local[name] = exc

    def assign_into(self, stmt: ast.Assign, module: str, local: dict) -> None:
        """``name = expr`` into ``local``: its value, or the Unresolvable saying why not."""
        for tgt in stmt.targets:
            if isinstance(tgt, ast.Name):
                try:
                    local[tgt.id] = self.eval(stmt.value, module, local)
                except Unresolvable as exc:
                    local[tgt.id] = exc

    # -- definitions by name -----------------------------------------------------------
    def find_class(self, module: str, name: str) -> ClassRef:
        """The class ``name`` of ``module``, through imports and re-exports."""
        found = self.value_of(self.tree.definition(module, name))
        if not isinstance(found, ClassRef):
            raise Unresolvable(f"{module}.{name} is not a class of the package")
        return found

    def find_function(self, module: str, name: str) -> FunctionRef:
        """The function ``name`` of ``module``, through imports and re-exports."""
        found = self.tree.definition(module, name)
        if not (isinstance(found, Binding) and found.kind == "def"):
            raise Unresolvable(f"{module}.{name} is not a function of the package")
        return FunctionRef(found.module, found.node)  # type: ignore[arg-type]

    def find_method(self, ref: ClassRef, name: str) -> FunctionRef:
        """The method ``name`` defined in the class's own body (not inherited)."""
        for stmt in ref.node.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
                return FunctionRef(ref.module, stmt)
        raise Unresolvable(f"{ref.node.name}.{name} not found")

    # -- classes -----------------------------------------------------------------------
    def class_attr(self, ref: ClassRef, attr: str) -> Any:
        local: dict[str, Any] = {}
        for stmt in ref.node.body:
            if isinstance(stmt, ast.Assign):
                self.assign_into(stmt, ref.module, local)
        if self.is_enum(ref):
            for member in self.enum_members(ref):
                if member.name == attr:
                    return member
        if attr in local:
            return self.lookup(ref.module, attr, local)
        raise Unresolvable(f"{ref.node.name}.{attr} not found")

    def is_enum(self, ref: ClassRef) -> bool:
        return any(self.qualname(base, ref.module) in _ENUM_BASES for base in ref.node.bases)

    def enum_members(self, ref: ClassRef) -> list[EnumMember]:
        """The members iteration gives, in order (aliases of an earlier value left out)."""
        members: list[EnumMember] = []
        seen_values = []
        auto = 0
        for stmt in ref.node.body:
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            tgt = stmt.targets[0]
            if not isinstance(tgt, ast.Name) or tgt.id.startswith("_"):
                continue
            if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) in _AUTO:
                auto += 1
                value = auto
            else:
                value = self.eval(stmt.value, ref.module)
                if isinstance(value, int):
                    auto = value
            if value in seen_values:  # an alias, not a member of iteration
                continue
            seen_values.append(value)
            members.append(EnumMember(ref.node.name, tgt.id, value))
        return members

    # -- functions ---------------------------------------------------------------------
    def call_function(self, ref: FunctionRef, args: list) -> Any:
        """Evaluate a small helper: function-level imports, then the last return.

        The earlier returns of such helpers (in sglang) are plugin hooks (``sys.modules``
        look-ups), so the unconditional final return is the stock answer."""
        fn = ref.node
        if args or fn.args.args:
            raise Unresolvable(f"call of {fn.name} with arguments")
        local: dict[str, Any] = {}
        last_return = None
        for stmt in fn.body:
            if isinstance(stmt, ast.ImportFrom | ast.Import):
                self.import_into(stmt, ref.module, local)
            elif isinstance(stmt, ast.Return):
                last_return = stmt
        if last_return is None or last_return.value is None:
            raise Unresolvable(f"{fn.name} has no final return")
        return self.eval(last_return.value, ref.module, local)

    # -- expressions -------------------------------------------------------------------
    def eval(self, node: ast.AST, module: str, local: dict[str, Any] | None = None) -> Any:
        """The value of expression ``node`` of ``module`` (``local``: names in scope)."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
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
            raise Unresolvable("f-string")
        if isinstance(node, ast.Name):
            return self.lookup(module, node.id, local)
        if isinstance(node, ast.Attribute):
            return self.attribute(self.eval(node.value, module, local), node.attr)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.BitOr):
            left = self.eval(node.left, module, local)
            right = self.eval(node.right, module, local)
            if isinstance(node.op, ast.Add):
                if isinstance(left, list) and isinstance(right, tuple):
                    raise Unresolvable("list + tuple")
                return left + right
            if isinstance(left, set | frozenset) and isinstance(right, set | frozenset):
                return left | right
            raise Unresolvable("| on non-sets")
        if isinstance(node, ast.Call):
            func = self.eval(node.func, module, local)
            if node.keywords:
                raise Unresolvable("call with keywords")
            return self.call(func, [self.eval(a, module, local) for a in node.args])
        if isinstance(node, ast.ListComp | ast.SetComp):
            return self._comprehension(node, module, local)
        raise Unresolvable(f"unsupported expression {ast.unparse(node)[:60]!r}")

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp, module: str, local: dict[str, Any] | None
    ) -> list | set:
        if len(node.generators) != 1:
            raise Unresolvable("nested comprehension")
        gen = node.generators[0]
        if not isinstance(gen.target, ast.Name) or gen.is_async:
            raise Unresolvable("comprehension target")
        out = []
        for item in self.iterate(self.eval(gen.iter, module, local)):
            inner = dict(local or {})
            inner[gen.target.id] = item
            if all(self.eval(cond, module, inner) for cond in gen.ifs):
                out.append(self.eval(node.elt, module, inner))
        return out if isinstance(node, ast.ListComp) else set(out)

    def attribute(self, base: Any, attr: str) -> Any:
        if isinstance(base, ClassRef):
            return self.class_attr(base, attr)
        if isinstance(base, ModuleRef):
            return self.lookup(base.module, attr)
        if isinstance(base, External):
            return External(f"{base.qualname}.{attr}")
        if isinstance(base, EnumMember):
            if attr == "name":
                return base.name
            if attr == "value":
                return base.value
        if isinstance(base, str) and attr in _STR_METHODS:
            return _StrMethod(base, attr)
        raise Unresolvable(f"attribute {attr!r} of {type(base).__name__}")

    def iterate(self, value: Any) -> Iterable:
        if isinstance(value, ClassRef) and self.is_enum(value):
            return self.enum_members(value)
        if isinstance(value, list | tuple | set | frozenset | dict | str):
            return value
        raise Unresolvable(f"iteration over {type(value).__name__}")

    def call(self, func: Any, args: list) -> Any:
        if isinstance(func, External) and func.qualname.startswith("builtins."):
            name = func.qualname.split(".", 1)[1]
            if name in _BUILTIN_CALLS:
                return _BUILTIN_CALLS[name](
                    *[list(self.iterate(a)) if isinstance(a, ClassRef) else a for a in args]
                )
        if isinstance(func, _StrMethod):
            return getattr(func.obj, func.attr)(*args)
        if isinstance(func, FunctionRef):
            return self.call_function(func, args)
        raise Unresolvable(f"call of {func!r}")

    # -- annotations as types ----------------------------------------------------------
    def qualname(self, node: ast.AST, module: str) -> str:
        """The qualified name a type-ish node names (``typing.Optional``, ``builtins.bool``,
        ``sglang.srt.x.Cls``, ``None``); the node as written when it is none of those."""
        try:
            val = self.eval(node, module)
        except Unresolvable:
            return ast.unparse(node)
        if isinstance(val, External | ClassRef):
            return val.qualname
        if val is None:
            return "None"
        return ast.unparse(node)

    def unwrap_optional(self, node: ast.AST, module: str) -> ast.AST:
        """``Optional[X]`` / ``Union[X, None]`` / ``X | None`` -> ``X`` (only with exactly one
        arm that is not None); any other node as it is."""
        if isinstance(node, ast.Subscript):
            q = self.qualname(node.value, module)
            args = subscript_args(node)
            if q == "typing.Optional" and len(args) == 1:
                return args[0]
            if q == "typing.Union":
                non_none = [a for a in args if not _is_none(a)]
                if len(non_none) == 1:
                    return non_none[0]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            non_none = [a for a in _union_arms(node) if not _is_none(a)]
            if len(non_none) == 1:
                return non_none[0]
        return node

    def literal_values(self, node: ast.AST, module: str) -> list | None:
        """The members of a ``Literal[...]`` annotation, evaluated; None for any other node."""
        if isinstance(node, ast.Subscript) and self.qualname(node.value, module) in _LITERAL:
            return [self.eval(a, module) for a in subscript_args(node)]
        return None

    def is_list_type(self, node: ast.AST, module: str) -> bool:
        """``List[...]``, ``list[...]`` or a bare ``list``."""
        target = node.value if isinstance(node, ast.Subscript) else node
        return self.qualname(target, module) in ("typing.List", "builtins.list", "list")

    def is_bool_type(self, node: ast.AST, module: str) -> bool:
        """A bare ``bool`` that is the builtin (not a module's own ``bool``)."""
        return (
            isinstance(node, ast.Name)
            and node.id == "bool"
            and self.qualname(node, module) in ("bool", "builtins.bool")
        )


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _union_arms(node: ast.AST) -> list[ast.AST]:
    """The arms of ``A | B | C``, left to right."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_arms(node.left) + _union_arms(node.right)
    return [node]
