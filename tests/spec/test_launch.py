"""Launch profiles: the commands match the target data; overrides work; bad input is clear."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from builder.core.errors import BuilderError
from builder.site import deploy
from builder.spec import launch, launch_profiles
from tests.conftest import REPO_ROOT, Builder

TARGET = REPO_ROOT / "images/sm120-0.5.9/target.toml"
PROFILES = tomllib.loads((REPO_ROOT / "images/sm120-0.5.9/profiles.toml").read_text())["profiles"]
IMAGE = "registry.example/ml/sglang-sm120@sha256:" + "a" * 64


def _flag(args: tuple[str, ...], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_default_profile_is_the_field_validated_tp8_recipe() -> None:
    recipe = launch.resolve(TARGET, None, IMAGE, launch.Overrides())
    assert recipe.profile == "glm5-nvfp4-tp8"
    base = PROFILES["glm5-nvfp4-tp8"]
    # Every argument comes from the data, with params filled in.
    params = base["params"]
    expected = [a.format(**params) for a in base["args"]]
    assert list(recipe.args) == expected
    assert _flag(recipe.args, "--moe-runner-backend") == "flashinfer_cutlass"
    assert _flag(recipe.args, "--tp") == "8"
    assert _flag(recipe.args, "--kv-cache-dtype") == "bfloat16"  # the dense-MLA stack's safe KV
    assert "--enable-flashinfer-allreduce-fusion" not in recipe.args
    assert recipe.env == base["env"]
    assert not recipe.experimental

    run = recipe.docker_run()
    assert run[:2] == ["docker", "run"]
    for part in ("--gpus", "--ipc=host", "--shm-size"):
        assert part in run
    assert IMAGE in run and run.index(IMAGE) == len(run) - len(recipe.args) - 1
    assert "127.0.0.1:30000:30000" in run, "published on loopback only by default"
    assert "/var/lib/sglang/huggingface:/root/.cache/huggingface:rw" in run


def test_fusion_profile_is_the_default_plus_the_flag_and_warns() -> None:
    plain = launch.resolve(TARGET, "glm5-nvfp4-tp8", IMAGE, launch.Overrides())
    fusion = launch.resolve(TARGET, "glm5-nvfp4-tp8-fusion", IMAGE, launch.Overrides())
    assert fusion.args == (*plain.args, "--enable-flashinfer-allreduce-fusion")
    assert fusion.experimental
    assert "236" in fusion.warning and "3,740" in fusion.warning
    assert fusion.expect["enable_flashinfer_allreduce_fusion"] is True
    assert fusion.expect["moe_runner_backend"] == "flashinfer_cutlass"


@pytest.mark.parametrize(
    "overrides",
    [
        launch.Overrides(params=(("kv_cache_dtype", "fp8_e4m3"),)),
        launch.Overrides(extra_args=("--kv-cache-dtype=fp8_e5m2",)),
        launch.Overrides(extra_args=("--kv-cache-dtype", "fp8_e4m3")),
    ],
)
@pytest.mark.parametrize("profile", ["glm5-nvfp4-tp8", "glm5-nvfp4-tp8-fusion"])
def test_the_dense_mla_stack_refuses_fp8_kv_in_one_line_saying_why(profile, overrides) -> None:
    """sglang 0.5.9 + FlashInfer MLA reads the packed DSA fp8 pool as plain fp8: wrong text,
    not an error; the profile refuses it however the value arrives."""
    with pytest.raises(BuilderError) as refused:
        launch.resolve(TARGET, profile, IMAGE, overrides)
    message = str(refused.value)
    assert "\n" not in message and "--kv-cache-dtype fp8_e" in message
    assert "packed DSA fp8 KV pool" in message and "bfloat16" in message


def test_overrides_model_dir_port_params_and_extra_args() -> None:
    overrides = launch.Overrides(
        model="/data/GLM-5-NVFP4",
        port=8000,
        params=(("kv_cache_dtype", "bf16"),),
        extra_args=("--log-level", "debug"),
        container_name="glm5-test",
    )
    recipe = launch.resolve(TARGET, None, IMAGE, overrides)
    assert _flag(recipe.args, "--model-path") == "/models/GLM-5-NVFP4"
    assert ("/data/GLM-5-NVFP4", "/models/GLM-5-NVFP4", "ro") in recipe.volumes
    assert _flag(recipe.args, "--port") == "8000" and "127.0.0.1:8000:8000" in recipe.docker_run()
    assert _flag(recipe.args, "--kv-cache-dtype") == "bf16"
    assert recipe.expect["kv_cache_dtype"] == "bf16"
    assert recipe.args[-2:] == ("--log-level", "debug")
    assert recipe.container_name == "glm5-test"


@pytest.mark.parametrize(
    ("profile", "overrides", "message"),
    [
        ("nope", launch.Overrides(), "unknown profile 'nope'"),
        (
            None,
            launch.Overrides(params=(("kv_dtype", "bf16"),)),
            "--set kv_dtype: profile 'glm5-nvfp4-tp8' has no such param",
        ),
        (None, launch.Overrides(port=70000), "--port 70000: not a TCP port"),
    ],
)
def test_bad_profile_or_override(profile, overrides, message) -> None:
    with pytest.raises(BuilderError, match=message):
        launch.resolve(TARGET, profile, IMAGE, overrides)


def test_compose_and_unit_carry_the_recipe() -> None:
    recipe = launch.resolve(TARGET, None, IMAGE, launch.Overrides())
    compose = deploy.compose_file(recipe)
    assert f"image: {IMAGE}" in compose
    assert "ipc: host" in compose and "driver: nvidia" in compose and "count: all" in compose
    assert "start_period: 20m" in compose
    assert '- "flashinfer_cutlass"' in compose
    unit = deploy.systemd_unit(recipe, "/opt/sglang")
    assert "ExecStart=/usr/bin/docker compose up --abort-on-container-exit" in unit
    assert "Restart=on-failure" in unit and "StartLimitBurst=5" in unit
    assert "Type=oneshot" not in unit, "a oneshot shows active after the server crashed"
    spaced = deploy.systemd_unit(recipe, "/opt/my models")
    assert "WorkingDirectory=/opt/my models\n" in spaced
    assert "pkill" not in unit


def _manifest(directory: Path, pushed: bool) -> Path:
    directory.mkdir(parents=True)
    image = {
        "reference": "sglang-sm120:test",
        "pushed": {"reference": IMAGE} if pushed else None,
    }
    path = directory / "20260101T000000Z-test.json"
    path.write_text(json.dumps({"schema_version": 1, "image": image}))
    return path


def test_launch_cli_takes_the_pushed_image_by_digest(builder: Builder) -> None:
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    result = builder.run("launch", "--set", "kv_cache_dtype=bf16", "--json")
    recipe = json.loads(result.stdout)
    assert recipe["image"] == IMAGE
    assert "--kv-cache-dtype" in recipe["args"] and "bf16" in recipe["args"]
    assert "warning" not in result.stderr


def test_launch_cli_warns_for_unpushed_image_and_experimental_profile(builder: Builder) -> None:
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=False)
    result = builder.run("launch", "--profile", "glm5-nvfp4-tp8-fusion")
    assert "sglang-sm120:test" in result.stdout
    assert "EXPERIMENTAL" in result.stderr and "was not pushed" in result.stderr


def test_launch_cli_bad_override_is_one_line(builder: Builder) -> None:
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    result = builder.run("launch", "--set", "nonsense", check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: --set nonsense: expected KEY=VALUE"


def test_a_missing_model_folder_given_for_one_profile_is_refused(
    builder: Builder, tmp_path
) -> None:
    """`--set PROFILE:model=DIR` names a folder as `--model` does: one that is not here is
    refused (docker would mount an empty one it made), not rendered."""
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    missing = tmp_path / "no-such-checkpoint"
    result = builder.run(
        "launch", "--profile", "glm5-nvfp4-tp8", "--set", f"glm5-nvfp4-tp8:model={missing}",
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: profile glm5-nvfp4-tp8: model {missing}: no such folder on this machine"
    )


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            ("--deadline", "30"),
            "error: --deadline: only with --run (it waits for the server it starts)",
        ),
        (("--poll", "2s"), "error: --poll: only with --run (it waits for the server it starts)"),
        (("--run", "--stall-minutes", "90x"), "error: --stall-minutes 90x:"),
        (("--run", "--deadline", "1200"), "error: --deadline 1200:"),
    ],
)
def test_launch_run_takes_wait_ready_s_options(builder: Builder, given, line: str) -> None:
    """#55: `launch --run` waits as wait-ready does, with the same options, checked before
    anything starts (a bad one never reaches the Docker daemon)."""
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    result = builder.run("launch", *given, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(line), result.stderr


def test_launch_without_any_manifest_says_what_to_do(builder: Builder) -> None:
    result = builder.run("launch", check=False)
    assert result.returncode == 1
    assert "run `builder image` first" in result.stderr


def test_bind_opens_the_port_and_a_bad_address_is_refused() -> None:
    recipe = launch.resolve(TARGET, None, IMAGE, launch.Overrides(bind="0.0.0.0"))
    assert "0.0.0.0:30000:30000" in recipe.docker_run()
    assert '"0.0.0.0:30000:30000"' in deploy.compose_file(recipe)
    assert recipe.url == "http://127.0.0.1:30000"
    default = deploy.compose_file(launch.resolve(TARGET, None, IMAGE, launch.Overrides()))
    assert '"127.0.0.1:30000:30000"' in default
    with pytest.raises(BuilderError, match=r"--bind example\.com: not an IP address"):
        launch.resolve(TARGET, None, IMAGE, launch.Overrides(bind="example.com"))


def test_the_printed_readiness_check_is_this_recipe_s_own() -> None:
    """launch, deploy-files and compose tell the user to run a wait-ready that checks this
    profile with these params against this image, not an empty expectation."""
    recipe = launch.resolve(
        TARGET, "glm5-nvfp4-tp8-fusion", IMAGE,
        launch.Overrides(params=(("kv_cache_dtype", "bf16"),), container_name="glm5"),
    )  # fmt: skip
    command = recipe.to_json()["readiness"]["command"]
    assert command == (
        "builder wait-ready http://127.0.0.1:30000 --container glm5 "
        f"--profile glm5-nvfp4-tp8-fusion --image {IMAGE} --set kv_cache_dtype=bf16"
    )
    assert f"# Ready when: {command}" in deploy.compose_file(recipe)


def test_wait_ready_takes_set_like_launch(builder: Builder, tmp_path) -> None:
    """The stand-in server (no GPU here) runs on loopback and reports bf16 KV: with the
    profile's default (bfloat16 written out) that is a mismatch, exit 5; with `--set
    kv_cache_dtype=bf16`, as the server was launched, it is ready, exit 0."""
    import os
    import subprocess
    import sys

    from tests.services import free_port, wait_for

    info = {"moe_runner_backend": "flashinfer_cutlass", "attention_backend": "flashinfer",
            "quantization": "modelopt_fp4", "tp_size": 8, "kv_cache_dtype": "bf16"}  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tests/standin_sglang.py"), str(port)],
        env={**os.environ, "SERVER_INFO": json.dumps(info), "STARTUP_SECONDS": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        from tests.services import port_open

        wait_for(lambda: port_open(port), 10, "stand-in server")
        url = f"http://127.0.0.1:{port}"
        plain = builder.run("wait-ready", url, "--profile", "glm5-nvfp4-tp8", "--deadline", "0.5", "--poll", "0.2",
                            check=False)  # fmt: skip
        assert plain.returncode == 5, plain.stderr
        assert "kv_cache_dtype=bf16 (asked for bfloat16)" in plain.stderr + plain.stdout
        matched = builder.run("wait-ready", url, "--profile", "glm5-nvfp4-tp8", "--set",
                              "kv_cache_dtype=bf16", "--deadline", "0.5", "--poll", "0.2", check=False)  # fmt: skip
        assert matched.returncode == 0, matched.stderr
    finally:
        server.terminate()


def _systemd_service(unit_text: str) -> dict[str, str]:
    import configparser

    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(unit_text)
    return dict(unit["Service"])


def test_installed_unit_runs_compose_with_its_secrets_and_no_home(
    builder: Builder, tmp_path: Path
) -> None:
    """`deploy-files --install`, then the unit's ExecStart as systemd runs it: an empty
    environment but the EnvironmentFile, in WorkingDirectory. `docker` is a recorder here
    (compose itself is not installed on this machine); what it gets is what compose gets."""
    import os
    import subprocess

    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    root = tmp_path / "root"
    result = builder.run("deploy-files", "--install", "--root", str(root))
    service_dir = root / "etc/sglang/glm5-nvfp4-tp8"
    unit_path = root / "etc/systemd/system/sglang-glm5-nvfp4-tp8.service"
    env_file = service_dir / "sglang-glm5-nvfp4-tp8.env"
    for path in (service_dir / "compose.yaml", unit_path, env_file):
        assert f"wrote {path}" in result.stdout
    assert "then: systemctl daemon-reload && systemctl enable --now sglang-glm5-nvfp4-tp8" in (
        result.stdout
    )
    assert env_file.stat().st_mode & 0o777 == 0o600
    service = _systemd_service(unit_path.read_text())
    assert service["WorkingDirectory"] == "/etc/sglang/glm5-nvfp4-tp8"
    assert service["EnvironmentFile"] == "/etc/sglang/glm5-nvfp4-tp8/sglang-glm5-nvfp4-tp8.env"
    compose = (service_dir / "compose.yaml").read_text()
    assert "${HOME}" not in compose and "$HOME" not in compose, "a service has no HOME"
    assert '"/var/lib/sglang/huggingface:/root/.cache/huggingface:rw"' in compose

    # The operator fills in the secret; a rerun keeps it.
    env_file.write_text(env_file.read_text().replace("HF_TOKEN=\n", "HF_TOKEN=hf_test_secret\n"))
    again = builder.run("deploy-files", "--install", "--root", str(root))
    assert f"kept {env_file}" in again.stdout and "hf_test_secret" in env_file.read_text()

    recorder = tmp_path / "docker"
    recorder.write_text(
        '#!/bin/sh\necho "$@" > "$RECORD.args"\nenv > "$RECORD.env"\npwd > "$RECORD.cwd"\n'
    )
    recorder.chmod(0o755)
    environment = {
        key: value
        for key, _, value in (line.partition("=") for line in env_file.read_text().splitlines())
        if key and not key.startswith("#")
    }  # systemd's EnvironmentFile: KEY=VALUE lines, # comments
    record = tmp_path / "record"
    command = service["ExecStart"].replace("/usr/bin/docker", str(recorder), 1)
    working = root / service["WorkingDirectory"].lstrip("/")
    subprocess.run(
        ["/bin/sh", "-c", command], cwd=working, check=True,
        env={**environment, "RECORD": str(record)},
    )  # fmt: skip
    received = dict(
        line.partition("=")[::2] for line in (record.with_suffix(".env")).read_text().splitlines()
    )
    assert received["HF_TOKEN"] == "hf_test_secret"
    assert "HOME" not in received, "nothing in the unit relies on a login environment"
    assert (record.with_suffix(".args")).read_text().split()[:2] == ["compose", "up"]
    assert Path((record.with_suffix(".cwd")).read_text().strip()) == working
    assert os.path.exists(working / "compose.yaml")


def test_a_unit_written_anywhere_runs_from_the_folder_it_is_installed_in(
    builder: Builder, tmp_path: Path
) -> None:
    """#55: the unit's WorkingDirectory and EnvironmentFile were the --out folder it was
    written to (a build host's, a home folder), so the unit copied to the VM as told ran
    nothing. It names /etc/sglang/PROFILE/; the printed copy puts the files where
    --install does, byte for byte."""
    import subprocess

    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    out = tmp_path / "rendered here"  # a space: the printed copy quotes the paths
    result = builder.run("deploy-files", "--out", str(out))
    unit = out / "sglang-glm5-nvfp4-tp8.service"
    service = _systemd_service(unit.read_text())
    assert service["WorkingDirectory"] == "/etc/sglang/glm5-nvfp4-tp8"
    assert service["EnvironmentFile"] == "/etc/sglang/glm5-nvfp4-tp8/sglang-glm5-nvfp4-tp8.env"
    assert str(out) not in unit.read_text()
    (copy,) = [line for line in result.stdout.splitlines() if line.startswith("on the VM")]
    # The printed commands, run under a stand-in root (no systemctl here).
    copied = tmp_path / "copied"
    commands = copy.split(": ", 1)[1].split(" && systemctl")[0].replace(" /etc/", f" {copied}/etc/")
    (copied / "etc/systemd/system").mkdir(parents=True)
    subprocess.run(["/bin/sh", "-c", commands], check=True)
    installed = tmp_path / "installed"
    builder.run("deploy-files", "--install", "--root", str(installed))
    files = sorted(p.relative_to(installed) for p in installed.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(copied) for p in copied.rglob("*") if p.is_file())
    for path in files:
        assert (copied / path).read_bytes() == (installed / path).read_bytes(), path
        assert (copied / path).stat().st_mode == (installed / path).stat().st_mode, path
    # Copied again after an upgrade: the secret filled in on the VM stays.
    secrets = copied / "etc/sglang/glm5-nvfp4-tp8/sglang-glm5-nvfp4-tp8.env"
    secrets.write_text("HF_TOKEN=hf_kept\n")
    subprocess.run(["/bin/sh", "-c", commands], check=True)
    assert secrets.read_text() == "HF_TOKEN=hf_kept\n"


def test_deploy_files_refuses_an_image_the_vm_cannot_pull_by_digest(
    builder: Builder, tmp_path: Path
) -> None:
    """An unpushed manifest's image is a local tag: `launch` on the build host warns and
    prints it; deploy-files, whose files are for the VM, writes nothing."""
    manifest = _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=False)
    out = tmp_path / "deploy"
    result = builder.run("deploy-files", "--out", str(out), check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {manifest}: image sglang-sm120:test was not pushed (a local tag, which can "
        "move and which the VM cannot pull): push it (`builder publish`, or `builder image "
        "--push REGISTRY/REPO`), or give --image REPO@sha256:DIGEST"
    )
    assert not out.exists()


