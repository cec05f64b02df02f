"""A package index's project page (PEP 691 JSON if offered, else PEP 503 HTML): which files
it offers, where, and with which sha256. Read to verify what `publish` uploaded, and to find
a release-sourced upstream's pinned wheel."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

from packaging.utils import canonicalize_name

from builder import http_client
from builder.errors import BuilderError
from builder.urls import redact

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data) -> None:
        if self._href is not None:
            self.links.append((self._href, data.strip()))
            self._href = None


def parse_project_page(body: bytes, content_type: str, page_url: str) -> dict[str, IndexFile]:
    files: dict[str, IndexFile] = {}
    if "json" in content_type:
        for entry in json.loads(body).get("files", []):
            files[entry["filename"]] = IndexFile(
                entry["filename"],
                urljoin(page_url, entry["url"]),
                (entry.get("hashes") or {}).get("sha256"),
            )
        return files
    parser = _Links()
    parser.feed(body.decode(errors="replace"))
    for href, text in parser.links:
        url, _, fragment = href.partition("#")
        filename = text or url.rsplit("/", 1)[-1]
        match = re.match(r"sha256=([0-9a-f]{64})", fragment)
        files[filename] = IndexFile(
            filename, urljoin(page_url, url), match.group(1) if match else None
        )
    return files


def read_project(simple_url: str, project: str) -> dict[str, IndexFile]:
    """What the index holds for `project` (PEP 691 JSON if offered, else PEP 503 HTML). The
    files' URLs keep the index's credentials only where they are on the index's own origin."""
    page = f"{simple_url.rstrip('/')}/{canonicalize_name(project)}/"
    answer = http_client.get(
        page, f"index {redact(simple_url)}", headers={"Accept": f"{JSON_ACCEPT}, text/html;q=0.5"}
    )
    if answer.status == 404:
        return {}
    if answer.status != 200:
        hint = {
            401: " (it wants credentials: in the URL, or over https ~/.netrc or the keyring)",
            403: " (it refused: check the credentials in the URL, ~/.netrc or the keyring)",
        }.get(answer.status, "")
        raise BuilderError(
            f"index {redact(simple_url)}: reading {project} answered {answer.status}{hint}"
        )
    try:
        files = parse_project_page(answer.body, answer.headers.get("Content-Type", ""), answer.url)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BuilderError(
            f"index {redact(simple_url)}: its page for {project} is not a PEP 503/691 project page"
        ) from None
    return {name: _with_credentials(found, simple_url) for name, found in files.items()}


def _with_credentials(found: IndexFile, simple_url: str) -> IndexFile:
    """A file on the index's own origin is fetched with the index's credentials; one served
    from elsewhere (files.pythonhosted.org for PyPI) is not given them."""
    bare, credentials = http_client.split_credentials(simple_url)
    if credentials is None or http_client.origin(found.url) != http_client.origin(bare):
        return found
    parts = urlsplit(found.url)
    userinfo = ":".join(quote(part, safe="") for part in credentials)
    return IndexFile(
        found.filename,
        urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}")),
        found.sha256,
    )
