"""`builder upstream`: follow sglang's releases (check what a move takes, then move)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from builder.build.commands.common import context
from builder.core.cache import atomic_write_text, locked
from builder.core.errors import EXIT_CODES, BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import FETCH, PROJECT, add_command, print_json

upstream = lazy_module("builder.upstream.check")
upstream_move = lazy_module("builder.upstream.move")
view = lazy_module("builder.upstream.view")


def _show(args: argparse.Namespace, report, extra: dict | None = None) -> None:
    """The report: the table on the terminal, or JSON; Markdown to --markdown FILE."""
    if getattr(args, "markdown", None):
        atomic_write_text(Path(args.markdown), view.markdown(report))
    if args.json:
        print_json({**report.to_json(), **(extra or {})}, ok=report.ok)
    else:
        view.print_table(report)


def cmd_upstream_check(args: argparse.Namespace) -> None:
    ctx = context(args)
    try:
        with locked(ctx.cache_dir):
            report = upstream.check(ctx, args.to, run_lock=not args.no_lock)
    except BuilderError as exc:  # --markdown FILE says why too: the weekly issue's body
        if args.markdown:
            atomic_write_text(Path(args.markdown), view.failure_markdown(ctx.target.name, exc))
        raise
    _show(args, report)
    if not report.ok:
        raise SystemExit(EXIT_CODES["drift"])


def cmd_upstream_move(args: argparse.Namespace) -> None:
    ctx = context(args)
    with locked(ctx.cache_dir):
        moved = upstream_move.move(
            ctx, args.to, keep_old_as=args.keep_old_as, run_lock=not args.no_lock
        )
    if moved.commit is None:
        _show(args, moved.report, {"moved": False, "refused": moved.refused})
        print(f"error: {moved.refused}", file=sys.stderr)
        raise SystemExit(EXIT_CODES["drift"])
    extra = {"moved": True, "commit": moved.commit, "kept": moved.kept, "lock": moved.lock}
    if args.markdown:  # the pull request's body: the report and the commit it made
        atomic_write_text(
            Path(args.markdown),
            view.markdown(moved.report) + f"\nCommitted: `{moved.subject}` ({moved.commit[:12]})\n",
        )
    if args.json:
        print_json({**moved.report.to_json(), **extra}, ok=True)
    else:
        view.print_table(moved.report)
        print(f"committed {moved.commit[:12]}: {moved.subject}")


def register(sub) -> None:
    command = sub.add_parser(
        "upstream",
        help="follow sglang's releases: check what moving to a new one takes, then move",
        description="`check` reads the index for sglang releases newer than the target's pin "
        "and reports, without changing anything, what moving to one would take: the pins, each "
        "patch, each launch profile's flags against the new release's parser, the JIT list "
        "against the new FlashInfer and whether the runtime lock resolves. `move` does it in "
        "the data directory and leaves one git commit.",
    )
    actions = command.add_subparsers(dest="upstream_command", required=True, metavar="ACTION")
    check = add_command(
        actions,
        "check",
        cmd_upstream_check,
        "what moving the target to a newer sglang release would take (changes nothing)",
        "For the newest sglang release on the sglang pin's index (or --to), report without "
        "touching the checkout: the pins that would change (the release file and sha256, the "
        "FlashInfer version it pins and that FlashInfer's commit, read from its released "
        "wheel, the target's torch/sglang-kernel pins, CUDA); each patch of each series "
        "(applies, already upstream, conflicts); every flag each launch profile renders against "
        "the new release's own argument parser; each [[jit.modules]] generator in the new "
        "FlashInfer, and the FlashInfer names sglang's code newly uses; whether the runtime "
        "lock resolves. Exit code 0: clean (or nothing newer); 7: needs review; 1: the check "
        "failed with a reason (an index page, a wheel or its METADATA refused: one line names "
        "the URL or file, and --markdown FILE holds it too).\n\n"
        "examples:\n"
        "  builder upstream check --target sm120\n"
        "  builder upstream check --target sm120 --to sglang==0.5.24 --json",
        uses=(PROJECT, FETCH),
    )
    move = add_command(
        actions,
        "move",
        cmd_upstream_move,
        "move the target to a newer sglang release and commit it",
        "Run the check, refuse unless it is clean (a conflicting patch: `builder patches "
        "refresh`, fix, `builder patches export`; a gone flag: edit the profile), then in the "
        "data directory: keep today's target as --keep-old-as NAME (its own pins, series and "
        "lock), re-pin sglang (and FlashInfer when the release pins another), move the series "
        "(`patches refresh`), set the target's pins the release requires, re-lock (`builder "
        "lock`), and leave one git commit that says per patch what happened and per profile "
        "which flags changed. Nothing is written unless every step succeeds. Exit code 7 when "
        "refused.\n\n"
        "examples:\n"
        "  builder upstream move --target sm120 --to sglang==0.5.24\n"
        "  builder upstream move --target sm120 --to sglang==0.5.24 --keep-old-as sm120-0.5.23",
        uses=(PROJECT, FETCH),
    )
    for each in (check, move):
        each.add_argument(
            "--no-lock",
            action="store_true",
            help="leave the runtime lock out (no uv resolution: offline; `move` leaves the old "
            "lock, which the image build then refuses until `builder lock`)",
        )
        each.add_argument(
            "--markdown", metavar="FILE", help="also write the report as Markdown to FILE"
        )
    check.add_argument(
        "--to", metavar="sglang==VERSION", help="this release (default: the newest newer one)"
    )
    move.add_argument(
        "--to", required=True, metavar="sglang==VERSION", help="the release to move to"
    )
    move.add_argument(
        "--keep-old-as",
        metavar="NAME",
        help="first copy today's target to images/NAME (extends the target; its own pins, "
        "series under forks/<upstream>-<version> and lock), as sm120-0.5.9 was kept",
    )
