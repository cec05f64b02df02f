"""TOML files read with one error shape; tomllib, or tomli on Python 3.10 (a GPU VM's Ubuntu
22.04)."""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10 (a GPU VM's Ubuntu 22.04): tomli is the same parser
    import tomli as tomllib
from pathlib import Path
from typing import Any

from builder.core.errors import BuilderError


def load_toml(path: Path) -> dict[str, Any]:
    """A TOML file; a missing or broken one is one BuilderError naming it."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise BuilderError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise BuilderError(f"{path}: not valid TOML ({exc})") from None
