"""`builder jit`: the target's FlashInfer kernel list, and kernels harvested from the field."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import add_cache_option, add_output_options, add_project_options, emit
from builder.core.settings import (
    resolve_cache_dir,
    resolve_data_dir,
)
from builder.spec.target import load_target

docker_client = lazy_module("builder.core.docker_client")
jit_list = lazy_module("builder.spec.jit.jit_list")
packs = lazy_module("builder.spec.jit.packs")
docker = lazy_module("docker")


def cmd_jit_list(args: argparse.Namespace) -> None:
    target = load_target(resolve_data_dir(args.data_dir), args.target)
    problems = jit_list.disagreements(target)
    modules = [
        {"generator": m.generator, "loaded_when": m.loaded_when, "call_site": m.call_site}
        for m in target.jit
    ]
    by_profile = jit_list.modules_by_profile(target)
    lines = [f"{m['generator']}\n    when {m['loaded_when']}: {m['call_site']}" for m in modules]
    lines += [
        f"profile {profile}: {len(loaded)} module(s): "
        + ", ".join(generator.split(":")[-1] for generator in loaded)
        for profile, loaded in by_profile.items()
    ]
    lines += [f"DISAGREES: {problem}" for problem in problems]
    result = {
        "target": target.name,
        "modules": modules,
        "profiles": by_profile,
        "disagreements": problems,
    }
    emit(args, result, lines, ok=not problems)
    if problems:
        raise SystemExit(1)


def cmd_jit_harvest(args: argparse.Namespace) -> None:
    out = Path(args.out) if args.out else packs.packs_dir(resolve_cache_dir(args.cache_dir))
    if args.container:
        client = docker_client.connect()
        try:
            container = client.containers.get(args.container)
        except docker.errors.NotFound:
            raise BuilderError(f"--container {args.container}: no such container") from None
        modules, pack = packs.harvest_container(container, out)
        where = f"container {args.container}"
    else:
        workspace = Path(args.workspace)
        if not (workspace / ".cache" / "flashinfer").is_dir():
            raise BuilderError(
                f"--workspace {workspace}: no .cache/flashinfer inside "
                "(pass FlashInfer's workspace base: FLASHINFER_WORKSPACE_BASE, or $HOME)"
            )
        modules, pack = packs.harvest_workspace(workspace, out)
        where = f"workspace {workspace}"
    names = [module.name for module in modules]
    calls = packs.pack_record(pack)["modules"] if pack else {}
    unknown = [name for name in names if not calls.get(name)]
    result = {"modules": names, "pack": str(pack) if pack else None, "generators": calls}
    if pack:
        lines = [
            f"harvested {len(names)} module(s) compiled at run time in {where}: {', '.join(names)}",
            f"kernel pack: {pack}",
            "the next `builder image` with this cache compiles them from its own flashinfer "
            "source (copy the pack into <cache>/kernel-packs/ on another build host)",
        ]
        lines += [
            f"warning: {name}: no journal named its generator call (a server without "
            "builder's image?): add it to the target's [[jit.modules]]"
            for name in unknown
        ]
    else:
        lines = [f"nothing to harvest: {where} compiled no FlashInfer module at run time"]
    emit(args, result, lines)


def register(sub) -> argparse._SubParsersAction:
    """The `jit` command; its actions, where the build host's `keygen` joins them."""
    jit_cmd = sub.add_parser(
        "jit",
        help="the FlashInfer kernel list; harvest kernels a server compiled at start-up",
        description="`list` shows the target's pre-compiled FlashInfer modules with the "
        "sglang call site that loads each, and checks them against the launch profiles. "
        "`harvest` names the modules a running (or stopped) server compiled itself, so the "
        "next `builder image` compiles them and the next start compiles nothing.",
    )
    jit_sub = jit_cmd.add_subparsers(dest="jit_command", required=True, metavar="ACTION")

    listing = jit_sub.add_parser(
        "list",
        help="the target's modules, call sites, and whether they agree with the profiles",
        description="Exit code 1 when a profile setting loads FlashInfer modules that are not "
        "listed, or a listed module is loaded by no profile.\n\n"
        "example: builder jit list --target sm120",
    )
    add_project_options(listing)
    add_output_options(listing)
    listing.set_defaults(func=cmd_jit_list)

    harvest = jit_sub.add_parser(
        "harvest",
        help="name the FlashInfer modules a server compiled at run time, for the next build",
        description="Reads what the server compiled at run time (the container's FlashInfer "
        "workspace against its image: `docker diff`, so a stopped container works too), and "
        "writes one kernel pack: each module's name and the FlashInfer generator call that "
        "made it (noted by the image's JIT journal), keyed by the exact flashinfer build and "
        "arch. No compiled file of the server is kept: `builder image` compiles every module "
        "of the matching packs in its cache from its own flashinfer source, and checks that "
        "each call makes a module of that name.\n\n"
        "example: builder jit harvest --container sglang-glm5",
    )
    source = harvest.add_mutually_exclusive_group(required=True)
    source.add_argument("--container", help="container name or id (on this Docker engine)")
    source.add_argument(
        "--workspace",
        help="a FlashInfer workspace base on this machine (on bare metal FlashInfer uses "
        "$FLASHINFER_WORKSPACE_BASE, else $HOME: pass that)",
    )
    harvest.add_argument(
        "--out", help="folder for the pack (default: <cache>/kernel-packs, where image looks)"
    )
    add_cache_option(harvest)
    add_output_options(harvest)
    harvest.set_defaults(func=cmd_jit_harvest)
    return jit_sub
