"""A few members of a wheel on a package index, read without downloading the whole file.

A wheel is a zip: its table of contents is at the end, each member's bytes at an offset it
names. `open_wheel` reads the table with one HTTP range request and then only the members
asked for (FlashInfer 0.7.2's wheel is 65 MB; its `_build_meta.py` and METADATA take about
1.4 MB of requests). A server that ignores ranges (it answers 200 with the whole file) is
read to the end instead, into a temporary file. What is read this way is information for a
report (a commit, a requirement, a function's signature), not an input to a build: nothing
is checked against the file's sha256 here, and whatever it names is verified where it is
used (`builder upstream check` holds the commit against FlashInfer's git tag).

Everything the wheel and its server say is bounded (builder.build.zip_bounds): the file's size,
its table of contents, each member read (MEMBER_LIMIT, strict UTF-8).
"""

from __future__ import annotations

import http.client
import io
import re
import tempfile
import urllib.error
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from builder.build.zip_bounds import END_BYTES, open_archive, read_member
from builder.core import http_client
from builder.core.errors import BuilderError, Unreachable
from builder.core.untrusted import printable
from builder.core.urls import redact

_TIMEOUT_S = 60
_BLOCK = 1 << 18  # later reads, in blocks: a member's header and data take one request
WHEEL_LIMIT = 2 << 30  # bytes of a wheel, read by ranges or whole: FlashInfer's is 65 MB
MEMBER_LIMIT = 4 << 20  # bytes of one member read: FlashInfer 0.7.2's largest module is 1.2 MB
_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
# The first request may be answered with the whole file (no ranges): up to WHEEL_LIMIT at
# about 1.2 MB/s. A range request has http_client's deadline (10 reads' timeouts).
_WHOLE_DEADLINE_S = 30 * 60


@contextmanager
def _get(url: str, what: str, byte_range: str | None, deadline: float | None = None):
    headers = {"Range": f"bytes={byte_range}"} if byte_range else {}
    try:
        with http_client.open_url(
            url, what, headers=headers, timeout=_TIMEOUT_S, deadline=deadline
        ) as response:
            yield response
    except urllib.error.HTTPError as exc:
        raise BuilderError(
            f"{what}: {printable(redact(url))} answered {exc.code} {printable(exc.reason)}"
        ) from None


def read_answer(response, size: int, url: str, what: str) -> bytes:
    """Up to `size` bytes of an answer's body; a connection that breaks off or a body that
    is not HTTP (a broken chunk) is Unreachable, with the URL, not an internal error."""
    try:
        return response.read(size)
    except (OSError, http.client.HTTPException, ValueError) as exc:  # a chunk size no number
        raise Unreachable(
            f"{what}: {printable(redact(url))} broke off its answer ({printable(exc)})"
        ) from None


class _Ranges(io.RawIOBase):
    """A remote file as a seekable binary file, one range request per read."""

    def __init__(self, url: str, what: str, size: int, tail: bytes) -> None:
        self.url, self.what, self.size = url, what, size
        self.position = 0
        self.tail = tail  # the file's last bytes, already read
        self.requested = 0  # bytes asked for, the first request included

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        end = min(self.position + len(buffer), self.size)
        if end <= self.position:
            return 0
        tail_start = self.size - len(self.tail)
        if self.position >= tail_start:
            data = self.tail[self.position - tail_start : end - tail_start]
        else:
            with _get(self.url, self.what, f"{self.position}-{end - 1}") as response:
                if response.status != 206:
                    raise BuilderError(
                        f"{self.what}: {printable(redact(self.url))} stopped serving ranges"
                    )
                # a server's extra bytes: not read
                data = read_answer(response, end - self.position, self.url, self.what)
            self.requested += len(data)
        if not data:
            return 0
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


@dataclass
class RemoteWheel:
    """A wheel's members by name, each read within MEMBER_LIMIT as UTF-8 text."""

    archive: zipfile.ZipFile
    where: str  # "flashinfer-python 0.7.2: URL", for errors

    @property
    def names(self) -> list[str]:
        return self.archive.namelist()

    def text(self, name: str) -> str | None:
        """A member's text, or None when the wheel has no such file."""
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            return None
        data = read_member(self.archive, info, MEMBER_LIMIT, self.where)
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise BuilderError(
                f"{self.where}: {printable(name)} is not UTF-8 (byte {exc.start})"
            ) from None


def _ranged(response, url: str, what: str) -> tuple[io.IOBase, bytes]:
    """The file behind a 206 answer to `bytes=-END_BYTES`: (a seekable reader, its end)."""
    shown = printable(redact(url))
    answered = _RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    if answered is None:
        raise BuilderError(f"{what}: {shown} answered a range without the file's size")
    first, last, size = (int(n) for n in answered.groups())
    if size > WHEEL_LIMIT:
        raise BuilderError(
            f"{what}: {shown} is {size:,} bytes, over the {WHEEL_LIMIT >> 20} MiB builder reads"
        )
    tail = read_answer(response, END_BYTES, url, what)
    if last != size - 1 or last - first + 1 != len(tail):
        raise BuilderError(
            f"{what}: {shown} answered bytes {first}-{last} of {size} with {len(tail)} "
            f"bytes for the file's last {END_BYTES}"
        )
    ranges = _Ranges(url, what, size, tail)
    ranges.requested = len(tail)
    return io.BufferedReader(ranges, _BLOCK), tail


def _whole(response, url: str, what: str) -> tuple[io.IOBase, bytes]:
    """The file of a 200 answer, spooled to a temporary file: (it, its end)."""
    declared = (response.headers.get("Content-Length") or "").strip()
    if declared.isdigit() and int(declared) > WHEEL_LIMIT:
        raise BuilderError(
            f"{what}: {printable(redact(url))} declares {int(declared):,} bytes, over the "
            f"{WHEEL_LIMIT >> 20} MiB builder reads: not read"
        )
    spooled = tempfile.TemporaryFile(prefix="builder-wheel-")  # noqa: SIM115
    try:
        for block in iter(lambda: read_answer(response, 1 << 20, url, what), b""):
            spooled.write(block)
            if spooled.tell() > WHEEL_LIMIT:
                raise BuilderError(
                    f"{what}: {printable(redact(url))} serves no ranges and is over "
                    f"{WHEEL_LIMIT >> 20} MiB: not read"
                )
        spooled.seek(-min(spooled.tell(), END_BYTES), io.SEEK_END)
        end = spooled.read()
        spooled.seek(0)
    except BaseException:
        spooled.close()
        raise
    return spooled, end


@contextmanager
def open_wheel(url: str, what: str) -> Iterator[RemoteWheel]:
    """The wheel at `url`, its members fetched as they are read."""
    with _get(url, what, f"-{END_BYTES}", _WHOLE_DEADLINE_S) as response:
        if response.status == 206:
            source, end = _ranged(response, url, what)
        else:  # no ranges here: the whole file, once
            source, end = _whole(response, url, what)
    where = f"{what}: {printable(redact(url))}"
    try:
        with open_archive(source, end, where) as archive:
            yield RemoteWheel(archive, where)
    finally:
        source.close()