def _install(builder: Builder, root: Path, *args: str):
    return builder.run("deploy-files", "--install", "--root", str(root), *args, check=False)


def test_a_second_profile_is_not_installed_on_a_port_or_name_another_unit_uses(
    builder: Builder, tmp_path: Path
) -> None:
    """#55: two profiles installed on one port, without a word: whichever started second
    failed. Both glm5 profiles publish 30000 as container sglang-glm5."""
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    root = tmp_path / "root"
    units = root / "etc/systemd/system"
    assert _install(builder, root).returncode == 0
    first = units / "sglang-glm5-nvfp4-tp8.service"
    remove = f"systemctl disable --now sglang-glm5-nvfp4-tp8 && rm {first}"

    def refused(*args: str) -> str:
        result = _install(builder, root, "--profile", "glm5-nvfp4-tp8-fusion", *args)
        assert result.returncode == 1, result.stdout
        assert not (units / "sglang-glm5-nvfp4-tp8-fusion.service").exists()
        assert not (root / "etc/sglang/glm5-nvfp4-tp8-fusion").exists()
        return result.stderr.strip().splitlines()[-1]

    assert refused() == (
        f"error: --install: port 30000 is already used by sglang-glm5-nvfp4-tp8.service, "
        f"installed for another profile ({first}); give another --port, or remove that unit "
        f"first ({remove})"
    )
    assert refused("--port", "30001") == (
        f"error: --install: container name sglang-glm5 is already used by "
        f"sglang-glm5-nvfp4-tp8.service, installed for another profile ({first}); give "
        f"another --name, or remove that unit first ({remove})"
    )
    beside = _install(builder, root, "--profile", "glm5-nvfp4-tp8-fusion", "--port", "30001",
                      "--name", "sglang-glm5-fusion")  # fmt: skip
    assert beside.returncode == 0, beside.stderr
    # The same profile again replaces its own unit, on any port.
    again = _install(builder, root, "--port", "30002")
    assert again.returncode == 0, again.stderr
    assert (
        '"127.0.0.1:30002:30002"' in (root / "etc/sglang/glm5-nvfp4-tp8/compose.yaml").read_text()
    )
    # A unit builder did not write is not read, whatever its folder holds.
    (units / "sglang-other.service").write_text(
        "[Service]\nWorkingDirectory=/etc/sglang/glm5-nvfp4-tp8\n"
    )
    assert _install(builder, root, "--port", "30002").returncode == 0


