"""`builder doctor --p2p` on a real GPU host without Docker: the probe, the analysis, the
record, and what `builder launch` then chooses on this machine.

From the repository root, on a machine whose python3 has torch (FlashInfer with builder's
kernel wheel too, for the PCIe IPC all-reduce; without it that stage is skipped):

    PYTHONPATH=. python3 bench/p2p_probe_check.py --out $OUT

1. builder/site/probes/p2p_probe.py with this Python, as doctor runs it in the image (the
   profile's NCCL settings, each stage under --stage-timeout): probe.json, probe.log;
2. this host's facts (builder/site/p2p_host.py: lspci, IOMMU, VM, nvidia-smi): host.json;
3. the analysis (builder/site/p2p.py): analysis.json, and every check printed as doctor prints it;
4. the record, written as doctor writes it, keyed by this machine's nvidia-smi, into
   OUT/p2p/<key>.json (BUILDER_P2P_DIR set to OUT/p2p; the profile's sglang_cache to
   OUT/sglang-cache, outside it);
5. read back through launch's path (builder/site/p2p_record.apply on the profile
builder/spec/launch.py
   resolves, which launch_options.py's recipe_from_args calls) for --profile and its -pcie-ar
   sibling, and through `builder launch --json` itself where builder's CLI can import
   here (docker, platformdirs ... are not on a bare GPU host): launch.json.
summary.json holds each step's outcome. Only the standard library and builder's light
modules (rich, packaging) are imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _write(out: Path, name: str, data: dict) -> Path:
    path = out / name
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def _launch_read(target_file: Path, profile: str, cache: Path) -> dict:
    """What launch applies on this machine: the profile resolved as `builder launch` resolves
    it, then the record step recipe_from_args runs (builder/site/commands/launch_options.py)."""
    from builder.core.errors import BuilderError
    from builder.site import p2p_record
    from builder.spec import launch, launch_profiles

    known = launch_profiles.Profiles.of(target_file)
    overrides = launch.Overrides(params=(("sglang_cache", str(cache)),))
    recipe = launch.resolve(known, profile, "-", overrides)
    needs = bool(launch_profiles.flattened(known, profile).get("needs_peer_access"))
    try:
        applied, line = p2p_record.apply(recipe, needs)
    except BuilderError as exc:
        return {"profile": profile, "refused": str(exc)}
    changed = {k: v for k, v in applied.env.items() if recipe.env.get(k) != v}
    dropped = sorted(set(recipe.env) - set(applied.env))
    return {"profile": profile, "line": line, "env": applied.env, "set": changed,
            "dropped": dropped}  # fmt: skip


def _launch_cli(out: Path, target: str, profile: str, cache: Path) -> dict:
    """`builder launch --json` itself, where builder's CLI imports on this host."""
    manifest = out / "launch-manifest.json"
    manifest.write_text(json.dumps({"schema_version": 1, "image": {"reference": "p2p-check:none"}}))
    command = [sys.executable, "-m", "builder.cli.main", "launch", "--target", target,
               "--manifest", str(manifest), "--profile", profile,
               "--set", f"sglang_cache={cache}", "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    manifest.unlink()
    said = [line for line in done.stderr.splitlines() if "P2P record" in line or "error" in line]
    if "ModuleNotFoundError" in done.stderr:
        missing = done.stderr.strip().splitlines()[-1]
        return {"profile": profile, "ran": False, "why": f"builder's CLI cannot import: {missing}"}
    try:
        env_chosen = json.loads(done.stdout).get("env")
    except json.JSONDecodeError:
        env_chosen = None
    return {"profile": profile, "ran": True, "exit_code": done.returncode, "said": said,
            "env": env_chosen}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the results go")
    parser.add_argument("--target", default="sm120", help="target (default: sm120)")
    parser.add_argument("--profile", default="glm5-nvfp4-tp8", help="(default: glm5-nvfp4-tp8)")
    parser.add_argument("--world", type=int, help="all-reduce world size (default: every GPU)")
    parser.add_argument("--pcie-ipc", choices=("auto", "on", "off"), default="auto",
                        help="FlashInfer's PCIe IPC all-reduce (default: auto)")  # fmt: skip
    parser.add_argument("--stage-timeout", type=float, default=120.0,
                        help="seconds per probe stage (default: 120)")  # fmt: skip
    parser.add_argument("--probe-result", type=Path, help="judge this document, run nothing")
    parser.add_argument("--note", action="append", help="a line for the summary (repeatable)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from builder.site import p2p, p2p_host, p2p_record, p2p_run
    from builder.spec import launch, launch_profiles
    from builder.spec.target import load_target

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "sglang-cache"
    os.environ[p2p_record.DIR_ENV] = str(out / "p2p")  # for the launches below too
    target = load_target(REPO, args.target)
    known = launch_profiles.Profiles.of(target.file)
    recipe = launch.resolve(
        known, args.profile, "-", launch.Overrides(params=(("sglang_cache", str(cache)),))
    )
    nccl_env = {k: v for k, v in recipe.env.items() if k.startswith("NCCL_")}
    summary: dict = {"notes": args.note or [], "python": sys.version.split()[0],
                     "profile": args.profile, "nccl_env": nccl_env}  # fmt: skip

    started = time.monotonic()
    if args.probe_result:
        probe = json.loads(args.probe_result.read_text())
    else:
        command = p2p_run.local_command(
            p2p_run.probe_args(args.world, args.pcie_ipc, args.stage_timeout, nccl_env)
        )
        summary["probe_command"] = command
        with open(out / "probe.log", "w") as log:
            probe = p2p_run.run(
                command, p2p_run.deadline_s(args.stage_timeout),
                on_line=lambda line: (print(line, file=sys.stderr, flush=True),
                                      log.write(line + "\n")),
            )  # fmt: skip
        _write(out, "probe.json", probe)
    summary["probe_seconds"] = round(time.monotonic() - started, 1)

    facts = p2p_host.collect()
    _write(out, "host.json", facts.to_json())
    tp = int(recipe.args[recipe.args.index("--tp-size") + 1]) if "--tp-size" in recipe.args else 1
    analysis = p2p.analyse(probe, facts, recipe.env, tp)
    _write(out, "analysis.json", analysis.to_json())
    for check in analysis.checks:
        print(f"{check.status:<4} {check.name}: {check.detail}")
    for cause in analysis.causes:
        print(f"cause: {cause}")
    print(f"verdict: {analysis.verdict}")
    summary.update(ok=analysis.ok, verdict=analysis.verdict,
                   settings=analysis.settings.to_json())  # fmt: skip

    machine = p2p_record.this_machine()
    if not probe.get("cuda"):
        summary["record"] = "not written: the probe measured nothing"
    elif not isinstance(machine, p2p_record.Machine):
        summary["record"] = f"not written: {machine}"
    else:
        path = p2p_record.write(
            p2p_record.record_dir(), machine, facts.topology, probe, facts, analysis, None,
            args.profile, recipe.volumes,
        )  # fmt: skip
        summary["record"] = str(path)
        print(f"record: {path}")

    pcie_ar = f"{args.profile}-pcie-ar" if f"{args.profile}-pcie-ar" in known.profiles else None
    profiles = [args.profile, *([pcie_ar] if pcie_ar else [])]
    launch_result = {
        "through_p2p_record_apply": [_launch_read(target.file, name, cache) for name in profiles],
        "through_builder_launch_cli": [
            _launch_cli(out, args.target, name, cache) for name in profiles
        ],
    }
    _write(out, "launch.json", launch_result)
    summary["launch"] = launch_result
    for read in launch_result["through_p2p_record_apply"]:
        print(f"launch {read['profile']}: {read.get('refused') or read['line']}")
        if read.get("set") or read.get("dropped"):
            print(f"  env set {read['set']}, dropped {read['dropped']}")
    for cli in launch_result["through_builder_launch_cli"]:
        print(f"builder launch --profile {cli['profile']}: "
              + (f"exit {cli['exit_code']}; {' | '.join(cli['said'])}" if cli["ran"]
                 else f"not run ({cli['why']})"))  # fmt: skip
    _write(out, "summary.json", summary)


if __name__ == "__main__":
    main()
