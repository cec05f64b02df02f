"""`builder upstream move`: a target onto a newer sglang release, as one git commit.

The check runs first and a move that is not clean is refused (a conflicting patch, a
profile flag the release no longer has, ...). Then every step works on a copy of the data
directory's images/ and forks/: keep today's target as another (--keep-old-as), move the
sglang series (`patches refresh`: pin and patch files), re-pin FlashInfer where the release
pins another, set the target's own pins to the release's, re-lock (`builder lock`). Only
when all of them succeeded are the changed files written into the data directory and
committed (pygit2), so a failure leaves the checkout as it was.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import re
import shutil
import tempfile

try:
    import tomllib
except ImportError:  # Python 3.10 (a GPU VM's Ubuntu 22.04): tomli is the same parser
    import tomli as tomllib
from dataclasses import dataclass
from pathlib import Path

import pygit2
import tomlkit
from pygit2.enums import FileMode, FileStatus

from builder.build import lock as build_lock
from builder.build.pipeline import Context
from builder.core import progress
from builder.core.errors import BuilderError
from builder.spec import lockfile as lock
from builder.spec.target import Target, load_target
from builder.upstream import check, view
from builder.upstream import series as series_module
from builder.upstream.check import FLASHINFER, SGLANG, Report

_DATA = ("images", "forks")
_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
AUTHOR = ("builder upstream move", "builder@localhost")


@dataclass
class Moved:
    report: Report
    commit: str | None = None
    refused: str = ""
    subject: str = ""
    kept: str | None = None
    lock: dict | None = None


def _repository(data_dir: Path) -> pygit2.Repository:
    found = pygit2.discover_repository(str(data_dir))
    if found is None:
        raise BuilderError(
            f"{data_dir}: not in a git repository; upstream move leaves its change as a commit"
        )
    repo = pygit2.Repository(found)
    if repo.is_bare or repo.head_is_unborn:
        raise BuilderError(f"{data_dir}: its git repository has no commit to build on")
    return repo


def _relative(repo: pygit2.Repository, path: Path) -> str:
    return path.resolve().relative_to(Path(repo.workdir).resolve()).as_posix()


def _refuse_uncommitted(repo: pygit2.Repository, data_dir: Path) -> None:
    prefixes = tuple(_relative(repo, data_dir / name) + "/" for name in _DATA)
    prefixes = tuple(p.removeprefix("./") for p in prefixes)
    for path, flags in sorted(repo.status().items()):
        if flags & FileStatus.IGNORED or flags == FileStatus.CURRENT:
            continue
        if path.startswith(prefixes):
            raise BuilderError(
                f"{path}: uncommitted change; commit or stash it first (upstream move leaves "
                "one commit of its own)"
            )


def _refusal(report: Report, target: str) -> str:
    """One line: why the move is refused, and what to do (outside text shown printable)."""
    shown = view.TERMINAL
    for upstream_name, checked in report.series.items():
        for patch in checked.get("patches", []):
            if patch["status"] == "conflict":
                onto = shown(checked["onto"])
                files = ", ".join(shown(f) for f in patch["conflicts"]) or "its files"
                return (
                    f"{upstream_name} patch {patch['patch']} conflicts with {onto} in {files}: "
                    f"run `builder patches refresh --target {target} --upstream {upstream_name} "
                    f"--onto {onto}`, fix the marked files, `builder patches export --target "
                    f"{target} --upstream {upstream_name}`, commit, then move again"
                )
    for profile in report.profiles:
        if profile.problems:
            problem = shown(profile.problems[0])
            return (
                f"profile {profile.profile} of {profile.target}: {problem}: edit "
                f"images/{profile.target}/profiles.toml for the new release, then move again"
            )
    more = f" (and {len(report.review) - 1} more: see the report)" if len(report.review) > 1 else ""
    return f"needs review: {shown(report.review[0])}{more}"


def _copy_data(data_dir: Path, into: Path) -> Path:
    for name in _DATA:
        shutil.copytree(data_dir / name, into / name, symlinks=True)
    return into


def _same_tree(one: Path, other: Path) -> bool:
    compared = filecmp.dircmp(one, other)
    if compared.left_only or compared.right_only or compared.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(one, other, compared.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(_same_tree(one / d, other / d) for d in compared.common_dirs)


def _kept_target_text(target: Target, name: str, forks: dict[str, str]) -> str:
    """The target's own target.toml as target `name`: extends it (for its Dockerfile folder),
    the same wheel label, its own fork folders; everything else as it is today."""
    text = target.file.read_text()
    document = tomlkit.parse(text)
    if "extends" in document:
        raise BuilderError(
            f"{target.file}: extends another target; --keep-old-as copies a target that "
            "stands alone (copy this one by hand)"
        )
    header = (
        f"# Target {name}: target {target.name} as it was before `builder upstream move` moved\n"
        f"# it on (kept with --keep-old-as): its own pins, series and lock; the Dockerfile\n"
        f"# folder is {target.name}'s.\n"
    )
    lines = (header + text).splitlines(keepends=True)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("schema_version")), 3)
    lines.insert(at, f'extends = "{target.name}"\n')
    document = tomlkit.parse("".join(lines))
    document["local_label"] = target.local_label
    image = document.get("image")
    if image is not None and "dockerfile" in image:
        del image["dockerfile"]
    for upstream_name, fork_name in forks.items():
        document["upstreams"][upstream_name]["fork"] = fork_name
    return tomlkit.dumps(document)


def keep(work: Path, target: Target, name: str) -> str:
    """Copy today's target to images/NAME with forks/<upstream>-<version> of its own."""
    if not _NAME.fullmatch(name):
        raise BuilderError(f"--keep-old-as {name}: a target name is lowercase letters, digits, . -")
    folder = work / "images" / name
    if folder.exists():
        raise BuilderError(f"--keep-old-as {name}: images/{name} exists already")
    forks = {}
    for upstream_name, use in target.upstreams.items():
        fork_name = f"{upstream_name}-{use.fork.version}"
        copy = work / "forks" / fork_name
        if copy.exists() and not _same_tree(copy, use.fork.directory):
            raise BuilderError(
                f"--keep-old-as {name}: forks/{fork_name} exists and differs from "
                f"forks/{use.fork.directory.name}"
            )
        if not copy.exists():
            shutil.copytree(use.fork.directory, copy)
            series = copy / "patches" / use.series
            if not any(series.iterdir()):  # git keeps no empty folder
                (series / ".keep").touch()
        forks[upstream_name] = fork_name
    folder.mkdir(parents=True)
    (folder / "target.toml").write_text(_kept_target_text(target, name, forks))
    shutil.copy2(target.file.parent / "profiles.toml", folder / "profiles.toml")
    if target.image.lock.is_file():
        shutil.copy2(target.image.lock, folder / target.image.lock.name)
    kept = load_target(work, name)  # it must load as it is written
    for upstream_name, use in target.upstreams.items():
        if kept.upstreams[upstream_name].fork.commit != use.fork.commit:
            raise BuilderError(f"--keep-old-as {name}: {upstream_name} is not the old pin")
    return name