def test_the_container_carries_the_profile_it_was_launched_with() -> None:
    """wait-ready and qualify read these labels back when given only --container."""
    plain = launch.resolve(TARGET, None, IMAGE, launch.Overrides())
    run = plain.docker_run()
    assert run[run.index("--label") + 1] == f"{launch.PROFILE_LABEL}=glm5-nvfp4-tp8"
    assert launch.PARAMS_LABEL not in " ".join(run)
    with_set = launch.resolve(
        TARGET, None, IMAGE, launch.Overrides(params=(("kv_cache_dtype", "bf16"),))
    )
    labels = {
        part.split("=", 1)[0]: part.split("=", 1)[1]
        for i, part in enumerate(with_set.docker_run())
        if i and with_set.docker_run()[i - 1] == "--label"
    }
    assert json.loads(labels[launch.PARAMS_LABEL]) == [["kv_cache_dtype", "bf16"]]
    compose = deploy.compose_file(with_set)
    assert f'      {launch.PROFILE_LABEL}: "glm5-nvfp4-tp8"' in compose
    assert launch.PARAMS_LABEL in compose


CURRENT = REPO_ROOT / "images/sm120/target.toml"


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        (TARGET, ("--tp=4",), "--extra-arg --tp=4: profile 'glm5-nvfp4-tp8' already passes "
         "--tp 8; use another profile"),
        (CURRENT, ("--tp-size", "4"), "already passes --tp-size 8"),
        (TARGET, ("--kv-cache-dtype", "fp16"), "already passes --kv-cache-dtype bfloat16; "
         "use --set kv_cache_dtype=VALUE"),
    ],
)  # fmt: skip
def test_an_extra_arg_that_restates_a_profile_flag_is_refused(target, extra, message) -> None:
    with pytest.raises(BuilderError) as refused:
        launch.resolve(target, None, IMAGE, launch.Overrides(extra_args=extra))
    assert message in str(refused.value)
    added = launch.resolve(target, None, IMAGE, launch.Overrides(extra_args=("--log-level=debug",)))
    assert added.args[-1] == "--log-level=debug", "a flag the profile lacks is simply added"


