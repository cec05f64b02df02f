"""Checks of command-line input made before any fetch, build or network call: each failure
is one BuilderError naming the flag and the value."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from builder.core.errors import BuilderError
from builder.core.urls import redact

# A repository as `docker push` takes it: [host[:port]/]path, lowercase, no tag or digest.
_HOST = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^(?:{_HOST}(?::\d+)?/)?{_COMPONENT}(?:/{_COMPONENT})*$")


def _shown(value: str) -> str:
    """A value as an error line shows it: as given, or quoted where it holds a line break
    or another non-printable character (the error stays one line)."""
    return value if value.isprintable() else repr(value)


def writable_dir(flag: str, value: str) -> Path:
    """A directory that exists or can be created, and can be written: proven by making and
    removing a probe directory in it (or in its nearest existing parent), nothing left."""
    path = Path(value).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise BuilderError(f"{flag} {value}: exists and is not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise BuilderError(f"{flag} {value}: {existing} is not a directory")
    try:
        Path(tempfile.mkdtemp(prefix=".builder-probe-", dir=existing)).rmdir()
    except OSError as exc:
        raise BuilderError(f"{flag} {value}: cannot create or write it ({exc.strerror})") from None
    return path


def _http_parts(value: str) -> SplitResult | None:
    """An http(s) URL with a host, split; None for anything else (a bad port or an unclosed
    [IPv6 address included: urlsplit raises on those)."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return None
    return parts if parts.scheme in ("http", "https") and parts.hostname else None


def http_url(flag: str, value: str) -> str:
    if _http_parts(value) is None:
        raise BuilderError(f"{flag} {redact(value)}: expected an http(s)://HOST/... URL")
    return value


def repository(flag: str, value: str) -> str:
    if ":" in value.rsplit("/", 1)[-1] or "@" in value:
        raise BuilderError(
            f"{flag} {_shown(value)}: give a repository without a tag or digest (builder tags "
            "the image with its inputs)"
        )
    if not _REPOSITORY.match(value):
        raise BuilderError(
            f"{flag} {_shown(value)}: not a valid image repository (lowercase "
            "[HOST[:PORT]/]PATH, e.g. registry.example.com/ml/sglang-sm120)"
        )
    return value


_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def image_reference(flag: str, value: str) -> str:
    """`REPOSITORY[:TAG][@sha256:DIGEST]`, as `docker pull` takes it."""
    name, _, digest = value.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = last.partition(":")[2] if ":" in last else ""
    repository = name[: len(name) - len(tag) - 1] if tag else name
    if (
        not _REPOSITORY.match(repository)
        or (tag and not _TAG.match(tag))
        or (digest and not _DIGEST.match(digest))
    ):
        raise BuilderError(
            f"{flag} {_shown(value)}: not an image reference (REPOSITORY[:TAG][@sha256:DIGEST], "
            "e.g. registry.example.com/ml/sglang-sm120@sha256:...)"
        )
    return value


def human_tag(flag: str, value: str) -> str:
    """A tag a person chooses (`--tag release-3`): docker's tag rule."""
    if not _TAG.match(value):
        raise BuilderError(
            f"{flag} {_shown(value)}: not an image tag (letters, digits, '_', '.', '-'; "
            "at most 128, not starting with '.' or '-')"
        )
    return value


def server_url(what: str, value: str) -> str:
    """A server root, `http(s)://HOST:PORT` (the readiness stages add their own paths)."""
    parts = _http_parts(value)
    if parts is None:
        raise BuilderError(f"{what} '{redact(value)}': expected http://HOST:PORT")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BuilderError(f"{what} '{redact(value)}': give the server root, e.g. http://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        raise BuilderError(
            f"{what} '{redact(value)}': credentials in the URL are not sent to a server; "
            "sglang takes an API key: --api-key-file FILE"
        )
    return value.rstrip("/")


def python_version(setting: str, value: str) -> None:
    if not re.fullmatch(r"3\.\d+", value):
        raise BuilderError(f"{setting} {value!r}: expected the image's Python as X.Y, e.g. 3.12")


def python_platform(setting: str, value: str) -> None:
    """uv's --python-platform for a Linux image: ARCH-manylinux_X_Y (or manylinux2014)."""
    if not re.fullmatch(r"(x86_64|aarch64)-manylinux(_\d+_\d+|2014)", value):
        raise BuilderError(
            f"{setting} {value!r}: expected ARCH-manylinux_X_Y for the image's glibc, "
            "e.g. x86_64-manylinux_2_39 (Ubuntu 24.04) or x86_64-manylinux_2_28"
        )


def distribution_name(setting: str, value: str) -> str:
    """A PyPI distribution name (PEP 508), canonicalized."""
    from packaging.utils import canonicalize_name

    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        raise BuilderError(f"{setting} {value!r}: expected a distribution name, e.g. torch")
    return canonicalize_name(value)


# One rule for every time flag: a number with its unit (90s, 20m, 1.5h), or a bare number
# in the flag's own unit, which its metavar names (--deadline MINUTES, --poll SECONDS).
UNITS = "90s, 20m, 1.5h"  # as --help shows the rule
_SECONDS_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}
_UNIT_WORDS = {"s": "seconds", "m": "minutes", "h": "hours"}
# A bare number longer than this is more likely the other unit (`--deadline 1200` meant as
# 20 min, read as 20 h): refused, with the spelling that says it. A server start takes
# minutes to an hour or two; with its unit (`20h`), a longer time is taken as written.
BARE_LIMIT_S = 6 * 3600.0
LONGEST_S = 7 * 24 * 3600.0  # past a week: a typo, and too long for a sleep to take


def duration(
    flag: str,
    text: str | None,
    bare_unit: str,
    minimum: float | None = None,
    above: float | None = None,
) -> float | None:
    """Seconds from `90s`, `20m`, `1.5h`, or a bare number in `bare_unit` ("s" or "m");
    None stays None (the flag was not given). `minimum` (inclusive) and `above` (exclusive)
    are in seconds. Each failure is one BuilderError naming the flag."""
    if text is None:
        return None
    unit_word = _UNIT_WORDS[bare_unit]
    scale = _SECONDS_PER[bare_unit]
    bound = ""
    if minimum is not None:
        bound = f", {minimum / scale:g} or more"
    elif above is not None:
        bound = f" above {above / scale:g}"
    rule = f"must be a number of {unit_word}{bound} (or with a unit: {UNITS})"
    bare = text[-1:] not in _SECONDS_PER
    number, unit = (text, bare_unit) if bare else (text[:-1], text[-1])
    try:
        seconds = float(number) * _SECONDS_PER[unit]
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or number.strip() != number or "_" in number:
        raise BuilderError(f"{flag} {_shown(text)}: {rule}")
    if (minimum is not None and seconds < minimum) or (above is not None and seconds <= above):
        raise BuilderError(f"{flag} {_shown(text)}: {rule}")
    if bare and seconds > BARE_LIMIT_S:  # before the week's limit: the likely slip, and its fix
        hours = f"{seconds / 3600:.3g} h"
        other = f"write {text}s for seconds, or " if bare_unit != "s" else "write "
        raise BuilderError(
            f"{flag} {text}: a bare number is {unit_word} here, {hours}; {other}"
            f"{text}{bare_unit} if you mean {hours}"
        )
    if seconds > LONGEST_S:
        raise BuilderError(f"{flag} {_shown(text)}: at most a week (168h)")
    return seconds
