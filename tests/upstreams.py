"""Real upstream source for the tests, without GitHub.

Downloads the sglang and flashinfer-python sdists from PyPI (cached outside the
repository) and turns each into a git repository with the upstream layout: sglang's
sdist root becomes `python/`, flashinfer's vendored cutlass and spdlog become real git
submodules. The bare repositories are laid out like GitHub (`<root>/<owner>/<name>.git`),
so the tests reach them through builder's own `--mirror https://github.com/=file://<root>/`
rewrite, exactly as an air-gapped site would.

Run as a script to build the repositories once by hand (e.g. to write patches):
    python -m tests.upstreams /tmp/github
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SDIST_CACHE = Path(
    os.environ.get("BUILDER_TEST_SDIST_CACHE", Path.home() / ".cache" / "builder-test-sdists")
)

# Fixed identity and dates: the fixture commits get the same SHAs on every machine.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "upstream fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "upstream fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    # The extracted sdist files belong to the archive's uid, not to us.
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    # No `git gc --auto` after a commit: it detaches, and packed the loose objects away while
    # the bare clone copied them (a copy, not links, where the work tree is on another file
    # system than the cache: scripts/scratch). The bare repository is packed anyway.
    "GIT_CONFIG_KEY_1": "gc.auto",
    "GIT_CONFIG_VALUE_1": "0",
}

# Files the sdist build generates that upstream git does not track.
_SDIST_ONLY = ("PKG-INFO", "setup.cfg")


@dataclass(frozen=True)
class Snapshot:
    """One upstream release as a commit: repository, tag and the sdist it is made of."""

    owner: str
    name: str
    dist: str
    version: str
    sdist_root_in_git: str  # "" or "python"
    generated_files: tuple[str, ...]
    submodules: tuple[tuple[str, str, str], ...] = ()  # (path, owner, name)


SGLANG = Snapshot(
    owner="sgl-project",
    name="sglang",
    dist="sglang",
    version="0.5.9",
    sdist_root_in_git="python",
    generated_files=("sglang/_version.py",),
)
FLASHINFER = Snapshot(
    owner="flashinfer-ai",
    name="flashinfer",
    dist="flashinfer-python",
    version="0.6.3",
    sdist_root_in_git="",
    generated_files=("flashinfer/_build_meta.py",),
    submodules=(
        ("3rdparty/cutlass", "NVIDIA", "cutlass"),
        ("3rdparty/spdlog", "gabime", "spdlog"),
    ),
)


# Target sm120's flashinfer (0.7.2): its sdist vendors cccl as well.
FLASHINFER_CURRENT = dataclasses.replace(
    FLASHINFER,
    version="0.7.2",
    submodules=(*FLASHINFER.submodules, ("3rdparty/cccl", "NVIDIA", "cccl")),
)


def fetch_sdist(dist: str, version: str) -> Path:
    """The sdist file from PyPI (simple JSON API), cached and sha256-checked."""
    return fetch_release_file(dist, f"{dist.replace('-', '_')}-{version}.tar.gz")


def fetch_release_file(dist: str, wanted: str) -> Path:
    """One released file (sdist or wheel) from PyPI, cached and sha256-checked against the
    index's own hash."""
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    cached = SDIST_CACHE / wanted
    if cached.is_file():
        return cached
    request = urllib.request.Request(
        f"https://pypi.org/simple/{dist}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        index = json.load(response)
    entry = next(f for f in index["files"] if f["filename"] == wanted)
    with urllib.request.urlopen(entry["url"], timeout=300) as response:
        payload = response.read()
    if hashlib.sha256(payload).hexdigest() != entry["hashes"]["sha256"]:
        raise RuntimeError(f"sha256 mismatch for {wanted}")
    target = SDIST_CACHE / wanted
    partial = target.with_suffix(".partial")
    partial.write_bytes(payload)
    partial.replace(target)
    return target


def _git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        **_GIT_ENV,
        "GIT_AUTHOR_DATE": "1700000000 +0000",
        "GIT_COMMITTER_DATE": "1700000000 +0000",
    }
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"git {' '.join(args)} in {cwd}: {result.stderr.strip()}")
    return result.stdout.strip()


def _commit_tree(
    work: Path, message: str, tag: str | None, gitlinks: dict[str, str] | None = None
) -> str:
    _git("add", "-A", "-f", ".", cwd=work)
    for path, commit in (gitlinks or {}).items():
        _git("update-index", "--add", "--cacheinfo", f"160000,{commit},{path}", cwd=work)
    _git("commit", "-q", "--allow-empty", "-m", message, cwd=work)
    if tag:
        _git("tag", tag, cwd=work)
    return _git("rev-parse", "HEAD", cwd=work)


def _publish_bare(work: Path, bare: Path) -> None:
    """`work` as the bare repository `bare`, packed: git daemon then sends the pack as it is
    (tests/services.py `start_git_daemon`)."""
    if bare.exists():
        shutil.rmtree(bare)
    bare.parent.mkdir(parents=True, exist_ok=True)
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=work.parent)
    _git("repack", "-a", "-d", "-q", cwd=bare)


def flashinfer_tags(root: Path) -> dict[str, str]:
    """A stand-in for FlashInfer's GitHub repository where only tags matter (`upstream
    check` reads the commit tag v<version> names): `<root>/flashinfer-ai/flashinfer.git`
    with annotated tags v0.7.1 and v0.7.2 on a commit each, and a last commit no tag names:
    {"v0.7.1": commit, "v0.7.2": commit, "later": commit}."""
    work = root / "flashinfer-work"
    work.mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=work)
    commits = {}
    for name in ("v0.7.1", "v0.7.2", "later"):
        (work / "version.txt").write_text(name)
        commits[name] = _commit_tree(work, name, None)
        if name != "later":
            _git("tag", "-a", name, "-m", name, cwd=work)
    _publish_bare(work, root / "flashinfer-ai" / "flashinfer.git")
    return commits