def test_an_extra_arg_that_may_abbreviate_a_profile_flag_is_a_warning(capsys) -> None:
    """`--tp` is short for the profile's `--tp-size` to argparse, but `--cuda-graph-max-bs`
    is an sglang option of its own beside `--cuda-graph-max-bs-decode`: not refused."""
    recipe = launch.resolve(
        CURRENT, None, IMAGE, launch.Overrides(extra_args=("--cuda-graph-max-bs=128",))
    )
    assert recipe.args[-1] == "--cuda-graph-max-bs=128"
    assert "if sglang reads --cuda-graph-max-bs as short for --cuda-graph-max-bs-decode" in (
        capsys.readouterr().err
    )


def test_what_a_container_was_launched_with_reads_back_from_its_labels() -> None:
    recipe = launch.resolve(
        TARGET, "glm5-nvfp4-tp8-fusion", IMAGE,
        launch.Overrides(params=(("kv_cache_dtype", "bf16"), ("port", "8000"))),
    )  # fmt: skip
    profile, params = launch.launched_with(recipe.labels, (("port", "9000"),))
    assert profile == "glm5-nvfp4-tp8-fusion"
    assert dict(params) == {"kv_cache_dtype": "bf16", "port": "9000"}, "--set wins"
    assert launch.launched_with({}, ()) == (None, ())


