"""Shared fixtures: real upstream repositories (from PyPI sdists) and a project data copy.

The pins in the copy point at the fixture commits through the documented mechanism
(`--data-dir` with edited pin.toml files), and every URL reaches the fixture through
`--mirror https://github.com/=git://127.0.0.1:PORT/` (a real git daemon on loopback),
exactly what an air-gapped site does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docker.errors import NotFound

from builder.spec.target import load_target
from tests import upstreams
from tests.services import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]

# jsonschema builds rfc3987-syntax's lark grammars at import (3.5 s of CPU in every worker's
# collection) for one format, "iri-reference", which none of the suite's schemas uses: left
# out, as builder's SBOM check does (builder/build/sbom.py).
sys.modules.setdefault("rfc3987_syntax", None)


def validate_manifest(manifest: dict) -> None:
    """Against manifests/schema-v1.json, the contract a manifest's readers rely on."""
    import jsonschema

    schema = json.loads((REPO_ROOT / "manifests/schema-v1.json").read_text())
    jsonschema.validate(manifest, schema, format_checker=jsonschema.FormatChecker())


# The integration suite builds the sm120 image family from what PyPI has as source: the
# sglang 0.5.9 and flashinfer 0.6.3 sdists, i.e. target sm120-0.5.9. Every builder run in
# it (in-process or not) defaults to that target; tests of the current target (sglang
# 0.5.23 from its released wheel, flashinfer 0.7.2) name `--target sm120` themselves
# (tests/build/test_current_stack.py).
STACK_TARGET = "sm120-0.5.9"
os.environ["BUILDER_TARGET"] = STACK_TARGET
# The fixture upstreams (tests/upstreams.py) are the pins of these fork folders.
FORK_DIRS = {"sglang": "sglang-0.5.9", "flashinfer": "flashinfer-0.6.3"}


@dataclass(frozen=True)
class Upstreams:
    root: Path
    commits: dict[str, str]
    served: str  # git://127.0.0.1:PORT/ of the git daemon serving `root`

    @property
    def mirror(self) -> str:
        return f"https://github.com/={self.served}"


# `scripts/test` runs three pytest workers (`-n 3 --dist loadgroup`), and all use one Docker
# engine (tests/services.py `once_per_run`): one copy of the test runtime's gigabytes, built
# once. The engine's tests are three groups, each run in order by one worker: the kernel
# sharing tests (their images under a repository of their own), the current stack's images
# (sm120's, then sm120-vllm's on its runtime layer; their own repositories too: a third of
# the engine's work in two tests) and all the others.
# Every other module is a group of its own (its module fixtures made once). The long groups
# are handed out first, so that the short ones fill in around them (longest first: the run
# ends when its last group does); xdist's own order, most tests first, would leave the
# one-test group of the current stack to the end.
_ENGINE_FIXTURES = {"docker_host", "docker_client", "registry"}
# A test that reaches the engine itself (not the registry alone) is marked `engine`:
# `./scripts/test -m "not engine"` leaves them out (no test base, no image, no kernel) for a
# quicker loop while editing; the test command and CI run them.
_ENGINE_ITSELF = {"docker_host", "docker_client"}
_ENGINE_GROUPS = {
    "tests.build.test_current_stack": "docker-engine-current-stack",
    "tests.build.test_kernels_shared": "docker-engine-kernels-shared",
    "tests.build.test_vllm_image": "docker-engine-current-stack",
}
_LONGEST_FIRST = ["docker-engine-current-stack", "docker-engine", "docker-engine-kernels-shared"]
_SHARED_KEY = pytest.StashKey[Path]()


