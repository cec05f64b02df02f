"""`builder doctor` checks on captured `nvidia-smi` output (no GPU here)."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from builder.site import doctor

DATA = Path(__file__).parents[1] / "data" / "nvidia-smi"


def _gpus(name: str) -> list[doctor.Gpu]:
    return doctor.parse_gpus((DATA / f"{name}.query.csv").read_text())


def _by_check(findings: list[doctor.Finding]) -> dict[str, doctor.Finding]:
    return {f.check: f for f in findings}


def test_eight_rtx_pro_6000_pass() -> None:
    gpus = _gpus("rtx-pro-6000-x8")
    assert len(gpus) == 8 and gpus[0].compute_cap == "12.0" and gpus[0].memory_mib == 97887
    findings = _by_check(doctor.check_gpus(gpus, "12.0", 8, 90))
    assert findings["gpu count"].ok and findings["gpu memory"].ok
    assert "compute capability" not in findings
    assert doctor.check_driver(gpus, Version("12.8.1")).ok


def test_old_driver_fails_with_the_minimum() -> None:
    finding = doctor.check_driver(_gpus("rtx-pro-6000-x8-old-driver"), Version("12.8.1"))
    assert not finding.ok
    assert "565.57.01" in finding.detail and ">= 570.26" in finding.detail
    assert "upgrade the NVIDIA driver" in finding.fix


def test_mixed_gpus_fail_count_and_capability() -> None:
    findings = _by_check(doctor.check_gpus(_gpus("mixed-6x-pro6000-1x-4090"), "12.0", 8, 90))
    assert not findings["gpu count"].ok
    assert "6 GPU(s) with compute capability 12.0" in findings["gpu count"].detail
    assert "Proxmox" in findings["gpu count"].fix
    assert not findings["compute capability"].ok
    assert "6 (NVIDIA GeForce RTX 4090, 8.9)" in findings["compute capability"].detail


def test_too_little_memory_per_gpu() -> None:
    findings = _by_check(doctor.check_gpus(_gpus("rtx-pro-6000-x8"), "12.0", 8, 120))
    assert not findings["gpu memory"].ok


def test_pcie_topology_is_parsed_and_explained() -> None:
    links = doctor.parse_topology((DATA / "rtx-pro-6000-x8.topo.txt").read_text())
    assert len(links) == 8 * 7
    assert links[(0, 1)] == "PHB" and links[(0, 5)] == "SYS" and links[(7, 6)] == "PHB"
    finding = doctor.check_topology(links)
    assert "PHB, SYS" in finding.detail and "no NVLink" in finding.detail
    assert "NCCL_P2P_LEVEL=PHB" in finding.fix


def test_small_shm_and_missing_runtime_fail() -> None:
    assert not doctor.check_shm(64 << 20).ok
    assert doctor.check_shm(64 << 30).ok
    assert not doctor.check_runtime(None).ok
    runtime = doctor.check_runtime({"Runtimes": {"runc": {}}})
    assert "runc" in runtime.detail
    assert doctor.check_runtime({"Runtimes": {"runc": {}, "nvidia": {}}}).ok


def test_real_h200_capture_with_nvlink() -> None:
    """Captured on the lent 2x H200 machine (its header has terminal escape codes)."""
    gpus = _gpus("h200-x2")
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H200"]
    findings = _by_check(doctor.check_gpus(gpus, "9.0", 2, 130))
    assert findings["gpu count"].ok and findings["gpu memory"].ok
    assert doctor.check_driver(gpus, Version("12.8.1")).ok
    links = doctor.parse_topology((DATA / "h200-x2.topo.txt").read_text())
    assert links == {(0, 1): "NV18", (1, 0): "NV18"}
    assert doctor.check_topology(links).detail == "all GPU pairs on NVLink"
    # The sm120 image on this machine: the capability check says why it cannot run.
    wrong = _by_check(doctor.check_gpus(gpus, "12.0", 8, 90))
    assert not wrong["gpu count"].ok and not wrong["compute capability"].ok


P2P_8 = """ \tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\t
 GPU0\tX\tOK\tOK\tOK\tOK\tOK\tOK\tOK\t
 GPU1\tOK\tX\tOK\tOK\tOK\tOK\tOK\tOK\t
 GPU2\tOK\tOK\tX\tOK\tOK\tOK\tOK\tOK\t
 GPU3\tOK\tOK\tOK\tX\tOK\tOK\tOK\tOK\t
 GPU4\tOK\tOK\tOK\tOK\tX\tOK\tOK\tOK\t
 GPU5\tOK\tOK\tOK\tOK\tOK\tX\tOK\tOK\t
 GPU6\tOK\tOK\tOK\tOK\tOK\tOK\tX\tOK\t
 GPU7\tOK\tOK\tOK\tOK\tOK\tOK\tOK\tX\t

Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""


def test_peer_access_for_the_pcie_allreduce_profile() -> None:
    status = doctor.parse_topology(P2P_8)
    assert len(status) == 8 * 7 and set(status.values()) == {"OK"}
    assert doctor.check_peer_access(status, 8).ok
    # A VM without iommu=pt: the host bridge refuses peer reads across the root complex.
    refused = P2P_8.replace(" GPU0\tX\tOK\tOK\tOK\tOK\tOK", " GPU0\tX\tOK\tOK\tOK\tCNS\tCNS")
    finding = doctor.check_peer_access(doctor.parse_topology(refused), 8)
    assert not finding.ok and "GPU0-GPU4 CNS" in finding.detail and "iommu=pt" in finding.fix
    assert doctor.check_peer_access(doctor.parse_topology(refused), 4).ok  # TP-4 uses GPU0-3
    assert not doctor.check_peer_access({}, 8).ok


def test_cuda_13_needs_a_580_driver() -> None:
    gpus = _gpus("rtx-pro-6000-x8")
    finding = doctor.check_driver(gpus, Version("13.0.1"))
    assert (">= 580.65.06" in finding.detail) and finding.ok == (
        Version(gpus[0].driver) >= Version("580.65.06")
    )
    assert not doctor.check_driver(_gpus("rtx-pro-6000-x8-old-driver"), Version("13.0.1")).ok


def test_a_hanging_nvidia_smi_is_a_finding_not_a_crash(tmp_path, monkeypatch) -> None:
    """A GPU that fell off the bus makes nvidia-smi hang: doctor reports it and goes on."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert doctor.run_command(["nvidia-smi", "-L"], timeout_s=0.5) is None
