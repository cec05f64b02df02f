"""The GitHub workflows: every file passes actionlint, and the weekly upstream workflow's
GitHub steps (scripts/upstream_github.py) ask the REST API what they should.

GitHub's API is the one part not run for real: a loopback stand-in (http.server on
127.0.0.1) answers the few calls the script makes and records each request, method, path,
query, headers and body; nothing leaves the machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import REPO_ROOT

WORKFLOWS = sorted((REPO_ROOT / ".github/workflows").glob("*.yml"))
SCRIPT = REPO_ROOT / "scripts/upstream_github.py"
ACTIONLINT = Path(sys.executable).parent / "actionlint"


def _actionlint(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", *map(str, files)], capture_output=True, text=True
    )


def test_every_workflow_passes_actionlint(tmp_path: Path) -> None:
    assert ACTIONLINT.is_file(), "actionlint is in the test extra (scripts/setup --test)"
    assert {w.name for w in WORKFLOWS} >= {"ci.yml", "upstream.yml"}
    result = _actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    # and it does look: an output no step writes is an error
    broken = tmp_path / ".github/workflows/broken.yml"
    broken.parent.mkdir(parents=True)
    text = (REPO_ROOT / ".github/workflows/upstream.yml").read_text()
    broken.write_text(text.replace("steps.check.outputs.ok ==", "steps.chekc.outputs.ok ==", 1))
    found = _actionlint(broken)
    assert found.returncode == 1 and "chekc" in found.stdout, found.stdout


class _GitHub(BaseHTTPRequestHandler):
    """Answers as GitHub's REST API would for the calls the script makes; records them."""

    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        url = urlsplit(self.path)
        self.server.requests.append(
            {
                "method": self.command,
                "path": url.path,
                "query": {k: v[0] for k, v in parse_qs(url.query).items()},
                "authorization": self.headers.get("Authorization"),
                "accept": self.headers.get("Accept"),
                "body": body,
            }
        )
        status, answer = self.server.answers.get((self.command, url.path), (404, {}))
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    requests: list[dict]
    answers: dict[tuple[str, str], tuple[int, object]]


