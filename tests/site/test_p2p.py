"""`builder doctor --p2p`: the analysis on probe documents and host facts (tests/data/p2p,
synthesised: no GPU exists here, see its README), the probe itself where torch is absent, the
probe's stage deadlines on real child processes, and the record as `builder launch` reads
it back through the CLI.

A GPU cannot exist on this machine, so the CLI tests put a fake `nvidia-smi` first on PATH:
a shell script that prints the recorded `--query-gpu=index,uuid,pci.bus_id` and `topo -m`
answers of a case's host.json (the machine launch keys its record by), nothing else."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.site import p2p, p2p_host, p2p_record
from builder.site.p2p_host import HostFacts
from builder.site.probes import p2p_probe
from tests.conftest import REPO_ROOT

DATA = Path(__file__).parents[1] / "data" / "p2p"
SMI = Path(__file__).parents[1] / "data" / "nvidia-smi"
PROFILE_ENV = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB"}  # images/sm120/profiles.toml


def _case(name: str) -> tuple[dict, HostFacts]:
    probe = json.loads((DATA / name / "probe.json").read_text())
    return probe, HostFacts.from_json(json.loads((DATA / name / "host.json").read_text()))


def _checks(analysis: p2p.Analysis) -> dict[str, p2p.Check]:
    return {check.name: check for check in analysis.checks}


# --- the analysis ------------------------------------------------------------------------


def test_a_healthy_box_keeps_the_profile_s_nccl_and_allows_pcie_ar() -> None:
    analysis = p2p.analyse(*_case("healthy-8x-rtx-pro-6000"), PROFILE_ENV)
    checks = _checks(analysis)
    assert analysis.ok and not analysis.causes
    assert {c.status for c in analysis.checks} == {"ok"}
    assert "median 31.5 GB/s over 56 directions" in checks["p2p bandwidth"].detail
    assert checks["iommu"].detail.startswith("passthrough")
    assert checks["host"].detail.startswith("bare metal")
    assert analysis.settings.nccl_set == {} and analysis.settings.nccl_unset == ()
    assert "NCCL_P2P_LEVEL=PHB kept" in analysis.settings.nccl_why
    assert analysis.settings.apply(PROFILE_ENV) == PROFILE_ENV
    assert analysis.settings.pcie_ar_allowed
    assert analysis.verdict.startswith("healthy;")


def test_a_collapsed_pair_behind_a_pex89144_disables_nccl_p2p_and_refuses_pcie_ar() -> None:
    probe, facts = _case("collapsed-pex89144")
    switches = p2p_host.parse_switches(facts.lspci)
    assert len(switches) == 12 and {s.chip for s in switches} == {"PEX89144"}
    assert all(s.collapse_family for s in switches)
    analysis = p2p.analyse(probe, facts, PROFILE_ENV)
    checks = _checks(analysis)
    assert not analysis.ok
    bandwidth = checks["p2p bandwidth"]
    assert bandwidth.status == "FAIL"
    assert "GPU2->GPU3 2.7 GB/s (9% of the median)" in bandwidth.detail
    assert "GPU3->GPU2 2.8 GB/s" in bandwidth.detail
    assert [c for c in analysis.checks if not c.ok] == [bandwidth]  # the rest ran fine
    assert "PEX89144" in checks["pcie switches"].detail
    (cause,) = analysis.causes
    assert cause.startswith("Broadcom PEX890xx posted-write P2P collapse") and "PEX89144" in cause
    assert analysis.settings.nccl_set == {"NCCL_P2P_DISABLE": "1"}
    assert analysis.settings.nccl_unset == ("NCCL_P2P_LEVEL",)
    assert analysis.settings.apply(PROFILE_ENV) == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}
    assert not analysis.settings.pcie_ar_allowed
    assert "GPU2->GPU3 copies at 2.7 GB/s" in analysis.settings.pcie_ar_why
    assert analysis.verdict.startswith("degraded (p2p bandwidth); NCCL: NCCL_P2P_DISABLE=1")


def test_the_collapse_s_cause_follows_what_lspci_can_see() -> None:
    probe, facts = _case("collapsed-pex89144")
    _, vm = _case("iommu-vm")  # inside a VM lspci shows QEMU's root ports, not the switches
    (inside,) = p2p.analyse(probe, vm, PROFILE_ENV).causes[:1]
    assert inside.startswith("likely the Broadcom PEX890xx") and "lspci -nn -d 1000:c030" in inside
    no_switch = HostFacts.from_json(
        {**facts.to_json(), "lspci": _case("healthy-8x-rtx-pro-6000")[1].lspci}
    )
    (plain,) = p2p.analyse(probe, no_switch, PROFILE_ENV).causes
    assert "no Broadcom PEX890xx switch" in plain and "nvidia-smi -q -d PCIE" in plain


def test_an_iommu_translated_vm_whose_nccl_hangs_at_8_gpus() -> None:
    analysis = p2p.analyse(*_case("iommu-vm"), PROFILE_ENV)
    checks = _checks(analysis)
    assert checks["host"].detail.startswith("VM (kvm; QEMU")
    assert checks["iommu"].detail.startswith("translated: vfio VM")
    assert "DMA-FQ" in checks["iommu"].detail and "intel_iommu=on" in checks["iommu"].detail
    assert checks["p2p bandwidth"].ok, "the translated IOMMU masks the collapse"
    nccl = checks["nccl all-reduce"]
    assert nccl.status == "FAIL" and nccl.detail.startswith("hung at world 8: no answer within")
    assert "ranks 0-7: all_reduce 12288 B: first call" in nccl.detail
    assert checks["nccl all-reduce, P2P off"].status == "ok"
    assert checks["pcie ipc all-reduce"].status == "FAIL"
    assert p2p.IOMMU_CAUSE in analysis.causes
    assert analysis.settings.nccl_set == {"NCCL_P2P_DISABLE": "1"}
    assert "NCCL's all-reduce hung at world 8" in analysis.settings.nccl_why
    assert not analysis.settings.pcie_ar_allowed
    assert analysis.settings.pcie_ar_why.startswith("FlashInfer's PCIe IPC all-reduce hung")


def test_nccl_that_also_hangs_with_p2p_off_is_broken_not_degraded() -> None:
    probe, facts = _case("iommu-vm")
    probe["all_reduce"]["nccl_p2p_disabled"] = dict(probe["all_reduce"]["nccl"])
    analysis = p2p.analyse(probe, facts, PROFILE_ENV)
    assert analysis.verdict.startswith("broken: NCCL fails with P2P off too")
    assert analysis.settings.nccl_set == {"NCCL_P2P_DISABLE": "1"}


def test_one_gpu_skips_what_it_cannot_measure_and_passes() -> None:
    analysis = p2p.analyse(*_case("one-h200"), PROFILE_ENV)
    checks = _checks(analysis)
    assert analysis.ok
    for name in ("peer access", "p2p bandwidth", "p2p latency", "nccl all-reduce",
                 "nccl all-reduce, P2P off", "pcie ipc all-reduce", "pcie switches"):  # fmt: skip
        assert checks[name].status == "SKIP", name
    assert "ran at world 1 (the profile runs TP 8)" in checks["nccl all-reduce"].detail
    assert analysis.settings.nccl_set == {}
    assert not analysis.settings.pcie_ar_allowed
    assert analysis.settings.pcie_ar_why.startswith("one GPU")


def test_a_probe_without_cuda_is_a_skipped_check_and_measures_nothing() -> None:
    _, facts = _case("one-h200")
    probe = {"probe": "builder-p2p", "cuda": False, "error": "no CUDA: torch is not installed"}
    analysis = p2p.analyse(probe, facts, PROFILE_ENV)
    assert _checks(analysis)["probe"].status == "SKIP"  # could not check: exit 9, not 1
    assert analysis.verdict == "could not measure: no CUDA: torch is not installed"
    assert not analysis.settings.pcie_ar_allowed and analysis.settings.nccl_set == {}


@pytest.mark.parametrize(
    ("gbps", "flagged"),
    [
        ([45.0] * 10 + [20.0], []),  # a SYS pair at 44 % of the median: slower, not collapsed
        ([45.0] * 10 + [10.0], [10.0]),  # 22 %
        ([2.7] * 12, [2.7] * 12),  # every pair collapsed: the median is no guide, the floor is
        ([12.0] * 6, []),  # a Gen 3 box, uniformly slow but above the floor
    ],
)
def test_collapse_is_far_below_the_median_or_under_the_floor(gbps, flagged) -> None:
    found = [p2p.Direction(0, i + 1, value) for i, value in enumerate(gbps)]
    _, slow = p2p.collapsed(found)
    assert [d.gbps for d in slow] == flagged


# --- host facts --------------------------------------------------------------------------


def test_plain_lspci_lines_name_the_switch_too() -> None:
    text = (
        "c0:01.1 PCI bridge [0604]: Advanced Micro Devices, Inc. [AMD] Device [14ab] (rev 01)\n"
        "c1:00.0 PCI bridge [0604]: Broadcom / LSI PEX890xx PCIe Gen 5 Switch [1000:c030] (rev b0)\n"
        "c3:00.0 3D controller [0302]: NVIDIA Corporation Device [10de:2bb5] (rev a1)\n"
    )
    (switch,) = p2p_host.parse_switches(text)
    assert (switch.slot, switch.device, switch.name) == (
        "c1:00.0",
        "c030",
        "PEX890xx PCIe Gen 5 Switch",
    )
    assert switch.collapse_family
    assert p2p_host.parse_switches(text.replace("c030", "c010"))[0].collapse_family is False


@pytest.mark.parametrize(
    ("facts", "mode"),
    [
        ({"iommu_groups": 80, "cmdline": "ro amd_iommu=on"}, "translated"),
        ({"iommu_groups": 80, "cmdline": "ro amd_iommu=on iommu=pt"}, "passthrough"),
        ({"iommu_groups": 80, "cmdline": "ro iommu.passthrough=1"}, "passthrough"),
        (
            {
                "iommu_groups": 80,
                "cmdline": "ro iommu=pt",
                "gpu_iommu_types": {"0000:01:00.0": "DMA"},
            },
            "translated",
        ),
        ({"iommu_groups": 0, "cmdline": "ro"}, "off"),
        ({"iommu_groups": None, "cmdline": "ro"}, "unknown"),
        ({"iommu_groups": 0, "cmdline": "ro", "sys_vendor": "QEMU"}, "translated"),  # vfio
    ],
)
def test_iommu_mode(facts, mode) -> None:
    host = HostFacts(detect_virt="none", **facts)
    assert p2p_host.iommu(host, p2p_host.virtualisation(host)).mode == mode


def test_the_topology_key_ignores_escapes_and_affinity_but_not_links() -> None:
    captured = (SMI / "h200-x2.topo.txt").read_text()  # the lent 2x H200's own, with escapes
    assert p2p_host.topology_matrix(captured) == "0-1 NV18"
    plain = captured.replace("\x1b[4m", "").replace("\x1b[0m", "").replace("0-31", "0-63")
    assert p2p_host.topology_hash(plain) == p2p_host.topology_hash(captured)
    assert p2p_host.topology_hash(captured.replace("NV18", "PHB")) != p2p_host.topology_hash(
        captured
    )


# --- the probe ---------------------------------------------------------------------------


def test_the_probe_without_torch_answers_no_cuda_in_one_document(capsys) -> None:
    """torch is not in this venv: the probe (run in-process) still prints one JSON document,
    and exits 9 (could not check, builder's code) with the reason and the route on stderr."""
    assert p2p_probe.main(["--stage-timeout", "5"]) == 9
    shown = capsys.readouterr()
    document = json.loads(shown.out)
    assert shown.err.strip().splitlines()[-1] == (
        f"p2p_probe: measured nothing: no CUDA: torch is not installed in this Python "
        f"({sys.executable}); run it with a python3 that has a CUDA build of torch (the server "
        "image has one: builder doctor --p2p --image IMAGE)"
    )
    assert document["probe"] == "builder-p2p" and document["probe_version"] == 1
    assert document["cuda"] is False
    assert document["error"] == f"no CUDA: torch is not installed in this Python ({sys.executable})"
    assert document["gpus"] == []
    for stage in ("nccl", "nccl_p2p_disabled", "pcie_ipc"):
        assert document["all_reduce"][stage]["status"] == "skipped"
    assert [s["bytes"] for s in document["all_reduce"]["sizes"]] == [
        12288, 98304, 393216, 1572864, 3145728,
    ]  # fmt: skip


def test_the_probe_refuses_bad_input_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "builder.site.probes.p2p_probe", "--nccl-env", "NCCL_P2P_LEVEL"],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "p2p_probe: error: argument --nccl-env: 'NCCL_P2P_LEVEL': expected KEY=VALUE\n"
    )


