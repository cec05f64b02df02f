"""Target sm120 on today's stack: sglang 0.5.23 (from its released wheel) + FlashInfer 0.7.2.

Real parts: the sglang 0.5.23 wheel and the flashinfer-python 0.7.2 sdist from PyPI (cached
outside the repository), a real package index (pypiserver on loopback) that serves the
wheel to builder through `--mirror`, exactly as a site's own index would.
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import io
import json
import re
import shutil
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from builder.build.wheelfiles import write_wheel
from builder.spec import launch, launch_profiles
from builder.spec.target import load_target
from builder.upstream import sglang_parser
from builder.upstream.jit_generators import check_generators
from tests.conftest import CP313_RELEASE, REPO_ROOT, Builder, seed_cache
from tests.services import (
    CURRENT_STACK_RUNTIME_LOCK,
    TEST_PYTHON,
    once_per_run,
    start_git_daemon,
    start_pypiserver,
)
from tests.upstreams import (
    FLASHINFER_CURRENT,
    build_repository,
    fetch_release_file,
    fetch_sdist,
)

TARGET = "sm120"
PIN = tomllib.loads((REPO_ROOT / "forks/sglang/pin.toml").read_text())
FLASHINFER_PIN = tomllib.loads((REPO_ROOT / "forks/flashinfer/pin.toml").read_text())


@pytest.fixture(scope="session")
def sglang_release() -> Path:
    wheel = fetch_release_file("sglang", PIN["ref"])
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == PIN["sha256"]
    return wheel


@pytest.fixture(scope="session")
def sglang_source(sglang_release: Path, tmp_path_factory) -> Path:
    """The `sglang` package of the 0.5.23 release, unpacked (its parser is read, not run)."""
    root = tmp_path_factory.mktemp("sglang-0.5.23")
    with zipfile.ZipFile(sglang_release) as archive:
        archive.extractall(root, [n for n in archive.namelist() if n.startswith("sglang/")])
    return root / "sglang"


@pytest.fixture(scope="session")
def release_index(sglang_release: Path, tmp_path_factory) -> str:
    """A real package index on loopback holding the release, as a site mirror would."""
    packages = tmp_path_factory.mktemp("release-index")
    shutil.copy(sglang_release, packages)
    process, port = start_pypiserver(packages, packages.parent / "pypiserver.log")
    yield f"https://pypi.org/simple=http://127.0.0.1:{port}/simple"
    process.terminate()


@pytest.fixture(scope="session")
def flashinfer_upstream() -> tuple[str, str]:
    """flashinfer 0.7.2 as a git repository with its submodules, from the sdist, served by a
    git daemon: (mirror, commit of the v0.7.2 tag). Made once for every worker: builder only
    reads it."""

    def make(root: Path) -> dict:
        commit = build_repository(FLASHINFER_CURRENT, root)
        process, served = start_git_daemon(root)
        return {"served": served, "commit": commit, "pids": [process.pid]}

    made = once_per_run("flashinfer-0.7.2-upstream", make)
    return f"https://github.com/={made['served']}", made["commit"]


def _distributions() -> set[str]:
    import importlib.metadata

    return {d.metadata["Name"] for d in importlib.metadata.distributions()}


@pytest.fixture(scope="session")
def flashinfer_wheel(flashinfer_upstream: tuple[str, str]) -> dict:
    """flashinfer 0.7.2's fork wheel, built once per run by `builder wheels` in a cache of
    its own (minutes of setuptools on 2 cores): its record, that cache (`seed_from_the_run`)
    and whether the build left builder's environment as it found it."""
    mirror, commit = flashinfer_upstream

    def build(root: Path) -> dict:
        builder = _builder(root, "unused=unused")
        pin = builder.data_dir / "forks/flashinfer/pin.toml"
        pin.write_text(pin.read_text().replace(FLASHINFER_PIN["commit"], commit))
        before = _distributions()
        result = builder.run("wheels", "--upstream", "flashinfer", "--mirror", mirror, "--json")
        wheel = json.loads(result.stdout)["upstreams"]["flashinfer"]["wheel"]
        entry = builder.cache_dir / "wheels" / wheel["cache_key"]
        assert (entry / "wheel.json").is_file(), entry
        untouched = before == _distributions()
        return {"wheel": wheel, "cache": str(builder.cache_dir), "environment_untouched": untouched}

    return once_per_run("flashinfer-0.7.2-wheel", build)