# -- the fallback a profile declares for a stalled start (qualify --sweep tries it once) --


def test_every_glm5_family_profile_falls_back_to_breakable_decode_graphs() -> None:
    """The default decode capture is `full`; the declared fallback, inherited through
    `extends`, sets the one param to `breakable`, and the recipe it makes asks for it."""
    known = launch_profiles.Profiles.of(CURRENT)
    assert len(known.profiles) == 7
    for name in known.profiles:
        assert launch_profiles.fallback_params(known, name) == (
            ("cuda_graph_backend_decode", "breakable"),
        )
        assert "full decode CUDA-graph capture hung" in launch_profiles.fallback_why(known, name)
        plain = launch.resolve(known, name, IMAGE, launch.Overrides())
        assert _flag(plain.args, "--cuda-graph-backend-decode") == "full"
        fallback = launch.resolve(
            known,
            name,
            IMAGE,
            launch.Overrides(params=launch_profiles.fallback_params(known, name)),
        )
        assert _flag(fallback.args, "--cuda-graph-backend-decode") == "breakable"
        assert fallback.expect["cuda_graph_backend_decode"] == "breakable"
        with pytest.raises(BuilderError, match="removed tc_piecewise"):  # sglang would exit
            launch.resolve(known, name, IMAGE, launch.Overrides(
                params=(("cuda_graph_backend_decode", "tc_piecewise"),)))  # fmt: skip
    old = launch_profiles.Profiles.of(TARGET)  # the 0.5.9 stack declares none
    assert launch_profiles.fallback_params(old, "glm5-nvfp4-tp8") == ()
    assert launch_profiles.fallback_why(old, "glm5-nvfp4-tp8") == ""


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('why = "w"\ncuda_graph_backend = "breakable"',
         "fallback: 'cuda_graph_backend' is not a param of the profile (params: "),
        ('cuda_graph_backend_decode = "breakable"',
         "fallback: 'why' must say when the fallback applies"),
        ('why = "w"\ncuda_graph_backend_decode = "full"',
         "fallback: 'cuda_graph_backend_decode' = 'full' is already the param's default"),
        ('why = "w"', "fallback: a 'why' without any param to set"),
        ('why = "w"\ncuda_graph_backend_decode = true',
         "fallback: 'cuda_graph_backend_decode' must be a string or a number"),
    ],
)  # fmt: skip
def test_a_bad_fallback_table_is_refused_when_the_profiles_load(
    tmp_path: Path, table: str, message: str
) -> None:
    target = tmp_path / "images/sm120/target.toml"
    shutil.copytree(REPO_ROOT / "images/sm120", target.parent)
    profiles = target.parent / "profiles.toml"
    text = profiles.read_text()
    start = text.index("[profiles.glm5-nvfp4-tp8.fallback]")
    end = text.index("[profiles.glm5-nvfp4-tp8-pcie-ar]")
    profiles.write_text(
        text[:start] + f"[profiles.glm5-nvfp4-tp8.fallback]\n{table}\n\n" + text[end:]
    )
    with pytest.raises(BuilderError) as refused:
        launch_profiles.Profiles.of(target)
    assert str(refused.value).startswith(f"{profiles}: profile 'glm5-nvfp4-tp8' {message}")
    # An image's recipe is not loaded from a file: the table is checked where it is used.
    from_image = launch_profiles.Profiles(tomllib.loads(profiles.read_text())["profiles"],
                                 "glm5-nvfp4-tp8", "image:recipe")  # fmt: skip
    with pytest.raises(
        BuilderError, match="image:recipe: profile 'glm5-nvfp4-tp8-pcie-ar' fallback"
    ):
        launch_profiles.fallback_params(from_image, "glm5-nvfp4-tp8-pcie-ar")


def test_refusals_and_sglang_s_choices_add_up_through_extends() -> None:
    """The MTP profile adds its own refusals and sglang-chosen keys; its parent's stay."""
    known = launch_profiles.Profiles.of(CURRENT)
    mtp = launch_profiles.flattened(known, "glm52-nvfp4-tp8-mtp")
    assert {rule["flag"] for rule in mtp["refuse"]} == {
        "--kv-cache-dtype", "--attention-backend", "--cuda-graph-backend-decode",
        "--speculative-eagle-topk",
    }  # fmt: skip
    assert set(mtp["chosen_by_sglang"]) == {"attention_backend", "dsa_prefill_backend",
        "dsa_decode_backend", "sampling_backend", "speculative_moe_runner_backend"}  # fmt: skip
    with pytest.raises(BuilderError, match="dense FlashInfer MLA"):
        launch.resolve(known, "glm52-nvfp4-tp8-mtp", IMAGE,
                       launch.Overrides(extra_args=("--attention-backend", "flashinfer")))  # fmt: skip


