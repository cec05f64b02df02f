"""Every benchmark the READMEs name loads, finds what it uses in builder and the test helpers,
and parses its arguments, in the default run: a moved builder module or a renamed helper
breaks it here, not on the day someone measures. The measurements themselves run in their
smallest form where the default run can afford them: bench/fetch_bench.py whole
(tests/test_fetch.py), bench/image_bench.py's no-op comparison (tests/test_image.py). The
others need a GPU, hours of nvcc, or two engines and five image builds (kernel_reuse.py,
whose scenarios tests/test_kernels_shared.py checks one by one)."""

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
READMES = (REPO_ROOT / "README.md", BENCH / "README.md")
NAMED = sorted(
    {name for readme in READMES for name in re.findall(r"bench/(\w+\.py)", readme.read_text())}
)


def test_every_bench_script_is_named_in_a_readme() -> None:
    """A script no README names is one nobody runs: it goes, or the README says what it
    measures (and the tests below then check it)."""
    assert sorted(path.name for path in BENCH.glob("*.py")) == NAMED


def _missing_attributes(path: Path, module: ModuleType) -> list[str]:
    """`helper.name` uses in the script whose helper is one of this repository's modules
    (builder's, the tests') and has no `name`: what an import alone does not catch."""
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            helper = getattr(module, node.value.id, None)
            if (
                isinstance(helper, ModuleType)
                and helper.__name__.split(".")[0] in ("builder", "tests")
                and not hasattr(helper, node.attr)
            ):
                missing.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return missing


@pytest.mark.parametrize("script", NAMED)
def test_a_named_bench_loads_and_parses_its_arguments(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = BENCH / script
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _missing_attributes(path, module) == []
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {script}")
