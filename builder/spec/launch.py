"""A launch profile resolved into the exact server command for a target's image.

A profile (`images/<target>/profiles.toml`, read by builder/spec/launch_profiles.py) holds
the server's arguments, environment, parameters (`{kv_cache_dtype}`), and what the server
must say it serves once ready. This module resolves one, with the operator's overrides,
into a recipe: the `docker run` for a Proxmox GPU VM, its mounts confined to the serving
state folder, its refusals, and the readiness check (site/deploy.py renders its files).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import progress
from builder.core.errors import BuilderError
from builder.spec import engines, model_check
from builder.spec.launch_profiles import (
    Profiles,
    derivations,
    derive,
    flatten,
    load_profiles,
    params_for,
    profile_number,
)

CONTAINER_MODEL_DIR = "/models"
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
# The Hugging Face cache's default, under the engine's state root (`hf_cache_default`): an
# absolute host path, as a system service has no $HOME (systemd sets none without User=).
HF_CACHE_FOLDER = "huggingface"
# The image's entrypoint (images/sm120/serve.py) hands the key in this file to sglang.
API_KEY_IN_CONTAINER = "/run/secrets/sglang-api-key"
# On the container `launch` and compose start: what wait-ready and qualify check it against.
PROFILE_LABEL = "io.builder.launch.profile"
PARAMS_LABEL = "io.builder.launch.params"  # JSON [[key, value], ...]: the --set overrides
_PARAM = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


@dataclass(frozen=True)
class Overrides:
    model: str | None = None
    port: int | None = None
    # The operator's own --set, on this command line: KEY for every profile, PROFILE:KEY
    # for one (params_for).
    params: tuple[tuple[str, str], ...] = ()
    extra_args: tuple[str, ...] = ()
    hf_cache: str | None = None  # None: hf_cache_default(the profile's engine)
    container_name: str | None = None
    bind: str = "127.0.0.1"  # host address the port is published on
    api_key_file: str | None = None  # mounted read-only; the key itself is never read here
    # Params a file supplies, not the operator: a sweep's chosen.json, or a profile's
    # fallback (named by `taken_from` in refusals). They win over `params` (a fallback is
    # tried for what it changes) but, like a profile's own, never mount outside
    # the engine's state root.
    taken_params: tuple[tuple[str, str], ...] = ()
    taken_from: str = ""


@dataclass(frozen=True)
class Recipe:
    profile: str
    description: str
    image: str
    container_name: str
    args: tuple[str, ...]
    env: dict[str, str]
    volumes: tuple[tuple[str, str, str], ...]  # (host, container, mode)
    port: int
    bind: str
    shm_size: str
    expect: dict[str, Any]
    ready_deadline_minutes: int
    experimental: bool
    warning: str
    params: tuple[tuple[str, str], ...] = ()  # the --set overrides this recipe was made with
    model: str = ""  # a hub id, or a folder on this machine by its absolute path (mounted)
    model_revision: str = ""  # the checkpoint revision the profile names (--revision)
    hf_cache: str = ""  # the host folder mounted as the Hugging Face cache ("" for a folder model)
    api_key_file: str = ""  # absolute; mounted read-only
    extra_args: tuple[str, ...] = ()  # --extra-arg, appended to the profile's args
    # (flag, host folder) of each read-write mount outside the engine's state root: the
    # operator's own flag on this command line put it there, and is told so.
    outside_state_root: tuple[tuple[str, str], ...] = ()
    # A line for each param the profile's `derived` table filled in from one the operator
    # set: said by the command that launches or deploys it.
    derived: tuple[str, ...] = ()
    # The tag the image was given by, when `image` is its digest: for people, never run.
    image_tag: str = ""
    engine: str = engines.DEFAULT  # whose server the args start (builder/spec/engines)

    @property
    def state_root(self) -> str:
        """Where its engine's profiles mount read-write (`outside_state_root` says where not)."""
        return state_root(self.engine)

    @property
    def model_is_local(self) -> bool:
        """A folder on this machine: `resolve` makes it absolute, and a hub id never starts
        with `/`."""
        return self.model.startswith("/")

    def served_from(self) -> dict:
        """What decides what this recipe serves besides its image, profile and params, as a
        qualify receipt records it (`server.launch`) and a sweep's chosen.json carries it to
        `deploy-files --profile chosen`."""
        return {
            "model": self.model or None,
            "model_revision": self.model_revision or None,
            "hf_cache": self.hf_cache or None,
            "port": self.port,
            "api_key_file": self.api_key_file or None,
            "extra_args": list(self.extra_args),
        }

    def docker_run(self, detach: bool = True) -> list[str]:
        command = ["docker", "run"]
        if detach:
            command.append("-d")
        command += [
            "--name", self.container_name,
            "--gpus", "all",
            "--ipc=host",
            "--shm-size", self.shm_size,
            "--ulimit", "memlock=-1",
            "--ulimit", "stack=67108864",
            "-p", f"{self.published_port}:{self.port}",
        ]  # fmt: skip
        for key, value in self.labels.items():
            command += ["--label", f"{key}={value}"]
        for host, container, mode in self.volumes:
            command += ["-v", f"{host}:{container}:{mode}"]
        for key, value in sorted(self.env.items()):
            command += ["-e", f"{key}={value}"]
        command += ["-e", "HF_TOKEN", self.image, *self.args]
        return command

    @property
    def labels(self) -> dict[str, str]:
        labels = {PROFILE_LABEL: self.profile}
        if self.params:
            labels[PARAMS_LABEL] = json.dumps([list(pair) for pair in self.params])
        return labels

    def shell(self) -> str:
        """The docker run as one shell line: every word quoted, except $HOME, which stays for
        the VM's shell to expand (`shlex.split` of it gives back `docker_run()`)."""
        return " ".join(_shell_word(part) for part in self.docker_run())

    @property
    def published_port(self) -> str:
        """`ADDR:PORT` on the host: loopback unless --bind opens it up."""
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        local = "127.0.0.1" if self.bind in ("0.0.0.0", "::") else self.bind
        return f"http://{f'[{local}]' if ':' in local else local}:{self.port}"

    def wait_ready_command(self) -> str:
        """The readiness check of exactly this recipe: its profile, params and image."""
        words = ["builder", "wait-ready", self.url, "--container", self.container_name,
                 "--profile", self.profile]  # fmt: skip
        if self.image not in ("-", ""):  # "-": no image yet (a checkout's manifest names it)
            words += ["--image", self.image]
        for key, value in self.params:
            words += ["--set", f"{key}={value}"]
        return " ".join(shlex.quote(word) for word in words)

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "description": self.description,
            "image": self.image,
            "container_name": self.container_name,
            "experimental": self.experimental,
            "warning": self.warning or None,
            "model": self.model or None,
            "model_revision": self.model_revision or None,
            "hf_cache": self.hf_cache or None,
            "args": list(self.args),
            "env": self.env,
            "volumes": [{"host": h, "container": c, "mode": m} for h, c, m in self.volumes],
            "port": self.port,
            "bind": self.bind,
            "shm_size": self.shm_size,
            "docker_run": self.docker_run(),
            "docker_run_shell": self.shell(),
            "readiness": {
                "url": self.url,
                "stages": list(engines.engine(self.engine).stages),
                "deadline_minutes": self.ready_deadline_minutes,
                "expect": self.expect,
                "command": self.wait_ready_command(),
            },
        }