def seed_from_the_run(builder: Builder, made: dict, *folders: str) -> None:
    """The run's flashinfer 0.7.2 mirror (its fetch: 25-40 s of packing on 2 cores) and/or
    wheel in `builder`'s cache, for tests whose subject is neither. The wheel cache is keyed
    by every input of the build (fork commit and tree, settings, backend, builder's code): a
    builder on the same fork takes it as its own, one on another fork never does."""
    seed_cache(builder, Path(made["cache"]), folders=folders)


def _profiles(target: str = TARGET) -> list[str]:
    profiles, _ = launch_profiles.load_profiles(REPO_ROOT / "images" / target / "target.toml")
    return list(profiles)


@pytest.mark.parametrize(
    ("target", "profile"), [(t, p) for t in (TARGET, "sm90") for p in _profiles(t)]
)
def test_every_flag_a_profile_renders_is_an_option_of_sglang_0_5_23(
    sglang_source: Path, target: str, profile: str
) -> None:
    """Read from the real 0.5.23 parser definition (no abbreviations: `--tp` only works
    because argparse takes prefixes); values must be among the option's choices, and
    every key the readiness check expects must be a ServerArgs field /server_info reports."""
    options = sglang_parser.server_flags(sglang_source)
    assert "--dsa-prefill-backend" in options and "--nsa-prefill-backend" not in options
    recipe = launch.resolve(
        REPO_ROOT / "images" / target / "target.toml", profile, "i@sha256:" + "0" * 64,
        launch.Overrides(),
    )  # fmt: skip
    args = list(recipe.args)
    for position, word in enumerate(args):
        if not word.startswith("--"):
            continue
        assert word in options, f"{profile}: {word} is not an sglang 0.5.23 option"
        option = options[word]
        if option.takes_value:
            value = args[position + 1]
            if option.choices is not None:
                assert value in option.choices, f"{profile}: {word} {value} not in choices"
    fields = set(sglang_parser.server_args_fields(sglang_source))
    assert set(recipe.expect) <= fields, set(recipe.expect) - fields


def _with_fallback() -> list[str]:
    known = launch_profiles.Profiles.of(REPO_ROOT / "images" / TARGET / "target.toml")
    return [name for name in known.profiles if launch_profiles.fallback_params(known, name)]


@pytest.mark.parametrize("profile", _with_fallback())
def test_every_fallback_renders_options_of_sglang_0_5_23(sglang_source: Path, profile: str) -> None:
    """What `qualify --sweep` tries once when a start stalls is a command sglang 0.5.23
    takes: the profile resolved with its fallback params, every value among its option's
    choices (tc_piecewise, the backend of the field report, is not one any more)."""
    options = sglang_parser.server_flags(sglang_source)
    assert "tc_piecewise" not in options["--cuda-graph-backend-decode"].choices
    known = launch_profiles.Profiles.of(REPO_ROOT / "images" / TARGET / "target.toml")
    params = launch_profiles.fallback_params(known, profile)
    assert launch_profiles.fallback_why(known, profile)
    recipe = launch.resolve(known, profile, "i@sha256:" + "0" * 64, launch.Overrides(params=params))
    args = list(recipe.args)
    for key, value in params:
        assert value in args, f"{profile}: fallback {key}={value} is not on the command line"
    for position, word in enumerate(args):
        option = options.get(word) if word.startswith("--") else None
        if option is not None and option.takes_value and option.choices is not None:
            assert args[position + 1] in option.choices, f"{profile}: {word} {args[position + 1]}"
    assert recipe.expect["cuda_graph_backend_decode"] == "breakable"


