"""A stand-in for sglang's HTTP endpoints (no GPU exists here), run inside a real container.

It plays a server that loads for STARTUP_SECONDS (port open, /health answers 503), then
serves /health, /health_generate and /server_info (SERVER_INFO, JSON). With
DIE_AFTER_SECONDS it exits with EXIT_CODE mid-start, like a server that crashed; with
SILENT_SECONDS it first hangs that long without a log line, like a stalled start. With
JIT_AT_START=ACT (in an image with flashinfer) it first loads FlashInfer's `ACT_and_mul`
module the way FlashInfer does at first use (`JitSpec.build_and_load`): from the kernel
wheel when it holds the module, else compiled with real ninja and nvcc, like a server
loading a kernel its image did not pre-compile. Loading needs the CUDA runtime, no GPU.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()
STARTUP = float(os.environ.get("STARTUP_SECONDS", "3"))
DIE_AFTER = os.environ.get("DIE_AFTER_SECONDS")
SERVER_INFO = json.loads(os.environ.get("SERVER_INFO", "{}"))
API_KEY = None  # `--api-key KEY` as sglang takes it: every path but /health* needs it


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
            self._send(503 if loading else 200, json.dumps(SERVER_INFO).encode())
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
    API_KEY = api_key_argument(sys.argv[1:])
    print(f"standin: server_args=ServerArgs(port={port_argument(sys.argv[1:])})", flush=True)
    if os.environ.get("JIT_AT_START"):
        build_jit_module(os.environ["JIT_AT_START"])
    # A start that hangs without a word before the port opens (NCCL init stuck on P2P).
    time.sleep(float(os.environ.get("SILENT_SECONDS", "0")))
    if DIE_AFTER:
        threading.Thread(
            target=die_later, args=(float(DIE_AFTER), int(os.environ.get("EXIT_CODE", "1")))
        ).start()
    print("standin: Load weight begin (loading checkpoint shards)", flush=True)
    server = ThreadingHTTPServer(("127.0.0.1", port_argument(sys.argv[1:])), Handler)
    server.serve_forever()
