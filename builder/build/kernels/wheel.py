"""Stage 4b: the compiled FlashInfer modules as a wheel tied to one flashinfer build.

The distribution is `flashinfer-jit-cache`, the name FlashInfer itself looks for: when the
package is installed, FlashInfer loads `<its folder>/<name>/<name>.so` for every module it
holds and never starts ninja (flashinfer/jit/env.py, core.py). Ours differs from the
official one in three ways:
- its version is the flashinfer build's plus a content tag, `0.7.2+sm120.g1a2b3c4.k<8 hex>`
  (the `k` part hashes every module's sha256), so one version means one set of bytes;
- it requires exactly that flashinfer build (`flashinfer-python==0.7.2+sm120.g1a2b3c4`), so
  pip refuses a mismatch, and at import it serves its folder only next to that build
  (0.6.x calls `get_jit_cache_dir()`, 0.7.x `get_jit_cache_providers()`: one provider with
  the arch list in FlashInfer's spelling, sm120f, and the module names);
- it holds only what the target's list (and kernel packs) name, compiled for its arch.

The wheel is reproducible: fixed timestamps and modes, files in sorted order.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from builder import __version__
from builder.build.wheelfiles import write_wheel
from builder.build.wheels import BuiltWheel
from builder.core.cache import sha256_file
from builder.core.errors import BuilderError

DIST_NAME = "flashinfer-jit-cache"
PACKAGE = "flashinfer_jit_cache"
PLATFORM_TAG = "linux_x86_64"

_INIT = '''"""FlashInfer kernels built by builder for {flashinfer_dist} {flashinfer_version}
({arch}, nvcc {nvcc}). Loaded by FlashInfer without compiling: 0.6.x from
get_jit_cache_dir(), 0.7.x from get_jit_cache_providers()."""

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

KERNELS_VERSION = "{version}"
FLASHINFER_BUILD = "{flashinfer_version}"
# What FlashInfer compares with its own version (0.6.x: a prefix; 0.7.x: equal, or
# "<version>+..."); the exact build is checked below.
__version__ = FLASHINFER_BUILD
CUDA_ARCHITECTURES = {cuda_architectures!r}
MODULES = {modules!r}


def get_jit_cache_dir() -> str:
    """The AOT folder, only next to the exact flashinfer build these kernels came from."""
    try:
        installed = version("{flashinfer_dist}")
    except PackageNotFoundError:
        installed = None
    if installed != FLASHINFER_BUILD:
        raise RuntimeError(
            f"flashinfer-jit-cache {{KERNELS_VERSION}} holds kernels built for {flashinfer_dist} "
            f"{{FLASHINFER_BUILD}}, but {{installed}} is installed: install the kernel wheel "
            "that the builder manifest records for this flashinfer build"
        )
    return str(Path(__file__).parent / "jit_cache")


@dataclass(frozen=True)
class JitCacheProvider:
    provider_id: str
    distribution: str
    version: str
    jit_cache_dir: Path
    cuda_architectures: frozenset
    modules: frozenset


def get_jit_cache_providers() -> tuple:
    """FlashInfer 0.7.x (flashinfer/jit/env.py _get_aot_providers): this wheel as its one
    provider; none next to another flashinfer build (an exception here would fail
    `import flashinfer`, so the mismatch is FlashInfer's warning and a compile instead)."""
    try:
        folder = Path(get_jit_cache_dir()).resolve()
    except RuntimeError:
        return ()
    return (
        JitCacheProvider(
            provider_id="builder",
            distribution="flashinfer-jit-cache",
            version=__version__,
            jit_cache_dir=folder,
            cuda_architectures=frozenset(CUDA_ARCHITECTURES),
            modules=frozenset(MODULES),
        ),
    )
'''


# What a module is, not how this run got it (compiled here, reused, pulled): the wheel is
# the same on every host that has the same kernels.
_STABLE_MODULE_FIELDS = ("module", "name", "file", "size", "sha256", "arch", "device_code", "key")
_STABLE_FIELDS = ("arch_list", "nvcc_version", "flashinfer_version")


def stable_inventory(inventory: dict) -> dict:
    return {
        **{field: inventory[field] for field in _STABLE_FIELDS},
        "modules": [
            {field: module[field] for field in _STABLE_MODULE_FIELDS if field in module}
            for module in sorted(inventory["modules"], key=lambda m: m["name"])
        ],
    }


def kernel_version(flashinfer_version: str, inventory: dict) -> str:
    """The flashinfer build's version plus `k` and 8 hex of every module's sha256: one
    version, one set of bytes (nvcc output differs between compiles of the same inputs).
    `.k…` extends a local label (0.7.2+sm120.g1a2b3c4.k…); a build without one starts it
    (0.7.2+k…): `0.7.2.k…` is no PEP 440 version."""
    digests = sorted((module["name"], module["sha256"]) for module in inventory["modules"])
    tag = hashlib.sha256(json.dumps(digests).encode()).hexdigest()[:8]
    return f"{flashinfer_version}{'.' if '+' in flashinfer_version else '+'}k{tag}"


def provider_arch(arch: str) -> str:
    """FLASHINFER_CUDA_ARCH_LIST's spelling in FlashInfer 0.7's: 9.0a -> sm90a, 12.0f -> sm120f."""
    major, _, minor = arch.partition(".")
    return f"sm{major}{minor}"


def build_kernel_wheel(
    modules_dir: Path, inventory: dict, flashinfer: BuiltWheel, target_name: str, out: Path
) -> BuiltWheel:
    """`flashinfer_jit_cache-<version>-py3-none-linux_x86_64.whl` in `out`, from the
    `<name>/<name>.so` files under `modules_dir` that `inventory` lists (sha256-checked)."""
    version = kernel_version(flashinfer.version, inventory)
    filename = f"{PACKAGE}-{version}-py3-none-{PLATFORM_TAG}.whl"
    files: dict[str, bytes] = {}
    for module in sorted(inventory["modules"], key=lambda m: m["name"]):
        library = modules_dir / module["name"] / f"{module['name']}.so"
        if not library.is_file() or sha256_file(library) != module["sha256"]:
            raise BuilderError(f"kernel wheel: {library} is missing or not what was built")
        files[f"{PACKAGE}/jit_cache/{module['name']}/{module['name']}.so"] = library.read_bytes()
    init = _INIT.format(
        flashinfer_dist=flashinfer.dist_name,
        flashinfer_version=flashinfer.version,
        arch=" ".join(inventory["arch_list"]),
        nvcc=inventory["nvcc_version"],
        version=version,
        cuda_architectures=sorted(provider_arch(arch) for arch in inventory["arch_list"]),
        modules=sorted(module["name"] for module in inventory["modules"]),
    )
    files[f"{PACKAGE}/__init__.py"] = init.encode()
    files[f"{PACKAGE}/inventory.json"] = json.dumps(
        stable_inventory(inventory), indent=2, sort_keys=True
    ).encode()
    dist_info = f"{PACKAGE}-{version}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {DIST_NAME}\n"
        f"Version: {version}\n"
        f"Summary: FlashInfer kernels for target {target_name} "
        f"({' '.join(inventory['arch_list'])}), built by builder\n"
        f"Requires-Dist: {flashinfer.dist_name}=={flashinfer.version}\n"
    )
    files[f"{dist_info}/METADATA"] = metadata.encode()
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: builder {__version__}\nRoot-Is-Purelib: false\n"
        f"Tag: py3-none-{PLATFORM_TAG}\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = f"{PACKAGE}\n".encode()

    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    with tempfile.TemporaryDirectory(prefix=".kernel-wheel-", dir=out) as staging:
        partial = Path(staging) / filename  # WheelFile reads name and version from it
        write_wheel(
            partial, {n: (d, 0o755 if n.endswith(".so") else 0o644) for n, d in files.items()}
        )
        partial.replace(path)
    digest = sha256_file(path)
    return BuiltWheel(
        name="kernels",
        dist_name=DIST_NAME,
        version=version,
        filename=filename,
        sha256=digest,
        size=path.stat().st_size,
        cache_key=version,
        cached=False,
        path=path,
    )
