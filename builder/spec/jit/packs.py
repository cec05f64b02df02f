"""What a running server compiled anyway: `compiled_in_container` compares a server's
FlashInfer workspace against the image's, so a kernel compiled at start-up is named, and a
kernel pack (`builder jit harvest`) tells the next image build to compile it. A pack names
modules and their generator calls; the compiled files of a network-facing server are never
shipped on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from builder.core import docker_client, progress
from builder.core.cache import atomic_write_text, read_limited
from builder.core.errors import BuilderError
from builder.spec.target import is_flashinfer_call

PACK_SUFFIX = ".kernel-pack.json"
_OLD_PACK_SUFFIX = ".kernel-pack.tar"  # before harvested .so files were recompiled
PACK_SCHEMA = 2
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


JOURNAL = "generators.jsonl"  # images/sm120/jit_journal.py writes it beside cached_ops/
_JOURNAL_LIMIT = 4 << 20
_JOURNAL_LINE_LIMIT = 8 << 10  # one record: a module's name and one generator call
_MODULE_NAME = re.compile(r"[A-Za-z0-9_]{1,200}")


def check_generator(entry: str, origin: str) -> str:
    """A harvested generator call, or a one-line refusal (builder/spec/target.py is_flashinfer_call:
    what a server hands back names a call; it never carries code or compiled bytes)."""
    if not is_flashinfer_call(entry):
        raise BuilderError(f"{origin}: generator {entry[:200]!r} is not a FlashInfer call: refused")
    return entry


def _journal(text: str, origin: str) -> dict[str, str]:
    """{module name: generator call} from a workspace's journal. A server writes it: a line
    that is not one well-formed record, or names anything but a plain FlashInfer call, is
    skipped with a warning (that module is then harvested without a call)."""
    found = {}
    unread = 0
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > _JOURNAL_LINE_LIMIT:
            unread += 1
            continue
        try:
            record = json.loads(line)
            name, generator = record["name"], record["generator"]
        except RecursionError:  # [[[[...: json recurses once a bracket
            unread += 1
            continue
        except (ValueError, KeyError, TypeError):
            continue
        if not (isinstance(name, str) and _MODULE_NAME.fullmatch(name)):
            continue
        try:
            found[name] = check_generator(str(generator), f"{origin}:{number}")
        except BuilderError as exc:
            progress.warn(f"{exc} (skipped)")
    if unread:
        progress.warn(
            f"{origin}: {unread} line(s) over {_JOURNAL_LINE_LIMIT} characters or nested too "
            "deep: not journal records (skipped)"
        )
    return found


def write_pack(
    modules: list[CompiledModule], generators: dict[str, str], out: Path, origin: str
) -> Path:
    """A kernel pack: which modules a server had to compile itself, for which flashinfer
    build and arch, and (where its journal named it) the generator call that makes each, as
    one JSON file named by its content. It holds no compiled code: `builder image` compiles
    each listed module from its own flashinfer source."""
    versions = {(m.flashinfer_version, m.arch) for m in modules}
    if len(versions) != 1:
        raise BuilderError(f"modules of several flashinfer builds or arches: {sorted(versions)}")
    ((version, arch),) = versions
    record = {
        "schema_version": PACK_SCHEMA,
        "flashinfer_version": version,
        "arch": arch,
        "origin": origin,
        "modules": {m.name: generators.get(m.name) for m in sorted(modules, key=_name)},
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"flashinfer-{version}-{arch}-{_record_key(record)}{PACK_SUFFIX}"
    atomic_write_text(path, _record_body(record).decode())
    return path


def _name(module: CompiledModule) -> str:
    return module.name


def _record_body(record: dict) -> bytes:
    return json.dumps(record, indent=2, sort_keys=True).encode() + b"\n"


def _record_key(record: dict) -> str:
    """A pack's name ends in this, so the name stands for the content, and `builder image`
    keys its flashinfer stage on names."""
    return hashlib.sha256(_record_body(record)).hexdigest()[:12]


def harvest_container(container, out: Path) -> tuple[list[CompiledModule], Path | None]:
    """A kernel pack of what the container compiled at run time (None if nothing)."""
    modules = compiled_in_container(container)
    if not modules:
        return [], None
    origin = f"container {container.name} of image {container.attrs['Config']['Image']}"
    generators: dict[str, str] = {}
    for arch_root in sorted({m.directory.rsplit("/cached_ops/", 1)[0] for m in modules}):
        try:
            chunks, stat = container.get_archive(f"{arch_root}/{JOURNAL}")
        except docker.errors.NotFound:
            continue
        if stat.get("size", 0) > _JOURNAL_LIMIT:  # asked before a byte of it is read
            progress.warn(f"{origin}: its {JOURNAL} is over {_JOURNAL_LIMIT} bytes: not read")
            continue
        where = f"{origin}: {JOURNAL}"
        try:  # the size above is the container's word: the stream is bounded too
            text = docker_client.file_from_archive(chunks, where, _JOURNAL_LIMIT)
        except BuilderError as exc:
            progress.warn(str(exc))
            continue
        generators.update(_journal(text.decode(errors="replace"), where))
    return modules, write_pack(modules, generators, out, origin)


def harvest_workspace(workspace: Path, out: Path) -> tuple[list[CompiledModule], Path | None]:
    """A kernel pack of every module compiled under a FlashInfer workspace base."""
    modules = compiled_in_workspace(workspace)
    if not modules:
        return [], None
    origin = f"workspace {workspace}"
    generators: dict[str, str] = {}
    for arch_root in sorted({Path(m.directory).parent.parent for m in modules}):
        journal = arch_root / JOURNAL
        if journal.is_file() and not journal.is_symlink():
            if journal.stat().st_size > _JOURNAL_LIMIT:
                progress.warn(f"{journal}: over {_JOURNAL_LIMIT} bytes: not read")
                continue
            generators.update(_journal(journal.read_text(errors="replace"), str(journal)))
    return modules, write_pack(modules, generators, out, origin)


def packs_dir(cache_dir: Path) -> Path:
    """Where `builder jit harvest` puts kernel packs and `builder image` takes them from."""
    return cache_dir / "kernel-packs"


_PACK_LIMIT = 4 << 20  # a pack names modules and calls: a larger file is not one
REJECTED_SUFFIX = ".rejected"


class PackRefused(BuilderError):
    """The kernel build refused a call the pack file `pack` names (it makes another module
    than the pack says, cannot be loaded, or fails to compile): `builder image` moves the
    pack aside (`reject`) and plans the image again without it."""

    def __init__(self, pack: str, why: str) -> None:
        super().__init__(f"kernel pack {pack}: {why}")
        self.pack = pack
        self.why = why


def pack_record(path: Path) -> dict:
    """A pack's JSON record, read only from a regular file of at most _PACK_LIMIT bytes."""
    try:
        data = read_limited(path, _PACK_LIMIT)
    except ValueError as exc:
        raise BuilderError(f"{path}: {exc}, not a kernel pack") from None
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise BuilderError(f"{path}: not a kernel pack ({exc})") from None
    if not isinstance(record, dict) or record.get("schema_version") != PACK_SCHEMA:
        raise BuilderError(f"{path}: not a kernel pack of schema {PACK_SCHEMA}")
    for field in ("flashinfer_version", "arch", "origin"):
        if not isinstance(record.get(field), str):
            raise BuilderError(f"{path}: not a kernel pack (its {field} is not a string)")
    return record