def _substitute(value: Any, params: dict[str, str], where: str, path: Path | str) -> Any:
    if not isinstance(value, str):
        return value

    def replace(match: re.Match) -> str:
        key = match.group(1)
        if key not in params:
            raise BuilderError(f"{path}: {where} uses '{{{key}}}', which no param defines")
        return params[key]

    return _PARAM.sub(replace, value)


def resolve(
    source: Path | Profiles, profile_name: str | None, image: str, overrides: Overrides
) -> Recipe:
    """A profile resolved with the overrides; `source` is a target.toml or `Profiles`."""
    known = source if isinstance(source, Profiles) else Profiles.of(source)
    profiles, default, path = known.profiles, known.default, known.where
    name = profile_name or default
    profile = flatten(profiles, name, path)

    params = {k: str(v) for k, v in profile.get("params", {}).items()}
    refuse_control_characters(overrides)
    given = dict(params_for(overrides.params, name))
    taken = dict(overrides.taken_params)
    for key in (*given, *taken):
        if key not in params:
            known = ", ".join(sorted(params))
            flag = f"--set {key}" if key in given else f"{overrides.taken_from}: param {key}"
            raise BuilderError(f"{flag}: profile '{name}' has no such param (params: {known})")
    params |= given | taken
    derived = derive(derivations(profile, name, path), params, {*given, *taken}, name)
    # The operator's own: a --set on this command line whose value is the one that stands.
    own = {key for key, value in given.items() if params[key] == value}
    if overrides.port is not None:
        params["port"] = str(overrides.port)
    if "port" in params and not (params["port"].isdigit() and 0 < int(params["port"]) < 65536):
        raise BuilderError(f"--port {params['port']}: not a TCP port")

    volumes: list[tuple[str, str, str]] = []
    outside: list[tuple[str, str]] = []
    root = state_root(known.engine)
    given_model = overrides.model or (params["model"] if "model" in own else "")
    folder = model_dir(given_model) if given_model else None
    if not given_model and looks_like_path(params.get("model", "")):
        default = params["model"]
        who = (
            f"{overrides.taken_from}: param model={default!r} is a folder on this machine, "
            "which only your own --model mounts"
            if "model" in taken
            else f"{path}: profile '{name}': its default model {default!r} is a folder on "
            "this machine, which a profile does not choose to mount"
        )
        raise BuilderError(f"{who}; give --model DIR")
    hf_cache = ""
    if folder:
        model = folder
        params["model"] = f"{CONTAINER_MODEL_DIR}/{posixpath.basename(folder)}"
        volumes.append((folder, params["model"], "ro"))
    else:
        model = params["model"] = given_model or params.get("model", "")
        hf_cache = overrides.hf_cache or hf_cache_default(known.engine)
        hf_cache = host_path(hf_cache, f"--hf-cache {hf_cache}")
        volumes.append((hf_cache, HF_CACHE_IN_CONTAINER, "rw"))
        if not in_state_root(hf_cache, root):
            outside.append(("--hf-cache", hf_cache))

    for volume in profile.get("volumes", []):
        if not isinstance(volume, dict) or not {"host", "container"} <= volume.keys():
            raise BuilderError(f"{path}: profile '{name}' volumes need host and container")
        host = _substitute(volume["host"], params, f"profile '{name}' volumes", path)
        host, own_flag = _confine_volume(
            volume, host, own, set(taken), overrides.taken_from, f"{path}: profile '{name}'", root
        )
        if own_flag:
            outside.append((own_flag, host))
        volumes.append((host, volume["container"], "rw"))

    args = [_substitute(a, params, f"profile '{name}' args", path) for a in profile["args"]]
    rendered = list(args)
    args += list(overrides.extra_args)
    _check_refusals(profile.get("refuse", []), args, name, path)
    _refuse_contradictions(profile["args"], rendered, overrides.extra_args, name)
    model_check.check_speculative_settings(args, f"profile '{name}'")
    pattern = model_check.index_topk_pattern(args, f"profile '{name}'", known.engine)
    if pattern is not None:
        layers = profile.get("model_layers")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int)):
            raise BuilderError(f"{path}: profile '{name}' field 'model_layers' must be a number")
        model_check.check_pattern(pattern, layers, f"profile '{name}'")
    env = {
        k: _substitute(str(v), params, f"env {k}", path) for k, v in profile.get("env", {}).items()
    }
    if overrides.api_key_file:
        volumes.append((overrides.api_key_file, API_KEY_IN_CONTAINER, "ro"))
        env[engines.engine(known.engine).api_key_file_env] = API_KEY_IN_CONTAINER
    expect = {
        k: _substitute(v, params, f"expect {k}", path) for k, v in profile.get("expect", {}).items()
    }
    try:
        port = int(params.get("port", "30000"))
    except ValueError:
        raise BuilderError(f"port '{params.get('port')}' is not a number") from None
    return Recipe(
        profile=name,
        description=profile.get("description", ""),
        image=image,
        container_name=overrides.container_name or profile.get("container_name", "sglang"),
        args=tuple(args),
        env=env,
        volumes=tuple(volumes),
        port=port,
        bind=bind_address(overrides.bind),
        shm_size=profile.get("shm_size", "32g"),
        expect=expect,
        ready_deadline_minutes=int(
            profile_number(profile, "ready_deadline_minutes", 20, f"{path}: profile '{name}'")
        ),
        experimental=bool(profile.get("experimental", False)),
        warning=profile.get("warning", ""),
        params=tuple((given | taken).items()),
        model=model,
        model_revision=params.get("model_revision", ""),
        hf_cache=hf_cache,
        api_key_file=overrides.api_key_file or "",
        extra_args=overrides.extra_args,
        outside_state_root=tuple(outside),
        derived=derived,
        engine=known.engine,
    )


