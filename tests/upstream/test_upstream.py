"""`builder upstream check` and `move` from sglang 0.5.22 to 0.5.23, on the real releases.

Real parts: the sglang 0.5.22 and 0.5.23 cp312 wheels and FlashInfer 0.7.2's wheel from PyPI
(cached outside the repository: 34 + 39 + 65 MB, once per machine), served by a real package
index on loopback (pypiserver) that builder reaches through `--mirror`; both releases' own
argument parsers; builder's own import, refresh and check. FlashInfer's new commit is the one
its git tag v0.7.2 names: GitHub is not reached here, so a git daemon serves a stand-in
repository with that tag (tests/upstreams.py `flashinfer_tags`), and the FlashInfer wheel on
the index has its `_build_meta.py` name the stand-in's commit, as the real wheel names the
real tag's (tests/upstream/test_hostile_index.py: a wheel naming another commit needs review). The
data copy is today's sm120
moved back to the 0.5.22 stack: the sglang pin to 0.5.22's cp312 wheel (sha256 and commit
computed here with builder's own import), FlashInfer to 0.7.1 (the version 0.5.22 pins), the
target's pins to 0.5.22's, and a series that applies there: the parts of today's two
patches that 0.5.22 has the context for, moved onto 0.5.22 by `builder patches refresh`.
The runtime lock's dry run needs PyPI for 200 packages: these runs pass `--no-lock`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import shutil
import tomllib
import zipfile
from pathlib import Path

import pygit2
import pytest

from builder.build.release import import_wheel
from builder.core.untrusted import markdown_inert
from tests.conftest import REPO_ROOT, Builder, seed_cache
from tests.services import start_git_daemon, start_pypiserver
from tests.upstreams import fetch_release_file, flashinfer_tags

OLD = "sglang-0.5.22-cp312-cp312-manylinux_2_34_x86_64.whl"
NEW = "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
FLASHINFER_WHEEL = "flashinfer_python-0.7.2-py3-none-any.whl"
# FlashInfer 0.7.1 (what sglang 0.5.22 pins): the commit its released wheel's
# flashinfer/_build_meta.py names (read from PyPI by hand, as 0.7.2's was).
FLASHINFER_0_7_1 = "0b46115d238d29ea2e92c6b9b2cb077d40fbc352"
PIN = tomllib.loads((REPO_ROOT / "forks/sglang/pin.toml").read_text())
FLASHINFER_PIN = tomllib.loads((REPO_ROOT / "forks/flashinfer/pin.toml").read_text())
SERIES = REPO_ROOT / "forks/sglang/patches/sm120"
# The files of each of today's patches that 0.5.22 has the context for.
KEPT_PARTS = {
    "0001-": "sglang/srt/layers/flashinfer_comm_fusion.py",
    "0002-": "sglang/srt/server_args.py",
}
TARGET = {"BUILDER_TARGET": "sm120"}  # the suite's default is sm120-0.5.9 (tests/conftest.py)
GONE_FLAG = "--speculative-skip-dp-mlp-sync"  # in 0.5.22's parser, not in 0.5.23's


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def _pinned(wheel: Path, dist: str) -> str:
    found = re.search(rf"^Requires-Dist: {dist}(\[[^\]]*\])?==(\S+)$", _metadata(wheel), re.M)
    assert found, dist
    return found.group(2)


def _part(patch: Path, path: str) -> str:
    """One file's part of a format-patch file (its header kept, the diffstat dropped)."""
    text = patch.read_text()
    head, *files = re.split(r"(?m)^(?=diff --git )", text)
    head = head.split("\n---\n", 1)[0] + "\n---\n\n"
    kept = [f for f in files if f.startswith(f"diff --git a/{path} ")]
    assert len(kept) == 1, (patch, path)
    return head + kept[0]


def _data_copy(root: Path) -> Path:
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, root / folder)
    return root


