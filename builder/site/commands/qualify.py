"""`builder qualify`: one command on the GPU VM proves a running server right and fast, and
leaves a receipt; `--compare` puts receipts side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.core.errors import EXIT_CODES, BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import (
    DEADLINE_MINUTES,
    EPILOG,
    UNITS,
    HelpFormatter,
    add_output_options,
    add_project_options,
    emit,
    print_json,
    print_table,
)
from builder.site.commands.launch_options import add_launch_options, read_api_key
from builder.site.commands.qualify_run import (
    STALL_MINUTES,
    Checked,
    Plan,
    run_checks,
)
from builder.site.commands.qualify_start import start_and_qualify
from builder.spec import engines

docker_client = lazy_module("builder.core.docker_client")
gsm8k = lazy_module("builder.site.gsm8k")
progress = lazy_module("builder.core.progress")
receipt_views = lazy_module("builder.site.receipt_views")
validate = lazy_module("builder.core.validate")

DEFAULT_CONCURRENCY = "1,32,256,1024"
DEFAULT_NEEDLES = "4096,16384,65536"
DEFAULT_PREFILL = "8192,65536"
DEFAULT_CHOOSE_AT = 32  # the anchors' most published level (cc32)


def _numbers(flag: str, text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise BuilderError(f"{flag} {text!r}: expected whole numbers above 0, e.g. 1,64,256")
    return values


def cmd_qualify(args: argparse.Namespace) -> None:
    if args.compare:
        _compare(args)
        return
    if args.gsm8k_save:
        _save_gsm8k(args)
        return
    if args.sweep and (args.url or args.container or args.start or args.profile):
        raise BuilderError(
            "qualify --sweep starts each profile itself: give no URL, --container, --start "
            "or --profile"
        )
    if args.start and (args.url or args.container):
        raise BuilderError("qualify --start starts the server itself: give no URL or --container")
    if args.engine and (args.start or args.sweep):
        raise BuilderError(
            "--engine: not with --start or --sweep (each profile's target names its engine)"
        )
    if not (args.url or args.start or args.sweep):
        raise BuilderError(
            "qualify: give the server URL (http://HOST:PORT), --start to launch one, "
            "--sweep P1,P2 to launch and compare profiles, or --compare A B"
        )
    url = validate.server_url("qualify URL", args.url) if args.url else ""
    concurrency = _numbers("--concurrency", args.concurrency)
    needles = _numbers("--needles", args.needles)
    prefill = _numbers("--prefill-lens", args.prefill_lens)
    args.deadline_s = validate.duration("--deadline", args.deadline, "m", minimum=0)
    args.stall_s = validate.duration("--stall-minutes", args.stall_minutes, "m", minimum=0)
    args.level_seconds = validate.duration("--level-seconds", args.level_seconds, "s", minimum=1)
    for flag, value in (
        ("--input-len", args.input_len), ("--output-len", args.output_len),
        ("--arithmetic", args.arithmetic), ("--gsm8k-limit", args.gsm8k_limit or 1),
        ("--prompts", args.prompts or 1),
    ):  # fmt: skip
        if value <= 0:
            raise BuilderError(f"{flag} {value}: must be a whole number above 0")
    if args.image:
        validate.image_reference("--image", args.image)
    if args.engine_image and not args.sweep:
        raise BuilderError(
            "--engine-image: only with --sweep (the image of ENGINE/PROFILE entries)"
        )
    for item in args.set:
        if "=" not in item or item.startswith("="):
            raise BuilderError(f"--set {item}: expected KEY=VALUE")
    if args.client == "image" and not (args.container or args.start or args.sweep):
        raise BuilderError(
            "--client image: needs --container NAME or --start "
            "(sglang's bench_serving runs inside the server's container)"
        )
    if args.sweep:
        _check_sweep_input(args, concurrency)
    out = validate.writable_dir("--out", args.out)
    api_key = read_api_key(args.api_key_file) if args.api_key_file else None
    if not (args.start or args.sweep):
        given = [flag for flag, attr in _START_ONLY if getattr(args, attr) != _DEFAULTS[attr]]
        if given:
            raise BuilderError(f"{given[0]}: only with --start (it launches the server)")
    if args.sweep:
        from builder.site.commands import qualify_sweep

        names, known = qualify_sweep.prepare(args)
    # The data before any server starts: no GPU hour is spent on a run that cannot finish.
    plan = Plan(concurrency, needles, prefill, gsm8k.load(args.gsm8k, args.gsm8k_limit), api_key)
    if args.sweep:
        qualify_sweep.run(args, plan, out, names, known)
        return
    if args.start:
        _report(args, start_and_qualify(args, plan, out))
    else:
        _report(args, run_checks(args, url, plan, out))


def _check_sweep_input(args, concurrency: list[int]) -> None:
    for flag, given in (
        ("--no-throughput", args.no_throughput), ("--push-receipt", args.push_receipt),
        ("--keep-server", args.keep_server),
    ):  # fmt: skip
        if given:
            raise BuilderError(
                f"{flag}: not with --sweep (it chooses by speed, one server after another, "
                "and the registry keeps one receipt per image)"
            )
    if args.choose_at not in concurrency:
        raise BuilderError(
            f"--choose-at {args.choose_at}: not one of the --concurrency levels "
            f"({','.join(map(str, concurrency))})"
        )


def _report(args, checked: Checked) -> None:
    """One run's lines (or JSON), and its exit code."""
    receipt, receipt_path, plot, pushed = (
        checked.receipt,
        checked.path,
        checked.plot,
        checked.pushed,
    )
    push_failed = bool(pushed and "error" in pushed)
    partial_allowed = receipt["result"].get("verdict") == "partial" and args.allow_partial
    passed = receipt["result"]["ok"] or partial_allowed
    ok = passed and not push_failed
    if args.json:
        where = {"receipt": str(receipt_path), "plot": plot and str(plot), "receipt_push": pushed}
        print_json({**receipt, **where}, ok=ok)
    else:
        print("\n".join(receipt_views.report_lines(receipt, receipt_path, plot)))
    if push_failed and passed:
        raise SystemExit(EXIT_CODES["error"])
    if not passed:
        raise SystemExit(EXIT_CODES["unqualified"])


