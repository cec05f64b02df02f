"""Commands that serve, on the GPU VM: launch, deploy-files, wait-ready (verify and doctor:
commands/check.py)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import subprocess
from pathlib import Path

from rich.markup import escape

from builder.core.cache import atomic_write_text
from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import (
    DEADLINE_MINUTES,
    PROJECT,
    UNITS,
    HelpFormatter,
    add_command,
    add_output_options,
    add_project_options,
    emit,
    print_json,
)
from builder.core.settings import resolve_data_dir
from builder.spec.target import load_target

deploy = lazy_module("builder.site.deploy")
deploy_chosen = lazy_module("builder.site.commands.deploy_chosen")
docker_client = lazy_module("builder.core.docker_client")
doctor = lazy_module("builder.site.doctor")
image_recipe = lazy_module("builder.spec.recipe")
launch = lazy_module("builder.spec.launch")
manifest = lazy_module("builder.spec.manifest")
model_check = lazy_module("builder.spec.model_check")
p2p_record = lazy_module("builder.site.p2p_record")
packs = lazy_module("builder.spec.jit.packs")
progress = lazy_module("builder.core.progress")
readiness = lazy_module("builder.site.readiness")
receipts = lazy_module("builder.site.receipts")
runtime_jit = lazy_module("builder.site.runtime_jit")
validate = lazy_module("builder.core.validate")
docker = lazy_module("docker")

# A start is stalled after this long without a log line (weights print progress; NCCL
# initialisation stuck on PCIe P2P prints nothing).
STALL_MINUTES = 10.0


def _key_values(flag: str, items: list[str]) -> list[tuple[str, str]]:
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
        params=tuple(_key_values("--set", args.set)),
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
        profiles = launch.Profiles.of(target.file)
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
                f"{flag}: mounts {folder} read-write, outside {launch.SERVING_STATE_ROOT}/ "
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
    )


def with_p2p_record(
    args: argparse.Namespace, recipe: launch.Recipe, profiles: launch.Profiles
) -> launch.Recipe:
    """The recipe with what `builder doctor --p2p` recorded for this machine (NCCL settings;
    a refused -pcie-ar profile is an error), and one line saying which record, or why none."""
    record_file, disabled = getattr(args, "p2p_record", None), getattr(args, "no_p2p_record", False)
    if record_file and disabled:
        raise BuilderError("--p2p-record and --no-p2p-record: give one")
    needs = bool(launch.flattened(profiles, recipe.profile).get("needs_peer_access"))
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


def cmd_launch(args: argparse.Namespace) -> None:
    waiting = [flag for flag, attr in _WAIT_FLAGS if getattr(args, attr) is not None]
    if waiting and not args.run:
        raise BuilderError(f"{waiting[0]}: only with --run (it waits for the server it starts)")
    deadline_s = _wait_durations(args, poll_default="5")
    recipe, source = recipe_from_args(args)
    if not args.run:
        emit(args, {**recipe.to_json(), "recipe_from": source}, [recipe.shell()])
        return
    # --gpus all needs the NVIDIA runtime: said as `builder doctor` says it, before a start
    doctor.require_gpu_runtime(docker_client.connect().info())
    start_server(recipe)
    progress.info(f"started {recipe.container_name}; waiting for it to be ready")
    _wait(args, recipe.url, recipe.container_name, recipe.expect,
          recipe.ready_deadline_minutes * 60 if deadline_s is None else deadline_s)  # fmt: skip


_WAIT_FLAGS = (("--deadline", "deadline"), ("--stall-minutes", "stall_minutes"), ("--poll", "poll"))


def _wait_durations(args: argparse.Namespace, poll_default: str) -> float | None:
    """--poll and --stall-minutes into seconds on `args`; the --deadline in seconds, or None
    for the profile's (0: check once)."""
    args.poll = validate.duration("--poll", args.poll or poll_default, "s", above=0)
    stall = args.stall_minutes or str(STALL_MINUTES)
    args.stall_s = validate.duration("--stall-minutes", stall, "m", minimum=0)
    return validate.duration("--deadline", args.deadline, "m", minimum=0)


def add_wait_options(command: argparse.ArgumentParser, poll_default: str, when: str = "") -> None:
    """How long and how closely to wait for ready: wait-ready's, and launch --run's."""
    command.add_argument(
        "--deadline", metavar="MINUTES",
        help=f"{when}how long to wait: minutes, or with a unit ({UNITS}); 0 checks once "
        f"(default: the profile's, or {DEADLINE_MINUTES})",
    )  # fmt: skip
    command.add_argument(
        "--stall-minutes", metavar="MINUTES",
        help=f"{when}no new log line for this long before ready is a stall: minutes, or with "
        f"a unit ({UNITS}) (default: {STALL_MINUTES:g})",
    )  # fmt: skip
    command.add_argument(
        "--poll", metavar="SECONDS",
        help=f"{when}between checks: seconds, or with a unit ({UNITS}) (default: {poll_default})",
    )  # fmt: skip


