"""Real services on 127.0.0.1 for the tests: Docker engine, registry, package index.

Started the way TESTBED.md measured them (Debian's docker.io, docker-registry, pypiserver).
Set BUILDER_TEST_DOCKER_HOST to reuse a running engine instead of starting one.

The engine, the runtime index and what is made on the engine once (the test base, the
test image) are shared by both pytest workers: the first worker to ask makes it, under a
lock, and records it in the run's shared folder (`once_per_run`); the run's controller
stops the services at its end (`stop_shared_services`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("BUILDER_TEST_SDIST_CACHE", Path.home() / ".cache/builder-test-sdists"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_git_daemon(root: Path, *, allow_any_sha: bool = False) -> tuple[subprocess.Popen, str]:
    """A real git daemon on loopback serving the bare repositories under `root`: (process,
    base URL git://127.0.0.1:PORT/). upload-pack sends a packed repository's pack as it is,
    where libgit2's file:// transport compresses every object again (a second or two here
    against 20-30 s for flashinfer 0.7.2). `allow_any_sha`: hand out a commit by its id, as
    GitHub does for `--shallow-submodules`."""
    port = free_port()
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"}
    if allow_any_sha:
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="uploadpack.allowAnySHA1InWant",
                   GIT_CONFIG_VALUE_0="true")  # fmt: skip
    process = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={root}",
         "--listen=127.0.0.1", f"--port={port}", str(root)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for(lambda: port_open(port), 10, "git daemon")
    return process, f"git://127.0.0.1:{port}/"


@dataclass
class Daemon:
    host: str
    process: subprocess.Popen | None
    data_root: Path | None = None
    run_dir: Path | None = None  # its socket, pid file and exec root, under /tmp

    def stop(self, *, remove_data: bool = False) -> None:
        """Stop the engine; `remove_data` frees its images (gigabytes: CI's disk is finite)."""
        if self.process:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.run_dir:
            remove_with_mounts(self.run_dir)
        if remove_data and self.data_root:
            remove_with_mounts(self.data_root)


# The run's shared folder: set by the controller (tests/conftest.py), inherited by workers.
SHARED_DIR_ENV = "BUILDER_TEST_SHARED_DIR"


def once_per_run(name: str, make: Callable[[Path], dict]) -> dict:
    """`make(folder)`'s record, made by the first process of this test run to ask and read
    back by every other. A record's "pids" are stopped and its "remove" paths deleted by
    `stop_shared_services` at the run's end. A `make` that failed is not tried again: a
    later asker gets its error at once instead of repeating a half-hour of work."""
    from filelock import FileLock

    from tests.cpu_profile import span

    shared = Path(os.environ[SHARED_DIR_ENV])
    record = shared / f"{name}.json"
    with FileLock(shared / f"{name}.lock"):
        if not record.exists():
            folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared))
            try:
                with span("fixture", name):
                    made = make(folder)
            except Exception as error:  # an interrupt leaves no record: the run is ending
                error_text = f"{type(error).__name__}: {error}"[:4000]
                _write_record(record, {"error": error_text, "remove": [str(folder)]})
                raise
            _write_record(record, made)
            return made
        made = json.loads(record.read_text())
    if "error" in made:
        raise RuntimeError(f"{name} failed earlier in this run: {made['error']}")
    return made


def _write_record(record: Path, made: dict) -> None:
    partial = record.with_suffix(".partial")
    partial.write_text(json.dumps(made))
    partial.replace(record)


