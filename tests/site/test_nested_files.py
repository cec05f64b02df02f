"""A sweep's files nested too deep for Python's JSON reader (review of #54): one line, exit 1,
never an internal error."""

from __future__ import annotations

from pathlib import Path

from builder.cli.main import main

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_deeply_nested_chosen_json_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "chosen.json").write_text(DEEP)
    code = main(["deploy-files", "--profile", "chosen", "--qualify-dir", str(tmp_path),
                 "--out", str(tmp_path / "deploy")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert err[-1].startswith(f"error: {tmp_path / 'chosen.json'}: not a readable chosen.json")
    assert not (tmp_path / "deploy").exists()


def test_a_deeply_nested_receipt_to_compare_is_one_line(tmp_path: Path, capsys) -> None:
    receipt = tmp_path / "receipt.json"
    receipt.write_text(DEEP)
    code = main(["qualify", "--compare", str(receipt), str(receipt)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert err[-1].startswith(f"error: --compare {receipt}: not a readable receipt")