def start_server(recipe: launch.Recipe) -> None:
    """`docker run` the very command `launch` prints, so what runs is what the manifest
    records. Only $HOME is expanded, as the VM's shell does for the printed line."""
    client = docker_client.connect()
    try:
        client.containers.get(recipe.container_name)
    except docker.errors.NotFound:
        pass
    else:
        raise BuilderError(
            f"a container named {recipe.container_name} exists: stop it gracefully with "
            f"`docker stop {recipe.container_name} && docker rm {recipe.container_name}`, "
            "or pass --name"
        )
    home = os.path.expanduser("~")
    command = [part.replace(launch.HOME, home) for part in recipe.docker_run()]
    try:  # a first run pulls the image: minutes for a server image
        started = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if started.returncode:
            raise BuilderError(f"docker run failed: {doctor.docker_failure(started.stderr)}")
    except BaseException as exc:
        # docker run may have created the container before failing to start it (port taken,
        # no NVIDIA runtime) or being interrupted: the name was free above, so it is ours.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["docker", "rm", "-f", recipe.container_name], capture_output=True, timeout=60
            )
        if isinstance(exc, subprocess.TimeoutExpired):
            raise BuilderError("docker run: no answer within an hour (pulling the image?)") from exc
        raise


def apply_chosen(args: argparse.Namespace) -> deploy_chosen.Chosen:
    """`--profile chosen`: the server a `qualify --sweep` chose (its chosen.json in
    --qualify-dir, checked against the receipt it cites) as the launch options."""
    chosen = deploy_chosen.load(args.qualify_dir)
    deploy_chosen.adopt(args, chosen)
    progress.info(escape(deploy_chosen.said(chosen, args.image)))
    return chosen


def cmd_deploy_files(args: argparse.Namespace) -> None:
    # Where it writes is checked before anything is looked up.
    if args.install:
        root = validate.writable_dir("--root", args.root)
    else:
        out = validate.writable_dir("--out", args.out).resolve()
    chosen = apply_chosen(args) if args.profile == "chosen" else None
    tag = None
    if args.image and not args.manifest:  # the recipe read from the digest that will run
        validate.image_reference("--image", args.image)
        pinned = deploy.pinned("--image", args.image)
        tag, args.image = (args.image if pinned != args.image else None), pinned
    recipe, source = recipe_from_args(args)
    deploy.refuse_unpinned(recipe.image, source)
    recipe = dataclasses.replace(recipe, image_tag=tag or "")
    if chosen:
        deploy_chosen.check_reproduces(recipe, chosen)
    # The unit runs compose where the files are installed, wherever they are written now.
    service_dir = deploy.service_dir(recipe.profile)
    if args.install:
        deploy.refuse_clash(root, recipe.profile, recipe.port, recipe.container_name)
        out = validate.writable_dir("--root", str(root / service_dir.lstrip("/")))
        units = validate.writable_dir("--root", str(root / deploy.SYSTEMD_DIR.lstrip("/")))
    else:
        units = out
    compose = out / "compose.yaml"
    unit = units / deploy.unit_name(recipe.profile)
    env_file = out / deploy.env_file_name(recipe)
    # Every file's text (each checks every value it holds) before the first is written:
    # a refused value leaves nothing behind.
    texts = (
        deploy.compose_file(recipe),
        deploy.systemd_unit(recipe, service_dir),
        deploy.environment_file(recipe),
    )
    atomic_write_text(compose, texts[0])
    atomic_write_text(unit, texts[1])
    written = [str(compose), str(unit)]
    if env_file.exists():
        if env_file.stat().st_mode & 0o077:
            progress.warn(f"{env_file}: others can read it; chmod 600 {env_file}")
        kept = f"kept {env_file} (your secrets; not rewritten)"
    else:
        atomic_write_text(env_file, texts[2], mode=0o600)
        written.append(str(env_file))
        kept = None
    result = {
        "compose": str(compose),
        "systemd_unit": str(unit),
        "environment_file": str(env_file),
        "written": written,
        "recipe_from": source,
    }
    enable = f"systemctl daemon-reload && systemctl enable --now {unit.stem}"
    lines = [f"wrote {path}" for path in written] + ([kept] if kept else [])
    lines.append(f"secrets (HF_TOKEN): edit {env_file} (mode 0600)")
    if args.install:
        lines.append(f"then: {enable}")
    else:  # cp -n: a secrets file already there keeps its token
        compose_q, env_q, unit_q = map(shlex.quote, map(str, (compose, env_file, unit)))
        lines.append(
            f"on the VM (the unit runs compose in {service_dir}/): mkdir -p {service_dir} && "
            f"cp {compose_q} {service_dir}/ && cp -n {env_q} {service_dir}/ && cp {unit_q} "
            f"{deploy.SYSTEMD_DIR}/ && {enable}"
        )
    lines.append(f"ready when: {recipe.wait_ready_command()}")
    emit(args, result, lines)


