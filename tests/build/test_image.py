"""`builder image` on the real Docker engine, with the real sm120 Dockerfile.

Docker Hub is unreachable here, so the base is a locally made Debian + CUDA 13 toolkit
image with Debian's CPU torch (tests/services.py), and the runtime dependencies come from a
loopback pypiserver with a reduced list (what flashinfer needs beside that torch). The JIT
warm-up compiles two cheap modules for sm_120a for real with nvcc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.spec import lockfile
from builder.spec.target import load_target
from tests.base_image import seed_layer
from tests.conftest import (  # noqa: F401 (image_args and WARM_MODULES: imported from here)
    IMAGE_REPOSITORY,
    REGISTRY_PASSWORD,
    REGISTRY_USER,
    REPO_ROOT,
    STACK_TARGET,
    WARM_MODULES,
    Builder,
    Upstreams,
    builder_in,
    container_events,
    fresh_second,
    image_args,
    repository_containers,
    repository_tags,
    seed_cache,
    validate_manifest,
)
from tests.services import IMAGE_RUNTIME_LOCK, IMAGE_RUNTIME_REQUIREMENTS, served_base_layer

pytestmark = pytest.mark.docker

REGISTRY_ENV = {
    "BUILDER_REGISTRY_USERNAME": REGISTRY_USER,
    "BUILDER_REGISTRY_PASSWORD": REGISTRY_PASSWORD,
    "BUILDER_REGISTRY_HOST": "127.0.0.1",  # the test registries, on loopback
}


@pytest.fixture(scope="module")
def built(built_image):
    return built_image


def _run_in(docker_client, reference: str, script: str) -> str:
    output = docker_client.containers.run(
        reference, entrypoint=["python", "-c", script], remove=True, network_mode="none"
    )
    return output.decode()


def test_image_holds_patched_wheels_and_warm_kernels(built, docker_client) -> None:
    builder, image, manifest_path = built
    manifest = json.loads(manifest_path.read_text())
    wheels = json.loads(builder.run("wheels", "--json").stdout)["upstreams"]
    script = (
        "import importlib.metadata as m, json, flashinfer_jit_cache as k;"
        "print(json.dumps({d: m.version(d) for d in "
        "('sglang', 'flashinfer-python', 'flashinfer-jit-cache')}));"
        "print(k.FLASHINFER_BUILD)"
    )
    versions, kernels_for = _run_in(docker_client, image["reference"], script).splitlines()
    flashinfer_version = wheels["flashinfer"]["wheel"]["version"]
    assert json.loads(versions) == {
        "sglang": wheels["sglang"]["wheel"]["version"],
        "flashinfer-python": flashinfer_version,
        # builder's own kernel wheel, never the official one (no sm_120 trtllm_comm)
        "flashinfer-jit-cache": manifest["wheels"]["kernels"]["version"],
    }
    assert manifest["wheels"]["kernels"]["version"].startswith(f"{flashinfer_version}.k")
    assert kernels_for == flashinfer_version

    inventory = image["jit_inventory"]
    assert inventory["arch_list"] == ["12.0a"]
    assert {m["name"] for m in inventory["modules"]} == {
        "gelu_tanh_and_mul",
        "fp4_quantization_120",
    }
    # Real libraries with sm_120a device code (cuobjdump's reading), not stand-in bytes.
    assert all(m["arch"] == ["sm_120a"] and m["size"] > 10_000 for m in inventory["modules"]), (
        inventory["modules"]
    )
    assert all(len(m["key"]) == 64 for m in inventory["modules"])
    assert {m["source"] for m in image["kernel_build"]["modules"]} == {"compiled"}


def test_container_loads_every_module_from_the_kernel_wheel_without_compiling(
    built, docker_client
) -> None:
    _, image, _ = built
    # FlashInfer's own run-time path (`JitSpec.build_and_load`), with JIT disabled and no
    # ninja on the PATH: a module not taken from the kernel wheel would raise.
    script = (
        "import flashinfer\n"
        "from flashinfer.jit.activation import gen_act_and_mul_module\n"
        "from flashinfer.jit.fp4_quantization import gen_fp4_quantization_sm120_module\n"
        'for spec in (gen_act_and_mul_module("gelu_tanh"), gen_fp4_quantization_sm120_module()):\n'
        "    spec.build_and_load()\n"
        "    print(spec.name, spec.aot_path, spec.jit_library_path.exists())\n"
    )
    output = docker_client.containers.run(
        image["reference"],
        ["-c", f"rm -f \"$(command -v ninja)\" && python -c '{script}'"],
        entrypoint=["sh"], environment={"FLASHINFER_DISABLE_JIT": "1"},
        remove=True, network_mode="none",
    ).decode()  # fmt: skip
    loaded = {
        name: (path, built_here) for name, path, built_here in map(str.split, output.splitlines())
    }
    assert set(loaded) == {"gelu_tanh_and_mul", "fp4_quantization_120"}
    for name, (path, built_here) in loaded.items():
        assert path.endswith(f"/site-packages/flashinfer_jit_cache/jit_cache/{name}/{name}.so")
        assert built_here == "False", "nothing in FlashInfer's JIT workspace"


def test_labels_record_provenance(built, docker_client) -> None:
    builder, image, _ = built
    labels = docker_client.images.get(image["reference"]).labels
    forks = json.loads(builder.run("wheels", "--json").stdout)["upstreams"]
    assert labels["io.builder.target"] == "sm120-0.5.9"
    assert labels["io.builder.jit.arch"] == "sm_120a"
    assert labels["org.opencontainers.image.revision"] == forks["sglang"]["fork_commit"]
    assert labels["org.opencontainers.image.version"] == forks["sglang"]["wheel"]["version"]
    assert labels["org.opencontainers.image.created"]
    for name in ("sglang", "flashinfer"):
        assert labels[f"io.builder.{name}.fork-commit"] == forks[name]["fork_commit"]
        assert labels[f"io.builder.{name}.upstream-commit"] == forks[name]["upstream_commit"]
        assert labels[f"io.builder.{name}.wheel-sha256"] == forks[name]["wheel"]["sha256"]
        assert labels[f"io.builder.{name}.patch-series-sha256"] == forks[name]["series_sha256"]
    assert image["reference"].startswith("sglang-sm120:sglang0.5.9-fi0.6.3-sm120-0.5.9-")


def test_unchanged_inputs_build_nothing(built, docker_client, test_base, runtime_index) -> None:
    """Nothing built, and not one container created from the image (its repository or its
    id: the other engine group makes containers of the test base meanwhile): the SBOM and
    kernel inventory the manifest needs come from the cache (kept by image id), not read
    out of the image."""
    builder, image, manifest = built
    since = fresh_second()
    # Another environment, so no record answers: the full no-op path (its record's: below).
    full = builder.run(
        *image_args(test_base, runtime_index, "--json"), env={"BUILDER_TEST_RUN": "once"}
    )
    assert "all stage keys match" in full.stderr
    again = json.loads(full.stdout)
    created = [
        event
        for event in container_events(docker_client, "create", since)
        if event["Actor"]["Attributes"].get("image", "").startswith(f"{IMAGE_REPOSITORY}:")
        or event["Actor"]["Attributes"].get("image") == image["image_id"]
    ]
    assert again["image"]["skipped"] is True
    assert again["image"]["image_id"] == image["image_id"]
    sbom_beside = Path(again["manifest"]).with_suffix(".cdx.json").read_text()
    assert sbom_beside == manifest.with_suffix(".cdx.json").read_text()
    assert again["image"]["jit_inventory"] == image["jit_inventory"]
    assert created == [], "a no-op run creates no container of the image"


def _without_run_stamps(manifest_path: Path) -> dict:
    manifest = json.loads(manifest_path.read_text())
    del manifest["created"], manifest["sbom"]["file"]
    return manifest


def test_a_no_op_is_answered_from_the_last_build_s_record(built, test_base, runtime_index) -> None:
    """The same command with nothing changed is answered from the record before the Docker
    SDK or pygit2 is imported, and says exactly what the full no-op run says (the same JSON,
    the same manifest but for its time); a touched input file sends it the full way, which
    records again."""
    builder, _, _ = built
    args = image_args(test_base, runtime_index, "--json")
    full = builder.run(*args, env={"BUILDER_TEST_RUN": "full"})  # another key: no record
    assert "all stage keys match" in full.stderr
    builder.run(*args)  # records (or replays) this command line
    replay = subprocess.run(
        [sys.executable, "-X", "importtime", *builder.command(*args)[1:]],
        capture_output=True, text=True, cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "200", "BUILDER_CONFIG": "/nonexistent", **builder.env},
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert "no input changed since" in replay.stderr
    imported = {line.split("|")[-1].strip() for line in replay.stderr.splitlines() if "|" in line}
    assert not imported & {"docker", "pygit2", "rich", "requests", "builder.build.image"}, imported
    answered, expected = json.loads(replay.stdout), json.loads(full.stdout)
    assert answered.pop("manifest") != expected.pop("manifest")
    assert answered == expected
    assert _without_run_stamps(Path(json.loads(replay.stdout)["manifest"])) == _without_run_stamps(
        Path(json.loads(full.stdout)["manifest"])
    )

    profiles = builder.data_dir / "images" / STACK_TARGET / "profiles.toml"
    # A second earlier: changed, and settled (a file written just now is never recorded).
    os.utime(profiles, ns=(profiles.stat().st_atime_ns, profiles.stat().st_mtime_ns - 10**9))
    touched = builder.run(*args)
    assert "all stage keys match" in touched.stderr and "no input changed" not in touched.stderr
    assert "no input changed since" in builder.run(*args).stderr


def test_sglang_patch_change_rebuilds_only_the_server_stage(
    built, docker_client, test_base, runtime_index
) -> None:
    builder, image, _ = built
    patch = sorted((builder.data_dir / "forks/sglang-0.5.9/patches/sm120").glob("0001-*.patch"))[0]
    original = patch.read_text()
    patch.write_text(original.replace("\n---\n", "\nReviewed-by: tests\n---\n", 1))
    try:
        plan = json.loads(
            builder.run(*image_args(test_base, runtime_index, "--plan", "--json")).stdout
        )
        assert plan["stages"]["runtime"]["rebuild"] is None
        assert plan["stages"]["flashinfer"]["rebuild"] is None
        assert plan["stages"]["server"]["rebuild"] == "sglang wheel or launch profiles changed"

        rebuilt = json.loads(builder.run(*image_args(test_base, runtime_index, "--json")).stdout)
        assert rebuilt["image"]["reference"] != image["reference"]
        old_layers = {h["Id"] for h in docker_client.images.get(image["reference"]).history()}
        new_history = docker_client.images.get(rebuilt["image"]["reference"]).history()
        kernels = [h for h in new_history if "jit_warmup.py --check" in h["CreatedBy"]]
        assert kernels and kernels[0]["Id"] in old_layers, "the kernel layer must be reused"
        assert rebuilt["image"]["jit_inventory"] == image["jit_inventory"]
    finally:
        patch.write_text(original)


def test_push_with_auth_then_pull_by_digest(
    built, docker_client, registry, test_base, runtime_index
) -> None:
    """The base's layer is in the registry beforehand, as a site's base image's layers are
    once anything built on it was pushed there (tests/base_image.py): the push compresses
    and sends builder's own layers, not the test base's 1.3 GB."""
    builder, image, _ = built
    repository = f"{registry}/ml/sglang-sm120"
    seed_layer(served_base_layer(), registry, "ml/sglang-sm120", (REGISTRY_USER, REGISTRY_PASSWORD))
    args = image_args(test_base, runtime_index, "--push", repository, "--tag", "rc-1", "--json")
    result = builder.run(*args, env=REGISTRY_ENV)
    assert REGISTRY_PASSWORD not in result.stdout + result.stderr
    pushed = json.loads(result.stdout)["image"]["pushed"]
    assert pushed["digest"].startswith("sha256:")
    assert pushed["reference"] == f"{repository}@{pushed['digest']}"
    # The base's one layer found in the registry, builder's own sent.
    assert pushed["layers"]["present"] == 1 and pushed["layers"]["sent"] >= 3, pushed["layers"]
    manifest = json.loads(Path(json.loads(result.stdout)["manifest"]).read_text())
    assert manifest["image"]["pushed"]["layers"] == pushed["layers"]
    # The human tag beside the input tag: the same image, read back from the registry.
    assert pushed["tags"] == [pushed["tag"], "rc-1"]
    docker_client.images.remove(f"{repository}:rc-1")
    docker_client.login(REGISTRY_USER, REGISTRY_PASSWORD, registry=registry)
    assert docker_client.images.pull(repository, tag="rc-1").id == image["image_id"]
    docker_client.images.remove(f"{repository}:rc-1")

    docker_client.images.remove(f"{repository}:{pushed['tag']}")
    docker_client.login(REGISTRY_USER, REGISTRY_PASSWORD, registry=registry)
    pulled = docker_client.images.pull(pushed["reference"])
    assert pulled.id == image["image_id"]
    docker_client.images.remove(pushed["reference"])


def test_wrong_registry_password_is_a_clear_error(
    built, docker_client, registry, test_base, runtime_index
) -> None:
    builder, _, _ = built
    repository = f"{registry}/ml/denied"
    env = {
        "BUILDER_REGISTRY_USERNAME": REGISTRY_USER,
        "BUILDER_REGISTRY_PASSWORD": "wrong-pass-123",
        "BUILDER_REGISTRY_HOST": "127.0.0.1",
    }
    args = image_args(test_base, runtime_index, "--push", repository)
    result = builder.run(*args, env=env, check=False)
    assert result.returncode == 1
    assert f"error: push to {repository} failed" in result.stderr
    assert "wrong-pass-123" not in result.stdout + result.stderr
    assert not repository_tags(docker_client, repository), "no registry tag left behind"


def test_missing_base_image_says_how_to_provide_it(built, test_base, runtime_index) -> None:
    builder, _, _ = built
    args = image_args("no-such-base:1.0", runtime_index)
    result = builder.run(*args, check=False)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "base image no-such-base:1.0 is not present and cannot be pulled" in line
    assert "--base-image" in line and "docker load" in line


def test_failing_kernel_build_names_the_module_and_leaves_no_tag(
    built, docker_client, test_base, runtime_index
) -> None:
    builder, _, _ = built
    args = image_args(test_base, runtime_index)
    args[args.index("--jit-modules") + 1] = "flashinfer.jit.norm:gen_no_such_module"
    before = repository_tags(docker_client)
    containers = repository_containers(docker_client)
    result = builder.run(*args, check=False)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        "kernel build failed: cannot load generator flashinfer.jit.norm:gen_no_such_module" in line
    )
    assert repository_tags(docker_client) == before
    assert repository_containers(docker_client) == containers, "the kernel container is removed"


def test_failing_build_step_names_the_step_and_leaves_no_tag(
    built, docker_client, test_base, runtime_index, tmp_path
) -> None:
    builder, _, _ = built
    index_url, _ = runtime_index
    broken = tmp_path / "requirements.txt"  # a user's unhashed list, honoured as given
    broken.write_text(IMAGE_RUNTIME_REQUIREMENTS.read_text() + "no-such-package-for-builder==1.0\n")
    args = image_args(test_base, (index_url, broken))
    before = repository_tags(docker_client)
    result = builder.run(*args, check=False)
    assert result.returncode == 1
    assert "image build failed at step" in result.stderr
    assert "pip install ${RUNTIME_REQUIRE_HASHES" in result.stderr  # the runtime step
    assert "no-such-package-for-builder" in result.stderr
    assert repository_tags(docker_client) == before


def test_docker_daemon_down_is_one_line(builder: Builder) -> None:
    """Could not check (9) is not "checked and found wrong" (1); --json says so too."""
    result = builder.run(
        "image", "--json", env={"DOCKER_HOST": "unix:///nonexistent.sock"}, check=False
    )  # fmt: skip
    assert result.returncode == 9
    assert "error: cannot reach the Docker daemon at unix:///nonexistent.sock: no socket" in (
        result.stderr
    )
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 9
    assert answer["error"].startswith("cannot reach the Docker daemon")


def test_a_daemon_that_does_not_answer_is_named_with_its_cause(builder: Builder) -> None:
    """Not "start one" for every case: the socket's absence, a refused connection."""
    for where, cause in [
        ("tcp://127.0.0.1:1", "nothing answers there"),
        (f"unix://{builder.data_dir}/no.sock", f"no socket at {builder.data_dir}/no.sock"),
    ]:
        result = builder.run("image", env={"DOCKER_HOST": where}, check=False)
        assert result.returncode == 9
        assert f"error: cannot reach the Docker daemon at {where}: {cause}" in result.stderr


