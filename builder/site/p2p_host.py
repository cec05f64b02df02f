"""What the GPU VM's host side says about its PCIe fabric, for `builder doctor --p2p`:
PCIe switches (`lspci`), IOMMU mode, whether this is a VM, the GPUs' order and topology.

`collect()` reads the commands and files (outside any container); everything else is a
pure function of that text, so recorded facts (tests/data/p2p) exercise every branch.

Broadcom's PCIe switches, as `lspci -nn` names them (pci.ids, github.com/pciutils/pciids
at c1c1254, 2026-08-22, vendor 1000 "Broadcom / LSI"): device c030 and c034 "PEX890xx
PCIe Gen 5 Switch" (the chip in the subsystem: 1000:0144 "PEX89144 PCIe Gen 5 72 port/144
lane Switch Upstream/Downstream Port", 0104 PEX89104, 0088 PEX89088 ...), c010 and c012
"PEX880xx PCIe Gen 4 Switch", c040 "PEX90xxx PCIe Gen 6 Switch". The posted-write P2P
collapse (rtx6kpro hardware/collapse-report.md; issues #25, #32) is the PEX890xx family.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from builder.site import doctor

BROADCOM = "1000"
PEX890XX = {"c030", "c034"}  # Gen 5: the family with the posted-write collapse
PEX_OTHER = {"c010": "PEX880xx (Gen 4)", "c012": "PEX880xx (Gen 4)", "c040": "PEX90xxx (Gen 6)"}
GPU_IDS_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]
TOPOLOGY_QUERY = ["nvidia-smi", "topo", "-m"]
LSPCI = ["lspci", "-vmm", "-nn"]
SYS = Path("/")


@dataclass(frozen=True)
class HostFacts:
    """The raw facts, as read: None where a command or file is missing here."""

    lspci: str | None = None  # `lspci -vmm -nn` (plain `lspci -nn` lines parse too)
    iommu_groups: int | None = None  # entries of /sys/kernel/iommu_groups (None: no folder)
    gpu_iommu_types: dict[str, str] | None = None  # NVIDIA GPU bus id -> its group's type
    cmdline: str | None = None  # /proc/cmdline
    sys_vendor: str | None = None  # /sys/class/dmi/id/sys_vendor
    product_name: str | None = None  # /sys/class/dmi/id/product_name
    detect_virt: str | None = None  # `systemd-detect-virt --vm` ("none" on bare metal)
    cpu_hypervisor: bool | None = None  # the "hypervisor" flag in /proc/cpuinfo
    gpu_ids: str | None = None  # nvidia-smi --query-gpu=index,uuid,pci.bus_id
    topology: str | None = None  # nvidia-smi topo -m

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> HostFacts:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _gpu_iommu_types(root: Path) -> dict[str, str] | None:
    """Each NVIDIA display/3D controller's IOMMU group type (identity = passthrough;
    DMA or DMA-FQ = translated), from sysfs."""
    devices = root / "sys/bus/pci/devices"
    if not devices.is_dir():
        return None
    types = {}
    for device in sorted(devices.iterdir()):
        if _read(device / "vendor") != "0x10de" or not (_read(device / "class") or "").startswith(
            "0x03"
        ):
            continue
        kind = _read(device / "iommu_group" / "type")
        types[device.name] = kind or "none"
    return types


def _detect_virt() -> str | None:
    """`systemd-detect-virt --vm`: the hypervisor (kvm, vmware ...), or "none" (it exits 1
    then) on bare metal; --vm leaves containers out (doctor may run in one on a VM)."""
    if not shutil.which("systemd-detect-virt"):
        return None
    try:
        done = subprocess.run(
            ["systemd-detect-virt", "--vm"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def collect(root: Path = SYS) -> HostFacts:
    """Read this machine's facts (`root`: another file system tree, for a chroot)."""
    groups = root / "sys/kernel/iommu_groups"
    cpuinfo = _read(root / "proc/cpuinfo")
    return HostFacts(
        lspci=doctor.run_command(LSPCI, timeout_s=30),
        iommu_groups=len(list(groups.iterdir())) if groups.is_dir() else None,
        gpu_iommu_types=_gpu_iommu_types(root),
        cmdline=_read(root / "proc/cmdline"),
        sys_vendor=_read(root / "sys/class/dmi/id/sys_vendor"),
        product_name=_read(root / "sys/class/dmi/id/product_name"),
        detect_virt=_detect_virt(),
        cpu_hypervisor=None if cpuinfo is None else bool(re.search(r"\bhypervisor\b", cpuinfo)),
        gpu_ids=doctor.run_command(GPU_IDS_QUERY, timeout_s=30),
        topology=doctor.run_command(TOPOLOGY_QUERY, timeout_s=30),
    )


