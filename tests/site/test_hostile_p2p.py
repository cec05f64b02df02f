"""Hostile P2P records, probe answers and other files a GPU VM's builder reads (security
review #54, operator review #55): each test gives one specific record, file or answer and
asserts the specific refusal.

No GPU exists here: as in tests/site/test_p2p.py, a fake `nvidia-smi` (a shell script printing a
recorded machine's GPU ids and topology) stands in for the GPUs. Everything else is real:
the CLI, the files, links and FIFOs, child processes, tar archives, the docker CLI; the test
of the NVIDIA runtime check uses the tests' Docker engine (marked engine by
tests/conftest.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from builder.core import docker_client
from builder.core.errors import BuilderError
from builder.site import doctor, p2p_record, p2p_run, runtime_jit
from builder.spec.engines import sglang
from builder.spec.jit import packs
from tests.conftest import REPO_ROOT
from tests.site.test_harvest import NORM_CALL, _workspace
from tests.site.test_p2p import DATA, _builder, _case, _doctor, _fake_nvidia_smi, _launch, _manifest

PCIE_AR = "glm5-nvfp4-tp8-pcie-ar"
VOLUME_IN_CONTAINER = "/root/.cache/sglang"  # where the profiles mount sglang_cache
MOVE_IT = "keep records outside it (BUILDER_P2P_DIR=DIR for doctor --p2p and launch)"


def _honest(tmp_path: Path, case: str = "collapsed-pex89144") -> tuple[Path, Path, Path]:
    """(the records folder, the record doctor wrote there for `case`, the fake nvidia-smi).
    The collapsed case's record refuses -pcie-ar and sets NCCL_P2P_DISABLE=1."""
    _, facts = _case(case)
    smi = _fake_nvidia_smi(tmp_path / "smi", facts)
    records = tmp_path / "records"
    _, answer = _doctor(case, records, smi)
    return records, Path(answer["record"]), smi


def _rewrite(path: Path, change: Callable[[dict], object]) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _allow_pcie_ar(record: dict) -> None:
    record["settings"]["pcie_ar"] = {"allowed": True, "why": "forged"}


def _error(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1]


# --- the record's settings: only what doctor writes -----------------------------------------


@pytest.mark.parametrize(
    ("field", "forged", "refusal"),
    [
        (
            "set",
            {"NCCL_NET_PLUGIN": "/root/.cache/sglang/libnccl-net.so"},
            "settings.nccl.set NCCL_NET_PLUGIN=/root/.cache/sglang/libnccl-net.so: not a "
            "setting doctor writes (it sets NCCL_P2P_DISABLE=1 only)",
        ),
        (
            "set",
            {"NCCL_TUNER_PLUGIN": "libnccl-tuner.so"},
            "settings.nccl.set NCCL_TUNER_PLUGIN=libnccl-tuner.so: not a setting doctor "
            "writes (it sets NCCL_P2P_DISABLE=1 only)",
        ),
        (
            "set",
            {"NCCL_PROTO": "Simple"},
            "settings.nccl.set NCCL_PROTO=Simple: not a setting doctor writes (it sets "
            "NCCL_P2P_DISABLE=1 only)",
        ),
        (  # the one variable doctor sets, with a value it never writes
            "set",
            {"NCCL_P2P_DISABLE": "0"},
            "settings.nccl.set NCCL_P2P_DISABLE=0: not a setting doctor writes (it sets "
            "NCCL_P2P_DISABLE=1 only)",
        ),
        (
            "unset",
            ["NCCL_IB_DISABLE"],
            "settings.nccl.unset NCCL_IB_DISABLE: not a setting doctor drops (it drops "
            "NCCL_P2P_LEVEL only)",
        ),
    ],
)
def test_a_record_with_nccl_settings_doctor_never_writes_is_refused(
    tmp_path: Path, field: str, forged: object, refusal: str
) -> None:
    records, record, smi = _honest(tmp_path)
    _rewrite(record, lambda r: r["settings"]["nccl"].__setitem__(field, forged))
    done = _launch(tmp_path, records, smi)
    assert done.returncode == 1
    assert _error(done) == f"error: P2P record {record}: {refusal}; rerun builder doctor --p2p"


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda r: r.__setitem__("gpu_uuids", "GPU-0"), "gpu_uuids must list 1 to 64 GPU UUIDs"),
        (lambda r: r.__setitem__("gpu_uuids", []), "gpu_uuids must list 1 to 64 GPU UUIDs"),
        (
            lambda r: r.__setitem__("gpu_uuids", ["GPU-0\x1b[2J"]),
            "gpu_uuids must list 1 to 64 GPU UUIDs",
        ),
        (
            lambda r: r.__setitem__("topology_sha256", "../../etc"),
            "topology_sha256 must be 64 hex digits",
        ),
        (lambda r: r.__setitem__("written_at", ["2026"]), "written_at must be a string"),
        (lambda r: r.pop("settings"), "settings missing"),
        (
            lambda r: r["settings"]["pcie_ar"].__setitem__("allowed", "yes"),
            "settings.pcie_ar.allowed must be true or false",
        ),
    ],
)
def test_a_record_not_of_the_shape_doctor_writes_is_refused(
    tmp_path: Path, change: Callable[[dict], object], refusal: str
) -> None:
    records, record, smi = _honest(tmp_path)
    _rewrite(record, change)
    done = _launch(tmp_path, records, smi, "--p2p-record", str(record))
    assert done.returncode == 1
    assert _error(done) == f"error: P2P record {record}: {refusal}; rerun builder doctor --p2p"


