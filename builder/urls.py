"""Credentials in URLs: found in userinfo and in query strings, and kept out of records."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters that carry a secret (`?token=`, `?access_token=`, `?X-Amz-Signature=`...).
_SECRET_QUERY = re.compile(r"token|passw|secret|key|auth|sig|credential", re.IGNORECASE)


def has_credentials(url: str) -> bool:
    parts = urlsplit(url)
    if parts.username or parts.password:
        return True
    return any(_SECRET_QUERY.search(key) for key, _ in parse_qsl(parts.query, True))


def redact(url: str) -> str:
    """The URL safe to print or record: no userinfo, secret query values shown as ***."""
    if not has_credentials(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    query = urlencode(
        [(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in parse_qsl(parts.query, True)],
        safe="*",
    )
    return urlunsplit((parts.scheme, host, parts.path, query, parts.fragment))
