"""`builder qualify --sweep P1,P2,...`: each profile started, qualified and stopped in turn,
as `qualify --start` does, a graph-capture hang retried once with the profile's declared
fallback; then the verdict (builder/site/sweep.py) as --out/chosen.json and a table."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from rich.markup import escape

from builder.core import progress, validate
from builder.core.cache import atomic_write_text
from builder.core.errors import EXIT_CODES, BuilderError
from builder.core.options import print_json, print_table
from builder.site import sweep
from builder.site.commands.launch_options import check_checkpoint, launch_overrides
from builder.site.commands.qualify_start import profiles_for, start_and_qualify
from builder.site.receipt_views import RECEIPT_SCHEMA, plot_compare
from builder.spec import engines, launch, launch_profiles, model_check


def sets_for(items: list[str], name: str) -> list[str]:
    """The --set items for one profile of the sweep: each KEY=VALUE, then its own
    PROFILE:KEY=VALUE without the prefix (they win); other profiles' left out."""
    pairs = [(key, value) for key, _, value in (item.partition("=") for item in items)]
    own = [(k, v) for k, v in pairs if launch_profiles.split_profile_key(k)[0] in (None, name)]
    return [f"{key}={value}" for key, value in launch_profiles.params_for(own, name)]


def _with_params(args: argparse.Namespace, name: str, fallback) -> argparse.Namespace:
    """The options for one --sweep entry's start: its profile and image, the user's --set
    for it, and its `fallback` params over those, taken from the profile (they never mount
    outside the state folder)."""
    engine, profile = sweep.split_entry(name)
    one = copy.copy(args)
    one.profile, one.taken_params = profile, tuple(fallback)
    one.taken_from = f"profile {profile}'s fallback" if fallback else ""
    one.set = sets_for(args.set, name)
    if engine is not None and engine in args.engine_images:
        one.image = args.engine_images[engine]
    return one


def engine_images(items: list[str]) -> dict[str, str]:
    """--engine-image ENGINE=REF, each engine once."""
    found: dict[str, str] = {}
    for item in items:
        engine, sep, reference = item.partition("=")
        if not sep or engine not in engines.NAMES or not reference:
            raise BuilderError(
                f"--engine-image {item}: expected ENGINE=IMAGE, ENGINE one of "
                f"{', '.join(engines.NAMES)}"
            )
        if engine in found:
            raise BuilderError(f"--engine-image {item}: {engine} is given twice")
        found[engine] = validate.image_reference("--engine-image", reference)
    return found


def _profiles_of(args: argparse.Namespace, name: str) -> launch_profiles.Profiles:
    """The profiles an entry is read from, which must serve with the engine it names."""
    engine, _ = sweep.split_entry(name)
    known = profiles_for(_with_params(args, name, ()))
    if engine is not None and known.engine != engine:
        raise BuilderError(
            f"--sweep {name}: {known.where} serves with {known.engine}; give the {engine} "
            f"image as --engine-image {engine}=IMAGE"
        )
    return known


def prepare(args: argparse.Namespace) -> tuple[list[str], dict[str, launch_profiles.Profiles]]:
    """The --sweep entries and each one's profiles: every entry resolved with the user's
    --set and again with its fallback, and the checkpoint each would load checked, before
    any data is fetched or server started: a typo or a checkpoint without MTP weights in
    the tenth profile costs no GPU hour."""
    names = sweep.profile_names(args.sweep)
    args.engine_images = engine_images(args.engine_image)
    for item in args.set:
        named, _ = launch_profiles.split_profile_key(item.partition("=")[0])
        if named is not None and named not in names:
            raise BuilderError(
                f"--set {item}: profile {named} is not in --sweep ({','.join(names)})"
            )
    known = {name: _profiles_of(args, name) for name in names}
    recipes = [
        launch.resolve(
            known[name], sweep.split_entry(name)[1], "-",
            launch_overrides(_with_params(args, name, params)),
        )
        for name in names
        for params in ((), launch_profiles.fallback_params(known[name], sweep.split_entry(name)[1]))
    ]  # fmt: skip
    # Then the checkpoints, each once (a fallback seldom changes what is read of it), and
    # last the warnings: a refusal is the one line a typo gets.
    checked = set()
    for recipe in recipes:
        if (asked := _checkpoint_asked(recipe)) not in checked:
            checked.add(asked)
            check_checkpoint(recipe)
    for recipe in {recipe.profile: recipe for recipe in recipes}.values():
        _warn_unpinned(recipe)
    return names, known


def _checkpoint_asked(recipe: launch.Recipe) -> tuple:
    """What `check_checkpoint` reads a recipe for: a fallback that changes none of it is not
    checked (or warned about) twice."""
    where = f"profile '{recipe.profile}'"
    return (
        recipe.profile, recipe.model, recipe.model_revision, recipe.hf_cache,
        model_check.index_topk_pattern(recipe.args, where, recipe.engine),
        model_check.draft_from_checkpoint(recipe.args, recipe.engine),
    )  # fmt: skip


