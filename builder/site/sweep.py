"""`qualify --sweep`'s verdict: per concurrency level, the fastest profile that passed every
check and every mandatory gate (output tok/s), and one choice at a stated level, written as
chosen.json for `deploy-files --profile chosen`.

A profile stands when its receipt's result is ok and each mandatory gate passed: a gate
skipped (`--gsm8k none`, or not reached) is not passed. Equal figures go to the profile
named first in --sweep (the operator's order is the preference).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from builder.core.errors import BuilderError
from builder.core.identity import builder_identity
from builder.site import gates as gate_list
from builder.spec import engines

CHOSEN_SCHEMA = "builder-qualify-chosen/2"
# Read back by --compare (the receipts' order); deploy-files refuses it: it does not record
# the model, HF cache and port the sweep served.
OLD_CHOSEN_SCHEMAS = ("builder-qualify-chosen/1",)
CHOSEN_FILE = "chosen.json"


def profile_names(text: str) -> list[str]:
    """--sweep's list: profile names, each once; `ENGINE/PROFILE` names a profile of the
    image that serves with ENGINE (`vllm/glm5-nvfp4-tp8`), for a sweep across engines."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or len(set(names)) != len(names):
        raise BuilderError(f"--sweep {text!r}: expected profile names, each once, e.g. a,b")
    for name in names:
        engine, slash, _ = name.rpartition("/")
        if slash and engine not in engines.NAMES:
            raise BuilderError(
                f"--sweep {name}: {engine!r} is not an engine ({', '.join(engines.NAMES)}); "
                "write ENGINE/PROFILE"
            )
    return names


def split_entry(entry: str) -> tuple[str | None, str]:
    """(engine or None, profile) of a --sweep entry."""
    engine, slash, profile = entry.rpartition("/")
    return (engine if slash else None), profile


@dataclass(frozen=True)
class Swept:
    profile: str
    receipt: dict
    path: str  # the receipt, relative to the sweep's folder
    label: str = ""  # the --sweep entry, where it is not the profile (ENGINE/PROFILE)

    @property
    def entry(self) -> str:
        return self.label or self.profile


def standing(receipt: dict, allow_partial: bool = False) -> tuple[bool, str | None, str | None]:
    """(stands, where it fell: a check, `gate NAME` or `partial`, why). A partial receipt
    (verify, the backends or throughput not run) stands only with --allow-partial."""
    result = receipt["result"]
    if result.get("verdict") == "partial":
        if not allow_partial:
            return False, "partial", result["message"]
        result = {**result, "ok": True}
    if not result["ok"] and result["failed_at"] != "correctness":
        return False, result["failed_at"], result["message"]
    gates = receipt.get("gates")
    if not gates:
        return False, "gates", "the receipt has no gates (made before they existed)"
    fell = gate_list.not_passed(gates)
    if fell:
        why = f"{fell['status']}: {fell['why'] or fell['result']}"
        return False, f"gate {fell['name']}", why
    if not result["ok"]:
        return False, result["failed_at"], result["message"]
    return True, None, None


def level_figure(receipt: dict, concurrency: int) -> float | None:
    """Output tok/s at that level, when some request completed there."""
    for level in (receipt.get("throughput") or {}).get("levels") or []:
        if level["concurrency"] == concurrency and level.get("completed"):
            return level.get("output_throughput")
    return None


def image_ref(image: dict | None) -> str | None:
    """The image by digest: its registry's where it has one, else its local id (a content
    digest too); never a tag, which can move."""
    if not image:
        return None
    digests = image.get("repo_digests") or []
    return digests[0] if digests else image.get("id")


def is_commit(revision: str | None) -> bool:
    """A 40-hex commit: a hub revision that cannot move."""
    return bool(revision) and re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def is_partial(receipt: dict) -> bool:
    return receipt["result"].get("verdict") == "partial"