# --- where a record is believed -------------------------------------------------------------


def test_a_record_on_the_server_s_volume_is_not_believed(tmp_path: Path) -> None:
    """The server's container writes its sglang cache volume: a record there that allows
    -pcie-ar, where the honest record refuses it, is refused wherever it is read from."""
    records, record, smi = _honest(tmp_path)
    volume = tmp_path / "sglang-cache"  # _launch's --set sglang_cache
    planted = volume / "builder-p2p"
    planted.mkdir(parents=True)
    forged = planted / record.name
    shutil.copy(record, forged)
    _rewrite(forged, _allow_pcie_ar)
    refusal = (
        f"error: P2P record folder {planted}: inside the volume {volume}:{VOLUME_IN_CONTAINER}, "
        f"which the server's container writes: a record there is not believed; {MOVE_IT}"
    )
    through_the_setting = _launch(tmp_path, planted, smi, "--profile", PCIE_AR)
    assert through_the_setting.returncode == 1 and _error(through_the_setting) == refusal
    named = _launch(tmp_path, records, smi, "--profile", PCIE_AR, "--p2p-record", str(forged))
    assert named.returncode == 1 and _error(named) == refusal
    honest = _launch(tmp_path, records, smi, "--profile", PCIE_AR)
    assert (
        honest.returncode == 1
        and "refuses it: collapsed pair: GPU2->GPU3 copies at 2.7" in _error(honest)
    )


def test_doctor_writes_no_record_into_the_server_s_volume(tmp_path: Path) -> None:
    """The default profile mounts /var/lib/sglang/cache-sm120: doctor refuses to keep a
    record there before it makes a folder."""
    _, facts = _case("one-h200")
    inside = Path("/var/lib/sglang/cache-sm120/builder-p2p")
    existed = inside.parent.exists()
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result",
        str(DATA / "one-h200" / "probe.json"), smi=_fake_nvidia_smi(tmp_path / "smi", facts),
        records=inside,
    )  # fmt: skip
    assert done.returncode == 1
    assert _error(done) == (
        f"error: P2P record folder {inside}: inside the volume /var/lib/sglang/cache-sm120:"
        f"{VOLUME_IN_CONTAINER}, which the server's container writes: a record there is not "
        f"believed; {MOVE_IT}"
    )
    assert inside.parent.exists() == existed


def test_doctor_writes_no_record_launch_would_refuse_as_too_large(tmp_path: Path) -> None:
    _, facts = _case("one-h200")
    probe = json.loads((DATA / "one-h200" / "probe.json").read_text())
    probe["padding"] = "x" * (1 << 20)
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe))
    records = tmp_path / "records"
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result", str(path),
        smi=_fake_nvidia_smi(tmp_path / "smi", facts), records=records,
    )  # fmt: skip
    assert done.returncode == 1
    machine = p2p_record.machine_from(facts.gpu_ids, facts.topology)
    error = _error(done)
    assert error.startswith(f"error: P2P record {records / machine.key}.json: ")
    assert error.endswith(
        " bytes, over the 1048576 launch reads: the probe's answer is not what builder's "
        "probe writes"
    )
    assert not records.exists()


