"""`builder qualify`: one command on the GPU VM proves a running server right and fast, and
leaves a receipt; `--compare` puts receipts side by side."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rich.markup import escape

from builder.cache import atomic_write_text
from builder.commands.common import (
    EPILOG,
    HelpFormatter,
    add_output_options,
    add_project_options,
    print_json,
)
from builder.commands.serve import (
    add_launch_options,
    read_api_key,
    recipe_from_args,
    start_server,
)
from builder.errors import EXIT_CODES, BuilderError
from builder.lazy import lazy_module
from builder.settings import resolve_data_dir
from builder.target import load_target

docker_client = lazy_module("builder.docker_client")
gpu_state = lazy_module("builder.gpu_state")
image_recipe = lazy_module("builder.recipe")
launch = lazy_module("builder.launch")
packs = lazy_module("builder.kernels.packs")
progress = lazy_module("builder.progress")
qualify = lazy_module("builder.qualify")
readiness = lazy_module("builder.readiness")
receipt_views = lazy_module("builder.receipt_views")
receipts = lazy_module("builder.receipts")
runtime_jit = lazy_module("builder.runtime_jit")
serving_bench = lazy_module("builder.serving_bench")
validate = lazy_module("builder.validate")
verify = lazy_module("builder.verify")
docker = lazy_module("docker")
identity = lazy_module("builder.identity")

DEFAULT_CONCURRENCY = "1,64,256,1024"
DEFAULT_NEEDLES = "4096,16384,65536"


def _numbers(flag: str, text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise BuilderError(f"{flag} {text!r}: expected whole numbers above 0, e.g. 1,64,256")
    return values


def _public_url(url: str) -> str:
    """The URL without user:password@ (the receipt and the log never hold credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _image_of(image, reference: str | None) -> dict:
    return {
        "reference": reference,
        "id": image.id,
        "repo_digests": image.attrs.get("RepoDigests") or [],
        "built_by_builder": image_recipe.built_by_builder(image),
    }


def _given_image(client, reference: str):
    """--image, pulled when it is not here (as verify does)."""
    image_recipe.from_image(client, reference)  # pulls; refuses an image without a recipe
    return client.images.get(reference)


_SECRET_NAME = re.compile(r"key|token|password|secret|credential", re.IGNORECASE)


def _server_command(container) -> list[str]:
    """What the container runs (entrypoint + command), with the value of every flag whose
    name says secret (`--api-key V`, `--api-key=V`, `--ssl-keyfile-password V`) hidden."""
    config = container.attrs["Config"]
    command = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    shown = []
    for index, part in enumerate(command):
        flag, equals, _ = part.partition("=")
        previous = command[index - 1] if index else ""
        if part.startswith("--") and equals and _SECRET_NAME.search(flag):
            shown.append(f"{flag}=<redacted>")
        elif previous.startswith("--") and "=" not in previous and _SECRET_NAME.search(previous):
            shown.append("<redacted>")
        else:
            shown.append(part)
    return shown


def _started_seconds_ago(container) -> float | None:
    try:
        started = docker_client.started_at(container)
    except ValueError:
        return None
    return (datetime.now(UTC) - started).total_seconds()


# sglang's line once the HTTP server serves (srt/entrypoints/http_server.py).
_SGLANG_READY = "The server is fired up and ready to roll"


def _time_to_ready(container, waited: float) -> tuple[float | None, str]:
    """Seconds from the container's start to ready: seen by waiting for it, or read from
    sglang's own ready line; a server already up when qualify came, without that line in
    its log, has no known figure (not the age of the container)."""
    if container is None:
        return round(waited, 1), "qualify start"
    container.reload()
    try:
        started = docker_client.started_at(container)
    except ValueError:
        return None, "unknown: ready before qualify came"
    # This start's lines only (a restarted container keeps the earlier ones).
    logs = container.logs(timestamps=True, since=started.replace(tzinfo=None))
    for line in logs.decode(errors="replace").splitlines():
        if _SGLANG_READY in line:
            try:
                ready = docker_client.timestamp(line.split(" ", 1)[0])
            except ValueError:
                break
            if ready >= started:
                return round((ready - started).total_seconds(), 1), "container start (its log)"
    since_start = _started_seconds_ago(container)
    if since_start is not None and waited >= 5:  # qualify saw it turn ready
        return round(since_start, 1), "container start"
    return None, "unknown: ready before qualify came"


class _Run:
    """The receipt as it fills, and the first hard failure."""

    def __init__(self, receipt: dict) -> None:
        self.receipt = receipt

    def fail(self, check: str, message: str) -> None:
        self.receipt["result"] = {"ok": False, "failed_at": check, "message": message}
        raise _Failed(check, message)


class _Failed(Exception):
    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check}: {message}")
        self.check = check


