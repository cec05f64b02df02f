"""`builder upstream check`: what moving a target to a newer sglang release would take.

Read-only: it reads the index the sglang pin names (rewritten by `--mirror`) and, for the
chosen release, reports
  pins      the release file and sha256 (from the index), the FlashInfer version it pins
            and that FlashInfer's commit (from its released wheel's `_build_meta.py`, read
            with range requests), the target's own pins (torch, sglang-kernel, ...) as the
            release requires them, the CUDA major its requirements name;
  series    each patch: applies / merged / already upstream / conflicts (builder.upstream.series),
  for
            sglang and, where FlashInfer moves and has patches, for FlashInfer;
  profiles  every flag each launch profile renders against the new release's own argument
            parser (series applied), for the target and every target sharing its forks;
  jit       each `[[jit.modules]]` generator in the new FlashInfer with its arguments, and
            the FlashInfer names sglang's server code uses that are new or gone;
  lock      whether the runtime lock would resolve (uv, into a temporary file).
Nothing in the data directory or the checkout changes; the cache gains the release files
and the series' refresh work directory, as `builder patches check` does.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pygit2
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.build import lock as build_lock
from builder.build.patches import parse_patch_file
from builder.build.pipeline import Context
from builder.build.remote_wheel import MEMBER_LIMIT, RemoteWheel, open_wheel
from builder.build.simple_index import read_project
from builder.build.sources import ref_commit
from builder.core import progress
from builder.core.errors import BuilderError, Unreachable
from builder.core.untrusted import printable
from builder.core.urls import redact
from builder.spec import lockfile as lock
from builder.spec.target import Fork, Target, available_targets, load_target
from builder.upstream import flashinfer_calls, jit_generators, profile_flags, sglang_parser
from builder.upstream import series as series_module

SGLANG = "sglang"
FLASHINFER = "flashinfer"
FLASHINFER_DIST = "flashinfer-python"
_META_COMMIT = re.compile(r"""__git_(?:commit|version)__\s*=\s*["']([0-9a-f]{40})["']""")
_CUDA = re.compile(r"(?<![a-z])cu(\d\d)(?!\d)")


@dataclass(frozen=True)
class Release:
    version: str
    filename: str
    url: str
    sha256: str | None


@dataclass
class Pins:
    sglang: dict  # from / to: version, ref, sha256, commit
    flashinfer: dict  # from / to: version, commit (+ ref, wheel); or {"unchanged": ...}
    requirements: list[dict]  # the target's [image] requirements: name, from, to
    cuda: dict  # stated majors, the target's CUDA version, ok

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Report:
    target: str
    index: str
    pinned: str
    newer: list[str]
    release: Release | None = None
    pins: Pins | None = None
    series: dict[str, dict] = field(default_factory=dict)  # upstream -> check or skipped
    profiles: list[profile_flags.ProfileCheck] = field(default_factory=list)
    generators: list[jit_generators.GeneratorCheck] = field(default_factory=list)
    call_sites: flashinfer_calls.CallSiteDiff | None = None
    lock: dict = field(default_factory=lambda: {"status": "skipped", "detail": "not run"})
    review: list[str] = field(default_factory=list)  # why it is not clean, one line each
    # FlashInfer's own requirements (its released wheel's METADATA), for the lock's dry run
    flashinfer_requirements: list[Requirement] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.review

    @property
    def up_to_date(self) -> bool:
        return self.release is None

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "index": redact(self.index),
            "pinned": self.pinned,
            "newer": self.newer,
            "to": self.release.version if self.release else None,
            "up_to_date": self.up_to_date,
            "pins": self.pins.to_json() if self.pins else None,
            "series": self.series,
            "profiles": [p.to_json() for p in self.profiles],
            "jit": {
                "generators": [g.to_json() for g in self.generators],
                "call_sites": self.call_sites.to_json() if self.call_sites else None,
            },
            "lock": self.lock,
            "review": self.review,
        }


