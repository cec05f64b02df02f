"""`builder doctor --p2p`'s judgement: the probe's measurements (builder/site/probes/p2p_probe.py)
and the host's facts (builder/site/p2p_host.py) in, checks, likely causes and the NCCL settings
out. Pure: recorded probe outputs (tests/data/p2p) exercise every branch.

What it looks for (../shared/ANCHORS-serving.md §1.5, §7):
- a collapsed pair: peer copies far below the machine's median, or below an absolute
  floor: the Broadcom PEX890xx posted-write collapse (about 37 -> 2.7 GB/s; rtx6kpro
  hardware/collapse-report.md, issues #25 and #32);
- a pair without peer access (FlashInfer's PCIe IPC all-reduce maps every peer's buffer);
- an NCCL all-reduce that hung or failed: with a translated IOMMU (a vfio VM always is),
  NCCL's P2P all-reduce hangs at 8+ GPUs (issue #15: ACS redirect with AMD-Vi translated).

What it chooses: the profile's NCCL_P2P_LEVEL when P2P is healthy; NCCL_P2P_DISABLE=1 when a
pair collapsed or an all-reduce hung or failed; the `-pcie-ar` profiles only with peer
access on every pair, no collapse, and FlashInfer's PCIe IPC all-reduce having run right.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from builder.site.p2p_host import (
    HostFacts,
    Iommu,
    Switch,
    iommu,
    parse_gpu_ids,
    parse_switches,
    summary,
    virtualisation,
)

COLLAPSE_SHARE = 0.25  # of the median over every direction of every pair
COLLAPSE_FLOOR_GBPS = 5.0  # PCIe Gen 3 x8 moves about 6 GB/s; RTX PRO 6000 (Gen 5) 25-50
P2P_DISABLE = "NCCL_P2P_DISABLE"
P2P_LEVEL = "NCCL_P2P_LEVEL"
# Every NCCL setting `_settings` can choose, and so all that launch applies from a record
# (builder/site/p2p_record.py refuses a record that sets or drops anything else): P2P off, and
# the profile's P2P level dropped with it.
NCCL_SETS = {P2P_DISABLE: ("1",)}
NCCL_UNSETS = (P2P_LEVEL,)
OK, FAIL, SKIP = "ok", "FAIL", "SKIP"

PEX_CAUSE = (
    "Broadcom PEX890xx posted-write P2P collapse: peer writes through the switch fall from "
    "about 37 to 2.7 GB/s (rtx6kpro hardware/collapse-report.md; issues #25, #32)"
)
IOMMU_CAUSE = (
    "IOMMU in translated mode (a vfio VM always is): it masks the PEX890xx collapse, but "
    "NCCL's P2P all-reduce hangs at 8+ GPUs and single-flow bandwidth drops about 15 % "
    "(collapse report; issue #15: ACS redirect with AMD-Vi translated)"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAIL or SKIP (what one GPU, or this host, cannot measure)
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    def to_json(self) -> dict:
        return {"check": self.name, "status": self.status, "ok": self.ok,
                "detail": self.detail, "fix": self.fix}  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """What `builder launch` applies from a record: NCCL variables to set and to drop, and
    whether the `-pcie-ar` profiles may start."""

    nccl_set: dict[str, str] = field(default_factory=dict)
    nccl_unset: tuple[str, ...] = ()
    nccl_why: str = ""
    pcie_ar_allowed: bool = False
    pcie_ar_why: str = ""

    def to_json(self) -> dict:
        return {
            "nccl": {"set": self.nccl_set, "unset": list(self.nccl_unset), "why": self.nccl_why},
            "pcie_ar": {"allowed": self.pcie_ar_allowed, "why": self.pcie_ar_why},
        }

    @classmethod
    def from_json(cls, data: dict) -> Settings:
        nccl, pcie_ar = data.get("nccl") or {}, data.get("pcie_ar") or {}
        return cls(
            nccl_set={str(k): str(v) for k, v in (nccl.get("set") or {}).items()},
            nccl_unset=tuple(str(k) for k in nccl.get("unset") or ()),
            nccl_why=str(nccl.get("why", "")),
            pcie_ar_allowed=pcie_ar.get("allowed") is True,
            pcie_ar_why=str(pcie_ar.get("why", "")),
        )

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        kept = {key: value for key, value in env.items() if key not in self.nccl_unset}
        return {**kept, **self.nccl_set}


@dataclass(frozen=True)
class Analysis:
    checks: tuple[Check, ...]
    causes: tuple[str, ...]
    settings: Settings
    verdict: str

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def to_json(self) -> dict:
        return {
            "checks": [check.to_json() for check in self.checks],
            "causes": list(self.causes),
            "settings": self.settings.to_json(),
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Direction:
    src: int
    dst: int
    gbps: float

    def name(self) -> str:
        return f"GPU{self.src}->GPU{self.dst}"


def directions(probe: dict) -> list[Direction]:
    found = []
    for pair in (probe.get("pairs") or {}).get("pairs") or []:
        ways = pair.get("bandwidth_gbps") or {}
        for way, (src, dst) in (("a_to_b", (pair["a"], pair["b"])),
                                ("b_to_a", (pair["b"], pair["a"]))):  # fmt: skip
            if isinstance(ways.get(way), int | float):
                found.append(Direction(src, dst, float(ways[way])))
    return found


def collapsed(found: list[Direction]) -> tuple[float, list[Direction]]:
    """The median GB/s, and each direction below COLLAPSE_SHARE of it or COLLAPSE_FLOOR_GBPS
    (a box whose every pair collapsed has a collapsed median)."""
    if not found:
        return 0.0, []
    median = statistics.median(d.gbps for d in found)
    limit = max(COLLAPSE_SHARE * median, COLLAPSE_FLOOR_GBPS)
    return median, sorted((d for d in found if d.gbps < limit), key=lambda d: d.gbps)


def _no_access(probe: dict) -> list[str]:
    refused = []
    for pair in (probe.get("pairs") or {}).get("pairs") or []:
        access = pair.get("peer_access") or {}
        ways = [w for w in ("a_to_b", "b_to_a") if access.get(w) is not True]
        if ways:
            refused.append(f"GPU{pair['a']}-GPU{pair['b']}")
    return refused


def _size(nbytes: int) -> str:
    return f"{nbytes // 1024} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):g} MiB"


def _timings(stage: dict) -> str:
    rows = [r for r in stage.get("results") or [] if "us" in r]
    return ", ".join(f"{_size(r['bytes'])} {r['us']:g} µs" for r in rows) or "no timings"


def _stage_broken(stage: dict) -> bool:
    return stage.get("status") in ("hung", "failed")


def _all_reduce_check(name: str, stage: dict, world: int, tp: int) -> Check:
    status = stage.get("status", "skipped")
    detail = stage.get("detail", "")
    if status == "skipped":
        module = stage.get("module") or {}
        if module.get("load"):
            where = module.get("aot_path") if module.get("is_aot") else "no kernel wheel entry"
            detail += f"; module load with JIT disabled: {module['load']} ({where})"
        return Check(name, SKIP, detail)
    if status == "hung":
        return Check(name, FAIL, f"hung at world {world}: {detail}")
    if status == "failed":
        return Check(name, FAIL, f"failed at world {world}: {detail}")
    short = f" (the profile runs TP {tp})" if world < tp else ""
    timings = f"world {world}{short}: {_timings(stage)}"
    if world < 2:
        return Check(name, SKIP, f"one GPU: ran at {timings}, no peer traffic")
    return Check(name, OK, f"{timings}, sums exact")


def analyse(probe: dict, facts: HostFacts, profile_env: dict[str, str], tp: int = 8) -> Analysis:
    """Checks, causes and settings for one machine."""
    checks: list[Check] = []
    vm = virtualisation(facts)
    mode = iommu(facts, vm)
    switches = parse_switches(facts.lspci)
    if not probe.get("cuda"):
        error = probe.get("error") or "the probe measured nothing"
        checks.append(Check("probe", SKIP, error, "run it where the GPUs and torch are: the "
                            "server image with --gpus all (NVIDIA container runtime)"))  # fmt: skip
        checks += _host_checks(vm.what, mode, switches, facts)
        settings = Settings(nccl_why=f"not measured ({error}): the profile's NCCL settings",
                            pcie_ar_why=f"not measured: {error}")  # fmt: skip
        return Analysis(tuple(checks), (), settings, f"could not measure: {error}")

    gpus = probe.get("gpus") or []
    count = len(gpus)
    names = sorted({g.get("name", "?") for g in gpus})
    checks.append(Check("probe", OK, f"{count} GPU(s) ({', '.join(names)}), torch "
                        f"{probe.get('torch')}, NCCL {probe.get('nccl')}"))  # fmt: skip
    checks.append(_order_check(gpus, facts))
    checks += _host_checks(vm.what, mode, switches, facts)

    pairs = probe.get("pairs") or {}
    found = directions(probe)
    median, slow = collapsed(found)
    refused = _no_access(probe)
    if count < 2:
        for name in ("peer access", "p2p bandwidth", "p2p latency"):
            checks.append(Check(name, SKIP, "one GPU: no pair to measure"))
    else:
        checks.append(
            Check("peer access", FAIL, f"no peer access between {', '.join(refused)}",
                  "on bare metal boot with iommu=pt; in Proxmox pass each GPU as a "
                  "PCI-Express device (q35) with All Functions; or serve without -pcie-ar")
            if refused else
            Check("peer access", OK, f"every pair of {count} GPUs, both ways")
        )  # fmt: skip
        checks.append(_bandwidth_check(pairs, found, median, slow))
        latencies = [
            value
            for pair in pairs.get("pairs") or []
            for value in (pair.get("latency_us") or {}).values()
            if isinstance(value, int | float)
        ]
        checks.append(
            Check("p2p latency", OK, f"4-byte copy: median {statistics.median(latencies):g} "
                  f"µs, worst {max(latencies):g} µs over {len(latencies)} directions")
            if latencies else Check("p2p latency", SKIP, "not measured")
        )  # fmt: skip

    reduce = probe.get("all_reduce") or {}
    world = int(probe.get("world") or count)
    nccl = reduce.get("nccl") or {}
    fallback = reduce.get("nccl_p2p_disabled") or {}
    ipc = reduce.get("pcie_ipc") or {}
    checks.append(_all_reduce_check("nccl all-reduce", nccl, world, tp))
    checks.append(_all_reduce_check("nccl all-reduce, P2P off", fallback, world, tp))
    checks.append(_all_reduce_check("pcie ipc all-reduce", ipc, world, tp))

    hung = _stage_broken(nccl) or _stage_broken(ipc) or _stage_broken(pairs)
    causes = _causes(slow, hung, mode, vm.in_vm, switches)
    settings = _settings(profile_env, count, refused, slow, median, pairs, nccl, ipc, world)
    verdict = _verdict(checks, settings, fallback)
    return Analysis(tuple(checks), tuple(causes), settings, verdict)


def _order_check(gpus: list[dict], facts: HostFacts) -> Check:
    host = [uuid for _, uuid, _ in parse_gpu_ids(facts.gpu_ids)]
    probed = [g.get("uuid") for g in gpus]
    if not host:
        return Check("gpu order", SKIP, "no GPU list from nvidia-smi on the host")
    if host == probed:
        return Check("gpu order", OK, f"the probe's GPUs are the host's {len(host)}, in order")
    return Check(
        "gpu order", FAIL,
        f"the probe saw {len(probed)} GPU(s) in another order than nvidia-smi's "
        f"{len(host)} (first: {probed[:1]} against {host[:1]})",
        "unset CUDA_VISIBLE_DEVICES, and give the container every GPU (--gpus all)",
    )  # fmt: skip


def _host_checks(what: str, mode: Iommu, switches: list[Switch], facts: HostFacts) -> list[Check]:
    checks = [Check("host", OK, what)]
    hint = ""
    if mode.mode == "translated":
        hint = (
            "a translated IOMMU can hide a PEX890xx collapse and costs about 15 % of peer "
            "bandwidth; on bare metal boot with iommu=pt (amd_iommu=on iommu=pt); a vfio "
            "VM cannot avoid it, so NCCL's all-reduce decides"
        )
    checks.append(Check("iommu", OK, f"{mode.mode}: {mode.why}", hint))
    if facts.lspci is None:
        checks.append(Check("pcie switches", SKIP, "lspci not found (apt-get install pciutils)"))
    elif switches:
        checks.append(Check("pcie switches", OK, summary(switches)))
    else:
        inside = " (in a VM lspci shows the VM's bridges: look on the Proxmox host)"
        checks.append(Check("pcie switches", OK, "no Broadcom PEX switch in lspci"
                            + (inside if "VM" in what else "")))  # fmt: skip
    return checks


def _bandwidth_check(
    pairs: dict, found: list[Direction], median: float, slow: list[Direction]
) -> Check:
    if pairs.get("status") in ("hung", "failed"):
        return Check(
            "p2p bandwidth", FAIL, f"peer copies {pairs['status']}: {pairs.get('detail')}",
            "a peer copy that does not finish is a broken P2P path: NCCL_P2P_DISABLE=1",
        )  # fmt: skip
    if not found:
        return Check("p2p bandwidth", SKIP, f"not measured ({pairs.get('detail', 'no pairs')})")
    low = min(found, key=lambda d: d.gbps)
    spread = (f"median {median:.1f} GB/s over {len(found)} directions, slowest "
              f"{low.name()} {low.gbps:.1f} GB/s")  # fmt: skip
    if not slow:
        return Check("p2p bandwidth", OK, spread)
    named = ", ".join(
        f"{d.name()} {d.gbps:.1f} GB/s ({d.gbps / median:.0%} of the median)" for d in slow[:4]
    )
    more = f" and {len(slow) - 4} more" if len(slow) > 4 else ""
    return Check(
        "p2p bandwidth", FAIL, f"collapsed: {named}{more}; {spread}",
        "NCCL_P2P_DISABLE=1 (launch applies it from the record); on a PEX890xx host ask "
        "the vendor for the switch firmware that fixes posted writes",
    )  # fmt: skip


def _causes(
    slow: list[Direction], hung: bool, mode: Iommu, in_vm: bool | None, switches: list[Switch]
) -> list[str]:
    causes = []
    family = [s for s in switches if s.collapse_family]
    if slow and family:
        chips = sorted({s.chip or s.name for s in family})
        causes.append(f"{PEX_CAUSE}; lspci shows {len(family)} of them ({', '.join(chips)})")
    elif slow and in_vm:
        causes.append(
            f"likely the {PEX_CAUSE}, if the Proxmox host has such switches (a VM cannot see "
            "them: run `lspci -nn -d 1000:c030` on the host)"
        )
    elif slow:
        causes.append(
            "one P2P path far slower than the rest, and no Broadcom PEX890xx switch in "
            "lspci: check that GPU's link (nvidia-smi -q -d PCIE: generation and width)"
        )
    if hung and mode.mode == "translated":
        causes.append(IOMMU_CAUSE)
    elif hung:
        causes.append(
            "a peer all-reduce hung or failed without a translated IOMMU: ACS redirect on "
            "the switch ports (issue #15) or a broken P2P path"
        )
    return causes


def _settings(
    profile_env: dict[str, str], count: int, refused: list[str], slow: list[Direction],
    median: float, pairs: dict, nccl: dict, ipc: dict, world: int,
) -> Settings:  # fmt: skip
    reasons = []
    if slow:
        d = slow[0]
        reasons.append(f"{d.name()} copies at {d.gbps:.1f} GB/s ({d.gbps / median:.0%} of "
                       f"the {median:.1f} GB/s median)")  # fmt: skip
    if _stage_broken(pairs):
        reasons.append(f"peer copies {pairs['status']} ({pairs.get('detail', '')})")
    if _stage_broken(nccl):
        reasons.append(f"NCCL's all-reduce {nccl['status']} at world {world}")
    if reasons:
        unset = (P2P_LEVEL,) if P2P_LEVEL in profile_env else ()
        nccl_set, nccl_why = {P2P_DISABLE: "1"}, "; ".join(reasons)
    else:
        unset, nccl_set = (), {}
        level = profile_env.get(P2P_LEVEL)
        nccl_why = (
            f"P2P healthy: the profile's {P2P_LEVEL}={level} kept"
            if level else "P2P healthy: the profile's NCCL settings kept"
        )  # fmt: skip
        if count < 2:
            nccl_why = "one GPU: nothing between GPUs to judge; the profile's NCCL settings kept"
    if count < 2:
        why = "one GPU: peer access and the PCIe IPC all-reduce not measured"
    elif refused:
        why = f"no peer access between {', '.join(refused[:4])}"
    elif slow or _stage_broken(pairs):
        why = f"collapsed pair: {reasons[0]}" if slow else reasons[0]
    elif ipc.get("status") != "ok":
        status = ipc.get("status", "not run")
        why = f"FlashInfer's PCIe IPC all-reduce {status}: {ipc.get('detail', '')}"
    else:
        why = f"peer access on every pair, no collapse, PCIe IPC all-reduce ran at world {world}"
    allowed = (
        count >= 2 and not refused and not slow and not _stage_broken(pairs)
        and ipc.get("status") == "ok"
    )  # fmt: skip
    return Settings(nccl_set, unset, nccl_why, allowed, why)


def _verdict(checks: list[Check], settings: Settings, fallback: dict) -> str:
    failed = [check.name for check in checks if not check.ok]
    nccl = ", ".join(f"{k}={v}" for k, v in settings.nccl_set.items()) or "the profile's settings"
    pcie_ar = "allowed" if settings.pcie_ar_allowed else f"refused ({settings.pcie_ar_why})"
    if settings.nccl_set and _stage_broken(fallback):
        state = "broken: NCCL fails with P2P off too; fix the host before serving"
    elif failed:
        state = f"degraded ({', '.join(failed)})"
    else:
        state = "healthy"
    return f"{state}; NCCL: {nccl}; -pcie-ar profiles: {pcie_ar}"
