"""`builder doctor --p2p`: measure the GPUs' peer-to-peer fabric before any model loads (the
probe in the server image), judge it with the host's facts, and keep the record that
`builder launch` applies on this machine (builder/site/p2p_record.py: where, and why there).
What the probe says (GPU names, versions, its stages' errors) is shown with its control
characters escaped: it comes from the image's python3, or a file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape

from builder.core.errors import EXIT_CODES, BuilderError, Unreachable
from builder.core.lazy import lazy_module
from builder.core.options import print_json
from builder.core.settings import resolve_data_dir
from builder.core.untrusted import printable

doctor = lazy_module("builder.site.doctor")
docker_client = lazy_module("builder.core.docker_client")
manifest = lazy_module("builder.spec.manifest")
p2p = lazy_module("builder.site.p2p")
p2p_host = lazy_module("builder.site.p2p_host")
p2p_record = lazy_module("builder.site.p2p_record")
p2p_run = lazy_module("builder.site.p2p_run")
progress = lazy_module("builder.core.progress")
validate = lazy_module("builder.core.validate")
docker = lazy_module("docker")

SHOWN = 1000  # characters of a check's line: the probe's strings in it are cut with the rest


def before_the_recipe(args: argparse.Namespace) -> None:
    """What `doctor --p2p` checks before the profile is resolved (with --image, the image
    may be pulled for its recipe): bad input, and, where the probe will run here, the NVIDIA
    container runtime, as plain `doctor` checks it (docker's own error names a device
    driver, not the runtime)."""
    check_options(args)
    if not args.probe_result:
        try:
            client = docker_client.connect()
        except Unreachable as exc:  # exit 9, with the route that needs no daemon
            raise Unreachable(f"{exc}; or measure without Docker: {without_docker()}") from None
        doctor.require_gpu_runtime(client.info())


def without_docker() -> str:
    """The probe run by a python3 that has a CUDA build of torch (builder's own environment
    on a GPU VM has none), then judged here."""
    return (
        f"python3 {p2p_run.probe_file()} --out p2p.json with a python3 that has a CUDA build "
        "of torch, then builder doctor --p2p --probe-result p2p.json"
    )


def check_options(args: argparse.Namespace) -> None:
    """Bad input before anything is looked up or started."""
    if args.container:
        raise BuilderError("--container: not with --p2p (the probe runs before any server)")
    if args.world is not None and args.world < 1:
        raise BuilderError(f"--world {args.world}: must be 1 or more")
    args.stage_timeout = validate.duration("--stage-timeout", args.stage_timeout, "s", above=0)
    if args.probe_result and not Path(args.probe_result).is_file():
        raise BuilderError(f"--probe-result {args.probe_result}: no such file")


def _probe_result(path: str) -> dict:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BuilderError(f"--probe-result {path}: cannot read it ({exc})") from None
    except RecursionError:
        raise BuilderError(f"--probe-result {path}: cannot read it (nested too deep)") from None
    if not isinstance(document, dict) or document.get("probe") != "builder-p2p":
        raise BuilderError(f"--probe-result {path}: not a p2p_probe document")
    return document


def _image(args: argparse.Namespace) -> str:
    """--image, or the image of the target's latest manifest (as `launch` takes it)."""
    if args.image:
        return args.image
    data_dir = resolve_data_dir(args.data_dir)
    path = manifest.latest_with_image(manifest.manifest_dir(data_dir, None, args.target))
    return manifest.image_reference(manifest.load(path), str(path))


def _probe_in_image(args: argparse.Namespace, image: str, nccl_env: dict[str, str]) -> dict:
    client = docker_client.connect()  # no daemon: exit 9, nothing was measured
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise BuilderError(
            f"{image}: not on this machine; pull it first (docker pull {image}, or builder "
            "verify, which pulls it)"
        ) from None
    args_ = p2p_run.probe_args(args.world, args.pcie_ipc, args.stage_timeout, nccl_env)
    name = p2p_run.container_name()
    deadline = p2p_run.deadline_s(args.stage_timeout)
    progress.info(escape(f"P2P probe in {image} (at most {deadline / 60:.0f} min)"))
    return p2p_run.run(
        p2p_run.container_command(image, args_, name), deadline, container=name,
        on_line=lambda line: progress.info(escape(printable(line, 400))),
    )  # fmt: skip


