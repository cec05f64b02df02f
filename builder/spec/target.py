"""Targets and upstream pins, read from the project data (`images/`, `forks/`).

A target (`images/<name>/target.toml`) says what to build for one GPU family; a fork
(`forks/<upstream>/pin.toml` + `patches/<series>/`) says which upstream commit to start
from and how to build its wheel. Every problem is reported as one line naming the file
and the field.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.core.errors import BuilderError
from builder.core.tomlfile import load_toml
from builder.spec import engines
from builder.spec.cuda import MIN_CUDA_FOR_ARCH, arch_base

# --- which generator calls the kernel-builder container may run ---------------------------
# One rule for the target's `[[jit.modules]]`, `--jit-modules` and kernel packs. The warm-up
# imports the module and calls the function a generator entry names, inside a container of
# the kernel-builder stage, and what it makes is native code in every image. So an entry must
# be a public `gen_*` function of a `flashinfer.jit` module (none of the `gen_customize_*`
# ones, which take C++ source), with plain arguments only: numbers, bool, None, short
# identifier-like strings and `torch.<dtype>`, what chooses among FlashInfer's own templates.


_GENERATOR = re.compile(r"flashinfer\.jit(\.[a-z_][a-z0-9_]*)*:gen_\w+(\(.*\))?", re.DOTALL)
_TORCH_NAME = re.compile(r"[a-z][a-z0-9_]*")
_PLAIN_STRING = re.compile(r"[A-Za-z0-9_.]{0,64}")  # as images/sm120/jit_journal.py notes
_MAX_LENGTH = 2000
GENERATOR_RULE = "flashinfer.jit.<module>:gen_<name>(plain arguments)"


def _plain_argument(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, str):
            return bool(_PLAIN_STRING.fullmatch(value))
        return value is None or type(value) in (bool, int, float)
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and bool(_TORCH_NAME.fullmatch(node.attr))
    )


def is_flashinfer_call(entry: str) -> bool:
    """`flashinfer.jit.x:gen_y` or `flashinfer.jit.x:gen_y(plain, arguments=...)`."""
    if len(entry) > _MAX_LENGTH or not _GENERATOR.fullmatch(entry):
        return False
    function = entry.partition(":")[2]
    if "customize" in function.split("(")[0]:
        return False
    try:
        call = ast.parse(function, mode="eval").body
    except SyntaxError:
        return False
    if isinstance(call, ast.Name):
        return True
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return False
    if any(keyword.arg is None for keyword in call.keywords):
        return False
    return all(_plain_argument(node) for node in [*call.args, *(k.value for k in call.keywords)])


_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_ARCH_RE = re.compile(r"^\d+\.\d+[af]?$")
_LABEL_RE = re.compile(r"^[a-z0-9]+$")


@dataclass(frozen=True)
class WheelBuild:
    """How to build one upstream's wheel from its fork checkout."""

    dist_name: str
    project_dir: str
    version_env: str
    version_env_value: str  # "{version}" or "{local}", formatted at build time
    clean: tuple[str, ...]
    must_contain: tuple[str, ...]
    # What the backend would ask git for, written into the exported tree instead (the build
    # sees no .git): {path in project_dir: text with {version} and {commit}}.
    write_files: dict[str, str] = field(default_factory=dict)
    # A file (in project_dir) listing the tracked files under project_dir, for backends whose
    # file finder would run `git ls-files` (setuptools-scm reads an egg-info SOURCES.txt).
    file_list: str = ""
    # Settings for the upstream's build backend (it sees no other variable of builder's).
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseSource:
    """A released wheel as the upstream source (`source = "release"` in pin.toml): the
    fork's `url` is the package index, `ref` this file's name, `commit` the commit its
    files make (builder/build/release.py)."""

    filename: str
    sha256: str
    python_tag: str  # e.g. cp312: the image's Python must match
    stable_abi: bool = False  # cp38-abi3: any CPython from that version on


