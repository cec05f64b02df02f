"""Stage 4: the server image, built with the Docker SDK from the wheels.

The build context is made from the target's Dockerfile folder, the two wheels and a
requirements file derived from the target and the wheels' METADATA. What goes in is planned
in builder/build/image_plan.py, every input hashed into the tag and into per-stage keys
stored as labels; here the daemon says what it has (the base image, earlier builds' keys),
so an unchanged `builder image` only checks keys, and `--plan` can say which stage would
rebuild and why.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from rich.markup import escape

from builder.build import records, sbom
from builder.build.image_plan import (
    STAGES,
    ImageOptions,
    ImagePlan,
    hashed_inputs,
    rebuild_reasons,
    recipe_files,
    runtime_inputs,  # noqa: F401 (builder/upstream/ imports it from here)
)
from builder.build.kernels import build as kernel_build
from builder.build.kernels import cache as kernel_cache
from builder.build.kernels import trust as kernel_trust
from builder.build.patches import ForkResult
from builder.build.wheels import BuiltWheel
from builder.core import docker_client, progress
from builder.core.cache import atomic_write_text, locked
from builder.core.errors import BuilderError
from builder.spec import recipe
from builder.spec.recipe import LABEL_PREFIX
from builder.spec.target import Target

# The kernel stage's own lock (the cache lock is not held through an image build): kernel
# entries, their signatures and the kernel wheel of a stage key, one run at a time.
KERNEL_LOCK = "kernels.lock"

INVENTORY_PATH = "/opt/builder/jit-inventory.json"
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")


@dataclass
class ImageResult:
    reference: str
    image_id: str
    skipped: bool
    labels: dict[str, str]
    jit_inventory: dict
    base_image: str
    base_image_id: str
    base_image_digest: str | None
    kernel_wheel: BuiltWheel
    kernel_build: dict | None  # this run's reuse/compile record; None: wheel from the cache
    runtime_lock: dict  # what the runtime stage installed from: file, sha256, hashed
    sbom: str  # CycloneDX JSON, also in the image at sbom.PATH_IN_IMAGE
    pushed: dict | None = None

    def to_json(self) -> dict:
        return {
            "reference": self.reference,
            "image_id": self.image_id,
            "skipped": self.skipped,
            "labels": self.labels,
            "jit_inventory": self.jit_inventory,
            "base_image": {
                "reference": self.base_image,
                "id": self.base_image_id,
                "digest": self.base_image_digest,
            },
            "kernel_wheel": self.kernel_wheel.filename,
            "kernel_build": self.kernel_build,
            "runtime_lock": self.runtime_lock,
            "sbom_in_image": sbom.PATH_IN_IMAGE,
            "pushed": self.pushed,
        }


def _base_identity(client: docker.DockerClient, reference: str) -> tuple[str, str | None]:
    """(image id, registry digest or None) of the base, pulling it if it is not local."""
    try:
        image = client.images.get(reference)
    except ImageNotFound:
        try:
            with progress.task(f"pull base image {reference}"):
                image = client.images.pull(reference)
        except (APIError, NotFound) as exc:
            raise BuilderError(
                f"base image {reference} is not present and cannot be pulled "
                f"({_first_line(str(exc))}): pass --base-image REF, or `docker load -i base.tar` it"
            ) from None
    digests = image.attrs.get("RepoDigests") or []
    return image.id, (digests[0] if digests else None)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _existing_keys(client: docker.DockerClient, target: Target) -> dict[str, set[str]]:
    """Every stage key of the images built for this target here: a stage whose key one of
    them carries is in the engine's layer cache and will not rebuild."""
    images = client.images.list(filters={"label": f"{LABEL_PREFIX}target={target.name}"})
    keys: dict[str, set[str]] = {stage: set() for stage in STAGES}
    for image in images:
        labels = image.labels or {}
        for stage in STAGES:
            keys[stage].add(labels.get(f"{LABEL_PREFIX}key.{stage}", ""))
    return keys if images else {}