def _save_gsm8k(args) -> None:
    """On a machine that reaches the hub: the GSM8K file an offline GPU VM qualifies with."""
    path = Path(args.gsm8k_save)
    if not path.parent.is_dir():
        raise BuilderError(f"--gsm8k-save {path}: no folder {path.parent}")
    if path.is_dir():
        raise BuilderError(f"--gsm8k-save {path}: a folder; name the file to write")
    questions, shots = gsm8k.save(path)
    emit(
        args,
        {"gsm8k": str(path), "questions": questions, "shots": shots, "source": gsm8k.HUB_SOURCE},
        [
            f"{path}: {questions} GSM8K questions and {shots} shots ({gsm8k.HUB_SOURCE})",
            f"on the GPU VM: builder qualify … --gsm8k {path.name} (the same questions and shots)",
        ],
    )


def _compare(args) -> None:
    named = receipt_views.expand(args.compare)
    out = validate.writable_dir("--out", args.out)
    try:
        header, rows = receipt_views.compare(named)
        plot = receipt_views.plot_compare(named, out / "compare.png")
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        raise BuilderError(
            f"--compare: a receipt is not as builder qualify writes it ({type(exc).__name__}: "
            f"{str(exc)[:80]!r}); compare receipts this builder wrote"
        ) from None
    if args.json:
        print_json({"columns": header, "rows": rows, "plot": plot and str(plot)})
        return
    print_table([header, *rows])
    if plot:
        print(f"plot: {plot}")


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
              per cache (0 expected): FlashInfer, then the engine's (sglang's DeepGEMM,
              JIT, Triton; vLLM's b12x, torch.compile, Triton, DeepGEMM); a start that
              stalls in CUDA-graph capture is a `graph-capture hang`
  correctness the gates, at temperature 0, thinking off: short probes with one right
              answer; a code hidden in filler at each --needles length (past the sparse
              top-k of 2048 tokens); --arithmetic two-digit products from --seed; the
              same prompts alone and 32 at once, byte-identical; GSM8K 5-shot strict
              match >= 0.94 (--gsm8k); MTP acceptance recorded for a speculative profile
  throughput  random prompts from --seed at each --concurrency, measured by the engine's
              own client inside the server's container (sglang's bench_serving, vllm
              bench serve; builder's client, same definitions, where it cannot run):
              output tok/s, req/s, TTFT and TPOT p50/p99; the GPUs' power, SM clock,
              utilisation and memory sampled with NVML meanwhile; then prefill at each
              --prefill-lens (TTFT of one request)