@dataclass(frozen=True)
class Fork:
    """One upstream: where it comes from, which commit, which patch series, how to build."""

    name: str
    url: str
    ref: str
    commit: str
    version: str
    reason: str
    wheel: WheelBuild
    directory: Path
    release: ReleaseSource | None = None

    def series_dir(self, series: str) -> Path:
        return self.directory / "patches" / series

    def patch_files(self, series: str) -> list[Path]:
        directory = self.series_dir(series)
        if not directory.is_dir():
            raise BuilderError(f"{directory}: patch series '{series}' does not exist")
        return sorted(directory.glob("*.patch"))


@dataclass(frozen=True)
class UpstreamUse:
    """A target's use of one fork: which patch series it applies."""

    fork: Fork
    series: str


@dataclass(frozen=True)
class ImageSettings:
    """How the target's image is built (all overridable from the command line)."""

    base: str
    dockerfile: Path
    repository: str
    pip_index_url: str
    pip_extra_index_url: str
    requirements: tuple[str, ...]  # pinned on top of the wheels' own requirements
    exclude_requirements: tuple[str, ...]  # never installed (e.g. flashinfer-jit-cache)
    # Distributions the lock may take as a source distribution: resolving one runs its build
    # code on the host, so none by default (the lock records the list).
    build_from_source: tuple[str, ...]
    python: str  # the image's interpreter (X.Y): what the lock is resolved for
    platform: str  # uv's --python-platform for the lock, e.g. x86_64-manylinux_2_39
    lock: Path  # the reviewed runtime lock (`builder lock`); the image installs from it
    # Files for the build context from outside the Dockerfile's folder (another target's
    # shared image scripts), by their own name.
    context_files: tuple[Path, ...] = ()


@dataclass(frozen=True)
class JitModule:
    """One FlashInfer module pre-compiled for the target, and why the server loads it."""

    generator: str  # flashinfer.jit.<module>:gen_<name> or ...:gen_<name>(args)
    # `key=value` (as /server_info reports it), `env:NAME=value` or `always`; alternatives
    # joined by " | " (any of them loads it)
    loaded_when: str
    call_site: str  # where sglang loads it

    @property
    def settings(self) -> tuple[str, ...]:
        return tuple(part.strip() for part in self.loaded_when.split("|"))


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    local_label: str
    cuda_version: Version
    arch_list: tuple[str, ...]
    image: ImageSettings
    upstreams: dict[str, UpstreamUse]
    jit: tuple[JitModule, ...]
    jit_job_memory_gb: float
    file: Path
    raw: dict[str, Any] = field(repr=False, compare=False)
    # The serving engine the image runs (builder/spec/engines): its upstream is the one of
    # that name, and its wheel the image's server.
    engine: str = engines.DEFAULT

    @property
    def jit_modules(self) -> tuple[str, ...]:
        return tuple(module.generator for module in self.jit)


