"""The GPU VM's deploy path fed what someone else wrote (security review #54, operator review
#55): a sweep's folder is files, and whoever can write there can forge chosen.json and the
receipt it cites together; an image's recipe (its profiles, their fallback) is whoever
pushed it. Each forgery below is refused in one line naming it, exit 1, nothing written;
the sweep's own folder deploys exactly the server its receipt ran, argument by argument.

No Docker engine here: the image is a manifest and config pushed to a real registry on
127.0.0.1 (its launch label carries the profiles), read daemon-less as on a VM. The sweep's
receipt records what Docker records of the container the sweep started with the recipe's
own `docker run` (its `-v` sources, the words after the image, the image's entrypoint); the
engine's own run of a sweep, its receipt and deploy-files is tests/site/test_sweep.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.cli.main import build_parser
from builder.site import gates, sweep
from builder.site.commands import qualify_sweep
from builder.site.commands.launch_options import recipe_from_args
from builder.site.commands.qualify_run import redacted
from builder.site.receipt_views import RECEIPT_SCHEMA
from tests.core.test_registry_api import CREDS, _push_image

ENTRYPOINT = ["python", "/opt/builder/entrypoint.py"]  # the sm120 image's
STATE_CACHE = "/var/lib/sglang/cache-deploy-test"
COMMIT = "8a1f4a13204acf2b7ac840375efaed64c231c522"
PROFILE = {
    "container_name": "deploy-test",
    "args": ["--model-path", "{model}", "--revision", "{model_revision}", "--port", "{port}",
             "--cuda-graph-backend-decode", "{backend}", "--mem-fraction-static", "{mem}"],
    "params": {"model": "org/model", "model_revision": "main", "port": "30000",
               "backend": "full", "mem": "0.85", "sglang_cache": STATE_CACHE},
    "volumes": [{"host": "{sglang_cache}", "container": "/root/.cache/sglang"}],
    "fallback": {"backend": "breakable", "why": "the full decode graph hung at capture"},
}  # fmt: skip
TARGET = {"name": "sm120", "description": "d", "cuda_version": "13.0.1", "arch_list": ["12.0f"]}


def _facts(profile: dict) -> str:
    return json.dumps({"schema_version": 1, "target": TARGET,
                       "profiles": {"default": "p", "profiles": {"p": profile}}})  # fmt: skip


@pytest.fixture
def vm(registry, monkeypatch):
    """This process and the builder it runs as a daemon-less VM that reads the registry."""
    for key, value in {**CREDS, "DOCKER_HOST": "unix:///nonexistent/docker.sock",
                       "BUILDER_CONFIG": "/nonexistent", "COLUMNS": "200"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    return registry


@pytest.fixture
def image(vm) -> str:
    digest = _push_image(vm, "vm/deploy", "v1", {"io.builder.launch": _facts(PROFILE)})
    return f"{vm}/vm/deploy@{digest}"


def builder(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`builder ...` as the operator runs it on the VM, in `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "builder.cli.main", *args], capture_output=True, text=True, cwd=cwd
    )


def refused(result: subprocess.CompletedProcess) -> str:
    """The one error line of a run that exited 1."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix("error: ")


def sweep_folder(folder: Path, image: str, *launch_options: str) -> Path:
    """A one-profile sweep's folder as `qualify --sweep p --image IMAGE ...` leaves it: the
    recipe resolved by the sweep's own code, the receipt of the container Docker started
    from its `docker run`, and chosen.json from the real chooser."""
    args = build_parser().parse_args(
        ["qualify", "--sweep", "p", "--image", image, *launch_options, "--out", str(folder)]
    )
    recipe, _ = recipe_from_args(qualify_sweep._with_params(args, "p", ()))
    run = recipe.docker_run()
    command = run[run.index(recipe.image) + 1 :]  # Docker's Cmd: the words after the image
    binds = [run[at + 1] for at, word in enumerate(run) if word == "-v"]  # HostConfig.Binds
    receipt = {
        "schema": RECEIPT_SCHEMA,
        "server": {
            "profile": recipe.profile, "params": [list(pair) for pair in recipe.params],
            "image": {"reference": image, "id": "sha256:" + "1" * 64, "repo_digests": [image],
                      "built_by_builder": True},
            "command": redacted([*ENTRYPOINT, *command]), "entrypoint": ENTRYPOINT,
            "mounts": binds, "launch": recipe.served_from(),
        },
        "startup": {"state": "ready"},
        "gates": [gates.entry(name, "passed", "x") for name in gates.GATES],
        "throughput": {"levels": [{"concurrency": 32, "completed": 8, "output_throughput": 900.0}]},
        "not_checked": [],
        "result": {"ok": True, "failed_at": None, "message": "every check passed",
                   "verdict": "qualified"},
    }  # fmt: skip
    (folder / "p").mkdir(parents=True)
    (folder / "p" / "receipt.json").write_text(json.dumps(receipt))
    doc = sweep.choose([sweep.Swept("p", receipt, "p/receipt.json")], [32], choose_at=32)
    (folder / sweep.CHOSEN_FILE).write_text(json.dumps(doc))
    return folder