@pytest.hookimpl(trylast=True)  # after the tmp_path plugin has made the run's basetemp
def pytest_configure(config: pytest.Config) -> None:
    """The controller makes the run's shared folder; its workers inherit it."""
    from tests.services import SHARED_DIR_ENV

    if hasattr(config, "workerinput") or SHARED_DIR_ENV in os.environ:
        return
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # the order is pytest_collection_modifyitems'
    shared = config._tmp_path_factory.getbasetemp() / "shared"  # the workers' basetemp's parent
    shared.mkdir()
    os.environ[SHARED_DIR_ENV] = str(shared)
    # The run is one build host: its kernel host key (builder/build/kernels/trust.py) is the run's,
    # never the user's own.
    os.environ["XDG_STATE_HOME"] = str(shared / "state")
    config.stash[_SHARED_KEY] = shared


# First: the tmp_path plugin's own deletes the basetemp (the shared folder's records too).
@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every worker has finished: the shared engine and index stop, the engine's
    data goes."""
    from tests.services import stop_shared_services

    if shared := session.config.stash.get(_SHARED_KEY, None):
        # Without workers (-p no:xdist), a run stopped early (-x, Ctrl-C) still holds its
        # session fixtures (containers on the engine): they go first, as pytest's runner
        # plugin would do after this hook.
        try:
            session._setupstate.teardown_exact(None)
        finally:
            stop_shared_services(shared)


# tryfirst: before xdist reads the groups into the node ids, and before `-m` deselects by
# the `engine` marker set here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # By the fixtures it asks for (directly or through others), not by the module's
        # `docker` marker: a test of a docker module that reaches no engine (bad input, a
        # daemon that is down) runs beside the engine's groups.
        module = item.module.__name__
        # heavy and gpu keep their own commands (benches, GPU machines): not engine.
        own_command = item.get_closest_marker("heavy") or item.get_closest_marker("gpu")
        if _ENGINE_ITSELF & set(item.fixturenames) and not own_command:
            item.add_marker(pytest.mark.engine)
        if _ENGINE_FIXTURES & set(item.fixturenames):
            group = _ENGINE_GROUPS.get(module, "docker-engine")
        else:
            group = module
        item.add_marker(pytest.mark.xdist_group(group))
    _leave_out_what_has_its_own_command(config, items)
    rank = {group: place for place, group in enumerate(_LONGEST_FIRST)}
    items.sort(  # stable: in a group, the collection's order
        key=lambda item: rank.get(item.get_closest_marker("xdist_group").args[0], len(rank))
    )


def _leave_out_what_has_its_own_command(config: pytest.Config, items: list[pytest.Item]) -> None:
    """heavy (hours of nvcc) and gpu (a GPU machine) run only where `-m` names them: any
    other `-m` (`-m "not engine"`, `-m engine`) replaces addopts' own and would take them in."""
    expression = config.getoption("markexpr") or ""
    named = {marker for marker in ("heavy", "gpu") if marker in expression}
    left_out = [
        item for item in items
        if any(item.get_closest_marker(m) for m in ("heavy", "gpu") if m not in named)
    ]  # fmt: skip
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]


@pytest.fixture(scope="session")
def github() -> Upstreams:
    """The fixture upstreams (sglang 0.5.9, flashinfer 0.6.3 with its submodules), served by
    one git daemon for the run (the workers only read them)."""
    from tests.services import once_per_run

    def make(root: Path) -> dict:
        made, process = serve_upstreams(root)
        return {"root": str(root), "commits": made.commits, "served": made.served,
                "pids": [process.pid]}  # fmt: skip

    made = once_per_run("github", make)
    return Upstreams(Path(made["root"]), made["commits"], made["served"])


def serve_upstreams(
    root: Path, *, allow_any_sha: bool = False
) -> tuple[Upstreams, subprocess.Popen]:
    """The fixture upstreams made under `root` and served by a git daemon (to be stopped by
    the caller): the one way the suite and the benches make them, so a bench cannot drift
    from what the tests run."""
    from tests.services import start_git_daemon

    commits = upstreams.build_all(root)
    process, served = start_git_daemon(root, allow_any_sha=allow_any_sha)
    return Upstreams(root, commits, served), process


