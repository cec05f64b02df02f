"""`builder upstream check` and `move` against a hostile package index (security review #54).

Real parts: a package index on loopback (http.server, answering pages, files and range
requests byte for byte as each test writes them, as a hostile or broken index would), a real
git daemon holding FlashInfer's tags, builder's own CLI in a subprocess, its own release
import. Each hostile page, wheel or member gets one line that names the URL or file and exit
1 (9 where the server broke off its answer), never an internal error.

Most tests run on a stand-in stack: sglang releases of two files each (METADATA and an
`__init__.py`; the pinned one is imported and its commit computed here, as a release pin's
is) and a FlashInfer wheel holding `_build_meta.py`, METADATA and a stand-in for each
generator module the target lists. A check that gets past every index read stops at the
stand-in's missing argument parser (test_the_stand_in_index_is_read_to_the_parser). The
tests of FlashInfer's commit and of what reaches the report and the commit message run on
the real sglang 0.5.23 wheel (cached outside the repository, as tests/upstream/test_upstream.py's),
pinned under the name of a 0.5.22 file, and moved to a copy of it whose reasoning-parser
names gain one a stranger wrote.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import struct
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pygit2
import pytest

from builder.build.release import import_wheel
from builder.core.untrusted import markdown_inert, printable
from builder.spec.target import load_target
from builder.upstream.jit_generators import split_generator
from tests.conftest import REPO_ROOT, Builder, seed_cache
from tests.services import start_git_daemon
from tests.upstreams import fetch_release_file, flashinfer_tags, move_tag

TARGET = {"BUILDER_TARGET": "sm120"}  # the suite's default is sm120-0.5.9 (tests/conftest.py)
TAGS = "cp312-cp312-manylinux_2_34_x86_64"
OLD = f"sglang-0.5.22-{TAGS}.whl"
NEW = f"sglang-0.5.23-{TAGS}.whl"
FLASHINFER_WHEEL = "flashinfer_python-0.7.2-py3-none-any.whl"
BUILD_META = "flashinfer/_build_meta.py"
FLASHINFER_METADATA = "flashinfer_python-0.7.2.dist-info/METADATA"
# A reasoning parser name a stranger added to the new release: a terminal title escape, a
# bell and a Markdown link.
HOSTILE_CHOICE = "glm45\x1b]0;pwned\x07[click](https://evil.example)"
GiB = 1 << 30


# -- the index ------------------------------------------------------------------------------


@dataclass
class Served:
    """One answer of the index: status, body and headers; range requests answered 206 (as
    pypiserver does) unless `ranges` is off."""

    body: bytes
    content_type: str = "application/octet-stream"
    status: int = 200
    reason: str | None = None
    ranges: bool = True
    headers: dict[str, str] = field(default_factory=dict)  # written over the usual ones


class _Index(BaseHTTPRequestHandler):
    server: _IndexServer

    def do_GET(self) -> None:
        served = self.server.routes.get(urlsplit(self.path).path)
        if served is None:
            served = Served(b"not found", "text/plain", 404)
        body, status = served.body, served.status
        headers = {"Content-Type": served.content_type}
        asked = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if asked and served.ranges and status == 200 and body:
            first, last = asked.groups()
            if not first:  # the last N bytes
                first, last = max(0, len(body) - int(last)), len(body) - 1
            else:
                first, last = int(first), min(int(last or len(body) - 1), len(body) - 1)
            headers["Content-Range"] = f"bytes {first}-{last}/{len(body)}"
            body, status = body[first : last + 1], 206
        headers["Content-Length"] = str(len(body))
        headers.update(served.headers)
        self.send_response(status, served.reason)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _IndexServer(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Served]


def _html_page(files: dict[str, bytes], names: dict[str, str] | None = None) -> bytes:
    """A PEP 503 page linking each file with its sha256 (its shown name from `names`)."""
    links = "".join(
        f'<a href="../../files/{name}#sha256={hashlib.sha256(data).hexdigest()}">'
        f"{(names or {}).get(name, name)}</a><br/>\n"
        for name, data in files.items()
    )
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()


def _json_page(files: dict[str, bytes]) -> bytes:
    listed = [
        {"filename": name, "url": f"../../files/{name}",
         "hashes": {"sha256": hashlib.sha256(data).hexdigest()}}
        for name, data in files.items()
    ]  # fmt: skip
    return json.dumps({"meta": {"api-version": "1.0"}, "files": listed}).encode()


JSON = "application/vnd.pypi.simple.v1+json"


class Index:
    """The loopback index: /simple/<project>/ pages and /files/<name>."""

    def __init__(self, server: _IndexServer, sglang: dict[str, bytes], flashinfer: bytes):
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self.good = (sglang, flashinfer)
        self.reset()

    @property
    def simple(self) -> str:
        return f"{self.url}/simple"

    def file_url(self, name: str) -> str:
        return f"{self.url}/files/{name}"

    def reset(self) -> None:
        """Every page and file as the good index serves them."""
        self.sglang, self.flashinfer = self.good
        self._route()

    def _route(self) -> None:
        routes = {"/simple/sglang/": Served(_html_page(self.sglang), "text/html")}
        routes["/simple/flashinfer-python/"] = Served(
            _html_page({FLASHINFER_WHEEL: self.flashinfer}), "text/html"
        )
        for name, data in {**self.sglang, FLASHINFER_WHEEL: self.flashinfer}.items():
            routes[f"/files/{name}"] = Served(data)
        self.server.routes = routes

    def page(self, project: str, body: bytes, content_type: str = "text/html") -> None:
        self.server.routes[f"/simple/{project}/"] = Served(body, content_type)

    def file(self, name: str, served: Served) -> None:
        self.server.routes[f"/files/{name}"] = served

    def release(self, data: bytes) -> None:
        """The new sglang release as `data`, the page giving its sha256."""
        self.sglang = {**self.sglang, NEW: data}
        self._route()

    def flashinfer_wheel(self, data: bytes) -> None:
        self.flashinfer = data
        self._route()


def _serve() -> _IndexServer:
    server = _IndexServer(("127.0.0.1", 0), _Index)
    server.routes = {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- wheels, and zips that lie --------------------------------------------------------------


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = method
            archive.writestr(info, data)
    return buffer.getvalue()


def _directory_entry(data: bytes, name: str) -> int:
    """The offset of `name`'s central directory entry."""
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + length] == name.encode():
            return at
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(name)


