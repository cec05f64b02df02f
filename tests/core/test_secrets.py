"""Secrets stay out of upstream code and out of every record."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import build
import pytest

from builder.build import wheels
from builder.core.urls import has_credentials, redact

RECORDING_BACKEND = """
import json, os, zipfile
from pathlib import Path

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    (Path(__file__).parent / "backend-env.json").write_text(json.dumps(dict(os.environ)))
    name = "recorded-0-py3-none-any.whl"
    zipfile.ZipFile(Path(wheel_directory) / name, "w").close()
    return name
"""


def test_an_upstream_build_backend_gets_only_the_allowlisted_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fixture build backend (in-tree, run by `build` through builder's runner) records
    the environment it was given."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "recorder.py").write_text(RECORDING_BACKEND)
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = []
            build-backend = "recorder"
            backend-path = ["."]
            """
        )
    )
    secrets = {
        "TWINE_PASSWORD": "twine-secret",
        "BUILDER_REGISTRY_PASSWORD": "registry-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "HF_TOKEN": "hf-secret",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    home = tmp_path / "backend-home"
    home.mkdir()
    runner = wheels._runner(
        tmp_path / "build.log", {"FLASHINFER_LOCAL_VERSION": "sm120.gabc"}, home
    )
    builder = build.ProjectBuilder(project, runner=runner)
    builder.build("wheel", tmp_path / "out")

    seen = json.loads((project / "backend-env.json").read_text())
    assert not set(secrets) & set(seen)
    assert not any(value in json.dumps(seen) for value in secrets.values())
    assert seen["FLASHINFER_LOCAL_VERSION"] == "sm120.gabc"
    assert seen["PATH"]
    # Not the user's HOME (~/.docker/config.json, ~/.netrc): an empty one of its own.
    assert seen["HOME"] == str(home) != os.environ.get("HOME")
    unexpected = set(seen) - {*wheels.BACKEND_ENV_ALLOWLIST, "FLASHINFER_LOCAL_VERSION", "HOME"}
    # What `build` and pyproject_hooks add themselves to talk to the backend.
    assert all(key.startswith(("PEP517", "_PYPROJECT_HOOKS", "PYTHON")) for key in unexpected)


@pytest.mark.parametrize(
    ("url", "secret", "shown"),
    [
        ("https://user:pa55@pypi.internal/simple", "pa55", "https://pypi.internal/simple"),
        ("https://pypi.internal/simple?token=t0k", "t0k", "https://pypi.internal/simple?token=***"),
        (
            "https://b.example/w?X-Amz-Signature=s1g&x=1",
            "s1g",
            "https://b.example/w?X-Amz-Signature=***&x=1",
        ),
        (
            "https://h.example:8443/simple?access_token=a",
            "=a",
            "https://h.example:8443/simple?access_token=***",
        ),
    ],
)
def test_credentials_in_userinfo_and_query_are_found_and_redacted(url, secret, shown) -> None:
    assert has_credentials(url)
    assert redact(url) == shown
    assert secret not in redact(url)


def test_a_plain_url_is_left_alone() -> None:
    url = "https://pypi.internal/simple?page=2"
    assert not has_credentials(url)
    assert redact(url) == url


def test_an_index_token_in_a_build_arg_is_refused_before_anything_runs(builder) -> None:
    result = builder.run(
        "image", "--pip-index-url", "https://pypi.internal/simple?token=t0ps3cret", check=False
    )
    assert result.returncode == 1
    assert "--pip-index-url https://pypi.internal/simple?token=***" in result.stderr
    assert "t0ps3cret" not in result.stderr + result.stdout
    assert "base image" not in result.stderr  # never a hint to bake a secret into an image
    assert not builder.wheelhouse.exists()


def test_a_mirror_token_never_reaches_the_output(builder) -> None:
    """A fetch through a mirror whose URL carries a token (here one that refuses the
    connection): neither the live progress line (shown as on a terminal) nor the error
    shows the token."""
    secret = "ghp_s3cr3tT0ken"
    result = builder.run(
        "sources", "--upstream", "sglang",
        "--mirror", f"https://github.com/sgl-project/=https://ci:{secret}@127.0.0.1:9/",
        check=False, env={"TTY_COMPATIBLE": "1"},
    )  # fmt: skip
    assert result.returncode == 9  # the mirror did not answer: could not check
    assert "127.0.0.1:9" in result.stderr  # the URL is named, redacted
    assert secret not in result.stdout + result.stderr


def test_the_api_key_is_never_sent_across_a_redirect() -> None:
    """wait-ready asks the server it was given: a 302 to another host is its answer (not
    ready), and the other host never sees the request, let alone the key."""
    import http.server
    import threading

    from builder.site import readiness

    seen: list[dict] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirecting(Elsewhere):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}/server_info")
            self.end_headers()

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirecting)
    for each in (other, server):
        threading.Thread(target=each.serve_forever, daemon=True).start()
    try:
        status, _ = readiness._get(
            f"http://127.0.0.1:{server.server_port}/server_info", 5, api_key="sk-s3cret"
        )
    finally:
        server.shutdown()
        other.shutdown()
    assert status == 302 and seen == []


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("--extra-index-url https://ci:t0ps3cret@pypi.internal/simple\ntorch==2.9.1\n", 1),
        # A comment goes into the image too (the file is copied as it is).
        ("torch==2.9.1\n# was: --extra-index-url=https://ci:t0ps3cret@pypi.internal/simple\n", 2),
        ("torch==2.9.1  #https://ci:t0ps3cret@pypi.internal/simple\n", 1),
    ],
)
def test_an_index_token_in_a_requirements_file_is_refused_like_the_flag(
    builder, tmp_path, text: str, number: int
) -> None:
    """--runtime-requirements is copied into the image: every line of it is checked."""
    requirements = tmp_path / "runtime.txt"
    requirements.write_text(text)
    result = builder.run("image", "--runtime-requirements", str(requirements), check=False)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {requirements}:{number}: https://pypi.internal/simple")
    assert "t0ps3cret" not in result.stderr + result.stdout
    assert not builder.wheelhouse.exists()