def _naming(wheel: Path, commit: str, into: Path) -> Path:
    """FlashInfer's wheel with its _build_meta.py naming `commit` (the rest as it is)."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(into, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "flashinfer/_build_meta.py":
                data = data.replace(FLASHINFER_PIN["commit"].encode(), commit.encode())
                assert commit.encode() in data
            copy.writestr(info, data, zipfile.ZIP_DEFLATED, compresslevel=1)
    return into


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> dict:
    """The loopback index: both sglang releases and FlashInfer 0.7.2's wheel (naming the
    stand-in tag's commit); the git daemon serving that tag."""
    packages = tmp_path_factory.mktemp("upstream-index")
    github = packages.parent / "upstream-github"
    tags = flashinfer_tags(github)
    real = fetch_release_file("flashinfer-python", FLASHINFER_WHEEL)
    wheels = {
        OLD: fetch_release_file("sglang", OLD),
        NEW: fetch_release_file("sglang", NEW),
        FLASHINFER_WHEEL: _naming(real, tags["v0.7.2"], packages / FLASHINFER_WHEEL),
    }
    for wheel in wheels.values():
        if wheel.parent != packages:
            shutil.copy(wheel, packages)
    process, port = start_pypiserver(packages, packages.parent / "upstream-pypiserver.log")
    daemon, served = start_git_daemon(github)
    yield {
        "mirror": f"https://pypi.org/simple=http://127.0.0.1:{port}/simple",
        "env": {**TARGET, "BUILDER_MIRRORS": f"https://github.com/={served}"},
        "wheels": wheels,
        "flashinfer": tags["v0.7.2"],
    }
    process.terminate()
    daemon.terminate()


@pytest.fixture(scope="module")
def stack_0_5_22(index: dict, tmp_path_factory) -> dict:
    """Today's sm120 moved back to the 0.5.22 stack, and the first check of the move to
    0.5.23 on it (its cache, with both releases imported, seeds the other tests)."""
    root = tmp_path_factory.mktemp("stack-0.5.22")
    builder = Builder(
        _data_copy(root / "data"), root / "cache", index["mirror"], root / "wh", env=index["env"]
    )
    series = builder.data_dir / "forks/sglang/patches/sm120"
    for patch in SERIES.glob("*.patch"):
        prefix = patch.name[:5]
        (series / patch.name).write_text(_part(patch, KEPT_PARTS[prefix]))
    builder.run("patches", "refresh", "--upstream", "sglang", "--onto", "0.5.22")

    old = index["wheels"][OLD]
    sha256 = hashlib.sha256(old.read_bytes()).hexdigest()
    commit = import_wheel(pygit2.init_repository(root / "import", bare=True), old, sha256)
    pin = tomllib.loads((builder.data_dir / "forks/sglang/pin.toml").read_text())
    assert (pin["ref"], pin["sha256"], pin["commit"]) == (OLD, sha256, commit)

    flashinfer = builder.data_dir / "forks/flashinfer/pin.toml"
    flashinfer.write_text(
        flashinfer.read_text()
        .replace(FLASHINFER_PIN["commit"], FLASHINFER_0_7_1)
        .replace('"refs/tags/v0.7.2"', '"refs/tags/v0.7.1"')
        .replace('version = "0.7.2"', 'version = "0.7.1"')
    )
    target = builder.data_dir / "images/sm120/target.toml"
    text = target.read_text()
    for dist in ("sglang-kernel", "sgl-deep-gemm"):
        text = re.sub(rf'"{dist}==[^"]+"', f'"{dist}=={_pinned(old, dist)}"', text)
    target.write_text(text)
    assert _pinned(old, "flashinfer_python") == "0.7.1"

    checked = builder.run("upstream", "check", "--no-lock", "--json", check=False)
    return {"builder": builder, "check": checked, "sha256": sha256, "commit": commit,
            "flashinfer": index["flashinfer"]}  # fmt: skip