def reject(path: Path, why: str) -> bool:
    """Move a bad pack aside (`<name>.rejected`, beside it) with one warning line naming it,
    so that it fails no later build; False if it was already gone (another run moved it)."""
    aside = path.with_name(path.name + REJECTED_SUFFIX)
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise BuilderError(
            f"{why}; cannot move the pack aside ({exc.strerror}): remove it"
        ) from None
    progress.warn(f"{why} (kernel pack skipped: moved aside to {aside.name})")
    return True


def packs_for(directory: Path, flashinfer_version: str, arch_list: tuple[str, ...]) -> list[Path]:
    """The kernel packs in `directory` made by exactly this flashinfer build, for an arch of
    the target (FlashInfer names the arch folder `120a` for `12.0a`). A pack that is not one
    (unreadable, renamed, a refused call or module name) is moved aside with one warning line
    naming it: a bad file in the cache fails no build."""
    arches = {arch.replace(".", "") for arch in arch_list}
    for old in sorted(directory.glob(f"*{_OLD_PACK_SUFFIX}")):
        progress.warn(
            f"{old}: a kernel pack of compiled files, which builder no longer ships as they "
            "are: skipped (run `builder jit harvest` again, or delete it)"
        )
    found = []
    for path in sorted(directory.glob(f"*{PACK_SUFFIX}")):
        try:
            record = pack_record(path)
            if record.get("flashinfer_version") != flashinfer_version:
                continue
            if record.get("arch") not in arches:
                continue
            if not path.name.endswith(f"-{_record_key(record)}{PACK_SUFFIX}"):
                raise BuilderError(f"{path}: its name does not match its content (edited?)")
            _pack_modules(path, record)
        except BuilderError as exc:
            reject(path, str(exc))
            continue
        found.append(path)
    return found


def _pack_modules(path: Path, record: dict) -> dict[str, str | None]:
    """{module name: checked generator call or None}, or a one-line refusal naming the pack."""
    modules = record.get("modules")
    if not isinstance(modules, dict):
        raise BuilderError(f"{path}: not a kernel pack (no modules)")
    for name, generator in modules.items():
        if not _MODULE_NAME.fullmatch(str(name)):
            raise BuilderError(f"{path}: module name {str(name)[:80]!r} refused")
        if generator is not None:
            check_generator(str(generator), str(path))
    return modules


def harvested_modules(paths: list[Path]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """({generator call: {"name": module, "pack": pack file name}}, problems): every module
    the packs name with a checked generator call; a module without one is a problem line
    (its server compiled it, but no journal said how: add it to the target's list)."""
    calls: dict[str, dict[str, str]] = {}
    problems = []
    for path in paths:
        modules = _pack_modules(path, pack_record(path))
        for name, generator in sorted(modules.items()):
            if generator is None:
                problems.append(
                    f"{path.name}: module {name} was compiled at run time, but no journal "
                    "named its generator call: add it to the target's [[jit.modules]]"
                )
                continue
            calls[str(generator)] = {"name": name, "pack": path.name}
    return calls, problems
