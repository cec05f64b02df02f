"""Runs inside an image, standard library only: checks what its recipe promises.

`builder verify` copies this file into a container of the image and runs it with the
image's own Python. It prints one JSON line, `BUILDER-VERIFY [{check, ok, detail}, ...]`:
- every wheel of the recipe is installed at its version, and every installed file still
  has the sha256 its RECORD lists (an edited file is named);
- every line the patches add is in the installed files;
- the kernel wheel is builder's, for exactly the installed flashinfer build (never the
  official flashinfer-jit-cache), and every listed module loads from it with JIT disabled,
  byte for byte as built, with GPU code for the target arch (the image's jit_warmup.py);
- the SBOM lists exactly the installed distributions at their versions;
- `pip check` is clean.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import json
import re
import subprocess
import sys
from pathlib import Path

WARMUP = "/opt/builder/jit_warmup.py"
SBOM = "/opt/builder/sbom.cdx.json"


def record_mismatches(dist: metadata.Distribution) -> list[str]:
    """Installed files whose sha256 differs from the one their RECORD lists."""
    changed = []
    for file in dist.files or []:
        if not file.hash or file.hash.mode != "sha256":
            continue
        try:
            data = Path(dist.locate_file(file)).read_bytes()
        except OSError:
            changed.append(f"{file} (missing)")
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != file.hash.value:
            changed.append(str(file))
    return changed


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sbom_matches_environment() -> tuple[bool, str]:
    """The image's SBOM lists exactly the distributions installed, at their versions (but
    the venv's own pip and setuptools, unless the lock installed them)."""
    try:
        sbom = json.loads(Path(SBOM).read_text())
    except (OSError, ValueError) as exc:
        return False, f"no readable SBOM at {SBOM} ({exc.__class__.__name__})"
    listed = {
        _canonical(c["purl"].split("@")[0].removeprefix("pkg:pypi/")): c.get("version")
        for c in sbom.get("components", [])
        if c.get("purl", "").startswith("pkg:pypi/")
    }
    seeded = {"pip", "setuptools"} - listed.keys()  # from `python -m venv`, when not locked
    installed: dict[str, str] = {}
    # In sys.path order: one the venv installed shadows the base's of that name (a venv
    # over the base's packages), as it does for import.
    for dist in metadata.distributions():
        name = _canonical(dist.metadata["Name"])
        if name not in seeded:
            installed.setdefault(name, dist.version)
    wrong = sorted(
        f"{name} {installed.get(name, 'absent')} installed, SBOM says {listed.get(name, 'absent')}"
        for name in installed.keys() | listed.keys()
        if installed.get(name) != listed.get(name)
    )
    if wrong:
        return False, f"{len(wrong)} difference(s), first: {wrong[0]}"
    return True, f"{SBOM} lists the {len(installed)} installed distributions at their versions"


def main() -> None:
    recipe = json.loads(Path(sys.argv[1]).read_text())
    checks: list[dict] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": ok, "detail": detail})

    installed: dict[str, metadata.Distribution] = {}
    for name, wheel in recipe["wheels"].items():
        label = f"{wheel['dist_name']} {wheel['version']}"
        try:
            dist = metadata.distribution(wheel["dist_name"])
        except metadata.PackageNotFoundError:
            check(f"wheel {name}", False, f"{wheel['dist_name']} is not installed")
            continue
        installed[name] = dist
        if dist.version != wheel["version"]:
            check(f"wheel {name}", False, f"{wheel['dist_name']} {dist.version} installed, "
                  f"the recipe says {wheel['version']}")  # fmt: skip
            continue
        changed = record_mismatches(dist)
        check(
            f"wheel {name}",
            not changed,
            f"{label}: every installed file matches its RECORD sha256"
            if not changed
            else f"{label}: {len(changed)} installed file(s) differ from RECORD: "
            + ", ".join(changed[:3]),
        )

    for name, members in recipe["patched_lines"].items():
        dist = installed.get(name)
        if dist is None:
            continue
        missing = []
        for member, lines in members.items():
            path = Path(dist.locate_file(member))
            text = path.read_text(errors="replace") if path.is_file() else ""
            missing += [f"{member}: {line!r}" for line in lines if line not in text]
        count = sum(len(lines) for lines in members.values())
        check(
            f"patches {name}",
            not missing,
            f"all {count} added lines present in {len(members)} installed files"
            if not missing
            else f"{len(missing)} added line(s) missing, first {missing[0]}",
        )

    kernels = recipe["wheels"].get("kernels")
    try:
        jit_cache = metadata.version("flashinfer-jit-cache")
    except metadata.PackageNotFoundError:
        jit_cache = None
    flashinfer = recipe["wheels"].get("flashinfer", {}).get("version")
    if kernels is None:
        check("kernel wheel", jit_cache is None,
              "no flashinfer-jit-cache" if jit_cache is None
              else f"flashinfer-jit-cache {jit_cache} installed; the recipe has none")  # fmt: skip
    else:
        built_for = None
        if jit_cache == kernels["version"]:
            import flashinfer_jit_cache

            built_for = getattr(flashinfer_jit_cache, "FLASHINFER_BUILD", None)
        ok = jit_cache == kernels["version"] and built_for == flashinfer
        check("kernel wheel", ok,
              f"builder's flashinfer-jit-cache {jit_cache} for flashinfer {built_for}" if ok
              else f"flashinfer-jit-cache {jit_cache} (kernels for {built_for}) installed; "
              f"expected builder's {kernels['version']} for flashinfer {flashinfer}")  # fmt: skip

    if recipe.get("jit_modules"):
        run = subprocess.run(
            [sys.executable, WARMUP, "--check", "--modules", json.dumps(recipe["jit_modules"]),
             "--inventory", "/tmp/builder-verify-inventory.json"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        lines = (run.stdout + run.stderr).strip().splitlines()
        errors = [line.split("error: ", 1)[1] for line in lines if "jit-warmup: error:" in line]
        check(
            "kernels load",
            run.returncode == 0,
            lines[-1].removeprefix("jit-warmup: ")
            if run.returncode == 0 and lines
            else (errors[0] if errors else "\n".join(lines[-3:])),
        )

    check("sbom", *sbom_matches_environment())

    run = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300
    )
    output = (run.stdout + run.stderr).strip()
    check("pip check", run.returncode == 0, output.splitlines()[0] if output else "clean")

    print("BUILDER-VERIFY " + json.dumps(checks), flush=True)


if __name__ == "__main__":
    main()
