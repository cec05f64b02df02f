"""A fuzz pass over what builder reads from outside: data files a site edits (pin.toml,
target.toml, profiles.toml), what a registry hands back (an image's launch label), what a
server answers (/server_info), receipts and a sweep's chosen.json read back (`--compare`,
`deploy-files --profile chosen`), a kernel pack copied from a VM, a kernel entry tar as the
kernel-builder container reads it. Each starts from the real file or answer and changes one
value at a time to another type, shape or text (hypothesis, a bounded number of examples
each): builder must answer with its own one-line error (BuilderError) or work, never with
a traceback, and never read without bound.

`BUILDER_FUZZ_EXAMPLES` raises the number of examples for a longer run (default: short).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.core.errors import BuilderError
from builder.site import deploy, readiness
from builder.spec import launch, launch_profiles, recipe
from builder.spec.target import load_fork, load_target
from tests.conftest import GOOD_INFO, REPO_ROOT

EXAMPLES = int(os.environ.get("BUILDER_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: a red CI run is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
IMAGE = "registry.example/ml/sglang-sm120@sha256:" + "a" * 64

_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x1b[2J", "a\nb", "../../etc", "{model}", "{nope}", "-1", "nan"]),
)
_SCALAR = st.one_of(
    _TEXT,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    """Every place in a parsed document where a value can be swapped or removed."""
    found = [at] if at else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*at, index))
    return found


@st.composite
def _mutated(draw, document: dict) -> dict:
    """`document` with one to three of its values replaced by any value, or removed, or a
    key added."""
    changed = copy.deepcopy(document)
    places = _paths(changed)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(places))
        parent = changed
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["replace", "remove", "add"]))
            if action == "remove":
                del parent[path[-1]]
            elif action == "add" and isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=12))] = draw(_VALUE)
            else:
                parent[path[-1]] = draw(_VALUE)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or replaced this place
    return changed


def _toml(document: dict) -> str | None:
    """TOML text for the document, or None where TOML cannot hold it (nan keys, None...)."""
    try:
        return tomlkit.dumps(document)
    except Exception:
        return None


def _exit_code(argv: list[str]) -> int:
    """builder's CLI in this process, as its console script ends: the exit code."""
    from builder.cli import main as cli

    try:
        return cli.main(argv)
    except SystemExit as done:  # a command's own verdict (a failed check: 1)
        return done.code if isinstance(done.code, int) else 1


def _refused_or_fine(call) -> None:
    try:
        call()
    except BuilderError as exc:
        message = str(exc)
        assert "\n" not in message.strip(), f"not one line: {message!r}"
    except RecursionError:
        pytest.fail("unbounded recursion on a data file")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-data")
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, root / folder)
    return root


def _real(path: str) -> dict:
    return tomllib.loads((REPO_ROOT / path).read_text())


def _read_as(data: Path, relative: str, document: dict, read) -> None:
    """`document` written as the data copy's file `relative`, `read` run on the copy, the
    file put back."""
    text = _toml(document)
    if text is None:
        return
    path = data / relative
    original = path.read_text()
    path.write_text(text)
    try:
        _refused_or_fine(read)
    finally:
        path.write_text(original)


@FUZZ
@given(document=_mutated(_real("forks/sglang/pin.toml")))
def test_pin_toml(data: Path, document: dict) -> None:
    _read_as(data, "forks/sglang/pin.toml", document, lambda: load_fork(data, "sglang"))


@FUZZ
@given(document=_mutated(_real("images/sm120/target.toml")))
def test_target_toml(data: Path, document: dict) -> None:
    _read_as(data, "images/sm120/target.toml", document, lambda: load_target(data, "sm120"))


def _every_profile(profiles: launch_profiles.Profiles) -> None:
    for name in profiles.profiles:
        recipe_ = launch.resolve(profiles, name, IMAGE, launch.Overrides())
        deploy.compose_file(recipe_)
        deploy.systemd_unit(recipe_, "/etc/sglang/x")


