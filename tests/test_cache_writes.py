"""Writes into the cache, wheelhouse and manifest folders from concurrent builder runs."""

from __future__ import annotations

import threading
from pathlib import Path

from builder.cache import atomic_copy, atomic_write_text


def test_concurrent_writers_of_one_file_all_finish_and_leave_one_whole_file(
    tmp_path: Path,
) -> None:
    """Two `builder image` runs copy the same kernel wheel and write the same manifest
    folder: each writer has its own temporary name (a shared `.partial` name made one of
    them fail with FileNotFoundError), and the result is one writer's whole file."""
    destination = tmp_path / "wheelhouse" / "flashinfer_jit_cache.whl"
    sources = []
    for number in range(8):
        source = tmp_path / f"source-{number}"
        source.write_bytes(bytes([number]) * 200_000)
        sources.append(source)
    errors: list[BaseException] = []

    def write(number: int) -> None:
        try:
            for _ in range(25):
                atomic_copy(sources[number], destination)
                atomic_write_text(destination.with_suffix(".json"), f"{number}\n" * 1000)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    data = destination.read_bytes()
    assert len(data) == 200_000 and len(set(data)) == 1
    assert len(set(destination.with_suffix(".json").read_text().split())) == 1
    assert sorted(p.name for p in destination.parent.iterdir()) == [
        destination.with_suffix(".json").name,
        destination.name,
    ]
    assert oct(destination.stat().st_mode & 0o777) == "0o644"
