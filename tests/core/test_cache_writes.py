"""Writes into the cache, wheelhouse and manifest folders from concurrent builder runs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from builder.core.cache import atomic_copy, atomic_write_text


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


def test_ctrl_c_inside_an_uninterrupted_step_lands_after_it() -> None:
    """`patches refresh` renames the series and then the pin: Ctrl-C between the two left
    the new series with the old pin. The interrupt now waits for the step's end."""
    import os
    import signal

    from builder.core.cache import uninterrupted

    # As an interactive shell starts it (a background job of a script inherits Ctrl-C
    # ignored: the test below).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt), uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("first rename")
            done.append("second rename")
        assert done == ["first rename", "second rename"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_process_that_ignores_ctrl_c_still_ignores_it_inside_an_uninterrupted_step() -> None:
    """Started with SIGINT ignored (`cmd &` in a script), Ctrl-C at the step's end
    must not stop builder: found when the whole suite ran as a background job."""
    import os
    import signal

    from builder.core.cache import uninterrupted

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        done = []
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("both renames")
        assert done == ["both renames"]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_durable_replace_leaves_the_new_bytes_under_the_old_name(tmp_path) -> None:
    from builder.core.cache import durable_replace

    old, new = tmp_path / "pin.toml", tmp_path / ".pin.toml.new"
    old.write_text("old\n")
    new.write_text("new\n")
    durable_replace(new, old)
    assert old.read_text() == "new\n" and not new.exists()
