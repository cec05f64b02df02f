"""docs/gpu-vm.md step 2, the install, run as written on this Debian 12 machine (the page's
own lines; only its folders, the private index and builder's version are this test's): a
venv builder, on root's path, whose `--version` answers. The private index is a real
pypiserver on loopback holding builder's own wheel; its dependencies come from PyPI."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from builder.build import self_wheel
from tests.conftest import REPO_ROOT
from tests.services import start_pypiserver

PAGE = REPO_ROOT / "docs/gpu-vm.md"


def _install_block() -> str:
    section = PAGE.read_text().split("\n## 2.", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"\n\n((?:    .*\n)+)", section)
    assert block, "step 2 has no command block"
    return "\n".join(line[4:] for line in block.group(1).splitlines())


def test_step_2_installs_builder_as_written(tmp_path: Path) -> None:
    wheel = self_wheel.build(tmp_path / "wheel").path
    served = tmp_path / "index"
    served.mkdir()
    (served / wheel.name).write_bytes(wheel.read_bytes())
    process, port = start_pypiserver(served, tmp_path / "pypiserver.log")
    version = wheel.name.split("-")[1]
    script = _install_block()
    for written, here in (
        ("sudo ", ""),  # the suite runs as root already
        ("apt-get install -y python3-venv", "dpkg -s python3-venv >/dev/null"),  # no apt run
        ("/opt/builder", str(tmp_path / "opt/builder")),
        ("/usr/local/bin", str(tmp_path / "bin")),
        ("https://pypi.internal/simple/", f"http://127.0.0.1:{port}/simple/"),
        ("0.1.0+src1a2b3c4d5e", version),
    ):
        assert written in script, f"step 2 no longer says {written!r}: update this test"
        script = script.replace(written, here)
    (tmp_path / "bin").mkdir()
    environment = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin",
        "PIP_CONFIG_FILE": os.devnull,  # this machine's pip configuration is not the VM's
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
            env=environment, cwd=tmp_path, timeout=600,
        )  # fmt: skip
    finally:
        process.terminate()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == (
        f"builder {version} (installed, no git checkout: the version names its sources)"
    )
    assert (tmp_path / "bin/builder").resolve() == tmp_path / "opt/builder/bin/builder"