def _builder_on(stack: dict, root: Path) -> Builder:
    """A builder on a copy of the 0.5.22 data, its cache seeded with the imported releases."""
    first: Builder = stack["builder"]
    builder = Builder(_data_copy_of(first.data_dir, root / "data"), root / "cache", first.mirror,
                      root / "wh", env=first.env)  # fmt: skip
    seed_cache(builder, first.cache_dir, folders=("mirrors", "releases"))
    return builder


def _data_copy_of(data: Path, root: Path) -> Path:
    for folder in ("images", "forks"):
        shutil.copytree(data / folder, root / folder)
    return root


def test_the_check_from_0_5_22_to_0_5_23_names_every_pin_and_the_series_moves(
    stack_0_5_22: dict,
) -> None:
    """Clean: the series (applied on 0.5.22) applies on 0.5.23, every profile flag is in
    0.5.23's parser, every JIT generator in FlashInfer 0.7.2; the pins are the ones the
    repository has today, found from the index alone."""
    checked = stack_0_5_22["check"]
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["review"] == [] and report["to"] == "0.5.23"
    assert report["newer"] == ["0.5.23"] and report["pinned"] == "0.5.22"
    sglang = report["pins"]["sglang"]
    assert sglang["from"]["commit"] == stack_0_5_22["commit"]
    assert sglang["to"] == {
        "version": "0.5.23", "ref": NEW, "sha256": PIN["sha256"], "commit": PIN["commit"],
    }  # fmt: skip
    flashinfer = report["pins"]["flashinfer"]
    assert flashinfer["from"]["version"] == "0.7.1" and flashinfer["changes"]
    tagged = stack_0_5_22["flashinfer"]  # the stand-in tag's: the real one is on GitHub
    assert flashinfer["to"] == {
        "version": "0.7.2", "commit": tagged, "ref": "refs/tags/v0.7.2",
        "wheel": FLASHINFER_WHEEL, "wheel_commit": tagged,
    }  # fmt: skip
    moved = {r["name"]: r["to"] for r in report["pins"]["requirements"] if r["changed"]}
    assert moved == {"sglang-kernel": "sglang-kernel==0.4.10",
                     "sgl-deep-gemm": "sgl-deep-gemm==0.2.3.post2"}  # fmt: skip
    assert report["pins"]["cuda"] == {"stated": ["cu13"], "target": "13.0.1", "ok": True}
    patches = report["series"]["sglang"]["patches"]
    assert [p["patch"][:5] for p in patches] == ["0001-", "0002-"]
    assert all(p["status"] in ("clean", "merged") for p in patches), patches
    assert report["series"]["flashinfer"] == {"skipped": "series sm120 has no patches"}
    profiles = {(p["target"], p["profile"]): p for p in report["profiles"]}
    assert {t for t, _ in profiles} == {"sm120", "sm90"}  # sm90 shares sm120's forks
    assert all(not p["problems"] for p in profiles.values())
    changed = profiles[("sm120", "glm5-nvfp4-tp8")]["changed"]
    assert any(c.startswith("--reasoning-parser: choices + ") for c in changed), changed
    generators = report["jit"]["generators"]
    assert len(generators) == 7 and {g["status"] for g in generators} == {"present"}
    calls = report["jit"]["call_sites"]
    assert "flashinfer:top_k_ragged_transform" in calls["added"]
    assert "flashinfer.sampling:top_k_top_p_sampling_from_probs" in calls["removed"]
    assert report["lock"] == {"status": "skipped", "detail": "--no-lock"}


