"""A package index's project page (PEP 691 JSON if offered, else PEP 503 HTML): which files
it offers, where, and with which sha256. Read to verify what `publish` uploaded, and to find
a release-sourced upstream's pinned wheel.

The page is outside data: read up to PAGE_LIMIT bytes, parsed in one pass, up to FILES_LIMIT
files (html.parser takes minutes on 40 kB of unclosed tags), and refused whole, with the
reason, where it is not a project page: not UTF-8 or JSON, a file name that is no file
name, a sha256 that is not one, one file listed twice."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

from packaging.utils import canonicalize_name

from builder.core import http_client
from builder.core.errors import BuilderError
from builder.core.untrusted import has_control, printable
from builder.core.urls import redact

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
PAGE_LIMIT = 16 << 20  # bytes of one project page: PyPI's JSON for torch is 0.4 MB, sglang's 0.17
FILES_LIMIT = 50_000  # files listed on one page: PyPI lists 412 for sglang (all releases)
FILENAME_LIMIT = 255  # characters of a file name: what a file system holds
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_ANCHOR_OR_COMMENT = re.compile(r"<a[\s>]|<!--", re.IGNORECASE)
_ANCHOR_END = re.compile(r"</a\s*>", re.IGNORECASE)
_HREF = re.compile(r"""\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None


class NotAProjectPage(ValueError):
    """Why a page is not a PEP 503/691 project page (one clause)."""


def _json_entries(body: bytes) -> Iterator[tuple[str, str, object]]:
    try:
        page = json.loads(body)
    except RecursionError:
        raise NotAProjectPage("its JSON is nested too deeply") from None
    except ValueError as exc:  # not UTF-8, not JSON, a number of a million digits
        raise NotAProjectPage(f"not JSON ({printable(exc)})") from None
    listed = page.get("files") if isinstance(page, dict) else None
    if not isinstance(listed, list):
        raise NotAProjectPage('its JSON has no "files" list')
    for entry in listed:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("filename"), str)
            and isinstance(entry.get("url"), str)
        ):
            raise NotAProjectPage('a "files" entry is not {"filename": TEXT, "url": TEXT, ...}')
        hashes = entry.get("hashes") or {}
        if not isinstance(hashes, dict):
            raise NotAProjectPage(f'the "hashes" of {printable(entry["filename"])} are no object')
        yield entry["filename"], entry["url"], hashes.get("sha256")


def _html_entries(body: bytes) -> Iterator[tuple[str, str, object]]:
    """(file name, URL, sha256) of every <a href> outside comments, in one pass: each search
    starts where the last one ended."""
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise NotAProjectPage(f"not UTF-8 (byte {exc.start})") from None
    position = 0
    while (found := _ANCHOR_OR_COMMENT.search(text, position)) is not None:
        start = found.start()
        if found.group(0) == "<!--":
            end = text.find("-->", found.end())
            if end < 0:
                raise NotAProjectPage(f"the comment at character {start} is not closed")
            position = end + 3
            continue
        tag_end = text.find(">", start)
        if tag_end < 0:
            raise NotAProjectPage(f"the <a> tag at character {start} is not closed")
        closing = _ANCHOR_END.search(text, tag_end + 1)
        if closing is None:
            raise NotAProjectPage(f"the <a> at character {start} has no </a>")
        href = _HREF.search(text, start, tag_end)
        label = text[tag_end + 1 : closing.start()]
        position = closing.end()
        if href is None:
            continue  # an anchor that links nothing: no file
        link = html.unescape(next(g for g in href.groups() if g is not None))
        url, _, fragment = link.partition("#")
        name = html.unescape(label).strip() if "<" not in label else ""
        sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        yield name or url.rsplit("/", 1)[-1], url, sha256


def _checked_name(filename: str) -> str:
    if (
        not filename
        or len(filename) > FILENAME_LIMIT
        or filename in (".", "..")
        or "/" in filename
        or "\\" in filename
        or has_control(filename)
    ):
        raise NotAProjectPage(f"it lists '{printable(filename)}', which is no file name")
    return filename


def _checked_sha256(filename: str, sha256: object) -> str | None:
    if sha256 is None:
        return None
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise NotAProjectPage(f"it gives {filename} the sha256 '{printable(sha256)}', not one")
    return sha256.lower()


def parse_project_page(body: bytes, content_type: str, page_url: str) -> dict[str, IndexFile]:
    """{file name: file} of a project page; NotAProjectPage says why it is not one."""
    entries = _json_entries(body) if "json" in content_type else _html_entries(body)
    files: dict[str, IndexFile] = {}
    for count, (filename, url, sha256) in enumerate(entries):
        if count == FILES_LIMIT:
            raise NotAProjectPage(f"it lists more than {FILES_LIMIT:,} files")
        name = _checked_name(filename)
        try:
            absolute = urljoin(page_url, url)
        except ValueError:  # an unclosed `[`, a port that is no number
            raise NotAProjectPage(f"it gives {name} the URL '{printable(redact(url))}'") from None
        found = IndexFile(name, absolute, _checked_sha256(name, sha256))
        if files.setdefault(name, found) != found:
            raise NotAProjectPage(f"it lists {name} twice, with another URL or sha256")
    return files


def _checked_url(found: IndexFile) -> IndexFile:
    """A file is fetched over http(s) only: no file:// (a path on this machine) or other
    scheme an index names."""
    try:
        parts = urlsplit(found.url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or has_control(found.url):
        raise NotAProjectPage(
            f"it gives {found.filename} the URL '{printable(redact(found.url))}', not http(s)"
        )
    return found


def read_project(simple_url: str, project: str) -> dict[str, IndexFile]:
    """What the index holds for `project` (PEP 691 JSON if offered, else PEP 503 HTML). The
    files' URLs keep the index's credentials only where they are on the index's own origin."""
    page = f"{simple_url.rstrip('/')}/{canonicalize_name(project)}/"
    answer = http_client.get(
        page,
        f"index {redact(simple_url)}",
        headers={"Accept": f"{JSON_ACCEPT}, text/html;q=0.5"},
        max_bytes=PAGE_LIMIT,
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
        files = {name: _checked_url(found) for name, found in files.items()}
    except NotAProjectPage as exc:
        raise BuilderError(
            f"index {redact(simple_url)}: its page for {project} is not a PEP 503/691 project "
            f"page: {exc}"
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
