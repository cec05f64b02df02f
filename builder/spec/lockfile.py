"""The runtime lock: the image's whole Python environment, each `name==version` + sha256.

`builder lock` resolves the runtime requirements (the target's pins and the patched
wheels' own requirements) once, with uv, for the target's Python and platform, into a
reviewed file under images/<target>/. The image installs from it with `--require-hashes`:
one lock, one set of packages, whatever the index offers on the day of the build.

Resolving never builds: uv takes wheels only, because reading a source distribution's metadata
runs its build backend here, with this host's HOME and the index's credentials at hand, and
whoever publishes any release in the dependency tree would choose that code. A distribution a
site must take as source is named in the target's `[image] build_from_source`, and the lock
records the list.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.core.cache import content_key
from builder.core.errors import BuilderError
from builder.core.urls import redact

_HEADER = re.compile(
    r"^# (python|platform|index|inputs|base provides|builds from source): (\S+)$", re.MULTILINE
)
# pip's forms: --hash=sha256:HEX or --hash sha256:HEX (sha384/sha512 accepted as well).
_HASH = re.compile(r"--hash[= ](sha256|sha384|sha512):([0-9a-fA-F]+)")
_OPTIONS = re.compile(r"\s--?[A-Za-z]")


def metadata_requirements(metadata: str) -> list[Requirement]:
    """A distribution's Requires-Dist lines (from its METADATA), extras' own left out."""
    found = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if not (requirement.marker and "extra" in str(requirement.marker)):
                found.append(requirement)
    return found


@dataclass(frozen=True)
class LockedPackage:
    name: str  # canonical
    version: str
    hashes: tuple[str, ...]  # its sha256 digests (lowercase hex)
    pinned_by_hash: bool  # any --hash (sha256, sha384 or sha512)
    line: int


@dataclass(frozen=True)
class Lock:
    path: Path
    text: str
    packages: dict[str, LockedPackage]
    header: dict[str, str]  # python, platform, index, inputs, base provides, builds from source
    options: tuple[str, ...]  # pip option lines (--find-links ...): a user's file only

    @property
    def hashed(self) -> bool:
        return any(package.pinned_by_hash for package in self.packages.values())

    @property
    def base_provides(self) -> tuple[str, ...]:
        """What the lock leaves to the base image's Python (`builder lock --base-provides`):
        the image's venv sees the base's packages."""
        listed = self.header.get("base provides", "")
        return tuple(name for name in listed.split(",") if name)

    @property
    def made_by_builder(self) -> bool:
        """Resolved by `builder lock` (wheels only), not a user's own requirements file."""
        return "python" in self.header and "inputs" in self.header

    @property
    def builds_from_source(self) -> tuple[str, ...]:
        """The distributions its resolution was allowed to take as source (the target's
        `[image] build_from_source` when it was made)."""
        listed = self.header.get("builds from source", "")
        return tuple(name for name in listed.split(",") if name)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def record(self) -> dict:
        """What the manifest says the runtime stage installed from."""
        return {
            "file": str(self.path),
            "sha256": self.sha256,
            "hashed": self.hashed,
            "base_provides": list(self.base_provides),
            "builds_from_source": list(self.builds_from_source),
        }


def requirement_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with `\\` continuations joined and comments dropped."""
    joined: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            joined.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        joined.append((start, pending.strip()))
    return joined


def requirement_of(path: Path, number: int, line: str) -> Requirement:
    """The requirement of one logical line, without its per-line options (--hash ...)."""
    text = _OPTIONS.split(" " + line, maxsplit=1)[0].strip()
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise BuilderError(
            f"{path}:{number}: not a requirement: {str(exc).splitlines()[0]}"
        ) from None


def parse(path: Path, text: str | None = None) -> Lock:
    """Every entry of a requirements file; when any entry carries a hash, all must, each
    pinned with `==` (the form `pip install --require-hashes` takes), each listed once."""
    if text is None:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise BuilderError(f"{path}: not a requirements file (not UTF-8 text)") from None
    packages: dict[str, LockedPackage] = {}
    options: list[str] = []
    for number, line in requirement_lines(text):
        if line.startswith("-"):
            options.append(line)
            continue
        requirement = requirement_of(path, number, line)
        pins = [spec for spec in requirement.specifier if spec.operator in ("==", "===")]
        name = canonicalize_name(requirement.name)
        if name in packages:
            raise BuilderError(
                f"{path}:{number}: {name} is listed twice (first at line {packages[name].line})"
            )
        packages[name] = LockedPackage(
            name=name,
            version=pins[0].version if len(pins) == 1 and "*" not in pins[0].version else "",
            hashes=tuple(d.lower() for a, d in _HASH.findall(line) if a == "sha256"),
            pinned_by_hash=bool(_HASH.search(line)),
            line=number,
        )
    header = dict(_HEADER.findall(text))
    lock = Lock(path=path, text=text, packages=packages, header=header, options=tuple(options))
    if lock.hashed:
        for package in packages.values():
            if not package.version or not package.pinned_by_hash:
                raise BuilderError(
                    f"{path}:{package.line}: {package.name} is not pinned with == and a "
                    "--hash: with hashes on any entry, every entry needs both "
                    "(pip --require-hashes)"
                )
    return lock


def refuse_names(lock: Lock, names: set[str], why: str, fix: str = "remove it") -> None:
    """One line naming the file, the line and the package that must not be in it."""
    for name in sorted(names):
        found = lock.packages.get(canonicalize_name(name))
        if found is not None:
            raise BuilderError(f"{lock.path}:{found.line}: lists {found.name}, {why}; {fix}")


def refuse_excluded(lock: Lock, excluded: tuple[str, ...]) -> None:
    """A package the target keeps out of the image (flashinfer-jit-cache) is refused from
    any file, the lock and a user's --runtime-requirements alike."""
    refuse_names(lock, set(excluded), "which the target's [image] exclude_requirements keeps out")


