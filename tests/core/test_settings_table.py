"""One table of every environment variable builder reads (builder/core/settings.py
ENVIRONMENT): every BUILDER_* name in builder's code is in it, and `--help`'s epilog and
docs/settings.md show exactly it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from builder.core.settings import ENVIRONMENT
from tests.conftest import REPO_ROOT

NAMES = [name for name, _ in ENVIRONMENT]


def _builder_names_in_code() -> set[str]:
    found = set()
    for path in (REPO_ROOT / "builder").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= set(re.findall(r"\bBUILDER_[A-Z0-9]+(?:_[A-Z0-9]+)*\b", node.value))
    return found


def test_every_variable_the_code_names_is_in_the_table() -> None:
    assert _builder_names_in_code() - set(NAMES) == set()
    assert len(NAMES) == len(set(NAMES))


def test_help_shows_the_table() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "builder", "--help"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout
    epilog = shown.split("\nenvironment:\n", 1)[1].split("\nconfig file:", 1)[0]
    listed = [line.split()[0] for line in epilog.splitlines() if not line.startswith(" " * 4)]
    assert listed == NAMES
    flat = " ".join(epilog.split())
    for name, meaning in ENVIRONMENT:
        assert f"{name} {' '.join(meaning.split())}" in flat, name


def test_the_settings_page_shows_the_table() -> None:
    page = (REPO_ROOT / "docs/settings.md").read_text()
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| (.*) \|$", page, re.M)
    assert rows == list(ENVIRONMENT)
