"""A zip (a wheel) an index served, read within bounds.

zipfile believes what the archive says: the size of its table of contents (one read of that
many bytes: 4 GiB asked of a 4 MB file), each member's size (decompressed whole into
memory), and it raises a dozen kinds of exception on a broken file. Here the table's size
is read from the archive's end and refused over DIRECTORY_LIMIT before zipfile reads it; a
member is refused where it declares more bytes than its reader takes or decompresses at an
absurd ratio, and read with a bound whatever it declared; every failure is one BuilderError
naming the file and the member.
"""

from __future__ import annotations

import lzma
import struct
import zipfile
import zlib
from typing import IO

from builder.core.errors import BuilderError
from builder.core.untrusted import printable

DIRECTORY_LIMIT = 8 << 20  # bytes of a table of contents: sglang 0.5.23's (6,396 files) is 0.7 MB
# A member larger than this decompresses at most RATIO_LIMIT times its compressed size: real
# wheels stay under 30 (sglang 0.5.23's most compressible file, a JSON table, is 28).
RATIO_LIMIT = 200
RATIO_FLOOR = 1 << 20
# The last bytes of a zip that hold its end records: the end of central directory record
# (22 bytes and a comment of up to 64 KiB) and, before it, zip64's locator and record.
END_BYTES = (1 << 16) + 22 + 20 + 56
# What zipfile raises on a broken archive or member: a bad signature, CRC or offset, a
# truncated file, an unknown compression method, an encrypted member, damaged deflate,
# bzip2 (OSError) or lzma data, a name that is not UTF-8.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    EOFError,
    ValueError,
    struct.error,
    OverflowError,
    NotImplementedError,
    RuntimeError,
    OSError,
    zlib.error,
    lzma.LZMAError,
)
_ENCRYPTED = 0x1  # general purpose flag bit 0
_END = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_END = b"PK\x06\x06"


def directory_size(end: bytes) -> int | None:
    """The size of the table of contents the end records in `end` (a zip's last END_BYTES
    or fewer) declare, found where zipfile finds them; None when there are none."""
    at = len(end) - 22
    if not (at >= 0 and end[at : at + 4] == _END and end[-2:] == b"\0\0"):
        at = end.rfind(_END, max(0, len(end) - (1 << 16) - 22))
        if at < 0 or len(end) - at < 22:
            return None
    size = struct.unpack_from("<L", end, at + 12)[0]
    locator = at - 20
    if locator >= 0 and end[locator : locator + 4] == _ZIP64_LOCATOR:
        record = locator - 56
        if record >= 0 and end[record : record + 4] == _ZIP64_END:
            size = struct.unpack_from("<Q", end, record + 40)[0]
    return size


def open_archive(source: IO[bytes], end: bytes, where: str) -> zipfile.ZipFile:
    """`source` (whose last bytes are `end`) as a ZipFile, its table of contents bounded."""
    size = directory_size(end)
    if size is None:
        raise BuilderError(f"{where}: not a wheel (no zip end record in its last bytes)")
    if size > DIRECTORY_LIMIT:
        raise BuilderError(
            f"{where}: its zip table of contents declares {size:,} bytes, over the "
            f"{DIRECTORY_LIMIT >> 20} MiB builder reads: not read"
        )
    try:
        return zipfile.ZipFile(source)
    except ZIP_ERRORS as exc:
        raise BuilderError(f"{where}: not a wheel ({printable(exc)})") from None


def check_member(info: zipfile.ZipInfo, limit: int, where: str) -> None:
    """Refuse a member that declares more than `limit` bytes, or a large one whose declared
    size is more than RATIO_LIMIT times its compressed size (a zip bomb), or is encrypted."""
    name = printable(info.filename)
    if info.flag_bits & _ENCRYPTED:
        raise BuilderError(f"{where}: {name} is encrypted: not read")
    if info.file_size > limit:
        raise BuilderError(
            f"{where}: {name} declares {info.file_size:,} bytes, over the {limit:,} builder "
            "reads of one member: not read"
        )
    if info.file_size > RATIO_FLOOR and info.file_size > RATIO_LIMIT * max(info.compress_size, 1):
        raise BuilderError(
            f"{where}: {name} declares {info.file_size:,} bytes from {info.compress_size:,} "
            f"compressed, more than {RATIO_LIMIT} to 1: not read"
        )


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, where: str) -> bytes:
    """A member's bytes: checked (check_member), then read with `limit` as the bound whatever
    the member declared."""
    check_member(info, limit, where)
    try:
        with archive.open(info) as member:
            data = member.read(limit + 1)
    except ZIP_ERRORS as exc:
        name = printable(info.filename)
        raise BuilderError(f"{where}: cannot read {name} ({printable(exc)})") from None
    if len(data) > limit:  # zipfile stops at the declared size: here only if that changes
        raise BuilderError(f"{where}: {printable(info.filename)} is over {limit:,} bytes")
    return data
