"""The image's HEALTHCHECK: GET /health on the port the server was started with.

Reads the server's own command line (PID 1: `python /opt/builder/entrypoint.py ... --port N`),
so a container started with `--port 8000` is checked on 8000, not on the image's default.
Exit 0 healthy, 1 not (Docker's convention).
"""

import sys
import urllib.request
from pathlib import Path


def server_port(default: int = 30000) -> int:
    args = Path("/proc/1/cmdline").read_bytes().decode(errors="replace").split("\0")
    for at, arg in enumerate(args):
        if arg == "--port" and at + 1 < len(args):
            return int(args[at + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return default


if __name__ == "__main__":
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server_port()}/health", timeout=8)
    except Exception as exc:  # any failure is "unhealthy"; say why in `docker inspect`
        print(f"unhealthy: {exc}")
        sys.exit(1)
