"""Fixtures of the GPU VM's tests: the stand-in vLLM server (the sglang one, used beyond
tests/site, is in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from docker.errors import NotFound

from tests.conftest import REPO_ROOT, STANDIN
from tests.services import free_port

# The stand-in vLLM server (no GPU exists here), given the args a sm120-vllm profile renders;
# it plays the sglang stand-in's model, mounted beside it.
STANDIN_VLLM = REPO_ROOT / "tests" / "standin_vllm.py"
VLLM_TARGET = REPO_ROOT / "images" / "sm120-vllm" / "target.toml"


def rendered_args(profile: str, port: int) -> tuple[str, ...]:
    """`vllm serve`'s args as the profile renders them, listening on `port`."""
    from builder.spec import launch, launch_profiles

    known = launch_profiles.Profiles.of(VLLM_TARGET)
    overrides = launch.Overrides(port=port)
    return launch.resolve(known, profile, "-", overrides).args


@pytest.fixture
def vllm_standin(docker_client, test_base):
    started = []

    def start(
        profile: str, volumes: dict | None = None, args: tuple = (), **env: str
    ) -> tuple[str, str]:
        port = free_port()
        name = f"standin-vllm-{uuid.uuid4().hex[:8]}"
        docker_client.containers.run(
            test_base,
            ["python3", "/standin_vllm.py", str(port), *rendered_args(profile, port), *args],
            name=name,
            detach=True,
            network_mode="host",
            environment=env,
            volumes={
                str(STANDIN_VLLM): {"bind": "/standin_vllm.py", "mode": "ro"},
                str(STANDIN): {"bind": "/standin_sglang.py", "mode": "ro"},
                **(volumes or {}),
            },
        )
        started.append(name)
        return f"http://127.0.0.1:{port}", name

    yield start
    for name in started:
        with contextlib.suppress(NotFound):
            docker_client.containers.get(name).remove(force=True)