def plan(
    client: docker.DockerClient,
    target: Target,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
) -> ImagePlan:
    """Every input hashed: the tag, the per-stage keys and what would rebuild."""
    base_id, base_digest = _base_identity(client, options.base_image)
    inputs = hashed_inputs(target, forks, wheels, options, base_id)
    exists = _image_matches(client, inputs.reference, inputs.inputs_hash)
    previous = {} if exists else _existing_keys(client, target)
    return ImagePlan(
        **vars(inputs),
        rebuild=rebuild_reasons(inputs.stage_keys, exists, previous, target.engine),
        exists=exists,
        base_id=base_id,
        base_digest=base_digest,
    )


def _image_matches(client: docker.DockerClient, reference: str, inputs_hash: str) -> bool:
    try:
        image = client.images.get(reference)
    except ImageNotFound:
        return False
    return (image.labels or {}).get(f"{LABEL_PREFIX}inputs") == inputs_hash


def _make_context(
    target: Target, wheels: dict[str, BuiltWheel], image_plan: ImagePlan, directory: Path
) -> None:
    requirements = image_plan.runtime_lock.text
    for item in recipe_files(target):
        shutil.copy2(item, directory / item.name)
    if target.image.dockerfile.name != "Dockerfile":
        shutil.copy2(target.image.dockerfile, directory / "Dockerfile")
    (directory / "requirements-runtime.txt").write_text(requirements)
    for name, wheel in wheels.items():
        (directory / "wheels" / name).mkdir(parents=True)
        shutil.copy2(wheel.path, directory / "wheels" / name / wheel.filename)


def _stream_build(
    client: docker.DockerClient,
    context: Path,
    reference: str,
    image_plan: ImagePlan,
    options: ImageOptions,
    stage: str | None = None,
) -> str:
    """Run the build, showing step n/N; the SDK does not raise on a failed step, so we do."""
    recent: deque[str] = deque(maxlen=20)
    image_id = None
    current = ("0", "?", "")
    with progress.task(f"docker build {stage or 'image'}", total=None) as bar:
        task_id = bar.task_ids[0]
        stream = client.api.build(
            path=str(context),
            tag=reference,
            target=stage,
            buildargs=image_plan.buildargs,
            labels=image_plan.labels if stage is None else {},
            decode=True,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode="host" if options.network_host else None,
        )
        for chunk in stream:
            if "stream" in chunk:
                for line in chunk["stream"].splitlines():
                    if not line.strip():
                        continue
                    recent.append(line)
                    match = _STEP.match(line)
                    if match:
                        current = match.groups()
                        bar.update(
                            task_id,
                            total=int(current[1]),
                            completed=int(current[0]) - 1,
                            description=f"docker build: step {current[0]}/{current[1]} "
                            f"{current[2][:60]}",
                        )
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
            if "error" in chunk or "errorDetail" in chunk:
                message = chunk.get("error") or chunk["errorDetail"].get("message", "")
                tail = "\n".join(f"    {line}" for line in list(recent)[-12:])
                raise BuilderError(
                    f"image build failed at step {current[0]}/{current[1]} ({current[2]}): "
                    f"{_first_line(message)}\n  last build output:\n{tail}"
                )
        bar.update(task_id, completed=int(current[1]) if current[1].isdigit() else 1)
    if image_id is None:
        raise BuilderError("image build ended without an image id (see the output above)")
    return image_id


def _check_labels(client: docker.DockerClient, reference: str, expected: dict[str, str]) -> None:
    labels = client.images.get(reference).labels or {}
    wrong = [key for key, value in expected.items() if labels.get(key) != value]
    if wrong:
        raise BuilderError(f"image {reference}: labels {wrong} missing or wrong after the build")


