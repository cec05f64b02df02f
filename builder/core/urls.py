"""Credentials in URLs: found in userinfo and in query strings, and kept out of records."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters that carry a secret (`?token=`, `?access_token=`, `?X-Amz-Signature=`...).
_SECRET_QUERY = re.compile(r"token|passw|secret|key|auth|sig|credential", re.IGNORECASE)


# `scheme://userinfo@`: what a URL too broken for urlsplit (a bad port, an unclosed `[`)
# still shows of its credentials.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?//[^/?#]*@")


def _split(url: str) -> SplitResult | None:
    """urlsplit's parts, or None where it (or its port) cannot parse the URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return None
    return parts


def _secret_query(query: str) -> bool:
    return any(_SECRET_QUERY.search(key) for key, _ in parse_qsl(query, True))


def _redacted_query(query: str) -> str:
    return urlencode(
        [(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in parse_qsl(query, True)],
        safe="*",
    )


def has_credentials(url: str) -> bool:
    parts = _split(url)
    if parts is None:  # unparseable: judged on its text, never by raising
        return bool(_USERINFO.match(url)) or _secret_query(url.partition("?")[2])
    if parts.username or parts.password:
        return True
    return _secret_query(parts.query)


def redact(url: str) -> str:
    """The URL safe to print or record: no userinfo, secret query values shown as ***."""
    if not has_credentials(url):
        return url
    parts = _split(url)
    if parts is None:  # an error message about a broken URL must not quote its secret
        base, _, query = _USERINFO.sub(lambda m: f"{m.group(1) or ''}//", url).partition("?")
        return f"{base}?{_redacted_query(query)}" if query else base
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(
        (parts.scheme, host, parts.path, _redacted_query(parts.query), parts.fragment)
    )


# `scheme://…@` inside free text, up to the authority's last `@`.
_USERINFO_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s]*@")
# A URL inside free text: up to the first space, quote or bracket that cannot be in it.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()]+")


def scrub(text: str) -> str:
    """`text` with every URL in it redacted: the last guard before a message is printed or
    recorded, for a message that quotes a URL some library handed back."""
    text = _USERINFO_IN_TEXT.sub(r"\1", text)  # first: a password with a quote or space in it
    return _URL_IN_TEXT.sub(lambda match: redact(match.group(0)), text)