def forge(folder: Path, change) -> None:
    """Rewrite chosen.json and the receipt it cites together, as whoever can write there."""
    doc = json.loads((folder / sweep.CHOSEN_FILE).read_text())
    receipt = json.loads((folder / "p" / "receipt.json").read_text())
    change(doc["chosen"], receipt["server"], doc)
    (folder / sweep.CHOSEN_FILE).write_text(json.dumps(doc))
    (folder / "p" / "receipt.json").write_text(json.dumps(receipt))


def deploy(cwd: Path, folder: Path, *options: str) -> subprocess.CompletedProcess:
    return builder(cwd, "deploy-files", "--profile", "chosen", "--qualify-dir", str(folder),
                   "--out", str(cwd / "deploy"), *options)  # fmt: skip


def nothing_written(cwd: Path) -> bool:
    return not (cwd / "deploy").exists() or not any((cwd / "deploy").iterdir())


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / "GLM-5-NVFP4"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def swept(tmp_path: Path, image: str, model: Path, monkeypatch) -> Path:
    """The sweep ran in models/ with a relative --model, as README's operator may type it."""
    monkeypatch.chdir(model.parent)
    return sweep_folder(tmp_path / "qualify", image, "--model", "./GLM-5-NVFP4", "--port", "30123")


def test_the_sweep_s_folder_deploys_exactly_the_server_its_receipt_ran(
    swept: Path, tmp_path: Path, image: str, model: Path
) -> None:
    """#55: chosen.json recorded neither --model nor --port, and the compose file served
    the profile's hub model on the profile's port. From another folder, without a flag."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = deploy(elsewhere, swept)
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load((elsewhere / "deploy" / "compose.yaml").read_text())
    service = service["services"]["sglang"]
    server = json.loads((swept / "p" / "receipt.json").read_text())["server"]
    assert server["launch"]["model"] == str(model), "the sweep's --model ./DIR, made absolute"
    ran = server["command"][len(ENTRYPOINT) :]
    assert len(service["command"]) == len(ran)
    for at, (compose_arg, receipt_arg) in enumerate(zip(service["command"], ran, strict=True)):
        assert compose_arg == receipt_arg, f"argument {at}"
    assert sorted(service["volumes"]) == sorted(server["mounts"])
    assert f"{model}:/models/GLM-5-NVFP4:ro" in service["volumes"]
    assert service["image"] == image
    assert service["ports"] == ["127.0.0.1:30123:30123"]
    assert f"model {model}" in result.stderr
    assert "partial" not in result.stderr


@pytest.mark.parametrize(
    ("which", "mode", "owner", "said"),
    [
        ("chosen.json", 0o646, None, "writable by others"),
        ("p/receipt.json", 0o666, None, "writable by others"),
        (".", 0o777, None, "writable by others"),
        ("chosen.json", 0o664, (0, 65534), "writable by group 65534"),
        ("chosen.json", 0o644, (65534, 65534), "owned by uid 65534, not root or this user"),
    ],
    ids=["chosen-others", "receipt-others", "folder-others", "chosen-group", "chosen-owner"],
)
def test_a_sweep_folder_others_could_write_is_not_deployed(
    swept: Path, tmp_path: Path, which: str, mode: int, owner, said: str
) -> None:
    """Review of #54: chosen.json and its receipt name the model folder, the key file and
    the image a root unit runs; a writer other than root, this user or sudo's is not
    believed (a forged pair agrees with itself)."""
    path = (swept / which).resolve()
    os.chmod(path, mode)
    if owner:
        os.chown(path, *owner)
    result = deploy(tmp_path, swept)
    assert refused(result) == f"{path}: {said}: what it names is not deployed"
    assert nothing_written(tmp_path)


def test_a_sweep_folder_of_the_user_sudo_runs_for_is_deployed(
    swept: Path, tmp_path: Path, monkeypatch
) -> None:
    """`qualify` as the operator (uid 65534 here), then `sudo deploy-files --install`: the
    user-private group may write (umask 002), as Ubuntu's users' files are made."""
    for path in (swept, swept / "chosen.json", swept / "p", swept / "p" / "receipt.json"):
        os.chown(path, 65534, 65534)
        os.chmod(path, 0o775 if path.is_dir() else 0o664)
    monkeypatch.setenv("SUDO_UID", "65534")
    result = deploy(tmp_path, swept)
    assert result.returncode == 0, result.stderr


def test_chosen_json_cannot_mount_the_host_root_read_write(swept: Path, tmp_path: Path) -> None:
    """#54: a forged chosen.json (and receipt) gave `/:/root/.cache/sglang:rw` in
    compose.yaml: its params were taken as the operator's own --set."""

    def root_cache(chosen: dict, server: dict, _doc: dict) -> None:
        for params in (chosen["params"], server["params"]):
            params.append(["sglang_cache", "/"])
        server["mounts"] = [m.replace(f"{STATE_CACHE}:", "/:") for m in server["mounts"]]

    forge(swept, root_cache)
    result = deploy(tmp_path, swept)
    assert refused(result) == (
        f"{swept}/chosen.json: sglang_cache='/' would mount '/' read-write: outside "
        "/var/lib/sglang/ only your own --set sglang_cache=DIR on the command line may"
    )
    assert nothing_written(tmp_path)


