"""A qualify receipt as people read it: the report after a run, the plot, and receipts side
by side (`builder qualify --compare`)."""

from __future__ import annotations

import json
from pathlib import Path

from builder import progress
from builder.errors import BuilderError

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
    result = receipt["result"]
    lines.append(
        "qualified: every check passed"
        if result["ok"]
        else f"NOT qualified: {result['failed_at']}: {result['message']}"
    )
    lines.append(f"receipt: {path}" + (f" (plot: {plot})" if plot else ""))
    return lines


def plot(receipt: dict, path: Path) -> Path | None:
    """Output tok/s and mean GPU power against concurrency, as PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress.warn("no plot: matplotlib is not installed (pip install 'builder[plot]')")
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


def _load(path: str) -> dict:
    try:
        receipt = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BuilderError(f"--compare {path}: not a readable receipt ({exc})") from None
    if receipt.get("schema") != RECEIPT_SCHEMA:
        raise BuilderError(f"--compare {path}: not a {RECEIPT_SCHEMA} receipt")
    return receipt


def compare(paths: list[str]) -> tuple[list[str], list[list[str]]]:
    """Receipts side by side: (column headers, rows of cells), the field's figure last."""
    receipts = [(path, _load(path)) for path in paths]
    if len(receipts) < 2:
        raise BuilderError("--compare: give two receipts or more")
    levels = sorted(
        {
            lvl["concurrency"]
            for _, r in receipts
            for lvl in (r["throughput"] or {}).get("levels", [])
        }
    )
    by_level = [
        {lvl["concurrency"]: lvl for lvl in (r["throughput"] or {}).get("levels", [])}
        for _, r in receipts
    ]
    header = ["", *(Path(p).parent.name or p for p, _ in receipts)]
    rows = [
        ["profile", *(r["server"].get("profile") or "-" for _, r in receipts)],
        [
            "result",
            *(
                "ok" if r["result"]["ok"] else f"FAIL {r['result']['failed_at']}"
                for _, r in receipts
            ),
        ],
    ]
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
    reference = FIELD_REFERENCE
    rows.append(
        [
            f"field c={reference['concurrency']} tok/s",
            *[str(reference["output_throughput"])] * len(receipts),
        ]
    )
    return header, rows