@pytest.mark.parametrize(
    "given",
    [
        ["--set", "mem_fraction_static=0.85\n    privileged: true"],
        ["--extra-arg=--log-level\ndebug"],
        ["--model", "/data/GLM\r\n# x"],
    ],
)
def test_a_line_break_from_the_command_line_never_reaches_generated_files(
    builder: Builder, tmp_path, given: list[str]
) -> None:
    """A --set value with a line break added lines to compose.yaml (its "Ready when" comment
    carries the values as given)."""
    out = tmp_path / "deploy"
    result = builder.run(
        "deploy-files", "--target", "sm120", *given, "--out", str(out), check=False
    )
    assert result.returncode == 1
    assert "a line break or another control character is not allowed" in result.stderr
    assert not out.exists() or not any(out.iterdir())


def _recipe_profiles(volumes: list[dict]) -> launch_profiles.Profiles:
    """Profiles as an image's recipe carries them (written by whoever pushed the image)."""
    profile = {
        "args": ["--model-path", "{model}", "--port", "{port}"],
        "params": {"model": "org/model", "port": "30000", "cache": "/var/lib/sglang/c"},
        "volumes": volumes,
    }
    return launch_profiles.Profiles({"p": profile}, "p", "registry.example/x@sha256:0:recipe")


@pytest.mark.parametrize(
    "host",
    ["/var/run/docker.sock", "/", "/etc", "/var/lib/sglang/../../etc", "/var/lib/sglangx", "rel"],
)
def test_a_recipe_does_not_choose_what_it_mounts_read_write(host: str) -> None:
    with pytest.raises(BuilderError, match=r"volume .* refused: a profile mounts read-write only"):
        launch.resolve(
            _recipe_profiles([{"host": host, "container": "/x"}]), "p", IMAGE, launch.Overrides()
        )


def test_profile_volumes_under_the_state_folder_or_the_operator_s_own_are_mounted() -> None:
    profiles = _recipe_profiles([{"host": "{cache}", "container": "/root/.cache/sglang"}])
    recipe = launch.resolve(profiles, "p", IMAGE, launch.Overrides())
    assert ("/var/lib/sglang/c", "/root/.cache/sglang", "rw") in recipe.volumes
    chosen = launch.Overrides(params=(("cache", "/srv/sglang-cache"),))
    recipe = launch.resolve(profiles, "p", IMAGE, chosen)
    assert ("/srv/sglang-cache", "/root/.cache/sglang", "rw") in recipe.volumes
    profile = profiles.profiles["p"]
    root = launch_profiles.Profiles(
        {"p": {**profile, "params": {**profile["params"], "cache": "/"}}}, "p", "recipe"
    )
    with pytest.raises(BuilderError, match=r"'/' refused: .* \(or --set cache=DIR\)"):
        launch.resolve(root, "p", IMAGE, launch.Overrides())


def test_a_vllm_profile_mounts_under_vllm_s_state_folder_not_sglang_s() -> None:
    """Each engine's profiles mount read-write under its own folder: a vLLM image's recipe
    cannot reach sglang's caches, and its Hugging Face cache defaults to its own."""
    profiles = _recipe_profiles([{"host": "{cache}", "container": "/root/.cache/vllm"}])
    vllm = dataclasses.replace(profiles, engine="vllm")
    with pytest.raises(
        BuilderError, match=r"'/var/lib/sglang/c' refused: .* only under /var/lib/vllm/ \(or"
    ):
        launch.resolve(vllm, "p", IMAGE, launch.Overrides())
    in_its_folder = launch.Overrides(params=(("cache", "/var/lib/vllm/c"),))
    own = launch.resolve(vllm, "p", IMAGE, in_its_folder)
    assert own.outside_state_root == ()
    assert ("/var/lib/vllm/c", "/root/.cache/vllm", "rw") in own.volumes
    assert ("/var/lib/vllm/huggingface", "/root/.cache/huggingface", "rw") in own.volumes
    # One download for a sweep across both engines: the operator's own flag says so.
    shared_hub_cache = dataclasses.replace(in_its_folder, hf_cache="/var/lib/sglang/huggingface")
    shared = launch.resolve(vllm, "p", IMAGE, shared_hub_cache)
    assert shared.outside_state_root == (("--hf-cache", "/var/lib/sglang/huggingface"),)


def test_hf_cache_help_names_each_engine_s_default() -> None:
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", "launch", "--help"],
        capture_output=True, text=True, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    help_text = " ".join(shown.split())
    for engine in ("sglang", "vllm"):
        assert launch.hf_cache_default(engine) in help_text, engine


def test_sm120_vllm_s_profiles_mount_only_under_var_lib_vllm() -> None:
    profiles = launch_profiles.Profiles.of(REPO_ROOT / "images/sm120-vllm/target.toml")
    assert profiles.engine == "vllm"
    for name in profiles.profiles:
        recipe = launch.resolve(profiles, name, IMAGE, launch.Overrides())
        written = [host for host, _, mode in recipe.volumes if mode == "rw"]
        assert written and all(host.startswith("/var/lib/vllm/") for host in written), written


def test_a_recipe_s_default_model_cannot_mount_a_host_folder() -> None:
    """A recipe whose default model is `/root/.ssh` mounted it read-only into the server."""
    profile = {"args": ["--model-path", "{model}"], "params": {"model": "/root/.ssh"}}
    recipe_profiles = launch_profiles.Profiles({"p": profile}, "p", "registry.example/x:recipe")
    with pytest.raises(BuilderError, match="a profile does not choose to mount; give --model"):
        launch.resolve(recipe_profiles, "p", IMAGE, launch.Overrides())
    chosen = launch.resolve(recipe_profiles, "p", IMAGE, launch.Overrides(model="/data/GLM-5"))
    assert ("/data/GLM-5", "/models/GLM-5", "ro") in chosen.volumes


def _run_in(builder: Builder, cwd: Path, *args: str):
    """`builder ...` run from `cwd` (relative paths are the operator's, not the checkout's)."""
    import os
    import subprocess

    env = {**os.environ, "COLUMNS": "200", "BUILDER_CONFIG": "/nonexistent"}
    return subprocess.run(builder.command(*args), capture_output=True, text=True, cwd=cwd, env=env)


