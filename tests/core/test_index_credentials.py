"""Authenticated package indexes and every other HTTP request builder makes: credentials are
sent where they belong, and never printed or recorded.

Real parts: the sglang 0.5.23 release file from PyPI (the default target's release-sourced
pin), served by pypiserver on loopback asking for HTTP Basic for listing and downloads, as
a company's authenticated PyPI proxy does; plain loopback HTTP(S) servers for the redirect
rule (a self-signed certificate made here for the https one).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import re
import shutil
import ssl
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from builder.core import http_client
from builder.core.errors import BuilderError
from tests.conftest import REPO_ROOT, Builder
from tests.services import start_pypiserver
from tests.upstreams import fetch_release_file

PIN = tomllib.loads((REPO_ROOT / "forks/sglang/pin.toml").read_text())
USER, TOKEN = "ci", "tok3n-s3cret-Zq9"


@pytest.fixture(scope="module")
def private_index(tmp_path_factory) -> Iterator[int]:
    """The sglang release on a loopback index that wants `ci:TOKEN` for every read."""
    packages = tmp_path_factory.mktemp("private-index")
    shutil.copy(fetch_release_file("sglang", PIN["ref"]), packages)
    process, port = start_pypiserver(
        packages, packages.parent / "pypiserver.log", auth=(USER, TOKEN), private=True
    )
    yield port
    process.terminate()


def _builder(root: Path, mirror: str) -> Builder:
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, root / "data" / folder)
    return Builder(
        root / "data", root / "cache", mirror, root / "w", env={"BUILDER_TARGET": "sm120"}
    )


def _no_secret_anywhere(result, *folders: Path) -> None:
    assert TOKEN not in result.stdout + result.stderr
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert TOKEN.encode() not in path.read_bytes(), path


def test_the_release_pin_downloads_through_an_index_that_wants_credentials(
    tmp_path: Path, private_index: int
) -> None:
    index = f"127.0.0.1:{private_index}/simple"
    mirror = f"https://pypi.org/simple=http://{USER}:{TOKEN}@{index}"
    builder = _builder(tmp_path / "b", mirror)
    result = builder.run("sources", "--upstream", "sglang", "--json", check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["upstreams"]["sglang"]["commit"] == PIN["commit"]
    _no_secret_anywhere(result, builder.cache_dir, builder.data_dir)


def test_a_netrc_login_is_withheld_from_a_plain_http_index(
    tmp_path: Path, private_index: int
) -> None:
    """The same index over plain http, its login in netrc: anyone on the path would read
    it, so it is not sent (over https it is: below); one line says so."""
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {USER} password {TOKEN}\n")
    netrc.chmod(0o600)
    index = f"http://127.0.0.1:{private_index}/simple"
    builder = _builder(tmp_path / "b", f"https://pypi.org/simple={index}")
    result = builder.run(
        "sources", "--upstream", "sglang", "--json", env={"NETRC": str(netrc)}, check=False
    )
    assert result.returncode == 1, result.stderr
    pin = builder.data_dir / "forks/sglang/pin.toml"
    assert result.stderr == (
        f"error: {pin}: index {index}: {index}/sglang/ asks for credentials over plain http: "
        "the login ~/.netrc or the keyring holds for its host is withheld (sent over https "
        "only); use https, or write USER:TOKEN@ into the URL to send one over plain http "
        "anyway\n"
    )
    _no_secret_anywhere(result, builder.cache_dir)


def test_wrong_credentials_are_one_line_that_does_not_quote_them(
    tmp_path: Path, private_index: int
) -> None:
    mirror = f"https://pypi.org/simple=http://{USER}:{TOKEN}x@127.0.0.1:{private_index}/simple"
    builder = _builder(tmp_path, mirror)
    result = builder.run("sources", "--upstream", "sglang", "--json", check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert re.search(r"answered 40[13] \(it (wants|refused)", result.stderr), result.stderr
    assert json.loads(result.stdout)["exit_code"] == 1
    _no_secret_anywhere(result, builder.cache_dir)


@pytest.mark.parametrize(
    ("mirror", "code", "words"),
    [
        # urllib read everything after the last ':' as the port and quoted it: the token was
        # printed in an internal error (exit 2) on every fresh-cache run.
        (f"https://pypi.org/simple=https://{USER}:{TOKEN}@proxy.invalid/simple", 9, "cannot read"),
        (f"https://pypi.org/simple=https://{USER}:{TOKEN}@proxy.invalid:8443/simple", 9, "cannot"),
        # A rule typed without FROM=: the usage error quoted it whole.
        (f"https://{USER}:{TOKEN}@proxy.invalid/simple", 1, "must look like FROM=TO"),
    ],
)
def test_a_mirror_with_credentials_that_fails_never_prints_them(
    tmp_path: Path, mirror: str, code: int, words: str
) -> None:
    builder = _builder(tmp_path, mirror)
    result = builder.run("sources", "--upstream", "sglang", "--json", check=False)
    assert result.returncode == code, result.stderr
    assert words in result.stderr and "internal error" not in result.stderr
    assert TOKEN not in result.stdout + result.stderr


def test_a_server_url_with_credentials_is_refused_without_quoting_them(tmp_path: Path) -> None:
    builder = _builder(tmp_path, "unused=unused")
    for command in ("wait-ready", "qualify"):
        result = builder.run(command, f"https://ops:{TOKEN}@llm.internal:8443", check=False)
        assert result.returncode == 1, result.stderr
        assert "--api-key-file" in result.stderr and TOKEN not in result.stderr


# --- the redirect rule, on loopback servers -------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers each path as `routes` says and records the Authorization each request had."""

    routes: ClassVar[dict[str, tuple[int, str]]] = {}
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        status, location = self.routes.get(self.path, (200, ""))
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) files for https://127.0.0.1, the certificate its own CA: trusted
    where SSL_CERT_FILE names it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two plain HTTP servers (two origins) and one HTTPS server trusted through
    SSL_CERT_FILE, sharing one routing table and one record of what each was sent."""
    cert_file, key_file = self_signed_certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    _Recorder.routes, _Recorder.seen = {}, []
    started = []
    for secure in (False, False, True):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        if secure:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert_file, key_file)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        scheme = "https" if secure else "http"
        started.append((server, f"{scheme}://127.0.0.1:{server.server_address[1]}"))
    yield [url for _, url in started]
    for server, _ in started:
        server.shutdown()


def test_credentials_follow_a_redirect_to_the_same_origin_only(servers) -> None:
    first, other, _ = servers
    _Recorder.routes = {
        "/same": (302, f"{first}/landed"),
        "/away": (302, f"{other}/elsewhere"),
    }
    for path in ("/same", "/away"):
        answer = http_client.get(f"{first}{path}", "test", credentials=(USER, TOKEN))
        assert answer.status == 200 and answer.body == b"ok"
    sent = dict(_Recorder.seen)
    basic = http_client.basic(USER, TOKEN)
    assert sent["/same"] == basic and sent["/landed"] == basic
    assert sent["/away"] == basic and sent["/elsewhere"] is None
    assert answer.url == f"{other}/elsewhere"


def test_credentials_in_the_url_are_sent_as_basic_and_never_in_the_request_line(
    servers,
) -> None:
    first, _, _ = servers
    host = first.removeprefix("http://")
    answer = http_client.get(f"http://{USER}:{TOKEN}@{host}/x", "test")
    assert answer.status == 200 and TOKEN not in answer.url
    assert _Recorder.seen == [("/x", http_client.basic(USER, TOKEN))]


def test_a_redirect_from_https_to_plain_http_is_refused(servers) -> None:
    first, _, secure = servers
    _Recorder.routes = {"/token": (307, f"{first}/stolen")}
    with pytest.raises(BuilderError, match=r"redirect from https to .* refused"):
        http_client.get(f"{secure}/token", "registry token", credentials=(USER, TOKEN))
    assert [path for path, _ in _Recorder.seen] == ["/token"]


def test_a_url_that_cannot_be_parsed_is_an_error_that_does_not_quote_its_secret() -> None:
    with pytest.raises(BuilderError) as raised:
        http_client.get(f"https://{USER}:{TOKEN}@host:port/simple", "index")
    assert TOKEN not in str(raised.value) and "not a valid URL" in str(raised.value)


@pytest.mark.parametrize(("login", "words"), [("", "asks for"), (f"{USER}:{TOKEN}@", "refused")])
def test_a_git_remote_that_asks_for_credentials_is_one_line(
    tmp_path: Path, servers, login: str, words: str
) -> None:
    """A git remote behind HTTP auth (the loopback server answers 401 to everything): was
    `internal error: TypeError` from libgit2's credential callback."""
    first, _, _ = servers
    _Recorder.routes = {}
    answer_401 = _Recorder.do_GET

    def challenge(handler) -> None:
        handler.seen.append((handler.path, handler.headers.get("Authorization")))
        handler.send_response(401)
        handler.send_header("WWW-Authenticate", 'Basic realm="git"')
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    _Recorder.do_GET = challenge
    try:
        host = first.removeprefix("http://")
        builder = _builder(tmp_path, f"https://github.com/=http://{login}{host}/")
        result = builder.run("sources", "--upstream", "flashinfer", check=False)
    finally:
        _Recorder.do_GET = answer_401
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], result.stderr
    assert "internal error" not in result.stderr and TOKEN not in result.stderr
    if login:
        assert http_client.basic(USER, TOKEN) in {auth for _, auth in _Recorder.seen}