def _warn_unpinned(recipe: launch.Recipe) -> None:
    """A hub model at a branch: what the sweep measures is not what a later deploy pulls."""
    if recipe.model and not recipe.model_is_local and not sweep.is_commit(recipe.model_revision):
        progress.warn(
            f"profile {recipe.profile}: {recipe.model} at revision "
            f"{recipe.model_revision or '(none)'} is a branch, not a commit: deploy-files "
            "--profile chosen will refuse it; --set model_revision=COMMIT, or --model DIR"
        )


def _qualify_one(
    args, entry: str, profiles: dict[str, launch_profiles.Profiles], plan, folder: Path
) -> dict:
    """One --sweep entry: started, qualified, stopped; once more on its fallback after a
    graph-capture hang (the hung start's log kept as server-graph-capture-hang.log)."""
    checked = start_and_qualify(_with_params(args, entry, ()), plan, folder)
    name, known = sweep.split_entry(entry)[1], profiles[entry]
    startup = checked.receipt["startup"] or {}
    if startup.get("state") != "graph-capture hang":
        return checked.receipt
    fallback = launch_profiles.fallback_params(known, name)
    if not fallback:
        progress.warn(f"{name}: graph-capture hang, and no [profiles.{name}.fallback] to retry")
        return checked.receipt
    hung_log = folder / "server-graph-capture-hang.log"
    if (folder / "server.log").exists():
        (folder / "server.log").replace(hung_log)
    why = launch_profiles.fallback_why(known, name) or "no why given"
    given = " ".join(f"--set {key}={value}" for key, value in fallback)
    progress.info(
        escape(f"{name}: graph-capture hang; once more with its fallback {given} ({why})")
    )
    earlier = [
        {
            "state": startup["state"], "message": checked.receipt["result"]["message"],
            "capture_line": startup.get("capture_line"),
            "params": checked.receipt["server"]["params"], "log": hung_log.name,
            "fallback": {"params": [list(pair) for pair in fallback], "why": why},
        }
    ]  # fmt: skip
    retry = _with_params(args, entry, fallback)
    return start_and_qualify(retry, plan, folder, earlier).receipt


def _not_started(name: str, why: str, folder: Path, engine: str = engines.DEFAULT) -> dict:
    """The receipt of a profile the sweep could not start (docker run refused, its image or
    checkpoint not right): no check ran, and it says why."""
    receipt = {
        "schema": RECEIPT_SCHEMA,
        "server": {"profile": name, "params": [], "image": None, "engine": engine},
        "startup": None,
        "gates": [],
        "not_checked": [{"what": "everything", "why": why}],
        "throughput": None,
        "result": {"ok": False, "failed_at": "start", "message": why, "verdict": "not qualified"},
    }
    atomic_write_text(folder / "receipt.json", json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    return receipt


def run(args: argparse.Namespace, plan, out: Path, names: list[str], known) -> None:
    swept = []
    for name in names:
        folder = validate.writable_dir("--out", str(out / name))
        folder.mkdir(parents=True, exist_ok=True)  # OUT/ENGINE/PROFILE for an engine's entry
        progress.info(escape(f"sweep: profile {name} ({len(swept) + 1} of {len(names)})"))
        try:
            receipt = _qualify_one(args, name, known, plan, folder)
        except BuilderError as exc:  # this profile could not start: the others still run
            progress.warn(f"{name}: {exc}")
            engine = known[name].engine if known else engines.DEFAULT
            receipt = _not_started(sweep.split_entry(name)[1], str(exc), folder, engine)
        profile = sweep.split_entry(name)[1]
        label = name if name != profile else ""
        swept.append(sweep.Swept(profile, receipt, f"{name}/receipt.json", label))
        stands, fell, why = sweep.standing(receipt, args.allow_partial)
        verdict = sweep.said(stands, fell, why, sweep.is_partial(receipt))
        progress.info(escape(f"{name}: {verdict}"))
    doc = sweep.choose(swept, plan.concurrency, args.choose_at, args.allow_partial)
    chosen_path = out / sweep.CHOSEN_FILE
    atomic_write_text(chosen_path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    plot = plot_compare([(s.profile, s.receipt) for s in swept], out / "sweep.png")
    if args.json:
        print_json({**doc, "chosen_file": str(chosen_path), "plot": plot and str(plot)},
                   ok=doc["chosen"] is not None)  # fmt: skip
    else:
        print_table(sweep.table(doc, swept))
        print(f"{sweep.summary(doc)}; {chosen_path}" + (f" (plot: {plot})" if plot else ""))
    if doc["chosen"] is None:
        raise SystemExit(EXIT_CODES["unqualified"])