@pytest.mark.parametrize(
    ("allowed", "reference", "sent"),
    [
        ("registry.internal:5000", "registry.internal:5000/ml/sglang-sm120", True),
        ("registry.internal", "registry.internal:5000/ml/sglang-sm120", True),
        ("registry.internal:5000", "registry.internal:6000/ml/sglang-sm120", False),
        ("registry.internal", "evil.example/ml/sglang-sm120", False),
        ("registry.internal", "lmsysorg/sglang:latest", False),  # Docker Hub
        ("", "registry.internal/ml/sglang-sm120", False),  # no host named: sent nowhere
    ],
)
def test_registry_credentials_go_to_their_registry_only(
    monkeypatch, allowed: str, reference: str, sent: bool
) -> None:
    """An image reference from a manifest or a recipe names any registry: the environment's
    credentials go only to the host BUILDER_REGISTRY_HOST names."""
    from builder.core import registry

    monkeypatch.setenv("BUILDER_REGISTRY_USERNAME", "ci")
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "s3cret-pass")
    monkeypatch.setenv("BUILDER_REGISTRY_HOST", allowed)
    credentials = registry.auth(reference)
    assert (
        (credentials == {"username": "ci", "password": "s3cret-pass"})
        if sent
        else (credentials is None)
    )


def test_a_token_in_the_read_back_url_is_refused_before_any_work(builder) -> None:
    result = builder.run(
        "publish", "--publish-repository", "internal",
        "--publish-simple", "https://u:T0pS3cret@pypi.internal/simple/", check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "--publish-simple https://pypi.internal/simple/: builder reads" in result.stderr
    assert "T0pS3cret" not in result.stderr + result.stdout
    assert "fetch" not in result.stderr and not builder.wheelhouse.exists()