def test_plan_without_a_daemon_says_what_is_known_from_this_machine(
    builder: Builder, fork_wheels: Path
) -> None:
    """The wheels, the runtime lock (checked current) and the kernel list need no daemon;
    the tag (it hashes the base image's id) and what is cached do, and it says so."""
    seed_cache(builder, fork_wheels)  # the wheels are the run's
    result = builder.run(
        "image", "--plan", "--json", env={"DOCKER_HOST": "unix:///nonexistent.sock"}
    )  # fmt: skip
    plan = json.loads(result.stdout)
    target = load_target(builder.data_dir, STACK_TARGET)
    assert plan["reference"] is None and "no socket at /nonexistent.sock" in plan["daemon"]
    assert [k["generator"] for k in plan["kernels"]] == list(target.jit_modules)
    assert plan["runtime_lock"]["file"] == str(target.image.lock)
    assert plan["runtime_lock"]["packages"] == len(lockfile.parse(target.image.lock).packages)
    assert set(plan["wheels"]) == {"sglang", "flashinfer"}
    assert plan["runtime_lock"]["base_provides"] == []
    shown = builder.run("image", "--plan", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert "unknown without a Docker daemon" in shown.stdout
    # A lock that leaves torch to the base says so.
    with_base = builder.run(
        "image", "--plan", "--runtime-requirements", str(IMAGE_RUNTIME_LOCK),
        env={"DOCKER_HOST": "unix:///nonexistent.sock"},
    )  # fmt: skip
    assert f"from {IMAGE_RUNTIME_LOCK} (current), beside the base's torch" in with_base.stdout


def test_manifest_records_exactly_what_was_built(built, docker_client) -> None:
    import hashlib

    builder, image, first_manifest = built
    manifests = builder.data_dir / "manifests" / "sm120-0.5.9"
    manifest = json.loads(first_manifest.read_text())
    validate_manifest(manifest)
    assert manifest["image"]["image_id"] == docker_client.images.get(image["reference"]).id
    assert manifest["image"]["pushed"] is None, "nothing was pushed: nothing claimed"
    assert manifest["jit_cache"] == image["jit_inventory"]
    assert set(manifest["wheels"]) == {"sglang", "flashinfer", "kernels"}
    for name, wheel in manifest["wheels"].items():
        on_disk = builder.wheelhouse / wheel["filename"]
        assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == wheel["sha256"]
        assert wheel["published"] == []
        fork = manifest["upstreams"]["flashinfer" if name == "kernels" else name]
        assert fork["fork_commit"][:7] in wheel["version"]
    recipe = manifest["launch"]["glm5-nvfp4-tp8"]
    assert recipe["image"] == image["reference"]
    assert "flashinfer_cutlass" in recipe["args"]
    assert not list(manifests.glob(".*partial"))


def test_manifest_history_is_kept(built, test_base, runtime_index) -> None:
    builder, _, _ = built
    manifests = builder.data_dir / "manifests" / "sm120-0.5.9"
    before = {p.name: p.read_bytes() for p in manifests.glob("2*.json")}
    result = json.loads(builder.run(*image_args(test_base, runtime_index, "--json")).stdout)
    after = {p.name: p.read_bytes() for p in manifests.glob("2*.json")}
    assert set(before) < set(after), "a new manifest per build"
    assert all(after[name] == content for name, content in before.items()), "none rewritten"
    latest = manifests / "latest.json"
    assert latest.is_symlink() and latest.resolve() == Path(result["manifest"])


def test_pushed_manifest_has_the_registry_digest_and_no_secret(
    built, docker_client, registry, test_base, runtime_index
) -> None:
    builder, _, _ = built
    repository = f"{registry}/ml/manifested"
    args = image_args(test_base, runtime_index, "--push", repository, "--json")
    result = json.loads(builder.run(*args, env=REGISTRY_ENV).stdout)
    manifest = json.loads(Path(result["manifest"]).read_text())
    validate_manifest(manifest)
    digest = docker_client.images.get_registry_data(
        f"{repository}:{manifest['image']['pushed']['tag']}",
        auth_config={"username": REGISTRY_USER, "password": REGISTRY_PASSWORD},
    ).id
    assert manifest["image"]["pushed"]["digest"] == digest
    assert manifest["launch"]["glm5-nvfp4-tp8"]["image"] == f"{repository}@{digest}"
    for path in builder.data_dir.joinpath("manifests").rglob("*.json"):
        assert REGISTRY_PASSWORD not in path.read_text()


def test_unreachable_registry_is_a_clear_error_and_leaves_no_tag(
    built, docker_client, test_base, runtime_index
) -> None:
    builder, _, _ = built
    repository = "127.0.0.1:1/ml/nowhere"
    args = image_args(test_base, runtime_index, "--push", repository)
    result = builder.run(*args, env=REGISTRY_ENV, check=False)
    assert result.returncode == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: push to {repository} failed:")
    assert "connection refused" in line.lower()
    assert not repository_tags(docker_client, repository)


def test_two_image_runs_at_once_on_one_cache_both_finish(built, test_base, runtime_index) -> None:
    """The kernel wheel, wheelhouse and manifest copies of two concurrent runs never share a
    temporary name (they once crashed with FileNotFoundError in 10 of 10 rounds)."""
    import subprocess

    builder, image, _ = built
    processes = [
        subprocess.Popen(
            builder.command(*image_args(test_base, runtime_index, "--json")),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COLUMNS": "200", "BUILDER_CONFIG": "/nonexistent",
                 **builder.env},
        )
        for _ in range(2)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=900) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    results = [json.loads(out)["image"] for out, _ in outputs]
    assert {r["reference"] for r in results} == {image["reference"]}, "the same image, twice"
    assert results[0]["kernel_wheel"] == results[1]["kernel_wheel"]
    kernel = builder.wheelhouse / results[0]["kernel_wheel"]
    assert kernel.is_file() and not list(builder.wheelhouse.glob(".*")), "no partial left"


