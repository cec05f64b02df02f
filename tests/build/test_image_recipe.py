"""The image describes itself: its recipe agrees with the build host's manifest; `launch`,
`deploy-files` and `wait-ready` work from `--image REF` alone, in a folder with no checkout,
pulling the image from the registry; `builder verify` passes on the image and names the
culprits in a tampered copy. Real engine, real registry, the real test image.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from docker.errors import ImageNotFound, NotFound

from tests.build.test_image import REGISTRY_ENV, image_args
from tests.conftest import REGISTRY_PASSWORD

pytestmark = pytest.mark.docker


def bare_builder(
    folder: Path, docker_host: str, *args: str, check: bool = True, path: str | None = None
):
    """`builder` as the VM operator runs it: no checkout, no data directory, no manifests."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BUILDER_DATA")}
    env.update(DOCKER_HOST=docker_host, BUILDER_CONFIG="/nonexistent", COLUMNS="200")
    env.update(REGISTRY_ENV)
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    result = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", *args],
        capture_output=True, text=True, cwd=folder, env=env,
    )  # fmt: skip
    if check and result.returncode:
        raise AssertionError(f"builder {' '.join(args)} failed:\n{result.stderr}")
    return result


def test_the_recipe_in_the_image_agrees_with_the_manifest(built_image, docker_client) -> None:
    from builder.core.docker_client import read_file_from_image
    from builder.spec.recipe import RECIPE_PATH

    _, image, manifest_path = built_image
    manifest = json.loads(manifest_path.read_text())
    recipe = json.loads(read_file_from_image(docker_client, image["reference"], RECIPE_PATH))
    assert recipe["target"] == {k: manifest["target"][k] for k in recipe["target"]}
    for name, upstream in recipe["upstreams"].items():
        recorded = manifest["upstreams"][name]
        assert upstream["commit"] == recorded["commit"]
        assert upstream["fork_commit"] == recorded["fork_commit"]
        assert upstream["series_sha256"] == recorded["series_sha256"]
        assert upstream["patches"] == recorded["patches"]
    assert set(recipe["wheels"]) == set(manifest["wheels"]) == {"sglang", "flashinfer", "kernels"}
    for name, wheel in recipe["wheels"].items():
        for field in ("filename", "version", "sha256", "dist_name"):
            assert wheel[field] == manifest["wheels"][name][field]
    assert recipe["jit_modules"] == manifest["image_options"]["jit_modules"]
    assert recipe["builder"] == manifest["builder"]  # built in this run: the same builder
    assert set(recipe["profiles"]["profiles"]) == set(manifest["launch"])
    assert recipe["patched_lines"]["flashinfer"], "the patched lines travel with the image"


def test_launch_and_deploy_files_from_a_pulled_image_alone(
    built_image, docker_client, docker_host, registry, test_base, runtime_index, tmp_path
) -> None:
    builder, _, _ = built_image
    repository = f"{registry}/vm/sglang-sm120"
    args = image_args(test_base, runtime_index, "--push", repository, "--json")
    pushed = json.loads(builder.run(*args, env=REGISTRY_ENV).stdout)["image"]["pushed"]
    reference = pushed["reference"]
    docker_client.images.remove(f"{repository}:{pushed['tag']}")

    # No Docker daemon at all: the profiles come from the registry's image config (its
    # launch label), and not one layer is pulled.
    no_daemon = "unix:///nonexistent/docker.sock"
    launched = bare_builder(
        tmp_path, no_daemon, "launch", "--image", reference, "--port", "8123",
        "--set", "mem_fraction_static=0.8", "--json",
    )  # fmt: skip
    assert REGISTRY_PASSWORD not in launched.stdout + launched.stderr
    recipe = json.loads(launched.stdout)
    assert recipe["image"] == reference
    assert recipe["readiness"]["url"] == "http://127.0.0.1:8123"
    assert "--port" in recipe["args"] and "8123" in recipe["args"]
    assert "0.8" in recipe["args"]
    with pytest.raises(ImageNotFound):
        docker_client.images.get(reference)

    out = tmp_path / "deploy"
    bare_builder(tmp_path, no_daemon, "deploy-files", "--image", reference, "--out", str(out))
    compose = yaml.safe_load((out / "compose.yaml").read_text())
    (service,) = compose["services"].values()
    assert service["image"] == reference
    assert not list(tmp_path.glob("manifests")), "nothing expected from a checkout"


