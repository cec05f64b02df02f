"""The stages in order: sources -> patches -> wheels. Each stage runs the ones before it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.build.patches import ForkResult, apply_series
from builder.build.sources import Checkout, fetch_and_checkout
from builder.build.wheels import BuiltWheel, build_wheel
from builder.core.errors import BuilderError
from builder.core.settings import Mirrors
from builder.spec.target import Target, UpstreamUse


@dataclass(frozen=True)
class Context:
    target: Target
    data_dir: Path
    cache_dir: Path
    mirrors: Mirrors
    only: tuple[str, ...] = ()

    def selected(self) -> dict[str, UpstreamUse]:
        unknown = [name for name in self.only if name not in self.target.upstreams]
        if unknown:
            known = ", ".join(self.target.upstreams)
            raise BuilderError(
                f"--upstream {unknown[0]}: target '{self.target.name}' has no such upstream "
                f"(it has: {known})"
            )
        return {
            name: use
            for name, use in self.target.upstreams.items()
            if not self.only or name in self.only
        }


def sources(ctx: Context) -> dict[str, Checkout]:
    return {
        name: fetch_and_checkout(ctx.cache_dir, ctx.target.name, use.fork, ctx.mirrors)
        for name, use in ctx.selected().items()
    }


def patch(ctx: Context) -> dict[str, ForkResult]:
    checkouts = sources(ctx)
    return {
        name: apply_series(checkouts[name], use.series, use.fork.patch_files(use.series))
        for name, use in ctx.selected().items()
    }


def wheels(ctx: Context, wheelhouse: Path) -> dict[str, tuple[ForkResult, BuiltWheel]]:
    forks = patch(ctx)
    wheelhouse.mkdir(parents=True, exist_ok=True)
    return {
        name: (
            forks[name],
            build_wheel(ctx.cache_dir, forks[name], use.fork, ctx.target.local_label, wheelhouse),
        )
        for name, use in ctx.selected().items()
    }
