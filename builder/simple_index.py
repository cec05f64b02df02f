"""A package index's project page (PEP 691 JSON if offered, else PEP 503 HTML): which files
it offers, where, and with which sha256. Read to verify what `publish` uploaded, and to find
a release-sourced upstream's pinned wheel."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin

from packaging.utils import canonicalize_name

from builder.errors import BuilderError, Unreachable
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
    """What the index holds for `project` (PEP 691 JSON if offered, else PEP 503 HTML)."""
    page = f"{simple_url.rstrip('/')}/{canonicalize_name(project)}/"
    request = urllib.request.Request(page, headers={"Accept": f"{JSON_ACCEPT}, text/html;q=0.5"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return parse_project_page(
                response.read(), response.headers.get("Content-Type", ""), response.url
            )
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise BuilderError(
            f"index {redact(simple_url)}: reading {project} answered {exc.code} {exc.reason}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"index {redact(simple_url)} is unreachable ({reason})") from None
