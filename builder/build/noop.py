"""A no-op `builder image`, answered from the last build's record by file times.

A full no-op run imports the Docker SDK, pygit2 and the pipeline and recomputes every key
(0.4 s against 0.1 s for a no-op `docker build`). After a build, `save` records what it
depended on: the command line and the environment it reads, the size, time and inode of
every file of the data folder, of builder's own code and checkout, of the cache folders a
build reads (wheels, kernel wheels, kernel packs, the image's files), of the files the
command line names, of the kernel keys (the trusted keys file, this host's key) and of the
wheels it left in the wheelhouse, and the image and base image ids. The next run with the
same command line (`replay`, before anything heavy is imported) stats those files, asks the
daemon for the two ids over its socket, and when all match writes a new manifest from the
recorded one, as the full run would. Anything else, an unreadable record included, takes
the full path, which records again. Pushing, publishing, --plan and --save-context are
never replayed.

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
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

RECORD_VERSION = 1
RECORDS = "noop"  # under the cache folder
# Cache folders a no-op build reads (mirrors and work trees are named by commit: immutable).
CACHE_FOLDERS = ("wheels", "kernel-wheels", "kernel-packs", "image-files", "releases")
# The options a replayed command line may hold, spelled out in full (argparse also takes
# unique prefixes: `--pus` is --push, so anything else, pushing and publishing, --plan and
# --save-context included, takes the full path).
_VALUED = (
    "--target", "--data-dir", "--mirror", "--cache-dir", "--wheelhouse", "--base-image",
    "--pip-index-url", "--pip-extra-index-url", "--runtime-requirements", "--jit-modules",
    "--kernel-registry", "--jit-jobs", "--manifest-dir",
)  # fmt: skip
_FLAGS = ("--json", "--debug", "--allow-dirty", "--network-host")
# Taken before or after the command, as argparse takes them (builder/cli/main.py).
_QUIET = ("-q", "--quiet")
_VERBOSE = ("-v", "--verbose")
_DEFAULT_SOCKET = "/var/run/docker.sock"
_DAEMON_SECONDS = 5
_PLACEHOLDER = "<manifest written by this run>"


_SECRET = ("PASSWORD", "TOKEN", "SECRET", "AUTH", "CREDENTIAL")
_READ_ALSO = (
    "SOURCE_DATE_EPOCH", "HOME", "PYTHONPATH", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
)  # fmt: skip


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
    build. -q and -v may stand before or after `image`: they change no result, so they are
    read and left out (a record answers with or without them); a --json before `image` is
    the command's own --json, so `builder --json image` and `builder image --json` share
    one record."""
    quiet = json_first = False
    rest = list(argv)
    while rest and rest[0] in (*_QUIET, *_VERBOSE, "--json"):
        flag = rest.pop(0)
        quiet = quiet or flag in _QUIET
        json_first = json_first or flag == "--json"
    if not rest or rest[0] != "image":
        return None
    given = rest[1:]
    arguments: list[str] = []
    index = 0
    while index < len(given):
        word = given[index]
        name, has_value, _ = word.partition("=")
        if name in _VALUED:
            step = 1 if has_value else 2
            arguments += given[index : index + step]
            index += step
        elif word in (*_QUIET, *_VERBOSE):
            quiet = quiet or word in _QUIET
            index += 1
        elif name in _FLAGS and not has_value:
            arguments.append(word)
            index += 1
        else:
            return None
    if json_first and "--json" not in arguments:
        arguments.append("--json")
    return quiet, arguments


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
        import platformdirs  # light; builder.core.settings resolves it the same way

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


def _only_a_plain_build(record: dict) -> bool:
    """A record answers only for what a plain build did: it names the image it built (and
    the daemon still has it, `_images_unchanged`), and claims no push and no publication,
    which no replayed command line does. Anything else in it is not believed."""
    manifest = record["manifest"]
    image = manifest["image"]
    wheels = [*(manifest.get("wheels") or {}).values(), manifest.get("builder_wheel") or {}]
    return (
        record["reference"] in record["images"]
        and image.get("reference") == record["reference"]
        and not image.get("pushed")
        and not any(wheel.get("published") for wheel in wheels)
        and not record["output"]["json"]["image"].get("pushed")
    )


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


def _watches_something(record: dict) -> bool:
    """A record that watches no file would say "up to date" whatever changed: it is not
    believed (one that names no image is refused by `_only_a_plain_build`)."""
    return bool(record["snapshot"]) and bool(record["trees"] or record["files"])


def replay(argv: list[str]) -> int | None:
    """Answer a no-op `builder image` from its record: the exit code, or None to run the
    full command (whatever is wrong with the record: the full run says it in its words)."""
    split = _split(argv)
    if split is None:
        return None
    quiet, arguments = split
    try:
        record = json.loads(_record_path(_cache_dir(arguments), arguments).read_text())
        if record["version"] != RECORD_VERSION:
            return None
        if not _watches_something(record):
            return None
        if _snapshot(record["trees"], record["files"]) != record["snapshot"]:
            return None
        if not _only_a_plain_build(record) or not _images_unchanged(record):
            return None
        template = record["output"]["json" if record["json"] else "lines"]
        said = (
            f"✓ image {record['reference']} is up to date (no input changed since "
            f"{record['recorded']}: nothing built)"
        )
        from builder.spec import manifest  # light: the standard library and small modules

        created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        written = manifest.write(
            Path(record["manifest_dir"]), {**record["manifest"], "created": created},
            record["manifest_tag"], record["sbom"],
        )  # fmt: skip
    except Exception:  # any bad record: the full run answers instead
        return None
    output = _substitute(template, _PLACEHOLDER, str(written))
    shown = json.dumps(output, indent=2, sort_keys=True) if record["json"] else "\n".join(output)
    if not quiet:
        print(said, file=sys.stderr)
    print(shown)
    return 0


