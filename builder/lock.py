"""The runtime lock: the image's whole Python environment, each `name==version` + sha256.

`builder lock` resolves the runtime requirements (the target's pins and the patched
wheels' own requirements) once, with uv, for the target's Python and platform, into a
reviewed file under images/<target>/. The image installs from it with `--require-hashes`:
one lock, one set of packages, whatever the index offers on the day of the build.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder import progress
from builder.cache import atomic_write_text, content_key
from builder.errors import BuilderError
from builder.urls import redact

_HEADER = re.compile(r"^# (python|platform|index|inputs): (\S+)$", re.MULTILINE)
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class LockedPackage:
    name: str  # canonical
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Lock:
    path: Path
    text: str
    packages: dict[str, LockedPackage]
    header: dict[str, str]  # python, platform, index, inputs (as `builder lock` wrote them)

    @property
    def hashed(self) -> bool:
        return any(package.hashes for package in self.packages.values())


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


def parse(path: Path, text: str | None = None) -> Lock:
    """Every entry of a requirements file; when any entry carries a hash, all must, each
    pinned with `==` (the form `pip install --require-hashes` takes)."""
    text = path.read_text() if text is None else text
    packages: dict[str, LockedPackage] = {}
    for number, line in requirement_lines(text):
        if line.startswith("-"):
            raise BuilderError(
                f"{path}:{number}: '{line.split()[0]}': a lock lists packages only "
                "(index URLs and other options come from the target or the command line)"
            )
        requirement_text = line.split(" --hash", 1)[0].strip()
        try:
            requirement = Requirement(requirement_text)
        except InvalidRequirement as exc:
            raise BuilderError(f"{path}:{number}: not a requirement: {exc}") from None
        pins = [spec for spec in requirement.specifier if spec.operator in ("==", "===")]
        name = canonicalize_name(requirement.name)
        packages[name] = LockedPackage(
            name=name,
            version=pins[0].version if len(pins) == 1 and "*" not in pins[0].version else "",
            hashes=tuple(_HASH.findall(line)),
        )
    lock = Lock(path=path, text=text, packages=packages, header=dict(_HEADER.findall(text)))
    if lock.hashed:
        for package in packages.values():
            if not package.version or not package.hashes:
                raise BuilderError(
                    f"{path}: {package.name} is not pinned with == and a --hash=sha256: "
                    "with hashes on any entry, every entry needs both (pip --require-hashes)"
                )
    return lock


def refuse_excluded(lock: Lock, excluded: tuple[str, ...]) -> None:
    """A package the target never installs (flashinfer-jit-cache) is refused from any file."""
    for name in excluded:
        if canonicalize_name(name) in lock.packages:
            raise BuilderError(
                f"{lock.path}: lists {name}, which this target never installs (its prebuilt "
                "trtllm_comm has no sm_120, and FlashInfer would load it before ours); remove it"
            )


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
    """The requirements (the target's pins and the wheels' own) the lock does not satisfy."""
    problems = []
    for requirement in requirements:
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        locked = lock.packages.get(canonicalize_name(requirement.name))
        if locked is None:
            problems.append(f"{requirement} is not in it")
        elif not requirement.specifier.contains(locked.version, prereleases=True):
            problems.append(f"{requirement} is not met by its {locked.name}=={locked.version}")
    return problems


def header(target: str, python: str, platform: str, index: str, inputs: str) -> str:
    return (
        f"# The runtime lock of target {target}: every package of the image's Python\n"
        f"# environment but builder's own wheels, pinned with its sha256. Made by\n"
        f"# `builder lock --target {target}`; review changes like code, do not edit by hand.\n"
        f"# python: {python}\n# platform: {platform}\n# index: {redact(index)}\n"
        f"# inputs: {content_key({'requirements': inputs})[:16]}\n"
    )


def resolve(
    inputs: str,
    *,
    target: str,
    python: str,
    platform: str,
    index_url: str,
    extra_index_url: str,
    output: Path,
    cache_dir: Path,
) -> Lock:
    """Resolve `inputs` (requirement lines) with uv for the image's Python and platform and
    write the lock to `output` (atomically: a failed resolution leaves the old file)."""
    from uv import find_uv_bin

    with tempfile.TemporaryDirectory(prefix="builder-lock-") as tmp:
        requested = Path(tmp) / "requirements.in"
        requested.write_text(inputs)
        resolved = Path(tmp) / "lock.txt"
        command = [
            find_uv_bin(), "pip", "compile", str(requested), "--output-file", str(resolved),
            "--generate-hashes", "--no-header", "--no-annotate", "--quiet",
            "--python-version", python, "--python-platform", platform,
            "--index-url", index_url, "--no-config", "--color", "never",
        ]  # fmt: skip
        if extra_index_url:
            command += ["--extra-index-url", extra_index_url]
        with progress.task(f"resolve the runtime lock for python {python} on {platform}"):
            run = subprocess.run(
                command, capture_output=True, text=True, env=_uv_environment(cache_dir / "uv")
            )
            if run.returncode:
                detail = " ".join(line.strip() for line in run.stderr.strip().splitlines()[-6:])
                source = redact(index_url)
                raise BuilderError(f"cannot resolve the runtime lock from {source}: {detail}")
        body = resolved.read_text()
    text = header(target, python, platform, index_url, inputs) + body
    lock = parse(output, text)
    atomic_write_text(output, text)
    return lock


def _uv_environment(uv_cache: Path) -> dict[str, str]:
    """uv sees no user config and no credentials but what the index URL carries."""
    keep = ("PATH", "HOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "HTTP_PROXY",
            "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")  # fmt: skip
    return {
        **{k: v for k, v in os.environ.items() if k in keep},
        "UV_CACHE_DIR": str(uv_cache),
        "UV_NATIVE_TLS": "1",  # the system's CA bundle: a TLS-inspecting proxy works
    }
