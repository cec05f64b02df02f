"""The GPU VM side on Python 3.10 (Ubuntu 22.04's): what can be checked without a 3.10.

No Python 3.10 can be installed here (Debian's mirror has 3.11 and 3.13, PyPI has no
interpreter), so two checks stand in for a run on one: vermin reads every module of the
package for the stdlib names, members and syntax each Python version has, and the one 3.11
module builder imports, tomllib, is taken away from a 3.11 process to show its fallback
(tomli, the parser tomllib was made from) reads the same targets and profiles.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.cli.test_packaging import VM_COMMANDS
from tests.conftest import REPO_ROOT

VERMIN = str(Path(sys.executable).parent / "vermin")  # no `python -m vermin`
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def test_the_package_uses_nothing_python_3_10_lacks() -> None:
    """tomllib is the one exception, left to the fallback test below."""
    checked = subprocess.run(
        [VERMIN, "-t=3.10-", "--violations", "--no-tips",
         "--eval-annotations", "--exclude", "tomllib", str(REPO_ROOT / "builder")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Target versions not met" not in checked.stdout
    assert SpecifierSet(PYPROJECT["requires-python"]).contains("3.10.12")
    tomli = [Requirement(r) for r in PYPROJECT["dependencies"] if r.startswith("tomli")]
    assert [r.marker.evaluate({"python_version": "3.10"}) for r in tomli] == [True]
    assert [r.marker.evaluate({"python_version": "3.11"}) for r in tomli] == [False]


def test_vermin_finds_a_3_11_name(tmp_path) -> None:
    """The check above can fail: a module with datetime.UTC (3.11) does not pass it."""
    module = tmp_path / "uses_utc.py"
    module.write_text("from datetime import UTC\nprint(UTC)\n")
    checked = subprocess.run(
        [VERMIN, "-t=3.10-", "--violations", "--no-tips", str(module)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert checked.returncode != 0 and "datetime.UTC" in checked.stdout


_RENDER = """
import json, sys
if sys.argv[1] == "without-tomllib":
    sys.modules["tomllib"] = None  # as on Python 3.10: `import tomllib` fails
from pathlib import Path
from builder.spec import launch
from builder.spec import launch_profiles
import builder.spec.target
recipes = {}
for target in ("sm120", "sm120-0.5.9"):
    source = Path(sys.argv[2]) / "images" / target / "target.toml"
    builder.spec.target.load_target(Path(sys.argv[2]), target)
    for name in launch_profiles.Profiles.of(source).profiles:
        recipe = launch.resolve(source, name, "i@sha256:" + "0" * 64, launch.Overrides())
        recipes[f"{target}/{name}"] = [list(recipe.args), dict(recipe.env)]
print(json.dumps({"tomli": "tomli" in sys.modules, "recipes": recipes}))
"""


def _render(mode: str) -> dict:
    rendered = subprocess.run(
        [sys.executable, "-c", _RENDER, mode, str(REPO_ROOT)],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
    )  # fmt: skip
    return json.loads(rendered.stdout)


def test_targets_and_profiles_read_the_same_through_tomli() -> None:
    plain, fallback = _render("with-tomllib"), _render("without-tomllib")
    assert not plain["tomli"] and fallback["tomli"]
    assert len(plain["recipes"]) >= 4
    assert fallback["recipes"] == plain["recipes"]


def test_every_vm_command_runs_without_tomllib() -> None:
    for command in VM_COMMANDS:
        shown = subprocess.run(
            [sys.executable, "-c",
             "import sys; sys.modules['tomllib'] = None\n"
             "from builder.cli.main import main; sys.argv[0] = 'builder'; main()",
             *command.split(), "--help"],
            capture_output=True, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
        assert shown.returncode == 0 and f"usage: builder {command}" in shown.stdout, shown.stderr
