"""Hostile servers and credentials (issue #54, "Trust III"): a git mirror that redirects its
login away, a server that drips its answer to hold builder forever, a plain-http host that
asks for the stored login, and a reason phrase that writes escape sequences to the terminal.

Real servers on loopback: http.server for git's smart-HTTP requests (a mirror on 127.0.0.1
and the host it redirects to on 127.0.0.2, another address of this machine, so another
origin), and raw sockets where a server must misbehave below HTTP (dripping, a broken status
line), plain or over TLS with a self-signed certificate made here.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import re
import socketserver
import ssl
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from builder.build import publish, remote_wheel
from builder.build.wheels import BuiltWheel
from builder.core import http_client
from builder.core.errors import BuilderError, Unreachable
from builder.site import qualify
from tests.core.test_index_credentials import TOKEN, USER, _builder, self_signed_certificate

OTHER_HOST = "127.0.0.2"  # loopback too, but another origin than 127.0.0.1


# --- 1. a git mirror's login stays with the mirror's origin ---------------------------


class _GitHost(http.server.BaseHTTPRequestHandler):
    """A git smart-HTTP host asking for a login (401, Basic) on every request, recording the
    Authorization each one carried; or, with `redirect_to`, a mirror sending every request
    there (the same path)."""

    redirect_to: ClassVar[str] = ""
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        host = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        self.seen.append((host, self.headers.get("Authorization")))
        if self.redirect_to and not self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", f"{self.redirect_to}{self.path}")
        else:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _serving(handler, host: str = "127.0.0.1") -> Iterator[str]:
    """HOST:PORT of an http.server with `handler`, for the block's life."""
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def git_hosts() -> Iterator[tuple[type[_GitHost], str, str, str]]:
    """(the mirror's handler, the mirror, a host on the mirror's address and another port,
    a host on another address): the mirror redirects where its `redirect_to` says; the
    others ask for a login."""

    class Mirror(_GitHost):
        pass

    Mirror.seen = _GitHost.seen = []
    with (
        _serving(Mirror) as mirror,
        _serving(_GitHost) as same_address,
        _serving(_GitHost, OTHER_HOST) as other,
    ):
        yield Mirror, mirror, same_address, other


def _fetch_through(tmp_path: Path, mirror: str) -> tuple[list[str], Path]:
    """The error lines of `builder sources` for flashinfer through `mirror` with a login,
    and the pin they name."""
    builder = _builder(tmp_path, f"https://github.com/=http://{USER}:{TOKEN}@{mirror}/")
    result = builder.run("sources", "--upstream", "flashinfer", check=False)
    assert result.returncode == 1, result.stderr
    assert TOKEN not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return errors, builder.data_dir / "forks/flashinfer/pin.toml"


@pytest.mark.parametrize("to", ["another address", "another port"])
def test_a_mirror_that_redirects_to_another_origin_gets_no_login_sent_there(
    tmp_path: Path, git_hosts, to: str
) -> None:
    """Reproduced in #54: the login written in the mirror's URL went with libgit2 to the
    host the mirror redirected to (the credentials callback answered whoever asked)."""
    mirror_handler, mirror, same_address, other = git_hosts
    target = other if to == "another address" else same_address
    mirror_handler.redirect_to = f"http://{target}"
    errors, pin = _fetch_through(tmp_path, mirror)
    assert errors == [
        f"error: {pin}: http://{mirror}/flashinfer-ai/flashinfer.git redirected to another "
        f"origin, http://{target}/flashinfer-ai/flashinfer.git, which asks for credentials: "
        "withheld (the mirror's go to its own scheme, host and port only); give the URL it "
        "redirects to as the mirror if you trust that host"
    ]
    at_target = [auth for host, auth in _GitHost.seen if host == target]
    assert at_target and set(at_target) == {None}  # asked there, and never sent the login


def test_a_mirror_that_redirects_within_its_own_origin_keeps_its_login(
    tmp_path: Path, git_hosts
) -> None:
    """The control: a redirect to another path of the mirror's own origin is answered with
    the mirror's login (refused here, as the host refuses every one)."""
    mirror_handler, mirror, _, _ = git_hosts
    mirror_handler.redirect_to = f"http://{mirror}/moved"
    errors, pin = _fetch_through(tmp_path, mirror)
    assert len(errors) == 1 and errors[0].startswith(
        f"error: {pin}: http://{mirror}/moved/flashinfer-ai/flashinfer.git refused the "
        "credentials given"
    ), errors
    assert (mirror, http_client.basic(USER, TOKEN)) in _GitHost.seen