def _set_requirements(target: Target, changes: list[dict]) -> None:
    """The target's own [image] requirements as the release pins them."""
    moved = {c["from"]: c["to"] for c in changes if c["changed"]}
    if not moved:
        return
    text = target.file.read_text()
    document = tomlkit.parse(text)
    listed = document.get("image", {}).get("requirements")
    if listed is None:
        raise BuilderError(
            f"{target.file}: its [image] requirements are inherited; set "
            f"{', '.join(moved.values())} where they are written, then move again"
        )
    for position, item in enumerate(list(listed)):
        if str(item) in moved:
            listed[position] = moved[str(item)]
    written = tomlkit.dumps(document)
    expected = tomllib.loads(text)
    expected["image"]["requirements"] = [moved.get(r, r) for r in expected["image"]["requirements"]]
    if tomllib.loads(written) != expected:
        raise BuilderError(f"{target.file}: rewriting [image] requirements changed other values")
    target.file.write_text(written)


def _repin_flashinfer(ctx: Context, report: Report) -> None:
    pins = report.pins.flashinfer if report.pins else {}
    if not pins.get("changes"):
        return
    use = ctx.target.upstreams[FLASHINFER]
    after = pins["to"]
    if use.fork.patch_files(use.series):
        with progress.task(f"move the flashinfer series onto v{after['version']}"):
            _, written = series_module.refresh(
                ctx.cache_dir, ctx.target.name, use.fork, use.series, ctx.mirrors,
                f"v{after['version']}",
            )  # fmt: skip
        if written is None:
            raise BuilderError(f"flashinfer: the series did not move onto v{after['version']}")
        if after["commit"] and written["pin"]["commit"] != after["commit"]:
            raise BuilderError(
                f"flashinfer v{after['version']} is commit {written['pin']['commit']}, its "
                f"released wheel was built from {after['commit']}"
            )
        return
    series_module.rewrite_pin(
        use.fork.directory / "pin.toml",
        {"ref": after["ref"], "commit": after["commit"], "version": after["version"]},
    )