def test_an_image_without_a_recipe_or_out_of_reach_is_one_line(
    built_image, docker_host, test_base, tmp_path
) -> None:
    no_recipe = bare_builder(tmp_path, docker_host, "launch", "--image", test_base, check=False)
    assert no_recipe.returncode == 1
    assert f"--image {test_base}: holds no /opt/builder/recipe.json" in no_recipe.stderr
    missing = bare_builder(
        tmp_path, docker_host, "launch", "--image", "127.0.0.1:9/none:1", check=False
    )
    assert missing.returncode == 1
    (line,) = [line for line in missing.stderr.splitlines() if line.startswith("error:")]
    assert "--image 127.0.0.1:9/none:1: not here and cannot be pulled" in line


def _reduced_runtime_gap(detail: str) -> bool:
    """The test image installs a reduced runtime list (what flashinfer needs, beside the
    test base's Debian torch), not all of sglang's requirements, so `pip check` names one
    sglang lacks, or its torch pin that the base's torch does not meet: a true finding."""
    from tests.services import IMAGE_RUNTIME_REQUIREMENTS, requirement_lines

    if not detail.startswith("sglang "):
        return False
    if " has requirement torch" in detail:
        return "but you have torch 2.6.0" in detail
    missing = detail.split(" requires ", 1)[1].split(",", 1)[0]
    installed = {line.split("=")[0].split("[")[0].lower() for line in requirement_lines(
        IMAGE_RUNTIME_REQUIREMENTS)}  # fmt: skip
    return detail.startswith("sglang ") and missing.lower() not in installed


def test_verify_passes_on_the_image(built_image, docker_host, tmp_path) -> None:
    _, image, _ = built_image
    result = bare_builder(
        tmp_path, docker_host, "verify", image["reference"], "--json", check=False
    )
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert [name for name, c in checks.items() if not c["ok"]] == ["pip check"], checks
    assert _reduced_runtime_gap(checks["pip check"]["detail"]), checks["pip check"]
    assert result.returncode == 1
    assert set(checks) == {
        "labels", "sources", "wheel sglang", "wheel flashinfer", "wheel kernels",
        "patches sglang", "patches flashinfer", "kernel wheel", "kernels load", "sbom",
        "pip check",
    }  # fmt: skip
    # What each wheel was made from: the pins' refs and the upstream commits.
    assert "sglang 0.5.9+sm120.g" in checks["sources"]["detail"]
    assert "refs/tags/v0.5.9 at " in checks["sources"]["detail"]
    text = bare_builder(tmp_path, docker_host, "verify", image["reference"], check=False).stdout
    assert len(text.strip().splitlines()) == len(checks) + 1  # one line per check, a verdict


def test_verify_against_the_build_hosts_manifest_and_lock(
    built_image, docker_host, runtime_index, tmp_path
) -> None:
    """Not only what the image says of itself: the image id and wheel hashes the build
    recorded, and the packages of a lock; another build's manifest or lock fails, named."""
    builder, image, _ = built_image
    from builder.spec.manifest import latest_with_image

    latest = latest_with_image(builder.data_dir / "manifests" / "sm120-0.5.9")
    _, lock = runtime_index  # the lock the test image was built from
    result = bare_builder(
        tmp_path, docker_host, "verify", image["reference"], "--manifest", str(latest),
        "--lock", str(lock), "--json", check=False,
    )  # fmt: skip
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    for name in ("manifest image", "manifest wheels", "runtime lock"):
        assert checks[name]["ok"], checks[name]

    record = json.loads(latest.read_text())
    record["wheels"]["sglang"]["sha256"] = "0" * 64
    other = tmp_path / "other-build.json"
    other.write_text(json.dumps(record))
    changed = lock.read_text().replace("tabulate==0.10.0", "tabulate==0.9.0", 1)
    other_lock = tmp_path / "other-lock.txt"
    other_lock.write_text(changed)
    result = bare_builder(
        tmp_path, docker_host, "verify", image["reference"], "--manifest", str(other),
        "--lock", str(other_lock), "--json", check=False,
    )  # fmt: skip
    assert result.returncode == 1
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert not checks["manifest wheels"]["ok"] and "sglang" in checks["manifest wheels"]["detail"]
    assert checks["manifest image"]["ok"]
    assert not checks["runtime lock"]["ok"]
    assert "tabulate 0.10.0 (lock: 0.9.0)" in checks["runtime lock"]["detail"]