def test_a_folder_outside_the_state_root_needs_the_operator_s_own_set(
    swept: Path, tmp_path: Path
) -> None:
    """A sweep run with `--set sglang_cache=/srv/...` is deployed only when the operator
    says the same on deploy-files' command line, which then says so in one line."""
    outside = "/srv/sglang-cache-test"

    def srv_cache(chosen: dict, server: dict, _doc: dict) -> None:
        for params in (chosen["params"], server["params"]):
            params.append(["sglang_cache", outside])
        server["mounts"] = [m.replace(f"{STATE_CACHE}:", f"{outside}:") for m in server["mounts"]]

    forge(swept, srv_cache)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: sglang_cache='{outside}' would mount '{outside}' read-write: "
        "outside /var/lib/sglang/ only your own --set sglang_cache=DIR on the command line may"
    )
    assert nothing_written(tmp_path)
    assert refused(deploy(tmp_path, swept, "--set", "sglang_cache=/srv/other")) == (
        f"--set sglang_cache=/srv/other: {swept}/chosen.json records sglang_cache={outside}, "
        "what the sweep's server ran; drop it, or re-run the sweep with it"
    )
    allowed = deploy(tmp_path, swept, "--set", f"sglang_cache={outside}")
    assert allowed.returncode == 0, allowed.stderr
    said = [line for line in allowed.stderr.splitlines() if "outside /var/lib/sglang/" in line]
    assert said == [
        f"--set sglang_cache={outside}: mounts {outside} read-write, outside /var/lib/sglang/ "
        "(your own flag on this command line)"
    ]
    service = yaml.safe_load((tmp_path / "deploy" / "compose.yaml").read_text())
    assert f"{outside}:/root/.cache/sglang:rw" in service["services"]["sglang"]["volumes"]


def test_an_image_s_fallback_cannot_mount_outside_the_state_root(vm, tmp_path: Path) -> None:
    """#54: a fallback's params became --set on the sweep's retry, free to leave
    /var/lib/sglang. The sweep resolves every fallback before anything starts."""
    hostile = {**PROFILE, "fallback": {"sglang_cache": "/", "why": "x"}}
    digest = _push_image(vm, "vm/hostile", "v1", {"io.builder.launch": _facts(hostile)})
    result = builder(tmp_path, "qualify", "--sweep", "p", "--image", f"{vm}/vm/hostile@{digest}",
                     "--gsm8k", "none", "--out", str(tmp_path / "q"))  # fmt: skip
    assert refused(result) == (
        "profile p's fallback: sglang_cache='/' would mount '/' read-write: outside "
        "/var/lib/sglang/ only your own --set sglang_cache=DIR on the command line may"
    )
    assert not (tmp_path / "q" / "p").exists()