def _choice(swept: Swept, concurrency: int, figure: float, ties: list[str]) -> dict:
    server = swept.receipt["server"]
    return {
        "concurrency": concurrency,
        "entry": swept.entry,
        "engine": server.get("engine") or engines.DEFAULT,
        "profile": swept.profile,
        "output_throughput": figure,
        "receipt": swept.path,
        "params": server.get("params") or [],
        "image": server.get("image"),
        "image_ref": image_ref(server.get("image")),
        # The model, HF cache, port, API key file and extra args it was started with (the
        # receipt's): with the image, profile and params, what deploy-files reproduces.
        "launch": server.get("launch"),
        "partial": is_partial(swept.receipt),
        "ties": ties,
    }


def choose(
    swept: list[Swept], levels: list[int], choose_at: int, allow_partial: bool = False
) -> dict:
    """chosen.json: the choice at `choose_at`, the choice per level, and every profile with
    where it fell."""
    stands = {s.entry: standing(s.receipt, allow_partial) for s in swept}
    per_level = []
    for concurrency in levels:
        ranked = [
            (s, figure)
            for s in swept
            if stands[s.entry][0] and (figure := level_figure(s.receipt, concurrency)) is not None
        ]
        ranked.sort(key=lambda pair: -pair[1])  # stable: equal figures keep the --sweep order
        if not ranked:
            per_level.append({"concurrency": concurrency, "profile": None})
            continue
        best, figure = ranked[0]
        ties = [s.entry for s, other in ranked[1:] if other == figure]
        per_level.append(_choice(best, concurrency, figure, ties))
    chosen = next((c for c in per_level if c["concurrency"] == choose_at), None)
    profiles = []
    for s in swept:
        ok, fell, why = stands[s.entry]
        attempts = (s.receipt.get("startup") or {}).get("attempts") or []
        profiles.append({
            "profile": s.profile, "entry": s.entry, "receipt": s.path, "stands": ok,
            "fell_at": fell, "why": why,
            "engine": s.receipt["server"].get("engine") or engines.DEFAULT,
            "params": s.receipt["server"].get("params") or [],
            "fallback_used": bool(attempts), "partial": is_partial(s.receipt),
        })  # fmt: skip
    return {
        "schema": CHOSEN_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "builder": builder_identity(),
        "rule": "per level the highest output tok/s among profiles whose result is ok and "
        "whose every mandatory gate passed (skipped is not passed)"
        + (", partial receipts allowed (--allow-partial)" if allow_partial else "")
        + "; a tie goes to the profile named first in --sweep",
        "choose_at": choose_at,
        "chosen": chosen if chosen and chosen["profile"] else None,
        "levels": per_level,
        "profiles": profiles,
    }


def table(doc: dict, swept: list[Swept]) -> list[list[str]]:
    """The verdict as rows: a profile a row, its output tok/s per level (`*`: chosen
    there), and where it fell."""
    levels = [c["concurrency"] for c in doc["levels"]]
    chosen_at = {(_entry(c), c["concurrency"]) for c in doc["levels"] if c["profile"]}
    rows = [["profile", "verdict", *(f"c={level}" for level in levels)]]
    by_name = {s.entry: s for s in swept}
    for entry in doc["profiles"]:
        receipt = by_name[_entry(entry)].receipt
        verdict = said(entry["stands"], entry["fell_at"], entry["why"], entry["partial"])
        if entry["fallback_used"]:
            verdict += " (on its fallback)"
        cells = []
        for level in levels:
            figure = level_figure(receipt, level)
            mark = "*" if (_entry(entry), level) in chosen_at else ""
            cells.append("-" if figure is None else f"{figure:g}{mark}")
        rows.append([_entry(entry), verdict[:70], *cells])
    return rows


def _entry(choice: dict) -> str:
    """The --sweep entry a choice or profile row names (its profile, in a file written
    before sweeps across engines)."""
    return choice.get("entry") or choice["profile"]