def test_a_relative_model_and_hf_cache_are_made_absolute_before_anything_renders(
    builder: Builder, tmp_path: Path
) -> None:
    """#55: `--model ./GLM-5-NVFP4-MTP` printed `-v GLM-5-NVFP4-MTP:/models/...`, a Docker
    named volume, in the docker run and in compose.yaml; `--hf-cache relative/hf` too."""
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    (tmp_path / "GLM-5-NVFP4").mkdir()
    printed = _run_in(builder, tmp_path, "launch", "--model", "./GLM-5-NVFP4", "--json")
    assert printed.returncode == 0, printed.stderr
    recipe = json.loads(printed.stdout)
    mount = f"{tmp_path}/GLM-5-NVFP4:/models/GLM-5-NVFP4:ro"
    assert recipe["model"] == str(tmp_path / "GLM-5-NVFP4")
    assert recipe["docker_run"][recipe["docker_run"].index(mount) - 1] == "-v"
    hub = _run_in(builder, tmp_path, "deploy-files", "--hf-cache", "relative/hf", "--out", "d")
    assert hub.returncode == 0, hub.stderr
    compose = (tmp_path / "d" / "compose.yaml").read_text()
    assert f'"{tmp_path}/relative/hf:/root/.cache/huggingface:rw"' in compose
    assert (
        f"--hf-cache: mounts {tmp_path}/relative/hf read-write, outside /var/lib/sglang/ "
        "(your own flag on this command line)"
    ) in hub.stderr


@pytest.mark.parametrize("given", ["./absent", "/data/absent-GLM-5", "~/absent-GLM-5", "file"])
def test_a_local_model_that_is_not_a_folder_here_is_an_error_for_every_profile(
    builder: Builder, tmp_path: Path, given: str
) -> None:
    """It was a warning for an MTP profile, and nothing at all for the others."""
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    (tmp_path / "file").write_text("not a checkpoint")
    result = _run_in(builder, tmp_path, "launch", "--model", given)
    assert result.returncode == 1, result.stderr
    folder = {"./absent": tmp_path / "absent", "file": tmp_path / "file",
              "~/absent-GLM-5": Path.home() / "absent-GLM-5"}.get(given, given)  # fmt: skip
    why = "not a folder" if given == "file" else "no such folder on this machine"
    assert result.stderr.strip().splitlines() == [f"error: --model {given}: {why} ({folder})"]
    assert not result.stdout


def test_a_hub_id_is_told_from_a_path_by_one_rule(tmp_path: Path, monkeypatch) -> None:
    """A folder: starts with /, ./, ../ or ~, or exists here (as sglang decides); anything
    else is a hub id, NAME or ORG/NAME, or refused."""
    monkeypatch.chdir(tmp_path)
    assert launch.model_dir("festr2/GLM-5-NVFP4-MTP") is None
    assert launch.model_dir("gpt2") is None
    assert launch.model_dir("./festr2/GLM-5-NVFP4-MTP") == f"{tmp_path}/festr2/GLM-5-NVFP4-MTP"
    assert launch.model_dir("../up") == f"{tmp_path.parent}/up"
    (tmp_path / "festr2" / "GLM-5-NVFP4-MTP").mkdir(parents=True)
    assert launch.model_dir("festr2/GLM-5-NVFP4-MTP") == f"{tmp_path}/festr2/GLM-5-NVFP4-MTP"
    for neither in ("data/models/GLM-5", "org/../name", "org--x/name", "-x", "a b"):
        with pytest.raises(BuilderError, match=rf"--model {re.escape(neither)}: not a folder on "
                           "this machine, nor a Hugging Face hub id"):  # fmt: skip
            launch.model_dir(neither)


def test_an_operator_volume_folder_must_be_absolute() -> None:
    """A relative `--set` for a volume's folder became a Docker named volume."""
    profiles = _recipe_profiles([{"host": "{cache}", "container": "/root/.cache/sglang"}])
    with pytest.raises(BuilderError, match=r"--set cache=cache: a folder to mount must be an "
                       r"absolute path \(Docker takes a relative one for a named volume\)"):  # fmt: skip
        launch.resolve(profiles, "p", IMAGE, launch.Overrides(params=(("cache", "cache"),)))
    with pytest.raises(
        BuilderError, match="--set cache=/: the host's root folder is never mounted"
    ):
        launch.resolve(profiles, "p", IMAGE, launch.Overrides(params=(("cache", "/"),)))
    mine = launch.resolve(profiles, "p", IMAGE, launch.Overrides(params=(("cache", "/srv/c/"),)))
    assert ("/srv/c", "/root/.cache/sglang", "rw") in mine.volumes
    assert mine.outside_state_root == (("--set cache=/srv/c/", "/srv/c"),)


# -- params: one profile's own --set, and what a profile derives ------------------------------


def test_a_set_for_one_profile_applies_to_it_alone_and_wins() -> None:
    """`--set PROFILE:KEY=VALUE` (a sweep's, one profile's): over a plain `--set KEY=VALUE`
    whatever the order, recorded as KEY=VALUE; one for another profile is refused."""
    given = (("glm5-nvfp4-tp8:mem_fraction_static", "0.8"), ("mem_fraction_static", "0.9"))
    recipe = launch.resolve(CURRENT, "glm5-nvfp4-tp8", IMAGE, launch.Overrides(params=given))
    assert _flag(recipe.args, "--mem-fraction-static") == "0.8"
    assert recipe.params == (("mem_fraction_static", "0.8"),)
    with pytest.raises(BuilderError) as refused:
        launch.resolve(CURRENT, "glm5-nvfp4-tp8-mtp", IMAGE, launch.Overrides(params=given))
    assert str(refused.value) == (
        "--set glm5-nvfp4-tp8:mem_fraction_static=0.8: for profile glm5-nvfp4-tp8, but this "
        "is profile glm5-nvfp4-tp8-mtp"
    )