def test_chosen_json_names_the_image_its_receipt_ran(vm, swept: Path, tmp_path: Path) -> None:
    """#54: chosen.json named the image; another one, with the same profiles, served."""
    twin = {**PROFILE, "description": "same profiles, other bytes"}
    other = f"{vm}/vm/other@" + _push_image(
        vm, "vm/other", "v1", {"io.builder.launch": _facts(twin)}
    )

    def another_image(chosen: dict, _server: dict, _doc: dict) -> None:
        chosen["image_ref"] = other
        chosen["image"] = {"reference": other, "id": "sha256:" + "e" * 64,
                           "repo_digests": [other]}  # fmt: skip

    image = json.loads((swept / "p" / "receipt.json").read_text())["server"]["image"]
    forge(swept, another_image)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: names image {other}, but the receipt it cites "
        f"({swept}/p/receipt.json) ran {', '.join(sorted([image['id'], *image['repo_digests']]))}"
    )
    assert nothing_written(tmp_path)


def test_a_receipt_whose_server_ran_another_command_is_not_deployed(
    swept: Path, tmp_path: Path
) -> None:
    def extra_flag(_chosen: dict, server: dict, _doc: dict) -> None:
        server["command"].append("--enable-something")

    forge(swept, extra_flag)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: cannot reproduce the server its receipt ran: argument "
        f"{len(json.loads((swept / 'p' / 'receipt.json').read_text())['server']['command']) - 1}"
        " would be none where it ran --enable-something"
    )
    assert nothing_written(tmp_path)


def test_a_receipt_that_mounted_another_folder_is_not_deployed(
    swept: Path, tmp_path: Path, model: Path
) -> None:
    def other_model(_chosen: dict, server: dict, _doc: dict) -> None:
        server["mounts"] = ["/data/other:/models/GLM-5-NVFP4:ro" if m.endswith(":ro") else m
                            for m in server["mounts"]]  # fmt: skip

    forge(swept, other_model)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: cannot reproduce the server its receipt ran: it would mount "
        f"{model}:/models/GLM-5-NVFP4:ro where it mounted /data/other:/models/GLM-5-NVFP4:ro"
    )
    assert nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("flag", "value", "recorded"),
    [
        ("--model", "../elsewhere", "{model}"),
        ("--port", "8000", "30123"),
        ("--hf-cache", "/var/lib/sglang/hf2", None),  # a folder model mounts no HF cache
        ("--extra-arg=--log-level=debug", None, "none"),
    ],
)
def test_an_operator_flag_that_contradicts_chosen_json_names_both(
    swept: Path, tmp_path: Path, model: Path, flag: str, value: str | None, recorded: str | None
) -> None:
    (tmp_path / "elsewhere").mkdir()
    cwd = model.parent  # where ../elsewhere is tmp_path/elsewhere
    result = deploy(cwd, swept, *([flag, value] if value else [flag]))
    if recorded is None:
        assert result.returncode == 0, result.stderr
        return
    given = {"--model": str(tmp_path / "elsewhere")}.get(flag, value or "--log-level=debug")
    shown = flag.split("=", 1)[0]
    assert refused(result) == (
        f"{shown} {given}: {swept}/chosen.json records {recorded.format(model=model)}, what "
        f"the sweep's server ran; drop {shown}, or re-run the sweep with it"
    )
    assert nothing_written(cwd)


def test_a_set_the_sweep_did_not_run_is_refused(swept: Path, tmp_path: Path) -> None:
    assert refused(deploy(tmp_path, swept, "--set", "mem=0.8")) == (
        f"--set mem=0.8: the sweep's server ran the profile's own mem ({swept}/chosen.json sets "
        "no such param); drop it, or re-run the sweep with it"
    )


def test_chosen_json_cannot_name_a_folder_as_the_profile_s_model(
    swept: Path, tmp_path: Path
) -> None:
    """A model param from chosen.json that is a folder would be mounted read-only."""

    def ssh_model(chosen: dict, server: dict, _doc: dict) -> None:
        for params in (chosen["params"], server["params"]):
            params.append(["model", "/root/.ssh"])
        for launched in (chosen["launch"], server["launch"]):
            launched["model"] = None

    forge(swept, ssh_model)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: param model='/root/.ssh' is a folder on this machine, which "
        "only your own --model mounts; give --model DIR"
    )


