"""Stage 5b: publish the wheels to a private package index, never overwriting a file.

Two ways: upload with twine to any index with the standard upload API (pypiserver,
devpi, Artifactory, ...), or write a static PEP 503 index (plus PEP 691 JSON) into a
directory nginx or object storage can serve. Either way builder first reads what the
index already holds: the same file with the same sha256 is skipped, the same file name
with another sha256 is refused. After publishing it resolves each wheel back from the
index and compares sha256; only verified wheels are recorded as published.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import sys
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.build.simple_index import IndexFile, parse_project_page, read_project
from builder.build.wheels import BuiltWheel
from builder.core import progress
from builder.core.cache import atomic_copy, atomic_write_text, sha256_file
from builder.core.errors import BuilderError
from builder.core.untrusted import printable
from builder.core.urls import redact

_CREDENTIAL_HINT = "check TWINE_USERNAME/TWINE_PASSWORD, your keyring or ~/.pypirc"


def _check_immutable(wheel: BuiltWheel, existing: dict[str, IndexFile], where: str) -> bool:
    """True if the same file is already there; error if a different one has its name."""
    present = existing.get(wheel.filename)
    if present is None:
        return False
    if present.sha256 != wheel.sha256:
        raise BuilderError(
            f"{where} already has {wheel.filename} with sha256 {present.sha256 or 'unknown'}, "
            f"ours is {wheel.sha256}: refusing to overwrite a published file (change the patch "
            "series so the version changes, or remove the old file on the index)"
        )
    return True


def _record(index: str, found: IndexFile, action: str) -> dict:
    return {
        "index": redact(index),
        "url": redact(found.url),
        "sha256": found.sha256,
        "action": action,
    }


def _verify(simple_url: str, wheel: BuiltWheel, index: str, action: str) -> dict:
    found = read_project(simple_url, wheel.dist_name).get(wheel.filename)
    if found is None or found.sha256 != wheel.sha256:
        got = "missing" if found is None else f"sha256 {found.sha256}"
        raise BuilderError(
            f"{redact(index)}: after publishing, {wheel.filename} resolves as {got}, "
            f"expected {wheel.sha256}"
        )
    return _record(index, found, action)


def pypirc_url(repository: str) -> str:
    """The upload URL of a ~/.pypirc section."""
    from twine import exceptions as twine_errors
    from twine.utils import get_repository_from_config

    try:
        config = get_repository_from_config("~/.pypirc", repository)
    except twine_errors.TwineException as exc:
        raise BuilderError(f"--repository {repository}: {exc}") from None
    return config["repository"]


def default_simple_url(upload_url: str) -> str:
    return upload_url.rstrip("/") + "/simple/"


def _upload(upload_url: str, repository: str | None, wheel: BuiltWheel) -> None:
    # twine (and requests) take a while to import; only uploads need them.
    import requests
    from twine import exceptions as twine_errors
    from twine.commands.upload import upload
    from twine.settings import Settings

    # With a .pypirc section, twine takes URL and credentials from it; else from the env.
    settings = Settings(
        repository_url=None if repository else upload_url,
        repository_name=repository or "pypi",
        # Settings does not read the environment itself (twine's CLI does).
        username=os.environ.get("TWINE_USERNAME"),
        password=os.environ.get("TWINE_PASSWORD"),
        non_interactive=True,
        disable_progress_bar=True,
    )
    try:
        # twine prints progress to stdout; stdout is reserved for --json results.
        with contextlib.redirect_stdout(sys.stderr):
            upload(settings, [str(wheel.path)])
    except requests.HTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        reason = printable(exc.response.reason if exc.response is not None else exc)
        hint = {401: _CREDENTIAL_HINT, 403: _CREDENTIAL_HINT}.get(status, "")
        if status in (400, 409):
            hint = "the index refused the file (it may exist with other content)"
        raise BuilderError(
            f"upload of {wheel.filename} to {redact(upload_url)} failed: "
            f"{status} {reason}" + (f" ({hint})" if hint else "")
        ) from None
    except requests.ConnectionError:
        raise BuilderError(f"index {redact(upload_url)} is unreachable") from None
    except twine_errors.TwineException as exc:
        raise BuilderError(f"upload of {wheel.filename}: {exc}") from None


def publish_to_index(
    wheels: list[BuiltWheel], upload_url: str, simple_url: str, repository: str | None = None
) -> dict[str, dict]:
    """Upload the wheels that are not there yet; return {wheel name: verified record}."""
    records: dict[str, dict] = {}
    where = redact(upload_url)
    for wheel in wheels:
        existing = read_project(simple_url, wheel.dist_name)
        if _check_immutable(wheel, existing, where):
            progress.info(f"[green]✓[/] {wheel.filename} already on {where} (same sha256): skipped")
            records[wheel.name] = _verify(simple_url, wheel, upload_url, "already-present")
            continue
        with progress.task(f"upload {wheel.filename} to {where}"):
            _upload(upload_url, repository, wheel)
        records[wheel.name] = _verify(simple_url, wheel, upload_url, "uploaded")
    return records


def _project_page(project: str, files: list[Path]) -> str:
    links = "\n".join(
        f'    <a href="../../files/{html.escape(f.name)}#sha256={sha256_file(f)}">'
        f"{html.escape(f.name)}</a><br/>"
        for f in files
    )
    return (
        '<!DOCTYPE html>\n<html>\n  <head><meta name="pypi:repository-version" content="1.0">'
        f"<title>Links for {project}</title></head>\n  <body>\n    <h1>Links for {project}</h1>\n"
        f"{links}\n  </body>\n</html>\n"
    )


def _project_json(project: str, files: list[Path]) -> str:
    return json.dumps(
        {
            "meta": {"api-version": "1.0"},
            "name": project,
            "files": [
                {
                    "filename": f.name,
                    "url": f"../../files/{f.name}",
                    "hashes": {"sha256": sha256_file(f)},
                }
                for f in files
            ],
        },
        indent=2,
    )


def _files_of(files_dir: Path, project: str) -> list[Path]:
    found = []
    for path in sorted(files_dir.glob("*.whl")):
        with contextlib.suppress(ValueError):
            if parse_wheel_filename(path.name)[0] == project:
                found.append(path)
    return found


def publish_static(wheels: list[BuiltWheel], directory: Path) -> dict[str, dict]:
    """Add the wheels to a static PEP 503/691 index in `directory`, keeping what is there."""
    directory = directory.resolve()
    files_dir = directory / "files"
    simple = directory / "simple"
    files_dir.mkdir(parents=True, exist_ok=True)
    index_url = directory.as_uri() + "/simple/"
    records: dict[str, dict] = {}
    actions: dict[str, str] = {}
    with FileLock(directory / ".builder-index.lock"):
        for wheel in wheels:
            project = canonicalize_name(wheel.dist_name)
            existing = {
                f.name: IndexFile(f.name, f.as_uri(), sha256_file(f))
                for f in _files_of(files_dir, project)
            }
            present = _check_immutable(wheel, existing, str(directory))
            actions[wheel.name] = "already-present" if present else "written"
            if not present:
                atomic_copy(wheel.path, files_dir / wheel.filename)
            files = _files_of(files_dir, project)
            atomic_write_text(simple / project / "index.html", _project_page(project, files))
            atomic_write_text(simple / project / "index.json", _project_json(project, files))
        projects = sorted(p.name for p in simple.iterdir() if (p / "index.html").is_file())
        root = "".join(f'    <a href="{p}/">{p}</a><br/>\n' for p in projects)
        atomic_write_text(
            simple / "index.html",
            f"<!DOCTYPE html>\n<html>\n  <body>\n{root}  </body>\n</html>\n",
        )
        for wheel in wheels:
            page = simple / canonicalize_name(wheel.dist_name) / "index.html"
            found = parse_project_page(page.read_bytes(), "text/html", page.as_uri()).get(
                wheel.filename
            )
            if found is None or found.sha256 != wheel.sha256:
                raise BuilderError(f"{page}: {wheel.filename} did not verify after writing")
            records[wheel.name] = _record(index_url, found, actions[wheel.name])
    return records
