"""The layout's import rules (issue #56): a module's path says which machine runs it, and
imports run one way. Read with ast from every module of builder/, `lazy_module("builder.…")`
strings and TYPE_CHECKING imports included (a static tool such as import-linter sees neither).

    core/      imports nothing of builder outside core/
    spec/      core/ only
    build/     spec/ and core/
    site/      spec/ and core/, never build/ (a GPU VM has no `build` extra)
    site/probes/  nothing of builder (they run where builder is not installed)
    upstream/  build/, spec/ and core/, never site/
    cli/       anything; nothing imports cli/ (but `python -m builder`'s __main__)

and no module of core/, spec/, site/, cli/ or a commands/ folder imports a package of the
`build` extra at module level: a VM's `builder` loads without them.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "builder"

MAY_IMPORT = {
    "core": {"core"},
    "spec": {"core", "spec"},
    "build": {"core", "spec", "build"},
    "site": {"core", "spec", "site", "site.probes"},
    "site.probes": {"site.probes"},
    "upstream": {"core", "spec", "build", "upstream"},
    "cli": {"core", "spec", "build", "site", "site.probes", "upstream", "cli"},
}
# The import names of the `build` extra's distributions, where they differ.
IMPORT_NAMES = {
    "setuptools-scm": "setuptools_scm",
    "apache-tvm-ffi": "tvm_ffi",
    "cyclonedx-python-lib": "cyclonedx",
    "rfc3986-validator": "rfc3986_validator",
}

# Imports that break a rule today, each with why it stays (the list only shrinks: a test
# below fails when an entry no longer breaks a rule).
ALLOWED: dict[tuple[str, str], str] = {}


# Import circles left today, each with why (the same rule: an entry that is gone fails).
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool  # a lazy_module("...") string
    runs_at_load: bool  # a module-level import outside TYPE_CHECKING


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
SOURCES = {module: path.read_text() for module, path in MODULES.items()}


def layer(module: str) -> str | None:
    """core, spec, build, site, site.probes, upstream, cli; None for builder/__init__ and
    __main__."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in MAY_IMPORT:
        return None
    if parts[1] == "site" and len(parts) > 2 and parts[2] == "probes":
        return "site.probes"
    return parts[1]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"


def _walk(node: ast.AST, at_load: bool):
    """Every node with whether it runs when the module loads (module level, outside
    functions and TYPE_CHECKING)."""
    for child in ast.iter_child_nodes(node):
        runs = at_load and not isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        )
        runs = runs and not _is_type_checking(child)
        yield child, runs
        yield from _walk(child, runs)


