"""`builder doctor`: is this GPU VM ready to run the target's image? Each finding has a fix.

Parsing is separate from running commands, so captured `nvidia-smi` output (tests/data)
exercises every check without a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from packaging.version import Version

from builder.core.errors import BuilderError
from builder.core.untrusted import printable

GPU_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,compute_cap,memory.total,driver_version",
    "--format=csv,noheader,nounits",
]
# The oldest Linux driver each CUDA minor needs (CUDA toolkit release notes, table 3).
# As NVIDIA writes them (Version would print 580.65.06 as 580.65.6).
MIN_DRIVER_FOR_CUDA = {
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
MIN_SHM_BYTES = 16 << 30


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""
    skipped: bool = False  # could not be checked (detail says why); never ok

    @property
    def status(self) -> str:
        """ok, FAIL or SKIP, as doctor --p2p prints them."""
        return "SKIP" if self.skipped else "ok" if self.ok else "FAIL"

    def to_json(self) -> dict:
        return {"check": self.check, "ok": self.ok, "status": self.status,
                "detail": self.detail, "fix": self.fix}  # fmt: skip


def skipped(check: str, why: str, fix: str = "") -> Finding:
    """A check that could not run: not a failure, not a pass."""
    return Finding(check, False, f"not checked: {why}", fix, skipped=True)


def verdict(findings: list[Finding]) -> tuple[str, int]:
    """The last line and the exit code: 1 when a check failed, 9 when one could not be
    checked and none failed, 0 when every check passed."""
    failed = [f.check for f in findings if f.status == "FAIL"]
    skipped_ = [f.check for f in findings if f.skipped]
    passed = len(findings) - len(failed) - len(skipped_)
    counts = f"{passed} ok, {len(failed)} failed, {len(skipped_)} not checked"
    if failed:
        return f"verdict: NOT ready ({counts}): failed: {', '.join(failed)}", 1
    if skipped_:
        return f"verdict: unknown ({counts}): not checked: {', '.join(skipped_)}", 9
    return f"verdict: ready ({counts})", 0


def parse_gpus(text: str) -> list[Gpu]:
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, name, cap, memory, driver = fields
        gpus.append(Gpu(int(index), name, cap, int(float(memory)), driver))
    return gpus


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m`: the link type between each pair of GPUs (NV#, PIX, PHB, SYS...)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header on a tty
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split()
    gpu_columns = [i for i, name in enumerate(header) if re.fullmatch(r"GPU\d+", name)]
    links: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for column in gpu_columns:
            col = int(header[column][3:])
            if row != col and column + 1 < len(cells):
                links[(row, col)] = cells[column + 1]
    return links


def check_gpus(
    gpus: list[Gpu], compute_cap: str, count: int, min_memory_gib: float
) -> list[Finding]:
    findings = []
    matching = [g for g in gpus if g.compute_cap == compute_cap]
    names = sorted({g.name for g in gpus}) or ["none"]
    findings.append(
        Finding(
            "gpu count",
            len(matching) >= count,
            f"{len(matching)} GPU(s) with compute capability {compute_cap} ({', '.join(names)}); "
            f"the profile needs {count}",
            ""
            if len(matching) >= count
            else "pass all GPUs through to this VM (Proxmox: PCI device, All Functions, "
            "PCI-Express, ROM-Bar) and check `nvidia-smi -L`",
        )
    )
    others = [g for g in gpus if g.compute_cap != compute_cap]
    if others:
        findings.append(
            Finding(
                "compute capability",
                False,
                "GPU(s) "
                + ", ".join(f"{g.index} ({g.name}, {g.compute_cap})" for g in others)
                + f" are not {compute_cap}: this image's kernels are built for {compute_cap} only",
                "use the target built for these GPUs, or hide them with CUDA_VISIBLE_DEVICES",
            )
        )
    small = [g for g in matching if g.memory_mib < min_memory_gib * 1024]
    findings.append(
        Finding(
            "gpu memory",
            not small and bool(matching),
            "per GPU: "
            + ", ".join(sorted({f"{g.memory_mib / 1024:.0f} GiB" for g in matching}) or ["-"])
            + f" (profile needs >= {min_memory_gib:g} GiB)",
            "" if not small else "use GPUs with more memory or a smaller model/profile",
        )
    )
    return findings


def check_driver(gpus: list[Gpu], cuda_version: Version) -> Finding:
    minimum = MIN_DRIVER_FOR_CUDA.get(f"{cuda_version.major}.{cuda_version.minor}")
    drivers = sorted({g.driver for g in gpus})
    if not drivers:
        return Finding("driver", False, "no NVIDIA driver answered", "install the NVIDIA driver")
    if minimum is None:
        return Finding(
            "driver", True, f"driver {drivers[0]}; no known minimum for CUDA {cuda_version}"
        )
    old = [d for d in drivers if Version(d) < Version(minimum)]
    return Finding(
        "driver",
        not old,
        f"driver {', '.join(drivers)}; CUDA {cuda_version.major}.{cuda_version.minor} "
        f"needs >= {minimum}",
        "" if not old else f"upgrade the NVIDIA driver in the VM to {minimum} or newer",
    )


def check_topology(links: dict[tuple[int, int], str]) -> Finding:
    kinds = sorted(set(links.values()))
    if not links:
        return Finding("topology", True, "single GPU or no topology reported")
    nvlink = all(k.startswith("NV") for k in kinds)
    if nvlink:
        return Finding("topology", True, "all GPU pairs on NVLink")
    return Finding(
        "topology",
        True,
        f"GPU links: {', '.join(kinds)} (PCIe, no NVLink): allreduce goes over PCIe",
        "keep NCCL_P2P_LEVEL=PHB and NCCL_IB_DISABLE=1 (the profile sets them); in Proxmox, "
        "GPUs behind one PCIe switch (PIX) allreduce faster than across sockets (SYS)",
    )


P2P_QUERY = ["nvidia-smi", "topo", "-p2p", "r"]  # peer reads between every GPU pair


def check_peer_access(status: dict[tuple[int, int], str], needed: int) -> Finding:
    """FlashInfer's PCIe IPC all-reduce maps every peer's buffer (cudaIpc, lazy peer access):
    each pair of the first `needed` GPUs must read its peer (`nvidia-smi topo -p2p r`: OK)."""
    pairs = {pair: value for pair, value in status.items() if max(pair) < needed}
    refused = sorted(f"GPU{a}-GPU{b} {value}" for (a, b), value in pairs.items() if value != "OK")
    if not pairs and needed > 1:
        refused = ["no peer matrix from nvidia-smi"]
    more = " ..." if len(refused) > 4 else ""
    outcome = f"refused for {', '.join(refused[:4])}{more}" if refused else "OK for every pair"
    return Finding(
        "peer access",
        not refused,
        f"peer reads between {needed} GPUs: {outcome}",
        ""
        if not refused
        else "the -pcie-ar profile needs GPU peer access: on the Proxmox host boot with "
        "iommu=pt (intel_iommu=on iommu=pt / amd_iommu=on iommu=pt) and pass the GPUs as "
        "PCI-Express devices; or use the profile without -pcie-ar (NCCL)",
    )


def check_shm(free_bytes: int) -> Finding:
    return Finding(
        "shm",
        free_bytes >= MIN_SHM_BYTES,
        f"/dev/shm {free_bytes / (1 << 30):.1f} GiB",
        ""
        if free_bytes >= MIN_SHM_BYTES
        else "the launch command uses --ipc=host; if you cannot, give the container --shm-size 32g",
    )


def check_runtime(docker_info: dict | None, why: str = "Docker engine not reachable") -> Finding:
    if docker_info is None:
        return skipped(
            "container runtime",
            why,
            "install docker.io and start it (systemctl enable --now docker)",
        )
    runtimes = sorted((docker_info.get("Runtimes") or {}).keys())
    ok = (
        "nvidia" in runtimes
        or bool(shutil.which("nvidia-container-runtime-hook"))
        or bool(shutil.which("nvidia-ctk"))
    )
    return Finding(
        "container runtime",
        ok,
        f"Docker runtimes: {', '.join(runtimes) or 'none'}",
        ""
        if ok
        else "install nvidia-container-toolkit, then `nvidia-ctk runtime configure "
        "--runtime=docker` and restart docker (needed for --gpus all)",
    )


def require_gpu_runtime(docker_info: dict) -> None:
    """Before a `docker run --gpus all`: the NVIDIA container runtime as `check_runtime` sees
    it, or one line with its fix (docker's own error names a device driver, not the cause)."""
    finding = check_runtime(docker_info)
    if not finding.ok:
        raise BuilderError(
            f"container runtime: no NVIDIA runtime for --gpus all ({finding.detail}); {finding.fix}"
        )


# What docker prints under its error: "Run 'docker run --help' for more information" (as
# of docker 25), "See 'docker run --help'." (before).
_DOCKER_HELP_HINT = re.compile(r"(Run|See) '[^']*--help'( for more information)?\.?")


def docker_failure(stderr: str, last: int = 3) -> str:
    """Why a `docker run` (or another docker command) failed, from its stderr: its `docker:`
    and `Error` lines, else its last few lines; never only the `Run 'docker run --help'`
    hint docker prints under the cause. Outside text: control characters escaped."""
    lines = [line.strip() for line in stderr.splitlines()]
    said = [line for line in lines if line and not _DOCKER_HELP_HINT.fullmatch(line)]
    errors = [line for line in said if line.startswith(("docker:", "Error"))]
    return printable(" | ".join(errors or said[-last:]) or "no message", 600)


def check_image(reference: str, present: bool) -> Finding:
    return Finding(
        "image",
        present,
        f"{reference} {'present' if present else 'not present'}",
        "" if present else f"docker pull {reference}",
    )


def run_command(command: list[str], timeout_s: float = 60) -> str | None:
    """The command's output, or None when it is missing, fails or hangs (a GPU that has
    fallen off the bus makes nvidia-smi hang: that is a finding, not a crash)."""
    if not shutil.which(command[0]):
        return None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    return result.stdout if result.returncode == 0 else None


def shm_free_bytes(path: str = "/dev/shm") -> int:
    try:
        stat = os.statvfs(path)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize
