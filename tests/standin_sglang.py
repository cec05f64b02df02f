"""A stand-in for sglang's HTTP endpoints (no GPU exists here), run inside a real container.

It plays a server that loads for STARTUP_SECONDS (port open, /health answers 503), then
serves /health, /health_generate and /server_info (SERVER_INFO, JSON). With
DIE_AFTER_SECONDS it exits with EXIT_CODE mid-start, like a server that crashed; with
SILENT_SECONDS it first hangs that long without a log line, like a stalled start. With
JIT_AT_START=ACT (in an image with flashinfer) it first loads FlashInfer's `ACT_and_mul`
module the way FlashInfer does at first use (`JitSpec.build_and_load`): from the kernel
wheel when it holds the module, else compiled with real ninja and nvcc, like a server
loading a kernel its image did not pre-compile. Loading needs the CUDA runtime, no GPU.
With WRITE_AT_START=PATH[;PATH...] it writes those files first, as DeepGEMM, sglang's JIT or
Triton leave a compiled kernel in their cache (they compile only on a GPU: a stand-in).

It also plays a model for `builder qualify`: /v1/models, /v1/chat/completions (the right
answer to each of qualify's probes, and the code hidden in a needle prompt; with
WRONG_TEXT=1 garbled text, as an FP8 KV pool read the wrong way gives; with
NEEDLE_LIMIT=N a wrong code past N prompt tokens, as attention that loses the needle past
the sparse top-k) and /generate streaming one token each TOKEN_SECONDS. A token here is
4 characters of prompt. It answers qualify's gates: two-digit products, counting prompts
(the same text whatever else is in flight), and GSM8K-shaped questions the tests generate
("NAME has A marbles and finds B more. ..."), a fraction GSM8K_WRONG_FRACTION of them
wrongly (by a hash of the question, so the same ones each run). With SPEC_ACCEPT_LENGTH
and SPEC_ACCEPT_RATE it plays a speculative server: each chat that asks gets sglang's
`sglext.spec_tokens_details`, /server_info its `internal_states[0].avg_spec_accept_length`,
/metrics the `sglang:spec_accept_*` gauges. With HANG_AT_CAPTURE=1 it logs sglang's
decode-graph capture line and then nothing, never serving, as a start that hangs in CUDA
graph capture, unless it was started with `--cuda-graph-backend-decode breakable`.
"""

import json
import os
import re
import signal
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()
STARTUP = float(os.environ.get("STARTUP_SECONDS", "3"))
DIE_AFTER = os.environ.get("DIE_AFTER_SECONDS")
SERVER_INFO = json.loads(os.environ.get("SERVER_INFO", "{}"))
API_KEY = None  # `--api-key KEY` as sglang takes it: every path but /health* needs it
WRONG_TEXT = os.environ.get("WRONG_TEXT") == "1"
NEEDLE_LIMIT = int(os.environ.get("NEEDLE_LIMIT", "0"))
TOKEN_SECONDS = float(os.environ.get("TOKEN_SECONDS", "0.002"))
CONTEXT_LENGTH = int(os.environ.get("CONTEXT_LENGTH", "32768"))
GSM8K_WRONG = float(os.environ.get("GSM8K_WRONG_FRACTION", "0"))
SPEC_LENGTH = os.environ.get("SPEC_ACCEPT_LENGTH")
SPEC_RATE = os.environ.get("SPEC_ACCEPT_RATE", "0")
ANSWERS = {  # what a working model says to builder qualify's probes
    "17 + 25": "42",
    "12 times 12": "144.",
    "1000 minus 1": "999",
    "capital of France": "Paris.",
    "Red Planet": "Mars",
    "formula of water": "H2O",
}


def write_gsm8k_questions(path, count: int):
    """A jsonl file of questions in GSM8K's format and of the shape `chat_answer` solves
    (no data shipped, none fetched): for the tests' and the GPU bench's GSM8K gate."""
    names = ["Ann", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ida", "Jo", "Kim", "Lu"]
    with open(path, "w") as out:
        for n in range(count):
            a, b = 3 + 7 * n, 11 + 5 * n
            name = names[n % len(names)]
            question = (
                f"{name} has {a} marbles and finds {b} more. How many marbles does {name} have now?"
            )
            answer = f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} marbles.\n#### {a + b}"
            out.write(json.dumps({"question": question, "answer": answer}) + "\n")
    return path


def chat_answer(prompt: str) -> str:
    if WRONG_TEXT:
        return "ÃÂ§ the the the ¿¿"
    code = re.search(r"access code is (\S+)\.", prompt)
    if code:
        lost = NEEDLE_LIMIT and len(prompt) // 4 > NEEDLE_LIMIT
        return "ZZZZ-0000" if lost else code.group(1)
    gsm8k = re.findall(r"Question: (\w+) has (\d+) marbles and finds (\d+) more", prompt)
    if gsm8k:
        name, a, b = gsm8k[-1]  # the last question: the shots before it are answered
        total = int(a) + int(b)
        if zlib.crc32(f"{name}{a}{b}".encode()) % 1000 < GSM8K_WRONG * 1000:
            total += 1
        return f"{name} has {a} + {b} = {total} marbles.\n#### {total}"
    product = re.fullmatch(r"What is (\d+) \* (\d+)\? Reply with the number only\.", prompt)
    if product:
        return str(int(product.group(1)) * int(product.group(2)))
    count = re.match(r"Count from (\d+) to (\d+)", prompt)
    if count:
        return ", ".join(str(n) for n in range(int(count.group(1)), int(count.group(2)) + 1))
    return next((a for q, a in ANSWERS.items() if q in prompt), "I do not know")


def spec_details(completion_tokens: int) -> dict:
    """sglang's per-reply figures (tokenizer_manager.py:3138-3176) for a 4-token draft."""
    length, rate = float(SPEC_LENGTH), float(SPEC_RATE)
    steps = max(1, round(completion_tokens / length))
    return {
        "spec_accept_rate": rate,
        "spec_accept_length": length,
        "spec_verify_ct": steps,
        "spec_num_proposed_drafts": steps * 3,
        "spec_num_correct_drafts": round(steps * 3 * rate),
    }


def api_key_argument(args: list[str]) -> str | None:
    return args[args.index("--api-key") + 1] if "--api-key" in args else None


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        loading = time.monotonic() - STARTED < STARTUP
        if self.path in ("/health", "/health_generate"):
            self._send(503 if loading else 200, b"")
        elif API_KEY and self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._send(401, b"")
        elif self.path in ("/server_info", "/get_server_info"):
            info = dict(SERVER_INFO)
            if SPEC_LENGTH:
                info["internal_states"] = [{"avg_spec_accept_length": float(SPEC_LENGTH)}]
            self._send(503 if loading else 200, json.dumps(info).encode())
        elif self.path == "/metrics" and SPEC_LENGTH:
            labels = '{model_name="standin"}'
            text = (
                f"sglang:spec_accept_length{labels} {SPEC_LENGTH}\n"
                f"sglang:spec_accept_rate{labels} {SPEC_RATE}\n"
            )
            self._send(200, text.encode())
        elif self.path == "/v1/models":
            model = {"id": "standin", "max_model_len": CONTEXT_LENGTH}
            self._send(200, json.dumps({"data": [model]}).encode())
        else:
            self._send(404, b"")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if API_KEY and self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._send(401, b"")
        elif self.path == "/v1/chat/completions":
            prompt = body["messages"][-1]["content"]
            text = chat_answer(prompt)
            answer = {
                "choices": [{"message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(prompt) // 4},
            }
            if SPEC_LENGTH and body.get("return_spec_tokens_details"):
                details = spec_details(max(1, len(text) // 4))
                answer["sglext"] = {"spec_tokens_details": details}
            self._send(200, json.dumps(answer).encode())
        elif self.path == "/generate" and body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for count in range(1, body["sampling_params"]["max_new_tokens"] + 1):
                time.sleep(TOKEN_SECONDS)
                chunk = {"text": "x" * count, "meta_info": {"completion_tokens": count}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        print(f"standin: {format % args}", flush=True)


def die_later(seconds: float, code: int) -> None:
    time.sleep(seconds)
    print(f"standin: Load weight begin... simulated fatal error, exiting {code}", flush=True)
    os._exit(code)


def build_jit_module(activation: str) -> None:
    from flashinfer.jit.activation import gen_act_and_mul_module

    spec = gen_act_and_mul_module(activation)
    print(f"standin: loading {spec.name} (AOT: {spec.is_aot})", flush=True)
    spec.build_and_load()


def port_argument(args: list[str]) -> int:
    """`PORT`, or sglang's own `--port PORT` (the image's healthcheck reads that)."""
    return int(args[args.index("--port") + 1] if "--port" in args else args[0])


if __name__ == "__main__":
    # As sglang's server (uvicorn) does, SIGTERM ends it: `docker stop` needs no SIGKILL after
    # its grace period (as PID 1 a process without a handler ignores SIGTERM).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    API_KEY = api_key_argument(sys.argv[1:])
    print(f"standin: server_args=ServerArgs(port={port_argument(sys.argv[1:])})", flush=True)
    if os.environ.get("JIT_AT_START"):
        build_jit_module(os.environ["JIT_AT_START"])
    for kernel_file in filter(None, os.environ.get("WRITE_AT_START", "").split(";")):
        os.makedirs(os.path.dirname(kernel_file), exist_ok=True)
        with open(kernel_file, "wb") as handle:
            handle.write(b"\x7fELF stand-in kernel")
    # A start that hangs without a word before the port opens (NCCL init stuck on P2P).
    time.sleep(float(os.environ.get("SILENT_SECONDS", "0")))
    if DIE_AFTER:
        threading.Thread(
            target=die_later, args=(float(DIE_AFTER), int(os.environ.get("EXIT_CODE", "1")))
        ).start()
    print("standin: Load weight begin (loading checkpoint shards)", flush=True)
    argv = sys.argv[1:]
    backend = argv[argv.index("--cuda-graph-backend-decode") + 1] if (
        "--cuda-graph-backend-decode" in argv) else "full"  # fmt: skip
    # sglang 0.5.23's lines (model_runner_components/cuda_graph_setup.py:758-762).
    print(
        f"standin: Capture target decode CUDA graph begin. backend={backend}, "
        "num_tokens_per_req=1, avail mem=10.00 GB",
        flush=True,
    )
    if os.environ.get("HANG_AT_CAPTURE") == "1" and backend != "breakable":
        while True:  # silent, never serving: SIGTERM ends it
            time.sleep(3600)
    print("standin: Capture target decode CUDA graph end. elapsed=0.01 s", flush=True)
    # sglang's own line once it serves: qualify reads the time to ready from it.
    ready_line = "standin: The server is fired up and ready to roll!"
    threading.Timer(
        max(0.0, STARTUP - (time.monotonic() - STARTED)), print, (ready_line,), {"flush": True}
    ).start()
    # A listen backlog as uvicorn's (2048), not http.server's 5: 32 requests at once connect.
    ThreadingHTTPServer.request_queue_size = 2048
    server = ThreadingHTTPServer(("127.0.0.1", port_argument(sys.argv[1:])), Handler)
    server.serve_forever()
