"""Where sglang reaches into FlashInfer, per file: the FlashInfer names its server code
imports or uses (`from flashinfer.jit.mla import gen_sparse_mla_sm120_module`,
`flashinfer.comm.trtllm_allreduce_fusion(...)`), read with `ast` from a release's files.

Two releases' sets, diffed, list what a new release starts or stops calling: a new or
renamed FlashInfer module is named for review (the target's JIT list may need it), without
running anything.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass

# sglang's server code (0.5.23 keeps its attention kernels' wrappers in sglang/kernels).
PREFIXES = ("sglang/srt/", "sglang/kernels/")
_ROOT = "flashinfer"
_FALLBACK = re.compile(
    r"\b(?:from\s+(flashinfer[\w.]*)\s+import\s+([\w, ]+)|(flashinfer(?:\.\w+)+))"
)


def _statements(body: list[ast.stmt]):
    """Every statement, nested ones included (imports sit in functions too); expressions,
    where most of a module's nodes are, are not visited."""
    for statement in body:
        yield statement
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(statement, name, None) or [])
        for handler in getattr(statement, "handlers", None) or []:
            yield from _statements(handler.body)
        for case in getattr(statement, "cases", None) or []:
            yield from _statements(case.body)


def file_references(text: str) -> set[str]:
    """FlashInfer names one file uses: `module:name` for an imported name, the dotted path
    for an attribute reached through an imported FlashInfer module (by pattern: comments
    count too), the module for a bare import that is never used further."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # newer syntax than this
        # Python's, a NUL byte, nesting too deep for its parser: the names, by pattern
        found = set()
        for module, names, dotted in _FALLBACK.findall(text):
            if dotted:
                found.add(dotted)
            found.update(f"{module}:{n.strip()}" for n in names.split(",") if n.strip())
        return found
    found: set[str] = set()
    modules: dict[str, str] = {}  # local name -> FlashInfer module it is bound to
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == _ROOT or node.module.startswith(_ROOT + "."):
                for alias in node.names:
                    found.add(f"{node.module}:{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == _ROOT or alias.name.startswith(_ROOT + "."):
                    found.add(alias.name)
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else _ROOT
    for local, module in modules.items():
        for chain in re.findall(rf"(?<![\w.]){re.escape(local)}((?:\.\w+)+)", text):
            found.add(module + chain)
    return _longest(found)


def _longest(names: set[str]) -> set[str]:
    """`flashinfer.comm.x` makes `flashinfer.comm` and `flashinfer` redundant."""
    return {n for n in names if not any(o != n and o.startswith(n + ".") for o in names)}


_IMPORTS = re.compile(r"\b(?:from|import)\s+flashinfer\b")


def text_references(text: str) -> set[str]:
    """file_references for a file that imports FlashInfer at all (most files that name it
    only compare a backend's name with the string "flashinfer")."""
    return file_references(text) if _ROOT in text and _IMPORTS.search(text) else set()


def references(files: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """{path: FlashInfer names} over (path, text) pairs, for files that use FlashInfer."""
    found = {}
    for path, text in files:
        names = text_references(text)
        if names:
            found[path] = names
    return found


@dataclass(frozen=True)
class CallSiteDiff:
    added: dict[str, list[str]]  # name -> files using it in the new release only
    removed: dict[str, list[str]]  # name -> files that used it in the old release
    files: int  # files of the new release that use FlashInfer

    def to_json(self) -> dict:
        return {"added": self.added, "removed": self.removed, "files": self.files}


def diff(old: dict[str, set[str]], new: dict[str, set[str]]) -> CallSiteDiff:
    """Names the new release uses that the old one did not (and the reverse), with files."""

    def users(found: dict[str, set[str]]) -> dict[str, list[str]]:
        by_name: dict[str, list[str]] = {}
        for path, names in sorted(found.items()):
            for name in names:
                by_name.setdefault(name, []).append(path)
        return by_name

    before, after = users(old), users(new)
    return CallSiteDiff(
        added={n: after[n] for n in sorted(after.keys() - before.keys())},
        removed={n: before[n] for n in sorted(before.keys() - after.keys())},
        files=len(new),
    )