def set_pin(data_dir: Path, fork: str, **fields: str) -> None:
    """Edit the pin of upstream `fork` (its folder in the suite's target) in a data copy."""
    pin = data_dir / "forks" / FORK_DIRS.get(fork, fork) / "pin.toml"
    text = pin.read_text()
    for key, value in fields.items():
        text, count = re.subn(rf'(?m)^{key} = ".*"$', f'{key} = "{value}"', text)
        assert count == 1, f"{pin} has no top-level {key}"
    pin.write_text(text)


def make_data_dir(destination: Path, github: Upstreams) -> Path:
    """A copy of the project's images/ and forks/ pinned to the fixture commits."""
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, destination / folder)
    for fork, commit in github.commits.items():
        set_pin(destination, fork, commit=commit)
    return destination


@pytest.fixture
def data_dir(tmp_path: Path, github: Upstreams) -> Path:
    return make_data_dir(tmp_path / "data", github)


@dataclass
class Builder:
    """Runs the real `builder` CLI in a subprocess against one cache and data directory."""

    data_dir: Path
    cache_dir: Path
    mirror: str
    wheelhouse: Path
    env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def _split(args: tuple[str, ...]) -> tuple[str, list[str]]:
        """(the command, e.g. "image" or "patches check", the rest of `args`)."""
        command, *rest = args
        if command in ("patches", "upstream"):  # these take the options after the action
            command, rest = f"{command} {rest[0]}", rest[1:]
        return command, rest

    def command(self, *args: str) -> list[str]:
        command, rest = self._split(args)
        options = [] if command == "verify" else ["--data-dir", str(self.data_dir)]
        fetches = ("sources", "patch", "wheels", "lock", "image", "publish", "patches", "upstream")
        if command.split()[0] in fetches and command != "patches list":
            options += ["--cache-dir", str(self.cache_dir), "--mirror", self.mirror]
        if command in ("wheels", "lock", "image", "publish"):
            options += ["--wheelhouse", str(self.wheelhouse)]
        return [sys.executable, "-m", "builder.cli.main", *command.split(), *options, *rest]

    def run(
        self, *args: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "COLUMNS": "200",
            "BUILDER_CONFIG": "/nonexistent",
            **self.env,
            **(env or {}),
        }
        from tests.cpu_profile import note_steps, span

        name = self._split(args)[0] + (" --plan" if "--plan" in args else "")
        with span("builder", name) as noted:
            result = subprocess.run(
                self.command(*args), capture_output=True, text=True, env=env, cwd=REPO_ROOT
            )
            note_steps(noted, result.stderr)
        if check and result.returncode != 0:
            raise AssertionError(f"builder {' '.join(args)} failed:\n{result.stderr}")
        return result


def builder_in(root: Path, github: Upstreams, docker_host: str | None = None) -> Builder:
    """A Builder with its own data copy, cache and wheelhouse under `root`."""
    env = {"DOCKER_HOST": docker_host} if docker_host else {}
    return Builder(
        make_data_dir(root / "data", github), root / "cache", github.mirror, root / "wheelhouse",
        env=env,
    )  # fmt: skip


def seed_cache(
    builder: Builder, source: Path, folders: tuple[str, ...] = ("mirrors", "wheels")
) -> None:
    """The mirrors and fork wheels of cache `source` in `builder`'s, hard-linked: its `sources`
    finds the pinned commits without a fetch and its `wheels` the keys without a build. For a
    build host whose fetch and wheel build are not what its test is about (libgit2 writes a
    repository's files anew and renames them, wheel entries are only read: no link is
    written through). Another worker may be writing to `source` meanwhile: a file that
    goes before it is linked (a temporary pack, a staging folder) is left out."""
    for folder in folders:
        for path in sorted((source / folder).rglob("*")):
            relative = path.relative_to(source)
            if (
                path.is_dir()
                or path.suffix == ".lock"
                or any(part.startswith(".") for part in relative.parts)
            ):
                continue
            link = builder.cache_dir / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.link(path, link)


@pytest.fixture
def builder(tmp_path: Path, data_dir: Path, github: Upstreams) -> Builder:
    return Builder(data_dir, tmp_path / "cache", github.mirror, tmp_path / "wheelhouse")


