"""`builder jit keygen`: the ed25519 key pair that signs the kernels build hosts share. A
build host's action (cryptography is of the `build` extra), listed among `jit`'s actions."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.core.lazy import lazy_module
from builder.core.options import add_output_options, emit
from builder.core.settings import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV

kernel_trust = lazy_module("builder.build.kernels.trust")


def cmd_jit_keygen(args: argparse.Namespace) -> None:
    private, public = kernel_trust.generate(Path(args.out))
    result = {"signing_key": str(private), "public_key": str(public)}
    lines = [
        f"wrote {private} (mode 0600: keep it on the hosts that share kernels, never in git)",
        f"wrote {public}",
        f"every build host: export {TRUSTED_KEYS_ENV}={public}",
        f"hosts that share new kernels: export {SIGNING_KEY_ENV}={private}",
    ]
    emit(args, result, lines)


def register(jit_actions: argparse._SubParsersAction) -> None:
    keygen = jit_actions.add_parser(
        "keygen",
        help="make the ed25519 key pair that signs the kernels build hosts share",
        description="A kernel registry (--kernel-registry) is used only with trusted keys: "
        f"entries are signed with {SIGNING_KEY_ENV} (a PEM file) and taken only "
        f"when one of {TRUSTED_KEYS_ENV} (a file, one public key a line) "
        "verifies them. Writes kernel-signing.key (0600) and kernel-signing.pub; never "
        "overwrites.\n\nexample: builder jit keygen --out /etc/builder",
    )
    keygen.add_argument("--out", required=True, help="folder for the two key files")
    add_output_options(keygen)
    keygen.set_defaults(func=cmd_jit_keygen)