def remove_with_mounts(path: Path) -> None:
    """`path` deleted, after what is still mounted under it: a stopped dockerd leaves its
    network namespace bind-mounted in its exec root, one more mount per run otherwise."""
    mounted = [
        line.split()[4].replace("\\040", " ")
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    ]
    for point in sorted(mounted, reverse=True):  # the deepest first
        if Path(point).is_relative_to(path):
            subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def _gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):  # reaped here only if this is its parent
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def stop_shared_services(shared: Path) -> None:
    """Stop what `once_per_run` started (each pid: SIGTERM, 30 s, SIGKILL) and delete what
    it asked to (the engine's data root: gigabytes)."""
    for record in sorted(shared.glob("*.json")):
        made = json.loads(record.read_text())
        for pid in made.get("pids", []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not _gone(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not _gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for path in made.get("remove", []):
            remove_with_mounts(Path(path))


def shared_dockerd() -> str:
    """The run's engine (or BUILDER_TEST_DOCKER_HOST's), started once for every worker."""
    if reuse := os.environ.get("BUILDER_TEST_DOCKER_HOST"):
        return reuse

    def start(folder: Path) -> dict:
        daemon = start_dockerd(folder)
        assert daemon.process and daemon.data_root and daemon.run_dir
        return {
            "host": daemon.host,
            "pids": [daemon.process.pid],
            "remove": [str(daemon.data_root), str(daemon.run_dir)],
        }

    return once_per_run("dockerd", start)["host"]


def start_dockerd(root: Path, *, second: bool = False) -> Daemon:
    """The tests' engine (or BUILDER_TEST_DOCKER_HOST's). A `second` engine is always new
    and has no bridge network, so it can run beside the first: builds use the host's."""
    reuse = os.environ.get("BUILDER_TEST_DOCKER_HOST")
    if reuse and not second:
        return Daemon(reuse, None)
    # A short socket path: unix socket paths are limited to ~108 bytes.
    run = Path(tempfile.mkdtemp(prefix="bt-docker-", dir="/tmp"))
    socket_path = run / "d.sock"
    root.mkdir(parents=True, exist_ok=True)
    log = (root / "dockerd.log").open("w")
    process = subprocess.Popen(
        [
            "dockerd",
            "--data-root", str(root / "data"),
            "--exec-root", str(run / "exec"),
            "--pidfile", str(run / "d.pid"),
            "-H", f"unix://{socket_path}",
            *(["--bridge=none", "--iptables=false", "--ip-masq=false"] if second else []),
        ],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    host = f"unix://{socket_path}"
    docker_cli = shutil.which("docker", path="/usr/bin") or "docker"

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"dockerd exited: {(root / 'dockerd.log').read_text()[-2000:]}")
        return subprocess.run([docker_cli, "-H", host, "info"], capture_output=True).returncode == 0

    wait_for(ready, 60, "dockerd")
    return Daemon(host, process, root / "data", run)


def start_process(command: list[str], port: int, log: Path, what: str) -> subprocess.Popen:
    process = subprocess.Popen(
        command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-2000:]}")
        return port_open(port)

    wait_for(ready, 30, what)
    return process


def htpasswd(path: Path, user: str, password: str, bcrypt: bool) -> None:
    flag = "-Bbn" if bcrypt else "-mbn"
    line = subprocess.run(
        ["htpasswd", flag, user, password], check=True, capture_output=True, text=True
    ).stdout.strip()
    path.write_text(line + "\n")


def start_registry(root: Path, user: str, password: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    htpasswd(root / "htpasswd", user, password, bcrypt=True)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: builder-tests\n    path: {root / 'htpasswd'}\n"
    )
    process = start_process(
        ["docker-registry", "serve", str(config)], port, root / "registry.log", "docker-registry"
    )
    return process, port


def start_pypiserver(
    packages: Path | list[Path],
    log: Path,
    auth: tuple[str, str] | None = None,
    private: bool = False,
) -> tuple[subprocess.Popen, int]:
    """pypiserver on loopback, serving one folder or several; uploads (to the first) need
    `auth` (htpasswd), downloads need none unless `private` (then listing and downloads ask
    for it too, as an authenticated company proxy does)."""
    folders = packages if isinstance(packages, list) else [packages]
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "pypi-server"), "run",
        "-i", "127.0.0.1", "-p", str(port), "--disable-fallback", "--hash-algo", "sha256",
    ]  # fmt: skip
    if auth:
        passwords = folders[0].parent / f"{folders[0].name}.htpasswd"
        htpasswd(passwords, *auth, bcrypt=False)
        command += ["-a", "download,list,update" if private else "update", "-P", str(passwords)]
    else:
        command += ["-a", ".", "-P", "."]
    command += [str(folder) for folder in folders]
    return start_process(command, port, log, "pypiserver"), port


# --- a CUDA base image without Docker Hub ------------------------------------------------

