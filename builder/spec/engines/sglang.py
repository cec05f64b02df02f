"""sglang (0.5.9 to 0.5.23) as builder's engine: what its server answers while it starts,
what it says it serves, its speculative figures and its benchmark client.

GET /health answers 503 while the model loads, /health_generate runs a real one-token
generation, and /server_info is the server's own account of what it runs (every setting,
with what sglang chose for the settings a profile leaves to it).

Its JITs outside FlashInfer write under these folders, as sglang 0.5.23 resolves them
(`srt/environ.py:1373-1397,2308-2321`, `srt/layers/deep_gemm_wrapper/compile_utils.py:49-51`,
`kernels/jit/utils/compile/cache.py:318`): DeepGEMM `$DG_JIT_CACHE_DIR`, else
`$SGLANG_DG_CACHE_DIR`, else `$SGLANG_CACHE_DIR/deep_gemm`; sglang's JIT
`$SGLANG_JIT_CACHE_DIR`, else `~/.cache/sglang/jit`; Triton `$TRITON_CACHE_DIR`, else
`$SGLANG_CACHE_DIR/triton`; `$SGLANG_CACHE_DIR` defaults to `~/.cache/sglang`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from builder.spec.engines.base import Acceptance, JitCache, Probe, flag_value, home_path

NAME = "sglang"
_KERNEL_FILES = (".so", ".cubin")
_GAUGE = re.compile(r"^(sglang:spec_accept_(?:length|rate))(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


class SglangEngine:
    name = NAME
    probes = (
        Probe("/health", 10, "still loading"),
        Probe("/health_generate", 120, "warming up"),  # a real 1-token generation
    )
    identity_paths = ("/server_info",)
    api_key_file_env = "SGLANG_API_KEY_FILE"
    log_keys: frozenset[str] = frozenset()  # /server_info says it all
    model_override_flag = "--json-model-override-args"
    # `python3 -m sglang.bench_serving` is the module in sglang 0.5.9 and still starts
    # 0.5.23's (which moved to `sglang.benchmark.serving` and forwards).
    bench_module = "sglang.bench_serving"
    bench_name = bench_module
    bench_prose = "sglang's bench_serving"
    own_client = "builder (sglang bench_serving's metric definitions, /generate streaming)"
    # Its line once the HTTP server serves (srt/entrypoints/http_server.py).
    ready_lines = ("The server is fired up and ready to roll",)
    speculative_flag = "--speculative-algorithm"
    acceptance_paths = ("/server_info", "/metrics")
    spec_reply_request = MappingProxyType({"return_spec_tokens_details": True})
    # The result line's keys (sglang/bench_serving.py 0.5.9, sglang/benchmark/serving.py 0.5.23).
    bench_result_keys = (
        "completed", "duration", "total_output_tokens", "request_throughput",
        "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p99_tpot_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms",
        "p99_e2e_latency_ms",
    )  # fmt: skip
    # sglang 0.5.23 logs a line when each capture begins and another when it ends
    # (srt/model_executor/model_runner_components/cuda_graph_setup.py:684-688 for the
    # prefill graph, 758-762 for decode: "Capture target decode CUDA graph begin.
    # backend=full, ...", then "Capture ... CUDA graph end. elapsed=..."), and while decode
    # capture runs, a progress bar "Capturing batches (bs=... avail_mem=... GB)"
    # (srt/model_executor/runner/decode_cuda_graph_runner.py:1342-1344). The decode graph's
    # `full` backend hung there for GLM DSA on RTX PRO 6000 (sglang PR #29580).
    capture_begin = re.compile(r"Capture [\w ]+? \w+ graph begin\.|Capturing batches \(")
    capture_end = re.compile(r"Capture [\w ]+? \w+ graph end\.")
    # DeepGEMM's kernel folder (`cache/kernel.<name>.<hash>/kernel.cubin`), sglang's module
    # (`<target>/<module>/...`), Triton's kernel (`<hash>/<kernel>.cubin`).
    jit_caches = (
        JitCache("DeepGEMM", "deep_gemm", _KERNEL_FILES, name_part=-2),
        JitCache("sglang JIT", "sglang_jit", _KERNEL_FILES, name_part=1),
        JitCache("Triton", "triton", _KERNEL_FILES),
    )
    cache_volume = "sglang cache volume"
    state_root = "/var/lib/sglang"

    @property
    def stages(self) -> tuple[str, ...]:
        return ("port", *(probe.path for probe in self.probes), *self.identity_paths)

    def served_name(self, answers: Mapping[str, bytes]) -> str:
        return ""

    def served(self, answers: Mapping[str, bytes], log_text: str = "") -> dict | str:
        try:
            value = json.loads(answers.get("/server_info") or b"{}")
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict):
            return "its /server_info is not a JSON object (not sglang?)"
        return value

    def speculative(self, args: Sequence[str] | None, served: Mapping) -> bool:
        """A speculative profile: its args hold --speculative-algorithm (or the server says)."""
        flags = [part.split("=", 1)[0] for part in args or ()]
        return "--speculative-algorithm" in flags or bool(served.get("speculative_algorithm"))

    def draft_from_checkpoint(self, args: Sequence[str]) -> bool:
        """EAGLE/NEXTN without a draft model (NEXTN is EAGLE's alias:
        srt/speculative/spec_registry.py:183, srt/arg_groups/speculative_hook.py:109-116)."""
        algorithm = flag_value(args, "--speculative-algorithm")
        if algorithm is None or algorithm.upper() not in ("EAGLE", "NEXTN"):
            return False
        return flag_value(args, "--speculative-draft-model-path") is None and (
            flag_value(args, "--speculative-draft-model") is None
        )

    def acceptance_from_metrics(self, metrics_text: str | None) -> dict:
        """sglang's gauges `sglang:spec_accept_length` and `sglang:spec_accept_rate`
        (srt/observability/metrics_collector.py:511-522; /metrics with --enable-metrics),
        averaged over their label sets; {} when there is none."""
        found: dict[str, list[float]] = {}
        for name, value in _GAUGE.findall(metrics_text or ""):
            found.setdefault(name.removeprefix("sglang:spec_"), []).append(float(value))
        return {name: round(statistics.fmean(values), 4) for name, values in found.items()}

    def spec_reply(self, answer: Mapping) -> dict | None:
        """`sglext.spec_tokens_details` of a chat answer."""
        extension = answer.get("sglext")
        details = extension.get("spec_tokens_details") if isinstance(extension, dict) else None
        return details if isinstance(details, dict) else None

    def acceptance(
        self, replies: Sequence[dict], before: Mapping[str, str | None],
        after: Mapping[str, str | None],
    ) -> Acceptance:  # fmt: skip
        """The replies' figures pooled, else /server_info's average since start; the
        /metrics gauges recorded beside them (all read after the gates)."""
        try:
            info = json.loads(after.get("/server_info") or "{}")
        except (ValueError, RecursionError):
            info = {}
        figures = {
            "per_reply": acceptance(replies),
            "server_average_accept_length": server_accept_length(
                info if isinstance(info, dict) else {}
            ),
            "metrics": self.acceptance_from_metrics(after.get("/metrics")),
        }
        per_reply = figures["per_reply"]
        length = per_reply["accept_length"] or figures["server_average_accept_length"]
        if per_reply["accept_length"] is None and figures["server_average_accept_length"] is None:
            why = (
                "the server reported no acceptance (no spec_tokens_details, no "
                "avg_spec_accept_length)"
            )
            return Acceptance(None, per_reply["accept_rate"], figures, why)
        return Acceptance(length, per_reply["accept_rate"], figures)

    def stream_request(
        self, model: str, input_ids: Sequence[int], output_len: int
    ) -> tuple[str, dict]:
        """sglang's native /generate with input_ids (bench_serving's `sglang` backend)."""
        return "/generate", {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }

    def stream_progress(self, chunk: Mapping) -> tuple[bool, int | None]:
        """Each chunk says the completion tokens so far (`meta_info.completion_tokens`)."""
        count = int((chunk.get("meta_info") or {}).get("completion_tokens") or 0)
        return count > 0, count

    def listen_port(self, args: Sequence[str] | None, served: Mapping) -> int | None:
        port = served.get("port")
        return port if isinstance(port, int) else None

    def tokenizer(self, served: Mapping, model: str) -> str:
        for key in ("tokenizer_path", "model_path"):
            if isinstance(served.get(key), str) and served[key]:
                return served[key]
        return model

    def bench_result(self, result: Mapping) -> dict:
        return {key: result.get(key) for key in self.bench_result_keys}

    def jit_cache_roots(self, env: Mapping[str, str]) -> dict[str, str]:
        sglang_cache = env.get("SGLANG_CACHE_DIR") or "~/.cache/sglang"
        folders = {
            "deep_gemm": env.get("DG_JIT_CACHE_DIR")
            or env.get("SGLANG_DG_CACHE_DIR")
            or f"{sglang_cache}/deep_gemm",
            "sglang_jit": env.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit",
            "triton": env.get("TRITON_CACHE_DIR") or f"{sglang_cache}/triton",
        }
        return {key: home_path(env, folder) for key, folder in folders.items()}

    def bench_command(
        self, *, base_url: str, model: str, tokenizer: str, concurrency: int, prompts: int,
        input_len: int, output_len: int, seed: int, deadline_s: int, output_file: str,
    ) -> list[str]:  # fmt: skip
        """bench_serving under coreutils' timeout (it has no time bound of its own; SIGINT
        first, so it can exit cleanly): `random-ids` prompts of exactly --random-input-len
        token ids, no dataset download."""
        return [
            "timeout", "--signal=INT", "--kill-after=30", str(deadline_s),
            "python3", "-m", self.bench_module,
            "--backend", "sglang",
            "--base-url", base_url,
            "--model", model,
            "--tokenizer", tokenizer,
            "--dataset-name", "random-ids",
            "--tokenize-prompt",
            "--random-input-len", str(input_len),
            "--random-output-len", str(output_len),
            "--random-range-ratio", "1",
            "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency),
            "--seed", str(seed),
            "--output-file", output_file,
            "--disable-tqdm",
        ]  # fmt: skip


def _number(value: object) -> float | None:
    """A figure a server reported, or None for anything that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def acceptance(details: Sequence[dict]) -> dict:
    """Over the replies sglang described (tokenizer_manager.py:3138-3176): accepted length =
    completion tokens per verify step (the bonus token counted), acceptance rate = accepted
    drafts / proposed drafts, both pooled over the replies."""
    details = [
        {key: _number(value) for key, value in d.items() if key.startswith("spec_")}
        for d in details
        if isinstance(d, dict)
    ]
    steps = sum(d.get("spec_verify_ct") or 0 for d in details)
    tokens = sum(
        (d.get("spec_accept_length") or 0) * (d.get("spec_verify_ct") or 0) for d in details
    )
    proposed = sum(d.get("spec_num_proposed_drafts") or 0 for d in details)
    accepted = sum(d.get("spec_num_correct_drafts") or 0 for d in details)
    rates = [d["spec_accept_rate"] for d in details if d.get("spec_accept_rate") is not None]
    return {
        "replies": len(details),
        "accept_length": round(tokens / steps, 3) if steps else None,
        "accept_rate": round(accepted / proposed, 4)
        if proposed
        else (round(statistics.fmean(rates), 4) if rates else None),
    }


def server_accept_length(server_info: dict) -> float | None:
    """/server_info's `internal_states[*].avg_spec_accept_length`: accepted tokens per
    forward since the server started (scheduler_components/internal_state.py:119-125)."""
    states = server_info.get("internal_states") or []
    values = [
        s["avg_spec_accept_length"]
        for s in states
        if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), int | float)
    ]
    return round(statistics.fmean(values), 3) if values else None


ENGINE = SglangEngine()