def release_upstream(target: Target) -> tuple[Fork, str]:
    """The target's sglang: (its fork, its series); it must be release-sourced."""
    if target.engine != SGLANG:
        raise BuilderError(
            f"{target.file}: upstream check follows sglang's releases; target {target.name} "
            f"serves with {target.engine}, whose releases it does not follow yet "
            "(its flags are checked against the pinned release by the test suite)"
        )
    use = target.upstreams.get(SGLANG)
    if use is None or use.fork.release is None:
        raise BuilderError(
            f"{target.file}: upstream check follows a release-sourced sglang pin "
            '(source = "release" in the fork\'s pin.toml); this target has none'
        )
    return use.fork, use.series


def _pre(version: Version) -> bool:
    return version.is_prerelease or version.is_devrelease


def newer_releases(fork: Fork, index: str) -> list[Release]:
    """The index's releases of the pinned file's kind (the project's own name, no build tag,
    the same Python, ABI and platform), newer than the pin, final releases only, oldest
    first. Two files of one release are refused: which one would be taken is not clear."""
    assert fork.release is not None
    _, pinned, _, tags = parse_wheel_filename(fork.release.filename)
    project = canonicalize_name(fork.wheel.dist_name)
    found: dict[Version, Release] = {}
    for name, entry in read_project(index, fork.wheel.dist_name).items():
        if not name.endswith(".whl"):
            continue
        try:
            dist, version, build, file_tags = parse_wheel_filename(name)
        except ValueError:  # not a wheel's name, or its version is none
            continue
        if dist != project or build or file_tags != tags or version <= pinned or _pre(version):
            continue
        if version in found:
            raise BuilderError(
                f"index {redact(index)}: offers two files of {project} {version} for the pinned "
                f"Python and platform ({found[version].filename}, {name}): not clear which"
            )
        found[version] = Release(str(version), name, entry.url, entry.sha256)
    return [found[version] for version in sorted(found)]


def parse_to(text: str) -> str:
    """`--to sglang==0.5.24` (or `0.5.24`): the version."""
    version = text.split("==", 1)[1] if "==" in text else text
    name = text.split("==", 1)[0] if "==" in text else SGLANG
    if canonicalize_name(name) != SGLANG:
        raise BuilderError(f"--to {text}: expected sglang==VERSION")
    try:
        return str(Version(version))
    except InvalidVersion:
        raise BuilderError(f"--to {text}: '{version}' is not a version") from None