def _checkout_files(package: Path) -> list[str]:
    """builder's own checkout, as far as its identity (commit, dirty) reads it: HEAD, the
    index, the refs and every tracked file. None outside a checkout."""
    from builder.core.identity import checkout

    repo = checkout(package)
    if repo is None:
        return []
    git = Path(repo.path)
    common = git  # a linked worktree keeps HEAD and index here, the refs in the common dir
    if (git / "commondir").is_file():
        common = (git / (git / "commondir").read_text().strip()).resolve()
    files = [str(git / "HEAD"), str(git / "index"), str(common / "packed-refs")]
    if not repo.head_is_unborn and repo.head.name.startswith("refs/"):
        files.append(str(common / repo.head.name))
    files += [str(Path(repo.workdir) / entry.path) for entry in repo.index]
    return files


# A file written this close to its snapshot may change again within the same time stamp
# (coarse file system clocks): a build that read one is not recorded.
_SETTLED_NS = 2 * 10**9


@dataclass
class Inputs:
    """What a build reads that a user edits, snapshotted before it reads them: a file
    changed while it ran leaves no record (the build may have read either version)."""

    arguments: list[str]
    json: bool
    trees: list[str]
    files: list[str]
    snapshot: dict[str, list[int] | None]
    taken_ns: int  # when the snapshot began

    def also(self, paths: list[Path]) -> None:
        """Inputs known only once the target is read (its Dockerfile, lock, recipe files),
        snapshotted before the build reads them."""
        added = [str(path) for path in paths if str(path) not in self.snapshot]
        self.files += added
        self.snapshot.update(_snapshot([], added))

    def unchanged(self) -> bool:
        """Still as snapshotted, and settled when it was taken."""
        settled = self.taken_ns - _SETTLED_NS
        return _snapshot(self.trees, self.files) == self.snapshot and all(
            stat is None or stat[1] < settled for stat in self.snapshot.values()
        )


def watch(argv: list[str], data_dir: Path, as_json: bool) -> Inputs | None:
    """Before a build reads anything: its inputs, or None for a command that is never
    replayed."""
    split = _split(argv)
    if split is None or daemon_socket() is None:
        return None
    _, arguments = split
    import sysconfig

    from builder.core.identity import PACKAGE
    from builder.core.settings import config_file, kernel_host_key

    taken_ns = time.time_ns()
    try:
        trees = [str(data_dir / "images"), str(data_dir / "forks"), str(PACKAGE)]
        # The environment's own packages folder: installing or removing one changes it.
        files = [*_checkout_files(PACKAGE), str(config_file()), sysconfig.get_paths()["purelib"]]
        # The keys a kernel is trusted by: a key removed from the file is a full run (whose
        # kernel step refuses what that key signed), not a replay.
        files.append(str(kernel_host_key()))
        if trusted := os.environ.get("BUILDER_KERNEL_TRUSTED_KEYS"):
            files.append(str(Path(trusted).expanduser()))
    except Exception:  # an unreadable checkout: this build is simply not recorded
        return None
    for argument in arguments:  # FILE, and --option=FILE
        for candidate in (argument, argument.partition("=")[2]):
            if candidate and os.path.isfile(candidate):
                files.append(candidate)
    return Inputs(arguments, as_json, trees, files, _snapshot(trees, files), taken_ns)


def _as_noop(image: dict) -> dict:
    """The image record a no-op run writes: nothing built, no kernel step."""
    return {**image, "skipped": True, "kernel_build": None}


def save(inputs: Inputs, **build) -> None:
    """Record a finished plain image build for `replay` (see `_record`); a build that worked
    is never failed by its record."""
    try:
        _record(inputs, **build)
    except Exception:  # the next run takes the full path and records then
        return


def _record(
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
    would write it. Nothing when an input changed or had only just changed (the next run
    takes the full path and records then), or when the record cannot be written."""
    if manifest["image"].get("pushed") or not images:  # not a plain build: never answered
        return
    outputs = _snapshot(
        [str(cache_dir / folder) for folder in CACHE_FOLDERS], [str(p) for p in wheel_files]
    )
    if not inputs.unchanged():  # checked after the outputs' snapshot: nothing slips between
        return
    output = _substitute(
        {"json": {**output_json, "image": _as_noop(output_json["image"])}, "lines": lines},
        str(written),
        _PLACEHOLDER,
    )
    record = {
        "version": RECORD_VERSION,
        "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "trees": inputs.trees + [str(cache_dir / folder) for folder in CACHE_FOLDERS],
        "files": inputs.files + [str(path) for path in wheel_files],
        "snapshot": {**inputs.snapshot, **outputs},
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
        "json": inputs.json,
        "output": output,
    }
    target = _record_path(cache_dir, inputs.arguments)
    partial = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False) as handle:
            partial = handle.name
            json.dump(record, handle)
        os.replace(partial, target)
    except BaseException:
        if partial:
            Path(partial).unlink(missing_ok=True)
        raise
