"""Commands that check, on the GPU VM: verify (an image against its promises) and doctor
(this machine against a profile's needs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from packaging.version import Version

from builder.core.errors import BuilderError, Unreachable
from builder.core.lazy import lazy_module
from builder.core.options import (
    UNITS,
    HelpFormatter,
    add_global_flags,
    add_output_options,
    add_project_options,
    print_json,
)
from builder.core.settings import resolve_data_dir
from builder.site.commands.launch_options import say_receipt
from builder.site.commands.wait_ready import compiled_line, launched_with
from builder.spec import engines
from builder.spec.target import load_target

docker_client = lazy_module("builder.core.docker_client")
doctor = lazy_module("builder.site.doctor")
doctor_p2p = lazy_module("builder.site.commands.doctor_p2p")
image_recipe = lazy_module("builder.spec.recipe")
launch = lazy_module("builder.spec.launch")
launch_profiles = lazy_module("builder.spec.launch_profiles")
manifest = lazy_module("builder.spec.manifest")
packs = lazy_module("builder.spec.jit.packs")
runtime_jit = lazy_module("builder.site.runtime_jit")
validate = lazy_module("builder.core.validate")
verify = lazy_module("builder.site.verify")
docker = lazy_module("docker")


def cmd_verify(args: argparse.Namespace) -> None:
    validate.image_reference("verify IMAGE", args.image)
    record = manifest.load(Path(args.manifest)) if args.manifest else None
    if record is not None and not (record.get("image") or {}).get("image_id"):
        raise BuilderError(
            f"--manifest {args.manifest}: records no image (a publish manifest?); give the "
            "manifest `builder image` wrote"
        )
    if args.lock and not Path(args.lock).is_file():
        raise BuilderError(f"--lock {args.lock}: no such file")
    client = docker_client.connect()
    built, checks = verify.verify(client, args.image)
    if record is not None:
        checks += verify.against_manifest(client, args.image, built, record)
    if args.lock:
        checks.append(verify.against_lock(client, args.image, Path(args.lock)))
    failed = [check for check in checks if not check.ok]
    verdict = (
        f"{len(failed)} of {len(checks)} checks failed"
        if failed
        else f"all {len(checks)} checks passed: {args.image} is what its recipe says"
    )
    receipt = say_receipt(client, args.image)
    if args.json:
        result = {
            "image": args.image,
            "target": built["target"]["name"],
            "checks": [check.to_json() for check in checks],
            "receipt": receipt,
        }
        print_json(result, ok=not failed)
    else:
        for check in checks:
            print(f"{'ok  ' if check.ok else 'FAIL'} {check.check}: {check.detail}")
        print(verdict)
    if failed:
        raise SystemExit(1)


def _from_the_container(args: argparse.Namespace) -> None:
    """`doctor --container NAME` on a VM without a checkout: the image and profile the
    container was launched with (its labels), as wait-ready takes them. A container builder
    did not start, or no daemon, leaves the checkout's target to answer (or say why not)."""
    try:
        profile, image, _ = launched_with(args.container, ())
    except BuilderError:  # no daemon, no such container: the checks below say so in place
        return
    if image:
        args.image = image
        args.profile = args.profile or profile


