"""builder as an operator installs it: from a wheel (`pip install .` or `pip install git+…`),
not an editable checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO_ROOT


def test_the_wheel_holds_every_module_and_its_cli_runs(tmp_path: Path) -> None:
    source_tree = tmp_path / "src"  # a clean copy: no build/ left over from another build
    shutil.copytree(
        REPO_ROOT / "builder", source_tree / "builder",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source_tree)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path),
         str(source_tree)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("builder-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
        archive.extractall(tmp_path / "site", [n for n in archive.namelist() if n.endswith(".py")])
    source = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "builder").rglob("*.py")}
    assert source - shipped == set()  # builder.commands was missing from `pip install .`
    result = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path[:0] = [{str(tmp_path / 'site')!r}]; "
         "from builder.cli import main; sys.argv = ['builder', 'launch', '--help']; main()"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage: builder launch" in result.stdout