@pytest.mark.parametrize("linked", ["the folder", "a folder above it"])
def test_doctor_writes_through_no_linked_folder(tmp_path: Path, linked: str) -> None:
    _, facts = _case("one-h200")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    records = link if linked == "the folder" else link / "p2p"
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result",
        str(DATA / "one-h200" / "probe.json"), smi=_fake_nvidia_smi(tmp_path / "smi", facts),
        records=records,
    )  # fmt: skip
    assert done.returncode == 1
    assert _error(done) == (
        f"error: P2P record folder {records}: {link} is a symbolic link: not followed; give "
        "a real folder (BUILDER_P2P_DIR)"
    )
    assert list(elsewhere.iterdir()) == []


def test_doctor_replaces_a_link_at_the_record_s_name_and_writes_nothing_through_it(
    tmp_path: Path,
) -> None:
    _, facts = _case("one-h200")
    machine = p2p_record.machine_from(facts.gpu_ids, facts.topology)
    records = tmp_path / "records"
    records.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    (records / f"{machine.key}.json").symlink_to(victim)
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result",
        str(DATA / "one-h200" / "probe.json"), smi=_fake_nvidia_smi(tmp_path / "smi", facts),
        records=records,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "kept\n"
    written = records / f"{machine.key}.json"
    assert not written.is_symlink() and json.loads(written.read_text())["key"] == machine.key
    assert sorted(p.name for p in records.iterdir()) == [written.name]  # no partial left


# --- reading a record: never following, blocking, or reading without end --------------------


def _plant(kind: str, at: Path, honest: Path) -> None:
    at.unlink()
    if kind == "a link to an allowing record":
        allowing = at.parent.parent / "allowing.json"
        shutil.copy(honest, allowing)
        _rewrite(allowing, _allow_pcie_ar)
        at.symlink_to(allowing)
    elif kind == "a dangling link":
        at.symlink_to(at.parent / "gone.json")
    elif kind == "a FIFO":
        os.mkfifo(at)
    elif kind == "a file over 1 MiB":
        at.write_bytes(b" " * (p2p_record.MAX_RECORD_BYTES + 1))
    elif kind == "JSON nested 5000 deep":
        at.write_text("[" * 5000 + "]" * 5000)
    elif kind == "a record others can write":
        shutil.copy(honest, at)
        at.chmod(0o666)


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        ("a link to an allowing record", "a symbolic link: not followed"),
        ("a dangling link", "a symbolic link: not followed"),
        ("a FIFO", "not a regular file"),
        ("a file over 1 MiB", "larger than 1048576 bytes: not a record"),
        ("JSON nested 5000 deep", "cannot read it (nested too deep)"),
        ("a record others can write", "writable by group or others: not believed"),
    ],
)
def test_a_hostile_file_at_the_record_s_name_is_refused_in_one_line(
    tmp_path: Path, kind: str, refusal: str
) -> None:
    records, record, smi = _honest(tmp_path)
    honest = tmp_path / "honest.json"
    shutil.copy(record, honest)
    _plant(kind, record, honest)
    done = _launch(tmp_path, records, smi, "--profile", PCIE_AR)
    assert done.returncode == 1
    assert _error(done) == f"error: P2P record {record}: {refusal}"


def test_a_device_named_as_the_record_is_not_read(tmp_path: Path) -> None:
    done = _launch(tmp_path, tmp_path / "records", None, "--p2p-record", "/dev/zero")
    assert done.returncode == 1
    assert _error(done) == "error: P2P record /dev/zero: not a regular file"


