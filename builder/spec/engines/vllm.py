"""vLLM (0.34) as builder's engine: what its server answers and logs, read in the 0.34.0
release (docs/research/vllm-0.34-b12x.md §5-6 has the file:line of each).

A vLLM server binds its port but does not listen until the engine has loaded, profiled
and captured its graphs: while it loads, a probe gets "connection refused" (wait-ready
tells loading from crashed by the container, as for sglang). Then /health answers 200,
/v1/models names the served model (`id`), the path or hub id it loaded (`root`) and the
context length, and a one-token completion proves generation. It has no /server_info
outside its dev mode (which also opens its debug routes), so what it serves is read from
/v1/models, /version, the `vllm:cache_config_info` metric and, with a container to read,
its start-up log: the "Initializing a V1 LLM engine" config line (tensor_parallel_size,
kv_cache_dtype, the kernel config's MoE and linear backends, the speculative config) and
the backend lines ("Using AttentionBackendEnum.X backend.", "Using B12X NvFp4 MoE
backend").

What it compiles at start-up outside FlashInfer goes to four folders, as 0.34.0 and b12x
1.5.1 resolve them (`$VLLM_CACHE_ROOT`, when unset, is `$XDG_CACHE_HOME/vllm`, else
`~/.cache/vllm`: envs.py:757-762, 361-365).
- b12x's CuTe DSL kernels (its MoE and NVFP4 GEMMs): `$B12X_COMPILE_CACHE_DIR`, else
  `$XDG_CACHE_HOME/b12x/compile`, else `~/.cache/b12x/compile` (b12x/_lib/compiler.py:683-690);
  one `<key[:2]>/<key>.o` per kernel (:2048-2049), beside its `.json` manifest and `.lock`.
- torch.compile: `$VLLM_CACHE_ROOT/torch_compile_cache`: `torch_aot_compile/<hash>/` with
  AOT compile (compilation/decorators.py:556-595; the default with torch >= 2.10,
  envs.py:400-409), else `<hash>/rank_<r>_<dp>/` (compilation/backends.py:1088-1102). vLLM
  points Inductor's cache into it (TORCHINDUCTOR_CACHE_DIR, `.../inductor_cache`:
  decorators.py:583-589, compiler_interface.py:31-33), where Inductor writes the code it
  generates, a `.py` per compiled graph and per Triton kernel (and a `.so` per C++ one);
  without $TRITON_CACHE_DIR the cubins of its Triton kernels land under it too
  (compiler_interface.py:34-41 without AOT compile; Inductor's own `triton/` with it).
- Triton (vLLM's own kernels, b12x's, and Inductor's with $TRITON_CACHE_DIR set):
  `$TRITON_CACHE_DIR`, else `~/.triton/cache` (Triton's default, as snapshot/runtime.py:93-95
  reads it); a kernel is `<hash>/<kernel>.cubin`, its launcher a `.so`.
- DeepGEMM (the DSA indexer's kernels, vLLM's bundled build): `$DG_JIT_CACHE_DIR`, else
  `$VLLM_CACHE_ROOT/deep_gemm` (utils/deep_gemm.py:339-344); its JIT (third_party/deep_gemm/
  _C_extension.abi3.so, deep_jit's disk cache) writes a folder per kernel with `kernel.cu`
  and the `kernel.cubin` compiled from it.
The sm120-vllm image puts all four under /root/.cache/vllm, the profiles' host volume
(VLLM_CACHE_ROOT, B12X_COMPILE_CACHE_DIR, TRITON_CACHE_DIR: images/sm120-vllm/Dockerfile).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from builder.spec.engines.base import Acceptance, JitCache, Probe, flag_value, home_path

NAME = "vllm"
_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v([^)]*)\) with config: (.*)$", re.M)
# Fields of VllmConfig.__str__ (config/vllm.py:2890-2923) that say what a profile asked for.
_CONFIG_FIELDS = {
    "tensor_parallel_size": re.compile(r"\btensor_parallel_size=(\d+)"),
    "kv_cache_dtype": re.compile(r"\bkv_cache_dtype=([\w.]+)"),
    "quantization": re.compile(r"\bquantization=([\w.]+)"),
    "revision": re.compile(r"\brevision=([^\s,]+)"),
    "enforce_eager": re.compile(r"\benforce_eager=(\w+)"),
    "moe_backend": re.compile(r"\bmoe_backend='?([\w-]+)'?"),
    "linear_backend": re.compile(r"\blinear_backend='?([\w-]+)'?"),
    "speculative_method": re.compile(r"SpeculativeConfig\(method='([\w-]+)'"),
    "num_speculative_tokens": re.compile(r"\bnum_spec_tokens=(\d+)"),
    "cudagraph_mode": re.compile(r"'cudagraph_mode': <?(?:CUDAGraphMode\.)?'?([A-Z_]+)"),
}
_ASKED_FLAGS = {
    "revision": "--revision",
    "tensor_parallel_size": "--tensor-parallel-size",
    "kv_cache_dtype": "--kv-cache-dtype",
    "attention_backend": "--attention-backend",
    "moe_backend": "--moe-backend",
    "linear_backend": "--linear-backend",
}
_ATTENTION = re.compile(
    r"Using (?:AttentionBackendEnum\.)?([A-Z0-9_]+) (?:attention )?backend(?:\.| out of)"
)
_MOE = re.compile(r"Using ([A-Z0-9_]+) NvFp4 MoE backend")
_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SPEC_COUNTER = re.compile(
    r"^vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)(?:_total)?(?:\{[^}]*\})? "
    r"([0-9.eE+-]+)$",
    re.M,
)


class VllmEngine:
    name = NAME
    probes = (
        Probe("/health", 10, "engine not up"),
        Probe("/v1/models", 10, "no model listed yet"),
        Probe(
            "/v1/completions", 120, "warming up",
            body='{"model": "{served}", "prompt": "1", "max_tokens": 1, "temperature": 0}',
        ),
    )  # fmt: skip
    identity_paths = ("/v1/models", "/version", "/metrics")
    api_key_file_env = "VLLM_API_KEY_FILE"
    # What only the start-up log says (no HTTP answer holds it outside vLLM's dev mode).
    log_keys = frozenset(
        {*_CONFIG_FIELDS, "log_version", "attention_backend", "moe_backend_selected"}
    )
    model_override_flag = "--hf-overrides"
    # `vllm bench serve` (benchmarks/serve.py), from the image: the client of the server it
    # measures. Its --save-result keys (serve.py:1317-1432).
    bench_module = "vllm.entrypoints.cli.main"
    bench_name = bench_prose = "vllm bench serve"
    own_client = "builder (vllm bench serve's metric definitions, /v1/completions streaming)"
    # build_and_serve's line, then uvicorn's once it serves (api_server/entry.py:139).
    ready_lines = ("Starting vLLM server on", "Application startup complete.")
    speculative_flag = "--speculative-config"
    acceptance_paths = ("/metrics",)
    spec_reply_request = MappingProxyType({})  # no per-reply figures: the counters say it
    bench_result_keys = (
        "completed", "duration", "total_output_tokens", "request_throughput",
        "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p99_tpot_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
    )  # fmt: skip
    # 0.34.0's model runner (v1/worker/gpu) captures under a tqdm bar on the global first
    # rank, "Capturing CUDA graphs (PIECEWISE)" then "(FULL)" (v1/worker/gpu/
    # cudagraph_utils.py:455-496); the speculator's captures name theirs "Capturing prefill
    # CUDA graphs (FULL)", "Capturing decode ...", "Capturing multi-module MTP ..."
    # (spec_decode/autoregressive/speculator.py:139,161, spec_decode/multi_module_mtp/
    # speculator.py:138, through the same bar). When every graph is captured, it logs
    # "Graph capturing finished in N secs, took X GiB" (v1/worker/gpu/model_runner.py:
    # 1141-1221), also after the capture that sizes the graphs' memory before the KV cache
    # exists (capture_model(profile_only=True), cudagraph_utils.py:1066-1067). A bar's line
    # ends only when the bar closes, and Docker logs a line once it ends (moby's
    # daemon/logger/copier.go): a hang inside a capture's first bar leaves no begin line in
    # the log (a plain stall), one in a later bar (FULL after PIECEWISE, the speculator's
    # after the model's) is read by the bar closed before it. Encoder graphs (a multimodal
    # model's; GLM-5 has none) log no begin line at INFO: a hang there is a plain stall.
    capture_begin = re.compile(r"Capturing [\w .-]*CUDA graphs \((?:PIECEWISE|FULL)\)")
    capture_end = re.compile(r"Graph capturing finished in ")
    # The module docstring says where each folder is and what its files are; a b12x or
    # Inductor kernel is named by its file (a hash), DeepGEMM's by its folder.
    jit_caches = (
        JitCache("b12x", "b12x", (".o",)),
        JitCache("torch.compile", "torch_compile", (".py", ".so", ".cubin")),
        JitCache("Triton", "triton", (".so", ".cubin")),
        JitCache("DeepGEMM", "deep_gemm", (".cubin",), name_part=-2),
    )
    cache_volume = "vLLM cache volume"
    state_root = "/var/lib/vllm"

    @property
    def stages(self) -> tuple[str, ...]:
        return ("port", *(probe.path for probe in self.probes), "identity")

    def served_name(self, answers: Mapping[str, bytes]) -> str:
        model = _first_model(answers.get("/v1/models", b""))
        return str(model.get("id", "")) if model else ""

    def served(self, answers: Mapping[str, bytes], log_text: str = "") -> dict | str:
        model = _first_model(answers.get("/v1/models", b""))
        if model is None:
            return "its /v1/models lists no model (not vLLM?)"
        served: dict = {
            "served_model_name": model.get("id"),
            "model": model.get("root"),
            "max_model_len": model.get("max_model_len"),
        }
        version = _json_object(answers.get("/version", b""))
        if version and "version" in version:
            served["version"] = version["version"]
        info = _CACHE_INFO.search(answers.get("/metrics", b"").decode(errors="replace"))
        if info:
            labels = dict(_LABEL.findall(info.group(1)))
            for key in ("cache_dtype", "block_size", "enable_prefix_caching"):
                if key in labels:
                    served[key] = labels[key]
        served.update(log_settings(log_text))
        return served

    def speculative(self, args: Sequence[str] | None, served: Mapping) -> bool:
        flags = [part.split("=", 1)[0] for part in args or ()]
        return bool(
            {"--speculative-config", "-sc", "--spec-method"} & set(flags)
            or served.get("speculative_method")
        )

    def asked(self, args: Sequence[str]) -> dict:
        """What a `vllm serve` command line asks for, in the names `served` reads back."""
        model = args[0] if args and not args[0].startswith("-") else flag_value(args, "--model")
        asked = {"model": model} if model else {}
        for key, flag in _ASKED_FLAGS.items():
            value = flag_value(args, flag)
            if value is not None:
                asked[key] = value
        spec = speculative_config(args)
        if spec:
            asked["speculative_method"] = str(spec.get("method"))
            asked["num_speculative_tokens"] = str(spec.get("num_speculative_tokens"))
        return asked

    def draft_from_checkpoint(self, args: Sequence[str]) -> bool:
        """`--speculative-config` with method mtp and no draft model: the checkpoint's own
        MTP layers (config/speculative.py:831,847-861)."""
        config = speculative_config(args)
        return bool(config) and config.get("method") == "mtp" and not config.get("model")

    def spec_reply(self, answer: Mapping) -> dict | None:
        return None

    def acceptance(
        self, replies: Sequence[dict], before: Mapping[str, str | None],
        after: Mapping[str, str | None],
    ) -> Acceptance:  # fmt: skip
        """From the spec-decode counters of /metrics: their growth over the gates (the
        figure), and their totals since the server started (recorded beside it)."""
        start, end = spec_counters(before.get("/metrics")), spec_counters(after.get("/metrics"))
        during = {name: end[name] - start.get(name, 0.0) for name in end}
        figures = {
            "during_gates": {**acceptance_of(during), **during},
            "since_start": acceptance_of(end),
        }
        found = figures["during_gates"]
        if "accept_length" not in found:
            why = (
                "no draft was counted during the gates (vllm:spec_decode_num_* on /metrics)"
                if end
                else "its /metrics has no spec-decode counters (vllm:spec_decode_num_*)"
            )
            return Acceptance(None, None, figures, why)
        return Acceptance(found["accept_length"], found.get("accept_rate"), figures)

    def stream_request(
        self, model: str, input_ids: Sequence[int], output_len: int
    ) -> tuple[str, dict]:
        """The OpenAI completions endpoint with a token-id prompt (vLLM takes a list of
        ints as `prompt`); the last chunk's usage counts the tokens."""
        return "/v1/completions", {
            "model": model,
            "prompt": list(input_ids),
            "max_tokens": output_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def stream_progress(self, chunk: Mapping) -> tuple[bool, int | None]:
        """As `vllm bench serve` reads it (benchmarks/lib/endpoint_request_func.py): a chunk
        with choices is output, the usage chunk's completion_tokens the count."""
        usage = chunk.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        return bool(chunk.get("choices")), int(tokens) if tokens is not None else None

    def listen_port(self, args: Sequence[str] | None, served: Mapping) -> int | None:
        """`--port` of its command line (no HTTP answer says it)."""
        port = flag_value(args or (), "--port")
        return int(port) if port and port.isdigit() else None

    def tokenizer(self, served: Mapping, model: str) -> str:
        """The model it loaded (/v1/models' `root`): vLLM's tokenizer defaults to it."""
        root = served.get("model")
        return root if isinstance(root, str) and root else model

    def bench_result(self, result: Mapping) -> dict:
        """Its result in the names builder's receipts use (sglang's): `e2el` is the
        end-to-end latency."""
        return {
            key.replace("_e2el_", "_e2e_latency_"): result.get(key)
            for key in self.bench_result_keys
        }

    def jit_cache_roots(self, env: Mapping[str, str]) -> dict[str, str]:
        xdg_cache = env.get("XDG_CACHE_HOME") or "~/.cache"
        vllm_cache = env.get("VLLM_CACHE_ROOT") or f"{xdg_cache}/vllm"
        folders = {
            "b12x": env.get("B12X_COMPILE_CACHE_DIR") or f"{xdg_cache}/b12x/compile",
            "torch_compile": f"{vllm_cache}/torch_compile_cache",
            "triton": env.get("TRITON_CACHE_DIR") or "~/.triton/cache",
            "deep_gemm": env.get("DG_JIT_CACHE_DIR") or f"{vllm_cache}/deep_gemm",
        }
        return {key: home_path(env, folder) for key, folder in folders.items()}

    def bench_command(
        self, *, base_url: str, model: str, tokenizer: str, concurrency: int, prompts: int,
        input_len: int, output_len: int, seed: int, deadline_s: int, output_file: str,
    ) -> list[str]:  # fmt: skip
        """`vllm bench serve` under coreutils' timeout: random prompts of exactly
        --random-input-len tokens (range ratio 0), greedy as sglang's client and builder's
        own are (0.34.0's sends no temperature unless told, serve.py:2247-2253, and the
        server then samples at the checkpoint's generation_config temperature, else 1.0:
        completion/protocol.py:333), the key from OPENAI_API_KEY."""
        directory, _, filename = output_file.rpartition("/")
        return [
            "timeout", "--signal=INT", "--kill-after=30", str(deadline_s),
            "python3", "-m", self.bench_module, "bench", "serve",
            "--backend", "vllm",
            "--base-url", base_url,
            "--model", model,
            "--tokenizer", tokenizer,
            # The server runs the checkpoint's code in this container already; without it
            # the client could not load a tokenizer that ships its own (sglang's trusts).
            "--trust-remote-code",
            "--dataset-name", "random",
            "--random-input-len", str(input_len),
            "--random-output-len", str(output_len),
            "--random-range-ratio", "0",
            "--ignore-eos",
            "--temperature", "0",
            "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency),
            "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99",
            "--save-result",
            "--result-dir", directory or ".",
            "--result-filename", filename,
            "--disable-tqdm",
        ]  # fmt: skip


def speculative_config(args: Sequence[str]) -> dict:
    """The JSON object of --speculative-config (or -sc), {} when absent or not an object."""
    raw = flag_value(args, "--speculative-config")
    raw = flag_value(args, "-sc") if raw is None else raw
    try:
        value = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def spec_counters(metrics_text: str | None) -> dict[str, float]:
    """vLLM's spec-decode counters (v1/spec_decode/metrics.py:229-231), summed over their
    label sets (one per engine): drafts, draft_tokens, accepted_tokens."""
    totals: dict[str, float] = {}
    for name, value in _SPEC_COUNTER.findall(metrics_text or ""):
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def acceptance_of(counters: Mapping[str, float]) -> dict:
    """Rate = accepted / draft tokens, mean length = 1 + accepted / drafts
    (v1/spec_decode/metrics.py:180-194); each only when its counters say it."""
    drafts, tokens = counters.get("drafts"), counters.get("draft_tokens")
    accepted = counters.get("accepted_tokens")
    figures = {}
    if accepted is not None and drafts:
        figures["accept_length"] = round(1 + accepted / drafts, 4)
    if accepted is not None and tokens:
        figures["accept_rate"] = round(accepted / tokens, 4)
    return figures


def log_settings(log_text: str) -> dict:
    """What the start-up log says the engine runs with: the last config line's fields and
    the backends it picked (each only when the log says it)."""
    found: dict = {}
    lines = _CONFIG_LINE.findall(log_text or "")
    if lines:
        version, config = lines[-1]
        found["log_version"] = version
        for key, pattern in _CONFIG_FIELDS.items():
            match = pattern.search(config)
            if match:
                found[key] = match.group(1)
    attention = _ATTENTION.findall(log_text or "")
    if attention:
        found["attention_backend"] = attention[-1]
    moe = _MOE.findall(log_text or "")
    if moe:
        found["moe_backend_selected"] = moe[-1].lower()
    return found


def _json_object(body: bytes) -> dict | None:
    try:
        value = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _first_model(body: bytes) -> dict | None:
    listed = _json_object(body)
    data = listed.get("data") if listed else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    return data[0]


ENGINE = VllmEngine()