def run(args: argparse.Namespace, recipe, tp: int) -> None:
    """`recipe`: the profile resolved as doctor resolves it (its env, its volumes), after
    `before_the_recipe`."""
    nccl_env = {k: v for k, v in recipe.env.items() if k.startswith("NCCL_")}
    facts = p2p_host.collect()
    image = None
    if args.probe_result:
        probe = _probe_result(args.probe_result)
        image = args.image
    else:
        image = _image(args)
        probe = _probe_in_image(args, image, nccl_env)
    try:  # the document comes from python3 inside the image, or a file: not believed blind
        if not isinstance(probe, dict):
            raise TypeError("not a JSON object")
        analysis = p2p.analyse(probe, facts, recipe.env, tp)
        _refuse_other_gpus(analysis)
        record, note = _record(probe, facts, analysis, image, recipe)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        raise BuilderError(
            f"the probe's answer is not what builder's probe writes ({type(exc).__name__}: "
            f"{str(exc)[:80]!r}); run the probe of this builder version"
        ) from None
    result = {
        "findings": [check.to_json() for check in analysis.checks],
        **{k: v for k, v in analysis.to_json().items() if k != "checks"},
        "record": str(record) if record else None,
        "record_note": note,
        "image": image,
        "profile": recipe.profile,
        "probe": probe,
        "host": facts.to_json(),
    }
    if args.json:
        print_json(result, ok=analysis.ok)
    else:
        for check in analysis.checks:
            print(f"{check.status:<4} {check.name}: {printable(check.detail, SHOWN)}")
            if check.fix and (not check.ok or args.verbose):
                print(f"     fix: {check.fix}")
        for cause in analysis.causes:
            print(f"cause: {printable(cause, SHOWN)}")
        print(f"verdict: {printable(analysis.verdict, SHOWN)}")
        print(f"record: {record} ({note})" if record else f"record: {note}")
    if not probe.get("cuda"):  # nothing was measured, so nothing was found wrong either
        raise SystemExit(EXIT_CODES["unreachable"])
    if not analysis.ok:
        raise SystemExit(1)


def _refuse_other_gpus(analysis) -> None:
    """A probe that saw other GPUs than this machine's, or in another order, judged the wrong
    fabric: its verdict would be filed under this machine's key and let launch start what
    plain doctor refuses (operator review #55). Nothing is written."""
    for check in analysis.checks:
        if check.name == "gpu order" and not check.ok:
            raise BuilderError(
                f"the probe's GPUs are not this machine's: {printable(check.detail, SHOWN)}; "
                f"no P2P record written; {check.fix}"
            )


def _record(probe, facts, analysis, image: str | None, recipe):
    """(path written, what launch will do) or (None, why none was written)."""
    if not probe.get("cuda"):
        return None, "not written: the probe measured nothing"
    machine = p2p_record.machine_from(facts.gpu_ids, facts.topology)
    topology = facts.topology
    if not isinstance(machine, p2p_record.Machine):  # no nvidia-smi here: the probe's own
        smi = probe.get("nvidia_smi") or {}
        machine = p2p_record.machine_from(smi.get("gpus"), smi.get("topology"))
        topology = smi.get("topology")
    if not isinstance(machine, p2p_record.Machine):
        return None, f"not written: {machine}, so the record could not be keyed"
    path = p2p_record.write(
        p2p_record.record_dir(), machine, topology, probe, facts, analysis, image,
        recipe.profile, recipe.volumes,
    )  # fmt: skip
    return path, "builder launch, deploy-files and qualify --start on this machine apply it"