def test_a_flag_only_the_older_release_has_is_named_with_its_profile(
    stack_0_5_22: dict, tmp_path: Path
) -> None:
    """0.5.22's parser has --speculative-skip-dp-mlp-sync, 0.5.23's has not (both read from
    the releases themselves); a value outside an option's choices is named the same way.
    The move is refused for them, and nothing changes."""
    builder = _builder_on(stack_0_5_22, tmp_path)
    profiles = builder.data_dir / "images/sm120/profiles.toml"
    text = profiles.read_text()
    assert '"--reasoning-parser", "glm45",' in text
    profiles.write_text(text.replace(
        '"--reasoning-parser", "glm45",',
        f'"--reasoning-parser", "glm45-typo", "{GONE_FLAG}",',
    ))  # fmt: skip
    markdown = tmp_path / "report.md"
    as_json = builder.run("upstream", "check", "--no-lock", "--json", "--markdown", str(markdown),
                          check=False)  # fmt: skip
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 7 and not report["ok"]
    table = markdown.read_text()
    # Two items (the typo'd value, the gone flag) for each sm120 profile: all render the line.
    count = 2 * len(tomllib.loads(text)["profiles"])
    assert table.startswith(f"**sm120: sglang 0.5.22 -> 0.5.23: needs review ({count} items)**")
    problem = markdown_inert(f"{GONE_FLAG} is not an option")  # sglang's words: inert
    # One row names every profile that says it (upstream/view.py `merged`).
    (row,) = [line for line in table.splitlines() if f" | {problem}" in line]
    for profile in ("glm5-nvfp4-tp8", "glm5-nvfp4-tp8-pcie-ar", "glm5-nvfp4-tp8-fusion"):
        assert f"sm120 {profile}," in row or row.split(" | ")[1].endswith(f"sm120 {profile}")
    assert (
        f"sm120 glm5-nvfp4-tp8: {GONE_FLAG} is not an option of sglang 0.5.23 (was in the "
        "pinned release)"
    ) in report["review"]
    assert (
        "sm120 glm5-nvfp4-tp8: --reasoning-parser glm45-typo: not among sglang 0.5.23's choices"
    ) in report["review"]
    assert not any(r.startswith("sm90 ") for r in report["review"])


def _git_commit_all(data: Path) -> str:
    repo = pygit2.init_repository(data)
    repo.index.add_all()
    repo.index.write()
    who = pygit2.Signature("test", "test@example.invalid", 0, 0)
    return str(repo.create_commit("HEAD", who, who, "data", repo.index.write_tree(), []))


def _files(data: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in data.rglob("*") if p.is_file() and ".git" not in p.parts}


def _conflicting_patch(old: Path, new: Path, path: str) -> str:
    """A patch on 0.5.22's `path` that edits a line 0.5.23 changed too."""
    with zipfile.ZipFile(old) as one, zipfile.ZipFile(new) as other:
        before = one.read(path).decode().splitlines(keepends=True)
        after = other.read(path).decode().splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    line = next(i1 for tag, i1, _, _, _ in matcher.get_opcodes() if tag == "replace")
    edited = list(before)
    edited[line] = edited[line].rstrip("\n") + "  # sm120\n"
    diff = "".join(difflib.unified_diff(before, edited, f"a/{path}", f"b/{path}"))
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: test <test@example.invalid>\nDate: Thu, 1 Jan 2026 00:00:00 +0000\n"
        "Subject: [PATCH 3/3] watermarking: a line 0.5.23 changed too\n\n---\n"
        f"diff --git a/{path} b/{path}\n{diff}"
    )


def test_a_conflicting_patch_stops_the_move_with_the_patch_named(
    stack_0_5_22: dict, index: dict, tmp_path: Path
) -> None:
    builder = _builder_on(stack_0_5_22, tmp_path)
    path = "sglang/srt/sampling/watermarking/core.py"
    patch = builder.data_dir / "forks/sglang/patches/sm120/0003-watermarking-a-line.patch"
    patch.write_text(_conflicting_patch(index["wheels"][OLD], index["wheels"][NEW], path))
    head = _git_commit_all(builder.data_dir)
    before = _files(builder.data_dir)

    moved = builder.run("upstream", "move", "--to", "sglang==0.5.23", "--no-lock",
                        "--keep-old-as", "sm120-0.5.22", check=False)  # fmt: skip
    assert moved.returncode == 7, moved.stderr
    line = moved.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: sglang patch {patch.name} conflicts with 0.5.23 in {path}")
    assert "builder patches refresh --target sm120 --upstream sglang --onto 0.5.23" in line
    assert "builder patches export" in line
    assert "needs review" in moved.stdout and patch.name in moved.stdout  # the table
    repo = pygit2.Repository(builder.data_dir)
    assert str(repo.head.target) == head
    assert _files(builder.data_dir) == before  # no kept target, pin or series file written