def target_environment(python: str, platform: str) -> dict[str, str]:
    """PEP 508 marker values for the image's interpreter, not the build host's."""
    machine = platform.split("-")[0]
    return {
        **default_environment(),
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
    }


def unmet(lock: Lock, requirements: list[Requirement], environment: dict[str, str]) -> list[str]:
    """The requirements (the target's pins and the wheels' own) the lock does not satisfy;
    those it leaves to the base image are the base's to meet (checked in the build)."""
    problems = []
    provided = set(lock.base_provides)
    for requirement in requirements:
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        if canonicalize_name(requirement.name) in provided:
            continue
        locked = lock.packages.get(canonicalize_name(requirement.name))
        if locked is None:
            problems.append(f"{requirement} is not in it")
        elif not requirement.specifier.contains(locked.version, prereleases=True):
            problems.append(f"{requirement} is not met by its {locked.name}=={locked.version}")
    return problems


def inputs_digest(requirements: list[str]) -> str:
    """What a lock was resolved from, as its header records it."""
    return content_key({"requirements": "".join(f"{line}\n" for line in requirements)})[:16]


def refuse_stale(
    chosen: Lock,
    *,
    target: str,
    python: str,
    platform: str,
    requirements: list[Requirement],
    build_from_source: tuple[str, ...] = (),
) -> None:
    """The target's lock must be hashed, made for the image's Python and platform, satisfy
    every requirement, have been resolved from exactly these requirements and with exactly
    the target's allowance of source distributions."""
    fix = f"run `builder lock --target {target}` and review the change"
    path = chosen.path
    if chosen.options:
        raise BuilderError(f"{path}: '{chosen.options[0]}': a lock lists packages only; {fix}")
    if not chosen.hashed:
        raise BuilderError(f"{path}: the runtime lock has no hashes; {fix}")
    for field, wanted in (("python", python), ("platform", platform)):
        found = chosen.header.get(field, "unknown")
        if found != wanted:
            raise BuilderError(f"{path}: made for {field} {found}, the target's is {wanted}; {fix}")
    stale = unmet(chosen, requirements, target_environment(python, platform))
    if stale:
        raise BuilderError(f"{path}: stale lock: {'; '.join(stale)}; {fix}")
    if chosen.header.get("inputs") != inputs_digest([str(r) for r in requirements]):
        raise BuilderError(
            f"{path}: stale lock: resolved from other requirements than the wheels' and the "
            f"target's pins now (one was added, dropped or changed); {fix}"
        )
    if chosen.builds_from_source != tuple(sorted(build_from_source)):
        made = ", ".join(chosen.builds_from_source) or "none"
        now = ", ".join(sorted(build_from_source)) or "none"
        raise BuilderError(
            f"{path}: stale lock: resolved with source distributions allowed for {made}, the "
            f"target's [image] build_from_source is {now}; {fix}"
        )


def header(
    target: str,
    python: str,
    platform: str,
    index: str,
    inputs: list[str],
    base_provides: tuple[str, ...] = (),
    build_from_source: tuple[str, ...] = (),
) -> str:
    made_by = f"builder lock --target {target}" + "".join(
        f" --base-provides {name}" for name in base_provides
    )
    text = (
        f"# The runtime lock of target {target}: every package of the image's Python\n"
        f"# environment but builder's own wheels, pinned with its sha256. Made by\n"
        f"# `{made_by}`; review changes like code, do not edit by hand.\n"
        f"# python: {python}\n# platform: {platform}\n# index: {redact(index)}\n"
        f"# inputs: {inputs_digest(inputs)}\n"
    )
    if base_provides:  # and whatever only they require: the base's Python has it
        text += f"# base provides: {','.join(base_provides)}\n"
    if build_from_source:  # the target's allowance: each of these ran its build code here
        text += f"# builds from source: {','.join(sorted(build_from_source))}\n"
    return text