The receipt (receipt.json, and receipt.png when matplotlib is installed) goes to --out;
--push-receipt also stores it beside the image in its registry, for verify and launch.
--sweep P1,P2 resolves every profile (--set KEY=VALUE for all, --set P1:KEY=VALUE for one)
and checks the checkpoint each loads before it starts any, then starts, qualifies and stops
each profile in turn (a graph-capture hang is retried once with the profile's [fallback]
params), a receipt each in --out/PROFILE/, then chooses per concurrency level the fastest
profile that passed every gate: --out/chosen.json (for `deploy-files --profile chosen`).
The verdict is `qualified` only when verify (an image known: --image, or a --container of
a builder image), the profile's backends (--profile, or launch's labels on the container)
and throughput all ran and passed; with one of them left out it is `partial`, naming each
and why, and exits 8 unless --allow-partial (a sweep: such a profile stands only with
--allow-partial).
A vLLM server (a profile of an engine = "vllm" target, or --engine vllm) is asked the same
gates; its MTP figure comes from its /metrics spec-decode counters.
Exit codes: 0 qualified (or partial with --allow-partial; a sweep: a profile chosen),
1 bad input, 8 a check failed or partial (the receipt says which; a sweep: none
chosen), 9 no Docker daemon, or the hub did not answer for GSM8K.

