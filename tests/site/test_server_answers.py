"""What a server hands back is not believed unchecked: `wait-ready` against loopback servers
that answer every stage but with what sglang would never say (no engine needed: these
servers are plain HTTP, the subject is builder's reading of their answers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import GOOD_INFO, Builder


@pytest.fixture
def serve() -> Iterator:
    started: list[ThreadingHTTPServer] = []

    def start(server_info: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server_info if self.path == "/server_info" else b""
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in started:
        server.shutdown()


def test_a_ready_server_checked_once_with_deadline_0_is_ready(builder: Builder, serve) -> None:
    """`--deadline 0` checks every stage once: a ready server is ready (it was `timeout …
    last: port open`, exit 4)."""
    url = serve(json.dumps(GOOD_INFO).encode())
    result = builder.run("wait-ready", url, "--deadline", "0", "--json", check=False)
    verdict = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    assert verdict["state"] == "ready"


def test_without_a_profile_the_backends_are_said_to_be_unchecked(builder: Builder, serve) -> None:
    url = serve(b"{}")
    result = builder.run("wait-ready", url, "--deadline", "0", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backends not checked (no profile)" in result.stdout
    assert "backends match" not in result.stdout


@pytest.mark.parametrize(
    "answer", [b"<html>proxy login</html>", b"[1, 2]", b'"text"', b"[" * 100_000]
)
def test_a_server_info_that_is_not_a_json_object_is_a_mismatch_not_a_crash(
    builder: Builder, serve, answer: bytes
) -> None:
    url = serve(answer)
    result = builder.run("wait-ready", url, "--deadline", "0", "--json", check=False)
    verdict = json.loads(result.stdout)
    assert result.returncode == 5, result.stderr
    assert "not a JSON object" in verdict["message"] and "internal error" not in result.stderr


def test_escape_sequences_a_server_reports_are_not_printed_raw(builder: Builder, serve) -> None:
    url = serve(json.dumps({**GOOD_INFO, "tp_size": "\x1b]0;owned\x07\x1b[2J\n8"}).encode())
    result = builder.run("wait-ready", url, "--deadline", "0", "--expect", "tp_size=8", check=False)
    assert result.returncode == 5
    assert "\x1b" not in result.stdout + result.stderr
    assert "\\x1b" in result.stdout + result.stderr
