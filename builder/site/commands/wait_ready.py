"""`builder wait-ready`: wait until a server is ready, telling 'still loading' from
'crashed' (and launch --run's wait, the same)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import (
    DEADLINE_MINUTES,
    UNITS,
    HelpFormatter,
    add_output_options,
    add_project_options,
    print_json,
)
from builder.core.settings import resolve_data_dir
from builder.site.commands.launch_options import key_values, read_api_key
from builder.spec import engines
from builder.spec.target import load_target

docker_client = lazy_module("builder.core.docker_client")
image_recipe = lazy_module("builder.spec.recipe")
launch = lazy_module("builder.spec.launch")
packs = lazy_module("builder.spec.jit.packs")
progress = lazy_module("builder.core.progress")
readiness = lazy_module("builder.site.readiness")
runtime_jit = lazy_module("builder.site.runtime_jit")
validate = lazy_module("builder.core.validate")
docker = lazy_module("docker")

# A start is stalled after this long without a log line (weights print progress; NCCL
# initialisation stuck on PCIe P2P prints nothing).
STALL_MINUTES = 10.0

WAIT_FLAGS = (("--deadline", "deadline"), ("--stall-minutes", "stall_minutes"), ("--poll", "poll"))


def wait_durations(args: argparse.Namespace, poll_default: str) -> float | None:
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


def wait_and_report(
    args,
    url: str,
    container: str | None,
    expect: dict,
    deadline_s: float,
    engine_name: str = engines.DEFAULT,
) -> None:
    """Wait for the `engine_name` server at `url` (watching `container`, if given), print
    the verdict and the kernels it compiled at start-up, and exit with the verdict's code."""
    engine = engines.engine(engine_name)
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
        engine=engine,
    )
    result = verdict.to_json()
    compiled = others = None
    if container:
        try:
            watched = client.containers.get(container)
            compiled = [m.name for m in packs.compiled_in_container(watched)]
            others = runtime_jit.compiled_in_container(watched, engine)
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
    deadline_s = wait_durations(args, poll_default="2")
    if args.image:
        validate.image_reference("--image", args.image)
    expect: dict = {}
    engine = args.engine
    params = tuple(key_values("--set", args.set))
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
        if engine and engine != recipe.engine:
            raise BuilderError(
                f"--engine {engine}: profile {recipe.profile} starts a {recipe.engine} server"
            )
        engine = recipe.engine
        expect = dict(recipe.expect)
        if deadline_s is None:
            deadline_s = recipe.ready_deadline_minutes * 60
    for item in args.expect:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuilderError(f"--expect {item}: expected KEY=VALUE")
        expect[key] = value
    deadline = DEADLINE_MINUTES * 60 if deadline_s is None else deadline_s
    wait_and_report(args, args.url, args.container, expect, deadline, engine or engines.DEFAULT)


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


def register(sub) -> None:
    wait = sub.add_parser(
        "wait-ready",
        help="wait until a server is ready; tell 'still loading' from 'crashed'",
        description="Wait in stages: port open, /health 200 (503 = still starting), "
        "/health_generate 200 (a real generation), /server_info shows the expected backends. "
        'A vLLM server (a profile of an engine = "vllm" target, or --engine vllm) listens '
        "only once loaded, then answers /health, /v1/models and a one-token completion; what "
        "it serves is read from /v1/models, /version, /metrics and, with --container, its "
        "start-up log. "
        "With --container, a crash is the container exiting, restarting or being removed "
        "(exit code and log tail shown), no new log line for --stall-minutes is a stalled "
        "start, and the kernels the server compiled at start-up are named (FlashInfer, then "
        "the engine's caches: sglang's DeepGEMM, JIT and Triton; vLLM's b12x, torch.compile, "
        "Triton and DeepGEMM). Given only --container, the backends are those of "
        "the profile and --set params `launch` started it with (its labels). "
        "Exit codes: 0 ready, 1 bad input, 3 crashed, 4 deadline passed (still loading), "
        "5 up but with other backends than expected, 6 stalled, 9 no Docker daemon.\n\n"
        "examples:\n"
        "  builder wait-ready http://127.0.0.1:30000 --container sglang-glm5   # as launched\n"
        "  builder wait-ready http://127.0.0.1:30000 --image $IMAGE --profile glm5-nvfp4-tp8\n"
        "  builder wait-ready http://127.0.0.1:8000 --target sm120-vllm --profile glm5-nvfp4-tp8 "
        "--container vllm-glm5",
        formatter_class=HelpFormatter,
    )
    wait.add_argument("url", help="server base URL, e.g. http://127.0.0.1:30000")
    wait.add_argument(
        "--container", help="container name or id to watch for crashes, stalls and JIT compiles"
    )
    add_wait_options(wait, poll_default="2")
    wait.add_argument("--profile", help="take the expected backends and deadline from a profile")
    wait.add_argument(
        "--engine",
        choices=engines.NAMES,
        help="the server's engine, when no profile says it (default: sglang)",
    )
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