# --- parsing: pure functions of the facts ----------------------------------------------


@dataclass(frozen=True)
class Switch:
    slot: str
    device: str  # "c030"
    name: str  # "PEX890xx PCIe Gen 5 Switch"
    chip: str  # "PEX89144" when the subsystem names it, else ""

    @property
    def collapse_family(self) -> bool:
        return self.device in PEX890XX


_ID = re.compile(r"\[([0-9a-f]{4})\]\s*$")
_LINE = re.compile(
    r"^(?P<slot>\S+)\s.*?:\s(?P<name>.*?)\s*\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\]"
)


def _name(value: str) -> tuple[str, str]:
    """`PEX890xx PCIe Gen 5 Switch [c030]` -> (name, id)."""
    found = _ID.search(value)
    return (value[: found.start()].strip(), found.group(1)) if found else (value.strip(), "")


def summary(switches: list[Switch]) -> str:
    """`Broadcom PEX890xx PCIe Gen 5 Switch (PEX89144) [1000:c030]: 10 bridge functions
    (41:00.0, 42:00.0, ...)`, one clause per kind."""
    kinds: dict[tuple[str, str, str], list[str]] = {}
    for switch in switches:
        kinds.setdefault((switch.name, switch.chip, switch.device), []).append(switch.slot)
    clauses = []
    for (name, chip, device), slots in kinds.items():
        shown = ", ".join(slots[:3]) + (", ..." if len(slots) > 3 else "")
        chip_text = f" ({chip})" if chip else ""
        clauses.append(
            f"Broadcom {name}{chip_text} [{BROADCOM}:{device}]: {len(slots)} bridge "
            f"function(s) ({shown})"
        )
    return "; ".join(clauses)


def parse_switches(lspci: str | None) -> list[Switch]:
    """Broadcom PEX switches in `lspci -vmm -nn` records (or `lspci -nn` lines)."""
    if not lspci:
        return []
    switches = []
    if "Slot:" in lspci:
        for block in re.split(r"\n\s*\n", lspci.strip()):
            record = dict(
                (key.strip(), value.strip())
                for key, _, value in (line.partition(":") for line in block.splitlines())
                if value
            )
            vendor = _name(record.get("Vendor", ""))[1]
            name, device = _name(record.get("Device", ""))
            if vendor != BROADCOM or not device.startswith("c0"):
                continue
            chip = re.match(r"PEX\d+", _name(record.get("SDevice", ""))[0])
            switches.append(
                Switch(record.get("Slot", "?"), device, name, chip.group(0) if chip else "")
            )
        return switches
    for line in lspci.splitlines():
        found = _LINE.match(line.strip())
        if found and found["vendor"] == BROADCOM and found["device"].startswith("c0"):
            name = found["name"].split(": ", 1)[-1].replace("Broadcom / LSI ", "")
            switches.append(Switch(found["slot"], found["device"], name, ""))
    return switches


@dataclass(frozen=True)
class Virtualisation:
    in_vm: bool | None  # None: nothing said either way
    what: str


