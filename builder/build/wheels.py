"""Stage 3: build each fork's wheel with `build`, verify it, and cache it by content.

The version is `<upstream version>+<label>.g<fork sha7>` and lands in the wheel METADATA.
SOURCE_DATE_EPOCH comes from the fork commit, and the build runs in an export of the fork
commit with no .git (what a backend would ask git for is written in from pin.toml), so two
clean builds give byte-identical wheels, with or without the git CLI on the host. A wheel
is built in a staging directory, checked (version, patched lines, required files), and only
then moved into the cache and copied into the wheelhouse: a failed or interrupted build
leaves nothing behind.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import build
import pygit2
from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.build import release
from builder.build.patches import ForkResult, PatchFile
from builder.build.repack import repack
from builder.build.sources import export_tree
from builder.core import progress
from builder.core.cache import atomic_copy, content_key, remove_tree, sha256_file, staging_dir
from builder.core.errors import BuilderError
from builder.core.identity import code_key
from builder.spec.target import Fork

BACKEND_PACKAGES = ("setuptools", "setuptools-scm", "wheel", "build")
_LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class BuiltWheel:
    name: str
    dist_name: str
    version: str
    filename: str
    sha256: str
    size: int
    cache_key: str
    cached: bool
    path: Path

    def to_json(self) -> dict:
        data = asdict(self)
        data["path"] = str(self.path)
        return data


def wheel_version(fork: Fork, label: str, fork_commit: str) -> str:
    return f"{fork.version}+{label}.g{fork_commit[:7]}"


def _build_env(fork: Fork, version: str, source_date_epoch: int) -> dict[str, str]:
    env = {**fork.wheel.env, "SOURCE_DATE_EPOCH": str(source_date_epoch), "PYTHONHASHSEED": "0"}
    if fork.wheel.version_env:
        local = version.split("+", 1)[1]
        value = fork.wheel.version_env_value.format(version=version, local=local)
        env[fork.wheel.version_env] = value
    return env


def _cache_inputs(
    repo: pygit2.Repository, result: ForkResult, fork: Fork, version: str, env: dict[str, str]
) -> dict:
    backend = {pkg: importlib.metadata.version(pkg) for pkg in BACKEND_PACKAGES}
    return {
        "builder": code_key("build/wheels", "build/sources", "build/repack", "build/wheelfiles"),
        "fork_commit": result.fork_commit,
        "fork_tree": str(repo.get(result.fork_commit).tree.id),
        "submodules": {s.path: s.commit for s in result.checkout.submodules},
        "version": version,
        "env": env,
        "wheel_settings": asdict(fork.wheel),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "backend": backend,
    }


# What an upstream build backend (arbitrary upstream code) gets from builder's environment:
# nothing else, so no registry password, index token or cloud key reaches it. Its HOME is an
# empty folder of its own: the user's holds ~/.docker/config.json, ~/.netrc, ~/.pypirc.
BACKEND_ENV_ALLOWLIST = (
    "PATH", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TEMP", "TMP",
)  # fmt: skip
BACKEND_TIMEOUT_S = 3 * 60 * 60  # a wheel build (no kernels in it) that runs longer hangs


def backend_environment(extra: dict[str, str]) -> dict[str, str]:
    allowed = {k: v for k, v in os.environ.items() if k in BACKEND_ENV_ALLOWLIST}
    return {**allowed, **extra}


def _runner(log_path: Path, extra_env: dict[str, str], home: Path):
    def run(cmd, cwd=None, extra_environ=None):
        env = backend_environment({**(extra_environ or {}), **extra_env, "HOME": str(home)})
        with log_path.open("ab") as log:
            try:  # the wheel records file modes: not the host's umask
                completed = subprocess.run(
                    cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, umask=0o022,
                    timeout=BACKEND_TIMEOUT_S,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                log.write(f"\nbuilder: stopped after {BACKEND_TIMEOUT_S} s\n".encode())
                raise subprocess.CalledProcessError(-1, cmd) from None
        if completed.returncode:
            raise subprocess.CalledProcessError(completed.returncode, cmd)

    return run


def _log_warnings(log_path: Path, caught: list[warnings.WarningMessage]) -> None:
    """The backend's warnings go to the build log, not the user's terminal."""
    with log_path.open("a") as log:
        for warning in caught:
            log.write(f"warning: {warning.message}\n")


def _log_tail(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    return "\n".join(f"    {line}" for line in lines)


def _added_lines(patch: PatchFile) -> dict[str, list[str]]:
    added: dict[str, list[str]] = {}
    for file_patch in patch.files:
        lines = [
            line[1:].strip()
            for line in file_patch.text.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()
        ]
        if lines:
            added[file_patch.path] = lines
    return added


def _check_compiles(wheel: Path, patch: PatchFile, archive: zipfile.ZipFile, members) -> None:
    """A patched Python file that does not even compile must not ship."""
    for member in members:
        if member.endswith(".py"):
            try:
                compile(archive.read(member), member, "exec")
            except SyntaxError as exc:
                raise BuilderError(
                    f"{wheel.name}: {member} does not compile after {patch.path.name} "
                    f"(line {exc.lineno}: {exc.msg})"
                ) from None


def _members_for(path: str, names: list[str]) -> list[str]:
    """Wheel members that hold the git file `path` (shipped under another prefix, maybe; a
    release's `.dist-info/` file in the repacked wheel's own, renamed for the local version)."""
    found = [
        name
        for name in names
        if name == path or path.endswith("/" + name) or name.endswith("/" + path)
    ]
    folder, slash, inner = path.partition("/")
    if found or not (slash and folder.endswith(".dist-info")):
        return found
    return [
        name
        for name in names
        if name.partition("/")[0].endswith(".dist-info") and name.partition("/")[2] == inner
    ]


def patched_lines(wheel: Path, patches: tuple[PatchFile, ...]) -> dict[str, list[str]]:
    """{installed file (wheel member): the lines the patches add to it}: what `builder verify`
    looks for in an image's site-packages."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    found: dict[str, list[str]] = {}
    for patch in patches:
        for path, lines in _added_lines(patch).items():
            for member in _members_for(path, names):
                found.setdefault(member, []).extend(lines)
    return {member: found[member] for member in sorted(found)}


