"""A no-op `builder image`, answered from the last build's record by file times.

A full no-op run imports the Docker SDK, pygit2 and the pipeline and recomputes every key
(0.4 s against 0.1 s for a no-op `docker build`). After a build, `save` records what it
depended on: the command line and the environment it reads, the size, time and inode of
every file of the data folder, of builder's own code and checkout, of the cache folders a
build reads (wheels, kernel wheels, kernel packs, the image's files), of the files the
command line names and of the wheels it left in the wheelhouse, and the image and base
image ids. The next run with the same command line (`replay`, before anything heavy is
imported) stats those files, asks the daemon for the two ids over its socket, and when all
match writes a new manifest from the recorded one, as the full run would. Anything else,
an unreadable record included, takes the full path, which records again. Pushing,
publishing, --plan and --save-context are never replayed.

Only the standard library here: this runs before builder's heavier imports.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

RECORD_VERSION = 1
RECORDS = "noop"  # under the cache folder
# Cache folders a no-op build reads (mirrors and work trees are named by commit: immutable).
CACHE_FOLDERS = ("wheels", "kernel-wheels", "kernel-packs", "image-files", "releases")
_NEVER_REPLAYED = ("--push", "--plan", "--save-context", "--publish", "-h", "--help")
_GLOBAL_FLAGS = ("-q", "--quiet", "-v", "--verbose")
_DEFAULT_SOCKET = "/var/run/docker.sock"
_DAEMON_SECONDS = 5
_PLACEHOLDER = "<manifest written by this run>"


_SECRET = ("PASSWORD", "TOKEN", "SECRET")
_READ_ALSO = ("SOURCE_DATE_EPOCH", "HOME", "PYTHONPATH", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")


def _environment() -> dict[str, str]:
    """What the image command reads from the environment (its settings and the daemon's).
    Credentials are left out: a no-op uses none, and not even their hash is kept."""
    return {
        name: value
        for name, value in os.environ.items()
        if (name.startswith(("BUILDER_", "DOCKER_")) or name in _READ_ALSO)
        and not any(word in name for word in _SECRET)
    }


def _split(argv: list[str]) -> tuple[bool, list[str]] | None:
    """(quiet, the image command's own arguments), or None when this is not a plain image
    build."""
    quiet = False
    rest = list(argv)
    while rest and rest[0] in _GLOBAL_FLAGS:
        quiet = quiet or rest.pop(0) in ("-q", "--quiet")
    if not rest or rest[0] != "image":
        return None
    if any(arg.split("=")[0].startswith(_NEVER_REPLAYED) for arg in rest[1:]):
        return None
    return quiet, rest[1:]


def _option(arguments: list[str], name: str) -> str | None:
    """The last value of `--name VALUE` / `--name=VALUE` (argparse: the last one wins)."""
    found = None
    for index, arg in enumerate(arguments):
        if arg == name and index + 1 < len(arguments):
            found = arguments[index + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def _cache_dir(arguments: list[str]) -> Path:
    chosen = _option(arguments, "--cache-dir") or os.environ.get("BUILDER_CACHE_DIR")
    if not chosen:
        import platformdirs  # light; builder.settings resolves it the same way

        chosen = platformdirs.user_cache_dir("builder")
    return Path(chosen).expanduser().resolve()


def _record_path(cache_dir: Path, arguments: list[str]) -> Path:
    where = [arguments, os.getcwd(), _environment(), sys.executable, sys.version, __file__]
    key = json.dumps(where, sort_keys=True)
    return cache_dir / RECORDS / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _stat(path: Path) -> list[int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def _tree(root: Path) -> dict[str, list[int] | None]:
    """Every file under `root` (the folder's own entry too: a file added or removed shows)."""
    found: dict[str, list[int] | None] = {str(root): _stat(root)}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")  # derived, rewritten by imports
        for name in files:
            path = os.path.join(folder, name)
            found[path] = _stat(Path(path))
    return found


def _substitute(value, old: str, new: str):
    """`value` (JSON data) with `old` replaced by `new` in every string."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_substitute(item, old, new) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, old, new) for key, item in value.items()}
    return value


def _snapshot(trees: list[str], files: list[str]) -> dict[str, list[int] | None]:
    found: dict[str, list[int] | None] = {}
    for root in trees:
        found.update(_tree(Path(root)))
    for path in files:
        found[path] = _stat(Path(path))
    return found


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=_DAEMON_SECONDS)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(_DAEMON_SECONDS)
        self.sock.connect(self._path)


def daemon_socket() -> str | None:
    """The daemon's unix socket, or None when DOCKER_HOST names another kind of host (the
    full path handles those)."""
    host = os.environ.get("DOCKER_HOST")
    if not host:
        return _DEFAULT_SOCKET
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _image_id(connection: http.client.HTTPConnection, reference: str) -> str | None:
    connection.request("GET", f"/images/{quote(reference, safe='/:@')}/json")
    response = connection.getresponse()
    body = response.read()
    return json.loads(body).get("Id") if response.status == 200 else None


def _images_unchanged(record: dict) -> bool:
    path = daemon_socket()
    if path is None or path != record["daemon"]:
        return False
    connection = _UnixConnection(path)
    try:
        return all(
            _image_id(connection, reference) == image_id
            for reference, image_id in record["images"].items()
        )
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def replay(argv: list[str]) -> int | None:
    """Answer a no-op `builder image` from its record: the exit code, or None to run the
    full command."""
    split = _split(argv)
    if split is None:
        return None
    quiet, arguments = split
    try:
        record = json.loads(_record_path(_cache_dir(arguments), arguments).read_text())
        if record.get("version") != RECORD_VERSION:
            return None
        if _snapshot(record["trees"], record["files"]) != record["snapshot"]:
            return None
        if not _images_unchanged(record):
            return None
        sbom = record["sbom"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    from builder import manifest  # light: the standard library and builder's small modules

    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        written = manifest.write(
            Path(record["manifest_dir"]), {**record["manifest"], "created": created},
            record["manifest_tag"], sbom,
        )  # fmt: skip
    except OSError:  # the full run meets the same and says so in its own words
        return None
    if not quiet:
        print(
            f"✓ image {record['reference']} is up to date (no input changed since "
            f"{record['recorded']}: nothing built)",
            file=sys.stderr,
        )
    output = _substitute(record["output"], _PLACEHOLDER, str(written))
    if "--json" in arguments:
        print(json.dumps(output["json"], indent=2, sort_keys=True))
    else:
        print("\n".join(output["lines"]))
    return 0


def _checkout_files(package: Path) -> list[str]:
    """builder's own checkout, as far as its identity (commit, dirty) reads it: HEAD, the
    index, the refs and every tracked file. None outside a checkout."""
    import pygit2

    found = pygit2.discover_repository(str(package))
    if found is None:
        return []
    repo = pygit2.Repository(found)
    if repo.workdir is None:
        return []
    git = Path(repo.path)
    files = [str(git / name) for name in ("HEAD", "index", "packed-refs")]
    if not repo.head_is_unborn and repo.head.name.startswith("refs/"):
        files.append(str(git / repo.head.name))
    files += [str(Path(repo.workdir) / entry.path) for entry in repo.index]
    return files


@dataclass
class Inputs:
    """What a build read that a user edits, snapshotted before it started: a file changed
    while it ran leaves no record (the build may have read either version)."""

    arguments: list[str]
    trees: list[str]
    files: list[str]
    snapshot: dict[str, list[int] | None]


def watch(argv: list[str], data_dir: Path) -> Inputs | None:
    """Before a build: its inputs, or None for a command that is never replayed."""
    split = _split(argv)
    if split is None or daemon_socket() is None:
        return None
    _, arguments = split
    from builder.identity import PACKAGE
    from builder.settings import config_file

    trees = [str(data_dir / "images"), str(data_dir / "forks"), str(PACKAGE)]
    files = [*_checkout_files(PACKAGE), str(config_file())]
    files += [arg for arg in arguments if os.path.isfile(arg)]
    return Inputs(arguments, trees, files, _snapshot(trees, files))


def _as_noop(image: dict) -> dict:
    """The image record a no-op run writes: nothing built, no kernel step."""
    return {**image, "skipped": True, "kernel_build": None}


def save(
    inputs: Inputs,
    *,
    cache_dir: Path,
    wheel_files: list[Path],
    images: dict[str, str],
    manifest_dir: Path,
    manifest_tag: str,
    manifest: dict,
    sbom: str | None,
    output_json: dict,
    lines: list[str],
    written: Path,
) -> None:
    """Record a finished plain image build for `replay`, as the no-op run that repeats it
    would write it."""
    if _snapshot(inputs.trees, inputs.files) != inputs.snapshot:
        return
    trees = inputs.trees + [str(cache_dir / folder) for folder in CACHE_FOLDERS]
    files = inputs.files + [str(path) for path in wheel_files]
    output = _substitute(
        {"json": {**output_json, "image": _as_noop(output_json["image"])}, "lines": lines},
        str(written),
        _PLACEHOLDER,
    )
    record = {
        "version": RECORD_VERSION,
        "recorded": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
        "trees": trees,
        "files": files,
        "snapshot": _snapshot(trees, files),
        "daemon": daemon_socket(),
        "images": images,
        "manifest_dir": str(manifest_dir),
        "manifest_tag": manifest_tag,
        "manifest": {
            **{k: v for k, v in manifest.items() if k not in ("created", "sbom")},
            "image": _as_noop(manifest["image"]),
        },
        "sbom": sbom,
        "reference": output["json"]["image"]["reference"],
        "output": output,
    }
    target = _record_path(cache_dir, inputs.arguments)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False) as handle:
        json.dump(record, handle)
    os.replace(handle.name, target)
