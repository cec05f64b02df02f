"""Which FlashInfer kernels a target needs, and what a running server compiled anyway.

The target's `[[jit.modules]]` list says, per module, the profile setting that makes sglang
load it; `disagreements` checks that list against the launch profiles both ways. The
image's JIT inventory says what was compiled at build time; `runtime_misses` compares a
server's FlashInfer workspace against it, so a kernel compiled at start-up is named.
"""

from __future__ import annotations

from builder import launch
from builder.target import Target

_PLACEHOLDER_IMAGE = "image@sha256:" + "0" * 64


def _setting(key: str, value: object) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def profile_settings(target: Target) -> dict[str, set[str]]:
    """Each profile's `key=value` settings, as its readiness check reads them back."""
    profiles, _ = launch.load_profiles(target.file)
    settings = {}
    for name in profiles:
        recipe = launch.resolve(target.file, name, _PLACEHOLDER_IMAGE, launch.Overrides())
        settings[name] = {_setting(k, v) for k, v in recipe.expect.items()}
    return settings


def disagreements(target: Target) -> list[str]:
    """Profile settings that load FlashInfer but have no listed module, and listed modules
    that no profile loads. Empty when the list and the profiles agree."""
    covered = {module.loaded_when for module in target.jit}
    by_profile = profile_settings(target)
    problems = []
    for profile, settings in by_profile.items():
        for setting in sorted(s for s in settings if "flashinfer" in s and s not in covered):
            problems.append(f"profile {profile}: {setting} loads FlashInfer, no module listed")
    used = set().union(*by_profile.values()) if by_profile else set()
    for module in target.jit:
        if module.loaded_when not in used:
            problems.append(f"{module.generator}: no profile has {module.loaded_when}")
    return problems
