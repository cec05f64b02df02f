"""Writing a wheel whose bytes depend only on its files: fixed member times and modes,
sorted members, RECORD written by `wheel`'s WheelFile (the same hashes pip checks)."""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wheel.wheelfile import WheelFile

ZIP_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can hold


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


def write_wheel(path: Path, files: dict[str, tuple[bytes, int]], epoch: int = ZIP_EPOCH) -> None:
    """`path` (named as a wheel: WheelFile reads name and version from it) holding `files`
    ({member: (bytes, mode)}) and their RECORD, every member stamped `epoch`."""
    epoch = max(epoch, ZIP_EPOCH)
    stamp = time.gmtime(epoch)[:6]
    with _source_date_epoch(epoch), WheelFile(path, "w") as archive:
        for name in sorted(files):
            data, mode = files[name]
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
