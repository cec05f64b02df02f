"""`qualify --start` (and each profile of `--sweep`): the server started from the launch
options, qualified, then stopped and removed; its log kept beside the receipt."""

from __future__ import annotations

from pathlib import Path

from builder.core.cache import atomic_write_text
from builder.core.errors import BuilderError
from builder.core.lazy import lazy_module
from builder.core.settings import resolve_data_dir
from builder.site.commands.launch import start_server
from builder.site.commands.launch_options import recipe_from_args
from builder.site.commands.qualify_run import Checked, Launched, Plan, run_checks
from builder.spec.target import load_target

docker_client = lazy_module("builder.core.docker_client")
image_recipe = lazy_module("builder.spec.recipe")
launch_profiles = lazy_module("builder.spec.launch_profiles")
progress = lazy_module("builder.core.progress")
docker = lazy_module("docker")


def profiles_for(args) -> launch_profiles.Profiles:
    """The launch profiles --start and --sweep start from: the image's recipe, else the
    checkout's target."""
    if args.image:
        return image_recipe.profiles_of(image_recipe.launch_recipe(args.image), args.image)
    return launch_profiles.Profiles.of(
        load_target(resolve_data_dir(args.data_dir), args.target).file
    )


def start_and_qualify(args, plan: Plan, out: Path, earlier: list | None = None) -> Checked:
    """`--start`: the server from the launch options, qualified, then stopped and removed
    (its log kept as out/server.log)."""
    recipe, _ = recipe_from_args(args)  # every input checked before a server starts
    known = profiles_for(args)
    start_server(recipe)
    progress.info(f"started {recipe.container_name} from {recipe.image}; qualifying it")
    args.container, args.image, args.profile = recipe.container_name, None, recipe.profile
    args.launched = Launched(recipe, known)
    try:
        return run_checks(args, recipe.url, plan, out, earlier)
    finally:
        if args.keep_server:
            progress.info(f"{recipe.container_name} keeps running (--keep-server)")
        else:
            _stop_server(recipe.container_name, out)


def _stop_server(name: str, out: Path) -> None:
    """Gracefully, as an operator would: SIGTERM, a minute to exit, then removed; its log
    is kept beside the receipt (server.log), since the container goes."""
    try:
        container = docker_client.connect().containers.get(name)
        container.stop(timeout=60)
        atomic_write_text(out / "server.log", container.logs().decode(errors="replace"))
        container.remove()
    except (BuilderError, docker.errors.NotFound, docker.errors.APIError, OSError) as exc:
        progress.warn(f"could not stop and remove {name}: {exc}; `docker rm -f {name}`")
        return
    progress.info(f"stopped and removed {name}, its log in {out / 'server.log'}")
