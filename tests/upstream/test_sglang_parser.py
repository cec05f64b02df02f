"""builder.upstream.sglang_parser on small `sglang` packages written to tmp_path: how the
`ArgumentParser(...)` of `prepare_server_args` is read. Nothing here is imported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from builder.upstream.pysource import ExtractionError
from builder.upstream.sglang_parser import parser_settings

SERVER_ARGS = """
import argparse

def prepare_server_args(argv):
    parser = argparse.ArgumentParser({keywords})
    return parser.parse_args(argv)
"""


def _sglang(root: Path, keywords: str) -> Path:
    package = root / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "srt/__init__.py").write_text("")
    text = textwrap.dedent(SERVER_ARGS).format(keywords=keywords)
    (package / "srt/server_args.py").write_text(text)
    return package


def test_a_keyword_the_flags_do_not_need_may_be_any_expression(tmp_path: Path) -> None:
    package = _sglang(tmp_path, "formatter_class=argparse.RawTextHelpFormatter, allow_abbrev=False")
    settings = parser_settings(package)
    assert settings["allow_abbrev"] is False and settings["add_help"] is True
    assert "formatter_class" not in settings
    assert settings["origin"] == "srt/server_args.py:5"


def test_a_setting_the_flags_need_that_is_not_a_literal_is_named(tmp_path: Path) -> None:
    package = _sglang(tmp_path, "add_help=HELP")
    with pytest.raises(ExtractionError) as raised:
        parser_settings(package)
    assert (
        str(raised.value) == "srt/server_args.py:5: ArgumentParser(add_help=...) is not a literal"
    )