def test_a_plain_http_git_mirror_is_never_sent_the_stored_login(tmp_path: Path, git_hosts) -> None:
    """A mirror over plain http that asks for a login, ~/.netrc holding one for its host:
    withheld, with one line that says so (anyone on the path would read it)."""
    _, mirror, _, _ = git_hosts
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {USER} password {TOKEN}\n")
    builder = _builder(tmp_path / "b", f"https://github.com/=http://{mirror}/")
    result = builder.run(
        "sources", "--upstream", "flashinfer", env={"NETRC": str(netrc)}, check=False
    )
    assert result.returncode == 1, result.stderr
    pin = builder.data_dir / "forks/flashinfer/pin.toml"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {pin}: http://{mirror}/flashinfer-ai/flashinfer.git asks for "
        "credentials over plain http: the login ~/.netrc or the keyring holds for its host "
        "is withheld (sent over https only); use https, or write USER:TOKEN@ into the URL to "
        "send one over plain http anyway"
    ]
    assert {auth for _, auth in _GitHost.seen} == {None}


# --- 2. http_client: a deadline for the whole request, no stored login over plain http,
# --- and a server's words shown inert ----------------------------------------------------


class _Raw(socketserver.BaseRequestHandler):
    """Reads a request's head, then sends `answer` (bytes), then `drip` over and over, one
    byte every 0.1 s, until the client goes away (or 60 s pass)."""

    answer: ClassVar[bytes] = b""
    drip: ClassVar[bytes] = b""

    def handle(self) -> None:
        received = b""
        while not self._whole(received):
            chunk = self.request.recv(65536)
            if not chunk:
                return
            received += chunk
        try:
            self.request.sendall(self.answer)
            for number in range(600 if self.drip else 0):
                at = number % len(self.drip)
                self.request.sendall(self.drip[at : at + 1])
                time.sleep(0.1)
        except OSError:  # the client hung up: what a deadline does
            pass

    @staticmethod
    def _whole(received: bytes) -> bool:
        """Whether `received` holds a request's head and the body its Content-Length says."""
        head, found, body = received.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        return bool(found) and len(body) >= (int(length.group(1)) if length else 0)