def test_a_line_break_in_chosen_json_never_reaches_compose(swept: Path, tmp_path: Path) -> None:
    def injected(chosen: dict, server: dict, _doc: dict) -> None:
        for params in (chosen["params"], server["params"]):
            params.append(["mem", "0.8\n    privileged: true"])

    forge(swept, injected)
    message = refused(deploy(tmp_path, swept))
    assert message.endswith("a line break or another control character is not allowed")
    assert message.startswith(f"{swept}/chosen.json 'mem=0.8\\n")
    assert nothing_written(tmp_path)


def test_a_receipt_outside_the_sweep_s_folder_is_refused(swept: Path, tmp_path: Path) -> None:
    def climbing(chosen: dict, _server: dict, _doc: dict) -> None:
        chosen["receipt"] = "../elsewhere/receipt.json"

    forge(swept, climbing)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: not a builder-qualify-chosen/2 file (chosen.receipt is not a "
        "receipt inside the sweep's folder)"
    )


def test_an_old_chosen_json_is_refused_with_what_to_do(swept: Path, tmp_path: Path) -> None:
    """builder-qualify-chosen/1 recorded no model, HF cache or port: it cannot be deployed
    exactly (qualify --compare still reads it)."""

    def old(chosen: dict, _server: dict, doc: dict) -> None:
        doc["schema"] = "builder-qualify-chosen/1"
        del chosen["launch"], chosen["partial"]

    forge(swept, old)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: written by an older builder (builder-qualify-chosen/1), which "
        "does not record the model, HF cache and port the sweep served; re-run "
        "`builder qualify --sweep` with this builder"
    )
    assert sweep.receipts_in(swept) == [swept / "p" / "receipt.json"]


def test_a_hub_model_at_a_branch_is_not_deployed(vm, image: str, tmp_path: Path) -> None:
    """What `main` points at moves: the sweep measured one checkpoint, a deploy would pull
    another. Pinned to a commit, it deploys with the hub cache under the state root."""
    moving = sweep_folder(tmp_path / "moving", image, "--model", "org/model")
    assert refused(deploy(tmp_path, moving)) == (
        f"{moving}/chosen.json: the sweep served org/model at revision main, a branch that "
        "moves, not a commit; re-run the sweep with --set model_revision=COMMIT (or --model DIR)"
    )
    pinned = sweep_folder(
        tmp_path / "pinned", image, "--model", "org/model", "--set", f"model_revision={COMMIT}"
    )
    result = deploy(tmp_path, pinned)
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load((tmp_path / "deploy" / "compose.yaml").read_text())
    service = service["services"]["sglang"]
    assert service["command"][:4] == ["--model-path", "org/model", "--revision", COMMIT]
    assert "/var/lib/sglang/huggingface:/root/.cache/huggingface:rw" in service["volumes"]


@pytest.mark.parametrize("root", ["/", "//", "/..", "/./"])
@pytest.mark.parametrize("flag", ["--model", "--hf-cache"])
def test_the_host_root_is_never_mounted(image: str, tmp_path: Path, flag: str, root: str) -> None:
    """#54: `--model /` mounted the host root as /models/ without a word."""
    result = builder(tmp_path, "launch", "--image", image, flag, root)
    assert refused(result) == f"{flag} {root}: the host's root folder is never mounted"
    assert not result.stdout


def test_an_hf_cache_outside_the_state_root_needs_the_operator_s_own_flag(
    image: str, tmp_path: Path
) -> None:
    """chosen.json records the sweep's --hf-cache; a read-write mount outside the state
    root is the operator's to say on this command line, as a param's is."""
    outside = "/srv/hf-deploy-test"
    swept = sweep_folder(tmp_path / "q", image, "--model", "org/model",
                         "--set", f"model_revision={COMMIT}", "--hf-cache", outside)  # fmt: skip
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: its HF cache {outside} is outside /var/lib/sglang/: it is "
        f"mounted read-write only when your own --hf-cache {outside} on this command line says so"
    )
    assert nothing_written(tmp_path)
    assert refused(deploy(tmp_path, swept, "--hf-cache", "/srv/other")) == (
        f"--hf-cache /srv/other: {swept}/chosen.json records {outside}, what the sweep's "
        "server ran; drop --hf-cache, or re-run the sweep with it"
    )
    allowed = deploy(tmp_path, swept, "--hf-cache", outside)
    assert allowed.returncode == 0, allowed.stderr
    assert (
        f"--hf-cache: mounts {outside} read-write, outside /var/lib/sglang/ (your own flag on "
        "this command line)"
    ) in allowed.stderr.splitlines()