def test_a_record_folder_others_can_write_is_not_believed(tmp_path: Path) -> None:
    records, _, smi = _honest(tmp_path)
    records.chmod(0o777)
    done = _launch(tmp_path, records, smi, "--profile", PCIE_AR)
    assert done.returncode == 1
    assert _error(done) == (
        f"error: P2P record folder {records}: writable by group or others: a record there is "
        "not believed"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_record_another_user_owns_is_not_believed(tmp_path: Path) -> None:
    records, record, smi = _honest(tmp_path)
    os.chown(record, 12345, 12345)
    done = _launch(tmp_path, records, smi, "--profile", PCIE_AR)
    assert done.returncode == 1
    assert _error(done) == (
        f"error: P2P record {record}: owned by uid 12345, not root or this user: not believed"
    )


def test_a_record_s_words_reach_the_terminal_escaped(tmp_path: Path) -> None:
    records, record, smi = _honest(tmp_path)
    _rewrite(record, lambda r: r.__setitem__("written_at", "2026-12-07\x1b[2J\x1b]0;owned\x07"))
    _rewrite(record, lambda r: r["settings"]["pcie_ar"].__setitem__("why", "no\u202epeer"))
    done = _launch(tmp_path, records, smi)
    assert done.returncode == 0, done.stderr
    assert f"P2P record {record} (2026-12-07\\x1b[2J\\x1b]0;owned\\x07): " in done.stderr
    refused = _launch(tmp_path, records, smi, "--profile", PCIE_AR)
    assert "refuses it: no\\u202epeer; launch a profile without it" in _error(refused)
    assert "\x1b" not in done.stderr + refused.stderr and "\u202e" not in refused.stderr


# --- the probe's answer: shown escaped, judged only for this machine's GPUs -----------------


def test_the_probe_s_words_reach_doctor_s_lines_escaped(tmp_path: Path) -> None:
    _, facts = _case("one-h200")
    probe = json.loads((DATA / "one-h200" / "probe.json").read_text())
    probe["gpus"][0]["name"] = "NVIDIA H200\x1b[2J"
    probe["torch"] = "2.11\u202e0"
    probe["all_reduce"]["nccl"]["status"] = "failed"
    probe["all_reduce"]["nccl"]["detail"] = "rank 0: \x1b]8;;http://x\x07NCCL error"
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe))
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result", str(path),
        smi=_fake_nvidia_smi(tmp_path / "smi", facts), records=tmp_path / "records",
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0] == "ok   probe: 1 GPU(s) (NVIDIA H200\\x1b[2J), torch 2.11\\u202e0, NCCL 2.27.7"
    assert (
        "FAIL nccl all-reduce: failed at world 1: rank 0: \\x1b]8;;http://x\\x07NCCL error" in lines
    )
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout


@pytest.mark.parametrize("machine", ["another machine's", "the same GPUs in another order"])
def test_a_probe_of_other_gpus_writes_no_record(tmp_path: Path, machine: str) -> None:
    """Operator review #55: the healthy 8-GPU probe, judged here, would allow -pcie-ar under
    this machine's key where plain doctor refuses peer access."""
    probe = json.loads((DATA / "healthy-8x-rtx-pro-6000" / "probe.json").read_text())
    if machine == "another machine's":
        _, facts = _case("one-h200")
        host = ["GPU-d7ecf5df-936a-51e4-8fc8-f8948103aa7b"]
    else:
        _, facts = _case("healthy-8x-rtx-pro-6000")
        rows = [line.split(", ") for line in facts.gpu_ids.splitlines()]
        rows[0][1], rows[1][1] = rows[1][1], rows[0][1]
        facts = type(facts)(
            gpu_ids="".join(", ".join(r) + "\n" for r in rows), topology=facts.topology
        )
        host = [rows[0][1]]
    records = tmp_path / "records"
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result",
        str(DATA / "healthy-8x-rtx-pro-6000" / "probe.json"),
        smi=_fake_nvidia_smi(tmp_path / "smi", facts), records=records,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    count = len(facts.gpu_ids.splitlines())
    assert _error(done) == (
        f"error: the probe's GPUs are not this machine's: the probe saw 8 GPU(s) in another "
        f"order than nvidia-smi's {count} (first: {[probe['gpus'][0]['uuid']]} against "
        f"{host}); no P2P record written; unset CUDA_VISIBLE_DEVICES, and give the container "
        "every GPU (--gpus all)"
    )
    assert not records.exists()


@pytest.mark.parametrize(
    ("prints", "reason"),
    [
        ("'[' * 5000", "the probe exited 0 without a JSON document: nothing on stderr"),
        ("' ' * (1 << 20) + '{}'", "the probe's answer is over 1048576 characters"),
    ],
)
def test_a_probe_answer_nested_too_deep_or_too_long_is_no_document(
    prints: str, reason: str
) -> None:
    """A real child process stands in for the probe: what it prints is all that matters."""
    document = p2p_run.run([sys.executable, "-c", f"print({prints})"], 60)
    assert document == {"probe": "builder-p2p", "cuda": False, "error": reason}