def _tampered_copy(docker_client, reference: str) -> str:
    """The image with one module .so replaced, one installed file of a wheel edited and one
    locked package removed."""
    script = (
        "set -e; site=$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
        "printf 'not a kernel' > $site/flashinfer_jit_cache/jit_cache/gelu_tanh_and_mul/gelu_tanh_and_mul.so; "
        "echo '# edited on the VM' >> $site/flashinfer/jit/comm.py; "
        "python -m pip uninstall -q -y tabulate"
    )
    container = docker_client.containers.run(
        reference, ["-c", script], entrypoint=["sh"], detach=True, network_mode="none"
    )
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()
        tampered = container.commit(repository="sglang-sm120-tampered", tag="test")
    finally:
        container.remove(force=True)
    return tampered.tags[0]


def test_verify_names_the_culprits_in_a_tampered_copy(
    built_image, docker_client, docker_host, tmp_path
) -> None:
    _, image, _ = built_image
    tampered = _tampered_copy(docker_client, image["reference"])
    try:
        result = bare_builder(tmp_path, docker_host, "verify", tampered, "--json", check=False)
        assert result.returncode == 1
        checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
        failed = {name for name, c in checks.items() if not c["ok"]}
        assert failed == {"wheel flashinfer", "wheel kernels", "kernels load", "sbom", "pip check"}
        assert "flashinfer/jit/comm.py" in checks["wheel flashinfer"]["detail"]
        assert (
            "jit_cache/gelu_tanh_and_mul/gelu_tanh_and_mul.so" in checks["wheel kernels"]["detail"]
        )
        assert "gelu_tanh_and_mul.so" in checks["kernels load"]["detail"]
        assert "tabulate absent installed, SBOM says" in checks["sbom"]["detail"]
        text = bare_builder(tmp_path, docker_host, "verify", tampered, check=False).stdout
        assert "FAIL wheel flashinfer" in text and text.strip().endswith("5 of 11 checks failed")
    finally:
        docker_client.images.remove(tampered, force=True)


def test_wait_ready_takes_its_expectations_from_the_image(
    built_image, docker_client, docker_host, tmp_path
) -> None:
    """The stand-in server answers with another quantization than the image's profile
    expects: wait-ready --image reports the mismatch without any checkout."""
    from tests.services import free_port
    from tests.site.test_readiness import GOOD_INFO, STANDIN

    _, image, _ = built_image
    port = free_port()
    info = {**GOOD_INFO, "quantization": "fp8"}
    container = docker_client.containers.run(
        image["reference"], [str(port)], entrypoint=["python", "/standin.py"],
        detach=True, network_mode="host",
        environment={"SERVER_INFO": json.dumps(info)},
        volumes={str(STANDIN): {"bind": "/standin.py", "mode": "ro"}},
    )  # fmt: skip
    try:
        result = bare_builder(
            tmp_path, docker_host, "wait-ready", f"http://127.0.0.1:{port}",
            "--image", image["reference"], "--container", container.name, "--poll", "0.5",
            "--json", check=False,
        )  # fmt: skip
    finally:
        container.remove(force=True)
    assert result.returncode == 5, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["state"] == "mismatch"
    assert "quantization" in verdict["message"]