def _patched(data: bytes, name: str, fmt: str, offset: int, value: int) -> bytes:
    """`data` with a field of `name`'s central directory entry rewritten (offsets as in
    APPNOTE 4.3.12: 8 flags, 10 method, 16 CRC, 24 size)."""
    at = _directory_entry(data, name) + offset
    return data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt) :]


def _declaring(data: bytes, sizes: dict[str, int]) -> bytes:
    """`data` whose central directory declares each named member `sizes[name]` bytes."""
    for name, size in sizes.items():
        data = _patched(data, name, "<L", 24, size)
    return data


def _with_directory_size(data: bytes, size: int) -> bytes:
    """`data` whose end record declares a table of contents of `size` bytes."""
    at = len(data) - 22
    assert data[at : at + 4] == b"PK\x05\x06"
    return data[: at + 12] + struct.pack("<L", size) + data[at + 16 :]


def _with_zip64_directory_size(data: bytes, size: int) -> bytes:
    """`data` with zip64 end records before its end record, declaring `size` bytes."""
    at = len(data) - 22
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, size, 0)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    return data[:at] + record + locator + data[at:]


def _sglang_release(version: str, metadata: str | bytes | None = None, **more: bytes) -> bytes:
    text = metadata if metadata is not None else (
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
        "Requires-Dist: flashinfer_python==0.7.2\nRequires-Dist: torch==2.14.1\n"
    )  # fmt: skip
    data = text.encode() if isinstance(text, str) else text
    return _zip({f"sglang-{version}.dist-info/METADATA": data, "sglang/__init__.py": b"", **more})


def _generator_stubs() -> dict[str, bytes]:
    """A module for each generator sm120 lists, defining it to take any arguments."""
    modules: dict[str, str] = {}
    for generator in load_target(REPO_ROOT, "sm120").jit_modules:
        module, function, _ = split_generator(generator)
        path = module.replace(".", "/") + ".py"
        modules[path] = modules.get(path, "") + f"def {function}(*args, **kwargs):\n    pass\n"
    return {path: text.encode() for path, text in modules.items()}


def _flashinfer_wheel(commit: str, **replaced: bytes | None) -> bytes:
    members: dict[str, bytes | None] = {
        BUILD_META: f'__version__ = "0.7.2"\n__git_commit__ = "{commit}"\n'.encode(),
        FLASHINFER_METADATA: b"Metadata-Version: 2.1\nName: flashinfer-python\n"
        b"Version: 0.7.2\nRequires-Dist: numpy\n",
        **_generator_stubs(),
        **replaced,
    }
    return _zip({name: data for name, data in members.items() if data is not None})


# -- the data copy -------------------------------------------------------------------------


def _set(pin: Path, **fields: str) -> None:
    text = pin.read_text()
    for key, value in fields.items():
        text, count = re.subn(rf'(?m)^{key} = ".*"', f'{key} = "{value}"', text)
        assert count == 1, key
    pin.write_text(text)