@pytest.mark.parametrize("profile", ["glm5-nvfp4-tp8-mtp", "glm52-nvfp4-tp8-mtp"])
def test_draft_tokens_follow_the_steps_the_operator_sets(profile: str) -> None:
    """#55: `--set speculative_num_steps=2` alone was refused (draft tokens stayed 4),
    though with topk 1 sglang keeps only steps + 1: the profile derives it and says so."""
    steps = (("speculative_num_steps", "2"),)
    recipe = launch.resolve(CURRENT, profile, IMAGE, launch.Overrides(params=steps))
    assert _flag(recipe.args, "--speculative-num-steps") == "2"
    assert _flag(recipe.args, "--speculative-num-draft-tokens") == "3"
    assert recipe.expect["speculative_num_draft_tokens"] == "3"
    assert recipe.params == steps, "what the operator said, derived again on every replay"
    assert recipe.derived == (
        "speculative_num_draft_tokens=3: derived from speculative_num_steps=2 (profile "
        f"'{profile}': speculative_num_draft_tokens = speculative_num_steps + 1)",
    )
    assert not launch.resolve(CURRENT, profile, IMAGE, launch.Overrides()).derived
    # Both given: the operator's pair, checked as given.
    both = (*steps, ("speculative_num_draft_tokens", "4"))
    with pytest.raises(BuilderError, match=r"makes it steps \+ 1 = 3"):
        launch.resolve(CURRENT, profile, IMAGE, launch.Overrides(params=both))
    with pytest.raises(BuilderError) as refused:
        launch.resolve(
            CURRENT, profile, IMAGE, launch.Overrides(params=(("speculative_num_steps", "two"),))
        )
    assert str(refused.value) == (
        f"--set speculative_num_steps=two: not a whole number, and profile '{profile}' derives "
        "speculative_num_draft_tokens from it (speculative_num_steps + 1)"
    )


def test_launch_says_in_one_line_what_it_derived(builder: Builder) -> None:
    _manifest(builder.data_dir / "manifests/sm120/", pushed=True)
    result = builder.run("launch", "--target", "sm120", "--profile", "glm5-nvfp4-tp8-mtp",
                         "--set", "speculative_num_steps=5", "--json")  # fmt: skip
    assert json.loads(result.stdout)["args"][-1] == "6"
    said = [line for line in result.stderr.splitlines() if "derived from" in line]
    assert said == [
        "speculative_num_draft_tokens=6: derived from speculative_num_steps=5 (profile "
        "'glm5-nvfp4-tp8-mtp': speculative_num_draft_tokens = speculative_num_steps + 1)"
    ]


@pytest.mark.parametrize(
    ("derived", "message"),
    [
        ({"b": "a * 2"}, '\'b\' must be "PARAM + N" or "PARAM - N" (N a whole number)'),
        ({"b": "__import__('os')"}, "'b' must be \"PARAM + N\""),
        ({"b": "c + 1"}, "'c' is not a param of the profile (params: a, b)"),
        ({"c": "a + 1"}, "'c' is not a param of the profile (params: a, b)"),
        ({"b": "b + 1"}, "'b' is derived from itself"),
        ({"b": [3]}, "field 'derived' must be a table of plain values"),
    ],
)
def test_a_derived_rule_is_a_param_plus_a_number_or_refused(
    tmp_path: Path, derived: dict, message: str
) -> None:
    """The rule is matched, never evaluated: anything but `PARAM + N` is refused as the
    profiles load (an image's recipe included)."""
    profile = {"args": ["--a", "{a}", "--b", "{b}"], "params": {"a": "1", "b": "2"},
               "derived": derived}  # fmt: skip
    known = launch_profiles.Profiles({"p": profile}, "p", "recipe.json")
    with pytest.raises(BuilderError) as refused:
        launch.resolve(known, "p", IMAGE, launch.Overrides(params=(("a", "4"),)))
    assert message in str(refused.value)


def test_an_sglang_and_a_vllm_profile_of_one_name_install_side_by_side(
    builder: Builder, tmp_path: Path
) -> None:
    """#57: both targets have a glm5-nvfp4-tp8; each engine's files have their own names
    (/etc/<engine>/<profile>, <engine>-<profile>.service), and a port one holds is refused
    to the other."""
    _manifest(builder.data_dir / "manifests/sm120-0.5.9", pushed=True)
    _manifest(builder.data_dir / "manifests/sm120-vllm", pushed=True)
    root = tmp_path / "root"
    units = root / "etc/systemd/system"
    assert _install(builder, root).returncode == 0
    clash = _install(builder, root, "--target", "sm120-vllm", "--port", "30000")
    assert clash.returncode == 1
    assert "port 30000 is already used by sglang-glm5-nvfp4-tp8.service" in clash.stderr
    assert not (units / "vllm-glm5-nvfp4-tp8.service").exists()
    result = _install(builder, root, "--target", "sm120-vllm")
    assert result.returncode == 0, result.stderr
    unit = (units / "vllm-glm5-nvfp4-tp8.service").read_text()
    assert "WorkingDirectory=/etc/vllm/glm5-nvfp4-tp8" in unit
    assert "--exit-code-from vllm" in unit and "Description=vllm glm5-nvfp4-tp8" in unit
    compose = (root / "etc/vllm/glm5-nvfp4-tp8/compose.yaml").read_text()
    assert "\n  vllm:\n" in compose and '"127.0.0.1:8000:8000"' in compose
    assert '- "FLASHINFER_MLA_SPARSE_SM120"' in compose  # vllm serve's args, as rendered
    assert (root / "etc/vllm/glm5-nvfp4-tp8/vllm-glm5-nvfp4-tp8.env").stat().st_mode & 0o077 == 0
    assert (units / "sglang-glm5-nvfp4-tp8.service").exists()  # the sglang unit stays
