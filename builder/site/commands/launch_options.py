"""The options that make a launch recipe (launch, deploy-files, qualify --start) and the
recipe they make: every host path checked before anything renders, the checkpoint checked
against the profile, the P2P record applied, and what qualify measured for the image said."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rich.markup import escape

from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.settings import resolve_data_dir
from builder.spec.target import load_target

image_recipe = lazy_module("builder.spec.recipe")
launch = lazy_module("builder.spec.launch")
launch_profiles = lazy_module("builder.spec.launch_profiles")
manifest = lazy_module("builder.spec.manifest")
model_check = lazy_module("builder.spec.model_check")
p2p_record = lazy_module("builder.site.p2p_record")
progress = lazy_module("builder.core.progress")
readiness = lazy_module("builder.site.readiness")
receipts = lazy_module("builder.site.receipts")
validate = lazy_module("builder.core.validate")


def key_values(flag: str, items: list[str]) -> list[tuple[str, str]]:
    """A repeatable flag's KEY=VALUE items as pairs; an item without `=` or a key is refused."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuilderError(f"{flag} {item}: expected KEY=VALUE")
        pairs.append((key, value))
    return pairs


def launch_overrides(args: argparse.Namespace) -> launch.Overrides:
    """The launch options as overrides, every host path checked before anything renders:
    a --model folder exists here (whatever the profile), an API key file is one."""
    key_file = None
    if args.api_key_file:
        read_api_key(args.api_key_file)  # exists, readable, not empty: checked, not kept
        key_file = str(Path(args.api_key_file).expanduser().resolve())
    overrides = launch.Overrides(
        model=args.model,
        port=args.port,
        params=tuple(key_values("--set", args.set)),
        extra_args=tuple(args.extra_arg),
        hf_cache=args.hf_cache,
        container_name=args.name,
        bind=args.bind,
        api_key_file=key_file,
        taken_params=tuple(args.taken_params),
        taken_from=args.taken_from,
    )
    launch.refuse_control_characters(overrides)
    given_as = f"--model {args.model}"
    model = args.model
    if not model and (set_model := dict(overrides.params).get("model")):
        given_as, model = f"--set model={set_model}", set_model
    folder = launch.model_dir(model) if model else None
    if folder is not None and not Path(folder).is_dir():
        why = "not a folder" if Path(folder).exists() else "no such folder on this machine"
        raise BuilderError(f"{given_as}: {why} ({folder})")
    return overrides


def recipe_from_args(args: argparse.Namespace) -> tuple[launch.Recipe, str]:
    """The resolved launch recipe and where it came from (an image's recipe or a manifest)."""
    launch.bind_address(args.bind)  # before looking for a manifest
    if args.image and args.manifest:
        raise BuilderError("--image and --manifest: give one (the image carries its recipe)")
    if args.image:
        validate.image_reference("--image", args.image)
    overrides = launch_overrides(args)
    if args.image:
        profiles = image_recipe.profiles_of(image_recipe.launch_recipe(args.image), args.image)
        recipe = launch.resolve(profiles, args.profile, args.image, overrides)
        check_checkpoint(recipe)
        source = f"{args.image}:{image_recipe.RECIPE_PATH}"
        say_receipt(None, args.image)
    else:
        data_dir = resolve_data_dir(args.data_dir)
        target = load_target(data_dir, args.target)
        profiles = launch_profiles.Profiles.of(target.file)
        # Profile, params, port and the checkpoint are checked before any manifest is
        # looked for.
        recipe = launch.resolve(profiles, args.profile, "-", overrides)
        check_checkpoint(recipe)
        directory = manifest.manifest_dir(data_dir, args.manifest_dir, target.name)
        path = Path(args.manifest) if args.manifest else manifest.latest_with_image(directory)
        record = manifest.load(path)
        recipe = dataclasses.replace(recipe, image=manifest.image_reference(record, str(path)))
        if not (record.get("image") or {}).get("pushed"):
            progress.warn(
                f"{path.name}: the image was not pushed; {recipe.image} exists only on the "
                "build host (or launch with --image REF)"
            )
        source = str(path)
    recipe = with_p2p_record(args, recipe, profiles)
    if recipe.experimental:
        progress.warn(f"profile {recipe.profile} is EXPERIMENTAL: {recipe.warning}")
    for flag, folder in recipe.outside_state_root:
        progress.info(
            escape(
                f"{flag}: mounts {folder} read-write, outside {recipe.state_root}/ "
                "(your own flag on this command line)"
            )
        )
    for line in recipe.derived:
        progress.info(escape(line))
    return recipe, source


def check_checkpoint(recipe: launch.Recipe) -> None:
    """The checkpoint on this machine against the recipe (index pattern, MTP weights); a
    local model that is no folder here, however it was given (`--set PROFILE:model=…` too),
    is refused: docker would make an empty one."""
    if recipe.model_is_local and not Path(recipe.model).is_dir():
        why = "not a folder" if Path(recipe.model).exists() else "no such folder on this machine"
        raise BuilderError(f"profile {recipe.profile}: model {recipe.model}: {why}")
    model_check.check_checkpoint(
        recipe.profile,
        recipe.args,
        recipe.model,
        recipe.model_is_local,
        recipe.model_revision,
        recipe.hf_cache,
        recipe.engine,
    )


