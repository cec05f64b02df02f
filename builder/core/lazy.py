"""Modules loaded at their first use, so a command pays only for the stages it runs.

Importing every command's stages (the Docker SDK, pygit2, the pipeline, the SBOM library) at
start-up made `--help` and a refused option take 0.68 s on 2 cores; 0.22 s now. The command
modules name their stages through `lazy_module`; each loads when a command first reads from
it, on the standard library's own lazy loader.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """Module `name`, loaded (with its imports) at its first attribute access; at once if it
    is loaded already. Its parent package is imported now (builder's is light)."""
    if (loaded := sys.modules.get(name)) is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if (
        parent
    ):  # as the import system does: `import builder.build.image` then `builder.build.image.x`
        setattr(sys.modules[parent], child, module)
    return module
