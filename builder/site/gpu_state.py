"""The GPUs while a server is under load, read with NVML (nvidia-ml-py, the driver's own
library): model, driver, the peer-to-peer matrix, and per GPU power, SM clock, utilisation
and memory sampled on a thread, so "the GPUs sat at 42 % of their power limit" is in the
receipt without a second terminal. Without NVML (no driver, no GPU) it says why, once.
"""

from __future__ import annotations

import statistics
import threading
from types import ModuleType


def _nvml() -> ModuleType:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    return pynvml


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def describe(nvml: ModuleType | None = None) -> dict:
    """GPU model, power limit and memory per device, driver, and P2P read support per pair
    ("OK" or NVML's reason). `{"available": False, "why": ...}` without NVML."""
    try:
        nvml = nvml or _nvml()
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = [
            {
                "index": i,
                "name": _text(nvml.nvmlDeviceGetName(h)),
                "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                "memory_gib": round(nvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
            }
            for i, h in enumerate(handles)
        ]
        p2p = [
            [
                "X"
                if a == b
                else _P2P.get(
                    nvml.nvmlDeviceGetP2PStatus(ha, hb, nvml.NVML_P2P_CAPS_INDEX_READ), "no"
                )
                for b, hb in enumerate(handles)
            ]
            for a, ha in enumerate(handles)
        ]
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception as exc:  # ImportError, NVMLError_*: no GPU state, said once
        return {"available": False, "why": f"NVML: {exc}" if str(exc) else type(exc).__name__}
    return {"available": True, "driver": driver, "devices": devices, "p2p_read": p2p}


# nvmlGpuP2PStatus_t
_P2P = {
    0: "OK",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by registry key",
    5: "not supported",
    6: "unknown",
}


class Sampler:
    """Samples every GPU each `interval` seconds between start() and stop()."""

    def __init__(self, interval: float = 1.0, nvml: ModuleType | None = None) -> None:
        self.interval, self._nvml = interval, nvml
        self.samples: list[list[dict]] = []
        self.why_not = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        try:
            self._nvml = self._nvml or _nvml()
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self.why_not = f"NVML: {exc}" if str(exc) else type(exc).__name__
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _read(self, handle) -> dict:
        nvml = self._nvml
        return {
            "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
            "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "utilisation_pct": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "memory_used_gib": nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30,
        }

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append([self._read(h) for h in self._handles])
            except Exception as exc:
                self.why_not = f"NVML: {exc}"
                return
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        """Per GPU: mean and peak power (and as % of its limit), mean SM clock and
        utilisation, peak memory over the samples taken."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        if not self.samples:
            return {"sampled": False, "why": self.why_not or "no sample taken"}
        per_gpu = []
        for index in range(len(self.samples[0])):
            rows = [sample[index] for sample in self.samples]
            power = [r["power_w"] for r in rows]
            limit = rows[-1]["power_limit_w"] or 1
            per_gpu.append(
                {
                    "index": index,
                    "power_w_mean": round(statistics.fmean(power), 1),
                    "power_w_peak": round(max(power), 1),
                    "power_pct_of_limit_mean": round(100 * statistics.fmean(power) / limit, 1),
                    "sm_clock_mhz_mean": round(statistics.fmean(r["sm_clock_mhz"] for r in rows)),
                    "utilisation_pct_mean": round(
                        statistics.fmean(r["utilisation_pct"] for r in rows), 1
                    ),
                    "memory_used_gib_peak": round(max(r["memory_used_gib"] for r in rows), 1),
                }
            )
        return {"sampled": True, "samples": len(self.samples), "per_gpu": per_gpu}


def measure(interval: float = 1.0) -> Sampler:
    """A started sampler (a no-op one, saying why, where NVML is missing)."""
    return Sampler(interval).start()
