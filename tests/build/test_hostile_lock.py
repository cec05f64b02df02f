"""Resolving the runtime lock runs no upstream code (#54): uv takes wheels only, a requirement
with only a source distribution is refused in one line naming it, and a target that must take
one names it in `[image] build_from_source`, which the lock records.

The hostile package is a real sdist on a real pypiserver on loopback: its in-tree build
backend writes a marker file the moment any resolver asks it for metadata."""

from __future__ import annotations

import hashlib
import io
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from builder.core.errors import BuilderError
from builder.spec import lockfile
from tests.conftest import REPO_ROOT, Builder
from tests.services import start_pypiserver

TARGET = "sm120-0.5.9"
PLATFORM = "x86_64-manylinux_2_28"


def _sdist_with_a_backend_that_writes(folder: Path, marker: Path) -> None:
    """evilpkg 1.0 as source only: building its metadata writes `marker`."""
    backend = (
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('the build backend ran')\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def prepare_metadata_for_build_wheel(directory, config_settings=None):\n"
        "    info = pathlib.Path(directory) / 'evilpkg-1.0.dist-info'\n"
        "    info.mkdir()\n"
        "    (info / 'METADATA').write_text('Metadata-Version: 2.1\\nName: evilpkg\\n"
        "Version: 1.0\\n')\n"
        "    return info.name\n"
    )
    files = {
        "evilpkg-1.0/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n',
        "evilpkg-1.0/backend.py": backend,
        "evilpkg-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n",
    }
    with tarfile.open(folder / "evilpkg-1.0.tar.gz", "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _wheel_requiring_evilpkg(folder: Path) -> None:
    """goodpkg 1.0, a plain wheel whose one requirement is the source-only evilpkg."""
    files = {
        "goodpkg/__init__.py": "",
        "goodpkg-1.0.dist-info/METADATA": (
            "Metadata-Version: 2.1\nName: goodpkg\nVersion: 1.0\nRequires-Dist: evilpkg\n"
        ),
        "goodpkg-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{name},sha256={hashlib.sha256(text.encode()).hexdigest()},{len(text)}\n"
        for name, text in files.items()
    )
    with zipfile.ZipFile(folder / "goodpkg-1.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("goodpkg-1.0.dist-info/RECORD", record + "goodpkg-1.0.dist-info/RECORD,,\n")


@pytest.fixture
def hostile_index(tmp_path: Path):
    """(index URL, marker): a pypiserver holding evilpkg (sdist only) and goodpkg (a wheel
    requiring it); `marker` exists once evilpkg's build code has run."""
    packages = tmp_path / "packages"
    packages.mkdir()
    marker = tmp_path / "evilpkg-ran"
    _sdist_with_a_backend_that_writes(packages, marker)
    _wheel_requiring_evilpkg(packages)
    process, port = start_pypiserver(packages, tmp_path / "pypiserver.log")
    try:
        yield f"http://127.0.0.1:{port}/simple/", marker
    finally:
        process.terminate()


@pytest.fixture
def project(tmp_path: Path) -> Builder:
    """builder against a copy of images/ and forks/ (no upstream is fetched: the lock is
    resolved from --runtime-requirements)."""
    data = tmp_path / "data"
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, data / folder)
    return Builder(data, tmp_path / "cache", "https://github.com/=file:///nonexistent/", tmp_path)


def _lock(project: Builder, index: str, requirement: str, out: Path):
    requirements = out.with_suffix(".in")
    requirements.write_text(f"{requirement}\n")
    return project.run(
        "lock", "--target", TARGET, "--runtime-requirements", str(requirements),
        "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
        "--python-platform", PLATFORM, "--pip-index-url", index, "--pip-extra-index-url=",
        "--out", str(out), check=False,
    )  # fmt: skip


@pytest.mark.parametrize("requirement", ["evilpkg", "goodpkg"], ids=["asked-for", "a-dependency's"])
def test_a_source_only_requirement_is_refused_and_its_build_code_never_runs(
    project: Builder, hostile_index: tuple[str, Path], tmp_path: Path, requirement: str
) -> None:
    index, marker = hostile_index
    out = tmp_path / "lock.txt"
    result = _lock(project, index, requirement, out)
    assert not marker.exists(), "resolving ran evilpkg's build backend"
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot resolve the runtime lock from {index}: evilpkg has ")
    assert "never builds a source distribution" in last
    assert f"[image] build_from_source of target {TARGET}" in last
    assert not out.exists(), "a refused resolution left a lock"


def test_a_target_that_allows_the_source_gets_it_and_the_lock_records_it(
    project: Builder, hostile_index: tuple[str, Path], tmp_path: Path
) -> None:
    target_file = project.data_dir / "images" / TARGET / "target.toml"
    text = target_file.read_text().replace(
        "[image]\n", '[image]\nbuild_from_source = ["EvilPkg"]\n'
    )
    target_file.write_text(text)
    index, marker = hostile_index
    out = tmp_path / "lock.txt"
    result = _lock(project, index, "goodpkg", out)
    assert result.returncode == 0, result.stderr
    assert marker.exists(), "the allowed source distribution was not the one resolved"
    made = lockfile.parse(out)
    assert set(made.packages) == {"evilpkg", "goodpkg"}
    assert made.builds_from_source == ("evilpkg",)
    assert "# builds from source: evilpkg\n" in made.text


def test_a_lock_made_with_another_allowance_is_stale() -> None:
    inputs = ["numpy<3"]
    made = lockfile.header(
        "sm120", "3.12", PLATFORM, "https://pypi.org/simple", inputs, (), ("numpy",)
    )
    current = lockfile.parse(
        Path("runtime-lock.txt"), made + f"numpy==2.1.0 --hash=sha256:{'b' * 64}\n"
    )
    check = {
        "target": "sm120", "python": "3.12", "platform": PLATFORM,
        "requirements": [Requirement(r) for r in inputs],
    }  # fmt: skip
    lockfile.refuse_stale(current, **check, build_from_source=("numpy",))
    with pytest.raises(BuilderError) as refused:
        lockfile.refuse_stale(current, **check)
    assert str(refused.value) == (
        "runtime-lock.txt: stale lock: resolved with source distributions allowed for numpy, "
        "the target's [image] build_from_source is none; run `builder lock --target sm120` "
        "and review the change"
    )


def test_build_from_source_names_distributions(project: Builder, tmp_path: Path) -> None:
    target_file = project.data_dir / "images" / TARGET / "target.toml"
    target_file.write_text(
        target_file.read_text().replace("[image]\n", '[image]\nbuild_from_source = ["evil pkg"]\n')
    )
    result = _lock(project, "http://127.0.0.1:9/simple/", "numpy", tmp_path / "lock.txt")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {target_file}: field 'image.build_from_source' has 'evil pkg', which is not a "
        "distribution name"
    )