def _data(root: Path, pinned: Path, flashinfer_commit: str, series: bool) -> Path:
    """images/ and forks/, sglang pinned to `pinned` (file name OLD; sha256 and commit as
    builder's import makes them), FlashInfer to v0.7.1 of the loopback git; the sglang
    series kept (`series`) or emptied (it is for the real release)."""
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, root / folder)
    data = pinned.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    commit = import_wheel(pygit2.init_repository(root / "import", bare=True), pinned, sha256)
    _set(root / "forks/sglang/pin.toml", ref=OLD, sha256=sha256, commit=commit, version="0.5.22")
    _set(root / "forks/flashinfer/pin.toml", ref="refs/tags/v0.7.1", commit=flashinfer_commit,
         version="0.7.1")  # fmt: skip
    if not series:
        for patch in (root / "forks/sglang/patches/sm120").iterdir():
            patch.unlink()
    return root


@dataclass
class Stack:
    index: Index
    git: dict[str, str]  # FlashInfer's commits
    mirrors: dict[str, str]  # the Builder's mirror and BUILDER_MIRRORS
    data: Path

    def builder(self, root: Path) -> Builder:
        data = root / "data"
        for folder in ("images", "forks"):
            shutil.copytree(self.data / folder, data / folder)
        return Builder(data, root / "cache", self.mirrors["mirror"], root / "wh",
                       env={**TARGET, "BUILDER_MIRRORS": self.mirrors["git"]})  # fmt: skip


def _stack(root: Path, sglang: dict[str, bytes], series: bool) -> Iterator[Stack]:
    git = flashinfer_tags(root / "github")
    daemon, served = start_git_daemon(root / "github")
    server = _serve()
    index = Index(server, sglang, _flashinfer_wheel(git["v0.7.2"]))
    pinned = root / OLD
    pinned.write_bytes(sglang[OLD])
    mirrors = {"mirror": f"https://pypi.org/simple={index.simple}",
               "git": f"https://github.com/={served}"}  # fmt: skip
    try:
        yield Stack(index, git, mirrors, _data(root / "data", pinned, git["v0.7.1"], series))
    finally:
        server.shutdown()
        server.server_close()
        daemon.terminate()


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Iterator[Stack]:
    sglang = {OLD: _sglang_release("0.5.22"), NEW: _sglang_release("0.5.23")}
    yield from _stack(tmp_path_factory.mktemp("stand-in"), sglang, series=False)


@pytest.fixture
def index(stand_in: Stack) -> Iterator[Index]:
    stand_in.index.reset()
    yield stand_in.index
    stand_in.index.reset()


def _refusal(stack: Stack, root: Path, code: int = 1, *options: str) -> str:
    """The last line of `upstream check` on the stand-in stack, which must fail with `code`."""
    result = stack.builder(root).run("upstream", "check", "--no-lock", *options, check=False)
    assert "internal error" not in result.stderr, result.stderr
    assert result.returncode == code, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("page", ["html", "json"])
def test_the_stand_in_index_is_read_to_the_parser(
    stand_in: Stack, index: Index, tmp_path: Path, page: str
) -> None:
    """Untouched, the stand-in index passes every read below: pages (PEP 503 HTML or PEP
    691 JSON), both releases, the FlashInfer wheel and its tag; the check stops where the
    stand-in has no parser."""
    if page == "json":
        index.page("sglang", _json_page(index.sglang), JSON)
    line = _refusal(stand_in, tmp_path)
    assert line.startswith("error: sglang 0.5.23: its argument parser: "), line


# -- project pages --------------------------------------------------------------------------

PAGE = "error: index {simple}: its page for {project} is not a PEP 503/691 project page: {why}"


def _page_refused(stand_in: Stack, tmp_path: Path, why: str, project: str = "sglang") -> None:
    expected = PAGE.format(simple=stand_in.index.simple, project=project, why=why)
    assert _refusal(stand_in, tmp_path) == expected