def test_a_stage_that_hangs_is_killed_and_recorded_where_it_was(tmp_path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    started = time.monotonic()
    ran = p2p_probe.run_processes([sleeper, sleeper], dict(os.environ), 1.0, tmp_path, "nccl")
    assert time.monotonic() - started < 20
    assert ran["status"] == "hung" and ran["progress"] == ["not started", "not started"]
    assert all(code is not None and code < 0 for code in ran["exit_codes"])  # killed


def test_one_rank_failing_stops_the_others_waiting_for_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(p2p_probe, "FAILED_RANK_GRACE_S", 0.5)
    failing = [sys.executable, "-c", "import sys; sys.exit('NCCL error: unhandled system error')"]
    waiting = [sys.executable, "-c", "import time; time.sleep(120)"]
    started = time.monotonic()
    ran = p2p_probe.run_processes([failing, waiting], dict(os.environ), 60, tmp_path, "nccl")
    assert time.monotonic() - started < 20
    assert ran["status"] == "failed" and ran["exit_codes"][0] == 1
    assert "NCCL error: unhandled system error" in ran["log_tails"][0]


def test_a_stage_child_s_own_words_are_its_failure(tmp_path) -> None:
    """The real stage child, here without torch: it fails, and says why."""
    args = p2p_probe.parse_args(["--stage-timeout", "60"])
    stage = p2p_probe.run_stage("gpus", 1, args, dict(os.environ), tmp_path)
    assert stage["status"] == "failed"
    assert stage["detail"] == "ModuleNotFoundError: No module named 'torch'"
    assert stage["ranks"][0]["error"] == stage["detail"]


def test_ranks_at_the_same_step_read_as_one_clause() -> None:
    assert p2p_probe.where_ranks_were(["init"] * 8) == "ranks 0-7: init"
    assert p2p_probe.where_ranks_were(["a", "b", "a"]) == "ranks 0, 2: a; rank 1: b"


# --- the record, through the CLI -----------------------------------------------------------


def _fake_nvidia_smi(folder: Path, facts: HostFacts) -> Path:
    """A fake `nvidia-smi` answering the two questions launch and doctor ask (see the
    module docstring: no GPU exists here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_ids.csv").write_text(facts.gpu_ids or "")
    (folder / "topo.txt").write_text(facts.topology or "")
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  "--query-gpu=index,uuid,pci.bus_id --format=csv,noheader") cat "{folder}/gpu_ids.csv" ;;\n'
        f'  "topo -m") cat "{folder}/topo.txt" ;;\n'
        '  *) echo "fake nvidia-smi: not asked for: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return folder


def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / "nvidia-smi").exists()
    )  # fmt: skip


def _builder(*args: str, smi: Path | None, records: Path) -> subprocess.CompletedProcess:
    """builder with the fake nvidia-smi (or none) and its P2P records kept in `records`;
    five minutes at most (a read that blocks is a failed test, not a hung run)."""
    path = _path_without_nvidia_smi()
    env = {**os.environ, "PATH": f"{smi}{os.pathsep}{path}" if smi else path,
           "COLUMNS": "200", "BUILDER_CONFIG": "/nonexistent",
           p2p_record.DIR_ENV: str(records)}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "builder.cli.main", *args], capture_output=True, text=True, env=env,
        cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip


def _manifest(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.json"
    image = {"reference": "sglang-sm120:test",
             "pushed": {"reference": "registry.example/ml/sglang-sm120@sha256:" + "a" * 64}}  # fmt: skip
    path.write_text(json.dumps({"schema_version": 1, "image": image}))
    return path


def _doctor(case: str, records: Path, smi: Path) -> tuple[int, dict]:
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result", str(DATA / case / "probe.json"),
        "--json", smi=smi, records=records,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def _launch(
    tmp_path: Path, records: Path, smi: Path | None, *more: str
) -> subprocess.CompletedProcess:
    return _builder(
        "launch", "--target", "sm120", "--manifest", str(_manifest(tmp_path)),
        "--set", f"sglang_cache={tmp_path / 'sglang-cache'}", "--json", *more, smi=smi,
        records=records,
    )  # fmt: skip


def test_launch_applies_the_record_doctor_wrote_and_refuses_pcie_ar(tmp_path) -> None:
    _, facts = _case("collapsed-pex89144")
    smi = _fake_nvidia_smi(tmp_path / "smi", facts)
    records = tmp_path / "records"
    code, doctor = _doctor("collapsed-pex89144", records, smi)
    assert code == 1 and doctor["ok"] is False  # a collapsed pair is a failed check
    record = Path(doctor["record"])
    machine = p2p_record.machine_from(facts.gpu_ids, facts.topology)
    assert record == records / f"{machine.key}.json"
    written = json.loads(record.read_text())
    assert written["gpu_uuids"] == list(machine.uuids) and written["profile"] == "glm5-nvfp4-tp8"
    assert written["settings"]["nccl"]["set"] == {"NCCL_P2P_DISABLE": "1"}
    assert written["probe"]["gpus"][2]["uuid"] == machine.uuids[2]

    done = _launch(tmp_path, records, smi)
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["env"]
    assert env["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in env
    assert f"P2P record {record} (" in done.stderr
    assert (
        "NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL dropped: GPU2->GPU3 copies at 2.7 GB/s" in done.stderr
    )
    assert "-e NCCL_P2P_DISABLE=1" in json.loads(done.stdout)["docker_run_shell"]

    refused = _launch(tmp_path, records, smi, "--profile", "glm5-nvfp4-tp8-pcie-ar")
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("error: profile glm5-nvfp4-tp8-pcie-ar needs peer access on every")
    assert str(record) in last and "GPU2->GPU3 copies at 2.7 GB/s" in last
    assert json.loads(refused.stdout)["exit_code"] == 1

    anyway = _launch(
        tmp_path, records, smi, "--profile", "glm5-nvfp4-tp8-pcie-ar", "--no-p2p-record"
    )
    assert anyway.returncode == 0 and "P2P record: not read (--no-p2p-record)" in anyway.stderr
    assert json.loads(anyway.stdout)["env"]["NCCL_P2P_LEVEL"] == "PHB"


def test_a_healthy_record_lets_pcie_ar_start_with_the_profile_s_nccl(tmp_path) -> None:
    _, facts = _case("healthy-8x-rtx-pro-6000")
    smi = _fake_nvidia_smi(tmp_path / "smi", facts)
    records = tmp_path / "records"
    code, doctor = _doctor("healthy-8x-rtx-pro-6000", records, smi)
    # This machine's own facts (no PEX, maybe a VM) join the recorded probe: nothing fails.
    assert code == 0 and doctor["ok"] and doctor["settings"]["pcie_ar"]["allowed"]
    done = _launch(tmp_path, records, smi, "--profile", "glm5-nvfp4-tp8-pcie-ar")
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["env"]
    assert env["NCCL_P2P_LEVEL"] == "PHB" and "NCCL_P2P_DISABLE" not in env
    assert env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert "P2P healthy: the profile's NCCL_P2P_LEVEL=PHB kept" in done.stderr


def test_a_stale_record_is_ignored_in_one_line(tmp_path) -> None:
    _, facts = _case("collapsed-pex89144")
    records = tmp_path / "records"
    code, doctor = _doctor("collapsed-pex89144", records, _fake_nvidia_smi(tmp_path / "a", facts))
    assert code == 1 and Path(doctor["record"]).is_file()
    rows = [line.split(", ") for line in facts.gpu_ids.splitlines()]
    rows[0][1], rows[1][1] = rows[1][1], rows[0][1]  # GPU0 and GPU1 swapped slots
    swapped = "".join(", ".join(row) + "\n" for row in rows)
    moved = _fake_nvidia_smi(tmp_path / "b", HostFacts(gpu_ids=swapped, topology=facts.topology))
    done = _launch(tmp_path, records, moved, "--profile", "glm5-nvfp4-tp8-pcie-ar")
    assert done.returncode == 0, done.stderr  # the record that refused it is not this machine's
    assert json.loads(done.stdout)["env"]["NCCL_P2P_LEVEL"] == "PHB"
    (line,) = [line for line in done.stderr.splitlines() if "P2P record" in line]
    assert "none for this machine's GPU order and topology" in line
    assert (
        f"ignored 1 stale ({Path(doctor['record']).name}: the same GPUs in another order)" in line
    )
    explicit = _launch(tmp_path, records, moved, "--p2p-record", doctor["record"])
    assert explicit.returncode == 0
    assert "ignored, stale: made for the same GPUs in another order" in explicit.stderr
    retopo = facts.topology.replace("GPU0\t X \tPIX", "GPU0\t X \tPHB", 1)  # GPU0-GPU1
    other = _fake_nvidia_smi(tmp_path / "c", HostFacts(gpu_ids=facts.gpu_ids, topology=retopo))
    assert p2p_host.topology_matrix(retopo) != p2p_host.topology_matrix(facts.topology)
    again = _launch(tmp_path, records, other, "--p2p-record", doctor["record"])
    assert "ignored, stale: made for another topology" in again.stderr


def test_without_nvidia_smi_launch_says_no_record_was_read_and_why(tmp_path) -> None:
    records = tmp_path / "records"
    _, facts = _case("collapsed-pex89144")
    _, doctor = _doctor("collapsed-pex89144", records, _fake_nvidia_smi(tmp_path / "smi", facts))
    done = _launch(tmp_path, records, None)
    assert done.returncode == 0
    assert (
        "P2P record: none read (nvidia-smi not found or not answering here, so this machine's "
        "GPU order and topology are unknown)"
    ) in done.stderr
    assert json.loads(done.stdout)["env"]["NCCL_P2P_LEVEL"] == "PHB"
    # Named explicitly (deploy-files on a build host for the VM): applied, and said so.
    named = _launch(tmp_path, records, None, "--p2p-record", doctor["record"])
    assert json.loads(named.stdout)["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "(not matched against this machine: nvidia-smi not found" in named.stderr


def test_a_bad_record_file_is_one_line(tmp_path) -> None:
    bad = tmp_path / "record.json"
    bad.write_text(json.dumps({"schema": "something else"}))
    done = _launch(tmp_path, tmp_path / "records", None, "--p2p-record", str(bad))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: P2P record {bad}: not a builder P2P record (schema builder-p2p-record)"
    )
    both = _launch(
        tmp_path, tmp_path / "records", None, "--p2p-record", str(bad), "--no-p2p-record"
    )
    assert (
        both.stderr.strip().splitlines()[-1] == "error: --p2p-record and --no-p2p-record: give one"
    )


def test_doctor_p2p_bad_input_is_one_line(tmp_path) -> None:
    done = _builder("doctor", "--p2p", "--target", "sm120", "--probe-result",
                    str(tmp_path / "missing.json"), smi=None, records=tmp_path)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --probe-result {tmp_path / 'missing.json'}: no such file"
    )


def test_doctor_p2p_prints_each_check_the_verdict_and_the_record(tmp_path) -> None:
    """One GPU (as the lent H200): what it cannot measure is SKIP, and that passes."""
    _, facts = _case("one-h200")
    smi = _fake_nvidia_smi(tmp_path / "smi", facts)
    records = tmp_path / "records"
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result",
        str(DATA / "one-h200" / "probe.json"), smi=smi, records=records,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ok   probe: 1 GPU(s) (NVIDIA H200)")
    assert "SKIP peer access: one GPU: no pair to measure" in lines
    assert all(line.split()[0] in ("ok", "FAIL", "SKIP", "fix:", "verdict:", "record:", "cause:")
               for line in lines)  # fmt: skip
    assert lines[-2].startswith("verdict: healthy; NCCL: the profile's settings; -pcie-ar")
    (record,) = records.glob("gpus-*.json")
    assert lines[-1].startswith(f"record: {record} (builder launch, deploy-files and qualify")


def test_doctor_p2p_without_a_docker_daemon_could_not_check(tmp_path) -> None:
    """Exit 9 (could not check), not 1: nothing was measured, nothing found wrong."""
    data = tmp_path / "data"
    for folder in ("images", "forks"):  # a data directory: no manifests in the checkout
        shutil.copytree(REPO_ROOT / folder, data / folder)
    manifest = _manifest(tmp_path)
    (data / "manifests" / "sm120").mkdir(parents=True)
    shutil.copy(manifest, data / "manifests" / "sm120" / "20260101T000000Z-test.json")
    done = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", "doctor", "--p2p", "--target", "sm120",
         "--data-dir", str(data)],
        capture_output=True, text=True, cwd=REPO_ROOT,
        env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
             p2p_record.DIR_ENV: str(tmp_path / "records")},
    )  # fmt: skip
    assert done.returncode == 9
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(
        f"error: cannot reach the Docker daemon at unix://{tmp_path}/no-docker.sock"
    )
    probe = REPO_ROOT / "builder/site/probes/p2p_probe.py"
    assert said.endswith(
        f"; or measure without Docker: python3 {probe} --out p2p.json with a python3 that has "
        "a CUDA build of torch, then builder doctor --p2p --probe-result p2p.json"
    )
    assert not (tmp_path / "records").exists()


def test_a_probe_that_measured_nothing_could_not_check(tmp_path, capsys) -> None:
    """The no-Docker route's answer from a python3 without a CUDA torch: exit 9, not 0 (it
    measured nothing) and not 1 (it found nothing wrong either); no record."""
    answer = tmp_path / "p2p.json"
    assert p2p_probe.main(["--stage-timeout", "5", "--out", str(answer)]) == 9
    capsys.readouterr()
    done = _builder(
        "doctor", "--p2p", "--target", "sm120", "--probe-result", str(answer),
        smi=None, records=tmp_path / "records",
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    assert "record: not written: the probe measured nothing" in done.stdout
    assert not (tmp_path / "records").exists()
