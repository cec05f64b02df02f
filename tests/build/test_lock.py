"""The lock file format and the checks `builder image` and `builder lock --check` apply:
every mistake is one line naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest
from packaging.requirements import Requirement

from builder.build.sources import export_tree
from builder.core.errors import BuilderError
from builder.spec import lockfile

A, B = "a" * 64, "b" * 64


def _lock(text: str) -> lockfile.Lock:
    return lockfile.parse(Path("runtime-lock.txt"), text)


def test_pip_forms_of_hashes_and_continuations_parse() -> None:
    parsed = _lock(
        "# comment\n"
        f"foo==1.0 \\\n    --hash=sha256:{A.upper()} \\\n    --hash=sha256:{B}\n"
        f"bar==2.0\t--hash sha256:{A}  # why\n"
        "baz==3.0 --hash=sha512:" + "c" * 128 + "\n"
    )
    assert parsed.packages["foo"].hashes == (A, B)
    assert parsed.packages["foo"].line == 2
    assert parsed.packages["bar"].hashes == (A,)
    assert parsed.packages["baz"].pinned_by_hash and parsed.hashed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"foo==1 --hash=sha256:{A}\nfoo==2 --hash=sha256:{B}\n",
         "runtime-lock.txt:2: foo is listed twice (first at line 1)"),
        (f"foo==1 --hash=sha256:{A}\nbar>=1\n",
         "runtime-lock.txt:2: bar is not pinned with == and a --hash"),
        ("foo bar\n", "runtime-lock.txt:1: not a requirement: Expected"),
    ],
)  # fmt: skip
def test_bad_entries_are_one_line_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(BuilderError) as caught:
        _lock(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def _current(requirements: list[str], python: str = "3.12") -> lockfile.Lock:
    header = lockfile.header("sm120", python, "x86_64-manylinux_2_39", "https://pypi.org/simple",
                         requirements)  # fmt: skip
    return _lock(header + f"torch==2.9.1 --hash=sha256:{A}\nnumpy==2.1.0 --hash=sha256:{B}\n")


def _refuse(chosen: lockfile.Lock, requirements: list[str]) -> str:
    with pytest.raises(BuilderError) as caught:
        lockfile.refuse_stale(
            chosen, target="sm120", python="3.12", platform="x86_64-manylinux_2_39",
            requirements=[Requirement(r) for r in requirements],
        )  # fmt: skip
    return str(caught.value)


def test_a_current_lock_passes_and_each_kind_of_stale_lock_is_refused() -> None:
    wanted = ["numpy<3", "torch==2.9.1"]
    lockfile.refuse_stale(
        _current(wanted), target="sm120", python="3.12", platform="x86_64-manylinux_2_39",
        requirements=[Requirement(r) for r in wanted],
    )  # fmt: skip
    fix = "run `builder lock --target sm120` and review the change"
    assert _refuse(_current(wanted, python="3.11"), wanted) == (
        f"runtime-lock.txt: made for python 3.11, the target's is 3.12; {fix}"
    )
    assert _refuse(_current(wanted), ["numpy<2", "torch==2.9.1"]) == (
        f"runtime-lock.txt: stale lock: numpy<2 is not met by its numpy==2.1.0; {fix}"
    )
    assert _refuse(_current(wanted), [*wanted, "einops"]).startswith(
        "runtime-lock.txt: stale lock: einops is not in it"
    )
    # satisfied, but resolved from other requirements (one was dropped)
    assert "resolved from other requirements" in _refuse(_current(wanted), ["torch==2.9.1"])
    # a marker that is false for the image's Python does not make it stale
    assert "resolved from other" in _refuse(
        _current(wanted), [*wanted, 'einops; python_version < "3.10"']
    )


def test_an_excluded_package_is_refused_from_any_file() -> None:
    parsed = _lock("torch==2.9.1\nflashinfer-jit-cache==0.6.3\n")
    with pytest.raises(BuilderError) as caught:
        lockfile.refuse_excluded(parsed, ("flashinfer-jit-cache",))
    assert str(caught.value).startswith("runtime-lock.txt:2: lists flashinfer-jit-cache")


def test_export_names_a_submodule_that_is_not_checked_out(tmp_path: Path) -> None:
    """A gitlink with nothing behind it: one line, not a traceback or the parent's files."""
    repo = pygit2.init_repository(str(tmp_path / "repo"))
    builder = repo.TreeBuilder()
    builder.insert("vendored", pygit2.Oid(hex="1" * 40), pygit2.enums.FileMode.COMMIT)
    builder.insert("README", repo.create_blob(b"hi\n"), pygit2.enums.FileMode.BLOB)
    signature = pygit2.Signature("t", "t@t")
    commit = repo.create_commit("HEAD", signature, signature, "m", builder.write(), [])
    with pytest.raises(BuilderError) as caught:
        export_tree(repo, str(commit), tmp_path / "out")
    assert "submodule vendored at 111111111111 is not checked out" in str(caught.value)