# `--model` names a folder on this machine when it starts like a path or names something
# that exists here (sglang's own test: os.path.exists); anything else must be a Hugging Face
# hub id, NAME or ORG/NAME. A profile's default model is never a folder (it is refused).
_PATH_STARTS = ("/", "./", "../", "~")
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"{_HUB_PART}(?:/{_HUB_PART})?")


def looks_like_path(value: str) -> bool:
    return value.startswith(_PATH_STARTS) or value in (".", "..") or value.startswith("$HOME")


def host_path(value: str, given_as: str) -> str:
    """A host folder given on the command line, absolute and normal: `~` (or a leading
    `$HOME`) expanded, a relative path taken from the working directory. Docker takes a
    relative `-v` source for a named volume; the host's root is never mounted (`given_as`,
    the flag and value as given, names it then)."""
    if value == "$HOME" or value.startswith("$HOME/"):
        value = "~" + value[len("$HOME") :]
    # normpath keeps a leading `//` (POSIX leaves its meaning to the system): one `/` here.
    folder = "/" + posixpath.normpath(os.path.abspath(os.path.expanduser(value))).lstrip("/")
    if folder == "/":
        raise BuilderError(f"{given_as}: the host's root folder is never mounted")
    return folder


def model_dir(model: str) -> str | None:
    """`--model`'s folder on this machine, absolute; None for a hub id (the rule above)."""
    if looks_like_path(model) or os.path.exists(model):
        return host_path(model, f"--model {model}")
    if _HUB_ID.fullmatch(model) and ".." not in model and "--" not in model:
        return None
    raise BuilderError(
        f"--model {model}: not a folder on this machine, nor a Hugging Face hub id (NAME or "
        "ORG/NAME); write a folder as a path: /DIR, ./DIR, ../DIR or ~/DIR"
    )


