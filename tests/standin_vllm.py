"""A stand-in for a `vllm serve` server (no GPU exists here, so no real vLLM can run), run
inside a real container beside tests/standin_sglang.py, whose model it plays.

    python3 standin_vllm.py PORT [vllm serve ARGS...]

It plays vLLM 0.34.0's start as read in its source (docs/research/vllm-0.34-b12x.md §5):
it logs the "Initializing a V1 LLM engine" config line made from ARGS (model, revision,
tensor_parallel_size, kv_cache_dtype, the speculative and kernel configs), loads for
STARTUP_SECONDS with its port closed (vLLM binds but does not listen until the engine is
up), logs the attention and MoE backend lines, then listens: /health, /v1/models (`id` the
served name, `root` the model), /version, /metrics (`vllm:cache_config_info` and the
spec-decode counters), POST /v1/completions. The key from VLLM_API_KEY (or --api-key)
guards /v1 only, as vLLM's does. ATTENTION_LOGGED overrides the attention backend it says
it picked (a server that fell back to another one); DIE_AFTER_SECONDS exits with
EXIT_CODE mid-start, like a crash. Then it captures CUDA graphs as vLLM's log shows it
(v1/worker/gpu/cudagraph_utils.py:455-496, model_runner.py:1216-1220): a tqdm bar on
stderr per mode, PIECEWISE then FULL (updates after a carriage return, the line ended when
the bar closes), then "Graph capturing finished in ..."; with HANG_AT_CAPTURE=1 it stops
inside the FULL bar and says nothing more, never listening, as a start that hangs in
capture. Once it listens it logs vLLM's "Starting vLLM server on ..." and uvicorn's
"Application startup complete.", the lines qualify times ready by. With
WRITE_AT_START=PATH[;PATH...] it first writes those files, as b12x, Inductor, Triton or
DeepGEMM leave a compiled kernel in their cache (they compile only on a GPU: a stand-in).

For `builder qualify` it plays the sglang stand-in's model (standin_sglang.chat_answer:
the probes' answers, products, counting prompts, GSM8K-shaped questions, needles; with
WRONG_TEXT, NEEDLE_LIMIT and GSM8K_WRONG_FRACTION as there) through vLLM's OpenAI API:
/v1/chat/completions (the served name only, usage's prompt_tokens at 4 characters a
token), and /v1/completions streaming a token-id prompt one token each TOKEN_SECONDS
(`ignore_eos`, `max_tokens`), its last chunk the usage when `stream_options.include_usage`
asks, as vLLM streams. /v1/models says CONTEXT_LENGTH (default GLM-5's 202752). With a
--speculative-config (method mtp, k tokens) its spec-decode counters start from earlier
traffic (100 drafts, 300 draft tokens, 90 accepted) and grow with each reply as an MTP
server whose drafts are accepted at SPEC_ACCEPT_RATE (default 0.62) would count them:
over the gates, rate = SPEC_ACCEPT_RATE and mean length = 1 + k x SPEC_ACCEPT_RATE.
"""

import json
import math
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standin_sglang import TOKEN_SECONDS, chat_answer

PORT = int(sys.argv[1])
ARGS = sys.argv[2:]
STARTUP = float(os.environ.get("STARTUP_SECONDS", "2"))
DIE_AFTER = os.environ.get("DIE_AFTER_SECONDS")