@FUZZ
@given(document=_mutated(_real("images/sm120/profiles.toml")))
def test_profiles_toml(data: Path, document: dict) -> None:
    _read_as(
        data,
        "images/sm120/profiles.toml",
        document,
        lambda: _every_profile(launch_profiles.Profiles.of(data / "images/sm120/x")),
    )


def _launch_label() -> dict:
    profiles, default = launch_profiles.load_profiles(REPO_ROOT / "images/sm120/target.toml")
    return {
        "schema_version": recipe.SCHEMA_VERSION,
        "target": {"name": "sm120", "description": "d", "cuda_version": "13.0.1",
                   "arch_list": ["12.0f"]},
        "profiles": {"default": default, "profiles": profiles},
    }  # fmt: skip


@FUZZ
@given(label=_mutated(_launch_label()))
def test_an_image_s_launch_label(label: dict) -> None:
    """What `launch --image` reads from a registry: checked, then resolved into files."""

    def use() -> None:
        facts = recipe.checked_facts(json.loads(json.dumps(label)), "label")
        _every_profile(recipe.profiles_of(facts, "ref"))

    _refused_or_fine(use)


@FUZZ
@given(info=_mutated({**GOOD_INFO, "internal_states": [{"avg_spec_accept_length": 3.1}]}))
def test_server_info(info: dict) -> None:
    """/server_info as wait-ready reads it: any JSON a server sends is a verdict's words."""
    body = json.dumps(info).encode()
    parsed = readiness._json_object(body)
    assert parsed is not None
    wrong = readiness.check_server_info(parsed, {key: GOOD_INFO[key] for key in GOOD_INFO})
    assert all(line.isprintable() for line in wrong)


@FUZZ
@given(body=st.binary(max_size=200) | st.sampled_from([b"[" * 20_000, b"{" * 20_000, b"1e999"]))
def test_server_info_bytes(body: bytes) -> None:
    parsed = readiness._json_object(body)
    assert parsed is None or isinstance(parsed, dict)


_SWEEP = REPO_ROOT / "bench/results/sweep-h200/sweep-gpu.json"


def _measured_receipt() -> dict:
    """A receipt qualify wrote on the lent H200 (bench/results/sweep-h200)."""
    return json.loads(_SWEEP.read_text())["runs"]["standin-mtp"]["receipt"]


@FUZZ
@given(receipt=_mutated(_measured_receipt()))
def test_receipts_compared(tmp_path_factory, receipt: dict) -> None:
    """`qualify --compare` over receipts (one as written, one changed): the CLI's answer is
    0 or a one-line error (1), never an internal error (2)."""
    folder = tmp_path_factory.mktemp("compare")
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    (folder / "a" / "receipt.json").write_text(json.dumps(_measured_receipt()))
    (folder / "b" / "receipt.json").write_text(json.dumps(receipt))
    code = _exit_code(
        [
            "qualify",
            "--compare",
            str(folder / "a"),
            str(folder / "b"),
            "--out",
            str(folder / "o"),
            "--json",
        ]
    )
    assert code in (0, 1)


@FUZZ
@given(doc=_mutated(json.loads((REPO_ROOT / "bench/results/sweep-h200/chosen.json").read_text())))
def test_a_sweep_s_chosen_json(tmp_path_factory, doc: dict) -> None:
    """What deploy-files --profile chosen and --compare read back from a sweep's folder."""
    from builder.site import sweep

    folder = tmp_path_factory.mktemp("chosen")
    (folder / sweep.CHOSEN_FILE).write_text(json.dumps(doc))

    def use() -> None:
        loaded = sweep.load_chosen(folder)
        sweep.summary(loaded)
        sweep.receipts_in(folder)

    _refused_or_fine(use)