def _launched_profile(args, container) -> tuple[str | None, tuple]:
    """--profile and --set, else what `launch` labelled the container with."""
    params = tuple(tuple(item.split("=", 1)) for item in args.set)
    if args.profile or container is None:
        return args.profile, params
    return launch.launched_with(container.labels or {}, params)


def _expect_from_profile(
    args, client, image: dict | None, profile: str | None, params: tuple
) -> tuple[dict, float | None]:
    """The backends the profile asks for, and its deadline: from the image's own recipe
    when it is a builder image, else from the checkout's target."""
    if not profile:
        return {}, None
    reference = args.image or (image or {}).get("id")
    if reference and (args.image or image.get("built_by_builder")):
        source = image_recipe.profiles_of(image_recipe.launch_recipe(reference), reference)
    else:
        source = load_target(resolve_data_dir(args.data_dir), args.target).file
    recipe = launch.resolve(source, profile, "-", launch.Overrides(params=params))
    return dict(recipe.expect), recipe.ready_deadline_minutes


def cmd_qualify(args: argparse.Namespace) -> None:
    if args.compare:
        _compare(args)
        return
    if args.start and (args.url or args.container):
        raise BuilderError("qualify --start starts the server itself: give no URL or --container")
    if not args.url and not args.start:
        raise BuilderError(
            "qualify: give the server URL (http://HOST:PORT), --start to launch one, "
            "or --compare A B"
        )
    url = validate.server_url("qualify URL", args.url) if args.url else ""
    concurrency = _numbers("--concurrency", args.concurrency)
    needles = _numbers("--needles", args.needles)
    args.deadline = validate.minutes("--deadline", args.deadline)
    if not (math.isfinite(args.level_seconds) and args.level_seconds >= 1):
        raise BuilderError(f"--level-seconds {args.level_seconds:g}: must be a number, 1 or more")
    for flag, value in (("--input-len", args.input_len), ("--output-len", args.output_len)):
        if value <= 0:
            raise BuilderError(f"{flag} {value}: must be a whole number above 0")
    if args.prompts is not None and args.prompts <= 0:
        raise BuilderError(f"--prompts {args.prompts}: must be a whole number above 0")
    if args.image:
        validate.image_reference("--image", args.image)
    for item in args.set:
        if "=" not in item or item.startswith("="):
            raise BuilderError(f"--set {item}: expected KEY=VALUE")
    out = validate.writable_dir("--out", args.out)
    api_key = read_api_key(args.api_key_file) if args.api_key_file else None
    if not args.start:
        given = [flag for flag, attr in _START_ONLY if getattr(args, attr) != _DEFAULTS[attr]]
        if given:
            raise BuilderError(f"{given[0]}: only with --start (it launches the server)")
        _qualify(args, url, api_key, concurrency, needles, out)
        return
    recipe, _ = recipe_from_args(args)  # every input checked before a server starts
    start_server(recipe)
    progress.info(f"started {recipe.container_name} from {recipe.image}; qualifying it")
    args.container, args.image, args.profile = recipe.container_name, None, recipe.profile
    try:
        _qualify(args, recipe.url, api_key, concurrency, needles, out)
    finally:
        if args.keep_server:
            progress.info(f"{recipe.container_name} keeps running (--keep-server)")
        else:
            _stop_server(recipe.container_name, out)