class _Reader:
    """Typed access to a parsed TOML table that names file and field on every error."""

    def __init__(self, path: Path, table: dict[str, Any], prefix: str = "") -> None:
        self.path = path
        self.table = table
        self.prefix = prefix

    def fail(self, key: str, message: str) -> BuilderError:
        return BuilderError(f"{self.path}: field '{self.prefix}{key}' {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.table:
            if default is ...:
                raise self.fail(key, "is missing")
            return default
        value = self.table[key]
        if not isinstance(value, kind):
            expected = (
                " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
            )
            raise self.fail(key, f"must be a {expected}, not {type(value).__name__}")
        return value

    def sub(self, key: str, default: Any = ...) -> _Reader:
        table = self.get(key, dict, default)
        return _Reader(self.path, table or {}, f"{self.prefix}{key}.")

    def strings(self, key: str, default: Any = ...) -> tuple[str, ...]:
        values = self.get(key, list, default)
        if not all(isinstance(v, str) for v in values):
            raise self.fail(key, "must be a list of strings")
        return tuple(values)


def load_fork(data_dir: Path, name: str) -> Fork:
    path = data_dir / "forks" / name / "pin.toml"
    reader = _Reader(path, load_toml(path))
    commit = reader.get("commit", str)
    if not _SHA_RE.match(commit):
        raise reader.fail("commit", f"must be a full 40-character lowercase SHA, got '{commit}'")
    version = reader.get("version", str)
    try:
        if Version(version).local:
            raise reader.fail("version", "must be the upstream release, without a +local label")
    except InvalidVersion:
        raise reader.fail("version", f"'{version}' is not a PEP 440 version") from None
    build = reader.sub("build")
    source = reader.get("source", str, "git")
    if source not in ("git", "release"):
        raise reader.fail("source", f"is '{source}', expected 'git' or 'release'")
    release = _release(reader, build, version) if source == "release" else None
    env_value = build.get("version_env_value", str, "{version}" if release else ...)
    if env_value not in ("{version}", "{local}"):
        raise build.fail("version_env_value", "must be '{version}' or '{local}'")
    return Fork(
        name=name,
        url=reader.get("url", str),
        ref=reader.get("ref", str),
        commit=commit,
        version=version,
        reason=reader.get("reason", str, ""),
        release=release,
        wheel=WheelBuild(
            dist_name=build.get("dist_name", str),
            project_dir=(
                _relative_path(build, "project_dir", build.get("project_dir", str))
                if build.get("project_dir", str, "")
                else ""
            ),
            version_env=build.get("version_env", str, "" if release else ...),
            version_env_value=env_value,
            clean=tuple(_relative_path(build, "clean", c) for c in build.strings("clean", [])),
            must_contain=build.strings("must_contain", []),
            write_files=_write_files(build),
            env=_backend_env(build),
            file_list=(
                _relative_path(build, "file_list", build.get("file_list", str))
                if "file_list" in build.table
                else ""
            ),
        ),
        directory=path.parent,
    )


def _release(reader: _Reader, build: _Reader, version: str) -> ReleaseSource:
    filename = reader.get("ref", str)
    try:
        dist, wheel_version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        raise reader.fail("ref", f"'{filename}' is not a wheel file name") from None
    if canonicalize_name(dist) != canonicalize_name(build.get("dist_name", str)):
        raise reader.fail("ref", f"'{filename}' is not a build.dist_name wheel")
    if str(wheel_version) != version:
        raise reader.fail("ref", f"'{filename}' is version {wheel_version}, not {version}")
    sha256 = reader.get("sha256", str)
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise reader.fail("sha256", "must be the file's 64-character lowercase sha256")
    python_tags = {tag.interpreter for tag in tags}
    if len(python_tags) != 1:
        raise reader.fail("ref", f"'{filename}' must be for one Python (one file per Python)")
    return ReleaseSource(
        filename, sha256, python_tags.pop(), stable_abi=all(tag.abi == "abi3" for tag in tags)
    )


# `key=value` as /server_info reports it, `env:NAME=value` from the profile's environment,
# or `always` (the model's own code path loads it under every profile).
_SETTING_RE = re.compile(r"^(always|(env:)?\w+=.+)$")


def _runs_on(release: ReleaseSource, python: str) -> bool:
    """Whether CPython `python` (X.Y) installs the release file."""
    if release.python_tag == "py3":
        return True
    wanted = f"cp{python.replace('.', '')}"
    if not release.stable_abi:
        return release.python_tag == wanted
    built_for = re.fullmatch(r"cp3(\d+)", release.python_tag)
    return bool(built_for) and int(built_for.group(1)) <= int(python.split(".")[1])


def _platform(image: _Reader) -> str:
    platform = image.get("platform", str, "x86_64-manylinux_2_28")
    if not re.fullmatch(r"(x86_64|aarch64)-manylinux(_\d+_\d+|2014)", platform):
        raise image.fail("platform", f"is '{platform}', expected e.g. x86_64-manylinux_2_39")
    return platform


def _distribution_names(image: _Reader, key: str) -> tuple[str, ...]:
    names = image.strings(key, [])
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
            raise image.fail(key, f"has '{name}', which is not a distribution name")
    return tuple(sorted({canonicalize_name(name) for name in names}))


def _backend_env(build: _Reader) -> dict[str, str]:
    table = build.get("env", dict, {})
    for name, value in table.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) or not isinstance(value, str):
            raise build.fail(f"env.{name}", 'must be NAME = "string"')
    return dict(table)