def relock(ctx: Context, target: Target) -> dict:
    """`builder lock` for `target` in the work copy: its upstreams' requirements read from
    their sources (sources and patch stages, no wheel built), resolved with uv; the lock's
    `base provides` kept."""
    from builder.build import pipeline
    from builder.build.image import runtime_inputs
    from builder.build.wheels import declared_metadata

    moved_ctx = dataclasses.replace(ctx, target=target)
    forks = pipeline.patch(moved_ctx)
    requires = {
        use.fork.wheel.dist_name: lock.metadata_requirements(
            declared_metadata(ctx.cache_dir, forks[name], use.fork, target.local_label)
        )
        for name, use in target.upstreams.items()
    }
    before = lock.parse(target.image.lock) if target.image.lock.is_file() else None
    refused = {name: "builder builds itself" for name in requires}
    refused.update({n: "the target excludes" for n in target.image.exclude_requirements})
    resolved = build_lock.resolve(
        [str(r) for r in runtime_inputs(target, requires)], target=target.name,
        python=target.image.python, platform=target.image.platform,
        index_url=target.image.pip_index_url, extra_index_url=target.image.pip_extra_index_url,
        output=target.image.lock, cache_dir=ctx.cache_dir, refused=refused,
        base_provides=before.base_provides if before else (),
        build_from_source=target.image.build_from_source,
    )  # fmt: skip
    old = before.packages if before else {}
    return {
        "lock": target.image.lock.name,
        "packages": len(resolved.packages),
        "changed": sorted(
            f"{n} {old[n].version} -> {p.version}"
            for n, p in resolved.packages.items()
            if n in old and old[n].version != p.version
        ),
    }


def _changes(work: Path, data_dir: Path) -> dict[str, bytes | None]:
    """{path under the data directory: new bytes, or None when removed}."""
    found: dict[str, bytes | None] = {}
    for name in _DATA:
        new = {p.relative_to(work).as_posix() for p in (work / name).rglob("*") if p.is_file()}
        old = {p.relative_to(data_dir).as_posix() for p in (data_dir / name).rglob("*")
               if p.is_file()}  # fmt: skip
        for path in sorted(new):
            data = (work / path).read_bytes()
            if path not in old or (data_dir / path).read_bytes() != data:
                found[path] = data
        for path in sorted(old - new):
            found[path] = None
    return {p: d for p, d in found.items() if "/__pycache__/" not in p}


