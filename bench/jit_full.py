"""Compile a target's full FlashInfer JIT list, one module at a time, and record each one.

Runs images/<target>/jit_warmup.py (the image's own warm-up) once per module with every
core, so each module's time is its own. Meant for a many-core machine (the lent GPU
machine): one call per module fits its 10-minute limit, and the workspace folder is kept
between calls so a module compiled earlier is not compiled again.

    # on the compile machine, with the patched flashinfer wheel importable:
    python bench/jit_full.py compile --target sm120 --workspace .jitwork \\
        --module flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module --out $OUT
    # here, once every module has a record:
    python bench/jit_full.py merge --target sm120 RECORD.json... --machine "32 cores" \\
        --result bench/results/jit-sm120-full.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def target_jit(target: str) -> dict:
    return tomllib.loads((ROOT / "images" / target / "target.toml").read_text())


def listed_generators(target: str) -> list[str]:
    return [module["generator"] for module in target_jit(target)["jit"]["modules"]]


def record_name(module: str) -> str:
    """A file name for one list entry: its generator plus a hash of its arguments."""
    function = module.partition(":")[2].partition("(")[0]
    return f"{function}-{hashlib.sha256(module.encode()).hexdigest()[:8]}"


def compile_module(target: str, module: str, workspace: Path, out: Path) -> dict:
    definition = target_jit(target)
    env = {
        **os.environ,
        "FLASHINFER_WORKSPACE_BASE": str(workspace.resolve()),
        "FLASHINFER_CUDA_ARCH_LIST": " ".join(definition["cuda"]["arch_list"]),
        "FLASHINFER_DISABLE_VERSION_CHECK": "1",
    }
    inventory = workspace / "inventories" / f"{record_name(module)}.json"
    command = [
        sys.executable, str(ROOT / "images" / target / "jit_warmup.py"), "--modules", json.dumps([module]),
        "--jobs", str(len(os.sched_getaffinity(0))),
        "--job-memory-gb", str(definition["jit"]["job_memory_gb"]), "--inventory", str(inventory),
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    sys.stdout.write(completed.stdout)
    if completed.returncode:
        record = {"module": module, "failed": completed.stderr[-4000:]}
    else:
        found = json.loads(inventory.read_text())
        record = {**found["modules"][0], "nvcc_version": found["nvcc_version"]}
        record["jobs"] = found["jobs"]
    import flashinfer

    record["flashinfer_version"] = flashinfer.__version__
    out.mkdir(parents=True, exist_ok=True)
    (out / f"jit-{record_name(module)}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return record


def merge(target: str, records: list[Path], result: Path, machine: str) -> None:
    listed = listed_generators(target)
    by_module = {}
    for path in records:
        record = json.loads(path.read_text())
        by_module[record["module"]] = record
    missing = [m for m in listed if m not in by_module]
    if missing:
        sys.exit(f"no record for {missing}")
    modules = [by_module[m] for m in listed]

    def row(m: dict) -> dict:
        return {
            "module": m["module"],
            "name": m.get("name"),
            "so_bytes": m.get("size"),
            "seconds": m.get("compile_seconds"),
            "device_code": (m.get("arch") or "host-only") if "failed" not in m else None,
            "nvcc_version": m.get("nvcc_version"),
            "jobs": m.get("jobs"),
            **({"failed": m["failed"]} if "failed" in m else {}),
        }

    summary = {
        "target": target,
        "machine": machine,
        "arch_list": target_jit(target)["cuda"]["arch_list"],
        "flashinfer_version": modules[0]["flashinfer_version"],
        "nvcc_versions": sorted({m.get("nvcc_version", "?") for m in modules}),
        "modules": [row(m) for m in modules],
        # Measured too, though nothing loads them under the target's profiles.
        "not_listed": [row(m) for name, m in by_module.items() if name not in listed],
        "total_seconds": round(sum(m.get("compile_seconds", 0) for m in modules), 1),
    }
    result.write_text(json.dumps(summary, indent=2) + "\n")
    for m in summary["modules"] + summary["not_listed"]:
        print(
            f"{m['name'] or m['module']:28} {m['seconds']!s:>7} s  {m['so_bytes']!s:>10} B  "
            f"{m['device_code']}"
        )
    print(f"total {summary['total_seconds']} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="compile modules, one at a time")
    compile_parser.add_argument("--target", default="sm120")
    compile_parser.add_argument("--workspace", type=Path, required=True)
    compile_parser.add_argument("--module", action="append", help="default: the whole list")
    compile_parser.add_argument("--out", type=Path, required=True)
    merge_parser = commands.add_parser("merge", help="one result file from per-module records")
    merge_parser.add_argument("--target", default="sm120")
    merge_parser.add_argument("records", nargs="+", type=Path)
    merge_parser.add_argument("--result", type=Path, required=True)
    merge_parser.add_argument("--machine", required=True, help="where the records were made")
    args = parser.parse_args()
    if args.command == "compile":
        for module in args.module or listed_generators(args.target):
            compile_module(args.target, module, args.workspace, args.out)
    else:
        merge(args.target, args.records, args.result, args.machine)


if __name__ == "__main__":
    main()
