"""Which FlashInfer kernels a target needs: the target's `[[jit.modules]]` list says, per
module, the profile setting that makes sglang load it; `disagreements` checks that list
against the launch profiles both ways."""

from __future__ import annotations

from builder.spec import launch, launch_profiles
from builder.spec.target import Target

_PLACEHOLDER_IMAGE = "image@sha256:" + "0" * 64


def _setting(key: str, value: object) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def profile_settings(target: Target) -> dict[str, set[str]]:
    """Each profile's settings: `key=value` as its readiness check reads them back,
    `env:NAME=value` from its environment, and `always`."""
    profiles, _ = launch_profiles.load_profiles(target.file)
    settings = {}
    for name in profiles:
        recipe = launch.resolve(target.file, name, _PLACEHOLDER_IMAGE, launch.Overrides())
        settings[name] = {_setting(k, v) for k, v in recipe.expect.items()}
        settings[name] |= {f"env:{k}={v}" for k, v in recipe.env.items()} | {"always"}
    return settings


def modules_by_profile(target: Target) -> dict[str, list[str]]:
    """Each profile's listed modules: those a setting of the profile loads."""
    return {
        profile: [m.generator for m in target.jit if settings & set(m.settings)]
        for profile, settings in profile_settings(target).items()
    }


def disagreements(target: Target) -> list[str]:
    """Profile settings that load FlashInfer but have no listed module, and listed modules
    that no profile loads. Empty when the list and the profiles agree."""
    covered = {setting for module in target.jit for setting in module.settings}
    by_profile = profile_settings(target)
    problems = []
    for profile, settings in by_profile.items():
        loads = {s for s in settings if "flashinfer" in s and not s.startswith("env:")}
        for setting in sorted(loads - covered):
            problems.append(f"profile {profile}: {setting} loads FlashInfer, no module listed")
    used = set().union(*by_profile.values()) if by_profile else set()
    for module in target.jit:
        if not used & set(module.settings):
            problems.append(f"{module.generator}: no profile has {module.loaded_when}")
    return problems
