"""Does each `[[jit.modules]]` generator still exist in a FlashInfer source, with the
arguments the target lists? Read with `ast`, never imported (no torch, no CUDA needed).

A generator is `package.module:function` or `package.module:function(args)`; it is
present when `function` is defined in the module (or imported into it from another module
of the package: `builder.upstream.pysource` follows the imports) and the listed arguments
bind to its parameters as a call would.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from builder.upstream.pysource import Evaluator, SourceTree, Unresolvable

# path inside the source ("flashinfer/jit/mla.py") -> its text, or None when absent
SourceReader = Callable[[str], str | None]


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


class _ReaderFiles:
    """Package ``top``'s files from a reader of the whole source (a wheel's members), as
    pysource's PackageFiles: each file read once, when first asked for."""

    def __init__(self, read: SourceReader, top: str):
        self._read, self.top = read, top
        self._texts: dict[str, str | None] = {}

    def _text(self, relative: str) -> str | None:
        if relative not in self._texts:
            self._texts[relative] = self._read(f"{self.top}/{relative}")
        return self._texts[relative]

    def is_file(self, relative: str) -> bool:
        return self._text(relative) is not None

    def read(self, relative: str) -> str:
        text = self._text(relative)
        assert text is not None, relative  # pysource reads only what is_file found
        return text


class _Source:
    """One source's packages, each parsed as it is first named (flashinfer, ...)."""

    def __init__(self, read: SourceReader):
        self.read = read
        self._packages: dict[str, Evaluator] = {}

    def function(self, module: str, name: str) -> ast.FunctionDef | None:
        """`name`'s definition in `module`, following imports and re-exports (None when the
        module or the function is not in the source)."""
        top = module.split(".")[0]
        if top not in self._packages:
            self._packages[top] = Evaluator(SourceTree(_ReaderFiles(self.read, top), top))
        try:
            return self._packages[top].find_function(module, name).node
        except Unresolvable:
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
    source = _Source(read)
    for generator in generators:
        module, name, call = split_generator(generator)
        function = source.function(module, name)
        if function is None:
            checks.append(GeneratorCheck(generator, "missing", f"no {name} in {module}"))
            continue
        problem = binding_problem(function, call)
        if problem:
            checks.append(GeneratorCheck(generator, "arguments", f"{name} {problem}"))
        else:
            checks.append(GeneratorCheck(generator, "present"))
    return checks