def test_the_move_commits_the_pins_the_series_and_the_kept_target(
    stack_0_5_22: dict, tmp_path: Path
) -> None:
    """`upstream move --keep-old-as`: one commit holds the new pins (sglang and FlashInfer),
    the moved series, the target's new pins and the old stack as target sm120-0.5.22, and
    says what happened to each patch and which flags changed per profile."""
    builder = _builder_on(stack_0_5_22, tmp_path)
    head = _git_commit_all(builder.data_dir)
    old_pin = (builder.data_dir / "forks/sglang/pin.toml").read_text()
    old_series = sorted(p.name for p in (builder.data_dir / "forks/sglang/patches/sm120").iterdir())

    moved = builder.run("upstream", "move", "--to", "sglang==0.5.23", "--no-lock",
                        "--keep-old-as", "sm120-0.5.22", "--json")  # fmt: skip
    result = json.loads(moved.stdout)
    assert result["ok"] and result["moved"] and result["kept"] == "sm120-0.5.22"
    repo = pygit2.Repository(builder.data_dir)
    commit = repo.head.peel(pygit2.Commit)
    assert str(commit.id) == result["commit"] and [str(p) for p in commit.parent_ids] == [head]
    assert not [p for p, f in repo.status().items() if f != pygit2.enums.FileStatus.IGNORED]

    data = builder.data_dir
    pin = tomllib.loads((data / "forks/sglang/pin.toml").read_text())
    assert {k: pin[k] for k in ("ref", "sha256", "commit", "version")} == {
        k: PIN[k] for k in ("ref", "sha256", "commit", "version")
    }
    flashinfer = tomllib.loads((data / "forks/flashinfer/pin.toml").read_text())
    assert (flashinfer["ref"], flashinfer["commit"], flashinfer["version"]) == (
        "refs/tags/v0.7.2", stack_0_5_22["flashinfer"], "0.7.2",
    )  # fmt: skip
    target = tomllib.loads((data / "images/sm120/target.toml").read_text())
    assert "sglang-kernel==0.4.10" in target["image"]["requirements"]

    kept = tomllib.loads((data / "images/sm120-0.5.22/target.toml").read_text())
    assert kept["extends"] == "sm120" and kept["local_label"] == "sm120"
    assert kept["upstreams"]["sglang"]["fork"] == "sglang-0.5.22"
    assert kept["upstreams"]["flashinfer"]["fork"] == "flashinfer-0.7.1"
    assert (data / "forks/sglang-0.5.22/pin.toml").read_text() == old_pin
    assert sorted(p.name for p in (data / "forks/sglang-0.5.22/patches/sm120").iterdir()) == (
        old_series
    )
    listed = json.loads(builder.run("patches", "list", "--target", "sm120-0.5.22", "--json").stdout)
    assert listed["sglang"]["pin"]["commit"] == stack_0_5_22["commit"]
    assert listed["flashinfer"]["pin"]["commit"] == FLASHINFER_0_7_1
    assert (data / "images/sm120-0.5.22/runtime-lock.txt").read_bytes() == (
        (REPO_ROOT / "images/sm120/runtime-lock.txt").read_bytes()
    )

    message = commit.message
    assert message.startswith("upstream: sm120 onto sglang 0.5.23 and flashinfer 0.7.2\n")
    for name in old_series:
        assert re.search(rf"^  {re.escape(name)}: applies", message, re.M), message
    assert re.search(r"^  sm120 glm5-nvfp4-tp8: .*--reasoning-parser: choices \+", message, re.M)
    assert "kept: target sm120-0.5.22" in message
    assert "runtime lock: not re-resolved (--no-lock)" in message