def state_root(engine: str) -> str:
    """Where a profile of `engine` may mount read-write on the VM: its state folder
    (/var/lib/sglang, /var/lib/vllm), unless the operator names the folder with --set. A
    profile comes from an image's recipe, which whoever pushed the image wrote: it does not
    choose what it mounts, nor a vLLM image's the folder sglang's caches are in."""
    return engines.engine(engine).state_root


def hf_cache_default(engine: str) -> str:
    return f"{state_root(engine)}/{HF_CACHE_FOLDER}"


def in_state_root(host: str, root: str) -> bool:
    """Under `root`, as written: absolute, normal (no `..` climbing out)."""
    return host.startswith("/") and posixpath.normpath(host) == host and host.startswith(f"{root}/")


def _confine_volume(
    volume: dict, host: str, own: set[str], taken: set[str], taken_from: str, where: str,
    root: str,
) -> tuple[str, str]:  # fmt: skip
    """(the host folder to mount, the operator's flag when it is theirs and outside `root`,
    else ''); a folder anyone else chose outside it is refused: the profile, or a param
    `taken` from `taken_from`."""
    template, container = volume["host"], volume["container"]
    if not (isinstance(template, str) and isinstance(container, str)):
        raise BuilderError(f"{where}: a volume's host and container must be strings")
    param = _PARAM.fullmatch(template)
    key = param.group(1) if param else None
    if key in own:  # the operator's own --set KEY=DIR on this command line
        if not host.startswith("/"):
            raise BuilderError(
                f"--set {key}={host}: a folder to mount must be an absolute path (Docker "
                "takes a relative one for a named volume)"
            )
        folder = host_path(host, f"--set {key}={host}")
        return folder, "" if in_state_root(folder, root) else f"--set {key}={host}"
    if in_state_root(host, root):
        return host, ""
    if key in taken:
        raise BuilderError(
            f"{taken_from}: {key}={host!r} would mount {host!r} read-write: outside "
            f"{root}/ only your own --set {key}=DIR on the command line may"
        )
    how = f" (or --set {key}=DIR)" if key else ""
    raise BuilderError(
        f"{where}: volume {host!r} refused: a profile mounts read-write only under {root}/{how}"
    )


