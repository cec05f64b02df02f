"""Which kernel entries and cached kernel wheels a host uses: each entry's signature, kept
beside it, is checked against the keys trusted *today* every time the entry is brought to a
kernel build (builder/build/kernels/trust.py, cache.py, build.py); entries and wheels that fail
are one warning line and made again. Real entry files, real keys; no engine (the same rules
through `builder image` on the real engine: tests/build/test_kernels_shared.py)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.build.kernels import build as kernel_build
from builder.build.kernels import cache as kernel_cache
from builder.build.kernels import trust as kernel_trust
from builder.build.wheels import BuiltWheel
from builder.core.errors import BuilderError

LOOKUP = "a" * 64


@pytest.fixture
def keys(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """The site's pair, another site pair and this host's state folder (its host key)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    site_key, site_public = kernel_trust.generate(tmp_path / "site")
    other_key, other_public = kernel_trust.generate(tmp_path / "other")
    monkeypatch.setenv(kernel_trust.TRUSTED_KEYS_ENV, str(site_public))
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(site_key))
    return {
        "site": site_key,
        "site.pub": site_public,
        "other": other_key,
        "other.pub": other_public,
    }


def _entry_bytes(name: str = "norm", key: str = "b" * 64) -> bytes:
    buffer = io.BytesIO()
    body = json.dumps({"key": key, "lookup": LOOKUP, "name": name}).encode()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member, data in (("entry.json", body), (f"{name}.so", b"\x7fELF native code")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _compiled_here(tmp_path: Path, cache: Path, trust, key: str = "b" * 64) -> Path:
    """An entry as this host's kernel build leaves it (keep: into the cache, signed)."""
    out = tmp_path / f"out-{key[:4]}"
    out.mkdir(exist_ok=True)
    entry = out / f"{LOOKUP}.{key[:16]}{kernel_cache.ENTRY_SUFFIX}"
    entry.write_bytes(_entry_bytes(key=key))
    kernel_cache.keep([entry], cache, _no_registry(trust), trust)
    return kernel_cache.local_dir(cache) / entry.name


def _no_registry(trust) -> kernel_cache.SharedKernels:
    return kernel_cache.SharedKernels(None, None, trust)  # type: ignore[arg-type]


def _gather(cache: Path, into: Path) -> tuple[dict, dict]:
    trust = kernel_trust.load()
    return kernel_cache.gather([LOOKUP], cache, _no_registry(trust), trust, into)


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]


def test_an_entry_compiled_here_is_signed_and_used(keys, tmp_path: Path, capsys) -> None:
    cache = tmp_path / "cache"
    entry = _compiled_here(tmp_path, cache, kernel_trust.load())
    signature = json.loads(Path(f"{entry}.sig").read_text())
    site = kernel_trust.signing_key().public_key()
    assert signature["signer"] == kernel_trust.public_text(site), "the site's key signs"
    found, signers = _gather(cache, tmp_path / "in")
    assert found == {LOOKUP: "local"} and signers == {entry.name: signature["signer"]}
    assert (tmp_path / "in" / entry.name).read_bytes() == entry.read_bytes()
    assert _warnings(capsys) == []


def test_an_entry_signed_by_a_key_since_removed_is_not_used(
    keys, tmp_path: Path, monkeypatch, capsys
) -> None:
    cache = tmp_path / "cache"
    entry = _compiled_here(tmp_path, cache, kernel_trust.load())
    # The site rotates its key: the old one is no longer in the trusted file.
    monkeypatch.setenv(kernel_trust.TRUSTED_KEYS_ENV, str(keys["other.pub"]))
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(keys["other"]))
    found, signers = _gather(cache, tmp_path / "in")
    assert found == {LOOKUP: "refused"} and signers == {}
    assert not list((tmp_path / "in").iterdir()), "nothing of it reaches the kernel build"
    (line,) = _warnings(capsys)
    assert f"kernel entry {entry} is signed by a key (" in line
    assert "not trusted now: not used, its module compiles here" in line


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("flip a byte", "does not match its signature (changed since it was signed)"),
        ("drop the signature", "has no signature"),
        ("garble the signature", "has an unreadable signature"),
        ("link it", "is a symbolic link"),
        ("not a tar", "is not a kernel entry (no tar with an entry.json)"),
        ("a folder", "is not a regular file"),
        ("too large", "is larger than 1024 bytes"),
    ],
)
def test_a_damaged_or_foreign_local_entry_is_refused_in_one_line(
    keys, tmp_path: Path, monkeypatch, capsys, damage: str, why: str
) -> None:
    cache = tmp_path / "cache"
    entry = _compiled_here(tmp_path, cache, kernel_trust.load())
    signature = Path(f"{entry}.sig")
    if damage == "flip a byte":
        data = bytearray(entry.read_bytes())
        data[data.index(b"native")] ^= 0xFF
        entry.write_bytes(bytes(data))
    elif damage == "drop the signature":
        signature.unlink()
    elif damage == "garble the signature":
        signature.write_text("{")
    elif damage == "link it":
        entry.unlink()
        entry.symlink_to("/dev/zero")
    elif damage == "not a tar":
        entry.write_bytes(b"not a tar at all")
    elif damage == "a folder":
        entry.unlink()
        entry.mkdir()
    else:
        monkeypatch.setattr(kernel_cache, "ENTRY_LIMIT", 1024)
    capsys.readouterr()
    found, _ = _gather(cache, tmp_path / "in")
    assert found == {LOOKUP: "refused"}
    (line,) = _warnings(capsys)
    assert f"kernel entry {entry} {why}" in line