def _stop_server(name: str, out: Path) -> None:
    """Gracefully, as an operator would: SIGTERM, a minute to exit, then removed; its log
    is kept beside the receipt (server.log), since the container goes."""
    try:
        container = docker_client.connect().containers.get(name)
        container.stop(timeout=60)
        atomic_write_text(out / "server.log", container.logs().decode(errors="replace"))
        container.remove()
    except (BuilderError, docker.errors.NotFound, docker.errors.APIError, OSError) as exc:
        progress.warn(f"could not stop and remove {name}: {exc}; `docker rm -f {name}`")
        return
    progress.info(f"stopped and removed {name}, its log in {out / 'server.log'}")


def _qualify(args, url: str, api_key, concurrency, needles, out: Path) -> None:
    client = docker_client.connect() if (args.container or args.image) else None
    container = None
    if args.container:
        try:
            container = client.containers.get(args.container)
        except docker.errors.NotFound:
            raise BuilderError(f"--container {args.container}: no such container") from None
    image = (
        _image_of(container.image, container.attrs["Config"].get("Image")) if container else None
    )
    if args.image:
        given = _given_image(client, args.image)
        if image and image["id"] != given.id:
            raise BuilderError(
                f"--image {args.image} is not the image --container {args.container} runs "
                f"({image['reference']})"
            )
        image = _image_of(given, args.image)
    profile, params = _launched_profile(args, container)
    in_image, client_note = _throughput_client(args, container)

    receipt: dict = {
        "schema": receipt_views.RECEIPT_SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "builder": identity.builder_identity(),
        "server": {
            "url": _public_url(url),
            "container": args.container,
            "image": image,
            "profile": profile,
            "params": [list(pair) for pair in params],
            "command": _server_command(container) if container else None,
        },
        "gpus": gpu_state.describe(),
        "verify": None,
        "startup": None,
        "correctness": None,
        "throughput": None,
        "result": {"ok": True, "failed_at": None, "message": "every check passed"},
    }
    run = _Run(receipt)
    with contextlib.suppress(_Failed):  # the receipt says where it stopped
        _checks(
            args, run, client, container, image, url, api_key, concurrency, needles,
            (in_image, client_note),
        )  # fmt: skip
    receipt_path = out / "receipt.json"
    atomic_write_text(receipt_path, json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    plot = receipt_views.plot(receipt, out / "receipt.png") if receipt["throughput"] else None
    pushed = None
    if args.push_receipt:
        try:
            pushed = {"reference": receipts.push(client or docker_client.connect(), receipt_path)}
            progress.info(escape(f"receipt pushed beside its image: {pushed['reference']}"))
        except BuilderError as exc:
            pushed = {"error": str(exc)}
            progress.warn(f"--push-receipt: {exc}")
    push_failed = bool(pushed and "error" in pushed)
    ok = receipt["result"]["ok"] and not push_failed
    if args.json:
        where = {"receipt": str(receipt_path), "plot": plot and str(plot), "receipt_push": pushed}
        print_json({**receipt, **where}, ok=ok)
    else:
        print("\n".join(receipt_views.report_lines(receipt, receipt_path, plot)))
    if push_failed and receipt["result"]["ok"]:
        raise SystemExit(EXIT_CODES["error"])
    if not receipt["result"]["ok"]:
        raise SystemExit(EXIT_CODES["unqualified"])


def _throughput_client(args, container) -> tuple[bool, str]:
    """Whether sglang's bench_serving in the container measures throughput, and why.
    sglang's own bench_serving from the server's image where it can run; builder's, which
    follows its definitions, where it cannot (no container to run it in, or no sglang)."""
    if args.no_throughput:
        return False, ""
    if args.client == "builder":
        return False, "--client builder"
    if container is None:
        if args.client == "image":
            raise BuilderError(
                "--client image: needs --container NAME or --start "
                "(sglang's bench_serving runs inside the server's container)"
            )
        return False, "no --container to run sglang's bench_serving in"
    why = serving_bench.missing(container)
    if why and args.client == "image":
        raise BuilderError(f"--client image: container {container.name}: {why}")
    if why:
        return False, f"container {container.name}: {why}"
    return True, f"from container {container.name}"


def _checks(
    args, run, client, container, image, url, api_key, concurrency, needles, throughput_client
) -> None:
    receipt = run.receipt
    # 1. The image's own promise, when it is known and a builder image.
    reference = args.image or (image or {}).get("id")
    if reference and (args.image or image.get("built_by_builder")):
        try:
            with progress.task(f"verify {reference}"):
                _, checks = verify.verify(client, reference)
        except BuilderError as exc:
            run.fail("verify", str(exc))
        failed = [c for c in checks if not c.ok]
        receipt["verify"] = {"ok": not failed, "checks": [c.to_json() for c in checks]}
        if failed:
            run.fail("verify", f"{failed[0].check}: {failed[0].detail}")

    # 2. Start-up: ready (and the profile's backends), then every JIT compile it cost.
    launched = receipt["server"]
    expect, profile_deadline = _expect_from_profile(
        args, client, image, launched["profile"], tuple(tuple(p) for p in launched["params"])
    )
    deadline = args.deadline if args.deadline is not None else (profile_deadline or 20)
    verdict = readiness.wait_ready(
        url,
        deadline_s=deadline * 60,
        expect=expect,
        container=args.container,
        docker_client=client,
        poll_s=2.0,
        stall_s=15 * 60,
        api_key=api_key,
    )
    startup: dict = {"state": verdict.state, "message": verdict.message}
    receipt["startup"] = startup
    if verdict.state != "ready":
        run.fail("startup", f"{verdict.state}: {verdict.message}")
    startup["ready_seconds"], startup["ready_seconds_from"] = _time_to_ready(
        container, verdict.elapsed
    )
    server_info = verdict.server_info
    receipt["server"]["server_info"] = {
        key: server_info.get(key)
        for key in sorted(server_info)
        if not isinstance(server_info.get(key), dict | list) and not _SECRET_NAME.search(key)
    }
    if container:
        try:
            flashinfer = [m.name for m in packs.compiled_in_container(container)]
            others = runtime_jit.compiled_in_container(container)
        except docker.errors.APIError as exc:
            run.fail("startup", f"cannot inspect container {args.container}: {exc.explanation}")
        compiled = {"flashinfer": flashinfer, **others.to_json()}
        startup["compiled_at_start"] = compiled
        if others.by_cache is None and not args.accept_start_compiles:
            run.fail("startup", f"the server's JIT caches could not be read ({others.why_unread})")
        counted = {cache: names for cache, names in compiled.items() if names}
        if counted and not args.accept_start_compiles:
            names = "; ".join(f"{cache}: {', '.join(n)}" for cache, n in counted.items())
            fix = (
                f"builder jit harvest --container {args.container}, then rebuild"
                if flashinfer
                else "they are on the sglang cache volume now: restart and qualify again"
            )
            run.fail("startup", f"{sum(map(len, counted.values()))} JIT compiles ({names}); {fix}")
    else:
        startup["compiled_at_start"] = None  # no container: nothing to look into

    # 3. Correctness at temperature 0.
    server = qualify.Server(url, api_key)
    try:
        model, context = qualify.served_model(server)
    except qualify.QualifyError as exc:
        run.fail("correctness", str(exc))
    correctness: dict = {"model": model, "context_length": context}
    receipt["correctness"] = correctness
    with progress.task(f"correctness: {len(qualify.PROBES)} probes"):
        try:
            correctness["probes"] = qualify.run_probes(server, model)
        except qualify.QualifyError as exc:
            correctness["probes"] = exc.partial
            run.fail("correctness", str(exc))
    with progress.task(f"correctness: needles at {', '.join(map(str, needles))} tokens"):
        try:
            correctness["needles"] = qualify.run_needles(server, model, needles, context, args.seed)
        except qualify.QualifyError as exc:
            correctness["needles"] = exc.partial
            run.fail("correctness", str(exc))

    # 4. Throughput, with the GPUs sampled through each level.
    if args.no_throughput:
        return
    levels = []
    in_image, client_note = throughput_client
    receipt["throughput"] = {
        "client": f"{serving_bench.MODULE} in the server's image"
        if in_image
        else "builder (sglang bench_serving's metric definitions, /generate streaming)",
        "client_why": client_note,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seed": args.seed,
        "level_seconds": args.level_seconds,
        "levels": levels,
    }
    for level in concurrency:
        prompts = args.prompts or min(max(4 * level, 16), 4096)
        with progress.task(f"throughput: concurrency {level}, {prompts} prompts"):
            sampler = gpu_state.measure()
            if in_image:
                result = serving_bench.run_level(
                    container, base_url=_inside_url(url, server_info), model=model,
                    tokenizer=args.tokenizer or _tokenizer_of(server_info, model),
                    api_key=api_key, concurrency=level, prompts=prompts,
                    input_len=args.input_len, output_len=args.output_len, seed=args.seed,
                    deadline_s=int(2 * args.level_seconds) + 120,
                )  # fmt: skip
            else:
                result = qualify.run_level(
                    server, level, prompts, args.input_len, args.output_len, args.seed,
                    args.level_seconds,
                )  # fmt: skip
            result["gpu"] = sampler.stop()
        levels.append(result)
        if not result["completed"]:
            run.fail(
                "throughput",
                f"concurrency {level}: no request completed ({result['first_error']})",
            )


def _inside_url(url: str, server_info: dict) -> str:
    """The server as a process in its own container reaches it: loopback, on the port the
    server itself listens on (a published port may differ)."""
    parts = urlsplit(url)
    port = server_info.get("port") if isinstance(server_info.get("port"), int) else parts.port
    return f"{parts.scheme}://127.0.0.1:{port}"


def _tokenizer_of(server_info: dict, model: str) -> str:
    for key in ("tokenizer_path", "model_path"):
        if isinstance(server_info.get(key), str) and server_info[key]:
            return server_info[key]
    return model


def _compare(args) -> None:
    header, rows = receipt_views.compare(args.compare)
    if args.json:
        print_json({"columns": header, "rows": rows})
        return
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


# Launch options that only --start uses (the server to start), and their defaults.
_START_ONLY = (
    ("--manifest", "manifest"), ("--manifest-dir", "manifest_dir"), ("--model", "model"),
    ("--port", "port"), ("--extra-arg", "extra_arg"), ("--hf-cache", "hf_cache"),
    ("--name", "name"), ("--bind", "bind"), ("--keep-server", "keep_server"),
)  # fmt: skip
_DEFAULTS: dict = {}


def register(sub) -> None:
    command = sub.add_parser(
        "qualify",
        help="prove a running server right and fast on this machine's GPUs; write a receipt",
        description="""\
Run against a server (URL; --container to watch it, --api-key-file if it wants a key),
or one it starts itself from an image's launch recipe (--start; stopped afterwards), in
order, stopping at the first hard failure with one line that names it:
  verify      the image's own checks (with --image, or a --container of a builder image)
  startup     ready (the --profile's backends), then every JIT compile the start cost,
              per cache: FlashInfer, DeepGEMM, sglang's JIT, Triton (0 expected)
  correctness short probes with one right answer, at temperature 0; then a code hidden
              in filler at each --needles length (past the sparse top-k of 2048 tokens)
  throughput  random prompts from --seed at each --concurrency, measured by sglang's
              own bench_serving inside the server's container (builder's client, same
              definitions, where it cannot run): output tok/s, req/s, TTFT and TPOT
              p50/p99; the GPUs' power, SM clock, utilisation and memory sampled with
              NVML meanwhile
The receipt (receipt.json, and receipt.png when matplotlib is installed) goes to --out;
--push-receipt also stores it beside the image in its registry, for verify and launch.
Exit codes: 0 qualified, 1 bad input, 8 a check failed (the receipt says which),
9 no Docker daemon.

examples:
  builder qualify http://127.0.0.1:30000 --container sglang-glm5 --profile glm5-nvfp4-tp8
  builder qualify --start --image REGISTRY/sglang-sm120@sha256:... --profile glm5-nvfp4-tp8-pcie-ar
  builder qualify --compare default/receipt.json pcie-ar/receipt.json""",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    command.add_argument("url", nargs="?", help="server root, e.g. http://127.0.0.1:30000")
    command.add_argument("--container", help="the server's container: crashes, JIT compiles")
    command.add_argument(
        "--start", action="store_true",
        help="start the server itself, as `launch --run` does (--image or the latest manifest, "
        "--profile, --set, --model, --port ...), qualify it, then stop and remove it",
    )  # fmt: skip
    command.add_argument(
        "--keep-server", action="store_true", help="with --start: leave the server running"
    )
    command.add_argument(
        "--api-key-file", metavar="FILE",
        help="file holding the server's key (with --start: the key the server then requires)",
    )  # fmt: skip
    command.add_argument(
        "--image", metavar="REF",
        help="the server's image: verify it first (with --start: the image to start)",
    )  # fmt: skip
    command.add_argument(
        "--profile", help="the launch profile it runs: its backends are checked at start-up"
    )
    command.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a profile param the server was launched with (as launch --set)",
    )  # fmt: skip
    command.add_argument(
        "--concurrency", default=DEFAULT_CONCURRENCY, metavar="N,N,...",
        help=f"throughput levels (default: {DEFAULT_CONCURRENCY})",
    )  # fmt: skip
    command.add_argument(
        "--prompts", type=int, metavar="N",
        help="requests per level (default: 4 x concurrency, 16 to 4096)",
    )  # fmt: skip
    command.add_argument(
        "--input-len", type=int, default=1024, metavar="TOKENS",
        help="prompt tokens per throughput request (default: 1024)",
    )  # fmt: skip
    command.add_argument(
        "--output-len", type=int, default=256, metavar="TOKENS",
        help="tokens generated per throughput request, ignoring EOS (default: 256)",
    )  # fmt: skip
    command.add_argument(
        "--level-seconds", type=float, default=300, metavar="S",
        help="no new request after this long in a level (default: 300)",
    )  # fmt: skip
    command.add_argument(
        "--needles", default=DEFAULT_NEEDLES, metavar="TOKENS,...",
        help=f"needle lengths, clamped to the served context (default: {DEFAULT_NEEDLES})",
    )  # fmt: skip
    command.add_argument("--seed", type=int, default=1, help="prompts and needles (default: 1)")
    command.add_argument(
        "--deadline", metavar="MINUTES",
        help="how long to wait for ready, in minutes or with a unit (90s, 20m, 1h) "
        "(default: the profile's, or 20)",
    )  # fmt: skip
    command.add_argument(
        "--accept-start-compiles", action="store_true",
        help="record JIT compiles at start-up without failing (a host's first start)",
    )  # fmt: skip
    command.add_argument(
        "--client", choices=("auto", "image", "builder"), default="auto",
        help="throughput client: sglang's own bench_serving inside the server's container "
        "(image), builder's, which follows its definitions (builder), or image where the "
        "container has sglang (auto, the default); with image, a level still running after "
        "2 x --level-seconds + 2 min is stopped and fails",
    )  # fmt: skip
    command.add_argument(
        "--tokenizer", metavar="PATH",
        help="the tokenizer bench_serving loads in the container (default: the server's)",
    )  # fmt: skip
    command.add_argument("--no-throughput", action="store_true", help="stop after correctness")
    command.add_argument("--out", default="qualify", help="receipt folder (default: ./qualify)")
    command.add_argument(
        "--push-receipt", action="store_true",
        help="store the receipt in the image's registry, tagged by the image's digest "
        "(REPO:sha256-<hex>.receipt); verify and launch --image then show it",
    )  # fmt: skip
    command.add_argument(
        "--compare", nargs="+", metavar="RECEIPT", help="print receipts side by side and stop"
    )
    add_launch_options(command, skip=("--profile", "--image", "--set", "--api-key-file"))
    _DEFAULTS.update({attr: command.get_default(attr) for _, attr in _START_ONLY})
    add_project_options(command)
    add_output_options(command)
    command.set_defaults(func=cmd_qualify)
