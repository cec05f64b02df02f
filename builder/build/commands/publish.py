"""`builder publish`: the patched wheels (and builder's own) onto a private index; the
publishing options `image` shares."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from builder.build.commands.common import add_wheelhouse, context, forks_and_wheels, wheelhouse_dir
from builder.core.cache import atomic_copy, sha256_file
from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import add_command, emit
from builder.core.urls import has_credentials, redact

if TYPE_CHECKING:
    from builder.build.wheels import BuiltWheel

identity = lazy_module("builder.core.identity")
kernel_wheel = lazy_module("builder.build.kernels.wheel")
manifest = lazy_module("builder.spec.manifest")
build_records = lazy_module("builder.build.records")
progress = lazy_module("builder.core.progress")
publish = lazy_module("builder.build.publish")
self_wheel = lazy_module("builder.build.self_wheel")
validate = lazy_module("builder.core.validate")
wheels_stage = lazy_module("builder.build.wheels")


def _manifest_kernel_wheel(
    directory: Path, wheelhouse: Path, flashinfer: BuiltWheel | None
) -> BuiltWheel | None:
    """The kernel wheel the newest image manifest of this flashinfer build names, from the
    wheelhouse and with the manifest's sha256: the one that image was built and checked
    with, never merely the newest file that matches a pattern."""
    if flashinfer is None:
        return None
    for path, record in manifest.with_images(directory):
        recorded = record.get("wheels") or {}
        if "kernels" not in recorded:
            continue
        if (recorded.get("flashinfer") or {}).get("sha256") != flashinfer.sha256:
            continue
        named = recorded["kernels"]
        wheel = wheelhouse / named["filename"]
        if not wheel.is_file():
            raise BuilderError(
                f"{path.name} names the kernel wheel {named['filename']}, which is not in "
                f"{wheelhouse} (run `builder image` again to make it)"
            )
        if sha256_file(wheel) != named["sha256"]:
            raise BuilderError(
                f"{wheel}: not the kernel wheel {path.name} records (sha256 differs): not "
                "published; run `builder image` again"
            )
        return wheels_stage.BuiltWheel(
            name="kernels",
            dist_name=kernel_wheel.DIST_NAME,
            version=named["version"],
            filename=wheel.name,
            sha256=named["sha256"],
            size=wheel.stat().st_size,
            cache_key=named["version"],
            cached=True,
            path=wheel,
        )
    return None


def into_wheelhouse(wheel: BuiltWheel, wheelhouse: Path) -> BuiltWheel:
    """The kernel wheel beside the others, so `builder publish` ships it too."""
    destination = wheelhouse / wheel.filename
    if not destination.is_file() or sha256_file(destination) != wheel.sha256:
        atomic_copy(wheel.path, destination)
    return dataclasses.replace(wheel, path=destination)


def check_publish_args(args: argparse.Namespace) -> None:
    """Where to publish, checked before anything is built."""
    if args.publish:
        validate.http_url("--publish-index", args.publish)
        if has_credentials(args.publish):
            raise BuilderError(
                f"--publish-index {redact(args.publish)}: credentials go in TWINE_USERNAME/"
                "TWINE_PASSWORD, keyring or ~/.pypirc (--publish-repository), not in the URL"
            )
    if args.publish_simple:
        validate.http_url("--publish-simple", args.publish_simple)
        if has_credentials(args.publish_simple):
            raise BuilderError(
                f"--publish-simple {redact(args.publish_simple)}: builder reads the index "
                "back without credentials; give its public (read-only) URL"
            )
    if args.publish_static:
        validate.writable_dir("--publish-static", args.publish_static)


def publish_wheels(
    args: argparse.Namespace, wheels: dict, cache_dir: Path
) -> tuple[dict[str, list[dict]], BuiltWheel | None]:
    """Publish where the flags say, builder's own wheel too (the VM installs builder from
    the same index); ({wheel name: [verified records]}, builder's wheel or None)."""
    if not (args.publish or args.publish_repository or args.publish_static):
        return {name: [] for name in wheels}, None
    own = None
    if identity.builder_identity()["dirty"]:
        progress.warn(
            "builder's checkout has uncommitted changes: its own wheel is not published "
            "(commit them, then publish again)"
        )
    elif (own := self_wheel.build(cache_dir)) is None:
        progress.warn(
            "builder runs from an installed wheel, not a checkout: its own wheel is not "
            "published (publish from a checkout, or upload that wheel yourself)"
        )
    # builder's own first: if it cannot go up, nothing of this build has.
    everything = {**({"builder": own} if own else {}), **wheels}
    published: dict[str, list[dict]] = {name: [] for name in everything}
    ordered = list(everything.values())
    upload_url = args.publish
    if args.publish_repository and not upload_url:
        upload_url = publish.pypirc_url(args.publish_repository)
    if upload_url:
        simple = args.publish_simple or publish.default_simple_url(upload_url)
        for name, record in publish.publish_to_index(
            ordered, upload_url, simple, args.publish_repository
        ).items():
            published[name].append(record)
    if args.publish_static:
        for name, record in publish.publish_static(ordered, Path(args.publish_static)).items():
            published[name].append(record)
    return published, own


def add_publish_options(command: argparse.ArgumentParser, *old_names: str) -> None:
    """The same four publishing options, by the same names, on `image` and `publish`;
    `old_names` (earlier spellings: --publish, --index, --static) keep working, unlisted."""
    command.add_argument(
        "--publish-index",
        dest="publish",
        metavar="URL",
        help="upload the wheels to this index's upload URL (pypiserver, devpi, Artifactory); "
        "credentials from TWINE_USERNAME/TWINE_PASSWORD, keyring or ~/.pypirc",
    )
    command.add_argument(
        "--publish-simple",
        dest="publish_simple",
        metavar="URL",
        help="the index's simple (PEP 503/691) URL, to check and verify (default: URL/simple/)",
    )
    command.add_argument(
        "--publish-repository",
        dest="publish_repository",
        metavar="NAME",
        help="a ~/.pypirc section to take the upload URL and credentials from",
    )
    command.add_argument(
        "--publish-static",
        dest="publish_static",
        metavar="DIR",
        help="write/extend a static PEP 503 index (+ PEP 691 JSON) in DIR",
    )
    hidden = {"--index-simple": "publish_simple", "--repository": "publish_repository"}
    hidden.update({name: _OLD_NAMES[name] for name in old_names})
    for name, dest in hidden.items():
        command.add_argument(name, dest=dest, help=argparse.SUPPRESS)


_OLD_NAMES = {"--publish": "publish", "--index": "publish", "--static": "publish_static"}


def cmd_publish(args: argparse.Namespace) -> None:
    if not (args.publish or args.publish_static or args.publish_repository):
        raise BuilderError(
            "builder publish needs --publish-index URL, --publish-repository NAME or "
            "--publish-static DIR"
        )
    check_publish_args(args)
    ctx = context(args)
    forks, wheels = forks_and_wheels(args, ctx)
    directory = manifest.manifest_dir(ctx.data_dir, args.manifest_dir, ctx.target.name)
    kernels_wheel = _manifest_kernel_wheel(
        directory, wheelhouse_dir(args, ctx), wheels.get("flashinfer")
    )
    without = None
    if kernels_wheel:
        wheels["kernels"] = kernels_wheel
    elif "flashinfer" in wheels:
        if not args.without_kernels:
            raise BuilderError(
                f"no image manifest of flashinfer {wheels['flashinfer'].version} names a kernel "
                "wheel yet: run builder image first (it makes one), or pass --without-kernels "
                "(a plain venv then compiles every FlashInfer module at first use)"
            )
        without = (
            "--without-kernels: no image manifest of this flashinfer build names a kernel "
            "wheel; a plain venv compiles every FlashInfer module at first use"
        )
        progress.warn(f"publishing without kernels ({without})")
    published, own_wheel = publish_wheels(args, wheels, ctx.cache_dir)
    record = build_records.build_manifest(
        ctx.target, forks, wheels, published=published, builder_wheel=own_wheel
    )
    if without:
        record["without_kernels"] = without
    tag = "publish-" + "-".join(f.fork_commit[:7] for f in forks.values())
    written = manifest.write(
        manifest.manifest_dir(ctx.data_dir, args.manifest_dir, ctx.target.name), record, tag
    )
    lines = [
        f"{r['action']:<16} {r['url']}  sha256={r['sha256'][:16]}…"
        for records in published.values()
        for r in records
    ]
    lines.append(f"manifest {written}")
    emit(args, {"published": published, "manifest": str(written)}, lines)


def register(sub) -> None:
    publish_cmd = add_command(
        sub,
        "publish",
        cmd_publish,
        "publish the patched wheels to a private index (runs wheels first)",
        "Upload the wheels to a package index with twine, or write them into a static PEP 503 "
        "index. A file already on the index with the same sha256 is skipped; the same name "
        "with another sha256 is refused. Each wheel is resolved back from the index and its "
        "sha256 compared before it is recorded as published in the manifest.\n\n"
        "examples:\n"
        "  TWINE_USERNAME=ci TWINE_PASSWORD=... builder publish --publish-index https://pypi.internal/\n"
        "  builder publish --publish-static /srv/www/wheels   # then pip install --index-url "
        "https://host/wheels/simple/ sglang==0.5.9",
    )
    add_wheelhouse(publish_cmd)
    add_publish_options(publish_cmd, "--index", "--static")
    publish_cmd.add_argument(
        "--without-kernels", action="store_true",
        help="publish the FlashInfer wheel though no image manifest names its kernel wheel "
        "yet (a plain venv then compiles every module); recorded in the manifest",
    )  # fmt: skip
    publish_cmd.add_argument("--manifest-dir", metavar="DIR", help="where manifests go")
