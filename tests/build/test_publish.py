"""`builder publish` against a real pypiserver (htpasswd) and a static index, installed by pip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Builder, Upstreams, make_data_dir, seed_cache, validate_manifest
from tests.services import start_pypiserver

USER, PASSWORD = "uploader", "index-s3cret-Token"


@pytest.fixture(scope="module")
def built(tmp_path_factory, github: Upstreams, fork_wheels: Path) -> tuple[Builder, dict]:
    root = tmp_path_factory.mktemp("publish")
    builder = Builder(
        make_data_dir(root / "data", github), root / "cache", github.mirror, root / "wheelhouse"
    )
    seed_cache(builder, fork_wheels)  # publishing is the subject, not the build
    wheels = json.loads(builder.run("wheels", "--json").stdout)["upstreams"]
    return builder, {name: u["wheel"] for name, u in wheels.items()}


@pytest.fixture
def index(tmp_path: Path):
    packages = tmp_path / "packages"
    packages.mkdir()
    process, port = start_pypiserver(packages, tmp_path / "pypiserver.log", auth=(USER, PASSWORD))
    yield f"http://127.0.0.1:{port}/", packages, tmp_path / "pypiserver.log"
    process.terminate()
    process.wait()


def _creds(password: str = PASSWORD) -> dict[str, str]:
    return {"TWINE_USERNAME": USER, "TWINE_PASSWORD": password}


def _fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def _pip_install(python: Path, *args: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # the machine's pip.conf must not add sources
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", *args],
        check=True, env=env,
    )  # fmt: skip
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return {p["name"]: p["version"] for p in json.loads(listed)}


def test_upload_then_pip_installs_the_sm120_wheels(built, index, tmp_path) -> None:
    builder, wheels = built
    url, _, log = index
    result = builder.run(
        "publish", "--publish-index", url, "--without-kernels", "--json", env=_creds()
    )
    published = json.loads(result.stdout)["published"]
    for name, wheel in wheels.items():
        (record,) = published[name]
        assert record["action"] == "uploaded"
        assert record["sha256"] == wheel["sha256"]
        assert record["index"] == url
    manifest = json.loads(Path(json.loads(result.stdout)["manifest"]).read_text())
    assert manifest["wheels"]["sglang"]["published"] == published["sglang"]
    assert manifest["image"] is None
    # builder itself, so the VM installs it from here: named by its sources' sha256.
    own = manifest["builder_wheel"]
    assert own["version"].startswith("0.1.0+src") and "builder" not in manifest["wheels"]
    assert published["builder"][0]["sha256"] == own["sha256"]
    validate_manifest(manifest)

    python = _fresh_venv(tmp_path / "venv")
    installed = _pip_install(
        python, "--index-url", f"{url}simple/", "sglang==0.5.9", "flashinfer-python==0.6.3",
        f"builder=={own['version']}",
    )  # fmt: skip
    assert installed["sglang"] == wheels["sglang"]["version"]
    assert installed["flashinfer-python"] == wheels["flashinfer"]["version"]
    assert installed["builder"] == own["version"]
    shown = subprocess.run(
        [str(python), "-c", "import builder; print(builder.__version__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert shown.strip() == own["version"]

    again = json.loads(
        builder.run(
            "publish", "--publish-index", url, "--without-kernels", "--json", env=_creds()
        ).stdout
    )
    assert {r[0]["action"] for r in again["published"].values()} == {"already-present"}

    texts = [result.stdout, result.stderr, log.read_text()]
    texts += [p.read_text() for p in (builder.data_dir / "manifests").rglob("*.json")]
    texts += [p.read_text(errors="replace") for p in (builder.cache_dir / "logs").glob("*")]
    assert not [t for t in texts if PASSWORD in t]


def test_same_name_different_content_is_refused(built, index) -> None:
    builder, wheels = built
    url, packages, _ = index
    impostor = packages / wheels["sglang"]["filename"]
    impostor.write_bytes(b"not the wheel we built")
    result = builder.run(
        "publish", "--publish-index", url, "--without-kernels", env=_creds(), check=False
    )
    assert result.returncode == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert f"already has {wheels['sglang']['filename']}" in line and "refusing to overwrite" in line
    assert impostor.read_bytes() == b"not the wheel we built"


def test_wrong_password_is_one_clear_line_and_records_nothing(built, index) -> None:
    builder, _ = built
    url, packages, _ = index
    manifests_before = set((builder.data_dir / "manifests").rglob("*.json"))
    result = builder.run(
        "publish",
        "--publish-index",
        url,
        "--without-kernels",
        env=_creds("wrong-Password-42"),
        check=False,
    )
    assert result.returncode == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert "403" in line and "TWINE_USERNAME" in line
    assert "wrong-Password-42" not in result.stdout + result.stderr
    assert not list(packages.iterdir())
    assert set((builder.data_dir / "manifests").rglob("*.json")) == manifests_before


def test_index_down(built) -> None:
    builder, _ = built
    result = builder.run(
        "publish",
        "--publish-index",
        "http://127.0.0.1:9/",
        "--without-kernels",
        env=_creds(),
        check=False,
    )
    assert result.returncode == 9, "could not check, not a bad input"
    assert "error: index http://127.0.0.1:9/simple/: cannot read" in result.stderr


def test_static_index_installs_with_require_hashes(built, tmp_path) -> None:
    builder, wheels = built
    static = tmp_path / "static"
    first = json.loads(
        builder.run(
            "publish", "--publish-static", str(static), "--without-kernels", "--json"
        ).stdout
    )
    assert {r[0]["action"] for r in first["published"].values()} == {"written"}
    recorded = json.loads(Path(first["manifest"]).read_text())["without_kernels"]
    assert recorded.startswith("--without-kernels: ") and "kernel wheel" in recorded
    page = (static / "simple/sglang/index.html").read_text()
    assert f"#sha256={wheels['sglang']['sha256']}" in page
    pep691 = json.loads((static / "simple/flashinfer-python/index.json").read_text())
    assert pep691["files"][0]["hashes"]["sha256"] == wheels["flashinfer"]["sha256"]

    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        "".join(
            f"{w['dist_name']}=={w['version']} --hash=sha256:{w['sha256']}\n"
            for w in wheels.values()
        )
    )
    python = _fresh_venv(tmp_path / "venv")
    installed = _pip_install(
        python,
        "--index-url",
        f"{static.as_uri()}/simple/",
        "--require-hashes",
        "-r",
        str(requirements),
    )
    assert installed["sglang"] == wheels["sglang"]["version"]

    again = json.loads(
        builder.run(
            "publish", "--publish-static", str(static), "--without-kernels", "--json"
        ).stdout
    )
    assert {r[0]["action"] for r in again["published"].values()} == {"already-present"}


def test_static_index_keeps_earlier_wheels(built, tmp_path) -> None:
    builder, wheels = built
    static = tmp_path / "static"
    builder.run("publish", "--publish-static", str(static), "--upstream", "sglang")
    patch = sorted((builder.data_dir / "forks/sglang-0.5.9/patches/sm120").glob("0001-*"))[0]
    original = patch.read_text()
    patch.write_text(original.replace("\n---\n", "\nTested-by: static index test\n---\n", 1))
    try:
        result = json.loads(
            builder.run(
                "publish", "--publish-static", str(static), "--upstream", "sglang", "--json"
            ).stdout
        )
    finally:
        patch.write_text(original)
    new = result["published"]["sglang"][0]["url"].rsplit("/", 1)[1]
    assert new != wheels["sglang"]["filename"]
    page = (static / "simple/sglang/index.html").read_text()
    assert wheels["sglang"]["filename"] in page and new in page
    files = {p.name for p in (static / "files").iterdir()}
    own = {name for name in files if name.startswith("builder-")}
    assert len(own) == 1  # builder's sources did not change between the two runs
    assert files - own == {wheels["sglang"]["filename"], new}


def test_the_kernel_wheel_published_is_the_one_the_image_manifest_names(built, tmp_path) -> None:
    """Not the newest file matching a pattern: the file and sha256 the newest image manifest
    of this flashinfer build records. A different file under that name is refused."""
    builder, wheels = built
    directory = builder.data_dir / "manifests" / "sm120-0.5.9"
    directory.mkdir(parents=True, exist_ok=True)
    name = f"flashinfer_jit_cache-{wheels['flashinfer']['version']}.k0123abcd-py3-none-linux_x86_64.whl"
    record = {
        "schema_version": 1,
        "image": {"reference": "sglang-sm120:test"},
        "wheels": {
            "flashinfer": {"sha256": wheels["flashinfer"]["sha256"]},
            "kernels": {"filename": name, "version": "x", "sha256": "0" * 64},
        },
    }
    manifest = directory / "29990101T000000Z-test.json"
    manifest.write_text(json.dumps(record))
    static = tmp_path / "static"
    try:
        missing = builder.run("publish", "--publish-static", str(static), check=False)
        assert missing.returncode == 1
        assert f"names the kernel wheel {name}, which is not in" in missing.stderr
        (builder.wheelhouse / name).write_bytes(b"not the wheel that image was built with")
        other = builder.run("publish", "--publish-static", str(static), check=False)
        assert other.returncode == 1
        assert f"{builder.wheelhouse / name}: not the kernel wheel {manifest.name} records" in (
            other.stderr
        )
        assert not static.exists() or not list(static.rglob("*.whl"))
    finally:
        manifest.unlink()
        (builder.wheelhouse / name).unlink(missing_ok=True)