DATA = Path(__file__).parent / "data"
CUDA_TOOLKIT = DATA / "cuda-toolkit.txt"
IMAGE_RUNTIME_REQUIREMENTS = DATA / "image-runtime-requirements.txt"
# The same resolved by `builder lock --base-provides torch` (python 3.13, manylinux_2_28):
# what the sm120-0.5.9 test images install beside the test base's torch.
IMAGE_RUNTIME_LOCK = DATA / "image-runtime-lock.txt"
# The current-stack test image's (PyPI's torch 2.7.1 and its CUDA libraries).
CURRENT_STACK_RUNTIME_LOCK = DATA / "current-stack-runtime-lock.txt"
TEST_PYTHON = "3.13"  # the test base's (Debian trixie)
_HEADERS_ONLY = ("nvidia-cublas", "nvidia-curand")


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _nvcc_version() -> str:
    for line in requirement_lines(CUDA_TOOLKIT):
        if line.startswith("nvidia-cuda-nvcc=="):
            return line.split("==")[1]
    raise RuntimeError(f"{CUDA_TOOLKIT} pins no nvidia-cuda-nvcc")


# The suffix changes whenever the recipe below does, so no engine keeps a stale base.
DEBIAN_SUITE = "trixie"  # Python 3.13, torch 2.6.0 (python3-torch)
TEST_BASE = f"builder-test-base:{DEBIAN_SUITE}-torch-cuda{_nvcc_version()}-3"


def _pip_download(requirements: list[str], destination: Path, *options: str) -> None:
    """From PyPI only: --isolated ignores this machine's pip config (local wheel folders)."""
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--isolated", "download", "-q",
            "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", TEST_PYTHON, "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_12_x86_64",
            "--platform", "manylinux2010_x86_64", "-d", str(partial), *options, *requirements,
        ],
        check=True,
    )  # fmt: skip
    shutil.rmtree(destination, ignore_errors=True)
    partial.replace(destination)


def _cached_download(name: str, requirements_file: Path, *options: str) -> Path:
    """Wheels for a requirements file, cached under a key of its content."""
    key = hashlib.sha256(requirements_file.read_bytes()).hexdigest()[:12]
    destination = CACHE / f"{name}-{key}"
    if not destination.is_dir():
        _pip_download(["-r", str(requirements_file)], destination, *options)
        _remove_earlier(destination, key)  # an earlier lock's wheels: up to 3 GB each
    return destination


def _remove_earlier(kept: Path, key: str) -> None:
    """The cache's earlier versions of `kept`, named as it is but for another `key`: finished
    ones alone, not another process's `.partial` or staging copy, nor a longer name that
    starts the same."""
    prefix, _, suffix = kept.name.partition(key)
    earlier = re.compile(rf"{re.escape(prefix)}[0-9a-f]{{{len(key)}}}{re.escape(suffix)}")
    for stale in kept.parent.iterdir():
        if stale != kept and earlier.fullmatch(stale.name):
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()


def runtime_wheelhouse(lock: Path = IMAGE_RUNTIME_LOCK) -> Path:
    """Wheels for a test image's runtime stage, cached. --no-deps: the lock is whole, and
    what it leaves to the base (torch) is not to be downloaded."""
    name = lock.stem.removesuffix("-lock") + "-wheels"
    return _cached_download(name, lock, "--require-hashes", "--no-deps")


# Debian's torch is its CPU build (PyPI's for Linux is CUDA's: 8 GB with its libraries);
# libtorch-dev has the unversioned libc10.so name torch-c-dlpack-ext's addon links to;
# torch.utils.cpp_extension imports setuptools (which debootstrap's resolver brought along).
BASE_PACKAGES = (
    "python3,python3-venv,python3-dev,g++,ca-certificates,python3-torch,libtorch-dev,"
    "python3-setuptools"
)
# What no test runs, dropped from the root filesystem: every MB of the base is gzipped by the
# first push, imported by the second engine and sent with every saved context (520 MB: docs,
# apt's lists, torch's and gcc's test and debug tools, static libpython, sanitizer runtimes,
# the Python packages' own tests, and ROCm with its LLVM: only UCX's ROCm plugins, which
# UCX loads when present, link them).
BASE_PRUNE = (
    "usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt/archives",
    "var/lib/apt/lists", "usr/lib/libtorch-test", "usr/lib/python3/dist-packages/torch/bin/test_*",
    "usr/bin/x86_64-linux-gnu-lto-dump-*", "usr/lib/python3.*/config-*/libpython3.*.a",
    "usr/lib/x86_64-linux-gnu/lib[ahlt]san.so*", "usr/lib/x86_64-linux-gnu/libubsan.so*",
    "usr/lib/python3/dist-packages/*/**/tests", "usr/lib/x86_64-linux-gnu/ucx/*rocm*",
    "usr/lib/x86_64-linux-gnu/libamdhip64.so*", "usr/lib/x86_64-linux-gnu/libamd_comgr.so*",
    "usr/lib/x86_64-linux-gnu/libhsa-runtime64.so*", "usr/lib/x86_64-linux-gnu/libhsakmt.so*",
    "usr/lib/x86_64-linux-gnu/libLLVM*.so*",
)  # fmt: skip