def _kernel_wheel(
    client: docker.DockerClient,
    target: Target,
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
    image_plan: ImagePlan,
    context: Path,
    cache_dir: Path,
) -> tuple[BuiltWheel, dict | None]:
    """The kernel wheel for this flashinfer stage: from the cache, or reuse-or-compile in
    the kernel-builder stage (which the image build then takes from the layer cache). Under
    the kernel lock: a second run at once waits, then takes the first one's wheel."""
    stage_key = image_plan.stage_keys["flashinfer"]
    with locked(cache_dir, KERNEL_LOCK):
        trust = kernel_trust.load()
        cached = kernel_build.cached_wheel(cache_dir, stage_key, trust)
        if cached:
            progress.info(
                f"[green]✓[/] kernels: {cached.filename} (cached for this flashinfer stage)"
            )
            return cached, None
        job = _kernel_job(client, target, options, image_plan, context)
        shared = kernel_cache.SharedKernels(client, options.kernel_registry, trust)
        with tempfile.TemporaryDirectory(prefix="builder-kernel-wheel-") as tmp:
            wheel, record, signers = kernel_build.build(
                client, job, cache_dir, shared, trust, wheels["flashinfer"], target.name, Path(tmp)
            )
            kept = kernel_build.remember_wheel(cache_dir, stage_key, wheel, signers, trust)
        return kept, record


def _kernel_job(
    client: docker.DockerClient,
    target: Target,
    options: ImageOptions,
    image_plan: ImagePlan,
    context: Path,
) -> kernel_build.KernelJob:
    """The kernel-builder stage (built now unless this engine has it) and what to run in it."""
    _ensure_kernel_builder(client, options, image_plan, context)
    return kernel_build.KernelJob(
        builder_image=image_plan.kernel_builder,
        modules=image_plan.jit_modules,
        jobs=options.jit_jobs,
        job_memory_gb=target.jit_job_memory_gb,
        harvested=image_plan.harvested,
        network_host=options.network_host,
    )


def _ensure_kernel_builder(
    client: docker.DockerClient, options: ImageOptions, image_plan: ImagePlan, context: Path
) -> None:
    try:
        client.images.get(image_plan.kernel_builder)
    except ImageNotFound:
        _stream_build(
            client, context, image_plan.kernel_builder, image_plan, options, stage="kernel-builder"
        )


def _runtime_sbom(
    client: docker.DockerClient,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
    image_plan: ImagePlan,
    context: Path,
) -> str:
    """The SBOM from what pip installed in the runtime stage (its report, read from the
    kernel-builder stage, which holds that stage), what the base provides, and builder's
    wheels."""
    _ensure_kernel_builder(client, options, image_plan, context)

    def read(path: str) -> dict:
        return json.loads(
            docker_client.read_file_from_image(client, image_plan.kernel_builder, path)
        )

    report = read(sbom.REPORT_IN_IMAGE)
    provided = read(sbom.BASE_PACKAGES_IN_IMAGE) if image_plan.runtime_lock.base_provides else {}
    return sbom.build_sbom(
        image_plan.repository,
        image_plan.tag,
        report,
        wheels,
        forks,
        image_plan.runtime_lock.sha256,
        base_packages=provided,
    )


def kernel_plan(
    client: docker.DockerClient,
    target: Target,
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
    image_plan: ImagePlan,
    cache_dir: Path,
) -> list[dict]:
    """Per module: reuse or compile, and why. The keys come from flashinfer's generators, so
    the kernel-builder stage is built first when this engine lacks it."""
    with tempfile.TemporaryDirectory(prefix="builder-context-") as tmp:
        _make_context(target, wheels, image_plan, Path(tmp))
        job = _kernel_job(client, target, options, image_plan, Path(tmp))
    with locked(cache_dir, KERNEL_LOCK):  # registry entries it pulls are kept
        trust = kernel_trust.load()
        shared = kernel_cache.SharedKernels(client, options.kernel_registry, trust)
        return kernel_build.plan(client, job, cache_dir, shared, trust)