@functools.cache
def imports_of(source: str) -> tuple[tuple[str, int, bool, bool], ...]:
    """(imported name, line, lazy, runs at load) for every import in a module's source."""
    tree = ast.parse(source)
    found: list[tuple[str, int, bool, bool]] = []
    for node, at_load in _walk(tree, True):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, False, at_load) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, node.lineno, False, at_load))
            found += [(f"{node.module}.{a.name}", node.lineno, False, at_load) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "lazy_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno, True, False))
    return tuple(found)


def builder_edges(sources: dict[str, str] = SOURCES) -> list[Edge]:
    edges = []
    for module, source in sources.items():
        for name, line, lazy, at_load in imports_of(source):
            if name in MODULES and name != module:
                edges.append(Edge(module, name, line, lazy, at_load))
    return edges


def violations(sources: dict[str, str] = SOURCES) -> list[tuple[str, str, str]]:
    """(source, target, where and why) for every edge against the rules."""
    found = []
    for edge in builder_edges(sources):
        source, target = layer(edge.source), layer(edge.target)
        where = f"{MODULES[edge.source].relative_to(REPO_ROOT)}:{edge.line}"
        if target == "cli" and edge.source != "builder.__main__" and source != "cli":
            found.append((edge.source, edge.target, f"{where}: nothing imports cli/"))
        elif source is None or target is None:
            if source == "site.probes":
                found.append((edge.source, edge.target, f"{where}: probes import no builder"))
        elif target not in MAY_IMPORT[source]:
            found.append((edge.source, edge.target, f"{where}: {source}/ may not import {target}/"))
    return found


def test_every_import_follows_the_layers() -> None:
    broken = [
        f"{why} ({source} -> {target})"
        for source, target, why in violations()
        if (source, target) not in ALLOWED
    ]
    assert broken == []


def test_every_allowed_exception_still_breaks_a_rule() -> None:
    """An entry that no longer breaks a rule is removed, so the list only shrinks."""
    seen = {(source, target) for source, target, _ in violations()}
    assert [pair for pair in ALLOWED if pair not in seen] == []


def build_only_packages() -> set[str]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    names = set()
    for line in pyproject["project"]["optional-dependencies"]["build"]:
        dist = Requirement(line).name
        names.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return names


def test_the_vm_side_loads_no_build_only_package() -> None:
    """core/, spec/, site/, cli/ and every commands/ folder: none imports a package of the
    `build` extra when it loads (inside a function, lazily or under TYPE_CHECKING is fine)."""
    build_only = build_only_packages()
    assert {"pygit2", "cryptography", "uv", "build"} <= build_only  # the extra was read
    found = []
    for module, path in MODULES.items():
        if layer(module) not in ("core", "spec", "site", "site.probes", "cli") and (
            ".commands" not in module
        ):
            continue
        for name, line, lazy, at_load in imports_of(SOURCES[module]):
            if at_load and not lazy and name.split(".")[0] in build_only:
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {name}")
    assert found == []


def test_every_lazy_module_string_names_a_module() -> None:
    """A typo in a `lazy_module("builder.…")` string fails here, not when the command runs."""
    missing = [
        f"{MODULES[module].relative_to(REPO_ROOT)}:{line}: {name}"
        for module in MODULES
        for name, line, lazy, _ in imports_of(SOURCES[module])
        if lazy and name.startswith("builder") and importlib.util.find_spec(name) is None
    ]
    assert missing == []


def circles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for edge in edges:
        graph[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    """Packages' own names count as edges too (`from builder.site import probes`), and
    imports inside functions: a circle is one however late it closes."""
    found = [frozenset(group) for group in circles(builder_edges())]
    assert [sorted(group) for group in found if group not in ALLOWED_CIRCLES] == []
    assert [sorted(group) for group in ALLOWED_CIRCLES if group not in found] == []


@pytest.mark.parametrize(
    ("source", "import_line"),
    [
        ("builder.core.errors", "from builder.spec import target"),
        ("builder.site.verify", "from builder.build import image"),
        ("builder.spec.target", 'lazy_module("builder.build.wheels")'),
    ],
)
def test_the_check_sees_a_forbidden_import(source: str, import_line: str) -> None:
    """The rules are read, not assumed: one forbidden line added to a module is found."""
    changed = {**SOURCES, source: SOURCES[source] + f"\n{import_line}\n"}
    assert source not in {s for s, _, _ in violations(SOURCES)}
    assert source in {s for s, _, _ in violations(changed)}


def test_every_test_folder_is_collected() -> None:
    """pytest skips folders its norecursedirs names (its default names `build`, which
    tests/build/ is): none of tests/'s folders holding tests may match one."""
    import fnmatch

    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    skipped = config["ini_options"]["norecursedirs"]
    folders = {path.parent for path in (REPO_ROOT / "tests").rglob("test_*.py")}
    hidden = [
        str(folder.relative_to(REPO_ROOT))
        for folder in folders
        for part in folder.relative_to(REPO_ROOT).parts
        if any(fnmatch.fnmatch(part, pattern) for pattern in skipped)
    ]
    assert hidden == []
    assert REPO_ROOT / "tests/build" in folders