def _sglang_function(package: Path, module: str, *names: str) -> dict:
    """Functions of one sglang module, taken from its source and run as they are (the
    module itself needs torch and transformers to import): name -> function."""
    import typing

    tree = ast.parse((package / module).read_text())
    kept = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in kept} == set(names), f"{module}: {names} moved"
    namespace: dict = {"PretrainedConfig": object, **vars(typing)}
    exec(compile(ast.Module(body=kept, type_ignores=[]), module, "exec"), namespace)
    return {name: namespace[name] for name in names}


def test_the_index_pattern_letters_mean_what_sglang_0_5_23_reads(sglang_source: Path) -> None:
    """sglang's own `dsa_layer_skips_topk` on GLM-5.2-shaped configs: S (and indexer_types
    "shared") reuses the previous layer's top-k, F computes its own, indexer_types wins over
    a pattern, and the layers past a short pattern's end silently compute their own, which
    is why `launch` refuses one."""
    from types import SimpleNamespace

    from builder.spec import model_check
    from tests.spec.test_model_check import GLM52_PATTERN, glm52_indexer_types

    names = ("_hf_arch", "_hf_attr", "is_deepseek_dsa", "dsa_layer_skips_topk")
    found = _sglang_function(sglang_source, "srt/configs/model_config.py", *names)
    skips = found["dsa_layer_skips_topk"]
    glm = {"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048}  # DSA needs both

    def schedule(config: SimpleNamespace) -> str:
        return "".join("S" if skips(config, layer) else "F" for layer in range(78))

    assert schedule(SimpleNamespace(**glm, index_topk_pattern=GLM52_PATTERN)) == GLM52_PATTERN
    declared = SimpleNamespace(**glm, indexer_types=glm52_indexer_types(),
                               index_topk_pattern="F" * 78)  # fmt: skip
    assert (
        schedule(declared)
        == GLM52_PATTERN
        == model_check.pattern_of_indexer_types(glm52_indexer_types(), "t")
    )
    short = schedule(SimpleNamespace(**glm, index_topk_pattern=GLM52_PATTERN[:70]))
    assert short == GLM52_PATTERN[:70] + "F" * 8  # no error: the tail just stops sharing


def test_the_old_stack_s_attention_workaround_is_not_in_the_current_profiles() -> None:
    for profile in _profiles():
        recipe = launch.resolve(
            REPO_ROOT / "images" / TARGET / "target.toml", profile, "i@sha256:" + "0" * 64,
            launch.Overrides(),
        )  # fmt: skip
        assert "--attention-backend" not in recipe.args
        assert recipe.expect["attention_backend"] == "dsa"
        assert recipe.expect["kv_cache_dtype"] == "fp8_e4m3"
    with pytest.raises(Exception, match="dense FlashInfer MLA"):
        launch.resolve(
            REPO_ROOT / "images" / TARGET / "target.toml", None, "i@sha256:" + "0" * 64,
            launch.Overrides(extra_args=("--attention-backend", "flashinfer")),
        )  # fmt: skip


def test_every_listed_generator_exists_in_flashinfer_0_7_2() -> None:
    """The JIT list names functions of the pinned FlashInfer (its released sdist), with
    arguments they take, so the image's warm-up cannot fail on a name that moved (the check
    `builder upstream check` runs against a new FlashInfer's wheel)."""
    sdist = fetch_sdist("flashinfer-python", FLASHINFER_PIN["version"])
    target = load_target(REPO_ROOT, TARGET)
    with tarfile.open(sdist) as archive:
        members = {Path(m.name).relative_to(Path(m.name).parts[0]).as_posix(): m
                   for m in archive.getmembers() if m.isfile() and m.name.endswith(".py")}  # fmt: skip

        def read(path: str) -> str | None:
            return archive.extractfile(members[path]).read().decode() if path in members else None

        checks = check_generators(target.jit_modules, read)
    assert [c.generator for c in checks if c.status != "present"] == [], checks


def _record_ok(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        record_name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        listed = {row[0] for row in rows}
        assert listed == set(archive.namelist())
        for path, digest, size in rows:
            if path == record_name:
                continue
            data = archive.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}" and int(size) == len(data), path


def _builder(root: Path, mirror: str) -> Builder:
    """builder on a data copy, reaching the release through the loopback index."""
    for folder in ("images", "forks"):
        shutil.copytree(REPO_ROOT / folder, root / "data" / folder)
    return Builder(
        root / "data", root / "cache", mirror, root / "wheelhouse", env={"BUILDER_TARGET": TARGET}
    )


@pytest.fixture(scope="module")
def sglang_built(release_index: str, tmp_path_factory) -> tuple[Builder, dict]:
    """`builder wheels --upstream sglang` from an empty cache: the builder and its record
    (made once for the module: the repack test's subject, the whole-target test's seed)."""
    builder = _builder(tmp_path_factory.mktemp("sglang-built"), release_index)
    result = builder.run("wheels", "--upstream", "sglang", "--json")
    return builder, json.loads(result.stdout)["upstreams"]["sglang"]


def test_the_sglang_wheel_is_the_release_repacked_with_the_series(
    tmp_path: Path, release_index: str, sglang_release: Path, sglang_built
) -> None:
    """From the index to the fork wheel: the pinned file becomes the pinned commit, the series
    applies on it, and the wheel is the release's bytes but for the patched files and the
    version; a second build from an empty cache gives the same bytes."""
    _, sglang = sglang_built
    assert sglang["upstream_commit"] == PIN["commit"]
    assert len(sglang["patches"]) == len(
        list((REPO_ROOT / "forks/sglang/patches/sm120").glob("*.patch"))
    )
    wheel = Path(sglang["wheel"]["path"])
    assert sglang["wheel"]["version"] == f"0.5.23+sm120.g{sglang['fork_commit'][:7]}"
    assert wheel.name.endswith("-cp312-cp312-manylinux_2_34_x86_64.whl")
    _record_ok(wheel)

    patched = set()
    for patch in (REPO_ROOT / "forks/sglang/patches/sm120").glob("*.patch"):
        patched |= {line.split(" b/")[-1] for line in patch.read_text().splitlines()
                    if line.startswith("diff --git ")}  # fmt: skip
    with zipfile.ZipFile(sglang_release) as old, zipfile.ZipFile(wheel) as new:
        new_names = set(new.namelist())
        compiled = 0
        for name in old.namelist():
            if name.endswith("/") or ".dist-info/" in name:
                continue
            assert name in new_names, name
            if name in patched:
                assert new.read(name) != old.read(name), f"{name}: patch not in the wheel"
            else:
                assert new.read(name) == old.read(name), f"{name} differs from the release"
                compiled += name.endswith(".so")
        assert compiled >= 2  # the Rust extensions, byte for byte
        metadata = next(n for n in new_names if n.endswith(".dist-info/METADATA"))
        assert f"\nVersion: {sglang['wheel']['version']}\n" in new.read(metadata).decode()
        launch_command_patch = new.read("sglang/srt/server_args.py").decode()
        assert "api_key" in launch_command_patch

    again = _builder(tmp_path / "b", release_index)
    second = json.loads(again.run("wheels", "--upstream", "sglang", "--json").stdout)["upstreams"][
        "sglang"
    ]["wheel"]
    assert second["sha256"] == sglang["wheel"]["sha256"] and not second["cached"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sha256", "0" * 64, "has sha256 8d257a31"),
        ("commit", "0" * 40, "make commit ccc10728"),
    ],
)
def test_a_release_that_is_not_the_pinned_one_is_refused_and_nothing_is_left(
    tmp_path: Path, release_index: str, field: str, value: str, message: str
) -> None:
    builder = _builder(tmp_path, release_index)
    pin = builder.data_dir / "forks/sglang/pin.toml"
    pin.write_text(pin.read_text().replace(f'{field} = "{PIN[field]}"', f'{field} = "{value}"'))
    result = builder.run("wheels", "--upstream", "sglang", check=False)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {pin}: ") and message in line
    assert not builder.wheelhouse.exists() or not list(builder.wheelhouse.glob("*.whl"))
    releases = builder.cache_dir / "releases"
    assert not releases.exists() or all(
        hashlib.sha256(p.read_bytes()).hexdigest() == PIN["sha256"] for p in releases.iterdir()
    )