def _write_files(build: _Reader) -> dict[str, str]:
    table = build.get("write_files", dict, {})
    for path, text in table.items():
        if not isinstance(text, str):
            raise build.fail(f"write_files.{path}", "must be a string")
        _relative_path(build, f"write_files.{path}", path)
        try:
            text.format(version="", commit="")
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise build.fail(f"write_files.{path}", f"has an unknown placeholder ({exc})") from None
    return dict(table)


def _relative_path(reader: _Reader, key: str, path: str) -> str:
    if not path or Path(path).is_absolute() or ".." in Path(path).parts:
        raise reader.fail(key, f"is '{path}': a path inside the project folder, without '..'")
    return path


def _jit_module(jit: _Reader, entry: Any) -> JitModule:
    if not isinstance(entry, dict):
        raise jit.fail("modules", "must be [[jit.modules]] tables (generator, loaded_when)")
    module = _Reader(jit.path, entry, f"{jit.prefix}modules.")
    generator = module.get("generator", str)
    if not is_flashinfer_call(generator):
        refused = f"'{generator[:200]}' is not a FlashInfer call ({GENERATOR_RULE}): refused"
        raise module.fail("generator", refused)
    loaded_when = module.get("loaded_when", str)
    if not all(_SETTING_RE.match(part.strip()) for part in loaded_when.split("|")):
        raise module.fail(
            "loaded_when", f"'{loaded_when}' is not setting=value, env:NAME=value or always"
        )
    return JitModule(generator, loaded_when, module.get("call_site", str, ""))


def available_targets(data_dir: Path) -> list[str]:
    return sorted(p.parent.name for p in (data_dir / "images").glob("*/target.toml"))


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; anything else (lists included) is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merged(base[key], value)
        else:
            merged[key] = value
    return merged