def _wait(args, url: str, container: str | None, expect: dict, deadline_s: float) -> None:
    client = None
    if container:
        client = docker_client.connect()
        try:
            client.containers.get(container)
        except docker.errors.NotFound:
            raise BuilderError(f"--container {container}: no such container") from None
    verdict = readiness.wait_ready(
        url,
        deadline_s=deadline_s,
        expect=expect,
        container=container,
        docker_client=client,
        poll_s=args.poll,
        stall_s=args.stall_s,
        api_key=read_api_key(args.api_key_file) if args.api_key_file else None,
    )
    result = verdict.to_json()
    compiled = others = None
    if container:
        try:
            watched = client.containers.get(container)
            compiled = [m.name for m in packs.compiled_in_container(watched)]
            others = runtime_jit.compiled_in_container(watched)
        except docker.errors.APIError:  # removed (404) or being removed (409): nothing left
            pass
        result["flashinfer_compiled_at_start"] = compiled
        result["other_jit_compiled_at_start"] = others.to_json() if others else None
    if args.json:
        print_json(result, ok=verdict.exit_code == 0)
    else:
        print(f"{verdict.state}: {verdict.message}")
        if compiled is not None:
            print(compiled_line(compiled, container))
        if others is not None:
            print(others.summary())
        if verdict.log_tail:
            print("last log lines:\n" + verdict.log_tail.rstrip())
    if verdict.exit_code:
        raise SystemExit(verdict.exit_code)


def compiled_line(compiled: list[str], container: str) -> str:
    if not compiled:
        return "FlashInfer modules compiled at start-up: 0 (every kernel came from the image)"
    return (
        f"FlashInfer modules compiled at start-up: {len(compiled)} ({', '.join(compiled)}); "
        f"pack them for the next image: builder jit harvest --container {container}"
    )


def cmd_wait_ready(args: argparse.Namespace) -> None:
    validate.server_url("wait-ready URL", args.url)
    deadline_s = _wait_durations(args, poll_default="2")
    if args.image:
        validate.image_reference("--image", args.image)
    expect: dict = {}
    params = tuple(_key_values("--set", args.set))
    profile, image = args.profile, args.image
    if not (profile or image) and args.container:
        # What `launch` started it with, from the labels it put on the container.
        profile, image, params = launched_with(args.container, params)
    if params and not (profile or image):
        raise BuilderError("--set: give --profile or --image (the profile whose params it sets)")
    if profile or image:
        if image:
            source = image_recipe.profiles_of(image_recipe.launch_recipe(image), image)
        else:
            source = load_target(resolve_data_dir(args.data_dir), args.target).file
        recipe = launch.resolve(source, profile, "-", launch.Overrides(params=params))
        expect = dict(recipe.expect)
        if deadline_s is None:
            deadline_s = recipe.ready_deadline_minutes * 60
    for item in args.expect:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuilderError(f"--expect {item}: expected KEY=VALUE")
        expect[key] = value
    _wait(args, args.url, args.container, expect,
          DEADLINE_MINUTES * 60 if deadline_s is None else deadline_s)  # fmt: skip


def launched_with(container_name: str, params: tuple) -> tuple[str | None, str | None, tuple]:
    """(profile, image id, params) from the labels `launch`/compose put on a container;
    (None, None, params) with a warning when it has none (started some other way)."""
    try:
        container = docker_client.connect().containers.get(container_name)
    except docker.errors.NotFound:
        raise BuilderError(f"--container {container_name}: no such container") from None
    profile, merged = launch.launched_with(container.labels or {}, params)
    if not profile or not image_recipe.built_by_builder(container.image):
        progress.warn(
            f"--container {container_name} was not started by builder launch from a builder "
            "image: backends not checked (give --profile, or --image)"
        )
        return None, None, params
    progress.info(escape(f"checking profile {profile} as launched (the container's labels)"))
    return profile, container.image.id, merged


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
        f"working directory or $HOME of yours) (default: {launch.HF_CACHE_DEFAULT})",
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