def test_another_image_or_a_manifest_is_refused(swept: Path, tmp_path: Path, image: str) -> None:
    other = "registry.example/ml/sglang@sha256:" + "0" * 64
    assert refused(deploy(tmp_path, swept, "--image", other)) == (
        f"--image {other}: {swept}/chosen.json chose p on {image}; drop --image (it comes from "
        "there)"
    )
    assert refused(deploy(tmp_path, swept, "--manifest", "m.json")) == (
        "--manifest: with --profile chosen the image is the one the sweep ran"
    )
    assert deploy(tmp_path, swept, "--image", image).returncode == 0


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("params", [["backend", "breakable"]], '[["backend", "breakable"]]'),
        ("profile", "q", '"q"'),
        ("partial", True, "true"),
        ("engine", "vllm", '"vllm"'),  # another engine's state folder for its mounts
    ],
)
def test_chosen_json_says_what_its_receipt_records(
    swept: Path, tmp_path: Path, field: str, value, shown: str
) -> None:
    """chosen.json alone edited: it no longer describes the server its receipt ran."""
    receipt = json.loads((swept / "p" / "receipt.json").read_text())
    recorded = {
        "params": receipt["server"]["params"], "profile": "p", "partial": False,
        "engine": "sglang",
    }[field]  # fmt: skip

    def edited(chosen: dict, _server: dict, _doc: dict) -> None:
        chosen[field] = value

    forge(swept, edited)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: {field} {shown} is not what the receipt it cites "
        f"({swept}/p/receipt.json) records ({json.dumps(recorded)})"
    )


def test_chosen_json_names_an_engine_builder_knows(swept: Path, tmp_path: Path) -> None:
    def unknown(chosen: dict, _server: dict, _doc: dict) -> None:
        chosen["engine"] = "/var/lib"

    forge(swept, unknown)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: not a builder-qualify-chosen/2 file (chosen.engine is not one "
        "of sglang, vllm)"
    )


@pytest.mark.parametrize("named", ["GLM-5-NVFP4", "./GLM-5-NVFP4", "data/models/GLM-5"])
def test_chosen_json_names_its_model_by_absolute_path_or_hub_id(
    swept: Path, tmp_path: Path, named: str
) -> None:
    """A relative folder would be whatever sits there where deploy-files runs."""
    (tmp_path / "GLM-5-NVFP4").mkdir()

    def relative(chosen: dict, server: dict, _doc: dict) -> None:
        for launched in (chosen["launch"], server["launch"]):
            launched["model"] = named

    forge(swept, relative)
    assert refused(deploy(tmp_path, swept)) == (
        f"{swept}/chosen.json: not a builder-qualify-chosen/2 file (chosen.launch.model is "
        "neither a folder by its absolute path nor a hub id)"
    )


def test_the_sweep_s_api_key_file_is_deployed_and_another_is_refused(
    image: str, model: Path, tmp_path: Path
) -> None:
    key, other = tmp_path / "api-key", tmp_path / "other-key"
    for path in (key, other):
        path.write_text("s3cret\n")
        path.chmod(0o600)
    swept = sweep_folder(tmp_path / "q", image, "--model", str(model), "--api-key-file", str(key))
    assert refused(deploy(tmp_path, swept, "--api-key-file", str(other))) == (
        f"--api-key-file {other}: {swept}/chosen.json records {key}, what the sweep's server "
        "ran; drop --api-key-file, or re-run the sweep with it"
    )
    result = deploy(tmp_path, swept)
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load((tmp_path / "deploy" / "compose.yaml").read_text())
    service = service["services"]["sglang"]
    assert f"{key}:/run/secrets/sglang-api-key:ro" in service["volumes"]
    assert service["environment"]["SGLANG_API_KEY_FILE"] == "/run/secrets/sglang-api-key"
    assert "s3cret" not in (tmp_path / "deploy" / "compose.yaml").read_text()
    without = sweep_folder(tmp_path / "q2", image, "--model", str(model))
    assert refused(deploy(tmp_path, without, "--api-key-file", str(key))) == (
        f"--api-key-file {key}: {without}/chosen.json records none, what the sweep's server "
        "ran; drop --api-key-file, or re-run the sweep with it"
    )


