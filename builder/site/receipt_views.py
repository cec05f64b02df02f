"""A qualify receipt as people read it: the report after a run, the plot, and receipts side
by side (`builder qualify --compare`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from builder.core import progress
from builder.core.errors import BuilderError

RECEIPT_SCHEMA = "builder-qualify-receipt/1"
# What the field measured by hand on 8x RTX PRO 6000, GLM-5-NVFP4 TP-8, flashinfer_cutlass
# MoE, 1024 concurrent requests: the line `--compare` draws receipts against.
FIELD_REFERENCE = {"concurrency": 1024, "output_throughput": 3740}


def report_lines(receipt: dict, path: Path, plot: Path | None) -> list[str]:
    """What a run found, a line per check, and where the receipt is."""
    lines = []
    startup = receipt["startup"] or {}
    if receipt["verify"]:
        lines.append(f"verify: {'ok' if receipt['verify']['ok'] else 'FAILED'}")
    seconds, since = startup.get("ready_seconds"), startup.get("ready_seconds_from")
    if seconds is not None:
        lines.append(f"ready {seconds:.0f} s after {since}")
    elif since:
        lines.append(f"ready; time to ready {since}")
    compiled = startup.get("compiled_at_start")
    if compiled:
        lines.append(
            "JIT compiles at start-up: "
            + ", ".join(
                f"{cache} {len(n) if n is not None else '?'}" for cache, n in compiled.items()
            )
        )
    correctness = receipt["correctness"] or {}
    for probe in correctness.get("probes") or []:
        answer = probe["answer"].strip()[:40]
        lines.append(f"{'ok  ' if probe['ok'] else 'FAIL'} probe {probe['name']}: {answer!r}")
    for needle in correctness.get("needles") or []:
        tokens = needle["prompt_tokens"] or needle["target_tokens"]
        lines.append(f"{'ok  ' if needle['ok'] else 'FAIL'} needle at {tokens} tokens")
    for gate in receipt.get("gates") or []:
        if gate["name"] in ("probes", "needle") and gate["status"] == "passed":
            continue  # each probe and needle has its line above
        mark = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip"}.get(gate["status"], "    ")
        why = f" ({gate['why']})" if gate["why"] and gate["status"] != "passed" else ""
        lines.append(f"{mark} gate {gate['name']}: {gate['result']}{why}")
    for skipped in receipt.get("not_checked") or []:
        lines.append(f"not checked: {skipped['what']} ({skipped['why']})")
    throughput = receipt["throughput"] or {}
    if throughput:
        why = f" ({throughput['client_why']})" if throughput.get("client_why") else ""
        lines.append(f"throughput client: {throughput['client']}{why}")
    for level in throughput.get("levels", []):
        gpu = level["gpu"]
        power = (
            "GPU power "
            + "/".join(f"{g['power_pct_of_limit_mean']:.0f}" for g in gpu["per_gpu"])
            + " % of limit"
            if gpu.get("sampled")
            else f"GPUs not sampled ({gpu.get('why')})"
        )
        lines.append(
            f"concurrency {level['concurrency']}: {level['output_throughput']} output tok/s, "
            f"{level['request_throughput']} req/s, TTFT p50 {level['ttft_ms']['p50']} ms, "
            f"TPOT p50 {level['tpot_ms']['p50']} ms; {power}"
        )
    for level in throughput.get("prefill") or []:
        if "skipped" in level:
            lines.append(f"prefill {level['input_len']} tokens: skipped, {level['skipped']}")
        else:
            lines.append(
                f"prefill {level['input_len']} tokens: TTFT p50 {level['ttft_ms']['p50']} ms, "
                f"{level['prefill_tok_s']} tok/s"
            )
    result = receipt["result"]
    if result["ok"]:
        lines.append(f"qualified: {result['message']}")
    elif result.get("verdict") == "partial":
        lines.append(f"partial, not qualified: {result['message']}")
    else:
        lines.append(f"NOT qualified: {result['failed_at']}: {result['message']}")
    lines.append(f"receipt: {path}" + (f" (plot: {plot})" if plot else ""))
    return lines


@functools.cache
def _pyplot() -> Any:
    """matplotlib's pyplot for PNG files, or None; a missing matplotlib is said once per
    run (a sweep plots each profile's receipt and the comparison)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress.warn("no plot: matplotlib is not installed (pip install 'builder[plot]')")
        return None
    return plt


def plot(receipt: dict, path: Path) -> Path | None:
    """Output tok/s and mean GPU power against concurrency, as PNG (needs matplotlib)."""
    plt = _pyplot()
    if plt is None:
        return None
    levels = receipt["throughput"]["levels"]
    x = [level["concurrency"] for level in levels]
    figure, tokens = plt.subplots(figsize=(7, 4))
    tokens.plot(x, [level["output_throughput"] for level in levels], "o-", label="output tok/s")
    field = f"field: {FIELD_REFERENCE['output_throughput']:,} tok/s at 1024"
    tokens.axhline(FIELD_REFERENCE["output_throughput"], ls=":", c="grey", label=field)
    tokens.set_xscale("log", base=2)
    tokens.set_xticks(x, [str(c) for c in x])
    tokens.set_xlabel("concurrency")
    tokens.set_ylabel("output tok/s")
    power = [
        sum(g["power_w_mean"] for g in level["gpu"]["per_gpu"])
        for level in levels
        if level["gpu"].get("sampled")
    ]
    if len(power) == len(levels):
        watts = tokens.twinx()
        watts.plot(x, power, "s--", c="tab:red", label="GPU power (W, all GPUs)")
        watts.set_ylabel("W")
    tokens.legend(loc="upper left")
    tokens.set_title(f"qualify {receipt['server']['url']} {receipt['created']}")
    figure.tight_layout()
    figure.savefig(path.with_suffix(".partial.png"))
    plt.close(figure)
    path.with_suffix(".partial.png").replace(path)
    return path


def _load(path: Path) -> dict:
    try:
        receipt = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise BuilderError(f"--compare {path}: not a readable receipt ({exc})") from None
    if not isinstance(receipt, dict) or receipt.get("schema") != RECEIPT_SCHEMA:
        raise BuilderError(f"--compare {path}: not a {RECEIPT_SCHEMA} receipt")
    return receipt


def expand(paths: list[str]) -> list[tuple[str, dict]]:
    """(column name, receipt) of each receipt given, a sweep's folder giving its receipts
    in --sweep order; a receipt is named by its folder (a sweep's: the profile)."""
    from builder.site.sweep import receipts_in

    found = []
    for given in paths:
        path = Path(given)
        found += receipts_in(path) if path.is_dir() else [path]
    named = [(path.parent.name or str(path), _load(path)) for path in found]
    if len(named) < 2:
        raise BuilderError("--compare: give two receipts or more (or a sweep's folder)")
    return named


def _gate_cell(receipt: dict, name: str) -> str:
    gate = next((g for g in receipt.get("gates") or [] if g["name"] == name), None)
    if gate is None:
        return "-"
    if gate["status"] == "passed":
        return f"ok {gate['result']}"
    return {"failed": "FAIL", "skipped": "skip"}.get(gate["status"], "") + f" {gate['result']}"


def compare(named: list[tuple[str, dict]]) -> tuple[list[str], list[list[str]]]:
    """Receipts side by side: (column headers, rows of cells): the result, each gate, each
    level's figures, each prefill length, the field's figure last."""
    receipts = [receipt for _, receipt in named]
    levels = sorted(
        {lvl["concurrency"] for r in receipts for lvl in (r["throughput"] or {}).get("levels", [])}
    )
    by_level = [
        {lvl["concurrency"]: lvl for lvl in (r["throughput"] or {}).get("levels", [])}
        for r in receipts
    ]
    header = ["", *(name for name, _ in named)]
    rows = [
        ["profile", *(r["server"].get("profile") or "-" for r in receipts)],
        ["result", *(_result_cell(r["result"]) for r in receipts)],
    ]  # fmt: skip
    gate_names = [g["name"] for r in receipts for g in r.get("gates") or []]
    for name in dict.fromkeys(gate_names):
        rows.append([f"gate {name}", *(_gate_cell(r, name) for r in receipts)])
    for level in levels:
        for key, label in (
            ("output_throughput", "tok/s"),
            ("ttft_ms", "TTFT p50 ms"),
            ("tpot_ms", "TPOT p50 ms"),
        ):
            cells = []
            for levels_of in by_level:
                value = levels_of.get(level, {}).get(key)
                cells.append(
                    "-"
                    if value is None
                    else str(value["p50"] if isinstance(value, dict) else value)
                )
            rows.append([f"c={level} {label}", *cells])
    prefill = [
        {p["input_len"]: p for p in (r["throughput"] or {}).get("prefill") or [] if "ttft_ms" in p}
        for r in receipts
    ]
    for length in sorted({length for of in prefill for length in of}):
        cells = [str(of[length]["ttft_ms"]["p50"]) if length in of else "-" for of in prefill]
        rows.append([f"prefill {length} TTFT p50 ms", *cells])
    reference = FIELD_REFERENCE
    rows.append(
        [
            f"field c={reference['concurrency']} tok/s",
            *[str(reference["output_throughput"])] * len(receipts),
        ]
    )
    return header, rows


def plot_compare(named: list[tuple[str, dict]], path: Path) -> Path | None:
    """Output tok/s against concurrency, a line per receipt (dashed: it did not qualify),
    the field's figure for reference (needs matplotlib)."""
    plt = _pyplot()
    if plt is None:
        return None
    figure, axes = plt.subplots(figsize=(8, 4.5))
    ticks: set[int] = set()
    for name, receipt in named:
        levels = [
            lvl for lvl in (receipt["throughput"] or {}).get("levels", []) if lvl["completed"]
        ]
        if not levels:
            continue
        x = [lvl["concurrency"] for lvl in levels]
        ticks.update(x)
        ok = receipt["result"]["ok"]
        label = name if ok else f"{name} ({_result_cell(receipt['result'])})"
        y = [lvl["output_throughput"] for lvl in levels]
        axes.plot(x, y, "o-" if ok else "x--", label=label)
    field = f"field: {FIELD_REFERENCE['output_throughput']:,} tok/s at 1024"
    axes.axhline(FIELD_REFERENCE["output_throughput"], ls=":", c="grey", label=field)
    axes.set_xscale("log", base=2)
    if ticks:
        axes.set_xticks(sorted(ticks), [str(c) for c in sorted(ticks)])
    axes.set_xlabel("concurrency")
    axes.set_ylabel("output tok/s")
    axes.legend(loc="upper left", fontsize="small")
    axes.set_title("qualify: profiles compared")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path.with_suffix(".partial.png"))
    plt.close(figure)
    path.with_suffix(".partial.png").replace(path)
    return path


def _result_cell(result: dict) -> str:
    if result["ok"]:
        return "ok"
    return "partial" if result.get("verdict") == "partial" else f"FAIL {result['failed_at']}"