def _metadata(repo: pygit2.Repository, commit: str, what: str) -> str:
    tree = repo.get(commit).peel(pygit2.Tree)
    infos = [entry.name for entry in tree if entry.name.endswith(".dist-info")]
    if len(infos) != 1 or "METADATA" not in tree[infos[0]].peel(pygit2.Tree):
        raise BuilderError(f"{what}: no single .dist-info/METADATA")
    data = repo.get(tree[infos[0]].peel(pygit2.Tree)["METADATA"].id).data
    if len(data) > MEMBER_LIMIT:
        raise BuilderError(f"{what}: its METADATA is over {MEMBER_LIMIT:,} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise BuilderError(f"{what}: its METADATA is not UTF-8 (byte {exc.start})") from None


def _requirements(metadata: str, what: str) -> list[Requirement]:
    """The Requires-Dist lines of a METADATA from the index; one that is no requirement is
    refused with the parser's first line (its others draw a caret under the line)."""
    try:
        return lock.metadata_requirements(metadata)
    except InvalidRequirement as exc:
        reason = printable(str(exc).splitlines()[0] if str(exc) else "")
        raise BuilderError(
            f"{what}: METADATA has a Requires-Dist that is no requirement ({reason})"
        ) from None
    except RecursionError:  # a marker of a thousand parentheses
        raise BuilderError(f"{what}: METADATA has a Requires-Dist nested too deeply") from None


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:  # a wildcard (0.7.*): no pin
        return False
    return True


def _pinned_versions(requirements: list[Requirement]) -> dict[str, str]:
    """{name: version} of the `==` pins to one version among a distribution's requirements."""
    pins = {}
    for requirement in requirements:
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(exact) == 1 and _is_version(exact[0]):
            pins[canonicalize_name(requirement.name)] = exact[0]
    return pins


def target_requirements(target: Target, new: dict[str, str], flashinfer: str | None) -> list[dict]:
    """The target's [image] requirements as the new release pins them: each `name==X` the
    release pins too becomes its version (flashinfer-cubin follows FlashInfer's); the rest
    stay as written."""
    changes = []
    for text in target.image.requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            raise BuilderError(
                f"{target.file}: [image] requirements: '{text}' is no requirement"
            ) from None
        name = canonicalize_name(requirement.name)
        wanted = flashinfer if name == "flashinfer-cubin" else new.get(name)
        current = [s.version for s in requirement.specifier if s.operator == "=="]
        moved = f"{requirement.name}=={wanted}" if wanted and current else text
        changes.append(
            {"name": requirement.name, "from": text, "to": moved, "changed": moved != text}
        )
    return changes


def _cuda(requirements: list[Requirement], target: Target) -> dict:
    stated = sorted(
        {int(m) for r in requirements for m in _CUDA.findall(f"{r.name} {sorted(r.extras)}")}
    )
    major = target.cuda_version.major
    return {
        "stated": [f"cu{m}" for m in stated],
        "target": str(target.cuda_version),
        "ok": not stated or stated == [major],
    }


class _GitPackage:
    """A Python package's files in a git tree, read where they are (sglang_parser's
    PackageFiles): the parser reads the few dozen modules it needs, nothing is written."""

    def __init__(self, repo: pygit2.Repository, tree: pygit2.Oid, top: str, what: str) -> None:
        self.repo, self.what = repo, what
        root = repo.get(tree).peel(pygit2.Tree)
        self.tree = root[top].peel(pygit2.Tree) if top in root else None

    def _entry(self, relative: str):
        try:
            return self.tree[relative] if self.tree is not None and relative else None
        except KeyError:
            return None

    def is_file(self, relative: str) -> bool:
        entry = self._entry(relative)
        return entry is not None and entry.type_str == "blob"

    def read(self, relative: str) -> str:
        entry = self._entry(relative)
        assert entry is not None, relative
        return self.repo.get(entry.id).data.decode("utf-8", errors="replace")

    def __str__(self) -> str:
        return self.what


def _call_sites(
    repo: pygit2.Repository, tree: pygit2.Oid, seen: dict[pygit2.Oid, set[str]]
) -> dict[str, set[str]]:
    """{path: FlashInfer names} of sglang's server code in a tree; `seen` keeps each file's
    names by blob, so the files two releases share are read once."""
    found = {}
    stack = [(repo.get(tree).peel(pygit2.Tree), "")]
    prefixes = flashinfer_calls.PREFIXES
    while stack:
        node, prefix = stack.pop()
        for entry in node:
            path = f"{prefix}{entry.name}"
            if entry.type_str == "tree":
                if any(p.startswith(path + "/") or path.startswith(p) for p in prefixes):
                    stack.append((repo.get(entry.id).peel(pygit2.Tree), path + "/"))
            elif path.endswith(".py") and path.startswith(prefixes):
                if entry.id not in seen:
                    data = repo.get(entry.id).data
                    seen[entry.id] = (
                        flashinfer_calls.text_references(data.decode("utf-8", errors="replace"))
                        if b"flashinfer" in data
                        else set()
                    )
                if seen[entry.id]:
                    found[path] = seen[entry.id]
    return found


def sharing_targets(data_dir: Path, target: Target) -> list[Target]:
    """The target and every other target whose sglang fork is the same folder (sm90
    extends sm120): a move moves them all."""
    fork_dir = target.upstreams[SGLANG].fork.directory
    found = [target]
    for name in available_targets(data_dir):
        if name == target.name:
            continue
        try:
            other = load_target(data_dir, name)
        except BuilderError:
            continue
        use = other.upstreams.get(SGLANG)
        if use is not None and use.fork.directory == fork_dir:
            found.append(other)
    return found


@dataclass
class FlashInferRelease:
    version: str
    filename: str
    commit: str | None  # what its _build_meta.py names: checked against the git tag
    requirements: list[Requirement]


def _wheel_metadata(wheel: RemoteWheel) -> str:
    """The text of the wheel's one top-level .dist-info/METADATA."""
    found = [n for n in wheel.names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(found) != 1:
        count = "no" if not found else f"{len(found)}"
        raise BuilderError(f"{wheel.where}: {count} .dist-info/METADATA: not a wheel")
    return wheel.text(found[0]) or ""


def _flashinfer_wheel(ctx: Context, index: str, version: str, report: Report, target: Target):
    """FlashInfer `version`'s released wheel, read for its commit, its requirements and the
    JIT generators; None (and a review line) when the index has none."""
    what = f"{FLASHINFER_DIST} {version}"
    files = read_project(index, FLASHINFER_DIST)
    wanted = f"flashinfer_python-{version}-py3-none-any.whl"
    entry = files.get(wanted)
    if entry is None:
        report.review.append(f"{what}: the index has no {wanted} (its commit is unknown)")
        return None
    with (
        progress.task(f"read {wanted} (its commit, requirements and JIT generators)"),
        open_wheel(ctx.mirrors.rewrite(entry.url), what) as wheel,
    ):
        found = _META_COMMIT.search(wheel.text("flashinfer/_build_meta.py") or "")
        requires = _requirements(_wheel_metadata(wheel), wheel.where)
        try:
            report.generators = jit_generators.check_generators(target.jit_modules, wheel.text)
        except BuilderError as exc:  # a module of the wheel: named with the wheel's URL
            raise type(exc)(f"{wheel.where}: {exc}") from None
    if found is None:
        report.review.append(f"{wanted}: flashinfer/_build_meta.py names no commit")
    return FlashInferRelease(version, wanted, found.group(1) if found else None, requires)


def _tagged_commit(ctx: Context, fork: Fork, version: str) -> str:
    """The commit FlashInfer's git tag v`version` names on its remote now (read from the ref
    advertisement, as `git ls-remote`: no tree is fetched)."""
    what = str(fork.directory / "pin.toml")
    commit = ref_commit(ctx.cache_dir, fork.url, f"refs/tags/v{version}", ctx.mirrors, what)
    if commit is None:
        raise BuilderError(
            f"flashinfer {version}: {redact(ctx.mirrors.rewrite(fork.url))} has no tag "
            f"v{version}, so the commit of its released wheel cannot be checked"
        )
    return commit


def _flashinfer(ctx: Context, index: str, version: str | None, report: Report) -> dict:
    """FlashInfer's pin as the release wants it, its series checked where it moves."""
    use = ctx.target.upstreams.get(FLASHINFER)
    if use is None:
        return {"unchanged": "the target has no flashinfer upstream"}
    fork = use.fork
    if version is None:
        report.review.append("the release pins no flashinfer_python version with ==")
        return {"from": {"version": fork.version, "commit": fork.commit}, "to": None}
    wheel = _flashinfer_wheel(ctx, index, version, report, ctx.target)
    built_from = wheel.commit if wheel else None
    report.flashinfer_requirements = wheel.requirements if wheel else []
    to = {
        "version": version,
        "commit": fork.commit,  # the pin's, while the version stays; else the tag's
        "ref": fork.ref if version == fork.version else f"refs/tags/v{version}",
        "wheel": wheel.filename if wheel else None,
        "wheel_commit": built_from,
    }
    pins = {
        "from": {"version": fork.version, "commit": fork.commit, "ref": fork.ref},
        "to": to,
        "changes": version != fork.version,
    }
    if version == fork.version:
        if built_from and built_from != fork.commit:
            report.review.append(
                f"flashinfer {version}: the released wheel was built from {built_from[:12]}, "
                f"the pin says {fork.commit[:12]}"
            )
        report.series[FLASHINFER] = {"skipped": f"flashinfer stays at {version}"}
        return pins
    # The new commit is the git tag's: the wheel's _build_meta.py, which the index serves,
    # only has to agree with it.
    patches = fork.patch_files(use.series)
    if patches:
        with progress.task(f"check the flashinfer series onto v{version}", announce=False):
            checked = series_module.check(
                ctx.cache_dir, ctx.target.name, fork, use.series, ctx.mirrors, f"v{version}"
            )
        report.series[FLASHINFER] = checked.to_json()
        to["commit"] = checked.onto_commit
    else:
        with progress.task(f"read flashinfer's tag v{version}", announce=False):
            to["commit"] = _tagged_commit(ctx, fork, version)
        report.series[FLASHINFER] = {"skipped": f"series {use.series} has no patches"}
    if built_from and built_from != to["commit"]:
        report.review.append(
            f"flashinfer v{version} is commit {to['commit'][:12]}, its released wheel "
            f"names {built_from[:12]}"
        )
    return pins


def _lock_dry_run(ctx: Context, requirements: list[str], requires: dict, report: Report) -> None:
    """Would the runtime lock resolve with the new pins? (uv into a temporary file)."""
    from builder.build.image import runtime_inputs

    try:
        from uv import find_uv_bin

        find_uv_bin()
    except (ImportError, FileNotFoundError) as exc:
        report.lock = {"status": "skipped", "detail": f"uv is not available ({exc})"}
        return
    target = ctx.target
    moved = dataclasses.replace(
        target, image=dataclasses.replace(target.image, requirements=tuple(requirements))
    )
    inputs = runtime_inputs(moved, requires)
    refused = {name: "builder builds itself" for name in requires}
    refused.update({n: "the target excludes" for n in target.image.exclude_requirements})
    with tempfile.TemporaryDirectory(prefix="builder-upstream-lock-") as tmp:
        try:
            resolved = build_lock.resolve(
                [str(r) for r in inputs], target=target.name, python=target.image.python,
                platform=target.image.platform, index_url=target.image.pip_index_url,
                extra_index_url=target.image.pip_extra_index_url, output=Path(tmp) / "lock.txt",
                cache_dir=ctx.cache_dir, refused=refused,
                build_from_source=target.image.build_from_source,
            )  # fmt: skip
        except Unreachable as exc:
            report.lock = {"status": "skipped", "detail": str(exc)}
            return
        except BuilderError as exc:
            report.lock = {"status": "fails", "detail": str(exc)}
            report.review.append(f"the runtime lock does not resolve: {exc}")
            return
    before = lock.parse(target.image.lock).packages if target.image.lock.is_file() else {}
    after = resolved.packages
    changed = sorted(
        f"{n} {before[n].version} -> {after[n].version}"
        for n in after.keys() & before.keys()
        if before[n].version != after[n].version
    )
    report.lock = {
        "status": "resolves",
        "detail": f"{len(after)} packages",
        "added": sorted(f"{n}=={after[n].version}" for n in after.keys() - before.keys()),
        "removed": sorted(f"{n}=={before[n].version}" for n in before.keys() - after.keys()),
        "changed": changed,
    }


def _parser(package: _GitPackage, what: str) -> tuple[dict, set[str]]:
    with progress.task(f"read {what}'s argument parser", announce=False):
        try:
            flags = sglang_parser.server_flags(package)
            return flags, set(sglang_parser.server_args_fields(package))
        except RecursionError:  # expressions nested deeper than the evaluator follows
            raise BuilderError("its expressions are nested too deeply to follow") from None


def check(ctx: Context, to: str | None = None, run_lock: bool = True) -> Report:
    """The report for moving ctx.target to release `to` (default: the newest)."""
    target = ctx.target
    fork, series_name = release_upstream(target)
    wanted = parse_to(to) if to is not None else None
    index = ctx.mirrors.rewrite(fork.url)
    with progress.task(f"read {redact(index)} for {fork.wheel.dist_name} releases"):
        newer = newer_releases(fork, index)
    report = Report(target.name, fork.url, fork.version, [r.version for r in newer])
    if wanted is not None:
        chosen = next((r for r in newer if r.version == wanted), None)
        if chosen is None:
            offered = ", ".join(report.newer) or "none"
            raise BuilderError(
                f"--to {to}: {redact(index)} has no {fork.wheel.dist_name} {wanted} newer than "
                f"the pinned {fork.version} for this Python and platform (newer: {offered})"
            )
    elif newer:
        chosen = newer[-1]
    else:
        return report
    report.release = chosen
    if chosen.sha256 is None:
        report.review.append(f"{chosen.filename}: the index gives no sha256")

    repo, onto_commit, _ = series_module.prepare(
        ctx.cache_dir, target.name, fork, ctx.mirrors, chosen.filename
    )
    patches = [parse_patch_file(p) for p in fork.patch_files(series_name)]
    with progress.task(f"check the sglang series onto {chosen.version}", announce=False):
        result = series_module.classify(
            repo, fork.name, fork.commit, chosen.version, onto_commit, patches
        )
    report.series[SGLANG] = result.to_json()
    for patch in result.patches:
        if patch.status == "conflict":
            report.review.append(f"sglang patch {patch.patch.path.name} conflicts")

    new_requires = _requirements(_metadata(repo, onto_commit, chosen.filename), chosen.filename)
    new_pins = _pinned_versions(new_requires)
    flashinfer_version = new_pins.get(canonicalize_name(FLASHINFER_DIST))
    flashinfer = _flashinfer(ctx, index, flashinfer_version, report)
    pinned_flashinfer = target.upstreams.get(FLASHINFER)
    requirements = target_requirements(
        target,
        new_pins,
        flashinfer_version or (pinned_flashinfer.fork.version if pinned_flashinfer else None),
    )
    cuda = _cuda(new_requires, target)
    if not cuda["ok"]:
        report.review.append(
            f"sglang {chosen.version} names {', '.join(cuda['stated'])}; the target's CUDA is "
            f"{cuda['target']}"
        )
    report.pins = Pins(
        sglang={
            "from": {
                "version": fork.version,
                "ref": fork.ref,
                "commit": fork.commit,
                "sha256": fork.release.sha256 if fork.release else None,
            },
            "to": {
                "version": chosen.version,
                "ref": chosen.filename,
                "commit": onto_commit,
                "sha256": chosen.sha256,
            },
        },
        flashinfer=flashinfer,
        requirements=requirements,
        cuda=cuda,
    )

    # Both with the series applied (conflicting patches left out): what would run.
    old_tree = result.pinned_trees[-1]
    new_tree = result.trees[-1] if result.trees else repo.get(onto_commit).peel(pygit2.Tree).id
    new_package = _GitPackage(repo, new_tree, SGLANG, f"sglang {chosen.version}")
    old_package = _GitPackage(repo, old_tree, SGLANG, f"sglang {fork.version}")
    try:
        new_flags, new_fields = _parser(new_package, f"sglang {chosen.version}")
    except BuilderError as exc:
        raise BuilderError(f"sglang {chosen.version}: its argument parser: {exc}") from None
    try:
        old_flags, _ = _parser(old_package, f"sglang {fork.version}")
    except BuilderError as exc:
        progress.warn(f"sglang {fork.version}'s argument parser is not read ({exc})")
        old_flags = None
    for shared in sharing_targets(ctx.data_dir, target):
        report.profiles += profile_flags.check_target(
            shared.name, shared.file, new_flags, new_fields, old_flags, chosen.version
        )
    for profile in report.profiles:
        report.review += [f"{profile.target} {profile.profile}: {p}" for p in profile.problems]
    for generator in report.generators:
        if generator.status != "present":
            report.review.append(f"JIT generator {generator.generator}: {generator.detail}")

    with progress.task("diff the FlashInfer names sglang's server code uses"):
        seen: dict[pygit2.Oid, set[str]] = {}
        report.call_sites = flashinfer_calls.diff(
            _call_sites(repo, old_tree, seen), _call_sites(repo, new_tree, seen)
        )

    if not run_lock:
        report.lock = {"status": "skipped", "detail": "--no-lock"}
    else:
        requires = {fork.wheel.dist_name: new_requires}
        if FLASHINFER in target.upstreams:
            flashinfer_fork = target.upstreams[FLASHINFER].fork
            requires[flashinfer_fork.wheel.dist_name] = report.flashinfer_requirements
        _lock_dry_run(ctx, [c["to"] for c in requirements], requires, report)
    return report
