"""Showing text that came from outside (an index's file names, a server's reason phrase, a
record on a shared volume): control characters escaped, so nothing a stranger wrote moves the
terminal's cursor, rewrites a line or hides in a report; Markdown made inert where it goes
into one; long strings cut."""

from __future__ import annotations

import re

SHOWN_MAX = 200  # characters of one outside string in a line a person reads
# C0, DEL, C1 and the Unicode format/separator characters that reorder or hide text
# (bidi overrides, zero-width joiners, line/paragraph separators).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~])")


def printable(text: object, limit: int = SHOWN_MAX) -> str:
    """`text` with every control character as a visible escape (`\\x1b`, `\\u202e`), cut to
    `limit` characters with `…` marking the cut."""
    shown = _CONTROL.sub(_escape, str(text))
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def markdown_inert(text: object, limit: int = SHOWN_MAX) -> str:
    """`printable(text)` with every Markdown metacharacter backslash-escaped: a file name
    shows as itself in a rendered report, never as a link, an image or a heading."""
    return _MARKDOWN.sub(r"\\\1", printable(text, limit))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def has_control(text: str) -> bool:
    """Whether `text` holds a character `printable` would escape: no file name or URL an
    index gives is taken with one."""
    return _CONTROL.search(text) is not None