def _target_table(data_dir: Path, name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A target's table, with `extends = "other"` merged over the other target's (its
    Dockerfile path stays relative to the file that names it; `local_label` is never
    inherited: it defaults to the target's own name)."""
    path = data_dir / "images" / name / "target.toml"
    if not path.is_file():
        known = ", ".join(available_targets(data_dir)) or "none"
        via = f" (extended by {seen[-1]})" if seen else ""
        raise BuilderError(f"unknown target '{name}'{via}: no {path} (known targets: {known})")
    raw = load_toml(path)
    image = raw.get("image")
    if isinstance(image, dict) and isinstance(image.get("dockerfile"), str):
        image["dockerfile"] = str((path.parent / image["dockerfile"]).resolve())
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise BuilderError(f"{path}: field 'extends' must be a target name")
    if parent in (*seen, name):
        raise BuilderError(f"{path}: extends '{parent}', which extends it back")
    base = _target_table(data_dir, parent, (*seen, name))
    base.pop("local_label", None)
    return _merged(base, raw)


def engine_of(target_file: Path) -> str:
    """The engine a target's image serves with (`engine`, through `extends`), read without
    loading the rest of the target."""
    reader = _Reader(target_file, _target_table(target_file.parents[2], target_file.parent.name))
    engine = reader.get("engine", str, engines.DEFAULT)
    if engine not in engines.NAMES:
        raise reader.fail("engine", f"is '{engine}', expected one of {', '.join(engines.NAMES)}")
    return engine


def load_target(data_dir: Path, name: str) -> Target:
    path = data_dir / "images" / name / "target.toml"
    raw = _target_table(data_dir, name)
    reader = _Reader(path, raw)

    label = reader.get("local_label", str, name)
    if not _LABEL_RE.match(label):
        raise reader.fail("local_label", "must be lowercase letters and digits (a PEP 440 label)")

    cuda = reader.sub("cuda")
    try:
        cuda_version = Version(cuda.get("version", str))
    except InvalidVersion:
        raise cuda.fail("version", "is not a version number") from None
    arch_list = cuda.strings("arch_list")
    if not arch_list:
        raise cuda.fail("arch_list", "must name at least one architecture")
    for arch in arch_list:
        if not _ARCH_RE.match(arch):
            raise cuda.fail("arch_list", f"has '{arch}', expected a form like '12.0a' or '9.0'")
        minimum = MIN_CUDA_FOR_ARCH.get(arch_base(arch))
        if minimum is None:
            raise cuda.fail("arch_list", f"has unknown architecture '{arch}'")
        if cuda_version < minimum:
            raise cuda.fail(
                "version",
                f"is {cuda_version}, but arch {arch} needs CUDA >= {minimum}",
            )

    upstreams: dict[str, UpstreamUse] = {}
    table = reader.sub("upstreams")
    if not table.table:
        raise reader.fail("upstreams", "must list at least one upstream")
    for upstream_name in table.table:
        entry = table.sub(upstream_name)
        fork_name = entry.get("fork", str, upstream_name)
        # The fork is known by the upstream's name (work tree, logs, results); its folder
        # under forks/ may carry a version (forks/sglang-0.5.9) when targets differ in pins.
        fork = dataclasses.replace(load_fork(data_dir, fork_name), name=upstream_name)
        upstreams[upstream_name] = UpstreamUse(fork=fork, series=entry.get("series", str))
        upstreams[upstream_name].fork.patch_files(upstreams[upstream_name].series)

    image = reader.sub("image")
    python = image.get("python", str, "3.12")
    if not re.fullmatch(r"3\.\d+", python):
        raise image.fail("python", f"is '{python}', expected the image's Python as X.Y (3.12)")
    for use in upstreams.values():
        release = use.fork.release
        if release and not _runs_on(release, python):
            raise BuilderError(
                f"{use.fork.directory / 'pin.toml'}: field 'ref' names {release.filename}, "
                f"a {release.python_tag} wheel, but the image runs Python {python} ({path})"
            )

    dockerfile = (path.parent / image.get("dockerfile", str, "Dockerfile")).resolve()
    if not dockerfile.is_file():
        raise image.fail("dockerfile", f"points at {dockerfile}, which does not exist")
    listed = image.strings("context_files", [])
    context_files = tuple((path.parent / listed_name).resolve() for listed_name in listed)
    for listed_name, file in zip(listed, context_files, strict=True):
        if not file.is_file():
            raise image.fail("context_files", f"names {listed_name}, which is no file ({file})")
    engine = engine_of(path)
    if engine not in upstreams:
        raise reader.fail(
            "engine", f"is '{engine}', but [upstreams] has no '{engine}' to serve with"
        )
    jit = reader.sub("jit", {})
    modules = tuple(_jit_module(jit, entry) for entry in jit.get("modules", list, []))
    job_memory = jit.get("job_memory_gb", (int, float), 6)
    if isinstance(job_memory, bool) or not (math.isfinite(job_memory) and job_memory > 0):
        raise jit.fail("job_memory_gb", f"is {job_memory}: must be a finite number above 0")

    return Target(
        name=name,
        description=reader.get("description", str, ""),
        local_label=label,
        cuda_version=cuda_version,
        arch_list=arch_list,
        image=ImageSettings(
            base=image.get("base", str),
            dockerfile=dockerfile,
            repository=image.get("repository", str, f"builder-{name}"),
            pip_index_url=image.get("pip_index_url", str, "https://pypi.org/simple"),
            pip_extra_index_url=image.get("pip_extra_index_url", str, ""),
            requirements=image.strings("requirements", []),
            exclude_requirements=image.strings("exclude_requirements", []),
            build_from_source=_distribution_names(image, "build_from_source"),
            python=python,
            platform=_platform(image),
            lock=path.parent / image.get("lock", str, "runtime-lock.txt"),
            context_files=context_files,
        ),
        upstreams=upstreams,
        jit=modules,
        jit_job_memory_gb=float(job_memory),
        file=path,
        raw=raw,
        engine=engine,
    )