def flag(name, default=None):
    value = default
    for at, word in enumerate(ARGS):
        if word == name and at + 1 < len(ARGS):
            value = ARGS[at + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


MODEL = ARGS[0] if ARGS and not ARGS[0].startswith("-") else flag("--model", "facebook/opt-125m")
SERVED = flag("--served-model-name", MODEL)
API_KEY = flag("--api-key") or os.environ.get("VLLM_API_KEY")
SPEC = json.loads(flag("--speculative-config", "null") or "null")
CONTEXT_LENGTH = int(os.environ.get("CONTEXT_LENGTH", "202752"))
SPEC_RATE = float(os.environ.get("SPEC_ACCEPT_RATE", "0.62"))
# vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}, from traffic before qualify.
COUNTERS = {"drafts": 100.0, "draft_tokens": 300.0, "accepted_tokens": 90.0}
COUNTING = threading.Lock()


def count_drafts(tokens: int) -> None:
    """What an MTP server counts for a reply of `tokens` tokens: one draft of k tokens per
    verify step, SPEC_RATE of them accepted (each step yields 1 + k x SPEC_RATE tokens)."""
    if not SPEC:
        return
    k = int(SPEC["num_speculative_tokens"])
    steps = math.ceil(tokens / (1 + k * SPEC_RATE))
    with COUNTING:
        COUNTERS["drafts"] += steps
        COUNTERS["draft_tokens"] += steps * k
        COUNTERS["accepted_tokens"] += steps * k * SPEC_RATE


def log(line):
    print(f"(APIServer pid=1) INFO 12-07 17:00:00 {line}", flush=True)


def config_line():
    spec = (
        f"SpeculativeConfig(method='{SPEC['method']}', model=None, "
        f"num_spec_tokens={SPEC['num_speculative_tokens']})"
        if SPEC
        else "None"
    )
    return (
        f"Initializing a V1 LLM engine (v0.34.0) with config: model={MODEL!r}, "
        f"speculative_config={spec}, tokenizer={MODEL!r}, skip_tokenizer_init=False, "
        f"tokenizer_mode=auto, revision={flag('--revision')}, tokenizer_revision=None, "
        f"trust_remote_code=True, dtype=torch.bfloat16, max_seq_len=202752, "
        f"download_dir=None, load_format=auto, "
        f"tensor_parallel_size={flag('--tensor-parallel-size', '1')}, "
        f"pipeline_parallel_size=1, data_parallel_size=1, quantization=modelopt_fp4, "
        f"enforce_eager=False, kv_cache_dtype={flag('--kv-cache-dtype', 'auto')}, "
        f"device_config=cuda, served_model_name={SERVED}, enable_prefix_caching=True, "
        f"compilation_config={{'mode': <CompilationMode.VLLM_COMPILE: 3>, "
        f"'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}}, "
        f"kernel_config=KernelConfig(enable_flashinfer_autotune=None, "
        f"moe_backend='{flag('--moe-backend', 'auto')}', "
        f"linear_backend='{flag('--linear-backend', 'auto')}')"
    )


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body, kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refused(self):
        if (
            API_KEY
            and self.path.startswith("/v1")
            and (self.headers.get("Authorization") != f"Bearer {API_KEY}")
        ):
            self.answer(401, {"error": "Unauthorized"})
            return True
        return False

    def do_GET(self):
        if self.refused():
            return
        if self.path == "/health":
            self.answer(200, b"")
        elif self.path == "/version":
            self.answer(200, {"version": "0.34.0"})
        elif self.path == "/v1/models":
            card = {"id": SERVED, "object": "model", "created": 1, "owned_by": "vllm",
                    "root": MODEL, "parent": None, "max_model_len": CONTEXT_LENGTH, "permission": []}  # fmt: skip
            self.answer(200, {"object": "list", "data": [card]})
        elif self.path == "/metrics":
            cache = flag("--kv-cache-dtype", "auto")
            text = (
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="64",cache_dtype="{cache}",'
                'enable_prefix_caching="True",engine="0"} 1.0\n'
            )
            if SPEC:
                with COUNTING:
                    for name, value in COUNTERS.items():
                        text += f'vllm:spec_decode_num_{name}_total{{engine="0"}} {value}\n'
            self.answer(200, text.encode(), "text/plain")
        else:
            self.answer(404, {"detail": "Not Found"})

    def do_POST(self):
        if self.refused():
            return
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.answer(404, {"detail": "Not Found"})
        elif request.get("model") != SERVED:
            self.answer(
                404, {"error": {"message": f"The model `{request.get('model')}` does not exist."}}
            )
        elif self.path == "/v1/chat/completions":
            prompt = request["messages"][-1]["content"]
            text = chat_answer(prompt)
            count_drafts(max(1, len(text) // 4))
            self.answer(200, {"object": "chat.completion", "model": SERVED,
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": text}}],
                              "usage": {"prompt_tokens": len(prompt) // 4}})  # fmt: skip
        elif request.get("stream"):
            self.stream(request)
        else:
            self.answer(200, {"object": "text_completion", "model": SERVED,
                              "choices": [{"index": 0, "text": "2", "finish_reason": "length"}]})  # fmt: skip

    def stream(self, request):
        """`max_tokens` chunks of one token each (`ignore_eos`), then the usage chunk."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        tokens = int(request["max_tokens"])
        for at in range(tokens):
            time.sleep(TOKEN_SECONDS)
            last = at == tokens - 1
            choice = {"index": 0, "text": "x", "finish_reason": "length" if last else None}
            self.event({"object": "text_completion", "model": SERVED, "choices": [choice]})
        count_drafts(tokens)
        if (request.get("stream_options") or {}).get("include_usage"):
            prompt = len(request["prompt"])
            usage = {"prompt_tokens": prompt, "completion_tokens": tokens,
                     "total_tokens": prompt + tokens}  # fmt: skip
            self.event(
                {"object": "text_completion", "model": SERVED, "choices": [], "usage": usage}
            )
        self.wfile.write(b"data: [DONE]\n\n")

    def event(self, chunk):
        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.flush()


def capture_graphs():
    """The model runner's capture: a bar per mode of 4 graphs, then the finish line."""
    for mode in ("PIECEWISE", "FULL"):
        for done in range(4):
            bar = "#" * (done * 10 // 4)
            sys.stderr.write(
                f"\rCapturing CUDA graphs ({mode}): {done * 25:3d}%|{bar:<10}| {done}/4"
            )
            sys.stderr.flush()
            if mode == "FULL" and done == 2 and os.environ.get("HANG_AT_CAPTURE") == "1":
                while True:  # silent, never serving: SIGTERM ends it
                    time.sleep(3600)
            time.sleep(0.05)
        sys.stderr.write(f"\rCapturing CUDA graphs ({mode}): 100%|##########| 4/4\n")
        sys.stderr.flush()
    log("Graph capturing finished in 1 secs, took 0.12 GiB")


def main():
    # As uvicorn does, SIGTERM ends it (as PID 1 a process without a handler ignores it).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for kernel_file in filter(None, os.environ.get("WRITE_AT_START", "").split(";")):
        os.makedirs(os.path.dirname(kernel_file), exist_ok=True)
        with open(kernel_file, "wb") as handle:
            handle.write(b"\x7fELF stand-in kernel")
    log(config_line())
    started = time.monotonic()
    while time.monotonic() - started < STARTUP:
        if DIE_AFTER and time.monotonic() - started >= float(DIE_AFTER):
            log("ERROR EngineCore failed to start: simulated fatal error")
            sys.exit(int(os.environ.get("EXIT_CODE", "1")))
        log("Loading safetensors checkpoint shards ...")
        time.sleep(0.5)
    attention = os.environ.get("ATTENTION_LOGGED", flag("--attention-backend", "TRITON_MLA"))
    log(f"Using AttentionBackendEnum.{attention} backend.")
    if flag("--moe-backend"):
        log(f"Using {flag('--moe-backend').upper()} NvFp4 MoE backend.")
    capture_graphs()
    log(f"Starting vLLM server on http://0.0.0.0:{PORT}")
    # A listen backlog as uvicorn's (2048), not http.server's 5: 32 requests at once connect.
    ThreadingHTTPServer.request_queue_size = 2048
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    print("(APIServer pid=1) INFO:     Application startup complete.", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