def cmd_doctor(args: argparse.Namespace) -> None:
    """Every check prints ok, FAIL or SKIP (what could not be checked, and why), then one
    verdict line; exit 1 when one failed, 9 when one could not be checked and none failed."""
    findings: list = []
    facts = None  # (cuda version, compute capability, tp size, profile) from the recipe
    if args.p2p:
        doctor_p2p.before_the_recipe(args)
    elif args.container and not args.image:
        _from_the_container(args)
    if args.image:
        validate.image_reference("--image", args.image)
        # On a VM: everything from the image's recipe, no checkout needed.
        try:
            built = image_recipe.launch_recipe(args.image)
        except Unreachable as exc:  # no daemon and no registry answer: not a finding
            if args.p2p:
                raise
            findings.append(doctor.skipped("image recipe", str(exc)))
        else:
            known = image_recipe.profiles_of(built, args.image)
            facts = Version(built["target"]["cuda_version"]), built["target"]["arch_list"]
    else:
        target = load_target(resolve_data_dir(args.data_dir), args.target)
        known = launch_profiles.Profiles.of(target.file)
        facts = target.cuda_version, target.arch_list
    recipe = profile = None
    tp = 1
    if facts is not None:
        recipe = launch.resolve(known, args.profile, args.image or "-", launch.Overrides())
        profile = launch_profiles.flattened(known, recipe.profile)
        tp = _tp_size(recipe.args)
    if args.p2p:
        doctor_p2p.run(args, recipe, tp)
        return
    no_recipe = "the image's recipe could not be read (image recipe above)"

    gpu_text = doctor.run_command(doctor.GPU_QUERY)
    if gpu_text is None:
        findings.append(
            doctor.Finding(
                "gpus",
                False,
                "nvidia-smi not found or failed",
                "install the NVIDIA driver in the VM (and pass the GPUs through)",
            )
        )
    else:
        gpus = doctor.parse_gpus(gpu_text)
        if facts is None:
            findings.append(
                doctor.Finding(
                    "gpus", bool(gpus), f"{len(gpus)} GPU(s): "
                    + (", ".join(sorted({g.name for g in gpus})) or "none"),
                )
            )  # fmt: skip
            for check in ("gpu count", "compute capability", "gpu memory"):
                findings.append(doctor.skipped(check, no_recipe))
            drivers = ", ".join(sorted({g.driver for g in gpus})) or "none"
            findings.append(doctor.skipped("driver", f"driver {drivers}; its minimum: {no_recipe}"))
        else:
            cuda_version, arch_list = facts
            compute_cap = arch_list[0].rstrip("af")
            memory = launch_profiles.profile_number(
                profile, "min_gpu_memory_gib", 0, f"profile '{recipe.profile}'"
            )
            findings += doctor.check_gpus(gpus, compute_cap, tp, memory)
            findings.append(doctor.check_driver(gpus, cuda_version))
        topo = doctor.run_command(["nvidia-smi", "topo", "-m"])
        findings.append(
            doctor.check_topology(doctor.parse_topology(topo))
            if topo
            else doctor.skipped("topology", "nvidia-smi topo -m failed")
        )
        if profile is not None and profile.get("needs_peer_access"):
            p2p = doctor.run_command(doctor.P2P_QUERY) or ""
            status = doctor.parse_topology(p2p) if p2p.strip() else {}
            findings.append(doctor.check_peer_access(status, tp))
    findings.append(doctor.check_shm(doctor.shm_free_bytes()))
    info = None
    client = None
    daemon_why = "Docker engine not reachable"
    try:
        client = docker_client.connect()
        info = client.info()
    except BuilderError as exc:
        daemon_why = str(exc)
    findings.append(doctor.check_runtime(info, *([] if info else [daemon_why])))
    if args.container and client is None:
        findings.append(doctor.skipped("jit", f"no Docker daemon to look into {args.container}"))
    elif args.container:
        try:
            container = client.containers.get(args.container)
        except docker.errors.NotFound:
            raise BuilderError(f"--container {args.container}: no such container") from None
        compiled = [m.name for m in packs.compiled_in_container(container)]
        findings.append(
            doctor.Finding(
                "jit",
                not compiled,
                compiled_line(compiled, args.container),
                f"builder jit harvest --container {args.container}, then builder image",
            )
        )
        # The profile's engine; without a recipe to say it, the default one's caches.
        engine = engines.engine(recipe.engine if recipe else engines.DEFAULT)
        others = runtime_jit.compiled_in_container(container, engine)
        findings.append(
            doctor.Finding(
                "other jit",
                others.by_cache is not None and not others.total,
                others.summary(),
                f"kept on the profile's {engine.cache_volume}: the next start on this host "
                "reuses them (if it does not, the volume is missing from the run command)",
            )
        )
    if args.image and client is None:
        findings.append(doctor.skipped("image", "no Docker daemon to look for it in"))
    elif args.image:
        present = True
        try:
            client.images.get(args.image)
        except docker.errors.ImageNotFound:
            present = False
        findings.append(doctor.check_image(args.image, present))

    line, code = doctor.verdict(findings)
    if args.json:
        print_json({"findings": [f.to_json() for f in findings], "verdict": line}, ok=code == 0)
    else:
        for finding in findings:
            print(f"{finding.status:<4} {finding.check}: {finding.detail}")
            if finding.fix and (finding.status != "ok" or args.verbose):
                print(f"     fix: {finding.fix}")
        print(line)
    if code:
        raise SystemExit(code)


def _tp_size(args: tuple[str, ...]) -> int:
    for flag in ("--tp", "--tp-size", "--tensor-parallel-size"):
        if flag in args:
            return int(args[args.index(flag) + 1])
    return 1