def prune_rootfs(root: str) -> None:
    """BASE_PRUNE out of the root filesystem at `root` (mmdebstrap's customize hook)."""
    for pattern in BASE_PRUNE:
        for junk in list(Path(root).glob(pattern)):
            if not junk.exists() and not junk.is_symlink():  # inside one removed before
                continue
            if junk.is_dir() and not junk.is_symlink():
                shutil.rmtree(junk)
            else:
                junk.unlink()


# dpkg never writes these (pruned after the fact, they were written and then deleted).
_NOT_UNPACKED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*")


def _bootstrap(destination: Path) -> Path:
    """Debian with BASE_PACKAGES as one tar, made once per machine. mmdebstrap, not
    debootstrap: apt resolves and unpacks in one pass and the tar is written straight from
    its staging folder (measured on a 2-core machine, cold, the prune included: 84 s and 83
    CPU-s, against debootstrap's 100 s and 108 CPU-s before its prune and tar)."""
    recipe = hashlib.sha256(
        repr(("mmdebstrap", BASE_PACKAGES, _NOT_UNPACKED, BASE_PRUNE)).encode()
    ).hexdigest()[:8]
    archive = CACHE / f"rootfs-{DEBIAN_SUITE}-{recipe}.tar"
    if archive.exists():
        return archive
    prune = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from tests.services import prune_rootfs; prune_rootfs(sys.argv[2])"
    )
    hook = shlex.join([sys.executable, "-c", prune, str(Path(__file__).parents[1])]) + ' "$1"'
    partial = archive.with_suffix(".partial")
    made = subprocess.run(
        [
            "mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar",
            f"--include={BASE_PACKAGES}",
            *(f"--dpkgopt=path-exclude={path}" for path in _NOT_UNPACKED),
            f"--customize-hook={hook}",
            DEBIAN_SUITE, str(partial), "http://deb.debian.org/debian",
        ],
        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(destination)},
    )  # fmt: skip
    if made.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join(made.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"mmdebstrap of Debian {DEBIAN_SUITE} failed:\n{tail}")
    partial.replace(archive)
    _remove_earlier(archive, recipe)  # an earlier recipe's: a GB each
    return archive


def assemble_cuda_toolkit(destination: Path) -> Path:
    """A CUDA_HOME from the pinned NVIDIA wheels: bin/ (nvcc, ptxas, cuobjdump...), nvvm/,
    include/ (with cccl, cuBLAS and cuRAND headers), lib64 -> lib, and a stub libcuda.so to
    link against (a build has no driver)."""
    wheels = _cached_download("cuda-toolkit", CUDA_TOOLKIT, "--no-deps")
    for wheel in sorted(wheels.glob("*.whl")):
        headers_only = wheel.name.replace("_", "-").startswith(_HEADERS_ONLY)
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                name = info.filename.removeprefix("nvidia/cu13/")
                if name == info.filename or info.is_dir() or name.startswith(".metadata/"):
                    continue
                if headers_only and not name.startswith("include/"):
                    continue
                target = destination / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(info))
                target.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    (destination / "lib64").symlink_to("lib")
    (destination / "lib/libcudart.so").symlink_to("libcudart.so.13")
    (destination / "lib/stubs").mkdir()
    subprocess.run(
        ["gcc", "-shared", "-x", "c", "/dev/null", "-o", str(destination / "lib/stubs/libcuda.so")],
        check=True,
    )
    return destination


