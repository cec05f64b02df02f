"""The cache directory: one lock for concurrent builds, atomic writes, content keys.

Everything that lands in the cache is written to a temporary sibling and renamed into
place, so a run killed at any moment leaves either the old entry or the new one, never a
half-written one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


@contextmanager
def locked(cache_dir: Path, name: str = "builder.lock") -> Iterator[None]:
    """Hold the cache lock (or the lock `name` in the cache); say so when another builder
    run has it."""
    # Imported here: a no-op `builder image` replayed from its record (builder/build/noop.py)
    # writes through this module and must not pay for them.
    from filelock import FileLock, Timeout

    from builder.core import progress

    cache_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(cache_dir / name)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress.info(f"waiting for another builder run to release {lock.lock_file} ...")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def content_key(inputs: dict) -> str:
    """A stable hash of everything that goes into a product."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


@contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """A temporary directory beside `final`, moved into place only if the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield staging
        remove_tree(final)
        os.replace(staging, final)
    finally:
        remove_tree(staging)


@contextmanager
def partial_beside(destination: Path, mode: int = 0o644) -> Iterator[Path]:
    """A temporary name beside `destination`, this writer's own (two builder runs that write
    the same file never share one), renamed over it when the block succeeds. The file is
    created 0600 (mkstemp) and gets `mode` only once complete."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    os.close(handle)
    partial = Path(name)
    try:
        yield partial
        os.chmod(partial, mode)
        durable_replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)


def durable_replace(source: Path, destination: Path) -> None:
    """`os.replace`, with the file's bytes on disk before its new name is, and the name on
    disk after: a power loss leaves the old file or the new one, never an empty new one."""
    if source.is_file():
        with source.open("rb") as handle:
            os.fsync(handle.fileno())
    os.replace(source, destination)
    _fsync_directory(destination.parent)


def fsync_files(folder: Path) -> None:
    """Every file directly in `folder` (and the folder) on disk, before it is renamed."""
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_directory(folder)


def _fsync_directory(path: Path) -> None:
    try:
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # a file system that cannot open a directory for this: nothing to sync
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C held back until the block ends: for steps that must all happen or none (the
    interrupt is raised right after, so the command still stops). A process started with
    Ctrl-C ignored (a script's background job, `cmd &`) keeps ignoring it."""
    import signal
    import threading

    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        yield
        return
    caught: list[object] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def atomic_copy(source: Path, destination: Path) -> None:
    with partial_beside(destination) as partial:
        shutil.copyfile(source, partial)


def atomic_write_text(destination: Path, text: str, mode: int = 0o644) -> None:
    with partial_beside(destination, mode) as partial:
        partial.write_text(text)


def read_limited(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them, for data from elsewhere (kernel entries,
    packs): a link is not followed, a FIFO or device never read, and a larger file is never
    read whole. ValueError says why not, in words that follow the file's name."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("is a symbolic link") from None
        raise ValueError(f"cannot be read ({exc.strerror})") from None
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(descriptor)
        raise ValueError(
            "is not a regular file" if not stat.S_ISREG(info.st_mode)
            else f"is larger than {limit} bytes"
        )  # fmt: skip
    with os.fdopen(descriptor, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"is larger than {limit} bytes")
    return data


class LinkedFolder(ValueError):
    """A component of a folder's path is a symbolic link or not a folder."""


def open_folder_unlinked(folder: Path, create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of `folder` reached from / one component at a time, none of them followed
    if it is a symbolic link (so a link planted anywhere on the path cannot send a write or a
    read elsewhere); with `create`, missing components are made with `mode`. LinkedFolder
    names the component at fault; FileNotFoundError when one is missing and not `create`."""
    reached = Path("/")
    descriptor = os.open(reached, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(os.path.abspath(folder)).parts[1:]:
            reached = reached / part
            inner = _open_component(descriptor, part, reached, create, mode)
            os.close(descriptor)
            descriptor = inner
        return descriptor
    except BaseException:
        os.close(descriptor)
        raise


def _open_component(parent: int, part: str, reached: Path, create: bool, mode: int) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(part, flags, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # Linux says ENOTDIR for a link too
            linked = stat.S_ISLNK(os.stat(part, dir_fd=parent, follow_symlinks=False).st_mode)
            what = "a symbolic link" if linked else "not a folder"
            raise LinkedFolder(f"{reached} is {what}") from None
        raise
    try:
        os.mkdir(part, mode, dir_fd=parent)
    except FileExistsError:  # another writer made it meanwhile: opened as found
        return _open_component(parent, part, reached, False, mode)
    made = os.open(part, flags, dir_fd=parent)
    os.fchmod(made, mode)  # whatever the umask
    return made


def replace_in_folder(folder: int, name: str, text: str, mode: int = 0o644) -> None:
    """`name` in the folder open as `folder` holding `text`, written to a temporary name
    beside it and renamed over it (a link of that name is replaced, never followed), with
    the bytes on disk before the name is."""
    partial = f".{name}.{os.getpid()}.partial"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with suppress(FileNotFoundError):  # left by a writer of this pid that died
        os.unlink(partial, dir_fd=folder)
    descriptor = os.open(partial, flags, 0o600, dir_fd=folder)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(partial, name, src_dir_fd=folder, dst_dir_fd=folder)
        os.fsync(folder)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(partial, dir_fd=folder)