def test_both_wheels_build_and_the_committed_lock_satisfies_them(
    tmp_path: Path,
    release_index: str,
    flashinfer_upstream: tuple[str, str],
    flashinfer_wheel,
    sglang_built,
) -> None:
    """The whole target's wheels: sglang from its release, flashinfer 0.7.2 built from git
    with the pin's backend settings (no expert-parallel extras, nothing pip-installed into
    builder's environment); `builder lock --check` finds images/sm120/runtime-lock.txt
    current for exactly these wheels, before any wheel is built (read from the sources) and
    after. The flashinfer mirror and build are the run's ones (`flashinfer_wheel`), the
    sglang release and wheel the module's (`sglang_built`): this builder finds them under
    its own keys."""
    mirror, commit = flashinfer_upstream
    builder = _builder(tmp_path, release_index)
    pin = builder.data_dir / "forks/flashinfer/pin.toml"
    pin.write_text(pin.read_text().replace(FLASHINFER_PIN["commit"], commit))
    seed_from_the_run(builder, flashinfer_wheel, "mirrors")
    seed_cache(builder, sglang_built[0].cache_dir, folders=("releases", "mirrors"))
    # A lock reads what each wheel will require from its sources: no wheel is built for it.
    checked = builder.run("lock", "--check", "--mirror", mirror, check=False)
    assert checked.returncode == 0, checked.stderr
    assert not list((builder.cache_dir / "wheels").glob("*/wheel.json"))
    seed_from_the_run(builder, flashinfer_wheel, "wheels")
    seed_cache(builder, sglang_built[0].cache_dir, folders=("wheels",))
    result = json.loads(builder.run("wheels", "--mirror", mirror, "--json").stdout)
    flashinfer = result["upstreams"]["flashinfer"]["wheel"]
    assert flashinfer["cached"] and flashinfer["sha256"] == flashinfer_wheel["wheel"]["sha256"]
    assert flashinfer["version"] == f"0.7.2+sm120.g{commit[:7]}"
    with zipfile.ZipFile(flashinfer["path"]) as archive:
        meta = archive.read("flashinfer/_build_meta.py").decode()
        assert f'__version__ = "{flashinfer["version"]}"' in meta and commit in meta
        names = set(archive.namelist())
    assert "flashinfer/data/cccl" in {n.rsplit("/", 1)[0] for n in names} or any(
        n.startswith("flashinfer/data/cccl/") for n in names
    )
    assert flashinfer_wheel["environment_untouched"], "the build pip-installed into builder's venv"
    checked = builder.run("lock", "--check", "--mirror", mirror, check=False)
    assert checked.returncode == 0, checked.stderr


