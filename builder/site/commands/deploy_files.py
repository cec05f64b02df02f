"""`builder deploy-files`: compose.yaml, the systemd unit and the secrets file of a launch
profile, the image pinned to its digest, written to --out or installed in place."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

from rich.markup import escape

from builder.core.cache import atomic_write_text
from builder.core.lazy import lazy_module
from builder.core.options import PROJECT, add_command, emit
from builder.site.commands.launch_options import add_launch_options, recipe_from_args

deploy = lazy_module("builder.site.deploy")
deploy_chosen = lazy_module("builder.site.commands.deploy_chosen")
progress = lazy_module("builder.core.progress")
validate = lazy_module("builder.core.validate")


def apply_chosen(args: argparse.Namespace) -> deploy_chosen.Chosen:
    """`--profile chosen`: the server a `qualify --sweep` chose (its chosen.json in
    --qualify-dir, checked against the receipt it cites) as the launch options."""
    chosen = deploy_chosen.load(args.qualify_dir)
    deploy_chosen.adopt(args, chosen)
    progress.info(escape(deploy_chosen.said(chosen, args.image)))
    return chosen


def cmd_deploy_files(args: argparse.Namespace) -> None:
    # Where it writes is checked before anything is looked up.
    if args.install:
        root = validate.writable_dir("--root", args.root)
    else:
        out = validate.writable_dir("--out", args.out).resolve()
    chosen = apply_chosen(args) if args.profile == "chosen" else None
    tag = None
    if args.image and not args.manifest:  # the recipe read from the digest that will run
        validate.image_reference("--image", args.image)
        pinned = deploy.pinned("--image", args.image)
        tag, args.image = (args.image if pinned != args.image else None), pinned
    recipe, source = recipe_from_args(args)
    deploy.refuse_unpinned(recipe.image, source)
    recipe = dataclasses.replace(recipe, image_tag=tag or "")
    if chosen:
        deploy_chosen.check_reproduces(recipe, chosen)
    # The unit runs compose where the files are installed, wherever they are written now.
    service_dir = deploy.service_dir(recipe.profile, recipe.engine)
    if args.install:
        deploy.refuse_clash(root, recipe.profile, recipe.port, recipe.container_name, recipe.engine)
        out = validate.writable_dir("--root", str(root / service_dir.lstrip("/")))
        units = validate.writable_dir("--root", str(root / deploy.SYSTEMD_DIR.lstrip("/")))
    else:
        units = out
    compose = out / "compose.yaml"
    unit = units / deploy.unit_name(recipe.profile, recipe.engine)
    env_file = out / deploy.env_file_name(recipe)
    # Every file's text (each checks every value it holds) before the first is written:
    # a refused value leaves nothing behind.
    texts = (
        deploy.compose_file(recipe),
        deploy.systemd_unit(recipe, service_dir),
        deploy.environment_file(recipe),
    )
    atomic_write_text(compose, texts[0])
    atomic_write_text(unit, texts[1])
    written = [str(compose), str(unit)]
    if env_file.exists():
        if env_file.stat().st_mode & 0o077:
            progress.warn(f"{env_file}: others can read it; chmod 600 {env_file}")
        kept = f"kept {env_file} (your secrets; not rewritten)"
    else:
        atomic_write_text(env_file, texts[2], mode=0o600)
        written.append(str(env_file))
        kept = None
    result = {
        "compose": str(compose),
        "systemd_unit": str(unit),
        "environment_file": str(env_file),
        "written": written,
        "recipe_from": source,
    }
    enable = f"systemctl daemon-reload && systemctl enable --now {unit.stem}"
    lines = [f"wrote {path}" for path in written] + ([kept] if kept else [])
    lines.append(f"secrets (HF_TOKEN): edit {env_file} (mode 0600)")
    if args.install:
        lines.append(f"then: {enable}")
    else:  # cp -n: a secrets file already there keeps its token
        compose_q, env_q, unit_q = map(shlex.quote, map(str, (compose, env_file, unit)))
        lines.append(
            f"on the VM (the unit runs compose in {service_dir}/): mkdir -p {service_dir} && "
            f"cp {compose_q} {service_dir}/ && cp -n {env_q} {service_dir}/ && cp {unit_q} "
            f"{deploy.SYSTEMD_DIR}/ && {enable}"
        )
    lines.append(f"ready when: {recipe.wait_ready_command()}")
    emit(args, result, lines)


def register(sub) -> None:
    deploy_cmd = add_command(
        sub,
        "deploy-files",
        cmd_deploy_files,
        "write a compose file and a systemd unit for the GPU VM",
        "Write compose.yaml (GPU reservation, host IPC, healthcheck with a start period that "
        "allows slow starts, no restart loop) and a systemd unit that runs it from "
        f"{deploy.INSTALL_DIR}/PROFILE/ (where --install puts them; with --out it says how to "
        "copy them there), for a launch profile and an image (--image, or a manifest's), "
        "pinned to its digest: a tag is resolved in its registry and kept in a comment. "
        "--profile chosen deploys the server a "
        "`qualify --sweep` chose (its chosen.json in --qualify-dir): the image by digest, "
        "profile, params, model, HF cache, port, API key file and extra args its receipt's "
        "server ran, compared with that server's command argument by argument; a flag that "
        "says otherwise is refused, and a param or HF cache it names mounts read-write "
        "outside its engine's state folder (/var/lib/sglang, /var/lib/vllm) only when your "
        "own --set or --hf-cache says the same.\n\n"
        "examples:\n"
        "  builder deploy-files --image $IMAGE --out deploy/   # then copy as it says\n"
        "  sudo builder deploy-files --image $IMAGE --install\n"
        "  sudo builder deploy-files --profile chosen --qualify-dir qualify/ --install",
        uses=(PROJECT,),
    )
    add_launch_options(deploy_cmd)
    deploy_cmd.add_argument(
        "--qualify-dir",
        default="qualify",
        metavar="DIR",
        help="with --profile chosen: the `qualify --sweep --out` folder whose chosen.json "
        "(and the receipt it cites) says what to deploy (default: ./qualify)",
    )
    deploy_cmd.add_argument("--out", default="deploy", help="output directory (default: ./deploy)")
    deploy_cmd.add_argument(
        "--install",
        action="store_true",
        help=f"put them in place instead: compose and the secrets file in "
        f"{deploy.INSTALL_DIR}/PROFILE/, the unit in {deploy.SYSTEMD_DIR}/ (refused when "
        "another profile's unit there uses the same port or container name)",
    )
    deploy_cmd.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="with --install: the file system root to install under (default: /)",
    )