def register(sub) -> None:
    verify_cmd = sub.add_parser(
        "verify",
        help="check inside an image everything its recipe promises",
        description="Check an image against the recipe it carries (/opt/builder/recipe.json), "
        "in a container without network: labels; every wheel installed at its version with "
        "every file matching its RECORD sha256; the lines each patch adds; builder's own "
        "kernel wheel for exactly the installed flashinfer build (never the official "
        "flashinfer-jit-cache), every listed module loading from it with JIT disabled, byte "
        "for byte, with GPU code for the target arch; `pip check`. One line per check; exit "
        "code 0 when all pass, 1 otherwise. Pulls the image when it is not here. With "
        "--manifest and --lock (the build host's), also that the image and its wheels are "
        "the ones the build recorded and its runtime packages the lock's, not only what the "
        "image says of itself.\n\n"
        "examples:\n"
        "  builder verify registry.example.com/ml/sglang-sm120@sha256:...\n"
        "  builder verify $IMAGE --manifest manifests/sm120/latest.json "
        "--lock images/sm120/runtime-lock.txt",
        formatter_class=HelpFormatter,
    )
    verify_cmd.add_argument("image", metavar="IMAGE", help="image reference (tag or digest)")
    verify_cmd.add_argument(
        "--manifest", metavar="FILE", help="the build's manifest: the image and wheels it recorded"
    )
    verify_cmd.add_argument(
        "--lock", metavar="FILE", help="a runtime lock: each package installed at its version"
    )
    add_output_options(verify_cmd)
    verify_cmd.set_defaults(func=cmd_verify)

    doctor_cmd = sub.add_parser(
        "doctor",
        help="check a GPU VM: driver, GPUs, memory, runtime, shm, topology, image; --p2p: "
        "the GPUs' peer-to-peer fabric",
        description="Check that this machine can run the target's image with a launch profile: "
        "NVIDIA driver new enough for the target's CUDA, GPU count and compute capability, "
        "memory per GPU, NVIDIA container runtime, /dev/shm, GPU topology (P2P over PCIe or "
        "NVLink) and, with --image, that the image is present. Each check says ok, FAIL or "
        "SKIP (could not be checked: no Docker daemon, the image's recipe unreadable, "
        "nvidia-smi topo failing), a failing one how to fix it; then one verdict line. Exit "
        "code 1 if any fails, 9 if one could not be checked and none failed.\n\n"
        "With --p2p, instead: measure the GPUs' peer-to-peer fabric before any model loads. "
        "A probe runs in the image (docker run --rm --gpus all --ipc=host, the probe file "
        "mounted read-only): peer access, copy bandwidth and latency of every GPU pair, "
        "and the all-reduce at GLM-5's decode sizes through NCCL (with the profile's NCCL "
        "settings, then with P2P off) and through FlashInfer's PCIe IPC all-reduce (JIT "
        "disabled: the image's kernel wheel); a stage that hangs is killed and recorded. "
        "With the host's facts (lspci's PCIe switches, IOMMU mode, VM or not, nvidia-smi "
        "topo -m) it names a collapsed pair, a pair without peer access or a hung all-reduce "
        "and its likely cause, and chooses the NCCL settings (the profile's, or "
        "NCCL_P2P_DISABLE=1) and whether the -pcie-ar profiles may run. The record goes to "
        "/var/lib/builder/p2p/ (BUILDER_P2P_DIR, for doctor and launch alike), keyed by GPU "
        "order and topology, outside every folder the server's container writes; builder "
        "launch on this machine applies it. A probe whose GPUs are not this machine's "
        "writes none. Each check says ok, FAIL or SKIP (what one GPU cannot measure); exit "
        "code 1 if one fails or the NVIDIA container runtime is missing, 9 if the Docker "
        "daemon does not answer.\n\n"
        "examples:\n"
        "  builder doctor --target sm120 --image $IMAGE --profile glm5-nvfp4-tp8-pcie-ar\n"
        "  builder doctor --container sglang-glm5      # what the running server compiled\n"
        "  builder doctor --p2p --image $IMAGE         # before the first start on a VM\n"
        "  builder doctor --p2p --image $IMAGE --profile glm5-nvfp4-tp8-pcie-ar --json\n"
        "  python3 -m builder.site.probes.p2p_probe > p2p.json   # a host with torch, no Docker\n"
        "  builder doctor --p2p --target sm120 --probe-result p2p.json",
    )
    add_project_options(doctor_cmd)
    doctor_cmd.add_argument(
        "--profile", help="launch profile whose TP size and memory to check (default: the target's)"
    )
    doctor_cmd.add_argument("--image", metavar="REF", help="image reference that should be present")
    doctor_cmd.add_argument(
        "--container",
        help="a server container: report FlashInfer modules it compiled at start-up (0 expected)",
    )
    # Its -v also shows the passing checks' hints (before or after the command, as anywhere).
    add_global_flags(
        doctor_cmd, verbose_help="show hints for passing checks too, and tracebacks on errors"
    )
    p2p_options = doctor_cmd.add_argument_group("peer-to-peer (--p2p)")
    p2p_options.add_argument(
        "--p2p", action="store_true",
        help="measure the GPUs' P2P fabric in the image and write the record launch applies",
    )  # fmt: skip
    p2p_options.add_argument(
        "--pcie-ipc", choices=("auto", "on", "off"), default="auto",
        help="FlashInfer's PCIe IPC all-reduce: auto runs it where flashinfer is installed, "
        "on fails without it (default: auto)",
    )  # fmt: skip
    p2p_options.add_argument(
        "--world", type=int, metavar="N", help="all-reduce world size (default: every GPU)"
    )
    p2p_options.add_argument(
        "--stage-timeout", default="120", metavar="SECONDS",
        help="a probe stage still running after this is killed and recorded as hung: "
        f"seconds, or with a unit ({UNITS}) (default: 120)",
    )  # fmt: skip
    p2p_options.add_argument(
        "--probe-result", metavar="FILE",
        help="judge a probe document saved earlier (python3 -m builder.site.probes.p2p_probe) "
        "instead of running the probe",
    )  # fmt: skip
    add_output_options(doctor_cmd)
    doctor_cmd.set_defaults(func=cmd_doctor)