# --- the server through the image's own recipe ---------------------------------------------
#
# sglang cannot start without a GPU, so the stand-in server takes its place inside a copy of
# the test image: `sglang/launch_server.py` is the stand-in and sglang's package __init__ is
# emptied (the reduced test runtime lacks its imports). The image's entrypoint, healthcheck
# and recipe are the real ones; the container is started with the recipe's own `docker run`,
# less `--gpus all` and the unlimited memlock (this sandbox refuses it).


def _file_archive(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def standin_image(built_image, docker_client) -> str:
    from tests.site.test_readiness import STANDIN

    _, image, _ = built_image
    script = (
        "set -e; package=$(python -c 'import importlib.util as u; "
        'print(u.find_spec("sglang").submodule_search_locations[0])\'); '
        ": > $package/__init__.py; cp /standin.py $package/launch_server.py"
    )
    # Copied in, not mounted: a committed container keeps its mount points as volumes.
    container = docker_client.containers.create(
        image["reference"], ["-c", script], entrypoint=["sh"], network_mode="none"
    )
    try:
        container.put_archive("/", _file_archive("standin.py", STANDIN.read_bytes()))
        container.start()
        assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()
        # The image's own entrypoint and command, as committed; only the package changed.
        committed = container.commit(
            repository="sglang-sm120-standin", tag="test",
            changes=['ENTRYPOINT ["python", "/opt/builder/entrypoint.py"]',
                     'CMD ["--host", "0.0.0.0", "--port", "30000"]'],
        )  # fmt: skip
    finally:
        container.remove(force=True)
    yield committed.tags[0]
    docker_client.images.remove(committed.tags[0], force=True)


def _start_from_recipe(
    tmp_path: Path, docker_host: str, image: str, port: int, name: str, *extra: str, env=()
) -> dict:
    from tests.site.test_readiness import GOOD_INFO

    recipe = json.loads(
        bare_builder(
            tmp_path, docker_host, "launch", "--image", image, "--port", str(port),
            "--name", name, "--hf-cache", str(tmp_path / "hf"), "--json", *extra,
        ).stdout
    )  # fmt: skip
    command = recipe["docker_run"]
    # No GPU here, and this sandbox refuses an unlimited memlock: those two flags go.
    for flag, value in (("--gpus", "all"), ("--ulimit", "memlock=-1")):
        at = next(i for i in range(len(command) - 1) if command[i : i + 2] == [flag, value])
        del command[at : at + 2]
    knobs = ["-e", f"SERVER_INFO={json.dumps(GOOD_INFO)}"]
    for item in env:
        knobs += ["-e", item]
    at = command.index(image)
    command[at:at] = ["--network", "host", *knobs]
    started = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": docker_host}
    )
    assert started.returncode == 0, started.stderr
    return recipe


def _wait(tmp_path: Path, docker_host: str, recipe: dict, *extra: str):
    return bare_builder(
        tmp_path, docker_host, "wait-ready", recipe["readiness"]["url"],
        "--container", recipe["container_name"], "--poll", "0.5", "--deadline", "2", "--json",
        *extra, check=False,
    )  # fmt: skip


def test_a_server_from_the_recipe_with_an_api_key_file(
    standin_image, docker_client, docker_host, tmp_path
) -> None:
    from tests.services import free_port

    key = "sk-builder-test-0123456789"
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    port, name = free_port(), f"recipe-key-{free_port()}"
    recipe = _start_from_recipe(
        tmp_path, docker_host, standin_image, port, name, "--api-key-file", str(key_file)
    )
    try:
        assert key not in json.dumps(recipe), "the key itself is never in the recipe"
        ready = _wait(tmp_path, docker_host, recipe, "--image", standin_image,
                      "--api-key-file", str(key_file))  # fmt: skip
        assert ready.returncode == 0, ready.stdout + ready.stderr
        assert json.loads(ready.stdout)["state"] == "ready"

        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5)
        assert refused.value.code == 401, "a request without the key is refused"
        without_key = _wait(tmp_path, docker_host, recipe, "--image", standin_image)
        assert without_key.returncode == 5
        assert "requires an API key; pass --api-key-file" in json.loads(without_key.stdout)[
            "message"]  # fmt: skip

        container = docker_client.containers.get(name)
        inspected = json.dumps(container.attrs)
        assert key not in inspected, "not in the command line, environment or config"
        assert key not in container.logs().decode()
        assert str(port) in container.attrs["Config"]["Cmd"], "served on the recipe's port"
        out = tmp_path / "deploy"
        # By its id: a local tag has no digest to pin (deploy-files deploys by digest).
        image_id = docker_client.images.get(standin_image).id
        bare_builder(tmp_path, docker_host, "deploy-files", "--image", image_id,
                     "--api-key-file", str(key_file), "--out", str(out))  # fmt: skip
        for generated in out.iterdir():
            assert key not in generated.read_text(), generated.name
        assert "SGLANG_API_KEY_FILE" in (out / "compose.yaml").read_text()
    finally:
        docker_client.containers.get(name).remove(force=True)