def verify_wheel(wheel: Path, fork: Fork, version: str, patches: tuple[PatchFile, ...]) -> None:
    """Fail unless the wheel says `version` in METADATA and holds every patch and file."""
    name, wheel_ver, _, _ = parse_wheel_filename(wheel.name)
    if canonicalize_name(name) != canonicalize_name(fork.wheel.dist_name):
        raise BuilderError(
            f"{wheel.name}: built distribution '{name}', expected '{fork.wheel.dist_name}'"
        )
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            raise BuilderError(f"{wheel.name}: no .dist-info/METADATA")
        metadata = archive.read(metadata_name).decode()
        declared = next(
            (
                line.split(":", 1)[1].strip()
                for line in metadata.splitlines()
                if line.startswith("Version:")
            ),
            None,
        )
        if declared != version or str(wheel_ver) != version:
            raise BuilderError(
                f"{wheel.name}: METADATA says version {declared}, expected {version} "
                f"(is {fork.wheel.version_env} honoured by {fork.name}'s build?)"
            )
        for required in fork.wheel.must_contain:
            if not any(n == required or n.startswith(required.rstrip("/") + "/") for n in names):
                raise BuilderError(
                    f"{wheel.name}: missing {required} (listed in {fork.directory / 'pin.toml'} "
                    "build.must_contain; were the submodules checked out?)"
                )
        for patch in patches:
            shipped = 0
            for path, lines in _added_lines(patch).items():
                members = _members_for(path, names)
                if not members:
                    continue
                shipped += 1
                content = "\n".join(archive.read(m).decode(errors="replace") for m in members)
                _check_compiles(wheel, patch, archive, members)
                missing = [line for line in lines if line not in content]
                if missing:
                    raise BuilderError(
                        f"{wheel.name}: {members[0]} lacks lines added by {patch.path.name}: "
                        f"{missing[0]!r}"
                    )
            if patch.files and not shipped:
                raise BuilderError(
                    f"{wheel.name}: none of the files {patch.path.name} changes is in the wheel"
                )