def with_p2p_record(
    args: argparse.Namespace, recipe: launch.Recipe, profiles: launch_profiles.Profiles
) -> launch.Recipe:
    """The recipe with what `builder doctor --p2p` recorded for this machine (NCCL settings;
    a refused -pcie-ar profile is an error), and one line saying which record, or why none."""
    record_file, disabled = getattr(args, "p2p_record", None), getattr(args, "no_p2p_record", False)
    if record_file and disabled:
        raise BuilderError("--p2p-record and --no-p2p-record: give one")
    needs = bool(launch_profiles.flattened(profiles, recipe.profile).get("needs_peer_access"))
    recipe, line = p2p_record.apply(recipe, needs, record_file, disabled)
    if line:
        progress.info(escape(line))
    return recipe


def say_receipt(client, image: str) -> str | None:
    """One line on stderr: what `builder qualify` measured for this image, if pushed."""
    try:
        receipt = receipts.fetch(image, client)
    except BuilderError as exc:
        progress.warn(str(exc))
        return None
    if not receipt:
        line = f"no qualify receipt for {image} in its registry"
    else:
        try:
            said = receipts.summary(receipt)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError):
            said = "a receipt builder qualify did not write"
        # Whoever can push a tag can push a receipt: what it says is theirs, shown as such.
        line = f"{readiness.printable(said, 300)} (as its pusher recorded it; qualify here to know)"
    progress.info(escape(line))
    return line


def read_api_key(path: str) -> str:
    """The key in `path` (first line, stripped): for wait-ready's requests, never printed."""
    file = Path(path).expanduser()
    try:
        if not file.is_file():  # /dev/zero, a FIFO or a folder would hang or mislead
            raise BuilderError(f"--api-key-file {path}: not a regular file")
        if file.stat().st_size > 4096:
            raise BuilderError(f"--api-key-file {path}: over 4096 bytes, not a key file")
        text = file.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not text"
        raise BuilderError(f"--api-key-file {path}: cannot read it ({reason})") from None
    key = text.splitlines()[0].strip() if text else ""
    if not key:
        raise BuilderError(f"--api-key-file {path}: the file is empty")
    if file.stat().st_mode & 0o077:
        progress.warn(f"--api-key-file {path}: others can read it; chmod 600 {path}")
    return key


def add_launch_options(command: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The options that make a launch recipe (launch, deploy-files, qualify --start); `skip`
    names those the command defines itself."""

    def option(flag: str, **kwargs) -> None:
        if flag not in skip:
            command.add_argument(flag, **kwargs)

    option("--profile", help="launch profile (default: the target's default)")
    option(
        "--image",
        metavar="REF",
        help="take the image and its launch profiles from this image alone (pulled if "
        "absent; no checkout or manifest needed)",
    )
    option("--manifest", help="manifest to take the image from (default: latest)")
    option("--manifest-dir", metavar="DIR", help="where manifests are")
    option(
        "--model",
        help="a Hugging Face hub id (NAME or ORG/NAME), or a weights folder on this machine to "
        "mount read-only: a path starting with /, ./, ../ or ~, or one that exists here (made "
        "absolute; it must exist)",
    )
    option("--port", type=int, help="server port (default: the profile's)")
    option(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile param, e.g. --set cuda_graph_max_bs_decode=128",
    )
    option(
        "--extra-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="append an argument to the sglang command line (repeatable); write one that "
        "starts with -- as --extra-arg=--log-level=debug. A flag the profile already "
        "passes is refused: change it with --set (what wait-ready checks)",
    )
    option(
        "--hf-cache",
        metavar="DIR",
        help="host folder for the Hugging Face cache, made absolute (a system service has no "
        "working directory or $HOME of yours) (default: in the engine's state folder, "
        "/var/lib/sglang/huggingface or /var/lib/vllm/huggingface)",
    )
    option("--name", help="container name (default: the profile's)")
    option(
        "--api-key-file",
        metavar="FILE",
        help="require this API key (the file's first line) from clients: the file is "
        "mounted read-only and the image hands the key to sglang, so it never appears on a "
        "command line, in the environment, a log or a generated file (chmod 600 it)",
    )
    option(
        "--p2p-record",
        metavar="FILE",
        help="apply this `builder doctor --p2p` record (default: the one in the profile's "
        "sglang cache that matches this machine's GPU order and topology, if any)",
    )
    option(
        "--no-p2p-record",
        action="store_true",
        help="read no P2P record: the profile's NCCL settings as they are",
    )
    option(
        "--bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="host address the server port is published on (default: 127.0.0.1, this "
        "machine only; 0.0.0.0 opens it to the network: put an API key in front)",
    )
    # Params a file gives (chosen.json, a profile's fallback), not this command line.
    command.set_defaults(taken_params=(), taken_from="")