def test_wait_ready_on_a_launched_container_checks_its_profile(
    standin_image, docker_client, docker_host, tmp_path
) -> None:
    """Only --container: the profile and --set params come from launch's labels, so a
    server started with other backends than its profile is a mismatch, not 'ready'."""
    from tests.services import free_port

    port, name = free_port(), f"recipe-labels-{free_port()}"
    recipe = _start_from_recipe(
        tmp_path, docker_host, standin_image, port, name, "--set", "kv_cache_dtype=fp16"
    )
    try:
        verdict = bare_builder(
            tmp_path, docker_host, "wait-ready", recipe["readiness"]["url"],
            "--container", name, "--poll", "0.5", "--deadline", "2", "--json", check=False,
        )  # fmt: skip
        assert f"checking profile {recipe['profile']} as launched" in verdict.stderr
        assert verdict.returncode == 5, verdict.stdout + verdict.stderr
        assert "kv_cache_dtype" in json.loads(verdict.stdout)["message"]
    finally:
        docker_client.containers.get(name).remove(force=True)


def test_doctor_on_a_launched_container_needs_no_checkout(
    standin_image, docker_client, docker_host, tmp_path
) -> None:
    """#55: `doctor --container NAME` on a VM without a checkout takes the image and profile
    the container was launched with (its labels), as wait-ready does."""
    from tests.services import free_port

    port, name = free_port(), f"doctor-labels-{free_port()}"
    recipe = _start_from_recipe(tmp_path, docker_host, standin_image, port, name)
    empty = tmp_path / "no-checkout"
    empty.mkdir()
    env = {**os.environ, "DOCKER_HOST": docker_host, "BUILDER_DATA_DIR": str(empty),
           "BUILDER_CONFIG": "/nonexistent", **REGISTRY_ENV}  # fmt: skip
    try:
        result = subprocess.run(
            [sys.executable, "-m", "builder.cli.main", "doctor", "--container", name, "--json"],
            capture_output=True, text=True, cwd=empty, env=env,
        )  # fmt: skip
    finally:
        docker_client.containers.get(name).remove(force=True)
    assert "data directory" not in result.stderr, result.stderr
    assert f"checking profile {recipe['profile']} as launched" in result.stderr
    findings = {f["check"]: f for f in json.loads(result.stdout)["findings"]}
    assert "jit" in findings and "image recipe" not in findings, findings


@pytest.mark.parametrize(
    ("knobs", "state", "code"),
    [
        (("DIE_AFTER_SECONDS=1", "EXIT_CODE=3"), "crashed", 3),
        (("SILENT_SECONDS=600",), "stalled", 6),
    ],
)
def test_a_crashed_or_stalled_server_from_the_recipe(
    standin_image, docker_client, docker_host, tmp_path, knobs, state, code
) -> None:
    from tests.services import free_port

    port, name = free_port(), f"recipe-{state}-{free_port()}"
    recipe = _start_from_recipe(tmp_path, docker_host, standin_image, port, name, env=knobs)
    try:
        verdict = _wait(tmp_path, docker_host, recipe, "--stall-minutes", "0.1")
        assert verdict.returncode == code, verdict.stdout + verdict.stderr
        assert json.loads(verdict.stdout)["state"] == state
    finally:
        docker_client.containers.get(name).remove(force=True)