def test_a_cache_restored_from_another_host_is_compiled_again_with_one_line(
    keys, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A host without a site signing key signs what it compiles with its own key, kept out
    of the cache: restored onto another host, those entries are not used there."""
    monkeypatch.delenv(kernel_trust.SIGNING_KEY_ENV)
    monkeypatch.delenv(kernel_trust.TRUSTED_KEYS_ENV)  # no site keys at all
    cache = tmp_path / "cache"
    trust = kernel_trust.load()
    first = _compiled_here(tmp_path, cache, trust, key="b" * 64)
    _compiled_here(tmp_path, cache, trust, key="c" * 64)
    assert _gather(cache, tmp_path / "in")[0] == {LOOKUP: "local"}, "this host's own: used"
    capsys.readouterr()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another-host"))
    found, _ = _gather(cache, tmp_path / "in2")
    assert found == {LOOKUP: "refused"}
    (line,) = _warnings(capsys)
    assert f"kernel entry {first} is signed by a key (" in line
    assert line.endswith("(and 1 more local entries not used)")


def test_the_host_key_is_made_once_outside_the_cache(keys, tmp_path: Path) -> None:
    from builder.core.settings import kernel_host_key

    path = kernel_host_key()
    assert path.is_relative_to(tmp_path / "state")
    first = kernel_trust.host_key()
    assert path.stat().st_mode & 0o777 == 0o600
    assert kernel_trust.public_text(kernel_trust.host_key().public_key()) == (
        kernel_trust.public_text(first.public_key())
    )
    path.write_text("garbage")
    with pytest.raises(BuilderError, match=rf"kernel host key {path}: not an ed25519 PEM key"):
        kernel_trust.host_key()


def _wheel(folder: Path, tag: str) -> BuiltWheel:
    filename = f"flashinfer_jit_cache-0.7.2+k{tag}-py3-none-linux_x86_64.whl"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_bytes(f"wheel {tag}".encode())
    from builder.core.cache import sha256_file

    return BuiltWheel(
        name="kernels", dist_name="flashinfer-jit-cache", version=f"0.7.2+k{tag}",
        filename=filename, sha256=sha256_file(folder / filename), size=8,
        cache_key=f"0.7.2+k{tag}", cached=False, path=folder / filename,
    )  # fmt: skip


def test_a_cached_kernel_wheel_is_used_only_while_its_signers_are_trusted(
    keys, tmp_path: Path, monkeypatch, capsys
) -> None:
    cache = tmp_path / "cache"
    trust = kernel_trust.load()
    site = kernel_trust.public_text(kernel_trust.signing_key().public_key())
    kept = kernel_build.remember_wheel(cache, "s" * 64, _wheel(tmp_path, "1"), [site], trust)
    assert kernel_build.cached_wheel(cache, "s" * 64, trust) == BuiltWheel(
        **{**kept.__dict__, "cached": True}
    )
    monkeypatch.setenv(kernel_trust.TRUSTED_KEYS_ENV, str(keys["other.pub"]))
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(keys["other"]))
    capsys.readouterr()
    assert kernel_build.cached_wheel(cache, "s" * 64, kernel_trust.load()) is None
    (line,) = _warnings(capsys)
    assert "holds kernels signed by a key (" in line and line.endswith(
        "not trusted now: made again"
    )
    # Restored onto another host (the record is signed by this host's key): not used either.
    monkeypatch.setenv(kernel_trust.TRUSTED_KEYS_ENV, str(keys["site.pub"]))
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(keys["site"]))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another-host"))
    assert kernel_build.cached_wheel(cache, "s" * 64, kernel_trust.load()) is None
    assert "is signed by another host's key" in _warnings(capsys)[0]


def _kernel_stage(cache: str, tag: str, started, results) -> None:
    """One `builder image` kernel stage (builder/build/image.py's own), with the kernel build
    itself standing in: it takes a second, and nvcc's bytes differ per run."""
    from builder.build import image

    def build(client, job, cache_dir, shared, trust, flashinfer, target_name, wheel_dir):
        started.set()
        time.sleep(1)
        return _wheel(Path(wheel_dir), tag), {"modules": []}, []

    image.kernel_build.build = build
    image._kernel_job = lambda *args: None
    wheel, _ = image._kernel_wheel(
        None, SimpleNamespace(name="sm120"), {"flashinfer": None},
        SimpleNamespace(kernel_registry=None), SimpleNamespace(stage_keys={"flashinfer": "s" * 64}),
        Path(cache), Path(cache),
    )  # fmt: skip
    results.put((tag, wheel.filename, wheel.cached))


def test_two_kernel_stages_at_once_leave_one_wheel_and_the_second_takes_it(
    keys, tmp_path: Path
) -> None:
    """Two `builder image` runs at once once left two kernel wheels in one stage folder, and
    the cache never hit again: the stage is one run at a time, the second takes the first's."""
    cache = tmp_path / "cache"
    cache.mkdir()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    first_started = context.Event()
    first = context.Process(target=_kernel_stage, args=(str(cache), "1", first_started, results))
    first.start()
    assert first_started.wait(30)
    second = context.Process(target=_kernel_stage, args=(str(cache), "2", context.Event(), results))
    second.start()
    for process in (first, second):
        process.join(60)
        assert process.exitcode == 0
    made = dict(
        (tag, (filename, cached)) for tag, filename, cached in (results.get(), results.get())
    )
    assert made["1"][1] is False and made["2"] == (made["1"][0], True)
    (folder,) = (cache / "kernel-wheels").iterdir()
    assert sorted(path.name for path in folder.iterdir()) == sorted(
        [made["1"][0], "wheel.json", "wheel.json.sig"]
    )
    assert not [p for p in (cache / "kernel-wheels").iterdir() if p.name.startswith(".")]
    assert os.path.exists(cache / "kernels.lock")