def _same_kernels(
    client: docker.DockerClient, image_plan: ImagePlan, kernels_wheel: BuiltWheel
) -> bool:
    """An image with this tag holds these very kernels. nvcc output is not byte-for-byte
    reproducible, so a host that compiled its own has other bytes under the same inputs: the
    image is built again, so the tag and the manifest describe what is inside."""
    labels = client.images.get(image_plan.reference).labels or {}
    found = labels.get(f"{LABEL_PREFIX}kernels.wheel-sha256")
    if found == kernels_wheel.sha256:
        return True
    progress.warn(
        f"image {image_plan.reference} holds other kernels (kernel wheel sha256 "
        f"{(found or 'none')[:12]}, this build's {kernels_wheel.sha256[:12]}): built again"
    )
    return False


def build_image(
    client: docker.DockerClient,
    target: Target,
    forks: dict[str, ForkResult],
    wheels: dict[str, BuiltWheel],
    options: ImageOptions,
    image_plan: ImagePlan,
    cache_dir: Path,
    save_context: Path | None = None,
) -> ImageResult:
    with tempfile.TemporaryDirectory(prefix="builder-context-") as tmp:
        context = Path(tmp)
        _make_context(target, wheels, image_plan, context)
        kernels_wheel, kernels_record = _kernel_wheel(
            client, target, wheels, options, image_plan, context, cache_dir
        )
        skipped = image_plan.exists and _same_kernels(client, image_plan, kernels_wheel)
        if skipped:  # read once: the no-op path is the one a user waits on most
            image, sbom_text, inventory = _image_files(client, image_plan.reference, cache_dir)
        if not skipped or save_context:
            kernels_folder = context / "wheels" / "kernels"
            kernels_folder.mkdir(parents=True)
            shutil.copy2(kernels_wheel.path, kernels_folder / kernels_wheel.filename)
            everything = {**wheels, "kernels": kernels_wheel}
            recipe.write(
                records.build_recipe(target, forks, everything, image_plan.jit_modules), context
            )
            if skipped:  # the very labels of the build that made the image
                existing = client.images.get(image_plan.reference).labels or {}
                made = {key: existing[key] for key in _BUILD_TIME_LABELS if key in existing}
            else:
                sbom_text = _runtime_sbom(client, forks, everything, options, image_plan, context)
                made = {
                    "org.opencontainers.image.created": _now(),
                    f"{LABEL_PREFIX}kernels.wheel": kernels_wheel.filename,
                    f"{LABEL_PREFIX}kernels.wheel-sha256": kernels_wheel.sha256,
                }
            (context / Path(sbom.PATH_IN_IMAGE).name).write_text(sbom_text)
            built_plan = ImagePlan(
                **{**image_plan.__dict__, "labels": {**image_plan.labels, **made}}
            )
        if save_context:  # before the build: a failed build is the one worth a look by hand
            _save_context(context, built_plan, options, save_context)
        if skipped:
            progress.info(
                f"[green]✓[/] image {image_plan.reference} is up to date "
                "(all stage keys match: nothing built)"
            )
        else:
            started = time.monotonic()
            _stream_build(client, context, image_plan.reference, built_plan, options)
            progress.info(f"image built in {time.monotonic() - started:.0f} s")
            _check_labels(client, image_plan.reference, image_plan.labels)
            image, sbom_text, inventory = _image_files(client, image_plan.reference, cache_dir)
    return ImageResult(
        reference=image_plan.reference,
        image_id=image.id,
        skipped=skipped,
        labels=image.labels or {},
        jit_inventory=inventory,
        base_image=options.base_image,
        base_image_id=image_plan.base_id,
        base_image_digest=image_plan.base_digest,
        kernel_wheel=kernels_wheel,
        kernel_build=kernels_record,
        runtime_lock=image_plan.runtime_lock.record(),
        sbom=sbom_text,
    )


