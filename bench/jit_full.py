"""Compile a FlashInfer JIT module list, one module at a time, and record each one.

Runs images/<target>/jit_warmup.py (the image's own warm-up) once per module with every
core, so each module's time is its own. Meant for a many-core machine (the lent GPU
machine, used as a compile box: nothing here touches the GPU). A call has a deadline: the
module compiling when it passes is stopped (ninja removes what it was writing) and its
time so far is kept in the workspace, so the next call with the same workspace resumes
that module where ninja left it and adds the times; modules already recorded are skipped.
Every call writes all records so far to <out>/jit-records.json.

    # on the compile machine, flashinfer (+ apache-tvm-ffi) importable, nvcc on PATH:
    python bench/jit_full.py compile --set sm120-current --arch 12.0f \\
        --workspace .devwork/jit --out $OUT --deadline 540
    # here, from the records that came back:
    python bench/jit_full.py merge --set sm120-current jit-records.json... \\
        --machine "lent nvidia-h200-x2, 32 cores" --result bench/results/jit-sm120-current.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Named lists. sm120-current: what a GLM-5-NVFP4 TP-8 server on SM120 loads with sglang
# 0.5.23 and flashinfer 0.7.2 (../shared/UPSTREAM-current.md §4; sparse MLA, cutlass fused
# MoE, NVFP4 quantisation and GEMM, DSv3 routing, sampling, the opt-in PCIe IPC
# all-reduce, the fusion profile's trtllm_comm), each generator called as flashinfer's own
# loader calls it. Largest first: fused_moe_120 gets a call to itself, and a call that runs
# out of time stops a small one.
SETS = {
    "sm120-current": [
        "flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module",
        "flashinfer.jit.mla:gen_sparse_mla_sm120_module",
        "flashinfer.jit.gemm:gen_gemm_sm120_module_cutlass_fp4",
        "flashinfer.jit.comm:gen_trtllm_comm_module",
        "flashinfer.jit.sampling:gen_sampling_module",
        "flashinfer.jit.dsv3_optimizations:gen_dsv3_fused_routing_module",
        "flashinfer.jit.fp4_quantization:gen_fp4_quantization_sm120f_module",
        "flashinfer.jit.comm:gen_pcie_ipc_comm_module",
    ],
}


def target_jit(target: str) -> dict:
    return tomllib.loads((ROOT / "images" / target / "target.toml").read_text())


def listed_generators(target: str) -> list[str]:
    return [module["generator"] for module in target_jit(target)["jit"]["modules"]]


def record_name(module: str) -> str:
    """A file name for one list entry: its generator plus a hash of its arguments."""
    function = module.partition(":")[2].partition("(")[0]
    return f"{function}-{hashlib.sha256(module.encode()).hexdigest()[:8]}"


def host_facts() -> dict:
    import flashinfer

    cores = len(os.sched_getaffinity(0))
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except OSError:
        gpus = ""
    return {
        "cores": cores,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "gpus": [line.split(" (UUID")[0] for line in gpus.splitlines() if line.strip()],
        "flashinfer_version": flashinfer.__version__,
        "flashinfer_file": flashinfer.__file__,
    }


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc): the ninja processes the warm-up started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _stop(process: subprocess.Popen) -> None:
    """Stop a warm-up at the deadline. Its ninja runs in its own session: SIGTERM to ninja
    makes it stop its compile jobs and delete the outputs they were writing, so the next
    ninja run redoes only those."""
    for child in _children(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def object_counts(build_dir: Path) -> dict:
    ninja = build_dir / "build.ninja"
    if not ninja.is_file():
        return {}
    edges = re.findall(r"^build (\S+\.o): ", ninja.read_text(), flags=re.M)
    return {"objects": len(edges), "objects_built": sum(Path(e).is_file() for e in edges)}


def compile_module(
    module: str, arch: str, jobs: int, job_memory_gb: float, workspace: Path, deadline: float
) -> dict:
    """One warm-up run for one module, stopped at `deadline` (time.monotonic())."""
    env = {
        **os.environ,
        "FLASHINFER_WORKSPACE_BASE": str((workspace / "flashinfer").resolve()),
        "FLASHINFER_CUDA_ARCH_LIST": arch,
    }  # what a server on the target GPU computes (flashinfer/compilation_context.py)
    inventory = workspace / "inventories" / f"{record_name(module)}.json"
    inventory.unlink(missing_ok=True)
    command = [
        sys.executable, str(ROOT / "images" / "sm120" / "jit_warmup.py"),
        "--modules", json.dumps([module]), "--jobs", str(jobs),
        "--job-memory-gb", str(job_memory_gb), "--inventory", str(inventory),
    ]  # fmt: skip
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    compile_started: list[float] = []

    def read() -> None:
        for line in process.stdout:
            if " to compile, jobs " in line and not compile_started:
                compile_started.append(time.monotonic())
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stopped = False
    try:
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stopped = True
        stopped_at = time.monotonic()
        _stop(process)
    reader.join(timeout=10)
    attempt = {"jobs": jobs, "wall_seconds": round(time.monotonic() - started, 1)}
    if stopped:
        begun = compile_started[0] if compile_started else started
        attempt.update(finished=False, seconds=round(stopped_at - begun, 1))
        return {"status": "stopped", "attempt": attempt, "log_tail": "".join(lines[-5:])}
    if process.returncode:
        attempt.update(finished=False, seconds=None)
        return {"status": "failed", "attempt": attempt, "log_tail": "".join(lines[-40:])}
    found = json.loads(inventory.read_text())
    (entry,) = found["modules"]
    attempt.update(finished=True, seconds=entry["compile_seconds"])
    return {
        "status": "done",
        "attempt": attempt,
        "name": entry["name"],
        "so_bytes": entry["size"],
        "sha256": entry["sha256"],
        "device_code": entry["arch"],
        "source": entry["source"],
        "nvcc_version": found["nvcc_version"],
        "arch_list": found["arch_list"],
    }


def compile_list(args: argparse.Namespace) -> None:
    started = time.monotonic()
    deadline = started + args.deadline if args.deadline else float("inf")
    modules = args.module or SETS.get(args.set) or listed_generators(args.target)
    if args.only:
        modules = [m for m in modules if any(part in m for part in args.only)]
    arch = args.arch or " ".join(target_jit(args.target)["cuda"]["arch_list"])
    jobs = args.jobs or len(os.sched_getaffinity(0))
    job_memory_gb = target_jit(args.target)["jit"]["job_memory_gb"]
    records_dir = args.workspace / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    # Set before flashinfer is imported here: its workspace and arch are read at import.
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str((args.workspace / "flashinfer").resolve())
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch
    host = host_facts()
    sys.path.insert(0, str(ROOT / "images" / "sm120"))
    import jit_warmup as warmup

    def save_all() -> None:
        records = {}
        for path in sorted(records_dir.glob("*.json")):
            record = json.loads(path.read_text())
            records[record["module"]] = record
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "jit-records.json").write_text(
            json.dumps({"host": host, "arch": arch, "records": records}, indent=2) + "\n"
        )

    for module in modules:
        path = records_dir / f"{record_name(module)}.json"
        record = json.loads(path.read_text()) if path.is_file() else {"module": module}
        if record.get("status") == "done":
            print(f"jit-full: {module}: recorded earlier, skipped", flush=True)
            continue
        if time.monotonic() >= deadline - 5:
            print(f"jit-full: {module}: no time left in this call", flush=True)
            break
        result = compile_module(module, arch, jobs, job_memory_gb, args.workspace, deadline)
        attempts = [*record.get("attempts", []), result.pop("attempt")]
        spec = warmup.load_spec(module)  # the same workspace and arch as the warm-up's
        counts = object_counts(Path(spec.build_dir))
        # Objects done when the attempt ended: a stopped attempt's unfinished ones are redone.
        attempts[-1]["objects_built"] = counts.get("objects_built")
        record = {
            **record,
            **result,
            "name": spec.name,
            "arch": arch,
            "attempts": attempts,
            **counts,
            "flashinfer_version": host["flashinfer_version"],
            "cores": host["cores"],
        }
        seconds = [a["seconds"] for a in attempts if a.get("seconds") is not None]
        record["seconds"] = round(sum(seconds), 1) if record["status"] == "done" else None
        record["seconds_so_far"] = round(sum(seconds), 1)
        path.write_text(json.dumps(record, indent=2) + "\n")
        save_all()
        print(f"jit-full: {module}: {record['status']} {json.dumps(attempts[-1])} {counts}",
              flush=True)  # fmt: skip
        if record["status"] == "stopped":
            break
    save_all()


def merge(args: argparse.Namespace) -> None:
    """One result file from the jit-records.json of one or more calls. Each file is one
    call's view; a module may appear in several (a workspace that did not survive between
    calls compiles it again): its `seconds` is its fastest complete compile (a complete
    record's attempts summed), and every attempt of every call is listed."""
    previous = json.loads(args.previous.read_text()) if args.previous else {}
    earlier_rows = {r["module"]: r for r in previous.get("modules", []) if r["attempts"]}
    calls_before = previous.get("calls", 0)
    host, arch, seen = {}, None, {}
    for call, path in enumerate(args.records, calls_before + 1):
        data = json.loads(path.read_text())
        host, arch = data["host"], data["arch"]
        this = (arch, host.get("flashinfer_version"))
        earlier = (previous.get("arch"), previous.get("flashinfer_version"))
        if previous and this != earlier:
            sys.exit(f"{path}: arch and flashinfer {this} differ from --previous's {earlier}")
        for module, record in data["records"].items():
            seen.setdefault(module, []).append((call, record))
    listed = args.module or SETS.get(args.set) or listed_generators(args.target)

    def row(module: str) -> dict:
        current = new_row(module)
        earlier = earlier_rows.get(module)
        if earlier is None:
            return current
        if not seen.get(module):
            return earlier
        merged = {**current, "attempts": earlier["attempts"] + current["attempts"]}
        merged["complete_compiles_seconds"] = (
            earlier["complete_compiles_seconds"] + current["complete_compiles_seconds"]
        )
        if earlier["status"] == "done" and (
            current["status"] != "done" or earlier["seconds"] <= current["seconds"]
        ):
            keep = ("name", "status", "seconds", "so_bytes", "device_code", "objects")
            merged |= {key: earlier[key] for key in keep} | {"objects_built_at_last_stop": None}
        return merged

    def new_row(module: str) -> dict:
        records = seen.get(module, [])
        complete = [r for _, r in records if r["status"] == "done"]
        best = min(complete, key=lambda r: r["seconds"]) if complete else None
        last = records[-1][1] if records else {}
        statuses = {r["status"] for _, r in records}
        status = "done" if complete else ("stopped" if "stopped" in statuses else None)
        return {
            "module": module,
            "name": (best or last).get("name"),
            "status": status or (last.get("status") if records else "not run"),
            "seconds": best["seconds"] if best else None,
            "complete_compiles_seconds": [r["seconds"] for r in complete],
            "so_bytes": best["so_bytes"] if best else None,
            "device_code": best["device_code"] if best else None,
            "objects": (best or last).get("objects"),
            "objects_built_at_last_stop": None if best else last.get("objects_built"),
            "attempts": [{"call": c, **a} for c, r in records for a in r["attempts"]],
            **({"log_tail": last["log_tail"]} if last.get("status") == "failed" else {}),
        }

    rows = [row(m) for m in listed]
    done = [r for r in rows if r["status"] == "done"]
    target_modules = listed_generators(args.target)
    nvcc = sorted({r.get("nvcc_version") for rs in seen.values() for _, r in rs} - {None})
    summary = {
        "target": args.target,
        "set": args.set,
        "machine": args.machine,
        "cores": host.get("cores"),
        "gpus": host.get("gpus"),
        "arch": arch,
        "flashinfer_version": host.get("flashinfer_version"),
        "flashinfer_wheel": args.flashinfer_wheel,
        "nvcc_version": nvcc[0] if len(nvcc) == 1 else nvcc,
        "jobs": sorted({a["jobs"] for r in rows for a in r["attempts"]}),
        "calls": calls_before + len(args.records),
        "modules": rows,
        "total_seconds_finished": round(sum(r["seconds"] for r in done), 1),
        "total_so_bytes_finished": sum(r["so_bytes"] for r in done),
        "all_finished": len(done) == len(rows),
        "not_finished": [r["name"] or r["module"] for r in rows if r["status"] != "done"],
        **({"notes": notes} if (notes := previous.get("notes", []) + (args.note or [])) else {}),
        # How this list compares with the target's [[jit.modules]] when merged.
        "not_in_target_toml": [m for m in listed if m not in target_modules],
        "in_target_toml_not_compiled": [m for m in target_modules if m not in listed],
    }
    args.result.write_text(json.dumps(summary, indent=2) + "\n")
    for r in rows:
        print(f"{r['name'] or r['module']:26} {r['status']:8} {r['seconds']!s:>7} s  "
              f"{r['so_bytes']!s:>10} B  {r['device_code']}  {r['complete_compiles_seconds']}")  # fmt: skip
    print(
        f"finished: {summary['total_seconds_finished']} s, {summary['total_so_bytes_finished']} B"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="compile modules, one at a time")
    merge_parser = commands.add_parser("merge", help="one result file from the records")
    for sub in (compile_parser, merge_parser):
        sub.add_argument("--target", default="sm120")
        sub.add_argument("--set", choices=sorted(SETS), help="a named list (default: target's)")
        sub.add_argument("--module", action="append", help="generator entries (repeatable)")
    compile_parser.add_argument("--arch", help="FLASHINFER_CUDA_ARCH_LIST (default: target's)")
    compile_parser.add_argument("--workspace", type=Path, required=True)
    compile_parser.add_argument("--out", type=Path, required=True)
    compile_parser.add_argument("--jobs", type=int, default=0, help="default: every core")
    compile_parser.add_argument("--deadline", type=float, help="seconds this call may take")
    compile_parser.add_argument(
        "--only", action="append", help="only the list's entries containing this (repeatable)"
    )
    merge_parser.add_argument("records", nargs="+", type=Path)
    merge_parser.add_argument("--result", type=Path, required=True)
    merge_parser.add_argument(
        "--previous",
        type=Path,
        help="an earlier result file: its modules and attempts are kept, its calls numbered first",
    )
    merge_parser.add_argument("--machine", required=True, help="where the records were made")
    merge_parser.add_argument("--flashinfer-wheel", help="the flashinfer wheel compiled from")
    merge_parser.add_argument("--note", action="append", help="a line for the result (repeatable)")
    args = parser.parse_args()
    if args.command == "compile":
        compile_list(args)
    else:
        merge(args)


if __name__ == "__main__":
    main()