def _base_archive(workdir: Path) -> Path:
    """The test base's root filesystem as one tar (its one layer, tests/base_image.py), made
    once per machine and kept beside the root filesystem it is made from, keyed by the
    base's tag, that root filesystem, the CUDA toolkit's pins and this host's CA bundle."""
    rootfs = _bootstrap(workdir)
    ca_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    key = hashlib.sha256(
        f"{TEST_BASE} {rootfs.name}".encode() + CUDA_TOOLKIT.read_bytes() + ca_bundle.read_bytes()
    ).hexdigest()[:12]
    archive = CACHE / f"test-base-{key}.tar"
    if archive.exists():
        return archive
    cuda = assemble_cuda_toolkit(workdir / "cuda")
    additions = {"usr/local/cuda": cuda, "etc/ssl/certs/ca-certificates.crt": ca_bundle}
    image_tar = workdir / "base.tar"
    with tarfile.open(rootfs) as source, tarfile.open(image_tar, "w") as tar:
        for member in source:
            name = member.name.removeprefix("./")
            if name in additions:
                continue
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        for arcname, path in additions.items():
            tar.add(path, arcname=arcname)
    shutil.rmtree(cuda)
    partial = archive.with_name(f".{archive.name}-{os.getpid()}")
    shutil.move(image_tar, partial)
    partial.replace(archive)
    for kept in (
        archive,
        archive.with_name(f"{archive.name}.gz"),
        archive.with_name(f"{archive.name}.gz.json"),
    ):
        _remove_earlier(kept, key)  # an earlier base's archive and layer (tests/base_image.py)
    return archive


# What `docker import` would set: CUDA's tools on PATH, and (as in NVIDIA's CUDA images) the
# runtime on the loader path, so a FlashInfer module (linked to libcudart.so.13) loads
# without a GPU.
TEST_BASE_ENV = [
    "PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "CUDA_HOME=/usr/local/cuda",
    "LD_LIBRARY_PATH=/usr/local/cuda/lib",
]


def _serve_test_base(folder: Path) -> dict:
    """The run's loopback registry holding the test base (tests/base_image.py)."""
    from tests import base_image

    layer = base_image.gzipped_layer(_base_archive(folder))
    process, port = start_registry(folder / "registry", base_image.USER, base_image.PASSWORD)
    reference = base_image.publish(
        f"127.0.0.1:{port}", TEST_BASE.split(":")[1], layer, TEST_BASE_ENV
    )
    return {"reference": reference, "layer": layer, "pids": [process.pid], "remove": [str(folder)]}


def served_base_layer() -> dict:
    """The test base's layer as the run's registry serves it (for `base_image.seed_layer`)."""
    return once_per_run("test-base-registry", _serve_test_base)["layer"]


def build_test_base(client, workdir: Path) -> str:
    """Debian + Python + g++ + Debian's CPU torch + a CUDA 13 toolkit from NVIDIA's PyPI
    wheels: enough for a real `docker build` to compile FlashInfer modules for sm_120a.
    Nothing from this host but its CA bundle (it trusts the TLS-re-signing proxy in front of
    PyPI). The archive is made once per machine (`_base_archive`). In a test run every engine
    pulls it from the run's registry (tests/base_image.py says why); a bench imports it."""
    from docker.errors import ImageNotFound

    from tests import base_image

    try:
        client.images.get(TEST_BASE)
        return TEST_BASE
    except ImageNotFound:
        pass
    repository, tag = TEST_BASE.split(":")
    if SHARED_DIR_ENV in os.environ:  # one maker at a time; every engine pulls the same
        reference = once_per_run("test-base-registry", _serve_test_base)["reference"]
        login = {"username": base_image.USER, "password": base_image.PASSWORD}
        client.images.pull(reference, auth_config=login).tag(repository, tag)
        client.images.remove(reference)  # the run's registry's name for it, not the image
        return TEST_BASE
    with _base_archive(workdir).open("rb") as handle:
        client.api.import_image_from_data(
            handle, repository=repository, tag=tag, changes=[f"ENV {e}" for e in TEST_BASE_ENV]
        )
    return TEST_BASE