@pytest.fixture
def github():
    server = _Server(("127.0.0.1", 0), _GitHub)
    server.requests, server.answers = [], {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _script(github: _Server, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    body = tmp_path / "report.md"
    body.write_text("**sm120: sglang 0.5.22 -> 0.5.23: clean**\n")
    environment = {
        "PATH": "/usr/bin:/bin",
        "GITHUB_API_URL": f"http://127.0.0.1:{github.server_address[1]}",
        "GITHUB_REPOSITORY": "example/builder",
        "GITHUB_TOKEN": "token-for-the-stand-in",
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--body-file", str(body)],
        capture_output=True, text=True, env=environment,
    )  # fmt: skip


PULLS = "/repos/example/builder/pulls"
ISSUES = "/repos/example/builder/issues"


def test_a_clean_move_opens_a_pull_request_and_a_second_run_updates_it(
    github: _Server, tmp_path: Path
) -> None:
    github.answers = {
        ("GET", PULLS): (200, []),
        ("POST", PULLS): (201, {"number": 12, "html_url": "https://github.invalid/pull/12"}),
    }
    pr = ("pr", "--branch", "upstream/sm120-sglang-0.5.23", "--base", "main",
          "--title", "upstream: sm120 onto sglang 0.5.23")  # fmt: skip
    opened = _script(github, tmp_path, *pr)
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.strip() == "https://github.invalid/pull/12"
    looked, made = github.requests
    assert (looked["method"], looked["path"]) == ("GET", PULLS)
    assert looked["query"] == {"head": "example:upstream/sm120-sglang-0.5.23", "state": "open"}
    assert made["method"] == "POST" and made["body"] == {
        "title": "upstream: sm120 onto sglang 0.5.23", "head": "upstream/sm120-sglang-0.5.23",
        "base": "main", "body": "**sm120: sglang 0.5.22 -> 0.5.23: clean**\n",
    }  # fmt: skip
    assert all(r["authorization"] == "Bearer token-for-the-stand-in" for r in github.requests)
    assert all(r["accept"] == "application/vnd.github+json" for r in github.requests)

    github.requests.clear()
    github.answers[("GET", PULLS)] = (200, [{"number": 12}])
    github.answers[("PATCH", f"{PULLS}/12")] = (200, {"html_url": "https://github.invalid/pull/12"})
    again = _script(github, tmp_path, *pr)
    assert again.returncode == 0, again.stderr
    assert [(r["method"], r["path"]) for r in github.requests] == [
        ("GET", PULLS), ("PATCH", f"{PULLS}/12"),
    ]  # fmt: skip


def test_a_release_that_needs_review_opens_one_issue_then_updates_it(
    github: _Server, tmp_path: Path
) -> None:
    issue = ("issue", "--label", "upstream-review",
             "--title", "upstream: sglang 0.5.23 needs review for sm120")  # fmt: skip
    github.answers = {
        ("GET", ISSUES): (200, [{"number": 3, "pull_request": {}}]),  # a PR is no issue
        ("POST", ISSUES): (201, {"number": 4, "html_url": "https://github.invalid/issues/4"}),
    }
    opened = _script(github, tmp_path, *issue)
    assert opened.returncode == 0, opened.stderr
    looked, made = github.requests
    assert looked["query"] == {"labels": "upstream-review", "state": "open"}
    assert made["method"] == "POST" and made["body"]["labels"] == ["upstream-review"]

    github.requests.clear()
    github.answers[("GET", ISSUES)] = (200, [{"number": 4}])
    github.answers[("PATCH", f"{ISSUES}/4")] = (
        200,
        {"html_url": "https://github.invalid/issues/4"},
    )
    assert _script(github, tmp_path, *issue).returncode == 0
    assert [(r["method"], r["path"]) for r in github.requests] == [
        ("GET", ISSUES), ("PATCH", f"{ISSUES}/4"),
    ]  # fmt: skip
    assert github.requests[1]["body"]["title"] == "upstream: sglang 0.5.23 needs review for sm120"


def test_an_api_error_is_one_line(github: _Server, tmp_path: Path) -> None:
    github.answers = {("GET", ISSUES): (401, {"message": "Bad credentials"})}
    failed = _script(github, tmp_path, "issue", "--label", "l", "--title", "t")
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines() == [
        f'error: GET {ISSUES}: 401 Unauthorized {{"message": "Bad credentials"}}'
    ]


def _workflow(name: str) -> dict:
    import yaml

    return yaml.safe_load((REPO_ROOT / ".github/workflows" / name).read_text())


def test_the_workflow_checks_moves_tests_then_pushes() -> None:
    """What the workflow asks for, read from the file (the steps themselves run on GitHub)."""
    workflow = _workflow("upstream.yml")
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert "schedule" in triggers and "workflow_dispatch" in triggers
    jobs = workflow["jobs"]
    runs = "\n".join(step.get("run", "") for step in jobs["check"]["steps"])
    assert "builder upstream check" in runs and "--json" in runs
    assert "builder upstream move" in runs and "git bundle create" in runs
    assert jobs["test"]["needs"] == "check"
    assert jobs["test"]["steps"][-1]["run"].endswith("bash .ci/run")
    # Pushed, and a pull request opened, only after the project's tests passed on the move.
    assert jobs["push"]["needs"] == ["check", "test"]
    assert "push --force" not in _runs(jobs["push"])
    assert "git ls-remote --exit-code --heads origin" in _runs(jobs["push"])
    assert jobs["pull-request"]["needs"] == ["check", "push"]
    assert "scripts/upstream_github.py pr" in _runs(jobs["pull-request"])
    assert "scripts/upstream_github.py issue --label upstream-review" in _runs(jobs["issue"])
    # Exit 1 (an index page or wheel refused: the reason in report.md) opens the issue too;
    # 9 (no answer) and 2 (a bug) fail the run.
    check = next(step for step in jobs["check"]["steps"] if step.get("id") == "check")["run"]
    assert '[ "$code" -ne 7 ] && [ "$code" -ne 1 ]; then exit "$code"' in check
    assert 'if [ "$code" -eq 1 ]; then echo "failed=true"' in check
    assert jobs["check"]["outputs"]["failed"] == "${{ steps.check.outputs.failed }}"
    assert 'title="upstream: the check for $TARGET failed"' in _runs(jobs["issue"])


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


_UPSTREAM_CODE = ("scripts/setup", ".venv/bin/builder", ".ci/run", "scripts/test", "pip install")


@pytest.mark.parametrize("name", [w.name for w in WORKFLOWS])
def test_no_job_that_runs_upstream_code_holds_a_token_that_writes(name: str) -> None:
    """#54: whoever publishes a release in the dependency tree chooses code that runs where
    upstream code runs; there the token only reads and checkout persists none. The jobs that
    write run none of it (git, and the standard-library GitHub script)."""
    workflow = _workflow(name)
    assert workflow["permissions"] == {"contents": "read"}
    for job_name, job in workflow["jobs"].items():
        permissions = job.get("permissions", workflow["permissions"])
        writes = sorted(scope for scope, level in permissions.items() if level == "write")
        runs_upstream = [marker for marker in _UPSTREAM_CODE if marker in _runs(job)]
        assert not (writes and runs_upstream), (
            f"{name}: job {job_name} holds {writes} and runs {runs_upstream}"
        )
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout@") and "contents" not in writes:
                assert step.get("with", {}).get("persist-credentials") is False, (
                    f"{name}: job {job_name} persists a token it does not need"
                )


@pytest.mark.parametrize("name", [w.name for w in WORKFLOWS])
def test_every_action_is_pinned_by_commit(name: str) -> None:
    import re

    for job in _workflow(name)["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]


def _push_step() -> str:
    (step,) = [
        s for s in _workflow("upstream.yml")["jobs"]["push"]["steps"] if s.get("id") == "push"
    ]
    return step["run"]


def _git(cwd: Path, *args: str) -> str:
    environment = {
        "PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }  # fmt: skip
    return subprocess.run(
        ["git", *args], cwd=cwd, env=environment, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def moved(tmp_path: Path) -> dict:
    """A remote at commit A, a checkout of it, and the check job's bundle of a move onto A."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(tmp_path, "init", "-q", "-b", "main", str(work))
    (work / "pin").write_text("0.5.22\n")
    _git(work, "add", "pin")
    _git(work, "commit", "-qm", "A")
    _git(work, "remote", "add", "origin", str(origin))
    _git(work, "push", "-q", "origin", "main")
    base = _git(work, "rev-parse", "HEAD")
    _git(work, "switch", "-qc", "move")
    (work / "pin").write_text("0.5.23\n")
    _git(work, "commit", "-qam", "move")
    bundle = tmp_path / "runner/move/move.bundle"
    bundle.parent.mkdir(parents=True)
    _git(work, "bundle", "create", "-q", str(bundle), f"{base}..move")
    checkout = tmp_path / "checkout"
    _git(tmp_path, "clone", "-q", str(origin), str(checkout))
    return {"origin": origin, "checkout": checkout, "base": base, "runner": tmp_path / "runner"}


def _push(moved: dict, to: str, sha: str | None = None) -> subprocess.CompletedProcess:
    output = moved["runner"] / "output"
    output.write_text("")
    environment = {
        "PATH": "/usr/bin:/bin", "HOME": str(moved["runner"]), "TARGET": "sm120", "TO": to,
        "GITHUB_SHA": sha or moved["base"], "RUNNER_TEMP": str(moved["runner"]),
        "GITHUB_OUTPUT": str(output),
    }  # fmt: skip
    return subprocess.run(
        ["bash", "-e", "-c", _push_step()], cwd=moved["checkout"], env=environment,
        capture_output=True, text=True,
    )  # fmt: skip


def test_the_push_job_pushes_the_tested_move_to_its_branch(moved: dict) -> None:
    pushed = _push(moved, "0.5.23")
    assert pushed.returncode == 0, pushed.stderr
    assert (moved["runner"] / "output").read_text() == "branch=upstream/sm120-sglang-0.5.23\n"
    shown = _git(moved["origin"], "show", "upstream/sm120-sglang-0.5.23:pin")
    assert shown == "0.5.23"
    again = _push(moved, "0.5.23")  # a branch that exists is left as it is
    assert again.returncode == 0 and "left as it is" in again.stdout
    assert (moved["runner"] / "output").read_text() == ""


@pytest.mark.parametrize("to", ["0.5.23 main", "$(touch x)", "../../main", ""])
def test_the_push_job_refuses_a_version_that_is_not_one(moved: dict, to: str) -> None:
    refused = _push(moved, to)
    assert refused.returncode == 1
    assert refused.stdout.strip() == f"refused: '{to}' is not a version"
    assert _git(moved["origin"], "branch", "--format=%(refname:short)") == "main"


def test_the_push_job_refuses_a_bundle_not_grown_from_this_run_s_commit(moved: dict) -> None:
    checkout = moved["checkout"]
    (checkout / "other").write_text("x\n")
    _git(checkout, "add", "other")
    _git(checkout, "commit", "-qm", "another base")
    refused = _push(moved, "0.5.23", sha=_git(checkout, "rev-parse", "HEAD"))
    assert refused.returncode != 0
    assert _git(moved["origin"], "branch", "--format=%(refname:short)") == "main"


def test_ci_runs_readme_s_one_test_command() -> None:
    """One command runs every test CI runs, the engine's included: README's, verbatim."""
    lines = (REPO_ROOT / ".ci/run").read_text().splitlines()
    ci = [line for line in lines if line.startswith("./")]
    assert ci == ["./scripts/test"]
    readme = (REPO_ROOT / "README.md").read_text().split("\n## ")[0]
    shown = [line.strip() for line in readme.splitlines() if line.startswith("    ./")]
    assert shown == ci
    addopts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert "engine" not in addopts["ini_options"]["addopts"], "the engine's tests left out"


def test_ci_fails_as_the_test_command_does(tmp_path: Path) -> None:
    """.ci/run with a stand-in scripts/test (it records its arguments and exits as told)."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO_ROOT / ".ci/run", tmp_path / ".ci/run")
    stand_in = tmp_path / "scripts/test"
    for code in (3, 0):
        stand_in.write_text(
            f'#!/usr/bin/env bash\necho "$*" >> "$(dirname "$0")/calls"\nexit {code}\n'
        )
        stand_in.chmod(0o755)
        (tmp_path / "scripts/calls").unlink(missing_ok=True)
        result = subprocess.run(["bash", tmp_path / ".ci/run"], capture_output=True)
        assert result.returncode == code
        assert (tmp_path / "scripts/calls").read_text().splitlines() == [""]
