"""builder's own wheel, published beside the patched wheels, so a GPU VM installs builder
from the site's private index: no checkout, no git.

It is built from the source tree builder runs from, with a local version that names the
sources and the backend that packs them (`0.1.0+src<sha256, 10 hex digits>`): the index
never holds two different files under one name, a changed builder gets a new name, and the
same sources make the same bytes (fixed SOURCE_DATE_EPOCH, fixed modes). PyPI refuses local
versions, so `builder==<that version>` from a mix of indexes can only ever resolve to the
private index's file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import tomllib
except ImportError:  # Python 3.10 (a GPU VM's Ubuntu 22.04): tomli is the same parser
    import tomli as tomllib
from pathlib import Path

from builder import __version__
from builder.build.wheels import BuiltWheel
from builder.core.cache import atomic_copy, sha256_file
from builder.core.errors import BuilderError
from builder.core.identity import PACKAGE

_TEXT = ("pyproject.toml", "README.md", "LICENSE")
_BACKEND = ("setuptools", "wheel", "build")  # another version may pack other bytes
_EPOCH = "315532800"  # 1980-01-01: the oldest time a zip entry can hold
_BUILD_TIMEOUT = 600


def source_root() -> Path | None:
    """The checkout builder runs from (pyproject.toml of project `builder` beside its
    package); None when it runs from an installed wheel."""
    root = PACKAGE.parent
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return None
    return root if project.get("name") == "builder" else None


def _sources(root: Path) -> list[Path]:
    code = [p for p in (root / "builder").rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(code) + [root / name for name in _TEXT]


def source_version(root: Path) -> str:
    """`<version>+src<10 hex digits>` over the sources and the backend that packs them (one
    alphanumeric segment: an all-digit one would be normalised, losing leading zeros)."""
    digest = hashlib.sha256()
    for name in _BACKEND:
        digest.update(f"\0{name}=={importlib.metadata.version(name)}".encode())
    for path in _sources(root):
        digest.update(f"\0{path.relative_to(root).as_posix()}\0".encode())
        digest.update(path.read_bytes())
    return f"{__version__}+src{digest.hexdigest()[:10]}"


def build(cache_dir: Path) -> BuiltWheel | None:
    """builder's wheel for its sources (cached by version); None outside a checkout."""
    root = source_root()
    if root is None:
        return None
    version = source_version(root)
    folder = cache_dir / "builder-wheel" / version
    found = sorted(folder.glob("builder-*.whl")) if folder.is_dir() else []
    if len(found) == 1:
        return _built(found[0], version, cached=True)
    with tempfile.TemporaryDirectory(prefix="builder-self-wheel-") as tmp:
        tree = Path(tmp) / "src"
        for path in _sources(root):
            copy = tree / path.relative_to(root)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
            copy.chmod(0o644)  # the wheel records modes: not this checkout's
        init = tree / "builder" / "__init__.py"
        text, count = re.subn(
            r'^__version__ = "[^"]*"$', f'__version__ = "{version}"', init.read_text(), flags=re.M
        )
        if count != 1:
            raise BuilderError(f"{root / 'builder/__init__.py'}: no __version__ line to set")
        init.write_text(text)
        out = Path(tmp) / "out"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "build", "--wheel", "--no-isolation",
                 "--outdir", str(out), str(tree)],
                capture_output=True, text=True, timeout=_BUILD_TIMEOUT,
                env={**os.environ, "SOURCE_DATE_EPOCH": _EPOCH, "PYTHONHASHSEED": "0"},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BuilderError(f"builder's own wheel: no result in {_BUILD_TIMEOUT} s") from None
        wheels = sorted(out.glob("builder-*.whl")) if done.returncode == 0 else []
        if len(wheels) != 1:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise BuilderError(f"builder's own wheel did not build: {' | '.join(tail)}")
        atomic_copy(wheels[0], folder / wheels[0].name)
    return _built(folder / wheels[0].name, version, cached=False)


def _built(path: Path, version: str, cached: bool) -> BuiltWheel:
    return BuiltWheel(
        name="builder",
        dist_name="builder",
        version=version,
        filename=path.name,
        sha256=sha256_file(path),
        size=path.stat().st_size,
        cache_key=version,
        cached=cached,
        path=path,
    )
