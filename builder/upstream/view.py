"""An upstream check's report as rows: one table on the terminal (rich), the same rows as
Markdown for a pull request or an issue (the weekly workflow), and the lines a move's
commit message is made of.

Text that came from outside (the index's file names, what sglang's and FlashInfer's code
says: a choice, a file, a name; uv's answer) goes through `shown`: `printable` on the
terminal and in the commit message, `markdown_inert` in the Markdown, so that none of it
moves a cursor, rewrites a line or becomes a link."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from builder.core.untrusted import markdown_inert, printable
from builder.core.urls import scrub
from builder.upstream.check import Report

OK, REVIEW, INFO = "ok", "review", "info"
_STYLE = {OK: "green", REVIEW: "bold red", INFO: "dim"}
SHOWN_LIMIT = 1000  # characters of one outside string in a cell or a line (uv's error)
Shown = Callable[[str], str]
TERMINAL: Shown = partial(printable, limit=SHOWN_LIMIT)
MARKDOWN: Shown = partial(markdown_inert, limit=SHOWN_LIMIT)


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "unknown"


def _files(files: list[str], shown: Shown) -> str:
    listed = ", ".join(shown(f) for f in files[:2])
    return listed + (f" (+{len(files) - 2} more)" if len(files) > 2 else "")


def rows(report: Report, shown: Shown = TERMINAL) -> list[tuple[str, str, str, str]]:
    """(section, item, result, verdict) in the order a reviewer reads them, outside text
    through `shown`."""
    found: list[tuple[str, str, str, str]] = []
    if report.release is None:
        found.append(("pins", "sglang", f"{report.pinned} is the newest release", OK))
        return found
    pins = report.pins
    assert pins is not None
    sglang = pins.sglang
    found.append(
        ("pins", "sglang",
         f"{sglang['from']['version']} -> {shown(sglang['to']['version'])} "
         f"({shown(sglang['to']['ref'])}, sha256 {shown((sglang['to']['sha256'] or 'none')[:12])}"
         f", commit {_short(sglang['to']['commit'])})", OK if sglang["to"]["sha256"] else REVIEW)
    )  # fmt: skip
    flashinfer = pins.flashinfer
    if flashinfer.get("to"):
        before, after = flashinfer["from"], flashinfer["to"]
        if before["version"] == after["version"]:
            moved = f"{before['version']} (unchanged)"
        else:
            moved = f"{before['version']} -> {shown(after['version'])}"
        agrees = after["wheel_commit"] == after["commit"]
        if not after["wheel"]:
            said = "the index has no released wheel"
        else:
            names = "the same" if agrees else _short(after["wheel_commit"])
            said = f"{shown(after['wheel'])} names {names}"
        source = f"commit {_short(after['commit'])} ({shown(after['ref'])}), {said}"
        found.append(("pins", "flashinfer", f"{moved} ({source})", OK if agrees else REVIEW))
    for requirement in pins.requirements:
        if requirement["changed"]:
            found.append(
                ("pins", requirement["name"],
                 f"{requirement['from']} -> {shown(requirement['to'])}", OK)
            )  # fmt: skip
        else:
            found.append(("pins", requirement["name"], f"{requirement['from']} (unchanged)", INFO))
    cuda = pins.cuda
    stated = ", ".join(shown(c) for c in cuda["stated"]) or "none stated"
    found.append(
        ("pins", "CUDA", f"{stated}; target {cuda['target']}", OK if cuda["ok"] else REVIEW)
    )
    for upstream, checked in report.series.items():
        if "skipped" in checked:
            found.append(("series", upstream, checked["skipped"], INFO))
            continue
        if not checked["patches"]:
            found.append(("series", upstream, "no patches", INFO))
        for patch in checked["patches"]:
            verdict = REVIEW if patch["status"] == "conflict" else OK
            words = {"clean": "applies", "merged": "applies (3-way)",
                     "upstream": "already upstream: dropped", "conflict": "conflicts"}  # fmt: skip
            detail = "; ".join(
                [
                    *(shown(d) for d in patch["details"]),
                    *(f"{shown(f)}: {shown(', '.join(h))}" for f, h in patch["conflicts"].items()),
                ]
            )
            text = words[patch["status"]] + (f" ({detail})" if detail else "")
            found.append(("series", f"{upstream} {patch['patch']}", text, verdict))
    for profile in report.profiles:
        name = f"{profile.target} {profile.profile}"
        for problem in profile.problems:
            found.append(("profiles", name, shown(problem), REVIEW))
        if not profile.problems:
            found.append(("profiles", name, f"{len(profile.flags)} flags all accepted", OK))
        for change in profile.changed:
            found.append(("profiles", name, f"changed: {shown(change)}", INFO))
    for generator in report.generators:
        verdict = OK if generator.status == "present" else REVIEW
        text = generator.status + (f": {shown(generator.detail)}" if generator.detail else "")
        found.append(("jit", generator.generator, text, verdict))
    if report.call_sites is not None:
        calls = report.call_sites
        for name, files in calls.added.items():
            found.append(
                ("jit", "sglang uses (new)", f"{shown(name)} in {_files(files, shown)}", INFO)
            )
        for name, files in calls.removed.items():
            found.append(
                ("jit", "sglang no longer uses",
                 f"{shown(name)} (was in {_files(files, shown)})", INFO)
            )  # fmt: skip
        if not report.call_sites.added and not report.call_sites.removed:
            found.append(("jit", "sglang's FlashInfer calls", "the same names as before", OK))
    lock = report.lock
    verdict = {"resolves": OK, "fails": REVIEW}.get(lock["status"], INFO)
    detail = shown(lock.get("detail", ""))
    changed = lock.get("changed") or []
    if changed:
        listed = ", ".join(shown(c) for c in changed[:12])
        detail += f"; changed: {listed}" + (" ..." if len(changed) > 12 else "")
    found.append(("lock", "runtime lock", f"{lock['status']}: {detail}", verdict))
    return found


def headline(report: Report) -> str:
    if report.release is None:
        return f"{report.target}: sglang {report.pinned} is the newest release: nothing to move"
    move = f"{report.target}: sglang {report.pinned} -> {report.release.version}"
    if report.ok:
        return f"{move}: clean, ready for `builder upstream move`"
    return f"{move}: needs review ({len(report.review)} items)"


TABLE_WIDTH = 120  # off a terminal (a CI log): wider than 80 columns, narrower than a page


def merged(found: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """Rows that say the same (section, result, verdict) about several items, one row naming
    them all: every profile of every target whose flags are all accepted, for one."""
    order: list[tuple[str, str, str]] = []
    items: dict[tuple[str, str, str], list[str]] = {}
    for section, item, result, verdict in found:
        key = (section, result, verdict)
        if key not in items:
            order.append(key)
            items[key] = []
        if item not in items[key]:
            items[key].append(item)
    return [(s, ", ".join(items[(s, r, v)]), r, v) for s, r, v in order]


def print_table(report: Report, console: Console | None = None) -> None:
    if console is None:
        console = Console(highlight=False)
        if not console.is_terminal:
            console = Console(highlight=False, width=TABLE_WIDTH)
    table = Table(title=escape(headline(report)), show_lines=False)
    for column in ("check", "item", "result", ""):
        table.add_column(column, overflow="fold")
    for section, item, result, verdict in merged(rows(report)):
        table.add_row(section, escape(item), escape(result), f"[{_STYLE[verdict]}]{verdict}[/]")
    console.print(table)


_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _cell(text: str) -> str:
    """A table cell: a pipe of builder's own text escaped (outside text's are already)."""
    return _UNESCAPED_PIPE.sub(r"\\|", text).replace("\n", " ")


def markdown(report: Report) -> str:
    """The report for a pull request's or an issue's body."""
    lines = [f"**{_cell(headline(report))}**", ""]
    if report.review:
        lines += ["Needs review:", ""] + [f"- {MARKDOWN(r)}" for r in report.review] + [""]
    lines += ["| check | item | result | |", "|---|---|---|---|"]
    lines += [
        f"| {s} | {_cell(i)} | {_cell(r)} | {v} |" for s, i, r, v in merged(rows(report, MARKDOWN))
    ]
    lines += ["", "Made by `builder upstream check`."]
    return "\n".join(lines) + "\n"


def failure_markdown(target: str, error: Exception) -> str:
    """The Markdown of a check that failed with a reason (a refused index page or wheel)."""
    return (
        f"**{target}: upstream check failed**\n\n{MARKDOWN(scrub(str(error)))}\n\n"
        "Made by `builder upstream check`.\n"
    )


_PATCH_WORDS = {
    "clean": "applies as it is",
    "merged": "applies with a 3-way merge",
    "upstream": "dropped: the release has it already",
    "conflict": "conflicts",
}


def commit_message(
    report: Report, kept: str | None, locked: dict[str, dict] | None
) -> tuple[str, str]:
    """(subject, whole message) of a move's commit: per patch what happened, per profile
    which of its flags changed; outside text shown `printable`."""
    assert report.release is not None and report.pins is not None
    shown = TERMINAL
    pins = report.pins
    subject = f"upstream: {report.target} onto sglang {shown(report.release.version)}"
    flashinfer = pins.flashinfer
    if flashinfer.get("changes"):
        subject += f" and flashinfer {shown(flashinfer['to']['version'])}"
    sglang = pins.sglang["to"]
    lines = [subject, "", "pins:"]
    lines.append(
        f"  sglang {report.pinned} -> {shown(sglang['version'])}: {shown(sglang['ref'])} "
        f"(sha256 {shown(sglang['sha256'])}, commit {sglang['commit']})"
    )
    if flashinfer.get("changes"):
        after = flashinfer["to"]
        lines.append(
            f"  flashinfer {flashinfer['from']['version']} -> {shown(after['version'])}: "
            f"{shown(after['ref'])} (commit {after['commit']}; {shown(after['wheel'])} "
            "names the same)"
        )
    lines += [f"  {r['from']} -> {shown(r['to'])}" for r in pins.requirements if r["changed"]]
    for upstream, checked in report.series.items():
        if "skipped" in checked:
            lines += ["", f"{upstream} series: {checked['skipped']}"]
            continue
        lines += ["", f"{upstream} series onto {shown(checked['onto'])}:"]
        if not checked["patches"]:
            lines.append("  (no patches)")
        for patch in checked["patches"]:
            merged = patch["status"] == "merged"
            detail = "; ".join(shown(d) for d in patch["details"]) if merged else ""
            words = _PATCH_WORDS[patch["status"]]
            lines.append(f"  {patch['patch']}: {words}" + (f" ({detail})" if detail else ""))
    lines += ["", f"profiles (flags whose definition changed in sglang "
                  f"{shown(sglang['version'])}):"]  # fmt: skip
    for profile in report.profiles:
        changed = "; ".join(shown(c) for c in profile.changed) if profile.changed else "none"
        lines.append(f"  {profile.target} {profile.profile}: {changed}")
    calls = report.call_sites
    if calls is not None and (calls.added or calls.removed):
        lines += ["", "FlashInfer names sglang's server code now uses (review the JIT list):"]
        lines += [f"  + {shown(n)} ({_files(f, shown)})" for n, f in calls.added.items()]
        lines += [f"  - {shown(n)} ({_files(f, shown)})" for n, f in calls.removed.items()]
    if kept:
        lines += ["", f"kept: target {kept} (images/{kept}) on the old pins, series and lock"]
    lines.append("")
    if locked is None:
        lines.append("runtime lock: not re-resolved (--no-lock): run `builder lock` before a build")
    elif not locked:
        lines.append("runtime lock: none to re-resolve")
    for name, summary in (locked or {}).items():
        changed = ", ".join(shown(c) for c in summary["changed"]) or "no version changed"
        lines.append(f"runtime lock of {name}: {summary['packages']} packages; {changed}")
    lines += ["", f"Made by `builder upstream move --target {report.target} --to "
                  f"sglang=={shown(report.release.version)}`."]  # fmt: skip
    return subject, "\n".join(lines) + "\n"
