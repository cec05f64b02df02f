"""Every HTTP request builder makes to an index, a registry or a server: credentials,
redirects and errors decided in one place.

- Credentials written into a URL (`https://ci:TOKEN@proxy/simple`) never reach urllib, which
  would read everything after the last `:` as a port and quote the token in its error: they
  are taken out of the URL and sent as HTTP Basic, to that origin only.
- A URL without them, answered 401 with a Basic challenge, is asked again once with the
  host's entry in ~/.netrc (or $NETRC), then the keyring's, as pip does.
- A redirect keeps credentials only to the same origin (scheme, host and port); it is
  followed without them to another host, and never from https to plain http. Callers that
  must see the 3xx itself (a server under test: its API key goes to no other host) ask for
  no redirects at all.
- Every error names the URL redacted (builder.urls.redact).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import netrc
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from urllib.parse import unquote, urlsplit, urlunsplit

from builder.errors import BuilderError, Unreachable
from builder.urls import redact

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


_FOLLOWING = urllib.request.build_opener(_SameOriginCredentials)
NO_REDIRECTS = urllib.request.build_opener(_NoRedirect)


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
def open_url(
    url: str,
    what: str,
    *,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 30,
    follow_redirects: bool = True,
    hint: str = "",
    credentials: tuple[str, str] | None = None,
    use_store: bool = True,
) -> Iterator[http.client.HTTPResponse]:
    """The open response to a 2xx answer for `url`; any other status (a 3xx too, when
    redirects are not followed) raises urllib's HTTPError, for the caller to read.
    Unreachable, with `what` and the redacted URL, when no answer came. `credentials`
    (user, password) go as Basic to the URL's origin, as those written in the URL would;
    `use_store=False` never asks netrc or the keyring (a server under test, a redirect's
    storage host: no stored login is theirs)."""
    bare, in_url = split_credentials(url)
    credentials = credentials or in_url
    opener = _FOLLOWING if follow_redirects else NO_REDIRECTS
    asked_store = credentials is not None or not use_store
    while True:
        try:
            response = opener.open(_request(bare, headers, data, credentials), timeout=timeout)
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
            if exc.code == 401 and not asked_store and challenge.lower().startswith("basic"):
                asked_store = True
                credentials = stored_credentials(bare)
                if credentials is not None:
                    exc.close()
                    continue
            raise
        except RedirectRefused as exc:
            raise BuilderError(f"{what}: {redact(url)}: {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise Unreachable(f"{what}: cannot read {redact(url)} ({reason}){hint}") from None
        with response:
            yield response
        return


def get(
    url: str,
    what: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    max_bytes: int = 64 << 20,
    follow_redirects: bool = True,
    hint: str = "",
    credentials: tuple[str, str] | None = None,
    use_store: bool = True,
) -> Answer:
    """The whole answer, HTTP error statuses included (a 404 is an answer, not an error);
    a body longer than `max_bytes` is refused before more is read."""
    try:
        with open_url(
            url, what, headers=headers, timeout=timeout, follow_redirects=follow_redirects,
            hint=hint, credentials=credentials, use_store=use_store,
        ) as response:  # fmt: skip
            body = response.read(max_bytes + 1)
            status, answer_headers, where = response.status, response.headers, response.url
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(max_bytes + 1) if exc.fp is not None else b""
        except (OSError, http.client.HTTPException) as broken:
            raise Unreachable(f"{what}: {redact(url)} broke off its answer ({broken})") from None
        status, answer_headers, where = exc.code, exc.headers, exc.url
    except (OSError, http.client.HTTPException) as exc:  # the connection broke mid-answer
        raise Unreachable(f"{what}: {redact(url)} broke off its answer ({exc}){hint}") from None
    if len(body) > max_bytes:
        raise BuilderError(f"{what}: {redact(url)} answered more than {max_bytes} bytes")
    declared = (answer_headers.get("Content-Length") or "").strip() if answer_headers else ""
    if declared.isdigit() and len(body) < int(declared):  # read(n) returns what came
        raise Unreachable(
            f"{what}: {redact(url)} broke off its answer ({len(body)} of {declared} bytes){hint}"
        )
    return Answer(status, answer_headers, split_credentials(where)[0], body)