def _fork_wheels_run(github: Upstreams) -> dict:
    from tests.services import once_per_run

    def build(root: Path) -> dict:
        builder = builder_in(root, github)
        result = json.loads(builder.run("wheels", "--json").stdout)
        paths = {"data": builder.data_dir, "cache": builder.cache_dir, "wheels": builder.wheelhouse}
        return {**{name: str(path) for name, path in paths.items()}, "result": result}

    return once_per_run("fork-wheels", build)


@pytest.fixture(scope="session")
def fork_wheels(github: Upstreams) -> Path:
    """A cache holding the suite's fork wheels (sglang 0.5.9, flashinfer 0.6.3) and the
    mirrors they came from, fetched and built by `builder wheels` from an empty cache once
    per run, for every worker: what a test whose subject is neither the fetch nor the wheel
    build seeds its own cache from (`seed_cache`)."""
    return Path(_fork_wheels_run(github)["cache"])


@pytest.fixture(scope="session")
def fork_wheels_build(github: Upstreams) -> tuple[Builder, dict]:
    """That same run of `builder wheels` from nothing (no mirror, no work tree, no wheel):
    its builder and `--json` record, for the tests of the fetch and the build themselves.
    Other tests read its cache meanwhile: only a run that changes nothing goes on it."""
    made = _fork_wheels_run(github)
    builder = Builder(
        data_dir=Path(made["data"]), cache_dir=Path(made["cache"]), mirror=github.mirror,
        wheelhouse=Path(made["wheels"]),
    )  # fmt: skip
    return builder, made["result"]


# --- real services ---------------------------------------------------------------------------

REGISTRY_USER = "builder"
REGISTRY_PASSWORD = "s3cret-registry-pass"


@pytest.fixture(scope="session")
def docker_host() -> str:
    if not shutil.which("dockerd") and not os.environ.get("BUILDER_TEST_DOCKER_HOST"):
        pytest.skip("dockerd not installed (scripts/setup --test installs docker.io)")
    from tests.services import shared_dockerd

    return shared_dockerd()


@pytest.fixture(scope="session")
def docker_client(docker_host: str):
    import docker

    return docker.DockerClient(base_url=docker_host, timeout=900)


@pytest.fixture(scope="session")
def test_base(docker_client) -> str:
    from tests.services import build_test_base, once_per_run

    made = once_per_run("test-base", lambda folder: {"tag": build_test_base(docker_client, folder)})
    return made["tag"]


@pytest.fixture(scope="session")
def runtime_index_served() -> tuple[str, Path]:
    """A pypiserver holding what the test image's runtime stage needs, for offline builds: one
    for the run, since its URL is a build argument of the runtime stage (another URL, another
    runtime layer). Not the current stack's 3 GB of torch wheels: the test image's first
    build (every engine test waits for it) would wait for their download on a cold cache;
    that image's test serves them itself."""
    from tests.services import (
        IMAGE_RUNTIME_LOCK,
        once_per_run,
        runtime_wheelhouse,
        start_pypiserver,
    )

    def start(folder: Path) -> dict:
        process, port = start_pypiserver(runtime_wheelhouse(), folder / "pypiserver.log")
        return {"url": f"http://127.0.0.1:{port}/simple/", "pids": [process.pid]}

    return once_per_run("runtime-index", start)["url"], IMAGE_RUNTIME_LOCK


@pytest.fixture(scope="session")
def current_stack_wheels() -> Path:
    """The current stack's runtime wheels (PyPI's torch 2.7.1 and its CUDA libraries, 3 GB),
    cached per machine; on a cold cache downloaded once, by the first test to ask, while
    the test image's builds go on."""
    from tests.services import CURRENT_STACK_RUNTIME_LOCK, once_per_run, runtime_wheelhouse

    def download(folder: Path) -> dict:
        return {
            "path": str(runtime_wheelhouse(CURRENT_STACK_RUNTIME_LOCK)),
            "remove": [str(folder)],
        }

    return Path(once_per_run("current-stack-wheels", download)["path"])