def test_listed_generators_are_checked_against_flashinfer_s_source(tmp_path: Path) -> None:
    """builder's generator check on FlashInfer 0.7.2's own wheel: a name that is not there
    and arguments that do not bind are named; the sm120 list is all present."""
    from builder.spec.target import load_target
    from builder.upstream.jit_generators import check_generators

    wheel = fetch_release_file("flashinfer-python", FLASHINFER_WHEEL)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())

        def read(path: str) -> str | None:
            return archive.read(path).decode() if path in names else None

        listed = load_target(REPO_ROOT, "sm120").jit_modules
        assert {c.status for c in check_generators(listed, read)} == {"present"}
        mla = ("flashinfer.jit.attention.modules:gen_batch_mla_module('fa2', torch.bfloat16, "
               "torch.bfloat16, torch.bfloat16, torch.int32, 512, 64, False")  # fmt: skip
        checks = check_generators(
            [
                mla + ")",
                mla + ", 1, 2, 3)",
                "flashinfer.jit.comm:gen_no_such_module",
                "flashinfer.jit.comm:gen_trtllm_comm_module(no_such_argument=1)",
            ],
            read,
        )
    assert [c.status for c in checks] == ["present", "arguments", "missing", "arguments"]
    assert checks[1].detail.startswith("gen_batch_mla_module takes ")
    assert checks[3].detail == "gen_trtllm_comm_module has no parameter no_such_argument"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--target", "sm120-0.5.9"),
         "sm120-0.5.9/target.toml: upstream check follows a release-sourced sglang pin"),
        (("--target", "sm120-vllm"),
         "target sm120-vllm serves with vllm, whose releases it does not follow yet"),
        (("--to", "vllm==0.9"), "--to vllm==0.9: expected sglang==VERSION"),
        (("--to", "sglang==next"), "--to sglang==next: 'next' is not a version"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_before_any_index_is_read(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    builder = Builder(_data_copy(tmp_path / "data"), tmp_path / "cache",
                      "https://pypi.org/simple=http://127.0.0.1:9/simple", tmp_path / "wh",
                      env=TARGET)  # fmt: skip
    result = builder.run("upstream", "check", *args, check=False)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and message in line, line


def test_the_newest_release_has_nothing_to_move(index: dict, tmp_path: Path) -> None:
    """Today's pin (0.5.23) against the index that holds 0.5.22 and 0.5.23: clean, nothing
    read but the index."""
    builder = Builder(_data_copy(tmp_path / "data"), tmp_path / "cache", index["mirror"],
                      tmp_path / "wh", env=TARGET)  # fmt: skip
    result = builder.run("upstream", "check", "--json")
    report = json.loads(result.stdout)
    assert report["ok"] and report["up_to_date"] and report["newer"] == []
    assert report["to"] is None and report["pinned"] == "0.5.23"
    assert not (builder.cache_dir / "mirrors").exists()
    table = builder.run("upstream", "check").stdout
    assert "sglang 0.5.23 is the newest release: nothing to move" in " ".join(table.split())


def test_a_wheel_is_read_whole_where_the_server_serves_no_ranges(tmp_path: Path) -> None:
    """http.server answers a range request with the whole file (200): the wheel is read to
    the end instead, the same member comes out (pypiserver, above, serves ranges)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from builder.build.remote_wheel import open_wheel

    wheel = fetch_release_file("flashinfer-python", FLASHINFER_WHEEL)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(wheel.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{FLASHINFER_WHEEL}"
        with open_wheel(url, "flashinfer") as wheel:
            meta = wheel.text("flashinfer/_build_meta.py")
            assert wheel.text("flashinfer/no_such_file.py") is None
    finally:
        server.shutdown()
        server.server_close()
    assert f'__git_commit__ = "{FLASHINFER_PIN["commit"]}"' in (meta or "")