def refuse_control_characters(overrides: Overrides) -> None:
    """What the command line (or chosen.json) gives goes into a docker run line,
    compose.yaml (its comments too) and a systemd unit: a line break there would add lines
    of its own."""
    given = [
        *((f"--set {key}", f"{key}={value}") for key, value in overrides.params),
        *((overrides.taken_from, f"{key}={value}") for key, value in overrides.taken_params),
        *(("--extra-arg", arg) for arg in overrides.extra_args),
        ("--model", overrides.model or ""),
        ("--hf-cache", overrides.hf_cache or ""),
        ("--api-key-file", overrides.api_key_file or ""),
    ]
    for flag, value in given:
        if not value.isprintable():
            raise BuilderError(
                f"{flag} {value!r}: a line break or another control character is not allowed"
            )


def _flag_values(args: list[str], flag: str) -> list[str]:
    values = [v.split("=", 1)[1] for v in args if v.startswith(f"{flag}=")]
    values += [args[i + 1] for i, v in enumerate(args[:-1]) if v == flag]
    return values


def _check_refusals(rules: Any, args: list[str], name: str, path: Path | str) -> None:
    """A profile's `refuse` rules: a flag value (from a param, --set or --extra-arg) that the
    profile's stack serves wrong is refused in one line saying why."""
    if not isinstance(rules, list):
        raise BuilderError(f"{path}: profile '{name}' field 'refuse' must be a list of tables")
    for rule in rules:
        if not isinstance(rule, dict) or not {"flag", "values", "why"} <= rule.keys():
            raise BuilderError(f"{path}: profile '{name}' refuse entries need flag, values, why")
        for value in _flag_values(args, rule["flag"]):
            if fnmatch.fnmatchcase(value, rule["values"]):
                raise BuilderError(
                    f"profile '{name}': {rule['flag']} {value} refused: {rule['why']}"
                )


def bind_address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise BuilderError(f"--bind {value}: not an IP address (e.g. 127.0.0.1, 0.0.0.0)") from None


def all_recipes(target_file: Path, image: str) -> dict[str, dict]:
    """Every profile with its default params, for the manifest."""
    profiles, _ = load_profiles(target_file)
    return {name: resolve(target_file, name, image, Overrides()).to_json() for name in profiles}


HOME = "$HOME"


def _shell_word(part: str) -> str:
    if HOME not in part:
        return shlex.quote(part)
    return '"$HOME"'.join(shlex.quote(piece) if piece else "" for piece in part.split(HOME))


def launched_with(
    labels: dict[str, str], params: tuple[tuple[str, str], ...]
) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """(profile, params) a container was started with, from the labels `launch` and compose
    put on it (profile None: started some other way); `params` (--set) win over its own."""
    try:
        launched = json.loads(labels.get(PARAMS_LABEL, "[]"))
        merged = {str(key): str(value) for key, value in launched} | dict(params)
    except (ValueError, TypeError):
        merged = dict(params)
    return labels.get(PROFILE_LABEL), tuple(merged.items())


def _refuse_contradictions(
    template: list[str], rendered: list[str], extra: tuple[str, ...], name: str
) -> None:
    """An --extra-arg may add a flag, never restate one the profile passes: sglang would
    take the last value while wait-ready and qualify check the profile's. A flag that is
    only a prefix of the profile's (`--tp` of `--tp-size`) is an abbreviation to argparse
    unless it is an option of its own (`--cuda-graph-max-bs`), which only sglang's parser
    knows: that one is a warning."""
    for arg in extra:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        for at, given in enumerate(rendered):
            if not (given.startswith("--") and given.startswith(flag)):
                continue
            value = rendered[at + 1] if at + 1 < len(rendered) else ""
            if value.startswith("--"):
                value = ""
            param = _PARAM.fullmatch(template[at + 1]) if value else None
            how = f"--set {param.group(1)}=VALUE" if param else "another profile"
            passes = f"profile '{name}' already passes {given} {value}".rstrip()
            if given == flag:
                raise BuilderError(
                    f"--extra-arg {arg}: {passes}; use {how} (the readiness check expects "
                    "the profile's value)"
                )
            progress.warn(
                f"--extra-arg {arg}: if sglang reads {flag} as short for {given}, it "
                f"overrides what the {passes}; use {how}"
            )