def test_a_tag_is_deployed_by_the_digest_it_names_now(vm, tmp_path: Path) -> None:
    """#55: `deploy-files --image REPO:TAG` wrote the tag into compose.yaml and the unit:
    whoever pushes that tag next chose what the unit starts. The tag is resolved in the
    registry, its recipe read by that digest, and kept only in a comment."""
    digest = _push_image(vm, "vm/tagged", "v1", {"io.builder.launch": _facts(PROFILE)})
    tagged, pinned = f"{vm}/vm/tagged:v1", f"{vm}/vm/tagged@{digest}"
    out = tmp_path / "deploy"
    result = builder(tmp_path, "deploy-files", "--image", tagged, "--out", str(out))
    assert result.returncode == 0, result.stderr
    compose = (out / "compose.yaml").read_text()
    assert yaml.safe_load(compose)["services"]["sglang"]["image"] == pinned
    noted = f"# Image {tagged} when deployed, pinned to its digest (a tag can move)"
    assert noted in compose.splitlines()
    assert f"--image {pinned}" in compose, "the readiness check names the digest too"
    unit = (out / "sglang-p.service").read_text()
    assert noted in unit.splitlines() and f"Description=sglang p ({pinned})" in unit
    assert f"{tagged} " not in compose.replace(noted, "") + unit.replace(noted, "")
    # The tag moves: a new deploy pins what it names then.
    moved = _push_image(vm, "vm/tagged", "v1", {"io.builder.launch": _facts({**PROFILE,
                        "description": "pushed later"})})  # fmt: skip
    assert moved != digest
    again = builder(tmp_path, "deploy-files", "--image", tagged, "--out", str(tmp_path / "d2"))
    assert again.returncode == 0, again.stderr
    service = yaml.safe_load((tmp_path / "d2" / "compose.yaml").read_text())["services"]
    assert service["sglang"]["image"] == f"{vm}/vm/tagged@{moved}"


def test_a_tag_whose_digest_cannot_be_read_is_refused_with_how_to_pin_it(
    vm, tmp_path: Path
) -> None:
    absent = f"{vm}/vm/deploy:absent"
    assert refused(builder(tmp_path, "deploy-files", "--image", absent, "--out", "deploy")) == (
        f"--image {absent}: a tag, which can move, and its registry did not give its digest "
        f"({absent}: the registry answered 404); give --image {vm}/vm/deploy@sha256:DIGEST "
        "(where it was pulled: docker image inspect --format '{{index .RepoDigests 0}}' "
        f"{absent})"
    )
    assert nothing_written(tmp_path)


def test_one_profile_s_own_set_is_recorded_and_deployed(
    image: str, model: Path, tmp_path: Path
) -> None:
    """`--set PROFILE:KEY=VALUE` sets a param of one profile of a sweep (over a plain
    `--set`): its receipt and chosen.json record it as KEY=VALUE, and deploy-files
    reproduces that server; the operator may repeat it either way, not for another."""
    assert qualify_sweep.sets_for(["mem=0.8", "p:mem=0.7", "q:backend=x", "backend=full"], "p") == [
        "mem=0.8", "backend=full", "mem=0.7"
    ]  # fmt: skip
    swept = sweep_folder(tmp_path / "q", image, "--model", str(model),
                         "--set", "p:mem=0.7", "--set", "mem=0.8")  # fmt: skip
    receipt = json.loads((swept / "p" / "receipt.json").read_text())
    assert receipt["server"]["params"] == [["mem", "0.7"]]
    assert json.loads((swept / "chosen.json").read_text())["chosen"]["params"] == [["mem", "0.7"]]
    for given in ((), ("--set", "p:mem=0.7"), ("--set", "mem=0.7")):
        result = deploy(tmp_path, swept, *given)
        assert result.returncode == 0, result.stderr
        service = yaml.safe_load((tmp_path / "deploy" / "compose.yaml").read_text())
        command = service["services"]["sglang"]["command"]
        assert command[command.index("--mem-fraction-static") + 1] == "0.7"
    assert refused(deploy(tmp_path, swept, "--set", "q:mem=0.7")) == (
        f"--set q:mem=0.7: {swept}/chosen.json chose profile p, not q"
    )