def test_doctor_on_a_vm_needs_only_the_image(built_image, docker_host, tmp_path) -> None:
    """`doctor --image REF` reads target, arch, CUDA and profile from the image's recipe: it
    runs where the data directory is unusable (here: an empty folder), and reports findings
    (no GPU on this machine: the GPU checks fail, each with a fix) instead of an error."""
    _, image, _ = built_image
    empty = tmp_path / "no-checkout"
    empty.mkdir()
    env = {**os.environ, "DOCKER_HOST": docker_host, "BUILDER_DATA_DIR": str(empty),
           "BUILDER_CONFIG": "/nonexistent", **REGISTRY_ENV}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", "doctor", "--image", image["reference"], "--json"],
        capture_output=True, text=True, cwd=empty, env=env,
    )  # fmt: skip
    assert "data directory" not in result.stderr, result.stderr
    answer = json.loads(result.stdout)
    findings = {f["check"]: f for f in answer["findings"]}
    assert answer["ok"] is False, "no GPU here: the GPU checks fail"
    assert "shm" in findings and ("gpus" in findings or "gpu count" in findings)
    assert findings["image"]["ok"], findings["image"]


def test_qualify_through_the_images_recipe_and_its_receipt_beside_the_image(
    standin_image, docker_client, docker_host, registry, tmp_path
) -> None:
    """The stand-in started by the image's own recipe (launch --image, by digest from the
    registry), qualified with --push-receipt; launch and verify then show the receipt, and a
    receipt forged for another image under this image's tag is refused."""
    from tests.conftest import REGISTRY_USER
    from tests.services import free_port

    repository = f"{registry}/vm/qualified"
    auth = {"username": REGISTRY_USER, "password": REGISTRY_PASSWORD}
    docker_client.images.get(standin_image).tag(repository, "test")
    docker_client.images.push(repository, tag="test", auth_config=auth)
    (reference,) = [
        d for d in docker_client.images.get(standin_image).attrs["RepoDigests"]
        if d.startswith(repository)
    ]  # fmt: skip
    port, name = free_port(), f"recipe-qualify-{free_port()}"
    recipe = _start_from_recipe(tmp_path, docker_host, reference, port, name)
    try:
        out = tmp_path / "qualify"
        result = bare_builder(
            tmp_path, docker_host, "qualify", recipe["readiness"]["url"], "--container", name,
            "--no-throughput", "--needles", "4096", "--gsm8k", "none", "--out", str(out),
            "--push-receipt",
            check=False,
        )  # fmt: skip
        assert REGISTRY_PASSWORD not in result.stdout + result.stderr
        receipt = json.loads((out / "receipt.json").read_text())
        # verify comes first, and the test image's reduced runtime fails its pip check
        # (test_verify_passes_on_the_image): a true finding, so qualify stops there.
        assert result.returncode == 8, result.stdout + result.stderr
        assert receipt["result"]["failed_at"] == "verify"
        assert receipt["server"]["profile"] == recipe["profile"], "from the container's labels"
        assert receipt["server"]["image"]["repo_digests"] == [reference]
        assert "receipt pushed beside its image" in result.stderr
        tag = reference.split("@")[1].replace(":", "-") + ".receipt"

        launched = bare_builder(tmp_path, docker_host, "launch", "--image", reference)
        assert f"receipt {receipt['created']}: NOT qualified (verify)" in launched.stderr
        verified = bare_builder(tmp_path, docker_host, "verify", reference, "--json", check=False)
        assert json.loads(verified.stdout)["receipt"].startswith(
            f"receipt {receipt['created']}: NOT qualified (verify)"
        )

        # A receipt that describes another image, pushed under this image's tag.
        forged = tmp_path / "forged"
        forged.mkdir()
        other = {
            **receipt,
            "server": {
                **receipt["server"],
                "image": {
                    **receipt["server"]["image"],
                    "repo_digests": [f"{repository}@sha256:{'1' * 64}"],
                },
            },
        }
        (forged / "receipt.json").write_text(json.dumps(other))
        (forged / "Dockerfile").write_text("FROM scratch\nCOPY receipt.json /\n")
        docker_client.images.build(
            path=str(forged), tag=f"{repository}:{tag}",
            labels={"io.builder.receipt": json.dumps(other)},
        )  # fmt: skip
        docker_client.images.push(repository, tag=tag, auth_config=auth)
        docker_client.images.remove(f"{repository}:{tag}")
        refused = bare_builder(tmp_path, docker_host, "verify", reference, check=False)
        assert f"receipt {repository}:{tag} describes another image" in refused.stderr
        assert "NOT qualified" not in refused.stderr
    finally:
        docker_client.containers.get(name).remove(force=True)


