#!/usr/bin/env python3
"""The weekly upstream workflow's GitHub side (.github/workflows/upstream.yml), through the
REST API with the workflow's GITHUB_TOKEN (Python's standard library only):

  upstream_github.py pr --branch B --base main --title T --body-file report.md
      opens a pull request from B, or updates the open one from B (title and body);
  upstream_github.py issue --label upstream-review --title T --body-file report.md
      opens an issue with that label, or updates the open one that has it (one issue, the
      latest report), so a release that needs review is not reported every week anew.

Environment: GITHUB_TOKEN, GITHUB_REPOSITORY (owner/name), GITHUB_API_URL (default
https://api.github.com; the tests point it at a loopback stand-in). Prints the URL of the
pull request or issue; an error is one line and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

TIMEOUT_S = 60


class Failed(Exception):
    pass


def _environment(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        raise Failed(f"{name} is not set")
    return value


def _call(method: str, path: str, body: dict | None = None, query: dict | None = None):
    api = _environment("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    url = f"{api}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "Authorization": f"Bearer {_environment('GITHUB_TOKEN')}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "builder-upstream-workflow",
            **({"Content-Type": "application/json"} if body is not None else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:200]
        raise Failed(f"{method} {path}: {exc.code} {exc.reason} {detail}".strip()) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Failed(f"{method} {path}: {getattr(exc, 'reason', exc)}") from None
    try:
        return json.loads(answer or b"null")
    except ValueError:
        raise Failed(f"{method} {path}: the answer is not JSON") from None


def _open_numbers(found, path: str) -> list[int]:
    """The numbers of what a list call found (GitHub answers a list of objects)."""
    if not isinstance(found, list) or not all(
        isinstance(entry, dict) and isinstance(entry.get("number"), int) for entry in found
    ):
        raise Failed(f"GET {path}: not a list of numbered items")
    return [entry["number"] for entry in found]


def _repository() -> tuple[str, str]:
    repository = _environment("GITHUB_REPOSITORY")
    owner, _, name = repository.partition("/")
    if not owner or not name:
        raise Failed(f"GITHUB_REPOSITORY={repository}: expected owner/name")
    return owner, name


def pull_request(branch: str, base: str, title: str, body: str) -> dict:
    owner, name = _repository()
    listed = f"/repos/{owner}/{name}/pulls"
    found = _open_numbers(
        _call("GET", listed, query={"head": f"{owner}:{branch}", "state": "open"}), listed
    )
    if found:
        number = found[0]
        return _call("PATCH", f"/repos/{owner}/{name}/pulls/{number}",
                     {"title": title, "body": body})  # fmt: skip
    return _call("POST", f"/repos/{owner}/{name}/pulls",
                 {"title": title, "head": branch, "base": base, "body": body})  # fmt: skip


def issue(label: str, title: str, body: str) -> dict:
    owner, name = _repository()
    listed = f"/repos/{owner}/{name}/issues"
    answer = _call("GET", listed, query={"labels": label, "state": "open"})
    if isinstance(answer, list):  # GitHub lists pull requests among issues: not those
        answer = [
            entry for entry in answer if not isinstance(entry, dict) or "pull_request" not in entry
        ]
    found = _open_numbers(answer, listed)
    if found:
        number = found[0]
        return _call("PATCH", f"/repos/{owner}/{name}/issues/{number}",
                     {"title": title, "body": body})  # fmt: skip
    return _call("POST", f"/repos/{owner}/{name}/issues",
                 {"title": title, "body": body, "labels": [label]})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    opened = actions.add_parser("pr", help="open or update the pull request from BRANCH")
    opened.add_argument("--branch", required=True)
    opened.add_argument("--base", required=True)
    reported = actions.add_parser("issue", help="open or update the issue with LABEL")
    reported.add_argument("--label", required=True)
    for each in (opened, reported):
        each.add_argument("--title", required=True)
        each.add_argument("--body-file", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        body = args.body_file.read_text()
        if args.action == "pr":
            result = pull_request(args.branch, args.base, args.title, body)
        else:
            result = issue(args.label, args.title, body)
    except (OSError, Failed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(result.get("html_url", "") if isinstance(result, dict) else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
