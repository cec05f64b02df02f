"""Where builder reads its data, keeps its cache, and which URL mirrors it applies.

Precedence for each setting: command-line flag, then environment variable, then the user
config file (`<user config dir>/builder/config.toml`), then the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from builder.core.errors import BuilderError
from builder.core.tomlfile import load_toml
from builder.core.urls import redact

# Every environment variable builder reads for itself, in one table: `--help`'s epilog and
# docs/settings.md show it (tests/core/test_settings_table.py holds them to it).
TARGET_ENV = "BUILDER_TARGET"
CACHE_ENV = "BUILDER_CACHE_DIR"
DATA_ENV = "BUILDER_DATA_DIR"
MIRRORS_ENV = "BUILDER_MIRRORS"
CONFIG_ENV = "BUILDER_CONFIG"
KERNEL_REGISTRY_ENV = "BUILDER_KERNEL_REGISTRY"
# The kernel registry's keys (builder/build/kernels/trust.py), named here for help texts that
# must not import cryptography (a GPU VM's builder has no need of it).
SIGNING_KEY_ENV = "BUILDER_KERNEL_SIGNING_KEY"
TRUSTED_KEYS_ENV = "BUILDER_KERNEL_TRUSTED_KEYS"
REGISTRY_USERNAME_ENV = "BUILDER_REGISTRY_USERNAME"
REGISTRY_PASSWORD_ENV = "BUILDER_REGISTRY_PASSWORD"
REGISTRY_HOST_ENV = "BUILDER_REGISTRY_HOST"  # the registry those credentials are for
P2P_DIR_ENV = "BUILDER_P2P_DIR"
DEFAULT_TARGET = "sm120"

ENVIRONMENT: tuple[tuple[str, str], ...] = (
    (TARGET_ENV, f"the target without --target (default: {DEFAULT_TARGET})"),
    (DATA_ENV, "images/ and forks/ instead of the checkout's (a copy: try a pin or a patch "
     "set safely)"),
    (CACHE_ENV, "mirrors, work trees, wheels and kernels (default: the user cache directory)"),
    (MIRRORS_ENV, "space-separated FROM=TO URL rewrites"),
    (CONFIG_ENV, "the config file (default: <user config dir>/builder/config.toml)"),
    (KERNEL_REGISTRY_ENV, "REGISTRY/REPO where hosts share kernels"),
    (TRUSTED_KEYS_ENV, "public keys whose kernel entries are used"),
    (SIGNING_KEY_ENV, "PEM file that signs this host's entries"),
    (REGISTRY_USERNAME_ENV, "registry user (else docker login's), sent only to "
     f"{REGISTRY_HOST_ENV}"),
    (REGISTRY_PASSWORD_ENV, f"registry password, sent only to {REGISTRY_HOST_ENV}"),
    (REGISTRY_HOST_ENV, "the registry (host, or host:port) those credentials are for"),
    (P2P_DIR_ENV, "where doctor --p2p keeps and launch reads P2P records (default: "
     "/var/lib/builder/p2p)"),
    ("TWINE_USERNAME", "package index user for publishing (or keyring, or ~/.pypirc)"),
    ("TWINE_PASSWORD", "package index password for publishing"),
    ("HF_TOKEN", "passed to the server by name; builder never writes its value "
     "(deploy-files: a 0600 file)"),
    ("DOCKER_HOST", "the Docker daemon, as docker's own client reads it"),
    ("DOCKER_CONFIG", "docker login's credentials folder (default: ~/.docker)"),
    ("NETRC", "the netrc file for index and git logins, https only (default: ~/.netrc)"),
)  # fmt: skip


def config_file() -> Path:
    configured = os.environ.get(CONFIG_ENV)
    if configured:
        return Path(configured)
    return Path(platformdirs.user_config_dir("builder")) / "config.toml"


def kernel_host_key() -> Path:
    """This host's own kernel key (builder/build/kernels/trust.py): in the user state folder, never
    in the cache, so that a cache restored from elsewhere does not bring it."""
    return Path(platformdirs.user_state_dir("builder")) / "kernel-host.key"


def _user_config() -> dict:
    path = config_file()
    return load_toml(path) if path.is_file() else {}


def resolve_cache_dir(flag: str | None) -> Path:
    chosen = flag or os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("builder")
    return Path(chosen).expanduser().resolve()


def _is_data_dir(path: Path) -> bool:
    return (path / "images").is_dir() and (path / "forks").is_dir()


def resolve_data_dir(flag: str | None) -> Path:
    """The folder holding `images/` and `forks/`: a flag, the env, or the nearest checkout."""
    chosen = flag or os.environ.get(DATA_ENV)
    if chosen:
        path = Path(chosen).expanduser().resolve()
        if not _is_data_dir(path):
            raise BuilderError(f"{path}: not a builder data directory (needs images/ and forks/)")
        return path
    for candidate in (Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]):
        if _is_data_dir(candidate):
            return candidate
    raise BuilderError(
        f"no builder data directory found (images/ and forks/); pass --data-dir or set "
        f"{DATA_ENV}, or on a GPU VM without a checkout give --image REF (launch, "
        "deploy-files, doctor, wait-ready and qualify read the image's own recipe; verify "
        "needs none)"
    )


@dataclass(frozen=True)
class Mirrors:
    """URL prefix rewrites, like git's `url.<to>.insteadOf = <from>`; longest prefix wins."""

    rules: tuple[tuple[str, str], ...] = ()

    def rewrite(self, url: str) -> str:
        matches = [(src, dst) for src, dst in self.rules if url.startswith(src)]
        if not matches:
            return url
        src, dst = max(matches, key=lambda rule: len(rule[0]))
        return dst + url[len(src) :]


def _parse_rule(text: str, origin: str) -> tuple[str, str]:
    source, sep, target = text.partition("=")
    if not sep or not source or not target:
        shown = "=".join(redact(part) for part in (source, target) if part) if sep else redact(text)
        raise BuilderError(f"{origin}: mirror '{shown}' must look like FROM=TO")
    return source, target


def resolve_mirrors(flags: list[str] | None) -> Mirrors:
    """CLI rules first, then BUILDER_MIRRORS (space separated), then the config's [mirrors]."""
    rules: list[tuple[str, str]] = [_parse_rule(f, "--mirror") for f in flags or []]
    rules += [_parse_rule(r, MIRRORS_ENV) for r in os.environ.get(MIRRORS_ENV, "").split()]
    configured = _user_config().get("mirrors", {})
    if not isinstance(configured, dict):
        raise BuilderError(f'{config_file()}: [mirrors] must be a table of FROM = "TO"')
    rules += [(src, str(dst)) for src, dst in configured.items()]
    # Earlier sources win for the same prefix.
    seen: dict[str, str] = {}
    for src, dst in rules:
        seen.setdefault(src, dst)
    return Mirrors(tuple(seen.items()))
