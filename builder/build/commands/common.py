"""What the build host's commands share: the pipeline context from their options, the
wheelhouse, sources -> patch -> wheels under the cache lock (the rest: builder/core/options.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.core.cache import locked
from builder.core.lazy import lazy_module
from builder.core.settings import resolve_cache_dir, resolve_data_dir, resolve_mirrors
from builder.spec.target import load_target

pipeline = lazy_module("builder.build.pipeline")
validate = lazy_module("builder.core.validate")


def context(args: argparse.Namespace) -> pipeline.Context:
    """The pipeline's context from a command's options (those it does not take: defaults)."""
    data_dir = resolve_data_dir(args.data_dir)
    target = load_target(data_dir, args.target)
    mirrors = resolve_mirrors(getattr(args, "mirror", []))
    only = tuple(getattr(args, "upstream", []))
    pipeline.Context(target, data_dir, Path(), mirrors, only).selected()  # names checked first
    return pipeline.Context(
        target=target,
        data_dir=data_dir,
        cache_dir=validate.writable_dir(
            "--cache-dir (or BUILDER_CACHE_DIR)",
            str(resolve_cache_dir(getattr(args, "cache_dir", None))),
        ),
        mirrors=mirrors,
        only=only,
    )


def wheelhouse_dir(args: argparse.Namespace, ctx: pipeline.Context) -> Path:
    return Path(args.wheelhouse or Path("wheelhouse") / ctx.target.name).resolve()


def add_wheelhouse(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--wheelhouse", help="where the wheels are copied (default: ./wheelhouse/<target>)"
    )


def forks_and_wheels(args: argparse.Namespace, ctx: pipeline.Context):
    """Run sources -> patch -> wheels under the cache lock; ({name: fork}, {name: wheel})."""
    with locked(ctx.cache_dir):
        built = pipeline.wheels(ctx, wheelhouse_dir(args, ctx))
    return (
        {name: fork for name, (fork, _) in built.items()},
        {name: wheel for name, (_, wheel) in built.items()},
    )
