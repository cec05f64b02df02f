"""`upstream check`'s table as a CI log shows it (#55): rows that say the same of several
items are one row naming them, and the table fits 120 columns off a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from builder.upstream import view
from builder.upstream.check import Pins, Release, Report
from builder.upstream.profile_flags import ProfileCheck

FLAGS = ("--tp-size", "--kv-cache-dtype", "--quantization")


def _report() -> Report:
    profiles = [
        ProfileCheck(target, name, FLAGS, (), ("--quantization: gained a choice",))
        for target in ("sm120", "sm120-0.5.9", "sm90")
        for name in ("glm5-nvfp4-tp8", "glm5-nvfp4-tp8-mtp")
    ]
    profiles.append(
        ProfileCheck("sm120", "glm5-nvfp4-tp8-fusion", FLAGS, ("--gone: no such flag",), ())
    )
    return Report(
        target="sm120", index="https://pypi.org/simple", pinned="0.5.22", newer=["0.5.23"],
        release=Release("0.5.23", "sglang-0.5.23-cp312.whl", "https://x/sglang.whl", "a" * 64),
        pins=Pins(
            sglang={"from": {"version": "0.5.22"},
                    "to": {"version": "0.5.23", "ref": "v0.5.23", "sha256": "a" * 64, "commit": "b" * 40}},
            flashinfer={}, requirements=[],
            cuda={"stated": ["13"], "target": "13.0", "ok": True},
        ),
        profiles=profiles,
    )  # fmt: skip


def test_rows_that_say_the_same_are_one_row_naming_their_items() -> None:
    merged = [row for row in view.merged(view.rows(_report())) if row[0] == "profiles"]
    accepted = [row for row in merged if row[2] == "3 flags all accepted"]
    assert len(accepted) == 1
    assert accepted[0][1] == (
        "sm120 glm5-nvfp4-tp8, sm120 glm5-nvfp4-tp8-mtp, sm120-0.5.9 glm5-nvfp4-tp8, "
        "sm120-0.5.9 glm5-nvfp4-tp8-mtp, sm90 glm5-nvfp4-tp8, sm90 glm5-nvfp4-tp8-mtp"
    )
    changed = [row for row in merged if row[2].startswith("changed:")]
    assert len(changed) == 1 and changed[0][1].count(",") == 5
    assert ("profiles", "sm120 glm5-nvfp4-tp8-fusion", "--gone: no such flag", "review") in merged
    rows = view.rows(_report())
    assert len(merged) < len([row for row in rows if row[0] == "profiles"])
    assert "3 flags all accepted" in view.markdown(_report()).split("sm90 glm5-nvfp4-tp8-mtp |")[1]


def test_the_table_off_a_terminal_fits_its_width() -> None:
    out = io.StringIO()
    view.print_table(_report(), Console(file=out, width=view.TABLE_WIDTH, highlight=False))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= view.TABLE_WIDTH
    assert sum("flags all accepted" in line for line in lines) == 1