def said(stands: bool, fell_at: str | None, why: str | None, partial: bool) -> str:
    """A profile's verdict in a sweep, worded one way wherever it is shown: `ok`, `partial`
    (verify, the backends or throughput did not run; chosen only with --allow-partial), or
    `FAIL` where it fell and why."""
    if stands:
        return "partial" if partial else "ok"
    if fell_at == "partial":
        return "partial (not chosen without --allow-partial)"
    return f"FAIL {fell_at}: {why}"


def summary(doc: dict) -> str:
    chosen = doc["chosen"]
    if not chosen:
        return f"no profile stands at concurrency {doc['choose_at']}: nothing chosen"
    return (
        f"chosen at concurrency {chosen['concurrency']}: {_entry(chosen)} "
        f"({chosen['output_throughput']:g} output tok/s)"
    )


def load_chosen(folder: str | Path) -> dict:
    """A sweep's chosen.json, checked to be one."""
    path = Path(folder) / CHOSEN_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise BuilderError(f"{path}: not a readable {CHOSEN_FILE} ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") not in (CHOSEN_SCHEMA, *OLD_CHOSEN_SCHEMAS):
        raise BuilderError(f"{path}: not a {CHOSEN_SCHEMA} file")
    problem = _chosen_problem(doc)
    if problem:
        raise BuilderError(f"{path}: not a {CHOSEN_SCHEMA} file ({problem})")
    return doc


def _is_pairs(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, str) for v in pair)
        for pair in value
    )


def _chosen_problem(doc: dict) -> str | None:
    """What in a chosen.json is not as `choose` writes it (read back by deploy-files and
    --compare: a hand-edited or truncated file is one line, not a traceback)."""
    if "chosen" not in doc:
        return "no chosen (null where the sweep chose none)"
    chosen = doc["chosen"]
    if chosen is not None:
        if not isinstance(chosen, dict):
            return "chosen is not an object"
        if not (isinstance(chosen.get("profile"), str) and chosen["profile"].isprintable()):
            return "chosen.profile is not a profile name"
        if not _is_pairs(chosen.get("params")):
            return "chosen.params is not a list of [key, value]"
        if not isinstance(chosen.get("image_ref"), str | None):
            return "chosen.image_ref is not a string"
        image = chosen.get("image")
        if not isinstance(image, dict | None):
            return "chosen.image is not an object"
        if image and not (
            isinstance(image.get("reference"), str | None)
            and isinstance(image.get("id"), str | None)
            and isinstance(image.get("repo_digests", []), list)
            and all(isinstance(d, str) for d in image.get("repo_digests", []))
        ):
            return "chosen.image's reference, id or repo_digests are not strings"
        figure = chosen.get("output_throughput")
        if isinstance(figure, bool) or not isinstance(figure, int | float):
            return "chosen.output_throughput is not a number"
        if not isinstance(chosen.get("concurrency"), int):
            return "chosen.concurrency is not a number"
    if not isinstance(doc.get("choose_at"), int):
        return "choose_at is not a number"
    profiles = doc.get("profiles")
    if not isinstance(profiles, list) or not all(
        isinstance(entry, dict)
        and isinstance(entry.get("receipt"), str)
        and not Path(entry["receipt"]).is_absolute()
        and ".." not in Path(entry["receipt"]).parts
        for entry in profiles
    ):
        return "profiles is not a list of receipts inside the sweep's folder"
    return None


def receipts_in(folder: Path) -> list[Path]:
    """A sweep's receipts in --sweep order (chosen.json), else each PROFILE/receipt.json,
    else the folder's own receipt.json."""
    if (folder / CHOSEN_FILE).is_file():
        return [folder / entry["receipt"] for entry in load_chosen(folder)["profiles"]]
    if (folder / "receipt.json").is_file():
        return [folder / "receipt.json"]
    found = sorted(folder.glob("*/receipt.json"))
    if not found:
        raise BuilderError(f"--compare {folder}: no receipt.json in it or its folders")
    return found