# No GPU and no NVIDIA container runtime here: this stands in for them in front of the real
# docker CLI. It drops what only they can serve (--gpus all; this sandbox also refuses an
# unlimited memlock), puts the server on the host network and gives the stand-in its answers.
def docker_without_gpus(tmp_path: Path, monkeypatch, server_info: dict) -> Path:
    """A folder for PATH whose `docker` is the stand-in below in front of the real CLI, the
    stand-in server answering `server_info`."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(_DOCKER_WITHOUT_GPUS)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("REAL_DOCKER", shutil.which("docker"))
    monkeypatch.setenv("STANDIN_INFO", json.dumps(server_info))
    return bin_dir


_DOCKER_WITHOUT_GPUS = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["run"]:
    for flag, value in (("--gpus", "all"), ("--ulimit", "memlock=-1")):
        at = next(i for i in range(len(args) - 1) if args[i : i + 2] == [flag, value])
        del args[at : at + 2]
    args[1:1] = ["--network", "host", "-e", "SERVER_INFO=" + os.environ["STANDIN_INFO"]]
os.execv(os.environ["REAL_DOCKER"], ["docker", *args])
"""


def test_qualify_start_launches_the_recipe_qualifies_and_removes_the_server(
    standin_image, docker_client, docker_host, tmp_path, monkeypatch
) -> None:
    """`qualify --start`: the image's own launch recipe started with launch's docker run,
    watched through its labels, qualified, then stopped and removed."""

    from tests.services import free_port
    from tests.site.test_readiness import GOOD_INFO

    bin_dir = docker_without_gpus(tmp_path, monkeypatch, GOOD_INFO)
    port, name, out = free_port(), f"qualify-start-{free_port()}", tmp_path / "qualify"
    try:
        result = bare_builder(
            tmp_path, docker_host, "qualify", "--start", "--image", standin_image,
            "--port", str(port), "--name", name, "--hf-cache", str(tmp_path / "hf"),
            "--no-throughput", "--needles", "4096", "--gsm8k", "none", "--out", str(out),
            check=False, path=str(bin_dir),
        )  # fmt: skip
    finally:  # whatever happened, no container is left for the tests after this one
        with contextlib.suppress(NotFound):
            left = docker_client.containers.get(name)
            left.remove(force=True)
            pytest.fail(f"qualify --start left {name} behind")
    receipt = json.loads((out / "receipt.json").read_text())
    assert f"started {name} from {standin_image}" in result.stderr
    assert receipt["server"]["container"] == name
    assert receipt["server"]["url"] == f"http://127.0.0.1:{port}"
    recipe = json.loads(
        bare_builder(
            tmp_path, docker_host, "launch", "--image", standin_image, "--port", str(port),
            "--name", name, "--hf-cache", str(tmp_path / "hf"), "--json",
        ).stdout
    )  # fmt: skip
    assert receipt["server"]["profile"] == recipe["profile"]
    assert receipt["server"]["command"][-len(recipe["args"]) :] == recipe["args"]
    # As in the test above: the test image's reduced runtime fails its own verify.
    assert result.returncode == 8 and receipt["result"]["failed_at"] == "verify", result.stderr
    assert f"stopped and removed {name}" in result.stderr
    assert "standin: server_args=" in (out / "server.log").read_text(), "its log, kept beside"