def _image_files(client: docker.DockerClient, reference: str, cache_dir: Path):
    """(the image, its SBOM text, its kernel inventory). The two files are kept in the cache
    by image id (content-addressed), so a no-op run reads nothing out of the image: each
    read is a container created, copied from and removed."""
    image = client.images.get(reference)
    kept = cache_dir / "image-files" / f"{image.id.removeprefix('sha256:')}.json"
    try:
        record = json.loads(kept.read_text())
        return image, record["sbom"], record["inventory"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    sbom_text = docker_client.read_file_from_image(client, reference, sbom.PATH_IN_IMAGE).decode()
    inventory = json.loads(docker_client.read_file_from_image(client, reference, INVENTORY_PATH))
    atomic_write_text(kept, json.dumps({"sbom": sbom_text, "inventory": inventory}) + "\n")
    return image, sbom_text, inventory


SAVED_BUILD = "docker-build.json"
_SAVED_BY = "builder image --save-context"
# Labels a build adds beyond the plan's: a saved context of an existing image repeats them.
_BUILD_TIME_LABELS = (
    "org.opencontainers.image.created",
    f"{LABEL_PREFIX}kernels.wheel",
    f"{LABEL_PREFIX}kernels.wheel-sha256",
)


def _saved_by_builder(folder: Path) -> bool:
    try:
        return json.loads((folder / SAVED_BUILD).read_text()).get("saved_by") == _SAVED_BY
    except (OSError, ValueError, AttributeError):
        return False


def _replaceable(folder: Path) -> bool:
    """Absent, empty, or written by --save-context: builder may replace it."""
    return not folder.exists() or (
        folder.is_dir() and (not any(folder.iterdir()) or _saved_by_builder(folder))
    )


def check_save_context(destination: Path) -> None:
    """A new or empty folder, or one an earlier --save-context wrote (it is replaced)."""
    if not destination.resolve().name:  # no folder beside `/` to swap it through
        raise BuilderError(
            f"--save-context {destination}: the file system root; give a new or empty folder"
        )
    for folder in (destination, *_save_context_siblings(destination)):
        if not _replaceable(folder):
            raise BuilderError(
                f"--save-context {destination}: {folder} exists and is not a build context "
                "builder saved; give a new or empty folder"
            )


def _save_context_siblings(destination: Path) -> tuple[Path, Path]:
    """The folders it is swapped through, beside it (`.` and `..` name no folder of their own)."""
    folder = destination.resolve()
    return folder.with_name(folder.name + ".partial"), folder.with_name(folder.name + ".old")


def _save_context(
    context: Path, image_plan: ImagePlan, options: ImageOptions, destination: Path
) -> None:
    """The exact context of the image build, and its docker build arguments beside it
    (docker-build.json), to audit it or run the same `docker build` by hand. A folder is
    swapped in whole; one that cannot be written is a warning, not a failed build."""
    partial, old = _save_context_siblings(destination)
    arguments = {
        "saved_by": _SAVED_BY,
        "tag": image_plan.reference,
        "buildargs": image_plan.buildargs,
        "labels": image_plan.labels,
        "network_mode": "host" if options.network_host else None,
    }
    try:
        check_save_context(destination)  # again: it may have changed since the start
        for leftover in (partial, old):
            shutil.rmtree(leftover, ignore_errors=True)
        partial.mkdir(parents=True)
        (partial / SAVED_BUILD).write_text(json.dumps(arguments, indent=2, sort_keys=True) + "\n")
        shutil.copytree(context, partial, dirs_exist_ok=True)
        if destination.exists():
            destination.rename(old)
        partial.rename(destination)
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, BuilderError) as exc:
        progress.warn(escape(f"--save-context {destination}: not saved ({exc})"))
        return
    progress.info(escape(f"build context saved: {destination} (arguments: {SAVED_BUILD})"))


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
