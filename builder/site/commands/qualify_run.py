"""One server qualified, in order: verify, start-up, correctness (the gates), throughput,
stopping at the first hard failure; the receipt (`builder qualify`'s run, without the CLI)."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from rich.markup import escape

from builder.core.cache import atomic_write_text
from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import DEADLINE_MINUTES
from builder.core.settings import resolve_data_dir
from builder.spec import engines
from builder.spec.engines import Engine, ready_line_indices
from builder.spec.target import load_target

if TYPE_CHECKING:
    from builder.site.gsm8k import Dataset
    from builder.spec.launch import Recipe
    from builder.spec.launch_profiles import Profiles

capture = lazy_module("builder.site.capture")
docker_client = lazy_module("builder.core.docker_client")
gates = lazy_module("builder.site.gates")
gpu_state = lazy_module("builder.site.gpu_state")
identity = lazy_module("builder.core.identity")
image_recipe = lazy_module("builder.spec.recipe")
launch = lazy_module("builder.spec.launch")
launch_profiles = lazy_module("builder.spec.launch_profiles")
packs = lazy_module("builder.spec.jit.packs")
progress = lazy_module("builder.core.progress")
qualify = lazy_module("builder.site.qualify")
readiness = lazy_module("builder.site.readiness")
receipt_views = lazy_module("builder.site.receipt_views")
receipts = lazy_module("builder.site.receipts")
runtime_jit = lazy_module("builder.site.runtime_jit")
serving_bench = lazy_module("builder.site.serving_bench")
verify = lazy_module("builder.site.verify")
docker = lazy_module("docker")

STALL_MINUTES = 15.0  # a cold start's weight load prints progress well within this


@dataclass(frozen=True)
class Plan:
    """What a run asks of each server, checked before any starts."""

    concurrency: list[int]
    needles: list[int]
    prefill: list[int]
    gsm8k: Dataset | None  # None: --gsm8k none
    api_key: str | None


@dataclass(frozen=True)
class Checked:
    """One server qualified: its receipt, where it was written, the plot, the push."""

    receipt: dict
    path: Path
    plot: Path | None
    pushed: dict | None


@dataclass(frozen=True)
class Launched:
    """The server `--start` (or a sweep) started: its recipe, and the profiles it came from."""

    recipe: Recipe
    profiles: Profiles


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
    """What the container runs (entrypoint + command), secrets hidden (`redacted`)."""
    config = container.attrs["Config"]
    return redacted([*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])])


def redacted(command: list[str]) -> list[str]:
    """`command` with the value of every flag whose name says secret (`--api-key V`,
    `--api-key=V`, `--ssl-keyfile-password V`) hidden, as a receipt records it."""
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
    return (datetime.now(timezone.utc) - started).total_seconds()


def _time_to_ready(container, waited: float, engine: Engine) -> tuple[float | None, str]:
    """Seconds from the container's start to ready: seen by waiting for it, or read from
    the engine's own ready line; a server already up when qualify came, without that line
    in its log, has no known figure (not the age of the container)."""
    if container is None:
        return round(waited, 1), "qualify start"
    container.reload()
    try:
        started = docker_client.started_at(container)
    except ValueError:
        return None, "unknown: ready before qualify came"
    # This start's lines only (a restarted container keeps the earlier ones).
    logs = container.logs(timestamps=True, since=started.replace(tzinfo=None))
    lines = logs.decode(errors="replace").splitlines()
    for at in ready_line_indices(lines, engine.ready_lines):
        try:
            ready = docker_client.timestamp(lines[at].split(" ", 1)[0])
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
    """The profile and params of the server qualify started (a fallback's included), else
    --profile and --set, else what `launch` labelled the container with."""
    launched = getattr(args, "launched", None)
    if launched:
        return launched.recipe.profile, launched.recipe.params
    params = tuple(tuple(item.split("=", 1)) for item in args.set)
    if args.profile or container is None:
        profile = args.profile
    else:
        profile, params = launch.launched_with(container.labels or {}, params)
    # Recorded as they apply to its profile (PROFILE:KEY=VALUE as KEY=VALUE).
    return profile, launch_profiles.params_for(params, profile) if profile else params


def _profile_recipe(args, image: dict | None, profile: str | None, params: tuple) -> Recipe | None:
    """The recipe of the profile the server runs (its backends, deadline and engine): from
    the image's own recipe when it is a builder image, else from the checkout's target."""
    if not profile:
        return None
    if getattr(args, "launched", None):  # started here: the very recipe it runs
        return args.launched.recipe
    reference = args.image or (image or {}).get("id")
    if reference and (args.image or image.get("built_by_builder")):
        source = image_recipe.profiles_of(image_recipe.launch_recipe(reference), reference)
    else:
        source = load_target(resolve_data_dir(args.data_dir), args.target).file
    return launch.resolve(source, profile, "-", launch.Overrides(params=params))


def _engine_of(args, recipe: Recipe | None) -> Engine:
    """The profile's engine, else --engine (sglang by default); an --engine that
    contradicts the profile is refused."""
    if recipe is None:
        return engines.engine(args.engine or engines.DEFAULT)
    if args.engine and args.engine != recipe.engine:
        raise BuilderError(
            f"--engine {args.engine}: profile {recipe.profile} starts a {recipe.engine} server"
        )
    return engines.engine(recipe.engine)


def run_checks(args, url: str, plan: Plan, out: Path, earlier: list | None = None) -> Checked:
    """Every check against one server, in order; the receipt written to out/receipt.json
    (and out/receipt.png), pushed with --push-receipt."""
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
    recipe = _profile_recipe(args, image, profile, params)
    engine = _engine_of(args, recipe)
    in_image, client_note = _throughput_client(args, container, engine)

    receipt: dict = {
        "schema": receipt_views.RECEIPT_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "builder": identity.builder_identity(),
        "server": {
            "url": _public_url(url),
            "engine": engine.name,
            "container": args.container,
            "image": image,
            "profile": profile,
            "params": [list(pair) for pair in params],
            "command": _server_command(container) if container else None,
            # What Docker ran, for deploy-files to reproduce: the image's entrypoint (the
            # command's head) and the host folders mounted.
            "entrypoint": redacted(container.attrs["Config"].get("Entrypoint") or [])
            if container
            else None,
            "mounts": list(container.attrs["HostConfig"].get("Binds") or []) if container else None,
            "launch": args.launched.recipe.served_from()
            if getattr(args, "launched", None)
            else None,
        },
        "gpus": gpu_state.describe(),
        "verify": None,
        "startup": None,
        "correctness": None,
        "gates": [],
        "throughput": None,
        "not_checked": [],
        "result": {"ok": True, "failed_at": None, "message": "every check passed"},
    }
    if not profile:
        why = "no --profile" + (", and the container has no launch labels" if container else "")
        _not_checked(receipt, "backends", why)
    if not receipt["gpus"].get("available", True):
        _not_checked(receipt, "GPU state", receipt["gpus"].get("why") or "no GPU seen")
    run = _Run(receipt)
    with contextlib.suppress(_Failed):  # the receipt says where it stopped
        _checks(
            args, run, client, container, image, url, plan, (in_image, client_note),
            recipe, engine,
        )  # fmt: skip
    if earlier and receipt["startup"] is not None:
        receipt["startup"]["attempts"] = earlier
    receipt["gates"] = gates.complete(receipt["gates"], receipt["result"]["failed_at"])
    skipped = [g["name"] for g in receipt["gates"] if g["mandatory"] and g["status"] == "skipped"]
    if receipt["result"]["ok"] and skipped:
        receipt["result"]["message"] = f"every check that ran passed; skipped: {', '.join(skipped)}"
    receipt["result"] = gates.verdict(receipt["result"], receipt["not_checked"])
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
    return Checked(receipt, receipt_path, plot, pushed)


def _throughput_client(args, container, engine: Engine) -> tuple[bool, str]:
    """Whether the engine's own client in the container measures throughput, and why:
    from the server's image where it can run; builder's, which follows its definitions,
    where it cannot (no container to run it in, or no such client in its image)."""
    if args.no_throughput:
        return False, ""
    if args.client == "builder":
        return False, "--client builder"
    if container is None:  # --client image without one was refused with the input
        return False, f"no --container to run {engine.bench_prose} in"
    why = serving_bench.missing(container, engine)
    if why and args.client == "image":
        raise BuilderError(f"--client image: container {container.name}: {why}")
    if why:
        return False, f"container {container.name}: {why}"
    return True, f"from container {container.name}"


def _checks(
    args, run, client, container, image, url, plan: Plan, throughput_client,
    recipe: Recipe | None, engine: Engine,
) -> None:  # fmt: skip
    receipt = run.receipt
    api_key = plan.api_key
    # 1. The image's own promise, when it is known and a builder image.
    reference = args.image or (image or {}).get("id")
    if not reference:
        _not_checked(receipt, "verify", "the image is not known (no --image, no --container)")
    elif not (args.image or image.get("built_by_builder")):
        _not_checked(
            receipt, "verify", f"{reference} is not a builder image (no io.builder labels)"
        )
    else:
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
    expect = dict(recipe.expect) if recipe else {}
    deadline_s = args.deadline_s
    if deadline_s is None:
        deadline_s = (recipe.ready_deadline_minutes if recipe else DEADLINE_MINUTES) * 60
    verdict = readiness.wait_ready(
        url,
        deadline_s=deadline_s,
        expect=expect,
        container=args.container,
        docker_client=client,
        poll_s=2.0,
        stall_s=args.stall_s if args.stall_s is not None else STALL_MINUTES * 60,
        api_key=api_key,
        engine=engine,
    )
    startup: dict = {"state": verdict.state, "message": verdict.message}
    receipt["startup"] = startup
    hung_at = capture.hang_line(verdict.log_tail, engine) if verdict.state == "stalled" else None
    if hung_at:  # wait-ready's stall message would point at NCCL: this one is capture
        quiet = verdict.message.split(" at stage", 1)[0]
        message = f"{quiet} after capture began: {hung_at!r}{_fallback(args)}"
        startup.update(state="graph-capture hang", capture_line=hung_at, message=message)
        run.fail("startup", f"graph-capture hang: {message}")
    if verdict.state != "ready":
        run.fail("startup", f"{verdict.state}: {verdict.message}")
    startup["ready_seconds"], startup["ready_seconds_from"] = _time_to_ready(
        container, verdict.elapsed, engine
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
            others = runtime_jit.compiled_in_container(container, engine)
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
                else f"they are on the {engine.cache_volume} now: restart and qualify again"
            )
            run.fail("startup", f"{sum(map(len, counted.values()))} JIT compiles ({names}); {fix}")
    else:
        startup["compiled_at_start"] = None  # no container: nothing to look into
        _not_checked(receipt, "compiled at start-up", "no --container to look into")

    # 3. Correctness at temperature 0.
    server = qualify.Server(url, api_key, engine=engine)
    try:
        model, context = qualify.served_model(server)
    except qualify.QualifyError as exc:
        run.fail("correctness", str(exc))
    correctness: dict = {"model": model, "context_length": context}
    receipt["correctness"] = correctness
    listed = receipt["gates"]
    with progress.task(f"correctness: {len(qualify.PROBES)} probes"):
        try:
            correctness["probes"] = qualify.run_probes(server, model)
        except qualify.QualifyError as exc:
            correctness["probes"] = exc.partial
            listed.append(gates.entry("probes", "failed", _tally(exc.partial), str(exc)))
            run.fail("correctness", str(exc))
    listed.append(gates.entry("probes", "passed", _tally(correctness["probes"])))
    needles = plan.needles
    with progress.task(f"correctness: needles at {', '.join(map(str, needles))} tokens"):
        try:
            correctness["needles"] = qualify.run_needles(server, model, needles, context, args.seed)
        except qualify.QualifyError as exc:
            correctness["needles"] = exc.partial
            listed.append(gates.entry("needle", "failed", _tally(exc.partial), str(exc)))
            run.fail("correctness", str(exc))
    listed.append(gates.entry("needle", "passed", _tally(correctness["needles"])))
    command = receipt["server"]["command"]
    speculative = engine.speculative(command, server_info)
    listed += gates.run_all(
        server, model, seed=args.seed, arithmetic=args.arithmetic, data=plan.gsm8k,
        is_speculative=speculative,
    )  # fmt: skip
    fell = gates.not_passed(listed)
    if fell and fell["status"] == "failed":
        run.fail("correctness", f"gate {fell['name']}: {fell['why']}")

    # 4. Throughput, with the GPUs sampled through each level.
    if args.no_throughput:
        _not_checked(receipt, "throughput", "--no-throughput")
        return
    levels: list[dict] = []
    prefill: list[dict] = []
    in_image, client_note = throughput_client
    receipt["throughput"] = {
        "client": f"{engine.bench_name} in the server's image" if in_image else engine.own_client,
        "client_why": client_note,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seed": args.seed,
        "level_seconds": args.level_seconds,
        "levels": levels,
        "prefill": prefill,
    }
    for level in plan.concurrency:
        prompts = args.prompts or min(max(4 * level, 16), 4096)
        with progress.task(f"throughput: concurrency {level}, {prompts} prompts"):
            sampler = gpu_state.measure()
            if in_image:
                result = serving_bench.run_level(
                    container, engine, model=model,
                    base_url=_inside_url(url, engine.listen_port(command, server_info)),
                    tokenizer=args.tokenizer or engine.tokenizer(server_info, model),
                    api_key=api_key, concurrency=level, prompts=prompts,
                    input_len=args.input_len, output_len=args.output_len, seed=args.seed,
                    deadline_s=int(2 * args.level_seconds) + 120,
                )  # fmt: skip
            else:
                result = qualify.run_level(
                    server, model, level, prompts, args.input_len, args.output_len, args.seed,
                    args.level_seconds,
                )  # fmt: skip
            result["gpu"] = sampler.stop()
        levels.append(result)
        if not result["completed"]:
            run.fail(
                "throughput",
                f"concurrency {level}: no request completed ({result['first_error']})",
            )
    for length in plan.prefill:
        if context and length >= context:
            prefill.append({"input_len": length, "skipped": f"over the served context ({context})"})
            continue
        with progress.task(f"prefill: {length} tokens, {qualify.PREFILL_PROMPTS} requests alone"):
            result = qualify.run_prefill(server, model, length, args.seed, args.level_seconds)
        prefill.append(result)
        if not result["completed"]:
            run.fail(
                "throughput", f"prefill {length}: no request completed ({result['first_error']})"
            )


def _not_checked(receipt: dict, what: str, why: str) -> None:
    receipt["not_checked"].append({"what": what, "why": why})


def _tally(results: list[dict]) -> str:
    return f"{sum(1 for r in results if r['ok'])}/{len(results)}"


def _fallback(args) -> str:
    """What a graph-capture hang's message adds: the profile's declared fallback."""
    launched = getattr(args, "launched", None)
    if not launched:
        return ""
    params = launch_profiles.fallback_params(launched.profiles, launched.recipe.profile)
    if not params:
        return f"; profile {launched.recipe.profile} declares no fallback"
    given = " ".join(f"--set {key}={value}" for key, value in params)
    why = launch_profiles.fallback_why(launched.profiles, launched.recipe.profile)
    return f"; its fallback: {given}" + (f" ({why})" if why else "")


def _inside_url(url: str, port: int | None) -> str:
    """The server as a process in its own container reaches it: loopback, on the port the
    server itself listens on (a published port may differ), else the URL's."""
    parts = urlsplit(url)
    return f"{parts.scheme}://127.0.0.1:{port or parts.port}"