def _write_and_commit(
    repo: pygit2.Repository, data_dir: Path, changes: dict[str, bytes | None], message: str
) -> str:
    """The changed files into the data directory and one commit of exactly them; on a
    failure the files are put back as HEAD has them."""
    paths = {path: _relative(repo, data_dir / path) for path in changes}
    head = repo.head.peel(pygit2.Commit)
    try:
        for path, data in changes.items():
            target = data_dir / path
            if data is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
            partial = target.with_name(f".{target.name}.upstream-move")
            partial.write_bytes(data)
            partial.chmod(mode)
            os.replace(partial, target)
        index = pygit2.Index()
        index.read_tree(head.tree)
        for path, relative in paths.items():
            if changes[path] is None:
                index.remove(relative)
            else:
                blob = repo.create_blob(changes[path])
                executable = os.access(data_dir / path, os.X_OK)
                index.add(
                    pygit2.IndexEntry(
                        relative, blob, FileMode.BLOB_EXECUTABLE if executable else FileMode.BLOB
                    )
                )
        tree = index.write_tree(repo)
        try:
            signature = repo.default_signature
        except (KeyError, pygit2.GitError):
            signature = pygit2.Signature(*AUTHOR)
        commit = repo.create_commit("HEAD", signature, signature, message, tree, [head.id])
    except BaseException:  # the files go back as HEAD has them: nothing half-done
        _restore(repo, data_dir, changes, head)
        raise
    repo.index.read()
    for path, relative in paths.items():
        if changes[path] is None:
            if relative in repo.index:
                repo.index.remove(relative)
        else:
            repo.index.add(relative)
    repo.index.write()
    return str(commit)


def _restore(repo, data_dir: Path, changes: dict, head: pygit2.Commit) -> None:
    for path in changes:
        relative = _relative(repo, data_dir / path)
        try:
            blob = head.tree[relative]
        except KeyError:
            (data_dir / path).unlink(missing_ok=True)
            continue
        (data_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / path).write_bytes(repo.get(blob.id).data)


def move(ctx: Context, to: str, keep_old_as: str | None = None, run_lock: bool = True) -> Moved:
    repo = _repository(ctx.data_dir)
    _refuse_uncommitted(repo, ctx.data_dir)
    if keep_old_as and (ctx.data_dir / "images" / keep_old_as).exists():
        raise BuilderError(f"--keep-old-as {keep_old_as}: images/{keep_old_as} exists already")
    report = check.check(ctx, to, run_lock=False)  # the move re-locks for real below
    if not report.ok:
        return Moved(report, refused=_refusal(report, ctx.target.name))
    with tempfile.TemporaryDirectory(prefix=".upstream-move-", dir=ctx.cache_dir) as tmp:
        try:
            changes, kept, locked = _move_in_copy(ctx, report, Path(tmp), keep_old_as, run_lock)
        except BuilderError as exc:  # named by the data directory's paths, not the copy's
            raise type(exc)(str(exc).replace(tmp, str(ctx.data_dir))) from None
    subject, message = view.commit_message(report, kept, locked)
    commit = _write_and_commit(repo, ctx.data_dir, changes, message)
    return Moved(report, commit, subject=subject, kept=kept, lock=locked)


def _move_in_copy(
    ctx: Context, report: Report, tmp: Path, keep_old_as: str | None, run_lock: bool
) -> tuple[dict[str, bytes | None], str | None, dict | None]:
    """Every step of the move on a copy of images/ and forks/: (the changed files, the kept
    target, the locks re-resolved)."""
    assert report.release is not None and report.pins is not None
    name = ctx.target.name
    work = _copy_data(ctx.data_dir, tmp)
    target = load_target(work, name)
    work_ctx = dataclasses.replace(ctx, target=target, data_dir=work)
    kept = keep(work, target, keep_old_as) if keep_old_as else None
    use = target.upstreams[SGLANG]
    with progress.task(f"move the sglang series onto {report.release.version}"):
        _, written = series_module.refresh(
            ctx.cache_dir, name, use.fork, use.series, ctx.mirrors, report.release.filename
        )
    if written is None:
        raise BuilderError(
            f"sglang: the series did not move onto {report.release.version}: run "
            f"`builder patches refresh --target {name} --upstream sglang --onto "
            f"{report.release.version}`"
        )
    _repin_flashinfer(work_ctx, report)
    _set_requirements(target, report.pins.requirements)
    moved = load_target(work, name)
    locked = None
    if run_lock:
        locked = {}
        for shared in check.sharing_targets(work, moved):
            if shared.image.lock.is_file():
                shared_ctx = dataclasses.replace(work_ctx, target=shared)
                locked[shared.name] = relock(shared_ctx, shared)
    return _changes(work, ctx.data_dir), kept, locked
