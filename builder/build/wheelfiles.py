"""Writing a wheel whose bytes depend only on its files: fixed member times and modes,
sorted members, RECORD written by `wheel`'s WheelFile (the same hashes pip checks). A member
may come as another archive's deflate stream (`Deflated`), written as it is: a repack of a
release keeps its unchanged files' streams instead of compressing them again."""

from __future__ import annotations

import hashlib
import os
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from wheel.wheelfile import WheelFile, urlsafe_b64encode

ZIP_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can hold


@dataclass(frozen=True)
class Deflated:
    """A member's raw deflate stream and what it inflates to (its CRC-32, size and sha256),
    checked by whoever took it from its archive."""

    stream: bytes
    crc: int
    size: int
    sha256: bytes

    @classmethod
    def of(cls, stream: bytes, data: bytes) -> Deflated:
        return cls(stream, zipfile.crc32(data), len(data), hashlib.sha256(data).digest())


@contextmanager
def _source_date_epoch(epoch: int) -> Iterator[None]:
    """WheelFile stamps RECORD with SOURCE_DATE_EPOCH when it is set, else with now."""
    saved = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = str(epoch)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["SOURCE_DATE_EPOCH"]
        else:
            os.environ["SOURCE_DATE_EPOCH"] = saved


def write_wheel(
    path: Path, files: dict[str, tuple[bytes | Deflated, int]], epoch: int = ZIP_EPOCH
) -> None:
    """`path` (named as a wheel: WheelFile reads name and version from it) holding `files`
    ({member: (bytes or a Deflated stream, mode)}) and their RECORD, every member stamped
    `epoch`."""
    epoch = max(epoch, ZIP_EPOCH)
    stamp = time.gmtime(epoch)[:6]
    with _source_date_epoch(epoch), WheelFile(path, "w") as archive:
        for name in sorted(files):
            data, mode = files[name]
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            if isinstance(data, Deflated):
                _write_deflated(archive, info, data)
            else:
                archive.writestr(info, data)


def copyable(size: int) -> bool:
    """Whether a member of `size` bytes can be written as a Deflated stream: one writestr
    gives no zip64 header (zipfile's own rule)."""
    return size * 1.05 <= zipfile.ZIP64_LIMIT


def _write_deflated(archive: WheelFile, info: zipfile.ZipInfo, member: Deflated) -> None:
    """What `archive.writestr(info, data)` writes for data that deflates to `member.stream`:
    the local header, the stream, the table of contents entry and the RECORD line. zipfile
    has no call that takes a compressed stream, so this does its steps (3.10-3.14's
    `_open_to_write` and `_ZipWriteFile.close`, seekable and without zip64)."""
    if not copyable(member.size) or len(member.stream) > zipfile.ZIP64_LIMIT:
        raise ValueError(f"{info.filename}: a member this large is not copied as a stream")
    info.flag_bits = 0
    info.CRC, info.file_size, info.compress_size = member.crc, member.size, len(member.stream)
    archive.fp.seek(archive.start_dir)
    info.header_offset = archive.fp.tell()
    archive._writecheck(info)
    archive._didModify = True
    archive.fp.write(info.FileHeader(False))
    archive.fp.write(member.stream)
    archive.filelist.append(info)
    archive.NameToInfo[info.filename] = info
    archive.start_dir = archive.fp.tell()
    archive._file_hashes[info.filename] = ("sha256", urlsafe_b64encode(member.sha256).decode())
    archive._file_sizes[info.filename] = member.size
