"""`builder verify IMAGE`: everything the image's recipe promises, checked inside it.

The labels are compared here; the rest runs in a container of the image, without network,
with the image's own Python (`image_check.py`): installed wheels against the recipe and
their RECORD hashes, the patched lines, the kernel wheel and its modules, `pip check`.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import docker
from packaging.utils import canonicalize_name

from builder.core.errors import BuilderError
from builder.spec import lockfile
from builder.spec import recipe as image_recipe
from builder.spec.recipe import LABEL_PREFIX

_SCRIPT = Path(__file__).parent / "probes" / "image_check.py"
_IN_CONTAINER = "/tmp/builder-image-check.py"
_MARK = "BUILDER-VERIFY "


@dataclass(frozen=True)
class Check:
    check: str
    ok: bool
    detail: str

    def to_json(self) -> dict:
        return {"check": self.check, "ok": self.ok, "detail": self.detail}


def _label_check(labels: dict[str, str], recipe: dict) -> Check:
    expected = {f"{LABEL_PREFIX}target": recipe["target"]["name"]}
    for name, wheel in recipe["wheels"].items():
        expected[f"{LABEL_PREFIX}{name}.wheel-sha256"] = wheel["sha256"]
    for name, upstream in recipe["upstreams"].items():
        expected[f"{LABEL_PREFIX}{name}.fork-commit"] = upstream["fork_commit"]
        expected[f"{LABEL_PREFIX}{name}.patch-series-sha256"] = upstream["series_sha256"]
    wrong = sorted(key for key, value in expected.items() if labels.get(key) != value)
    # What launch reads from the registry without pulling must be what the recipe says.
    launch_label = labels.get(image_recipe.LAUNCH_LABEL)
    facts = {key: recipe[key] for key in ("schema_version", "target", "profiles")}
    try:
        if launch_label is not None and json.loads(launch_label) != facts:
            wrong.append(image_recipe.LAUNCH_LABEL)
    except ValueError:
        wrong.append(image_recipe.LAUNCH_LABEL)
    if wrong:
        return Check("labels", False, f"{len(wrong)} label(s) disagree with the recipe: {wrong[0]}")
    return Check("labels", True, f"{len(expected)} labels agree with the recipe")


def _made_from(recipe: dict) -> Check | None:
    """What each wheel was made from, as the recipe records it (images before 0.5.23's
    release-sourced pins have no record: nothing to say)."""
    parts = []
    for name, upstream in recipe["upstreams"].items():
        made = upstream.get("made_from")
        if not made:
            return None
        origin = (
            f"{made['ref']} (sha256 {made['sha256'][:12]})"
            if "sha256" in made
            else (f"{made['url']} {made['ref']}")
        )
        version = recipe["wheels"].get(name, {}).get("version", "?")
        parts.append(
            f"{name} {version} from {origin} at {upstream['commit'][:12]} "
            f"+ {len(upstream['patches'])} patch(es)"
        )
    return Check("sources", True, "; ".join(parts))


def _script_archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = _SCRIPT.read_bytes()
        info = tarfile.TarInfo(Path(_IN_CONTAINER).name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def verify(client: docker.DockerClient, reference: str) -> tuple[dict, list[Check]]:
    """(the image's recipe, one check per promise); pulls the image when it is not here."""
    recipe = image_recipe.from_image(client, reference)
    checks = [_label_check(client.images.get(reference).labels or {}, recipe)]
    made = _made_from(recipe)
    if made:
        checks.append(made)
    container = client.containers.create(
        reference,
        [_IN_CONTAINER, image_recipe.RECIPE_PATH],
        entrypoint=["python"],
        network_mode="none",
    )
    try:
        container.put_archive(str(Path(_IN_CONTAINER).parent), _script_archive())
        container.start()
        status = container.wait(timeout=900)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    found = [line for line in output.splitlines() if line.startswith(_MARK)]
    if not found:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise BuilderError(
            f"verify {reference}: the check in the image ended with exit code "
            f"{status.get('StatusCode')} and no result:\n{tail}"
        )
    checks += [Check(**item) for item in json.loads(found[-1][len(_MARK) :])]
    return recipe, checks


def against_manifest(client: docker.DockerClient, reference: str, recipe: dict, record: dict):
    """The image and its wheels as the build host's manifest recorded them, not only as the
    image says of itself: a pulled image whose recipe was rewritten along with its files
    still fails here."""
    image = client.images.get(reference)
    built = record.get("image") or {}
    pushed = (built.get("pushed") or {}).get("digest")
    same_image = image.id == built.get("image_id") or (
        pushed is not None
        and any(d.endswith(f"@{pushed}") for d in image.attrs.get("RepoDigests") or [])
    )
    checks = [
        Check(
            "manifest image",
            same_image,
            f"{image.id[:19]} is the image the manifest recorded"
            if same_image
            else f"{image.id[:19]} is not the manifest's image ({str(built.get('image_id'))[:19]})",
        )
    ]
    wrong = [
        f"{name} {wheel.get('filename')}"
        for name, wheel in (record.get("wheels") or {}).items()
        if wheel.get("sha256") != (recipe.get("wheels", {}).get(name) or {}).get("sha256")
    ]
    count = len(record.get("wheels") or {})
    checks.append(
        Check(
            "manifest wheels",
            not wrong,
            f"{count} wheels as the manifest recorded them"
            if not wrong
            else "differ from the manifest: " + ", ".join(wrong),
        )
    )
    return checks


def against_lock(client: docker.DockerClient, reference: str, lock_path: Path) -> Check:
    """The packages installed in the image (read in a container of it, without network)
    against a lock of the build host's (`images/<target>/runtime-lock.txt`): every locked
    package present at its version. The lock copy inside the image is not what is read."""
    wanted = lockfile.parse(lock_path)
    # In sys.path order, the first of a name is the one imported: a venv's shadows the
    # base's of that name (a lock that leaves packages to the base).
    script = (
        "import importlib.metadata as m, json, re\n"
        "seen = {}\n"
        "for d in m.distributions():\n"
        "    seen.setdefault(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(), d.version)\n"
        "print(json.dumps(seen))"
    )
    output = client.containers.run(
        reference, ["-c", script], entrypoint=["python"], network_mode="none", remove=True
    )
    installed = {canonicalize_name(k): v for k, v in json.loads(output).items()}
    differ = [
        f"{name} {installed.get(name, 'absent')} (lock: {package.version})"
        for name, package in sorted(wanted.packages.items())
        if installed.get(name) != package.version
    ]
    if not differ:
        return Check(
            "runtime lock", True, f"{len(wanted.packages)} packages installed as {lock_path}"
        )
    more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
    return Check("runtime lock", False, f"differs from {lock_path}: {', '.join(differ[:5])}{more}")
