"""Outside text shown to a person: builder/core/untrusted.py."""

from __future__ import annotations

from builder.core.untrusted import markdown_inert, printable


def test_terminal_escapes_are_shown_not_obeyed():
    hostile = "sglang-0.6.0\x1b[2K\rclean.whl\u202eexe.\x07"
    shown = printable(hostile)
    assert "\x1b" not in shown and "\r" not in shown and "\u202e" not in shown
    assert shown == "sglang-0.6.0\\x1b[2K\\x0dclean.whl\\u202eexe.\\x07"


def test_long_outside_strings_are_cut():
    assert printable("a" * 1000, limit=50) == "a" * 49 + "…"


def test_markdown_from_outside_renders_as_itself():
    shown = markdown_inert("[click](https://evil.example) ![x](y) # head | cell `code`")
    assert "[" not in shown.replace("\\[", "") and "](" not in shown
    assert shown.startswith("\\[click\\]\\(https://evil\\.example\\)")
    assert "\\|" in shown and "\\`code\\`" in shown
