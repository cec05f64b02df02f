"""What a running server compiled anyway: `compiled_in_container` compares a server's
FlashInfer workspace against the image's, so a kernel compiled at start-up is named, and a
kernel pack (`builder jit harvest`) carries it into the next image.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from builder.cache import partial_beside
from builder.errors import BuilderError

PACK_SUFFIX = ".kernel-pack.tar"
_DEFAULT_WORKSPACE = "/root"  # FlashInfer's default base is $HOME; the image sets its own


@dataclass(frozen=True)
class CompiledModule:
    """A module a server compiled itself: `<base>/.cache/flashinfer/<version>/<arch>/
    cached_ops/<name>/<name>.so` appeared or changed after the image was built."""

    flashinfer_version: str
    arch: str
    name: str
    directory: str  # absolute, inside the container or on this machine


def _parse_module_path(path: str, cache_root: str) -> CompiledModule | None:
    if not path.startswith(cache_root) or not path.endswith(".so"):
        return None
    parts = path[len(cache_root) :].split("/")
    if len(parts) == 5 and parts[2] == "cached_ops" and parts[4] == f"{parts[3]}.so":
        directory = cache_root + "/".join(parts[:4])
        return CompiledModule(parts[0], parts[1], parts[3], directory)
    return None


def _container_cache_root(container) -> str:
    # `-e NAME` with NAME unset on the host (docker run -e HF_TOKEN) leaves a bare "NAME".
    env = dict(item.partition("=")[::2] for item in container.attrs["Config"].get("Env") or [])
    base = env.get("FLASHINFER_WORKSPACE_BASE") or _DEFAULT_WORKSPACE
    return f"{base.rstrip('/')}/.cache/flashinfer/"


def compiled_in_container(container) -> list[CompiledModule]:
    """Modules the container compiled since it started from its image: the container's
    FlashInfer workspace against the image's (`docker diff`, so it works on a stopped or
    crashed container too). A module baked into the image and loaded as is never shows."""
    root = _container_cache_root(container)
    found = {}
    for change in container.diff() or []:
        if change["Kind"] in (0, 1):  # changed or added; 2 is deleted
            module = _parse_module_path(change["Path"], root)
            if module:
                found[module.name] = module
    return [found[name] for name in sorted(found)]


def compiled_in_workspace(workspace: Path) -> list[CompiledModule]:
    """Every compiled module under a FlashInfer workspace base on this machine."""
    root = f"{workspace.resolve()}/.cache/flashinfer/"
    found = []
    for library in sorted(Path(root).glob("*/*/cached_ops/*/*.so")):
        module = _parse_module_path(str(library), root)
        if module:
            found.append(module)
    return found


def write_pack(
    modules: list[CompiledModule], files: dict[str, tuple[bytes, int, int]], out: Path, origin: str
) -> Path:
    """A kernel pack: `pack.json` (flashinfer version, arch, modules, sha256 of every file)
    and each module's whole build state (`cached_ops/<name>/`: the .so, the object files,
    build.ninja and ninja's logs that make ninja see no work; under `generated/`, the sources
    FlashInfer generated for it), as one tar named by its content. `files` maps paths relative to
    `<version>/<arch>/` to (bytes, mode, mtime); mtimes are kept, ninja compares them."""
    versions = {(m.flashinfer_version, m.arch) for m in modules}
    if len(versions) != 1:
        raise BuilderError(f"modules of several flashinfer builds or arches: {sorted(versions)}")
    for name in files:
        _pack_member_name(name, origin)
    ((version, arch),) = versions
    record = {
        "schema_version": 1,
        "flashinfer_version": version,
        "arch": arch,
        "modules": [m.name for m in modules],
        "origin": origin,
        "files": {name: hashlib.sha256(files[name][0]).hexdigest() for name in sorted(files)},
    }
    body = _record_body(record)
    key = _record_key(record)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"flashinfer-{version}-{arch}-{key}{PACK_SUFFIX}"
    entries = {"pack.json": (body, 0o644, 0), **{name: files[name] for name in sorted(files)}}
    with partial_beside(path) as partial, tarfile.open(
        partial, "w", format=tarfile.PAX_FORMAT
    ) as tar:
        for name, (data, mode, mtime) in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            tar.addfile(info, io.BytesIO(data))
    return path


_PACK_FOLDERS = (("cached_ops",), ("generated",))


def _pack_member_name(name: str, origin: str) -> str:
    """A pack holds `cached_ops/...` and `generated/...` under the arch folder, nothing else:
    what a server's workspace hands over never names a file outside it."""
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or parts[:1] not in _PACK_FOLDERS:
        raise BuilderError(f"{origin}: {name!r} lies outside the module's build folders: refused")
    return name


