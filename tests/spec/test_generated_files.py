"""Generated files read back by real parsers give exactly the intended argv and env:
compose YAML (PyYAML, then compose's own `$$` rule), the systemd unit (configparser, the
INI dialect systemd reads), and the printed docker run (`shlex.split`, as a shell does)."""

from __future__ import annotations

import configparser
import dataclasses
import shlex

import pytest
import yaml

from builder.core.errors import BuilderError
from builder.site import deploy
from builder.spec import launch
from tests.conftest import REPO_ROOT

TARGET = REPO_ROOT / "images/sm120-0.5.9/target.toml"
IMAGE = "registry.example/ml/sglang-sm120@sha256:" + "a" * 64
AWKWARD = 'pa$$word "quoted" it\'s — ñandú'  # $, quotes, spaces, non-ASCII


def _recipe() -> launch.Recipe:
    overrides = launch.Overrides(
        model="/data/models dir/GLM-5 ñ",
        extra_args=("--served-model-name", AWKWARD, "--chat-template", "$HOME/tpl.jinja"),
        hf_cache="$HOME/hf cache/ü",
    )
    return launch.resolve(TARGET, None, IMAGE, overrides)


def _compose_interpolated(value: str) -> str:
    """What compose makes of a value: `$$` is a literal `$`; `${HOME}` comes from the VM."""
    assert "$" not in value.replace("$$", "").replace("${HOME}", ""), value
    return value.replace("$$", "\0").replace("${HOME}", "$HOME").replace("\0", "$")


def test_compose_round_trips_args_env_and_volumes() -> None:
    recipe = _recipe()
    service = yaml.safe_load(deploy.compose_file(recipe))["services"]["sglang"]
    assert [_compose_interpolated(a) for a in service["command"]] == list(recipe.args)
    assert AWKWARD in [_compose_interpolated(a) for a in service["command"]]
    environment = dict(service["environment"])
    assert environment.pop("HF_TOKEN") == "${HF_TOKEN:-}"  # from the VM's environment
    assert {k: _compose_interpolated(v) for k, v in environment.items()} == recipe.env
    volumes = [_compose_interpolated(v) for v in service["volumes"]]
    assert volumes == [f"{h}:{c}:{m}" for h, c, m in recipe.volumes]
    assert service["ports"] == ["127.0.0.1:30000:30000"]


def test_printed_docker_run_round_trips_through_a_shell_split() -> None:
    recipe = _recipe()
    assert shlex.split(recipe.shell()) == recipe.docker_run()
    assert '"$HOME"' in recipe.shell()  # left for the VM's shell, unquoted $ nowhere else
    assert AWKWARD in recipe.docker_run()


def test_systemd_unit_reads_back_with_the_directory_as_given() -> None:
    recipe = _recipe()
    directory = "/srv/sglang deploy/ñ"
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(deploy.systemd_unit(recipe, directory))
    service = unit["Service"]
    assert service["WorkingDirectory"] == directory
    assert service["ExecStart"].split()[:3] == ["/usr/bin/docker", "compose", "up"]
    assert service["Restart"] == "on-failure"
    assert unit["Unit"]["StartLimitBurst"] == "5"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"profile": "x/../../../../escape/evil"}, "profile name"),
        ({"profile": "p\nExecStartPre=/bin/sh -c id"}, "profile name"),
        ({"container_name": "glm5\n    privileged: true"}, "container name"),
        ({"image": "reg.example/x:y\n    pid: host"}, "not an image reference"),
        ({"shm_size": "32g\n    privileged: true"}, "shm size"),
        ({"env": {"A\n    privileged": "true"}}, "env key"),
    ],
)
def test_injected_values_never_reach_a_generated_file(change: dict, named: str) -> None:
    """Values from the command line, a manifest or a pulled image's recipe that would add
    lines to compose.yaml or the unit, or put the unit outside --out, are refused."""
    recipe = dataclasses.replace(_recipe(), **change)
    for write in (deploy.compose_file, lambda r: deploy.systemd_unit(r, "/srv/deploy")):
        with pytest.raises(BuilderError, match=named):
            write(recipe)