def test_what_the_base_provides_is_the_bases_to_meet() -> None:
    """A lock made with --base-provides torch names it in its header; the target's torch pin
    is then not the lock's to satisfy, every other requirement still is."""
    inputs = ["numpy<3", "torch==2.9.1"]
    header = lockfile.header(
        "sm120", "3.12", "x86_64-manylinux_2_39", "https://pypi.org/simple", inputs, ("torch",)
    )
    assert "`builder lock --target sm120 --base-provides torch`" in header
    made = _lock(header + f"numpy==2.1.0 --hash=sha256:{B}\n")
    assert made.base_provides == ("torch",)
    assert made.record()["base_provides"] == ["torch"]
    environment = lockfile.target_environment("3.12", "x86_64-manylinux_2_39")
    assert lockfile.unmet(made, [Requirement(r) for r in inputs], environment) == []
    assert lockfile.unmet(made, [Requirement("numpy<2")], environment) == [
        "numpy<2 is not met by its numpy==2.1.0"
    ]
    assert _lock(f"numpy==2.1.0 --hash=sha256:{B}\n").base_provides == ()


def test_base_provides_leaves_it_out_with_what_only_it_requires(
    builder, runtime_index_served, current_stack_wheels: Path, tmp_path: Path
) -> None:
    """`builder lock --base-provides torch` against an index holding the test image's
    runtime wheels (`runtime_index_served`: downloaded once for the run) and PyPI's torch
    with its CUDA libraries: the test image's lock, torch and its 8 GB left out; without the
    option they are back."""
    from tests.services import (
        IMAGE_RUNTIME_LOCK,
        IMAGE_RUNTIME_REQUIREMENTS,
        TEST_PYTHON,
        runtime_wheelhouse,
        start_pypiserver,
    )

    process, port = start_pypiserver(
        [runtime_wheelhouse(), current_stack_wheels], tmp_path / "pypiserver.log"
    )
    made = {}
    try:
        for name, extra in (("base", ("--base-provides", "torch")), ("pypi", ())):
            out = tmp_path / f"{name}.txt"
            builder.run(
                "lock", "--runtime-requirements", str(IMAGE_RUNTIME_REQUIREMENTS),
                "--python-version", TEST_PYTHON, "--python-platform", "x86_64-manylinux_2_28",
                "--pip-index-url", f"http://127.0.0.1:{port}/simple/", "--pip-extra-index-url=",
                "--out", str(out), *extra,
            )  # fmt: skip
            made[name] = lockfile.parse(out)
    finally:
        process.terminate()
    committed = lockfile.parse(IMAGE_RUNTIME_LOCK)
    versions = {n: p.version for n, p in made["base"].packages.items()}
    assert versions == {n: p.version for n, p in committed.packages.items()}
    assert made["base"].base_provides == ("torch",)
    assert not {"torch", "triton", "sympy", "nvidia-cublas-cu12"} & set(versions)
    assert {"torch", "triton", "nvidia-cublas-cu12"} <= set(made["pypi"].packages)
    assert made["pypi"].base_provides == ()


def test_base_provides_is_a_distribution_name(builder) -> None:
    result = builder.run(
        "lock", "--runtime-requirements", "/dev/null", "--base-provides", "torch>=2", check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --base-provides 'torch>=2': expected a distribution name, e.g. torch"
    )