def test_a_probe_result_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "p2p.json"
    path.write_text("[" * 5000)
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result", str(path), smi=None,
        records=tmp_path / "records",
    )  # fmt: skip
    assert done.returncode == 1
    assert _error(done) == f"error: --probe-result {path}: cannot read it (nested too deep)"


# --- docker's own words, and the NVIDIA runtime first ---------------------------------------


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        (  # #55: what docker run printed on a VM without the NVIDIA runtime (docker 28)
            'docker: Error response from daemon: could not select device driver "" with '
            "capabilities: [[gpu]]\n\nRun 'docker run --help' for more information\n",
            'docker: Error response from daemon: could not select device driver "" with '
            "capabilities: [[gpu]]",
        ),
        (  # a pull first, then the error, then the older hint
            "Unable to find image 'sglang-sm120:x' locally\nx: Pulling from sglang-sm120\n"
            "docker: Error response from daemon: manifest unknown.\nSee 'docker run --help'.\n",
            "docker: Error response from daemon: manifest unknown.",
        ),
        (  # no docker line (the image's python3 failed): its last lines
            'Traceback (most recent call last):\n  File "/opt/p.py", line 1\n'
            "ModuleNotFoundError: No module named 'torch'\n",
            'Traceback (most recent call last): | File "/opt/p.py", line 1 | '
            "ModuleNotFoundError: No module named 'torch'",
        ),
        (  # a cause without docker's prefix: the lines above the hint, never the hint
            "Unable to find image 'x:1' locally\npull access denied for x\n\n"
            "Run 'docker run --help' for more information\n",
            "Unable to find image 'x:1' locally | pull access denied for x",
        ),
        ("docker: \x1b[2Jcleared\n", "docker: \\x1b[2Jcleared"),
    ],
)
def test_a_failed_docker_run_says_its_error_not_its_help_hint(stderr: str, said: str) -> None:
    assert doctor.docker_failure(stderr) == said


@pytest.mark.skipif(not shutil.which("docker"), reason="the docker CLI is not installed")
def test_the_probe_s_failed_docker_run_is_named_by_docker_s_error(tmp_path, monkeypatch) -> None:
    """The real docker CLI with no daemon behind DOCKER_HOST prints its error, a blank line
    and its help hint: the reason is the error."""
    socket = tmp_path / "no-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    command = p2p_run.container_command("sglang-sm120:test", [], "builder-p2p-probe-test")
    document = p2p_run.run(command, 60)
    assert document["cuda"] is False
    assert document["error"] == (
        f"the probe exited 125 without a JSON document: docker: Cannot connect to the Docker "
        f"daemon at unix://{socket}. Is the docker daemon running?"
    )


def _no_nvidia_toolkit_path() -> str:
    return os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any((Path(d) / tool).exists() for tool in
                         ("nvidia-smi", "nvidia-ctk", "nvidia-container-runtime-hook"))
    )  # fmt: skip