examples:
  builder qualify http://127.0.0.1:30000 --container sglang-glm5 --profile glm5-nvfp4-tp8
  builder qualify --start --image $IMAGE --profile glm5-nvfp4-tp8-pcie-ar --model /data/GLM-5-NVFP4
  builder qualify --sweep glm5-nvfp4-tp8,glm5-nvfp4-tp8-pcie-ar --image $IMAGE \\
      --model /data/GLM-5-NVFP4
  builder qualify --sweep glm5-nvfp4-tp8-mtp,glm5-nvfp4-tp8-pcie-ar-mtp --image $IMAGE \\
      --model /data/GLM-5-NVFP4-MTP --set glm5-nvfp4-tp8-pcie-ar-mtp:speculative_num_steps=2
  builder qualify --compare qualify/   # a sweep's folder, or receipts: one table, compare.png
  builder qualify --gsm8k-save gsm8k.jsonl   # where the hub is reachable; then --gsm8k FILE""",
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
        "--sweep", metavar="P1,P2,...",
        help="start each profile in turn as --start does (the same launch options), run every "
        "check, stop it; then choose per level the fastest that passed every gate "
        "(--out/PROFILE/receipt.json, --out/chosen.json)",
    )  # fmt: skip
    command.add_argument(
        "--choose-at", type=int, default=DEFAULT_CHOOSE_AT, metavar="N",
        help="with --sweep: the concurrency level of the one overall choice "
        f"(default: {DEFAULT_CHOOSE_AT})",
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
        "--engine-image", action="append", default=[], metavar="ENGINE=REF",
        help="with --sweep: the image whose profiles the ENGINE/PROFILE entries run (a sweep "
        "across engines: --sweep glm5-nvfp4-tp8,vllm/glm5-nvfp4-tp8 --image $SGLANG_IMAGE "
        "--engine-image vllm=$VLLM_IMAGE)",
    )  # fmt: skip
    command.add_argument(
        "--profile", help="the launch profile it runs: its backends are checked at start-up"
    )
    command.add_argument(
        "--engine", choices=engines.NAMES,
        help="the server's engine, when no profile says it (default: sglang)",
    )  # fmt: skip
    command.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a profile param the server was (with --start, --sweep: is) launched with, as "
        "launch --set; with --sweep, PROFILE:KEY=VALUE sets it for that profile alone "
        "(over a plain KEY=VALUE)",
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
        "--level-seconds", default="300", metavar="SECONDS",
        help=f"no new request after this long in a level: seconds, or with a unit ({UNITS}) "
        "(default: 300)",
    )  # fmt: skip
    command.add_argument(
        "--needles", default=DEFAULT_NEEDLES, metavar="TOKENS,...",
        help=f"needle lengths, clamped to the served context (default: {DEFAULT_NEEDLES})",
    )  # fmt: skip
    command.add_argument(
        "--prefill-lens", default=DEFAULT_PREFILL, metavar="TOKENS,...",
        help="prefill levels: TTFT of one request at a time with this many input tokens and "
        f"1 output token (default: {DEFAULT_PREFILL}; longer than the context: skipped)",
    )  # fmt: skip
    command.add_argument(
        "--arithmetic", type=int, default=20, metavar="N",
        help="two-digit products the arithmetic gate asks, from --seed (default: 20)",
    )  # fmt: skip
    command.add_argument(
        "--gsm8k", default="hub", metavar="hub|FILE|none",
        help="GSM8K's questions: openai/gsm8k's test split from the Hugging Face hub (its "
        "rows API), a jsonl FILE of {question, answer ending '#### N'}, or none (the gate "
        "is then skipped, and a sweep chooses no profile) (default: hub)",
    )  # fmt: skip
    command.add_argument(
        "--gsm8k-limit", type=int, metavar="N", help="ask only the first N GSM8K questions"
    )
    command.add_argument(
        "--gsm8k-save", metavar="FILE",
        help="only write GSM8K's questions and shots from the hub to FILE and exit: run it "
        "where the hub is reachable, copy FILE to an offline GPU VM and qualify there with "
        "--gsm8k FILE (the same questions, the same shots)",
    )  # fmt: skip
    command.add_argument("--seed", type=int, default=1, help="prompts and needles (default: 1)")
    command.add_argument(
        "--deadline", metavar="MINUTES",
        help=f"how long to wait for ready: minutes, or with a unit ({UNITS}) "
        f"(default: the profile's, or {DEADLINE_MINUTES})",
    )  # fmt: skip
    command.add_argument(
        "--stall-minutes", default=str(STALL_MINUTES), metavar="MINUTES",
        help="no new log line for this long before ready is a stalled start (one after a "
        f"capture-begin line: a graph-capture hang): minutes, or with a unit ({UNITS}) "
        f"(default: {STALL_MINUTES:g})",
    )  # fmt: skip
    command.add_argument(
        "--accept-start-compiles", action="store_true",
        help="record JIT compiles at start-up without failing (a host's first start)",
    )  # fmt: skip
    command.add_argument(
        "--client", choices=("auto", "image", "builder"), default="auto",
        help="throughput client: the engine's own inside the server's container (image: "
        "sglang's bench_serving, vllm bench serve), builder's, which follows its definitions "
        "(builder), or image where the container has it (auto, the default); with image, a "
        "level still running after 2 x --level-seconds + 2 min is stopped and fails",
    )  # fmt: skip
    command.add_argument(
        "--tokenizer", metavar="PATH",
        help="the tokenizer the image's client loads in the container (default: the "
        "server's)",
    )  # fmt: skip
    command.add_argument(
        "--no-throughput", action="store_true",
        help="stop after correctness (the verdict is then partial)",
    )  # fmt: skip
    command.add_argument(
        "--allow-partial", action="store_true",
        help="exit 0 when every check that ran passed but verify, the backends or throughput "
        "did not run (verdict partial; the receipt names them); a sweep may then choose "
        "such a profile",
    )  # fmt: skip
    command.add_argument("--out", default="qualify", help="receipt folder (default: ./qualify)")
    command.add_argument(
        "--push-receipt", action="store_true",
        help="store the receipt in the image's registry, tagged by the image's digest "
        "(REPO:sha256-<hex>.receipt); verify and launch --image then show it",
    )  # fmt: skip
    command.add_argument(
        "--compare",
        nargs="+",
        metavar="RECEIPT|DIR",
        help="print receipts (or a sweep's folder) side by side, plot them to "
        "--out/compare.png, and stop",
    )
    add_launch_options(command, skip=("--profile", "--image", "--set", "--api-key-file"))
    _DEFAULTS.update({attr: command.get_default(attr) for _, attr in _START_ONLY})
    add_project_options(command)
    add_output_options(command)
    command.set_defaults(func=cmd_qualify)
