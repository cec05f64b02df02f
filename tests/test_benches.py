"""Every benchmark the READMEs name loads, finds what it takes from builder and the test
helpers, and answers `--help`, in the default run: a moved builder module or a renamed helper
breaks it here, not on the day someone measures. The measurements themselves run in their
smallest form where the default run can afford them: bench/fetch_bench.py whole
(tests/build/test_fetch.py), bench/image_bench.py's no-op comparison (tests/build/test_image.py);
the GPU
checks under `-m gpu` (tests/site/test_gpu.py). The others need a GPU, hours of nvcc, a Python
with sglang and torch, or two engines and five image builds (kernel_reuse.py, whose
scenarios tests/build/test_kernels_shared.py checks one by one)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO_ROOT

BENCH = REPO_ROOT / "bench"
READMES = (REPO_ROOT / "README.md", BENCH / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
NAMED = sorted(
    {name for readme in READMES for name in re.findall(r"bench/(\w+\.py)", readme.read_text())}
)


def test_every_bench_script_is_named_in_a_readme() -> None:
    """A script no README or docs page names is one nobody runs: it goes, or a page says
    what it measures (and the tests below then check it)."""
    assert sorted(path.name for path in BENCH.glob("*.py")) == NAMED


def _ours(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in ("builder", "tests")


def _missing_names(path: Path, module: ModuleType) -> list[str]:
    """What the script takes from this repository's modules (builder's, the tests') and is
    not there: names imported inside functions, which loading the script does not run, and
    `helper.name` uses of a helper module it imported, which no import checks. A name the
    script also binds itself (a local `image = ...`) is not taken to be the module."""
    tree = ast.parse(path.read_text())
    bound = {
        node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
        and isinstance(node.ctx, ast.Store)
    } | {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}  # fmt: skip
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and _ours(node.module):
            source = importlib.import_module(node.module)
            missing += [
                f"{path.name}:{node.lineno}: {node.module}.{alias.name}"
                for alias in node.names
                if not hasattr(source, alias.name)
                and importlib.util.find_spec(f"{node.module}.{alias.name}") is None
            ]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name) and importlib.util.find_spec(alias.name) is None:
                    missing.append(f"{path.name}:{node.lineno}: {alias.name}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id not in bound
        ):
            helper = getattr(module, node.value.id, None)
            if (
                isinstance(helper, ModuleType)
                and _ours(helper.__name__)
                and not hasattr(helper, node.attr)
            ):
                missing.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return missing


@pytest.mark.parametrize("script", NAMED)
def test_a_named_bench_loads_and_answers_help(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = BENCH / script
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put the repository first
    spec.loader.exec_module(module)
    assert _missing_names(path, module) == []
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {script}")
