"""`builder launch`: print the exact docker run of a launch profile, or (--run) start it
here and wait until it is ready."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess

from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.options import PROJECT, add_command, emit
from builder.site.commands.launch_options import add_launch_options, recipe_from_args
from builder.site.commands.wait_ready import (
    WAIT_FLAGS,
    add_wait_options,
    wait_and_report,
    wait_durations,
)

docker_client = lazy_module("builder.core.docker_client")
doctor = lazy_module("builder.site.doctor")
launch = lazy_module("builder.spec.launch")
progress = lazy_module("builder.core.progress")
docker = lazy_module("docker")


def cmd_launch(args: argparse.Namespace) -> None:
    waiting = [flag for flag, attr in WAIT_FLAGS if getattr(args, attr) is not None]
    if waiting and not args.run:
        raise BuilderError(f"{waiting[0]}: only with --run (it waits for the server it starts)")
    deadline_s = wait_durations(args, poll_default="5")
    recipe, source = recipe_from_args(args)
    if not args.run:
        emit(args, {**recipe.to_json(), "recipe_from": source}, [recipe.shell()])
        return
    # --gpus all needs the NVIDIA runtime: said as `builder doctor` says it, before a start
    doctor.require_gpu_runtime(docker_client.connect().info())
    start_server(recipe)
    progress.info(f"started {recipe.container_name}; waiting for it to be ready")
    deadline = recipe.ready_deadline_minutes * 60 if deadline_s is None else deadline_s
    wait_and_report(args, recipe.url, recipe.container_name, recipe.expect, deadline, recipe.engine)


def start_server(recipe: launch.Recipe) -> None:
    """`docker run` the very command `launch` prints, so what runs is what the manifest
    records. Only $HOME is expanded, as the VM's shell does for the printed line."""
    client = docker_client.connect()
    try:
        client.containers.get(recipe.container_name)
    except docker.errors.NotFound:
        pass
    else:
        raise BuilderError(
            f"a container named {recipe.container_name} exists: stop it gracefully with "
            f"`docker stop {recipe.container_name} && docker rm {recipe.container_name}`, "
            "or pass --name"
        )
    home = os.path.expanduser("~")
    command = [part.replace(launch.HOME, home) for part in recipe.docker_run()]
    try:  # a first run pulls the image: minutes for a server image
        started = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if started.returncode:
            raise BuilderError(f"docker run failed: {doctor.docker_failure(started.stderr)}")
    except BaseException as exc:
        # docker run may have created the container before failing to start it (port taken,
        # no NVIDIA runtime) or being interrupted: the name was free above, so it is ours.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["docker", "rm", "-f", recipe.container_name], capture_output=True, timeout=60
            )
        if isinstance(exc, subprocess.TimeoutExpired):
            raise BuilderError("docker run: no answer within an hour (pulling the image?)") from exc
        raise


def register(sub) -> None:
    launch_cmd = add_command(
        sub,
        "launch",
        cmd_launch,
        "print (or --run) the exact docker run for a launch profile",
        "Print the docker run that starts the server on a GPU VM: the image (--image REF as "
        "given, or by digest from the manifest), --gpus all, --ipc=host, shm size, model cache "
        "volume, port, environment and the sglang command line of the profile. With --run, "
        "start it and wait until it is ready (see wait-ready).\n\n"
        "examples:\n"
        "  builder launch --image $IMAGE   # on the GPU VM: the image's own profiles\n"
        "  builder launch --target sm120   # on the build host: the latest manifest's image\n"
        "  builder launch --image $IMAGE --model /data/GLM-5-NVFP4 "
        "--set cuda_graph_max_bs_decode=128\n"
        "  builder launch --image $IMAGE --profile glm5-nvfp4-tp8-fusion   # experimental, "
        "prints a warning",
        uses=(PROJECT,),
    )
    add_launch_options(launch_cmd)
    launch_cmd.add_argument("--run", action="store_true", help="start it here and wait-ready")
    add_wait_options(launch_cmd, poll_default="5", when="with --run: ")