# The suite's base is Debian trixie (Python 3.13): no Python 3.12 base can be made here
# (Debian's mirror has none, PyPI has no interpreter). A site on a Python 3.13 base re-pins
# the release to its cp313 file, as sm120's image test does: file, sha256 and the commit
# builder names for it. vLLM's release is one abi3 file for every Python.
CP313_RELEASE = "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl"
VLLM_PIN = tomllib.loads((REPO_ROOT / "forks/vllm/pin.toml").read_text())


@pytest.fixture(scope="session")
def current_stack_index(current_stack_wheels: Path, tmp_path_factory) -> int:
    """One loopback index for the current stack's images: the releases builder downloads
    through --mirror (sglang's cp313 wheel, vLLM's), and the runtime stage's wheels (PyPI's
    torch 2.7.1: flashinfer 0.7.2 needs torch >= 2.7, newer than the test base's). Its URL
    is a build argument of the runtime stage: one index for both targets, so the second
    image takes the first one's 3 GB runtime layer (another lock, another layer than the
    test image's, so neither waits for the other). Returns its port."""
    from tests.services import start_pypiserver
    from tests.upstreams import fetch_release_file

    releases = tmp_path_factory.mktemp("current-stack-releases")
    shutil.copy(fetch_release_file("sglang", CP313_RELEASE), releases)
    shutil.copy(fetch_release_file("vllm", VLLM_PIN["ref"]), releases)
    process, port = start_pypiserver(
        [releases, current_stack_wheels], releases.parent / "current-stack-index.log"
    )
    yield port
    process.terminate()


@pytest.fixture(scope="session")
def runtime_index(runtime_index_served: tuple[str, Path], built_image) -> tuple[str, Path]:
    """The runtime index, once the engine holds the runtime stage: built by the test image
    (`built_image`), so no two builds on the shared engine make that layer at once (a test
    run alone that asks for this builds the test image first)."""
    return runtime_index_served


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not shutil.which("docker-registry"):
        pytest.skip("docker-registry not installed (scripts/setup --test installs it)")
    from tests.services import start_registry

    process, port = start_registry(
        tmp_path_factory.mktemp("registry"), REGISTRY_USER, REGISTRY_PASSWORD
    )
    yield f"127.0.0.1:{port}"
    process.terminate()


# --- the test image ---------------------------------------------------------------------------

# Two modules: one that every arch builds (gelu_tanh_and_mul: one translation unit, 7 s of nvcc
# here, where norm takes 35 s) and the SM120-only NVFP4 quantization.
WARM_MODULES = (
    "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='gelu_tanh');"
    "flashinfer.jit.fp4_quantization:gen_fp4_quantization_sm120_module"
)


