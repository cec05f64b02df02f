"""Does each `[[jit.modules]]` generator still exist in a FlashInfer source, with the
arguments the target lists? Read with `ast`, never imported (no torch, no CUDA needed).

A generator is `package.module:function` or `package.module:function(args)`; it is
present when `function` is defined in the module (or imported into it from another module
of the package) and the listed arguments bind to its parameters as a call would.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from builder.core.errors import BuilderError

# path inside the source ("flashinfer/jit/mla.py") -> its text, or None when absent
SourceReader = Callable[[str], str | None]
_MAX_HOPS = 4  # re-exports followed from the named module


@dataclass(frozen=True)
class GeneratorCheck:
    generator: str
    status: str  # present | missing | arguments
    detail: str = ""

    def to_json(self) -> dict:
        return {"generator": self.generator, "status": self.status, "detail": self.detail}


def split_generator(generator: str) -> tuple[str, str, ast.Call]:
    """(module, function, the listed call) of `package.module:function(args)`; a bare
    `package.module:function` is called with no arguments (as the image's warm-up does)."""
    module, _, rest = generator.partition(":")
    function = rest.partition("(")[0].strip()
    try:
        parsed = ast.parse(rest.strip(), mode="eval").body
    except SyntaxError:
        parsed = None
    if isinstance(parsed, ast.Call):
        return module, function, parsed
    return module, function, ast.Call(func=ast.Name(function), args=[], keywords=[])


def _module_paths(module: str) -> tuple[str, str]:
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def find_function(read: SourceReader, module: str, name: str) -> ast.FunctionDef | None:
    """`name`'s definition in `module`, following `from .x import name` re-exports."""
    for _ in range(_MAX_HOPS):
        text, is_package = None, False
        for path in _module_paths(module):
            text = read(path)
            if text is not None:
                is_package = path.endswith("__init__.py")
                break
        if text is None:
            return None
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError) as exc:  # a release in newer Python than this one
            raise BuilderError(f"{path}: cannot be read by this Python ({exc})") from None
        except (RecursionError, MemoryError):  # the parser's answer to deep nesting
            raise BuilderError(f"{path}: nested too deeply to parse") from None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node  # type: ignore[return-value]
        imported = next(
            (
                (_absolute(module, is_package, node), alias.name)
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                for alias in node.names
                if (alias.asname or alias.name) == name
            ),
            None,
        )
        if imported is None:
            return None
        module, name = imported
    return None


def binding_problem(function: ast.FunctionDef, call: ast.Call) -> str:
    """Why `call`'s arguments would not bind to `function`'s parameters ("" when they do)."""
    spec = function.args
    positional = [a.arg for a in (*spec.posonlyargs, *spec.args)]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return ""  # *args / **kwargs in the listed call: nothing to count
    given = len(call.args)
    if given > len(positional) and spec.vararg is None:
        return f"takes {len(positional)} positional arguments, the list passes {given}"
    named = {k.arg for k in call.keywords}
    keywords = {a.arg for a in spec.args} | {a.arg for a in spec.kwonlyargs}
    unknown = sorted(n for n in named if n not in keywords)
    if unknown and spec.kwarg is None:
        return f"has no parameter {', '.join(unknown)}"
    filled = set(positional[:given]) | named
    required = positional[: len(positional) - len(spec.defaults)]
    required += [a.arg for a, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=True) if d is None]
    missing = [name for name in required if name not in filled]
    if missing:
        return f"now also needs {', '.join(missing)}"
    return ""


def check_generators(generators: Iterable[str], read: SourceReader) -> list[GeneratorCheck]:
    """Each generator against the source `read` gives."""
    checks = []
    for generator in generators:
        module, name, call = split_generator(generator)
        function = find_function(read, module, name)
        if function is None:
            checks.append(GeneratorCheck(generator, "missing", f"no {name} in {module}"))
            continue
        problem = binding_problem(function, call)
        if problem:
            checks.append(GeneratorCheck(generator, "arguments", f"{name} {problem}"))
        else:
            checks.append(GeneratorCheck(generator, "present"))
    return checks