@pytest.mark.parametrize(
    ("body", "content_type", "why"),
    [
        (b"{not json", JSON,
         "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        (b"[" * 100_000, JSON, "its JSON is nested too deeply"),
        (b'{"files": {"sglang-0.5.23.whl": {}}}', JSON, 'its JSON has no "files" list'),
        (b'{"files": [{"filename": 7, "url": "x.whl"}]}', JSON,
         'a "files" entry is not {"filename": TEXT, "url": TEXT, ...}'),
        (b'{"files": [{"filename": "x.whl", "url": "x.whl", "hashes": ["sha256"]}]}', JSON,
         'the "hashes" of x.whl are no object'),
        (b'{"files": [{"filename": "x.whl", "url": "x.whl", "hashes": {"sha256": "beef"}}]}',
         JSON, "it gives x.whl the sha256 'beef', not one"),
        (b'<a href="x.whl#sha256=' + b"g" * 64 + b'">x.whl</a>', "text/html",
         f"it gives x.whl the sha256 '{'g' * 64}', not one"),
        (b'<a href="x.whl">\xff.whl</a>', "text/html", "not UTF-8 (byte 16)"),
        # html.parser spends minutes on 40 kB of this; read in one pass, it is one line.
        (b"<a " * 300_000, "text/html", "the <a> tag at character 0 is not closed"),
        (b'<a href="x.whl">x.whl', "text/html", "the <a> at character 0 has no </a>"),
        (b"<!-- <a href=x.whl>x.whl</a>", "text/html", "the comment at character 0 is not closed"),
        (b'<a href="x.whl">sglang-0.5.23\x1b[2K\rclean.whl</a>', "text/html",
         "it lists 'sglang-0.5.23\\x1b[2K\\x0dclean.whl', which is no file name"),
        (b'<a href="x.whl">../../../etc/cron.d/sglang-0.5.23.whl</a>', "text/html",
         "it lists '../../../etc/cron.d/sglang-0.5.23.whl', which is no file name"),
        (b'<a href="x.whl">' + b"s" * 300 + b".whl</a>", "text/html",
         f"it lists '{'s' * 199}…', which is no file name"),
        (b'<a href="a.whl#sha256=' + b"a" * 64 + b'">x.whl</a><a href="a.whl#sha256=' + b"b" * 64
         + b'">x.whl</a>', "text/html", "it lists x.whl twice, with another URL or sha256"),
        (b'<a href="file:///etc/passwd">x.whl</a>', "text/html",
         "it gives x.whl the URL 'file:///etc/passwd', not http(s)"),
        (b'<a href="http://[::1/x.whl">x.whl</a>', "text/html",
         "it gives x.whl the URL 'http://[::1/x.whl'"),
        (b"".join(b'<a href="f%d.whl">f%d.whl</a>' % (n, n) for n in range(50_001)), "text/html",
         "it lists more than 50,000 files"),
    ],
    ids=["not-json", "json-nested", "json-files-not-a-list", "json-filename-not-text",
         "json-hashes-not-an-object", "json-bad-sha256", "html-bad-sha256", "html-not-utf8",
         "html-unclosed-tags", "html-no-closing-anchor", "html-unclosed-comment",
         "name-with-escapes", "name-with-a-path", "name-too-long", "one-name-twice",
         "file-url", "unparseable-url", "too-many-files"],
)  # fmt: skip
def test_a_page_that_is_no_project_page_is_refused_in_one_line(
    stand_in: Stack, index: Index, tmp_path: Path, body: bytes, content_type: str, why: str
) -> None:
    index.page("sglang", body, content_type)
    _page_refused(stand_in, tmp_path, why)


def test_a_page_over_its_bound_is_not_read(stand_in: Stack, index: Index, tmp_path: Path):
    index.page("sglang", b"<!--" + b"x" * (16 << 20) + b"-->")
    line = _refusal(stand_in, tmp_path)
    assert line == (
        f"error: index {index.simple}: {index.simple}/sglang/ answered more than {16 << 20} bytes"
    )


def test_flashinfer_s_page_is_held_to_the_same(stand_in: Stack, index: Index, tmp_path: Path):
    index.page("flashinfer-python", b'{"files": null}', JSON)
    _page_refused(stand_in, tmp_path, 'its JSON has no "files" list', "flashinfer-python")


def test_two_files_of_one_release_are_refused(stand_in: Stack, index: Index, tmp_path: Path):
    """`SGLang-0.5.23-…` and `sglang-0.5.23-…`: the same release for the same Python and
    platform, which builder would take is not clear."""
    files = {**index.sglang, f"SGLang-0.5.23-{TAGS}.whl": index.sglang[NEW]}
    index.page("sglang", _html_page(files))
    assert _refusal(stand_in, tmp_path) == (
        f"error: index {index.simple}: offers two files of sglang 0.5.23 for the pinned Python "
        f"and platform ({NEW}, SGLang-0.5.23-{TAGS}.whl): not clear which"
    )


def test_files_of_another_project_or_a_rebuild_are_not_taken(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    """`evil-0.9.0-…` on sglang's page, and `sglang-0.9.0-1-…` (a build tag, which parses as
    any text): newer than 0.5.23, neither is an sglang release builder takes."""
    files = {**index.sglang, f"evil-0.9.0-{TAGS}.whl": b"", f"sglang-0.9.0-1[x]-{TAGS}.whl": b""}
    index.page("sglang", _html_page(files))
    line = _refusal(stand_in, tmp_path)
    assert line.startswith("error: sglang 0.5.23: its argument parser: "), line


def test_a_failed_check_writes_its_reason_into_the_markdown(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    """--markdown FILE holds the reason too (the weekly workflow's issue body), Markdown and
    escapes from the index made inert."""
    index.page("sglang", b'<a href="x.whl">[click](https://evil.example)\x1b[2J.whl</a>')
    report = tmp_path / "report.md"
    line = _refusal(stand_in, tmp_path, 1, "--markdown", str(report))
    assert "\x1b" not in line
    reason = line.removeprefix("error: ")
    assert report.read_text() == (
        f"**sm120: upstream check failed**\n\n{markdown_inert(reason, 1000)}\n\n"
        "Made by `builder upstream check`.\n"
    )
    assert "[click](" not in report.read_text()


# -- the new sglang release -----------------------------------------------------------------


def test_a_release_that_declares_more_than_builder_downloads_is_not_downloaded(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    index.file(NEW, Served(index.sglang[NEW], headers={"Content-Length": str(3 * GiB)}))
    assert _refusal(stand_in, tmp_path) == (
        f"error: {tmp_path / 'data/forks/sglang/pin.toml'}: {index.file_url(NEW)} declares "
        "3,221,225,472 bytes, over the 2048 MiB builder downloads of a release: not used"
    )


@pytest.mark.parametrize(
    ("release", "why"),
    [
        (_sglang_release("0.5.23", **{"sglang/zeros.bin": bytes(2 << 20)}),
         "sglang/zeros.bin declares 2,097,152 bytes from {compressed} compressed, more than "
         "200 to 1: not read"),
        (_sglang_release("0.5.23", **{"sglang/\x1b[2Jx.py": b""}),
         "member 'sglang/\\x1b[2Jx.py' is no path inside the archive"),
        (_sglang_release("0.5.23", **{"sglang/../../x.py": b""}),
         "member 'sglang/../../x.py' is no path inside the archive"),
        (_sglang_release("0.5.23", **{"sglang/.git/config": b""}),
         "member 'sglang/.git/config' is inside a .git folder"),
        (b"<html>503 Service Unavailable</html>",
         "not a wheel (no zip end record in its last bytes)"),
        (_with_directory_size(_sglang_release("0.5.23"), 0xFFFFFF00),
         "its zip table of contents declares 4,294,967,040 bytes, over the 8 MiB builder "
         "reads: not read"),
        (_declaring(_sglang_release("0.5.23", **{f"sglang/{n}.bin": b"" for n in range(9)}),
                    {f"sglang/{n}.bin": GiB - 1 for n in range(9)}),
         "its members declare 9,663,676,527 bytes, over the 8 GiB builder imports: not used"),
    ],
    ids=["zip-bomb-member", "member-name-with-escapes", "member-outside", "member-in-git",
         "not-a-zip", "table-of-contents-lies", "members-declare-too-much"],
)  # fmt: skip
def test_a_release_whose_files_are_hostile_is_not_imported(
    stand_in: Stack, index: Index, tmp_path: Path, release: bytes, why: str
) -> None:
    """The sha256 matches (the index gives the hostile file's own): the import refuses it."""
    index.release(release)
    if "{compressed}" in why:
        with zipfile.ZipFile(io.BytesIO(release)) as archive:
            why = why.format(compressed=f"{archive.getinfo('sglang/zeros.bin').compress_size:,}")
    assert _refusal(stand_in, tmp_path) == f"error: {NEW}: {why}"


def test_a_member_with_no_valid_time_is_not_imported(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    release = _sglang_release("0.5.23")
    at = _directory_entry(release, "sglang/__init__.py")
    date = struct.unpack_from("<H", release, at + 14)[0] & ~(0xF << 5)  # month 0
    index.release(release[: at + 14] + struct.pack("<H", date) + release[at + 16 :])
    assert _refusal(stand_in, tmp_path) == (
        f"error: {NEW}: member 'sglang/__init__.py' has no valid time (2026, 0, 1, 0, 0, 0)"
    )


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        (b"Metadata-Version: 2.1\nName: sglang\n\xff\xfe\n", "its METADATA is not UTF-8 (byte 35)"),
        (b"Metadata-Version: 2.1\nName: sglang\nRequires-Dist: flash infer ==\n",
         "METADATA has a Requires-Dist that is no requirement (Expected semicolon "
         "(after name with no version specifier) or end)"),
    ],
    ids=["not-utf8", "no-requirement"],
)  # fmt: skip
def test_a_release_whose_metadata_is_hostile_is_refused(
    stand_in: Stack, index: Index, tmp_path: Path, metadata: bytes, why: str
) -> None:
    index.release(_sglang_release("0.5.23", metadata))
    assert _refusal(stand_in, tmp_path) == f"error: {NEW}: {why}"


# -- FlashInfer's wheel, read by range requests ---------------------------------------------


def _wheel_refused(stand_in: Stack, tmp_path: Path, why: str, code: int = 1) -> None:
    url = stand_in.index.file_url(FLASHINFER_WHEEL)
    assert _refusal(stand_in, tmp_path, code) == f"error: flashinfer-python 0.7.2: {url}{why}"


@pytest.mark.parametrize(
    ("wheel", "why"),
    [
        (lambda c: b"<html>Not Found</html>", ": not a wheel (no zip end record in its last bytes)"),
        # The review's 4 MB on the wire that asked for 4.1 GiB: the end record's size.
        (lambda c: _with_directory_size(_flashinfer_wheel(c), 0xFFFFFF00),
         ": its zip table of contents declares 4,294,967,040 bytes, over the 8 MiB builder "
         "reads: not read"),
        (lambda c: _with_zip64_directory_size(_flashinfer_wheel(c), 1 << 40),
         ": its zip table of contents declares 1,099,511,627,776 bytes, over the 8 MiB builder "
         "reads: not read"),
        (lambda c: _patched(_flashinfer_wheel(c), BUILD_META, "<L", 24, 0xFFFFFF00),
         f": {BUILD_META} declares 4,294,967,040 bytes, over the 4,194,304 builder reads of one "
         "member: not read"),
        (lambda c: _patched(_flashinfer_wheel(c), BUILD_META, "<H", 10, 99),
         f": cannot read {BUILD_META} (That compression method is not supported)"),
        (lambda c: _patched(_flashinfer_wheel(c), BUILD_META, "<H", 8, 1),
         f": {BUILD_META} is encrypted: not read"),
        (lambda c: _patched(_flashinfer_wheel(c), BUILD_META, "<L", 16, 0),
         f": cannot read {BUILD_META} (Bad CRC-32 for file '{BUILD_META}')"),
        (lambda c: _flashinfer_wheel(c, **{FLASHINFER_METADATA: b"\xffName: x\n"}),
         f": {FLASHINFER_METADATA} is not UTF-8 (byte 0)"),
        (lambda c: _flashinfer_wheel(c, **{FLASHINFER_METADATA: None}),
         ": no .dist-info/METADATA: not a wheel"),
        (lambda c: _flashinfer_wheel(c, **{"x.dist-info/METADATA": b"Name: x\n"}),
         ": 2 .dist-info/METADATA: not a wheel"),
        (lambda c: _flashinfer_wheel(c, **{FLASHINFER_METADATA: b"Name: x\n\n" + b"\n" * (3 << 20)}),
         f": {FLASHINFER_METADATA} declares 3,145,737 bytes from {{compressed}} compressed, "
         "more than 200 to 1: not read"),
        (lambda c: _flashinfer_wheel(c, **{FLASHINFER_METADATA: b"Requires-Dist: numpy >>= 1\n"}),
         ": METADATA has a Requires-Dist that is no requirement (Expected semicolon "
         "(after name with no version specifier) or end)"),
        (lambda c: _flashinfer_wheel(c, **{"flashinfer/jit/mla.py": b"x = " + b"-" * 100_000 + b"1\n"}),
         ": flashinfer/jit/mla.py: nested too deeply to parse"),
    ],
    ids=["not-a-zip", "table-of-contents-lies", "zip64-table-of-contents-lies",
         "member-size-lies", "unknown-compression", "encrypted", "bad-crc", "metadata-not-utf8",
         "no-metadata", "two-metadata", "zip-bomb-metadata", "metadata-no-requirement",
         "module-nested-too-deeply"],
)  # fmt: skip
def test_a_hostile_flashinfer_wheel_is_refused_in_one_line(
    stand_in: Stack, index: Index, tmp_path: Path, wheel, why: str
) -> None:
    data = wheel(stand_in.git["v0.7.2"])
    index.flashinfer_wheel(data)
    if "{compressed}" in why:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            compressed = archive.getinfo(FLASHINFER_METADATA).compress_size
        why = why.format(compressed=f"{compressed:,}")
    _wheel_refused(stand_in, tmp_path, why)


def test_a_name_that_is_not_utf8_is_no_wheel(stand_in: Stack, index: Index, tmp_path: Path):
    data = _flashinfer_wheel(stand_in.git["v0.7.2"], **{"flashinfer/x.py": b""})
    at = _directory_entry(data, "flashinfer/x.py")
    data = data[: at + 46] + b"\xff" + data[at + 47 :]  # the name's first byte
    flags = struct.unpack_from("<H", data, at + 8)[0] | 0x800  # "the name is UTF-8"
    index.flashinfer_wheel(data[: at + 8] + struct.pack("<H", flags) + data[at + 10 :])
    _wheel_refused(
        stand_in, tmp_path,
        ": not a wheel ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"Content-Range": "bytes 0-99/*"}, " answered a range without the file's size"),
        ({"Content-Range": "bytes 0-99/10000000000"},
         " is 10,000,000,000 bytes, over the 2048 MiB builder reads"),
        ({"Content-Range": "bytes 0-9/10"},
         " answered bytes 0-9 of 10 with {size} bytes for the file's last 65634"),
    ],
    ids=["no-size", "absurd-size", "range-is-not-the-end"],
)  # fmt: skip
def test_a_range_answer_that_lies_is_refused(
    stand_in: Stack, index: Index, tmp_path: Path, headers: dict[str, str], why: str
) -> None:
    index.file(FLASHINFER_WHEEL, Served(index.flashinfer, headers=headers))
    _wheel_refused(stand_in, tmp_path, why.format(size=len(index.flashinfer)))


def test_a_wheel_served_whole_is_bounded_by_what_it_declares(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    index.file(
        FLASHINFER_WHEEL,
        Served(index.flashinfer, ranges=False, headers={"Content-Length": str(3 * GiB)}),
    )
    _wheel_refused(
        stand_in,
        tmp_path,
        " declares 3,221,225,472 bytes, over the 2048 MiB builder reads: not read",
    )


def test_a_reason_phrase_with_escapes_is_shown_escaped(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    index.file(FLASHINFER_WHEEL, Served(b"gone", status=404, reason="Gone\x1b]0;pwned\x07"))
    _wheel_refused(stand_in, tmp_path, " answered 404 Gone\\x1b]0;pwned\\x07")


def test_a_broken_chunked_answer_is_could_not_check(
    stand_in: Stack, index: Index, tmp_path: Path
) -> None:
    """A body that is not HTTP (a chunk size that is no number): exit 9, the URL named."""
    index.file(
        FLASHINFER_WHEEL,
        Served(b"zz\r\nbroken", headers={"Transfer-Encoding": "chunked", "Content-Length": ""}),
    )
    url = index.file_url(FLASHINFER_WHEEL)
    line = _refusal(stand_in, tmp_path, 9)
    assert line.startswith(f"error: flashinfer-python 0.7.2: {url} broke off its answer ("), line


# -- FlashInfer's commit: the git tag's, the wheel must agree -------------------------------


def test_a_flashinfer_without_its_tag_is_refused(stand_in: Stack, index: Index, tmp_path: Path):
    """The release pins FlashInfer 0.7.3 and the index has its wheel, but FlashInfer's git has
    no tag v0.7.3: the wheel's commit cannot be checked, and is not taken."""
    wheel = "flashinfer_python-0.7.3-py3-none-any.whl"
    metadata = "Metadata-Version: 2.1\nName: sglang\nRequires-Dist: flashinfer_python==0.7.3\n"
    index.release(_sglang_release("0.5.23", metadata))
    index.page("flashinfer-python", _html_page({wheel: index.flashinfer}))
    index.file(wheel, Served(index.flashinfer))
    git = stand_in.mirrors["git"].split("=", 1)[1]
    assert _refusal(stand_in, tmp_path) == (
        f"error: flashinfer 0.7.3: {git}flashinfer-ai/flashinfer.git has no tag v0.7.3, so "
        "the commit of its released wheel cannot be checked"
    )


def test_a_pinned_ref_that_moved_is_found_with_the_commit_cached(tmp_path: Path) -> None:
    """`builder sources` fetched FlashInfer's v0.7.1; upstream moves the tag to another
    commit: the next run refuses, though the pinned commit is in the cache."""
    git = flashinfer_tags(tmp_path / "github")
    daemon, served = start_git_daemon(tmp_path / "github")
    try:
        pinned = tmp_path / OLD
        pinned.write_bytes(_sglang_release("0.5.22"))
        data = _data(tmp_path / "data", pinned, git["v0.7.1"], series=False)
        builder = Builder(data, tmp_path / "cache", "https://pypi.org/simple=http://127.0.0.1:9/",
                          tmp_path / "wh",
                          env={**TARGET, "BUILDER_MIRRORS": f"https://github.com/={served}"})  # fmt: skip
        builder.run("sources", "--upstream", "flashinfer")
        bare = tmp_path / "github/flashinfer-ai/flashinfer.git"
        move_tag(bare, "v0.7.1", git["later"])
        moved = builder.run("sources", "--upstream", "flashinfer", check=False)
    finally:
        daemon.terminate()
    assert moved.returncode == 1, moved.stderr
    assert moved.stderr.strip().splitlines()[-1] == (
        f"error: {data / 'forks/flashinfer/pin.toml'}: refs/tags/v0.7.1 at "
        f"{served}flashinfer-ai/flashinfer.git is commit {git['later']}, the pin says "
        f"{git['v0.7.1']}"
    )
    # Offline (the daemon gone) with the pinned commit cached: built, the ref said unchecked.
    offline = builder.run("sources", "--upstream", "flashinfer", check=False)
    assert offline.returncode == 0, offline.stderr
    assert "building the pinned commit from the cache, refs/tags/v0.7.1 unchecked" in " ".join(
        offline.stderr.split()
    )


def _hostile_release(real: Path, into: Path) -> Path:
    """The real release with one more reasoning parser name, HOSTILE_CHOICE (stored, not
    compressed: quick to write)."""
    names = "sglang/srt/parser/reasoning_parser_names.py"
    with zipfile.ZipFile(real) as source, zipfile.ZipFile(into, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == names:
                text = data.decode()
                assert '    "glm45",\n' in text
                literal = HOSTILE_CHOICE.encode("unicode_escape").decode()
                data = text.replace('    "glm45",\n', f'    "glm45",\n    "{literal}",\n').encode()
            info.compress_type = zipfile.ZIP_STORED
            copy.writestr(info, data)
    return into


@pytest.fixture(scope="module")
def real_stack(tmp_path_factory) -> Iterator[Stack]:
    """The real sglang 0.5.23 pinned as OLD, moved to a copy naming HOSTILE_CHOICE too; the
    real series (it applies on both); FlashInfer 0.7.1 -> 0.7.2 on the loopback git."""
    root = tmp_path_factory.mktemp("real-stack")
    real = fetch_release_file("sglang", NEW)
    sglang = {OLD: real.read_bytes(), NEW: _hostile_release(real, root / NEW).read_bytes()}
    yield from _stack(root, sglang, series=True)


@pytest.fixture(scope="module")
def real_cache(real_stack: Stack, tmp_path_factory) -> Path:
    """A cache holding both releases imported (one first check), to seed each test's."""
    root = tmp_path_factory.mktemp("real-cache")
    real_stack.builder(root).run("upstream", "check", "--no-lock", "--json", check=False)
    return root / "cache"


def _real_builder(stack: Stack, cache: Path, root: Path) -> Builder:
    builder = stack.builder(root)
    seed_cache(builder, cache, folders=("mirrors", "releases"))
    return builder


def _commit_all(data: Path) -> None:
    repo = pygit2.init_repository(data)
    repo.index.add_all()
    repo.index.write()
    who = pygit2.Signature("test", "test@example.invalid", 0, 0)
    repo.create_commit("HEAD", who, who, "data", repo.index.write_tree(), [])


def test_a_wheel_naming_another_commit_than_the_tag_needs_review(
    real_stack: Stack, real_cache: Path, tmp_path: Path
) -> None:
    """FlashInfer moves 0.7.1 -> 0.7.2 with no patches of its own: its new commit is read
    from the git tag, and a released wheel whose _build_meta.py names another is a review
    item; the move is refused for it."""
    git = real_stack.git
    real_stack.index.flashinfer_wheel(_flashinfer_wheel(git["later"]))
    try:
        builder = _real_builder(real_stack, real_cache, tmp_path)
        checked = builder.run("upstream", "check", "--no-lock", "--json", check=False)
        report = json.loads(checked.stdout)
        assert checked.returncode == 7, checked.stderr
        expected = (
            f"flashinfer v0.7.2 is commit {git['v0.7.2'][:12]}, its released wheel names "
            f"{git['later'][:12]}"
        )
        assert report["review"] == [expected]
        assert report["pins"]["flashinfer"]["to"]["commit"] == git["v0.7.2"]
        assert report["pins"]["flashinfer"]["to"]["wheel_commit"] == git["later"]
        _commit_all(builder.data_dir)
        moved = builder.run("upstream", "move", "--to", "sglang==0.5.23", "--no-lock", check=False)
    finally:
        real_stack.index.reset()
    assert moved.returncode == 7
    assert moved.stderr.strip().splitlines()[-1] == f"error: needs review: {expected}"


def test_outside_text_reaches_the_terminal_report_and_commit_escaped(
    real_stack: Stack, real_cache: Path, tmp_path: Path
) -> None:
    """The new release's parser offers HOSTILE_CHOICE: the table shows it escaped, the
    Markdown inert, the move's commit message escaped; FlashInfer is pinned to its tag's
    commit, which the wheel names too."""
    builder = _real_builder(real_stack, real_cache, tmp_path)
    report = tmp_path / "report.md"
    table = builder.run("upstream", "check", "--no-lock", "--markdown", str(report))
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout
    assert "clean, ready for" in " ".join(table.stdout.split())
    change = f"--reasoning-parser: choices + {HOSTILE_CHOICE}"
    markdown = report.read_text()
    assert f"| changed: {markdown_inert(change, 1000)} | info |" in markdown
    assert "[click](" not in markdown and "\x1b" not in markdown

    _commit_all(builder.data_dir)
    builder.run("upstream", "move", "--to", "sglang==0.5.23", "--no-lock")
    message = pygit2.Repository(builder.data_dir).head.peel(pygit2.Commit).message
    assert "\x1b" not in message and "\x07" not in message
    assert f"  sm120 glm5-nvfp4-tp8: {printable(change)}\n" in message
    git = real_stack.git
    assert (
        f"  flashinfer 0.7.1 -> 0.7.2: refs/tags/v0.7.2 (commit {git['v0.7.2']}; "
        f"{FLASHINFER_WHEEL} names the same)\n"
    ) in message
    pin = tomllib.loads((builder.data_dir / "forks/flashinfer/pin.toml").read_text())
    assert (pin["ref"], pin["commit"], pin["version"]) == (
        "refs/tags/v0.7.2", git["v0.7.2"], "0.7.2",
    )  # fmt: skip
