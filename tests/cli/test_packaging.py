"""builder as an operator installs it: from a wheel (`pip install .` or `pip install git+…`),
not an editable checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import builder
from builder.build import self_wheel
from tests.conftest import REPO_ROOT


def test_the_wheel_holds_every_module_and_its_cli_runs(tmp_path: Path) -> None:
    source_tree = tmp_path / "src"  # a clean copy: no build/ left over from another build
    shutil.copytree(
        REPO_ROOT / "builder", source_tree / "builder",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, source_tree)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path),
         str(source_tree)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("builder-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
        (license_file,) = [
            n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")
        ]
        assert "Apache License" in archive.read(license_file).decode()
        assert "builder/__main__.py" in shipped  # `python -m builder`
        archive.extractall(tmp_path / "site", [n for n in archive.namelist() if n.endswith(".py")])
    source = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "builder").rglob("*.py")}
    assert source - shipped == set()  # a subpackage was once missing from `pip install .`
    result = subprocess.run(
        [sys.executable, "-I", "-c", EVERY_HELP.format(site=str(tmp_path / "site"))],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split()
    assert {"image", "launch", "doctor", "patches check", "jit keygen"} <= set(
        " ".join(c.split("/")) for c in commands
    ), commands


# Every command's and action's --help, run from the wheel's files alone (each must exit 0).
EVERY_HELP = """
import argparse, contextlib, io, sys
sys.path[:0] = [{site!r}]
import builder.cli.main
assert builder.cli.main.__file__.startswith({site!r}), builder.cli.main.__file__

def walk(parser, prefix):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + [name]
                yield from walk(sub, prefix + [name])

for words in walk(builder.cli.main.build_parser(), []):
    sys.argv = ["builder", *words, "--help"]
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        try:
            builder.cli.main.main()
        except SystemExit as done:
            assert done.code == 0, (words, done.code)
    assert "usage: builder " + " ".join(words) in shown.getvalue(), words
    print("/".join(words))
"""


def test_builder_s_own_wheel_is_named_by_its_sources_and_made_the_same_twice(
    tmp_path: Path,
) -> None:
    """What `publish` uploads beside the patched wheels: a changed builder is a new
    version, never a second file under an old name."""
    first = self_wheel.build(tmp_path / "one")
    second = self_wheel.build(tmp_path / "two")
    assert first.version == self_wheel.source_version(REPO_ROOT)
    assert first.version.startswith(f"{builder.__version__}+src")
    assert (first.filename, first.sha256) == (second.filename, second.sha256)
    assert self_wheel.build(tmp_path / "one").cached
    with zipfile.ZipFile(first.path) as archive:
        init = archive.read("builder/__init__.py").decode()
    assert f'__version__ = "{first.version}"' in init


VM_COMMANDS = ("launch", "deploy-files", "doctor", "wait-ready", "verify", "qualify", "jit harvest")


def test_the_gpu_vm_install_is_small_and_runs_every_vm_command(tmp_path: Path) -> None:
    """`pip install builder` on a GPU VM: the VM's commands and nothing of the build host's
    (pygit2, build, uv, cyclonedx ... are the `build` extra). Installed from the wheel into a
    fresh venv with its dependencies from the index, as an operator would."""
    wheel = self_wheel.build(tmp_path / "wheel").path
    venv = tmp_path / "vm"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    listed = subprocess.run(
        [str(uv), "pip", "list", "--python", str(venv / "bin" / "python"), "--format", "json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    packages = {p["name"].lower() for p in json.loads(listed)}
    assert "builder" in packages and not packages & {"pygit2", "build", "uv", "cryptography"}
    assert len(packages) <= 15, sorted(packages)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert size <= 30 << 20, f"{size / (1 << 20):.1f} MB"
    builder_cli = venv / "bin" / "builder"
    for command in VM_COMMANDS:
        shown = subprocess.run(
            [str(builder_cli), *command.split(), "--help"], capture_output=True, text=True
        )
        assert shown.returncode == 0 and f"usage: builder {command}" in shown.stdout, shown.stderr
    # Its version names the wheel's sources; no word of pygit2, which a VM never needs.
    version = subprocess.run([str(builder_cli), "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == (
        f"builder {self_wheel.source_version(self_wheel.source_root())} (installed, no git checkout: the version names its "
        "sources)"
    ), version.stdout + version.stderr
    # A build host's command says what to install, in one line (not a traceback).
    refused = subprocess.run(
        [str(builder_cli), "image", "--target", "sm120"], capture_output=True, text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("error: builder image runs on a build host: this install")
    assert "pip install 'builder[build]'" in refused.stderr