def virtualisation(facts: HostFacts) -> Virtualisation:
    vendor = " ".join(filter(None, (facts.sys_vendor, facts.product_name)))
    if facts.detect_virt and facts.detect_virt != "none":
        return Virtualisation(True, f"VM ({facts.detect_virt}; {vendor or 'vendor unknown'})")
    if re.search(r"QEMU|KVM|VMware|Xen|Microsoft Corporation|innotek|Proxmox", vendor, re.I):
        return Virtualisation(True, f"VM ({vendor})")
    if facts.cpu_hypervisor:
        return Virtualisation(True, f"VM (cpu flag hypervisor; {vendor or 'vendor unknown'})")
    if facts.detect_virt == "none" or facts.cpu_hypervisor is False:
        return Virtualisation(False, f"bare metal ({vendor or 'vendor unknown'})")
    return Virtualisation(None, "unknown (no DMI, systemd-detect-virt or cpuinfo here)")


@dataclass(frozen=True)
class Iommu:
    mode: str  # passthrough, translated, off, unknown
    why: str


def _cmdline_words(cmdline: str) -> dict[str, str]:
    return {key: value for key, _, value in (word.partition("=") for word in cmdline.split())}


def iommu(facts: HostFacts, vm: Virtualisation) -> Iommu:
    """The IOMMU mode the GPUs' peer traffic sees. In a VM that is the host's: vfio keeps a
    passed-through device in a translated domain whatever the host's iommu=pt says, so a
    vfio VM is translated (ANCHORS-serving §7), whatever the guest's own IOMMU does."""
    words = _cmdline_words(facts.cmdline or "")
    passthrough = words.get("iommu") == "pt" or words.get("iommu.passthrough") in ("1", "on")
    off = "off" in (words.get("iommu"), words.get("intel_iommu"), words.get("amd_iommu"))
    types = sorted(set((facts.gpu_iommu_types or {}).values()) - {"none"})
    guest = ""
    if types:
        guest = f"GPU group type {', '.join(types)}"
    elif facts.iommu_groups is not None:
        guest = f"{facts.iommu_groups} IOMMU groups"
    flags = " ".join(w for w in (facts.cmdline or "").split() if "iommu" in w) or "no iommu flag"
    if vm.in_vm:
        inside = f"; inside: {guest or 'no IOMMU'}, cmdline {flags}"
        return Iommu("translated", f"vfio VM: the host IOMMU translates the GPUs' DMA{inside}")
    if types:
        mode = "passthrough" if types == ["identity"] else "translated"
        return Iommu(mode, f"{guest} (cmdline: {flags})")
    if facts.iommu_groups == 0 or (facts.iommu_groups is None and off):
        return Iommu("off", f"no IOMMU groups (cmdline: {flags})")
    if facts.iommu_groups:
        mode = "passthrough" if passthrough else "translated"
        return Iommu(mode, f"{guest} (cmdline: {flags})")
    return Iommu("unknown", f"no /sys/kernel/iommu_groups here (cmdline: {flags})")


def parse_gpu_ids(text: str | None) -> list[tuple[int, str, str]]:
    """(index, UUID, bus id) per GPU from GPU_IDS_QUERY, in index order."""
    rows = []
    for line in (text or "").strip().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1], cells[2] if len(cells) > 2 else ""))
    return sorted(rows)


def topology_matrix(text: str | None) -> str:
    """`nvidia-smi topo -m`'s GPU-to-GPU links, normalised: `0-1 PHB;0-2 SYS;...` (CPU
    and NUMA affinity, NICs, legend and terminal escapes left out)."""
    if not text or not text.strip():
        return ""
    links = doctor.parse_topology(text)
    return ";".join(f"{a}-{b} {link}" for (a, b), link in sorted(links.items()) if a < b)


def topology_hash(text: str | None) -> str:
    return hashlib.sha256(topology_matrix(text).encode()).hexdigest()
