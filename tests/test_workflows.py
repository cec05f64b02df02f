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


def test_the_workflow_runs_the_check_the_move_and_the_project_s_tests() -> None:
    """What the workflow asks for, read from the file (the steps themselves run on GitHub)."""
    import yaml

    workflow = yaml.safe_load((REPO_ROOT / ".github/workflows/upstream.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert "schedule" in triggers and "workflow_dispatch" in triggers
    steps = workflow["jobs"]["check"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "builder upstream check" in runs and "--json" in runs
    assert "builder upstream move" in runs and "push --force" not in runs
    assert "git ls-remote --exit-code --heads origin" in runs  # an existing move is left alone
    assert "scripts/upstream_github.py issue --label upstream-review" in runs
    # Exit 1 (an index page or wheel refused: the reason in report.md) opens the issue too;
    # 9 (no answer) and 2 (a bug) fail the run.
    check = next(step for step in steps if step.get("id") == "check")["run"]
    assert '[ "$code" -ne 7 ] && [ "$code" -ne 1 ]; then exit "$code"' in check
    assert 'if [ "$code" -eq 1 ]; then echo "failed=true"' in check
    assert 'title="upstream: the check for $TARGET failed"' in runs
    test = workflow["jobs"]["test"]
    assert test["needs"] == "check"
    assert test["steps"][-1]["run"].endswith("bash .ci/run")
    assert test["permissions"] == {"contents": "read"}
    assert test["steps"][0]["with"]["persist-credentials"] is False
    # The pull request only after the project's tests passed on the move.
    pull = workflow["jobs"]["pull-request"]
    assert pull["needs"] == ["check", "test"]
    assert "scripts/upstream_github.py pr" in "\n".join(s.get("run", "") for s in pull["steps"])
    assert workflow["permissions"] == {"contents": "read"}


def test_ci_runs_both_of_readme_s_test_commands() -> None:
    """The default run leaves the engine's tests out (`engine`, tests/conftest.py): CI runs
    them as README's second command, so every check still runs on each change."""
    lines = (REPO_ROOT / ".ci/run").read_text().splitlines()
    ci = [line for line in lines if line.startswith("./")]
    assert ci == ["./scripts/test", "./scripts/test -m engine"]
    readme = (REPO_ROOT / "README.md").read_text().split("\n## ")[0]
    for command in ci:
        assert f"\n    {command}\n" in readme, command


def test_ci_runs_the_engine_s_tests_after_a_failed_default_run(tmp_path: Path) -> None:
    """.ci/run with a stand-in scripts/test (it records its arguments and fails as told):
    both commands run, and the first failure's exit code is CI's."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO_ROOT / ".ci/run", tmp_path / ".ci/run")
    stand_in = tmp_path / "scripts/test"
    for default, engine, expected in ((3, 5, 3), (0, 5, 5), (0, 0, 0)):
        stand_in.write_text(
            "#!/usr/bin/env bash\n"
            'echo "$*" >> "$(dirname "$0")/calls"\n'
            f'[ "$*" = "-m engine" ] && exit {engine}\nexit {default}\n'
        )
        stand_in.chmod(0o755)
        (tmp_path / "scripts/calls").unlink(missing_ok=True)
        result = subprocess.run(["bash", tmp_path / ".ci/run"], capture_output=True)
        assert result.returncode == expected, (default, engine, result.returncode)
        assert (tmp_path / "scripts/calls").read_text().splitlines() == ["", "-m engine"]