def image_args(test_base: str, runtime_index: tuple[str, Path], *extra: str) -> list[str]:
    """`builder image` offline: the local test base, the loopback runtime index, two modules."""
    index_url, requirements = runtime_index
    return [
        "image",
        "--base-image", test_base,
        "--pip-index-url", index_url,
        "--pip-extra-index-url=",
        "--runtime-requirements", str(requirements),
        "--network-host",
        "--jit-modules", WARM_MODULES,
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def built_image(github: Upstreams, fork_wheels, docker_host, test_base, runtime_index_served):
    """One built test image for every module that reads it, in either worker: (builder,
    image record, manifest). Its sources and wheels are the run's (`fork_wheels`), built
    before the test base is asked for: on a cold machine one worker builds them while
    another makes the base (mmdebstrap: downloads, then dpkg)."""
    from tests.services import once_per_run

    def build(root: Path) -> dict:
        builder = builder_in(root, github, docker_host)
        seed_cache(builder, fork_wheels)
        args = image_args(
            test_base, runtime_index_served, "--json", "--save-context", str(root / "context")
        )
        result = json.loads(builder.run(*args).stdout)
        fields = {k: str(v) for k, v in vars(builder).items() if k != "env"}
        return {"builder": {**fields, "env": builder.env}, **result}

    made = once_per_run("built-image", build)
    fields = made["builder"]
    builder = Builder(
        *(Path(fields[k]) for k in ("data_dir", "cache_dir")), fields["mirror"],
        Path(fields["wheelhouse"]), env=fields["env"],
    )  # fmt: skip
    return builder, made["image"], Path(made["manifest"])


# The test image's repository, as its target names it. What its tests count on the engine
# is counted in it: the other engine group builds beside them under its own.
IMAGE_REPOSITORY = load_target(REPO_ROOT, STACK_TARGET).image.repository


def repository_tags(client, repository: str = IMAGE_REPOSITORY) -> set[str]:
    # One image may carry tags of both repositories (the kernel-builder stage): its tags
    # in `repository` only.
    return {
        tag
        for image in client.api.images(name=repository)
        for tag in image["RepoTags"] or []
        if tag.startswith(f"{repository}:")
    }


def repository_containers(client, repository: str = IMAGE_REPOSITORY) -> set[str]:
    """Ids of the containers (any state) made from an image of `repository`. The other
    group's containers come and go between list and inspect: those gone are skipped."""
    return {
        container.id
        for container in client.containers.list(all=True, ignore_removed=True)
        if container.attrs["Config"]["Image"].startswith(f"{repository}:")
    }


def fresh_second() -> int:
    """Now, waited until a new second begins: the engine's events are asked for by whole
    second, so earlier events cannot fall into a window that starts here."""
    time.sleep(1.05 - time.time() % 1)
    return int(time.time())


def container_events(client, event: str, since: int) -> list[dict]:
    """The engine's container `event`s (create, start...) from `since` until now."""
    filters = {"type": "container", "event": event}
    return list(
        client.events(since=since, until=int(time.time()) + 1, decode=True, filters=filters)
    )


def pip_freeze(client, reference: str) -> list[str]:
    """`pip freeze --all --local` in the image: its venv, one line per distribution (not the
    base's packages it also sees)."""
    output = client.containers.run(
        reference,
        ["-m", "pip", "freeze", "--all", "--local"],
        entrypoint=["python"],
        remove=True,
        network_mode="none",  # no bridge needed (a second engine on this host may drop docker0)
    )
    return sorted(output.decode().splitlines())


def installed_versions(client, reference: str, *, local: bool = True) -> dict[str, str]:
    """{canonical name: version} of every distribution in the image's venv (`local`), or
    every one its Python sees, the base's too."""
    from packaging.utils import canonicalize_name

    output = client.containers.run(
        reference,
        ["-m", "pip", "list", "--format=json", *(["--local"] if local else [])],
        entrypoint=["python"],
        remove=True,
        network_mode="none",
    )
    return {canonicalize_name(d["name"]): d["version"] for d in json.loads(output)}


# The stand-in sglang server (no GPU exists here), run in a container of the test base.
STANDIN = Path(__file__).with_name("standin_sglang.py")
GOOD_INFO = {
    "moe_runner_backend": "flashinfer_cutlass",
    "attention_backend": "flashinfer",
    "tp_size": 8,
    "kv_cache_dtype": "bfloat16",
    "enable_flashinfer_allreduce_fusion": False,
    "quantization": "modelopt_fp4",
}


@pytest.fixture
def standin(docker_client, test_base):
    started = []

    def start(volumes: dict | None = None, args: tuple = (), **env: str) -> tuple[str, str]:
        port = free_port()
        name = f"standin-{uuid.uuid4().hex[:8]}"
        docker_client.containers.run(
            test_base,
            ["python3", "/standin.py", str(port), *args],
            name=name,
            detach=True,
            network_mode="host",
            environment={"SERVER_INFO": json.dumps(GOOD_INFO), **env},
            volumes={str(STANDIN): {"bind": "/standin.py", "mode": "ro"}, **(volumes or {})},
        )
        started.append(name)
        return f"http://127.0.0.1:{port}", name

    yield start
    for name in started:
        with contextlib.suppress(NotFound):  # a test may have removed it
            docker_client.containers.get(name).remove(force=True)