def _as_release(wheel: Path, version: str, out: Path) -> Path:
    """`wheel` re-labelled as release `version` (dist-info, METADATA, RECORD): a stand-in
    for an sglang release that is not out yet (a fake only in its version number)."""
    with zipfile.ZipFile(wheel) as archive:
        files = {n: archive.read(n) for n in archive.namelist() if not n.endswith("/RECORD")}
    old_info = next(n for n in files if n.endswith(".dist-info/METADATA")).split("/")[0]
    info = f"sglang-{version}.dist-info"
    renamed = {n.replace(old_info, info, 1) if n.startswith(old_info) else n: d
               for n, d in files.items()}  # fmt: skip
    meta = renamed[f"{info}/METADATA"].decode().splitlines(keepends=True)
    renamed[f"{info}/METADATA"] = "".join(
        f"Version: {version}\n" if line.startswith("Version: ") else line for line in meta
    ).encode()
    path = out / PIN["ref"].replace("-0.5.23-", f"-{version}-")
    write_wheel(path, {name: (data, 0o644) for name, data in renamed.items()})
    return path


def test_the_series_moves_to_a_new_release_with_builder_s_own_tools(
    tmp_path: Path, sglang_release: Path, sglang_built
) -> None:
    """`patches check/refresh --onto VERSION` for a release-sourced upstream: the next
    release (here 0.5.23 with our API-key patch merged, labelled 0.5.24) is fetched from the
    index, imported as a commit, the series classified (0002 `upstream`), and refresh writes
    the pin (file, sha256 from the index, commit, version) and the shorter series; the
    wheels then build from it. 0.5.23 comes imported already (`sglang_built`'s cache: the
    same file gives the same commit); 0.5.24 is fetched and imported here."""
    one = _builder(tmp_path / "one", "unused=unused")
    seed_cache(one, sglang_built[0].cache_dir, folders=("releases", "mirrors"))
    series = one.data_dir / "forks/sglang/patches/sm120"
    for patch in sorted(series.glob("0001-*.patch")):
        patch.unlink()
    packages = tmp_path / "index"
    packages.mkdir()
    shutil.copy(sglang_release, packages)
    process, port = start_pypiserver(packages, tmp_path / "pypiserver.log")
    try:
        mirror = f"https://pypi.org/simple=http://127.0.0.1:{port}/simple"
        one.mirror = mirror
        only_0002 = json.loads(one.run("wheels", "--upstream", "sglang", "--json").stdout)
        _as_release(Path(only_0002["upstreams"]["sglang"]["wheel"]["path"]), "0.5.24", packages)

        builder = _builder(tmp_path / "two", mirror)
        seed_cache(builder, sglang_built[0].cache_dir, folders=("releases", "mirrors"))
        checked = builder.run("patches", "check", "--upstream", "sglang", "--onto", "0.5.24")
        lines = checked.stdout + checked.stderr
        assert "clean     0001-" in lines and "upstream  0002-" in lines, lines
        builder.run("patches", "refresh", "--upstream", "sglang", "--onto", "0.5.24")
        pin = tomllib.loads((builder.data_dir / "forks/sglang/pin.toml").read_text())
        wanted = PIN["ref"].replace("-0.5.23-", "-0.5.24-")
        assert pin["version"] == "0.5.24" and pin["ref"] == wanted
        assert pin["sha256"] == hashlib.sha256((packages / wanted).read_bytes()).hexdigest()
        moved = (builder.data_dir / "forks/sglang/patches/sm120").glob("*.patch")
        kept = (REPO_ROOT / "forks/sglang/patches/sm120").glob("0001-*.patch")
        assert [p.name for p in moved] == [p.name for p in kept]  # 0002 dropped: upstream
        wheel = json.loads(builder.run("wheels", "--upstream", "sglang", "--json").stdout)
        assert wheel["upstreams"]["sglang"]["upstream_commit"] == pin["commit"]
        assert wheel["upstreams"]["sglang"]["wheel"]["version"].startswith("0.5.24+sm120.g")
    finally:
        process.terminate()


