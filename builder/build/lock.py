"""`builder lock`'s resolve: the runtime lock made with uv, for the target's Python and
platform (the format it writes and the image reads: builder/spec/lockfile.py)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from builder.core import progress
from builder.core.cache import atomic_write_text
from builder.core.errors import BuilderError, Unreachable
from builder.core.untrusted import printable
from builder.core.urls import redact
from builder.spec.lockfile import Lock, header, parse, refuse_names

RESOLVE_TIMEOUT_S = 30 * 60  # uv against a slow index; a hang is not a resolution
# uv's answer when a requirement has only a source distribution (or no wheel for the platform)
_NO_WHEEL = re.compile(
    r"Wheels are required for `([^`]+)`|\b([A-Za-z0-9._-]+)(?:==\S+)? has no usable wheels"
)


def resolve(
    inputs: list[str],
    *,
    target: str,
    python: str,
    platform: str,
    index_url: str,
    extra_index_url: str,
    output: Path,
    cache_dir: Path,
    refused: dict[str, str],
    base_provides: tuple[str, ...] = (),
    build_from_source: tuple[str, ...] = (),
) -> Lock:
    """Resolve `inputs` (requirement lines) with uv for the image's Python and platform and
    write the lock to `output` (atomically: a failed resolution, or one that pulls in a
    package of `refused` {name: why}, leaves the old file). `base_provides` are left out
    with what only they require: an override no platform matches drops them from the
    resolution (the base image's Python has them). Wheels only, but for `build_from_source`:
    a requirement with no wheel for the platform is refused in one line naming it."""
    from uv import find_uv_bin

    with tempfile.TemporaryDirectory(prefix="builder-lock-") as tmp:
        requested = Path(tmp) / "requirements.in"
        requested.write_text("".join(f"{line}\n" for line in inputs))
        resolved = Path(tmp) / "lock.txt"
        command = [
            find_uv_bin(), "pip", "compile", str(requested), "--output-file", str(resolved),
            "--generate-hashes", "--no-header", "--no-annotate", "--quiet",
            "--python-version", python, "--python-platform", platform,
            "--no-config", "--color", "never", "--only-binary", ":all:",
        ]  # fmt: skip
        for name in sorted(build_from_source):  # the source, always: what the lock names
            command += ["--no-binary", name]
        if base_provides:
            overrides = Path(tmp) / "base-provides.txt"
            overrides.write_text("".join(f"{n} ; sys_platform == 'never'\n" for n in base_provides))
            command += ["--overrides", str(overrides)]
        # The index URLs go in the environment: credentials in them stay out of `ps`.
        environment = {**_uv_environment(cache_dir / "uv"), "UV_INDEX_URL": index_url}
        if extra_index_url:
            environment["UV_EXTRA_INDEX_URL"] = extra_index_url
        with progress.task(f"resolve the runtime lock for python {python} on {platform}"):
            try:
                run = subprocess.run(
                    command, capture_output=True, text=True, env=environment,
                    timeout=RESOLVE_TIMEOUT_S,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                raise Unreachable(
                    f"cannot resolve the runtime lock from {redact(index_url)}: no answer "
                    f"within {RESOLVE_TIMEOUT_S // 60} minutes"
                ) from None
            if run.returncode:
                _refuse_missing_wheel(run.stderr, target, python, platform, index_url)
                lines = run.stderr.strip().splitlines()[-6:]
                detail = " ".join(_redact_urls(line.strip()) for line in lines)
                source = redact(index_url)
                raise BuilderError(f"cannot resolve the runtime lock from {source}: {detail}")
        body = resolved.read_text()
    text = header(target, python, platform, index_url, inputs, base_provides, build_from_source)
    text += body
    lock = parse(output, text)
    for name, why in refused.items():
        refuse_names(
            lock, {name}, f"which {why}, pulled in by a dependency",
            "lock not written: pin or exclude that dependency's source of it",
        )  # fmt: skip
    atomic_write_text(output, text)
    return lock


def _refuse_missing_wheel(
    stderr: str, target: str, python: str, platform: str, index_url: str
) -> None:
    found = _NO_WHEEL.search(stderr)
    if found is None:
        return
    name = printable(found.group(1) or found.group(2))
    raise BuilderError(
        f"cannot resolve the runtime lock from {redact(index_url)}: {name} has no wheel for "
        f"python {python} on {platform}, and resolving never builds a source distribution (its "
        f"build code would run on this host); pin a version of it that has a wheel, or, if it "
        f"must come as source, name it in [image] build_from_source of target {target}"
    )


def _redact_urls(text: str) -> str:
    return re.sub(r"\bhttps?://\S+", lambda match: redact(match.group(0)), text)


def _uv_environment(uv_cache: Path) -> dict[str, str]:
    """uv sees no user config and no credentials but what the index URL carries (and, as
    pip would, ~/.netrc)."""
    keep = ("PATH", "HOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "HTTP_PROXY",
            "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")  # fmt: skip
    return {
        **{k: v for k, v in os.environ.items() if k in keep},
        "UV_CACHE_DIR": str(uv_cache),
        "UV_NATIVE_TLS": "1",  # the system's CA bundle: a TLS-inspecting proxy works
    }