def test_every_line_builder_prints_shows_urls_without_their_credentials(capsys) -> None:
    """The one redaction (builder/core/urls.py) at the one place lines are printed (progress)."""
    from builder.core import progress

    progress.info(f"fetch https://{USER}:{TOKEN}@mirror.internal/x.git")
    progress.warn(f"slow: http://{USER}:{TOKEN}@127.0.0.1:1/simple?token={TOKEN}")
    with progress.task(f"download https://{USER}:{TOKEN}@files.internal/a.whl"):
        pass
    printed = capsys.readouterr().err
    assert TOKEN not in printed
    assert "https://mirror.internal/x.git" in printed and "token=***" in printed


def test_a_netrc_default_login_goes_to_no_host_and_a_server_under_test_gets_none(
    servers, tmp_path: Path, monkeypatch
) -> None:
    """netrc's `default` entry would answer for any host; and a server under test (wait-ready)
    is never sent a stored login, whatever the store holds for its host. Over https: a
    stored login never goes over plain http (tests/core/test_hostile_credentials.py)."""
    _, _, secure = servers
    netrc = tmp_path / "netrc"
    netrc.write_text(f"default login {USER} password {TOKEN}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert http_client.stored_credentials(f"{secure}/x") is None
    netrc.write_text(f"machine 127.0.0.1 login {USER} password {TOKEN}\n")

    class Challenge(_Recorder):
        def do_GET(self) -> None:
            self.seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="x"')
            self.send_header("Content-Length", "0")
            self.end_headers()

    answer_401 = _Recorder.do_GET
    _Recorder.do_GET = Challenge.do_GET
    try:
        asked = http_client.get(f"{secure}/index", "index")
        tested = http_client.get(f"{secure}/server_info", "server", use_store=False)
    finally:
        _Recorder.do_GET = answer_401
    assert asked.status == tested.status == 401
    sent = [auth for path, auth in _Recorder.seen if path == "/index"]
    assert sent == [None, http_client.basic(USER, TOKEN)]  # asked, then the host's own login
    assert [auth for path, auth in _Recorder.seen if path == "/server_info"] == [None]


def test_a_broken_off_answer_is_unreachable_not_a_traceback() -> None:
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer_then_reset() -> None:
        connection, _ = listener.accept()
        connection.recv(4096)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
        connection.close()

    threading.Thread(target=answer_then_reset, daemon=True).start()
    from builder.core.errors import Unreachable

    with pytest.raises(Unreachable, match="broke off its answer"):
        http_client.get(f"http://127.0.0.1:{listener.getsockname()[1]}/x", "server")
    listener.close()