PCIE_IPC = "flashinfer.jit.comm:gen_pcie_ipc_comm_module"
OWN_REPOSITORY = "sglang-sm120-current-stack"


def current_stack_image_args(test_base: str, port: int, module: str = PCIE_IPC) -> list[str]:
    """`builder image` on the test base with the current stack's runtime lock from
    `current_stack_index`, compiling one module."""
    from tests.conftest import image_args

    index_url = f"http://127.0.0.1:{port}/simple/"
    runtime = (index_url, CURRENT_STACK_RUNTIME_LOCK)
    return image_args(test_base, runtime, "--json", "--jit-modules", module)


def own_target(builder: Builder, target: str, repository: str) -> None:
    """`target` on the suite's Python, its image under `repository`: a repository of its own,
    since these tests run beside the engine's other tests, which count sglang-sm120's tags
    and containers (tests/conftest.py)."""
    path = builder.data_dir / f"images/{target}/target.toml"
    text = path.read_text()
    assert 'python = "3.12"' in text and "\nrepository = " in text, path
    text = text.replace('python = "3.12"', f'python = "{TEST_PYTHON}"')
    path.write_text(re.sub(r'(?m)^repository = "[^"]*"', f'repository = "{repository}"', text))


def what_the_image_holds(docker_client, reference: str, server: str, module_call: str) -> dict:
    """In a container of the image, offline and with FlashInfer's JIT off: the versions of
    `server` and FlashInfer, the server's requirements, the sha256 of each of its compiled
    extensions, whether `module_call` (a FlashInfer generator call) resolves to the kernel
    wheel, and the engine the image's recipe names."""
    module, call = module_call.split(":", 1)
    script = (
        "import hashlib, importlib.metadata as m, json, os\n"
        "os.environ['FLASHINFER_DISABLE_JIT'] = '1'\n"
        f"import {module} as generators\n"
        f"spec = generators.{call}\n"
        "so = {str(f): hashlib.sha256(f.locate().read_bytes()).hexdigest()\n"
        f"      for f in m.files({server!r}) if f.suffix == '.so'}}\n"
        "recipe = json.load(open('/opt/builder/recipe.json'))\n"
        f"print(json.dumps({{'versions': {{d: m.version(d) for d in ({server!r}, 'flashinfer-python')}},\n"
        f"                  'requires': m.requires({server!r}), 'so': so, 'aot': spec.is_aot,\n"
        "                  'aot_path': str(spec.aot_path), 'engine': recipe['target'].get('engine')}))\n"
    )
    output = docker_client.containers.run(
        reference, entrypoint=["python", "-c", script], remove=True, network_mode="none"
    )
    return json.loads(output.decode())