def _inside(path: Path, root: Path, origin: str) -> Path:
    """`path`, a plain file under `root` (no link, no `..` out of it)."""
    if path.is_symlink() or not path.resolve().is_relative_to(root.resolve()):
        raise BuilderError(f"{origin}: {path} links or leads outside {root}: refused")
    return path


def _record_body(record: dict) -> bytes:
    return json.dumps(record, indent=2, sort_keys=True).encode() + b"\n"


def _record_key(record: dict) -> str:
    """A pack's name ends in this: its pack.json names every file by sha256, so the name
    stands for the content, and `builder image` keys on names without reading the tars."""
    return hashlib.sha256(_record_body(record)).hexdigest()[:12]


def _generated_sources(build_ninja: bytes, arch_root: str) -> list[str]:
    """Sources FlashInfer generated for a module (`<arch root>/generated/...`), as its
    build.ninja names them: they are part of its build state."""
    pattern = re.escape(f"{arch_root}/generated/") + r"[^\s:$|]+"
    return sorted(set(re.findall(pattern, build_ninja.decode(errors="replace"))))


def _tar_files(stream: bytes, prefix: str) -> dict[str, tuple[bytes, int, int]]:
    files = {}
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member).read()
                name = _pack_member_name(f"{prefix}/{member.name}", "container archive")
                files[name] = (data, member.mode, int(member.mtime))
    return files


def harvest_container(container, out: Path) -> tuple[list[CompiledModule], Path | None]:
    """A kernel pack of what the container compiled at run time (None if nothing)."""
    modules = compiled_in_container(container)
    if not modules:
        return [], None
    files = {}
    for module in modules:
        arch_root = module.directory.rsplit("/cached_ops/", 1)[0]
        chunks, _ = container.get_archive(module.directory)
        # get_archive names entries after the folder it was given: `<name>/...`.
        built = _tar_files(b"".join(chunks), "cached_ops")
        files.update(built)
        ninja, _, _ = built.get(f"cached_ops/{module.name}/build.ninja", (b"", 0, 0))
        for source in _generated_sources(ninja, arch_root):
            chunks, _ = container.get_archive(source)
            folder = str(Path(source).parent.relative_to(arch_root))
            files.update(_tar_files(b"".join(chunks), folder))
    origin = f"container {container.name} of image {container.attrs['Config']['Image']}"
    return modules, write_pack(modules, files, out, origin)


def harvest_workspace(workspace: Path, out: Path) -> tuple[list[CompiledModule], Path | None]:
    """A kernel pack of every module compiled under a FlashInfer workspace base."""
    modules = compiled_in_workspace(workspace)
    if not modules:
        return [], None
    files = {}
    origin = f"workspace {workspace}"
    for module in modules:
        folder = Path(module.directory)
        arch_root = folder.parent.parent
        paths = [p for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()]
        paths += map(
            Path, _generated_sources((folder / "build.ninja").read_bytes(), str(arch_root))
        )
        for path in paths:
            _inside(path, arch_root, origin)
            stat = path.stat()
            name = str(path.relative_to(arch_root))
            files[name] = (path.read_bytes(), stat.st_mode & 0o777, int(stat.st_mtime))
    return modules, write_pack(modules, files, out, origin)


def packs_dir(cache_dir: Path) -> Path:
    """Where `builder jit harvest` puts kernel packs and `builder image` takes them from."""
    return cache_dir / "kernel-packs"


def pack_record(path: Path) -> dict:
    with tarfile.open(path) as tar:
        member = tar.extractfile("pack.json")
        return json.loads(member.read()) if member else {}


def packs_for(directory: Path, flashinfer_version: str, arch_list: tuple[str, ...]) -> list[Path]:
    """The kernel packs in `directory` made by exactly this flashinfer build, for an arch of
    the target (FlashInfer names the arch folder `120a` for `12.0a`)."""
    arches = {arch.replace(".", "") for arch in arch_list}
    found = []
    for path in sorted(directory.glob(f"*{PACK_SUFFIX}")):
        try:
            record = pack_record(path)
        except (tarfile.TarError, KeyError, ValueError) as exc:
            raise BuilderError(f"{path}: not a kernel pack ({exc})") from None
        if record.get("flashinfer_version") == flashinfer_version and record.get("arch") in arches:
            if not path.name.endswith(f"-{_record_key(record)}{PACK_SUFFIX}"):
                raise BuilderError(f"{path}: its name does not match its pack.json (edited?)")
            found.append(path)
    return found