def test_the_saved_context_rebuilds_the_same_image_and_the_image_bench_runs(
    built, docker_client, test_base, runtime_index
) -> None:
    """`--save-context` (the suite's image was built with it) holds the exact build: a plain
    `docker build` of it with its saved arguments is cached step for step and gives the
    very image. That is bench/image_bench.py's no-op comparison, run here in its smallest
    form (one round) so the benchmark the README names cannot rot."""
    import contextlib
    import importlib.util

    from docker.errors import ImageNotFound

    builder, image, _ = built
    context = builder.cache_dir.parent / "context"
    assert sorted(p.name for p in (context / "wheels").iterdir()) == [
        "flashinfer", "kernels", "sglang",
    ]  # fmt: skip
    spec = importlib.util.spec_from_file_location("image_bench", REPO_ROOT / "bench/image_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    command = builder.command(*image_args(test_base, runtime_index, "--json"))
    env = {**os.environ, "BUILDER_CONFIG": "/nonexistent", **builder.env}
    try:
        measured = bench.noop_builds(docker_client, command, env, context, repeat=1)
        assert docker_client.images.get(bench.NOOP_TAG).id == image["image_id"]
    finally:
        with contextlib.suppress(ImageNotFound):
            docker_client.images.remove(bench.NOOP_TAG)
    assert len(measured["noop_builder_s"]) == len(measured["noop_docker_build_s"]) == 1
    assert measured["noop_ratio"] > 0
    assert measured["noop_builder_replayed"] == [True], "the timed no-op is the recorded one"
