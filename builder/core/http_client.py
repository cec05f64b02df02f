"""Every HTTP request builder makes to an index, a registry or a server: credentials,
redirects and errors decided in one place.

- Credentials written into a URL (`https://ci:TOKEN@proxy/simple`) never reach urllib, which
  would read everything after the last `:` as a port and quote the token in its error: they
  are taken out of the URL and sent as HTTP Basic, to that origin only.
- A URL without them, answered 401 with a Basic challenge, is asked again once with the
  host's entry in ~/.netrc (or $NETRC), then the keyring's, as pip does; over https only: a
  plain-http 401 is never sent a stored login (anyone on the path would read it).
- A redirect keeps credentials only to the same origin (scheme, host and port); it is
  followed without them to another host, and never from https to plain http. Callers that
  must see the 3xx itself (a server under test: its API key goes to no other host) ask for
  no redirects at all.
- Each request has a deadline for the whole of it (connection, redirects, a retry with a
  stored login, and the body the caller reads): a server that drips its answer a byte at a
  time cannot hold builder, whose other timeout is for one read.
- Every error names the URL redacted (builder.core.urls.redact), and what a server wrote in it (a
  reason phrase, a broken status line) shown through builder.core.untrusted.printable.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import netrc
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from urllib.parse import unquote, urlsplit, urlunsplit

from builder.core.errors import BuilderError, Unreachable
from builder.core.untrusted import printable
from builder.core.urls import redact

AUTHORIZATION = "Authorization"
_CREDENTIAL_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie")


class RedirectRefused(urllib.error.URLError):
    """A redirect from https to plain http: the answer would travel unprotected."""


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class _SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """urllib copies a request's ordinary headers onto the redirected one, whatever its host:
    credentials are kept apart (unredirected) and carried only to the origin they were for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(req.full_url).scheme == "https" and urlsplit(newurl).scheme != "https":
            raise RedirectRefused(f"redirect from https to {redact(newurl)} refused")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        same = origin(newurl) == origin(req.full_url)
        if not same:  # a header a caller passed that carries credentials stays home too
            for name in _CREDENTIAL_HEADERS:
                new.headers.pop(name.capitalize(), None)
                new.headers.pop(name, None)
        credentials = req.unredirected_hdrs.get(AUTHORIZATION)
        if credentials and same:
            new.add_unredirected_header(AUTHORIZATION, credentials)
        return new


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


NO_REDIRECTS = urllib.request.build_opener(_NoRedirect)
DEADLINE_TIMEOUTS = 10  # a request's default deadline, in its timeouts (for one read each)


class _Deadline:
    """Ends a request still running at its deadline: each of its connections is shut down,
    so that a read blocked on a server that drips its answer returns at once (urllib's
    timeout is for one read, and each byte resets it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.passed = False
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, connection: socket.socket) -> socket.socket:
        """`connection`, to be shut down at the deadline: through a duplicate of it, which
        the TLS layer wrapped around it later does not take over."""
        duplicate = connection.dup()
        with self._lock:
            self._connections.append(duplicate)
            if self.passed:
                duplicate.shutdown(socket.SHUT_RDWR)
        return connection

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            for connection in self._connections:
                with contextlib.suppress(OSError):  # closed by the other side already
                    connection.shutdown(socket.SHUT_RDWR)

    def end(self) -> None:
        self._timer.cancel()
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()


def _watched(connection_class, deadline: _Deadline):
    """`connection_class` (http.client's) whose sockets `deadline` watches."""

    def connect(host: str, **options) -> http.client.HTTPConnection:
        connection = connection_class(host, **options)
        create = connection._create_connection
        connection._create_connection = lambda *a, **k: deadline.watch(create(*a, **k))
        return connection

    return connect


class _WatchedHTTP(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self._deadline), req)


class _WatchedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req):
        connection = _watched(http.client.HTTPSConnection, self._deadline)
        return self.do_open(connection, req, context=self._context)


