"""`builder patches`: the series against a moving upstream (list, check, refresh, export)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from builder.build.commands.common import context
from builder.core.cache import locked
from builder.core.errors import EXIT_CODES, BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import BUILD_COMMAND, PROJECT, SELECTION, add_command, emit, print_json

series = lazy_module("builder.upstream.series")
patch_files = lazy_module("builder.build.patches")


def cmd_patches_list(args: argparse.Namespace) -> None:
    ctx = context(args)
    result, lines = {}, []
    for name, use in ctx.selected().items():
        entries = []
        for path in use.fork.patch_files(use.series):
            patch = patch_files.parse_patch_file(path)
            entries.append(
                {
                    "file": path.name,
                    "subject": patch.message.splitlines()[0],
                    "files": [f.path for f in patch.files],
                    "sha256": patch.sha256,
                }
            )
            lines.append(f"{name:<11} {path.name}")
            lines.append(f"{'':<11}   {', '.join(f.path for f in patch.files)}")
        result[name] = {
            "series": use.series,
            "pin": {"url": use.fork.url, "ref": use.fork.ref, "commit": use.fork.commit},
            "patches": entries,
        }
    emit(args, result, lines)


def cmd_patches_check(args: argparse.Namespace) -> None:
    ctx = context(args)
    selected = ctx.selected()
    if len(selected) != 1:  # one REF names one upstream's history, never every upstream's
        raise BuilderError(
            f"builder patches check --onto {args.onto}: which upstream's {args.onto}? pass "
            f"--upstream NAME (target {ctx.target.name}: {', '.join(selected)})"
        )
    results = {}
    with locked(ctx.cache_dir):
        for name, use in ctx.selected().items():
            results[name] = series.check(
                ctx.cache_dir, ctx.target.name, use.fork, use.series, ctx.mirrors, args.onto
            )
    lines = []
    for name, result in results.items():
        lines.append(
            f"{name}: {result.base_commit[:12]} -> {args.onto} ({result.onto_commit[:12]})"
        )
        for patch in result.patches:
            lines.append(f"  {patch.status:<9} {patch.patch.path.name}")
            lines += [f"            {d}" for d in patch.details]
            for file, hunks in patch.conflicts.items():
                lines.append(f"            {file}: {'; '.join(hunks)}")
    unattended = all(r.unattended for r in results.values())
    emit(args, {name: r.to_json() for name, r in results.items()}, lines, ok=unattended)
    if not unattended:
        raise SystemExit(EXIT_CODES["drift"])


def cmd_patches_refresh(args: argparse.Namespace) -> None:
    ctx = context(args)
    if len(ctx.selected()) != 1:
        raise BuilderError("builder patches refresh works on one upstream: pass --upstream NAME")
    ((name, use),) = ctx.selected().items()
    with locked(ctx.cache_dir):
        result, written = series.refresh(
            ctx.cache_dir, ctx.target.name, use.fork, use.series, ctx.mirrors, args.onto
        )
    if written is None:
        conflict = next(p for p in result.patches if p.status == "conflict")
        path = series.refresh_dir(ctx.cache_dir, ctx.target.name, name)
        print(series.conflict_help(path, conflict, ctx.target.name, name), file=sys.stderr)
        if args.json:
            print_json(
                {"refreshed": False, "check": result.to_json(), "workdir": str(path)}, ok=False
            )
        raise SystemExit(EXIT_CODES["drift"])
    dropped = [p.patch.path.name for p in result.patches if p.status == "upstream"]
    lines = [f"{name}: series moved onto {args.onto} ({result.onto_commit[:12]})"]
    lines += [f"  dropped (upstream): {d}" for d in dropped]
    lines += [f"  wrote {n}" for n in written["patches"]]
    lines.append(f"  pin: {written['pin']}")
    emit(args, {"refreshed": True, "check": result.to_json(), **written}, lines)


def cmd_patches_export(args: argparse.Namespace) -> None:
    ctx = context(args)
    if len(ctx.selected()) != 1:
        raise BuilderError("builder patches export works on one upstream: pass --upstream NAME")
    ((name, use),) = ctx.selected().items()
    with locked(ctx.cache_dir):
        written = series.export(ctx.cache_dir, ctx.target.name, use.fork, use.series)
    lines = [f"{name}: wrote {n}" for n in written["patches"]] + [f"  pin: {written['pin']}"]
    emit(args, written, lines)


def register(sub) -> None:
    patches_cmd = sub.add_parser(
        "patches",
        help="manage the patch series against a moving upstream (list, check, refresh, export)",
        description="A patch series is a branch of commits on the pinned upstream. `check` "
        "classifies each patch against a newer REF (clean, merged, conflict, upstream); "
        "`refresh` rebases the series onto REF and rewrites forks/ only if every patch made "
        "it; `export` writes the series back after a manual conflict fix.",
    )
    patches_sub = patches_cmd.add_subparsers(
        dest="patches_command", required=True, metavar="ACTION"
    )

    def add_patches(name: str, func: Callable, help_text: str, description: str, onto: bool):
        # `list` reads the data files only: no fetch, no cache.
        uses = (PROJECT, SELECTION) if name == "list" else BUILD_COMMAND
        command = add_command(patches_sub, name, func, help_text, description, uses)
        if onto:
            command.add_argument(
                "--onto", required=True, metavar="REF", help="upstream tag, branch or commit"
            )

    add_patches(
        "list",
        cmd_patches_list,
        "list the series of each upstream",
        "List each upstream's pin and patch files with the files they touch.\n\n"
        "example: builder patches list --target sm120 --upstream sglang",
        False,
    )
    add_patches(
        "check",
        cmd_patches_check,
        "classify every patch against a newer upstream REF",
        "Classify each patch against REF without changing anything: clean (applies as is), "
        "merged (3-way merge; moved hunks shown), conflict (files and hunks), upstream (REF "
        "already has it). Exit code 0: the series can move to REF unattended; 7: it cannot.\n\n"
        "example: builder patches check --upstream flashinfer --onto v0.6.16",
        True,
    )
    add_patches(
        "refresh",
        cmd_patches_refresh,
        "rebase the series onto REF and re-pin",
        "Rebase the series onto REF (3-way), drop patches REF already contains, then write the "
        "new patch files and pin. On a conflict, stop with the conflict marked in a work "
        "directory, say what to edit, and leave forks/ untouched (exit code 7).\n\n"
        "example: builder patches refresh --upstream flashinfer --onto v0.6.16",
        True,
    )
    add_patches(
        "export",
        cmd_patches_export,
        "write the patch files from the fork branch",
        "After a refresh stopped at a conflict and you edited the files: commit your fix as that "
        "patch, apply the rest and write forks/. Without a pending refresh: regenerate the "
        "patch files from the build work directory's fork branch.\n\n"
        "example: builder patches export --upstream flashinfer   # after editing a conflict",
        False,
    )