def _release_extensions(wheel: Path) -> dict[str, str]:
    """{path: sha256} of the release's compiled extensions."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name: hashlib.sha256(archive.read(name)).hexdigest()
            for name in archive.namelist()
            if name.endswith(".so")
        }


@pytest.mark.docker
def test_the_current_stack_builds_into_an_image(
    tmp_path: Path,
    flashinfer_upstream: tuple[str, str],
    flashinfer_wheel: dict,
    docker_host: str,
    docker_client,
    test_base: str,
    current_stack_index: int,
) -> None:
    """`builder image --target sm120` on the real engine: sglang 0.5.23 from its released
    wheel (re-pinned to the cp313 file for the suite's Python 3.13 base), flashinfer 0.7.2
    from git, one module of the target's list (pcie_ipc_comm) compiled with nvcc 13 for the
    target's 12.0f and checked to load from the kernel wheel. The runtime stage installs
    tests/data/current-stack-runtime-lock.txt from `current_stack_index`; the target's own
    lock is checked against these wheels by the test above. The flashinfer mirror and wheel
    are the run's ones (`flashinfer_wheel`), built before the test base is asked for: on a
    cold machine while another worker makes it."""
    import pygit2

    from builder.build.release import import_wheel
    from tests.conftest import validate_manifest

    release = fetch_release_file("sglang", CP313_RELEASE)
    release_sha256 = hashlib.sha256(release.read_bytes()).hexdigest()
    release_commit = import_wheel(
        pygit2.init_repository(tmp_path / "import", bare=True), release, release_sha256
    )
    port = current_stack_index
    builder = _builder(tmp_path, f"https://pypi.org/simple=http://127.0.0.1:{port}/simple")
    builder.env["DOCKER_HOST"] = docker_host
    pin = builder.data_dir / "forks/sglang/pin.toml"
    text = pin.read_text()
    for field, value in (("ref", CP313_RELEASE), ("sha256", release_sha256),
                         ("commit", release_commit)):  # fmt: skip
        text = text.replace(f'{field} = "{PIN[field]}"', f'{field} = "{value}"')
    pin.write_text(text)
    own_target(builder, TARGET, OWN_REPOSITORY)
    mirror, flashinfer_commit = flashinfer_upstream
    flashinfer_pin = builder.data_dir / "forks/flashinfer/pin.toml"
    flashinfer_pin.write_text(
        flashinfer_pin.read_text().replace(FLASHINFER_PIN["commit"], flashinfer_commit)
    )
    seed_from_the_run(builder, flashinfer_wheel, "mirrors", "wheels")
    args = current_stack_image_args(test_base, port)
    result = json.loads(builder.run(*args, "--mirror", mirror).stdout)

    image = result["image"]
    assert image["reference"].startswith(f"{OWN_REPOSITORY}:"), image["reference"]
    manifest = json.loads(Path(result["manifest"]).read_text())
    validate_manifest(manifest)
    assert manifest["target"]["name"] == "sm120" and manifest["target"]["arch_list"] == ["12.0f"]
    sglang = manifest["upstreams"]["sglang"]
    assert sglang["source"] == "release" and sglang["release_sha256"] == release_sha256
    assert sglang["commit"] == release_commit and sglang["ref"] == CP313_RELEASE
    assert manifest["upstreams"]["flashinfer"]["commit"] == flashinfer_commit
    wheels = manifest["wheels"]
    assert wheels["sglang"]["version"].startswith("0.5.23+sm120.g")
    flashinfer_fork = manifest["upstreams"]["flashinfer"]["fork_commit"]
    assert wheels["flashinfer"]["version"] == f"0.7.2+sm120.g{flashinfer_fork[:7]}"

    inventory = image["jit_inventory"]
    assert inventory["arch_list"] == ["12.0f"]
    assert [m["name"] for m in inventory["modules"]] == ["pcie_ipc_comm"]
    assert all(m["arch"] == ["sm_120f"] for m in inventory["modules"]), inventory

    # The default profile's command: DSA left to sglang, FP8 KV, NVFP4 MoE on CUTLASS.
    recipe = manifest["launch"]["glm5-nvfp4-tp8"]
    command = " ".join(recipe["args"])
    assert "--attention-backend" not in command, command
    for flag in ("--kv-cache-dtype fp8_e4m3", "--quantization modelopt_fp4",
                 "--moe-runner-backend flashinfer_cutlass"):  # fmt: skip
        assert flag in command, command

    # In the image: both fork wheels installed, the release's Rust extensions byte for byte,
    # and the module resolved from the kernel wheel with JIT disabled (loading it needs a
    # driver: it links libcuda).
    found = what_the_image_holds(docker_client, image["reference"], "sglang", PCIE_IPC + "()")
    assert found["versions"] == {
        "sglang": wheels["sglang"]["version"],
        "flashinfer-python": wheels["flashinfer"]["version"],
    }
    extensions = _release_extensions(release)
    assert len(extensions) >= 2 and found["so"] == extensions
    assert found["engine"] is None  # an sglang image's recipe is as before the second engine
    assert found["aot"] and found["aot_path"].endswith(
        "/flashinfer_jit_cache/jit_cache/pcie_ipc_comm/pcie_ipc_comm.so"
    )