def test_doctor_p2p_and_launch_run_name_the_missing_nvidia_runtime_first(
    tmp_path: Path, docker_host: str
) -> None:
    """The tests' engine has runc only: before the image is looked up (doctor --p2p) or a
    container made (launch --run), one line names the runtime and its fix, as plain doctor
    does; docker's own error would name a device driver."""
    env = {**os.environ, "DOCKER_HOST": docker_host, "PATH": _no_nvidia_toolkit_path(),
           "BUILDER_CONFIG": "/nonexistent", p2p_record.DIR_ENV: str(tmp_path / "records")}  # fmt: skip

    def builder(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "builder.cli.main", *args], capture_output=True, text=True,
            env=env, cwd=REPO_ROOT, timeout=300,
        )  # fmt: skip

    said = "error: container runtime: no NVIDIA runtime for --gpus all (Docker runtimes: "
    fix = (
        "); install nvidia-container-toolkit, then `nvidia-ctk runtime configure "
        "--runtime=docker` and restart docker (needed for --gpus all)"
    )
    # Said before the image is looked up, or pulled for its recipe.
    probe = builder("doctor", "--p2p", "--target", "sm120", "--image", "builder-absent:none")
    assert probe.returncode == 1 and "pull" not in probe.stderr
    assert _error(probe).startswith(said) and _error(probe).endswith(fix)
    name = f"builder-runtime-check-{os.getpid()}"
    start = builder(
        "launch", "--target", "sm120", "--manifest", str(_manifest(tmp_path)), "--run",
        "--name", name, "--set", f"sglang_cache={tmp_path / 'sglang-cache'}",
        "--hf-cache", str(tmp_path / "hf"),
    )  # fmt: skip
    assert start.returncode == 1
    assert _error(start).startswith(said) and _error(start).endswith(fix)
    listed = subprocess.run(
        ["docker", "-H", docker_host, "ps", "-a", "--filter", f"name={name}", "-q"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert listed.stdout == ""


# --- what a server's container hands back, and an image's files -----------------------------


def test_a_journal_line_too_long_or_nested_too_deep_is_skipped_in_one_warning(
    tmp_path: Path, capsys
) -> None:
    """A server writes the JIT journal: a line nested 5000 deep made json raise
    RecursionError and harvest crash; a record padded past 8 KiB is no record doctor's
    image writes."""
    journal = "\n".join([
        "[" * 5000,
        json.dumps({"name": "padded", "generator": NORM_CALL, "pad": "x" * 9000}),
        json.dumps({"name": "norm", "generator": NORM_CALL}),
    ])  # fmt: skip
    _workspace(tmp_path / "ws", journal)
    _, pack = packs.harvest_workspace(tmp_path / "ws", tmp_path / "packs")
    assert packs.pack_record(pack)["modules"] == {"norm": NORM_CALL}
    journal_path = next((tmp_path / "ws").rglob(packs.JOURNAL))
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.endswith(
        f"{journal_path}: 2 line(s) over 8192 characters or nested too deep: not journal "
        "records (skipped)"
    )


def test_kernel_names_a_server_s_container_chose_are_shown_escaped() -> None:
    caches = sglang.ENGINE.jit_caches
    compiled = runtime_jit.RuntimeCompiles(caches, {"triton": ["k\x1b[2J"], "deep_gemm": []})
    assert compiled.summary().endswith("(k\\x1b[2J)")
    unread = runtime_jit.RuntimeCompiles(caches, None, "python3 in the container: \x1b]0;x\x07")
    assert unread.summary().endswith("(python3 in the container: \\x1b]0;x\\x07)")


def _tar_of(add: Callable[[tarfile.TarFile], None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        add(tar)
    return buffer.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _chunks(data: bytes, taken: list[int], size: int = 64 << 10) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        taken.append(size)
        yield data[start : start + size]


def test_an_image_file_over_its_limit_is_not_held(tmp_path: Path) -> None:
    """A `get_archive` stream of a 16 MiB file with a 1 KiB limit: refused having read about
    the limit and the tar's slack, not the whole stream."""
    archive = _tar_of(lambda tar: _file(tar, "recipe.json", b"x" * (16 << 20)))
    taken: list[int] = []
    with pytest.raises(BuilderError) as refused:
        docker_client.file_from_archive(_chunks(archive, taken), "img: /recipe.json", 1024)
    assert str(refused.value) == "img: /recipe.json: larger than 1024 bytes: not read"
    assert sum(taken) <= 1024 + (1 << 20) + (64 << 10)


@pytest.mark.parametrize("kind", ["a folder (its whole tree)", "a symbolic link", "two files"])
def test_an_image_path_that_is_not_one_regular_file_is_not_read(kind: str) -> None:
    def add(tar: tarfile.TarFile) -> None:
        if kind == "a folder (its whole tree)":
            folder = tarfile.TarInfo("journal")
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
            _file(tar, "journal/a", b"{}")
        elif kind == "a symbolic link":
            link = tarfile.TarInfo("journal")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
            tar.addfile(link)
        else:
            _file(tar, "journal", b"{}")
            _file(tar, "other", b"{}")

    taken: list[int] = []
    with pytest.raises(BuilderError) as refused:
        docker_client.file_from_archive(_chunks(_tar_of(add), taken), "c: journal", 1 << 20)
    assert str(refused.value) == "c: journal: not a regular file: not read"


def test_one_regular_file_within_its_limit_is_read() -> None:
    archive = _tar_of(lambda tar: _file(tar, "recipe.json", b'{"ok": 1}'))
    taken: list[int] = []
    assert docker_client.file_from_archive(_chunks(archive, taken), "i", 1024) == b'{"ok": 1}'
