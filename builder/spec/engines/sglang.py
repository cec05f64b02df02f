"""sglang (0.5.9 to 0.5.23) as builder's engine: what its server answers while it starts,
what it says it serves, its speculative figures and its benchmark client.

GET /health answers 503 while the model loads, /health_generate runs a real one-token
generation, and /server_info is the server's own account of what it runs (every setting,
with what sglang chose for the settings a profile leaves to it).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence

from builder.spec.engines.base import Probe, flag_value

NAME = "sglang"
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
    # The result line's keys (sglang/bench_serving.py 0.5.9, sglang/benchmark/serving.py 0.5.23).
    bench_result_keys = (
        "completed", "duration", "total_output_tokens", "request_throughput",
        "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p99_tpot_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms",
        "p99_e2e_latency_ms",
    )  # fmt: skip

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

    def bench_result(self, result: Mapping) -> dict:
        return {key: result.get(key) for key in self.bench_result_keys}

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


ENGINE = SglangEngine()