def register(sub) -> None:
    launch_cmd = add_command(
        sub,
        "launch",
        cmd_launch,
        "print (or --run) the exact docker run for a launch profile",
        "Print the docker run that starts the server on a GPU VM: the image (--image REF as "
        "given, or by digest from the manifest), --gpus all, --ipc=host, shm size, model cache "
        "volume, port, environment and the sglang command line of the profile. With --run, "
        "start it and wait until it is ready (see wait-ready).\n\n"
        "examples:\n"
        "  builder launch --image $IMAGE   # on the GPU VM: the image's own profiles\n"
        "  builder launch --target sm120   # on the build host: the latest manifest's image\n"
        "  builder launch --image $IMAGE --model /data/GLM-5-NVFP4 "
        "--set cuda_graph_max_bs_decode=128\n"
        "  builder launch --image $IMAGE --profile glm5-nvfp4-tp8-fusion   # experimental, "
        "prints a warning",
        uses=(PROJECT,),
    )
    add_launch_options(launch_cmd)
    launch_cmd.add_argument("--run", action="store_true", help="start it here and wait-ready")
    add_wait_options(launch_cmd, poll_default="5", when="with --run: ")

    deploy_cmd = add_command(
        sub,
        "deploy-files",
        cmd_deploy_files,
        "write a compose file and a systemd unit for the GPU VM",
        "Write compose.yaml (GPU reservation, host IPC, healthcheck with a start period that "
        "allows slow starts, no restart loop) and a systemd unit that runs it from "
        f"{deploy.INSTALL_DIR}/PROFILE/ (where --install puts them; with --out it says how to "
        "copy them there), for a launch profile and an image (--image, or a manifest's), "
        "pinned to its digest: a tag is resolved in its registry and kept in a comment. "
        "--profile chosen deploys the server a "
        "`qualify --sweep` chose (its chosen.json in --qualify-dir): the image by digest, "
        "profile, params, model, HF cache, port, API key file and extra args its receipt's "
        "server ran, compared with that server's command argument by argument; a flag that "
        "says otherwise is refused, and a param or HF cache it names mounts read-write "
        "outside /var/lib/sglang only when your own --set or --hf-cache says the same.\n\n"
        "examples:\n"
        "  builder deploy-files --image $IMAGE --out deploy/   # then copy as it says\n"
        "  sudo builder deploy-files --image $IMAGE --install\n"
        "  sudo builder deploy-files --profile chosen --qualify-dir qualify/ --install",
        uses=(PROJECT,),
    )
    add_launch_options(deploy_cmd)
    deploy_cmd.add_argument(
        "--qualify-dir",
        default="qualify",
        metavar="DIR",
        help="with --profile chosen: the `qualify --sweep --out` folder whose chosen.json "
        "(and the receipt it cites) says what to deploy (default: ./qualify)",
    )
    deploy_cmd.add_argument("--out", default="deploy", help="output directory (default: ./deploy)")
    deploy_cmd.add_argument(
        "--install",
        action="store_true",
        help=f"put them in place instead: compose and the secrets file in "
        f"{deploy.INSTALL_DIR}/PROFILE/, the unit in {deploy.SYSTEMD_DIR}/ (refused when "
        "another profile's unit there uses the same port or container name)",
    )
    deploy_cmd.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="with --install: the file system root to install under (default: /)",
    )

    wait = sub.add_parser(
        "wait-ready",
        help="wait until a server is ready; tell 'still loading' from 'crashed'",
        description="Wait in stages: port open, /health 200 (503 = still starting), "
        "/health_generate 200 (a real generation), /server_info shows the expected backends. "
        "With --container, a crash is the container exiting, restarting or being removed "
        "(exit code and log tail shown), no new log line for --stall-minutes is a stalled "
        "start, and the kernels the server compiled at start-up are named (FlashInfer, "
        "DeepGEMM, sglang's JIT, Triton). Given only --container, the backends are those of "
        "the profile and --set params `launch` started it with (its labels). "
        "Exit codes: 0 ready, 1 bad input, 3 crashed, 4 deadline passed (still loading), "
        "5 up but with other backends than expected, 6 stalled, 9 no Docker daemon.\n\n"
        "examples:\n"
        "  builder wait-ready http://127.0.0.1:30000 --container sglang-glm5   # as launched\n"
        "  builder wait-ready http://127.0.0.1:30000 --image $IMAGE --profile glm5-nvfp4-tp8",
        formatter_class=HelpFormatter,
    )
    wait.add_argument("url", help="server base URL, e.g. http://127.0.0.1:30000")
    wait.add_argument(
        "--container", help="container name or id to watch for crashes, stalls and JIT compiles"
    )
    add_wait_options(wait, poll_default="2")
    wait.add_argument("--profile", help="take the expected backends and deadline from a profile")
    wait.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a profile param, as given to `launch --set` (repeatable), e.g. "
        "--set cuda_graph_max_bs_decode=128",
    )
    wait.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="the server's API key (first line), sent for /server_info (/health needs none)",
    )
    wait.add_argument(
        "--image",
        metavar="REF",
        help="take the profiles from this image's recipe instead of a checkout (pulled if absent)",
    )
    wait.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="/server_info must report this (repeatable)",
    )
    add_project_options(wait)
    add_output_options(wait)
    wait.set_defaults(func=cmd_wait_ready)