def _export_source(
    repo: pygit2.Repository, fork: Fork, commit: str, version: str, root: Path
) -> Path:
    """The fork commit as plain files, plus what the backend would otherwise ask git for;
    the project folder to build."""
    exported = export_tree(repo, commit, root)

    def inside(key: str, relative: str, path: Path) -> Path:
        """`path`, whose folder must be in the export: pin.toml's paths are relative
        without `..`, but a symlink in the upstream tree could still lead out of it."""
        if not path.parent.resolve().is_relative_to(root.resolve()):
            raise BuilderError(
                f"{fork.directory / 'pin.toml'}: field 'build.{key}' is '{relative}', which "
                f"leads out of the source export through a symlink of commit {commit[:12]}"
            )
        return path

    for relative in fork.wheel.clean:
        remove_tree(inside("clean", relative, root / relative))
    project = root / fork.wheel.project_dir
    inside("project_dir", fork.wheel.project_dir, project / "x")
    written = {
        relative: text.format(version=version, commit=commit)
        for relative, text in fork.wheel.write_files.items()
    }
    prefix = f"{fork.wheel.project_dir.strip('/')}/" if fork.wheel.project_dir else ""
    if fork.wheel.file_list:
        present = {path.removeprefix(prefix) for path in exported if path.startswith(prefix)}
        present = {path for path in present if (project / path).is_file()} | written.keys()
        written[fork.wheel.file_list] = "".join(f"{path}\n" for path in sorted(present))
    for relative, text in written.items():
        key = "file_list" if relative == fork.wheel.file_list else f"write_files.{relative}"
        path = inside(key, relative, project / relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():  # replaced, never written through
            path.unlink()
        path.write_text(text)
        path.chmod(0o644)  # the wheel records modes: not this host's umask
    return project


def _backend_home(exported: Path) -> Path:
    """An empty HOME for the backend, in the export's folder beside the source: it goes with
    the export, and a killed build's with the killed export (the next build clears those)."""
    home = exported / "backend-home"
    home.mkdir()
    return home


def _run_build(
    source: Path, fork: Fork, env: dict[str, str], outdir: Path, log_path: Path, home: Path
) -> Path:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    return _build_with(source, fork, env, outdir, log_path, home)


def _build_with(
    source: Path, fork: Fork, env: dict[str, str], outdir: Path, log_path: Path, home: Path
) -> Path:
    project = build.ProjectBuilder(
        source, python_executable=sys.executable, runner=_runner(log_path, env, home)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        missing = project.check_dependencies("wheel")
    _log_warnings(log_path, caught)
    if missing:
        names = ", ".join(sorted(" ".join(req) for req in missing))
        raise BuilderError(
            f"{fork.name}: build requirements missing from builder's environment: {names} "
            "(reinstall builder: pip install -e .)"
        )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            built = project.build("wheel", outdir)
    except build.BuildBackendException:
        raise BuilderError(
            f"{fork.name}: wheel build failed (full log: {log_path}); last lines:\n"
            f"{_log_tail(log_path)}"
        ) from None
    finally:
        _log_warnings(log_path, caught)
    return Path(built)


def _wheel_inputs(
    result: ForkResult, fork: Fork, label: str
) -> tuple[pygit2.Repository, str, dict[str, str], str]:
    """(work repository, wheel version, backend environment, cache key) of a fork's wheel."""
    repo = pygit2.Repository(str(result.checkout.path))
    version = wheel_version(fork, label, result.fork_commit)
    env = _build_env(fork, version, repo.get(result.fork_commit).commit_time)
    return repo, version, env, content_key(_cache_inputs(repo, result, fork, version, env))


def wheel_metadata(wheel: Path) -> str:
    """A wheel's METADATA text."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def declared_metadata(cache_dir: Path, result: ForkResult, fork: Fork, label: str) -> str:
    """The METADATA the fork's wheel has, without building it where that can be avoided:
    from the cached wheel; for a release-sourced upstream, from the fork commit's own
    `.dist-info/`; else from the backend's prepare_metadata_for_build_wheel (no compile)."""
    repo, version, env, key = _wheel_inputs(result, fork, label)
    record_path = cache_dir / "wheels" / key / "wheel.json"
    if record_path.is_file():
        wheel = record_path.parent / json.loads(record_path.read_text())["filename"]
        if wheel.is_file():
            return wheel_metadata(wheel)
    tree = repo.get(result.fork_commit).peel(pygit2.Tree)
    if fork.release:
        found = [e.name for e in tree if e.name.endswith(".dist-info")]
        if len(found) != 1 or "METADATA" not in tree[found[0]].peel(pygit2.Tree):
            raise BuilderError(f"{fork.release.filename}: no single .dist-info/METADATA")
        return repo.get(tree[found[0]].peel(pygit2.Tree)["METADATA"].id).data.decode()
    with tempfile.TemporaryDirectory(prefix=".source-", dir=cache_dir) as exported:
        source = _export_source(repo, fork, result.fork_commit, version, Path(exported) / "src")
        log_path = cache_dir / "logs" / f"{fork.name}-metadata.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
        backend_env = {**env, "GIT_CEILING_DIRECTORIES": exported}
        project = build.ProjectBuilder(
            source,
            python_executable=sys.executable,
            runner=_runner(log_path, backend_env, _backend_home(Path(exported))),
        )
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                info = Path(project.metadata_path(Path(exported) / "metadata"))
        except build.BuildBackendException:
            raise BuilderError(
                f"{fork.name}: the backend could not say its metadata (full log: "
                f"{log_path}); last lines:\n{_log_tail(log_path)}"
            ) from None
        finally:
            _log_warnings(log_path, caught)
        return (info / "METADATA").read_text()


def build_wheel(
    cache_dir: Path, result: ForkResult, fork: Fork, label: str, wheelhouse: Path
) -> BuiltWheel:
    """The fork's wheel from the cache, or built, verified and cached; copied to the wheelhouse."""
    repo, version, env, key = _wheel_inputs(result, fork, label)
    entry = cache_dir / "wheels" / key
    record_path = entry / "wheel.json"

    cached = False
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        wheel_path = entry / record["filename"]
        if wheel_path.is_file() and sha256_file(wheel_path) == record["sha256"]:
            cached = True
            progress.info(
                f"[green]✓[/] {fork.name}: wheel {record['filename']} unchanged (cache hit)"
            )
    if not cached:
        for leftover in cache_dir.glob(".source-*"):  # a killed build's (the cache is locked)
            remove_tree(leftover)
        with (
            staging_dir(entry) as staging,
            tempfile.TemporaryDirectory(prefix=".source-", dir=cache_dir) as exported,
        ):
            if fork.release:
                with progress.task(f"repack wheel {fork.wheel.dist_name} {version}"):
                    kept = release.cached(cache_dir, fork.release.filename)
                    built = repack(repo, result.fork_commit, fork, version, staging, kept)
            else:
                with progress.task(f"build wheel {fork.wheel.dist_name} {version}"):
                    source = _export_source(
                        repo, fork, result.fork_commit, version, Path(exported) / fork.name
                    )
                    log_path = cache_dir / "logs" / f"{fork.name}-wheel.log"
                    # No repository above the export either (git looks upward for one).
                    backend_env = {**env, "GIT_CEILING_DIRECTORIES": exported}
                    home = _backend_home(Path(exported))
                    built = _run_build(source, fork, backend_env, staging, log_path, home)
            verify_wheel(built, fork, version, result.patches)
            record = {"filename": built.name, "sha256": sha256_file(built), "key": key}
            (staging / "wheel.json").write_text(json.dumps(record, indent=2))
        wheel_path = entry / record["filename"]

    for stale in wheelhouse.glob("*.whl"):
        stale_name = parse_wheel_filename(stale.name)[0]
        if stale_name == canonicalize_name(fork.wheel.dist_name) and stale.name != wheel_path.name:
            stale.unlink()
    destination = wheelhouse / wheel_path.name
    if not destination.is_file() or sha256_file(destination) != record["sha256"]:
        atomic_copy(wheel_path, destination)
    return BuiltWheel(
        name=fork.name,
        dist_name=fork.wheel.dist_name,
        version=version,
        filename=wheel_path.name,
        sha256=record["sha256"],
        size=destination.stat().st_size,
        cache_key=key,
        cached=cached,
        path=destination,
    )