_PACK = {
    "schema_version": 2,
    "flashinfer_version": "0.7.2+sm120.g104a5bf",
    "arch": "120f",
    "origin": "container sglang-glm5 on vm-1",
    "modules": {
        "fp4_gemm_cutlass_sm120": "flashinfer.jit.gemm:gen_gemm_sm120_module_cutlass_fp4()",
        "silu_and_mul": None,
    },
}


@FUZZ
@given(record=_mutated(_PACK))
def test_a_kernel_pack(tmp_path_factory, record: dict) -> None:
    """A pack `jit harvest` wrote on a VM and someone copied into the build host's cache:
    read by `builder image` (packs_for, harvested_modules); a bad one is moved aside."""
    from builder.spec.jit import packs

    folder = tmp_path_factory.mktemp("packs")
    try:
        name = f"flashinfer-x-y-{packs._record_key(record)}{packs.PACK_SUFFIX}"
    except (TypeError, ValueError):  # a record JSON cannot hold: not a file anyone can write
        return
    (folder / name).write_text(json.dumps(record))

    def use() -> None:
        found = packs.packs_for(folder, _PACK["flashinfer_version"], ("12.0f",))
        packs.harvested_modules(found)

    _refused_or_fine(use)


@functools.cache
def _warmup():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "jit_warmup_fuzzed", REPO_ROOT / "images/sm120/jit_warmup.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ENTRY = {
    "schema_version": 1, "name": "silu_and_mul", "lookup": "a" * 64, "key": "b" * 64,
    "sha256": "c" * 64, "inputs": {"csrc/activation.cu": "d" * 64},
}  # fmt: skip


@FUZZ
@given(
    record=_mutated(_ENTRY),
    library=st.binary(max_size=64),
    shape=st.sampled_from(["plain", "no-so", "so-is-a-link", "json-is-a-folder", "not-a-tar"]),
)
def test_a_kernel_entry_tar(tmp_path_factory, record: dict, library: bytes, shape: str) -> None:
    """An entry tar as the kernel-builder container reads it (images/sm120/jit_warmup.py):
    any content is an entry or a reason, never a crash of the warm-up."""
    import io
    import tarfile

    warmup = _warmup()
    folder = tmp_path_factory.mktemp("entry")
    path = folder / "x.kernel.tar"
    if shape == "not-a-tar":
        path.write_bytes(library or b"x")
    else:
        with tarfile.open(path, "w") as tar:
            body = json.dumps(record).encode()
            info = tarfile.TarInfo("entry.json")
            if shape == "json-is-a-folder":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            if shape == "so-is-a-link":
                link = tarfile.TarInfo("silu_and_mul.so")
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
                tar.addfile(link)
            elif shape != "no-so":
                so = tarfile.TarInfo("silu_and_mul.so")
                so.size = len(library)
                tar.addfile(so, io.BytesIO(library))
    found, _, why = warmup.read_entry(path, "silu_and_mul", None, ["csrc/activation.cu"])
    assert (found is None) == bool(why)
    if shape != "plain":
        assert found is None


_PROBE = json.loads((REPO_ROOT / "tests/data/p2p/healthy-8x-rtx-pro-6000/probe.json").read_text())


@FUZZ
@given(probe=_mutated(_PROBE))
def test_a_p2p_probe_document(tmp_path_factory, monkeypatch, probe: dict) -> None:
    """What `doctor --p2p` reads back from the probe in the image (or --probe-result FILE):
    judged, or one line; never an internal error (2)."""
    folder = tmp_path_factory.mktemp("probe")
    (folder / "probe.json").write_text(json.dumps(probe))
    monkeypatch.setenv("BUILDER_P2P_DIR", str(folder / "records"))
    code = _exit_code([
        "doctor", "--p2p", "--probe-result", str(folder / "probe.json"), "--target", "sm120",
        "--data-dir", str(REPO_ROOT), "--json",
    ])  # fmt: skip
    assert code in (0, 1, 9)