def _opener(follow_redirects: bool, deadline: _Deadline) -> urllib.request.OpenerDirector:
    redirects = _SameOriginCredentials if follow_redirects else _NoRedirect
    return urllib.request.build_opener(redirects, _WatchedHTTP(deadline), _WatchedHTTPS(deadline))


@contextlib.contextmanager
def _within(seconds: float, url: str, what: str, hint: str) -> Iterator[_Deadline]:
    """A deadline for everything done inside: what failed because it passed (a read cut
    short, an answer broken off) is the one line that says so."""
    deadline = _Deadline(seconds)
    passed = Unreachable(
        f"{what}: {redact(url)} did not answer in full within {seconds:g} s (the deadline "
        f"for the whole request, its body included){hint}"
    )
    try:
        yield deadline
    except Exception:
        if deadline.passed:
            raise passed from None
        raise
    finally:
        deadline.end()
    if deadline.passed:  # a read the deadline cut short can look like the end of the body
        raise passed


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without userinfo, (user, password) or None). Raises BuilderError, with the URL
    redacted, for one that cannot be parsed (a port that is not a number, an unclosed `[`)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise BuilderError(f"{redact(url)}: not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BuilderError(f"{redact(url)}: not an http(s)://HOST/... URL")
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def stored_credentials(url: str) -> tuple[str, str] | None:
    """The host's login from ~/.netrc ($NETRC), else from the keyring (when installed and it
    has one); never an error: a broken store is the same as none."""
    host = (urlsplit(url).hostname or "").lower()
    try:  # the host's own entry only: netrc's `default` would go to any host that asks
        found = netrc.netrc(os.environ.get("NETRC") or None).hosts.get(host)
    except (OSError, netrc.NetrcParseError):
        found = None
    if found and found[0] and found[2] is not None:
        return found[0], found[2]
    try:
        import keyring

        credential = keyring.get_credential(host, None)
    except Exception:  # no keyring, no backend, a locked one: nothing stored
        return None
    if credential is not None and credential.username:
        return credential.username, credential.password
    return None


def stored_login(url: str, what: str) -> tuple[str, str] | None:
    """The host's stored login for a URL that asks for one, over https only: where plain
    http asks and the store holds one, BuilderError says it was withheld."""
    found = stored_credentials(url)
    if found is not None and urlsplit(url).scheme != "https":
        raise BuilderError(
            f"{what}: {redact(url)} asks for credentials over plain http: the login "
            "~/.netrc or the keyring holds for its host is withheld (sent over https only); "
            "use https, or write USER:TOKEN@ into the URL to send one over plain http anyway"
        )
    return found


@dataclass
class Answer:
    status: int
    headers: Message
    url: str  # where the answer came from, after redirects (credentials never in it)
    body: bytes


def _request(
    url: str, headers: dict[str, str] | None, data: bytes | None, credentials
) -> urllib.request.Request:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    if credentials is not None:
        request.add_unredirected_header(AUTHORIZATION, basic(*credentials))
    return request


@contextlib.contextmanager
def _answer(
    url: str,
    what: str,
    deadline: _Deadline,
    *,
    headers: dict[str, str] | None,
    data: bytes | None,
    timeout: float,
    follow_redirects: bool,
    hint: str,
    credentials: tuple[str, str] | None,
    use_store: bool,
) -> Iterator[http.client.HTTPResponse]:
    """open_url's answer, its connections watched by `deadline`."""
    bare, in_url = split_credentials(url)
    credentials = credentials or in_url
    opener = _opener(follow_redirects, deadline)
    asked_store = credentials is not None or not use_store
    while True:
        try:
            response = opener.open(_request(bare, headers, data, credentials), timeout=timeout)
        except urllib.error.HTTPError as exc:
            exc.msg = printable(exc.msg)  # the server's reason phrase, in callers' errors
            challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
            if exc.code == 401 and not asked_store and challenge.lower().startswith("basic"):
                asked_store = True
                credentials = stored_login(bare, what)
                if credentials is not None:
                    exc.close()
                    continue
            raise
        except RedirectRefused as exc:
            raise BuilderError(f"{what}: {redact(url)}: {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            reason = printable(getattr(exc, "reason", None) or exc)  # a broken status line
            raise Unreachable(f"{what}: cannot read {redact(url)} ({reason}){hint}") from None
        with response:
            yield response
        return


@contextlib.contextmanager
def open_url(
    url: str,
    what: str,
    *,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 30,
    deadline: float | None = None,
    follow_redirects: bool = True,
    hint: str = "",
    credentials: tuple[str, str] | None = None,
    use_store: bool = True,
) -> Iterator[http.client.HTTPResponse]:
    """The open response to a 2xx answer for `url`; any other status (a 3xx too, when
    redirects are not followed) raises urllib's HTTPError, for the caller to read.
    Unreachable, with `what` and the redacted URL, when no answer came, or when the request
    and the caller's reading of the body took longer than `deadline` seconds (default:
    DEADLINE_TIMEOUTS x `timeout`, the limit for one read). `credentials` (user, password)
    go as Basic to the URL's origin, as those written in the URL would; `use_store=False`
    never asks netrc or the keyring (a server under test, a redirect's storage host: no
    stored login is theirs)."""
    with (
        _within(deadline or DEADLINE_TIMEOUTS * timeout, url, what, hint) as watch,
        _answer(
            url, what, watch, headers=headers, data=data, timeout=timeout,
            follow_redirects=follow_redirects, hint=hint, credentials=credentials,
            use_store=use_store,
        ) as response,
    ):  # fmt: skip
        yield response


def get(
    url: str,
    what: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    deadline: float | None = None,
    max_bytes: int = 64 << 20,
    follow_redirects: bool = True,
    hint: str = "",
    credentials: tuple[str, str] | None = None,
    use_store: bool = True,
    data: bytes | None = None,
) -> Answer:
    """The whole answer, HTTP error statuses included (a 404 is an answer, not an error);
    a body longer than `max_bytes` is refused before more is read; the whole of it within
    `deadline` seconds (default: DEADLINE_TIMEOUTS x `timeout`), an error body too.
    With `data`, the request is a POST of it."""
    with _within(deadline or DEADLINE_TIMEOUTS * timeout, url, what, hint) as watch:
        status, answer_headers, where, body = _read_whole(
            url, what, watch, max_bytes, headers=headers, data=data, timeout=timeout,
            follow_redirects=follow_redirects, hint=hint, credentials=credentials,
            use_store=use_store,
        )  # fmt: skip
    if len(body) > max_bytes:
        raise BuilderError(f"{what}: {redact(url)} answered more than {max_bytes} bytes")
    declared = (answer_headers.get("Content-Length") or "").strip() if answer_headers else ""
    if declared.isdigit() and len(body) < int(declared):  # read(n) returns what came
        raise Unreachable(
            f"{what}: {redact(url)} broke off its answer ({len(body)} of {declared} bytes){hint}"
        )
    return Answer(status, answer_headers, split_credentials(where)[0], body)


def _read_whole(
    url: str, what: str, deadline: _Deadline, max_bytes: int, *, hint: str, **options
) -> tuple[int, Message, str, bytes]:
    """(status, headers, where the answer came from, up to `max_bytes` + 1 of its body)."""
    try:
        with _answer(url, what, deadline, hint=hint, **options) as response:
            body = response.read(max_bytes + 1)
            return response.status, response.headers, response.url, body
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(max_bytes + 1) if exc.fp is not None else b""
        except (OSError, http.client.HTTPException) as broken:
            raise Unreachable(
                f"{what}: {redact(url)} broke off its answer ({printable(broken)})"
            ) from None
        return exc.code, exc.headers, exc.url, body
    except (OSError, http.client.HTTPException) as exc:  # the connection broke mid-answer
        raise Unreachable(
            f"{what}: {redact(url)} broke off its answer ({printable(exc)}){hint}"
        ) from None