def move_tag(bare: Path, tag: str, commit: str) -> None:
    """Upstream moves annotated tag `tag` of the bare repository `bare` to `commit`."""
    _git("tag", "-f", "-a", tag, "-m", f"{tag}, moved", commit, cwd=bare)


def _extract(snapshot: Snapshot, version: str, destination: Path) -> Path:
    """The sdist of `version` laid out as the upstream's git tree, in `destination`."""
    sdist = fetch_sdist(snapshot.dist, version)
    with tarfile.open(sdist) as archive:
        archive.extractall(destination, filter="tar")
    (extracted,) = [p for p in destination.iterdir() if p.is_dir()]
    for name in _SDIST_ONLY:
        (extracted / name).unlink(missing_ok=True)
    for egg_info in extracted.glob("*.egg-info"):
        shutil.rmtree(egg_info)
    for generated in snapshot.generated_files:
        (extracted / generated).unlink(missing_ok=True)
    tree = destination / "tree"
    (tree / snapshot.sdist_root_in_git).mkdir(parents=True, exist_ok=True)
    for item in extracted.iterdir():
        shutil.move(str(item), tree / snapshot.sdist_root_in_git / item.name)
    if not snapshot.sdist_root_in_git:
        # flashinfer's git tree carries its version in version.txt (the sdist in PKG-INFO).
        (tree / "version.txt").write_text(f"{version}\n")
    return tree


def _replace_tree(work: Path, tree: Path) -> None:
    for item in work.iterdir():
        if item.name != ".git":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    for item in tree.iterdir():
        shutil.move(str(item), work / item.name)


def build_history(snapshot: Snapshot, versions: list[str], root: Path) -> dict[str, str]:
    """`<root>/<owner>/<name>.git` with one commit per version on one branch, each tagged
    v<version>; submodules get one commit per version too. Returns {version: commit}.

    Made once per machine and kept beside the sdists (the commits are the same on every
    machine: fixed identity and dates), keyed by the snapshot, the versions and this file;
    each caller gets hard links to them (git writes no file of a repository in place), or
    copies where its folder is on another file system (scripts/scratch's)."""
    recipe = hashlib.sha256(repr((snapshot, versions)).encode() + Path(__file__).read_bytes())
    made = SDIST_CACHE / "repositories" / f"{snapshot.name}-{recipe.hexdigest()[:12]}"
    if not (made / _COMMITS).is_file():
        made.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{made.name}-", dir=made.parent))
        commits = _build_history(snapshot, versions, staging)
        (staging / _COMMITS).write_text(json.dumps(commits))
        try:
            staging.rename(made)
        except OSError:  # another worker made it first: the same commits
            shutil.rmtree(staging)
    shutil.copytree(made, root, copy_function=_link_or_copy, dirs_exist_ok=True,
                    ignore=lambda folder, names: [_COMMITS] if Path(folder) == made else [])  # fmt: skip
    return json.loads((made / _COMMITS).read_text())


_COMMITS = "commits.json"


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copy2(source, destination)


def _build_history(snapshot: Snapshot, versions: list[str], root: Path) -> dict[str, str]:
    commits: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix=f"fixture-{snapshot.name}-") as tmp:
        tmp_path = Path(tmp)
        work = tmp_path / "work"
        work.mkdir()
        _git("init", "-q", "-b", "main", cwd=work)
        sub_works = {}
        for path, _, name in snapshot.submodules:
            sub_works[path] = tmp_path / "submodules" / name
            sub_works[path].mkdir(parents=True)
            _git("init", "-q", "-b", "main", cwd=sub_works[path])
        for number, version in enumerate(versions):
            tree = _extract(snapshot, version, tmp_path / f"sdist-{number}")
            gitlinks, gitmodules = {}, []
            for path, owner, name in snapshot.submodules:
                _replace_tree(sub_works[path], tree / path)
                shutil.rmtree(tree / path)
                gitlinks[path] = _commit_tree(
                    sub_works[path], f"{name} as vendored by {snapshot.dist} {version}", None
                )
                gitmodules.append(
                    f'[submodule "{path}"]\n\tpath = {path}\n'
                    f"\turl = https://github.com/{owner}/{name}.git\n"
                )
            if gitmodules:
                (tree / ".gitmodules").write_text("".join(gitmodules))
            _replace_tree(work, tree)
            commits[version] = _commit_tree(
                work, f"{snapshot.dist} {version}", f"v{version}", gitlinks
            )
        for path, owner, name in snapshot.submodules:
            _publish_bare(sub_works[path], root / owner / f"{name}.git")
        _publish_bare(work, root / snapshot.owner / f"{snapshot.name}.git")
    return commits


def build_repository(snapshot: Snapshot, root: Path) -> str:
    """Create `<root>/<owner>/<name>.git` from the sdist; return the tagged commit SHA."""
    return build_history(snapshot, [snapshot.version], root)[snapshot.version]


def build_all(root: Path) -> dict[str, str]:
    """Both upstreams under `root`; returns {upstream name: pinned commit}."""
    return {snap.name: build_repository(snap, root) for snap in (SGLANG, FLASHINFER)}


if __name__ == "__main__":
    print(json.dumps(build_all(Path(sys.argv[1])), indent=2))