@pytest.fixture(params=["http", "https"])
def raw_server(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A factory: (answer, drip) -> the URL of a raw server sending them, plain or TLS."""
    started: list[socketserver.ThreadingTCPServer] = []

    def start(answer: bytes, drip: bytes = b"") -> str:
        handler = type("Answer", (_Raw,), {"answer": answer, "drip": drip})
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        if request.param == "https":
            cert, key = self_signed_certificate(tmp_path)
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # twine's (publish)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"{request.param}://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
DRIPS = {
    "the status line": (b"HTTP/1.1 2", b"0"),
    "the head": (b"HTTP/1.1 200 OK\r\nX-Slow: ", b"a"),  # a header line that never ends
    "the body": (HEAD, b"a"),
    # Its end is where the connection closes: cut at the deadline, it would look whole.
    "a body of no stated length": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"a"),
    "a chunked body": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\na\r\n"),
}


def _deadline_line(url: str) -> str:
    return (
        f"index: {url}/simple/x/ did not answer in full within 2 s (the deadline for the "
        "whole request, its body included)"
    )


@pytest.mark.parametrize("where", DRIPS)
def test_a_server_that_drips_its_answer_meets_the_deadline(raw_server, where: str) -> None:
    """One byte every 0.1 s, well inside the 1 s for one read: was held for as long as the
    server liked. The URL's login is not in the line."""
    url = raw_server(*DRIPS[where])
    bare = url.replace("://", f"://{USER}:{TOKEN}@")
    started = time.monotonic()
    with pytest.raises(Unreachable) as raised:
        http_client.get(f"{bare}/simple/x/", "index", timeout=1, deadline=2)
    assert str(raised.value) == _deadline_line(url)
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("where", ["the body", "a body of no stated length", "a chunked body"])
def test_a_body_read_by_the_caller_meets_the_deadline_too(raw_server, where: str) -> None:
    """open_url hands the open answer over (release downloads read it in blocks): the
    deadline covers those reads, and the one line is the deadline's, not a short body's."""
    url = raw_server(*DRIPS[where])
    started = time.monotonic()
    with (
        pytest.raises(Unreachable) as raised,
        http_client.open_url(f"{url}/simple/x/", "index", timeout=1, deadline=2) as answer,
    ):
        for _ in iter(lambda: answer.read(1 << 20), b""):
            pass
    assert str(raised.value) == _deadline_line(url)
    assert time.monotonic() - started < 4


def test_a_plain_http_401_is_never_sent_the_stored_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """netrc holds the host's login; the host, over plain http, asks for it: nothing is
    sent, one line says why. (Over https it is sent: test_index_credentials.py.)"""

    class Asks(_GitHost):
        pass

    Asks.seen = []
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {USER} password {TOKEN}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with _serving(Asks) as host:
        with pytest.raises(BuilderError) as raised:
            http_client.get(f"http://{host}/simple/x/", "index")
        with (
            pytest.raises(BuilderError) as opened,
            http_client.open_url(f"http://{host}/a.whl", "download"),
        ):
            pass
    assert str(raised.value) == (
        f"index: http://{host}/simple/x/ asks for credentials over plain http: the login "
        "~/.netrc or the keyring holds for its host is withheld (sent over https only); use "
        "https, or write USER:TOKEN@ into the URL to send one over plain http anyway"
    )
    assert "download: " in str(opened.value) and "withheld" in str(opened.value)
    assert [auth for _, auth in Asks.seen] == [None, None]


ESCAPES = "\x1b[2J\x1b]0;owned\x07"  # clear the screen, retitle the terminal


def test_a_reason_phrase_reaches_the_error_line_inert(raw_server) -> None:
    answer = f"HTTP/1.1 404 Not {ESCAPES}Found\r\nContent-Length: 0\r\n\r\n"
    url = raw_server(answer.encode("latin-1"))
    with (
        pytest.raises(BuilderError) as raised,
        remote_wheel.open_wheel(f"{url}/a.whl", "wheel"),
    ):
        pass
    assert str(raised.value) == (
        f"wheel: {url}/a.whl answered 404 Not \\x1b[2J\\x1b]0;owned\\x07Found"
    )


def test_a_broken_status_line_reaches_the_error_line_inert(raw_server) -> None:
    url = raw_server(f"{ESCAPES}HELLO\r\n\r\n".encode("latin-1"))
    with pytest.raises(Unreachable) as raised:
        http_client.get(f"{url}/x", "server")
    assert str(raised.value) == (  # http.client's BadStatusLine quotes the line whole
        f"server: cannot read {url}/x (\\x1b[2J\\x1b]0;owned\\x07HELLO\\x0d\\x0a)"
    )


def test_a_broken_status_line_from_a_server_under_test_is_inert(raw_server) -> None:
    """qualify's client (no redirects, the server's own API key) says the same inertly."""
    url = raw_server(f"{ESCAPES}HELLO\r\n\r\n".encode("latin-1"))
    with pytest.raises(qualify.QualifyError) as raised:
        qualify.Server(url, None, timeout=5).get("/server_info")
    assert str(raised.value) == (
        f"GET /server_info: no answer from {url} (\\x1b[2J\\x1b]0;owned\\x07HELLO\\x0d\\x0a)"
    )


def test_an_index_refusing_an_upload_has_its_reason_shown_inert(
    raw_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """builder publish's upload (twine, requests) to an index that answers 403 with escapes
    in its reason phrase."""
    url = raw_server(f"HTTP/1.1 403 For{ESCAPES}bidden\r\nContent-Length: 0\r\n\r\n".encode())
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        info = "demo-1.0.dist-info"
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    built = BuiltWheel("demo", "demo", "1.0", wheel.name, digest, 1, "key", False, wheel)
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", TOKEN)
    with pytest.raises(BuilderError) as raised:
        publish._upload(f"{url}/", None, built)
    assert str(raised.value) == (
        f"upload of {wheel.name} to {url}/ failed: 403 For\\x1b[2J\\x1b]0;owned\\x07bidden "
        "(check TWINE_USERNAME/TWINE_PASSWORD, your keyring or ~/.pypirc)"
    )
