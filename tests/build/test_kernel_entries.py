"""A kernel entry is data from a shared cache, so the warm-up's reuse decision trusts none
of it: the entry must be for the lookup key being served and record every source the
module compiles. `decide()` is the image's own (images/sm120/jit_warmup.py); what runs here
is only the decision, on real entry files, with no FlashInfer installed."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture
def warmup(tmp_path: Path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "jit_warmup", REPO_ROOT / "images/sm120/jit_warmup.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    monkeypatch.setattr(module, "workspace_dir", lambda: str(workspace))
    return module, workspace


def _entry(warmup, out: Path, lookup: str, inputs: dict[str, str], claimed: str | None = None):
    module, _ = warmup
    library = out.parent / "norm.so"
    library.write_bytes(b"native code from whoever could push to the registry")
    record = {
        "schema_version": module.ENTRY_SCHEMA,
        "name": "norm",
        "lookup": claimed or lookup,
        "inputs": inputs,
        "key": module.content_key(claimed or lookup, inputs),
        "sha256": hashlib.sha256(library.read_bytes()).hexdigest(),
    }
    path = module.write_entry(out, record, library)
    return path.rename(out / path.name.replace(claimed or lookup, lookup, 1))


def test_an_honest_entry_with_unchanged_inputs_is_reused(warmup, tmp_path: Path) -> None:
    module, workspace = warmup
    source = workspace / "norm.cu"
    source.write_text("__global__ void k() {}\n")
    spec = SimpleNamespace(name="norm", sources=[source])
    inputs = {module.portable(str(source)): module.sha256(source)}
    _entry(warmup, tmp_path / "entries", "a" * 64, inputs)
    record, library, why = module.decide(spec, "a" * 64, tmp_path / "entries")
    assert record is not None and why == "reuse: its 1 inputs are unchanged"
    assert library.startswith(b"native code")


@pytest.mark.parametrize(
    ("forge", "named"),
    [
        ("no inputs", "records no inputs"),  # "0 inputs unchanged" used to mean reuse
        ("other lookup", "is for another lookup key"),
        ("missing source", "does not record its source"),
    ],
)
def test_a_forged_entry_is_compiled_again_and_named(
    warmup, tmp_path: Path, capsys, forge: str, named: str
) -> None:
    module, workspace = warmup
    source = workspace / "norm.cu"
    source.write_text("__global__ void k() {}\n")
    header = workspace / "norm.cuh"
    header.write_text("// header\n")
    spec = SimpleNamespace(name="norm", sources=[source])
    lookup = "a" * 64
    inputs = {
        "no inputs": {},
        "other lookup": {module.portable(str(source)): module.sha256(source)},
        "missing source": {module.portable(str(header)): module.sha256(header)},
    }[forge]
    claimed = "b" * 64 if forge == "other lookup" else None
    _entry(warmup, tmp_path / "entries", lookup, inputs, claimed)
    record, library, why = module.decide(spec, lookup, tmp_path / "entries")
    assert record is None and library == b""
    assert why.startswith("compile: entry ") and named in why
    assert named in capsys.readouterr().out  # the warm-up's warning names the entry


def test_signatures_verify_only_with_a_trusted_key(tmp_path: Path, monkeypatch) -> None:
    """A registry entry is used only with a signature by a key the site trusts: the
    site's own verifies, another's or a changed byte does not."""
    from builder.build.kernels import trust as kernel_trust

    site_key, site_public = kernel_trust.generate(tmp_path / "site")
    other_key, _ = kernel_trust.generate(tmp_path / "other")
    assert site_key.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(site_key))
    monkeypatch.setenv(kernel_trust.TRUSTED_KEYS_ENV, str(site_public))
    entry = b"entry.json and norm.so"
    signature = kernel_trust.sign(kernel_trust.signing_key(), entry)
    trusted = kernel_trust.trusted_keys()
    assert kernel_trust.verify(trusted, entry, signature)
    assert not kernel_trust.verify(trusted, entry + b"!", signature)
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(other_key))
    assert not kernel_trust.verify(
        trusted, entry, kernel_trust.sign(kernel_trust.signing_key(), entry)
    )
    assert not kernel_trust.verify([], entry, signature)


def test_a_bad_key_file_is_one_line_naming_it(tmp_path: Path, monkeypatch) -> None:
    from builder.build.kernels import trust as kernel_trust
    from builder.core.errors import BuilderError

    keys = tmp_path / "trusted.pub"
    keys.write_text("# site keys\nnot-base64!!\n")
    monkeypatch.setenv(kernel_trust.TRUSTED_KEYS_ENV, str(keys))
    with pytest.raises(BuilderError, match=rf"{keys}:2: not a base64 ed25519 public key"):
        kernel_trust.trusted_keys()
    huge = tmp_path / "huge.key"
    huge.write_bytes(b"x" * (1 << 20))
    monkeypatch.setenv(kernel_trust.SIGNING_KEY_ENV, str(huge))
    with pytest.raises(BuilderError, match="not a key file"):
        kernel_trust.signing_key()
