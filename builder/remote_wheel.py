"""A few members of a wheel on a package index, read without downloading the whole file.

A wheel is a zip: its table of contents is at the end, each member's bytes at an offset it
names. `open_wheel` reads the table with one HTTP range request and then only the members
asked for (FlashInfer 0.7.2's wheel is 65 MB; its `_build_meta.py` and METADATA take about
1.4 MB of requests). A server that ignores ranges (it answers 200 with the whole file) is
read to the end instead, into a temporary file. What is read this way is information for a
report (a commit, a requirement, a function's signature), not an input to a build: nothing
is checked against the file's sha256 here, and whatever it names is verified where it is
used (`builder sources` fetches and checks the commit).
"""

from __future__ import annotations

import io
import re
import tempfile
import urllib.error
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

from builder import http_client
from builder.errors import BuilderError
from builder.urls import redact

_TIMEOUT_S = 60
# The first request may be answered with the whole file (no ranges): up to _WHOLE_LIMIT at
# about 1.2 MB/s. A range request has http_client's deadline (10 reads' timeouts).
_WHOLE_DEADLINE_S = 30 * 60
_TAIL = 1 << 16  # the first request: the end of the file (the zip's table of contents)
_BLOCK = 1 << 18  # later reads, in blocks: a member's header and data take one request
_WHOLE_LIMIT = 2 << 30  # a wheel read whole (no ranges): FlashInfer's is 65 MB
_TOTAL = re.compile(r"bytes \d+-\d+/(\d+)")


@contextmanager
def _get(url: str, what: str, byte_range: str | None, deadline: float | None = None):
    headers = {"Range": f"bytes={byte_range}"} if byte_range else {}
    try:
        with http_client.open_url(
            url, what, headers=headers, timeout=_TIMEOUT_S, deadline=deadline
        ) as response:
            yield response
    except urllib.error.HTTPError as exc:
        raise BuilderError(f"{what}: {redact(url)} answered {exc.code} {exc.reason}") from None


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
                    raise BuilderError(f"{self.what}: {redact(self.url)} stopped serving ranges")
                data = response.read(end - self.position)  # a server's extra bytes: not read
            self.requested += len(data)
        if not data:
            return 0
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


@contextmanager
def open_wheel(url: str, what: str) -> Iterator[zipfile.ZipFile]:
    """The wheel at `url` as a ZipFile whose members are fetched as they are read."""
    with _get(url, what, f"-{_TAIL}", _WHOLE_DEADLINE_S) as response:
        total = _TOTAL.match(response.headers.get("Content-Range", ""))
        if response.status == 206 and total:
            tail = response.read(_TAIL)
            ranges = _Ranges(url, what, int(total.group(1)), tail)
            ranges.requested = len(tail)
            source: io.IOBase = io.BufferedReader(ranges, _BLOCK)
        elif response.status == 206:
            raise BuilderError(f"{what}: {redact(url)} answered a range without the file's size")
        else:  # no ranges here: the whole file, once
            spooled = tempfile.TemporaryFile(prefix="builder-wheel-")  # noqa: SIM115
            for block in iter(lambda: response.read(1 << 20), b""):
                spooled.write(block)
                if spooled.tell() > _WHOLE_LIMIT:
                    spooled.close()
                    raise BuilderError(
                        f"{what}: {redact(url)} serves no ranges and is over "
                        f"{_WHOLE_LIMIT >> 20} MiB: not read"
                    )
            spooled.seek(0)
            source = spooled  # closed below, with the archive
    try:
        try:
            archive = zipfile.ZipFile(source)
        except zipfile.BadZipFile as exc:
            raise BuilderError(f"{what}: {redact(url)} is not a wheel ({exc})") from None
        with archive:
            yield archive
    finally:
        source.close()


def read_member(archive: zipfile.ZipFile, name: str) -> str | None:
    """A member's text, or None when the wheel has no such file."""
    try:
        return archive.read(name).decode("utf-8", errors="replace")
    except KeyError:
        return None
