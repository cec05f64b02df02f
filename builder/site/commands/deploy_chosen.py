"""`deploy-files --profile chosen`: a sweep's chosen.json turned back into the launch options
of the server its receipt qualified, and the result held against what that server ran.

chosen.json and the receipt it cites are files in a folder: whoever can write there writes
what they say. So the image is the receipt's, by digest; a param or HF cache they name
mounts read-write only under its engine's state folder (/var/lib/sglang, /var/lib/vllm),
unless the operator's own flag on this command line names the same folder; a flag the
operator gives that says otherwise is refused, naming both values; and the compose command
must be, argument by argument, the command the receipt's server ran, with the same host
folders mounted.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from builder.core.errors import BuilderError
from builder.core.untrusted import printable
from builder.site import sweep
from builder.site.commands.qualify_run import redacted
from builder.spec import engines, launch, launch_profiles

RERUN = "re-run `builder qualify --sweep` with this builder"


@dataclass(frozen=True)
class Chosen:
    """chosen.json's choice, checked against the receipt it cites."""

    where: Path  # chosen.json
    choice: dict
    receipt: dict
    receipt_path: Path

    @property
    def served_from(self) -> dict:
        """Model, model revision, HF cache, port, API key file, extra args."""
        return self.choice["launch"]

    @property
    def params(self) -> list[list[str]]:
        return self.choice["params"]

    @property
    def engine(self) -> str:
        return self.choice.get("engine") or engines.DEFAULT


def load(folder: str | Path) -> Chosen:
    """The sweep's choice in `folder`, refused in one line when it is from an older builder,
    chose nothing, is not as `qualify --sweep` writes it, or disagrees with its receipt."""
    where = Path(folder) / sweep.CHOSEN_FILE
    _written_by_its_owner(Path(folder), where)
    doc = sweep.load_chosen(folder)
    if doc["schema"] != sweep.CHOSEN_SCHEMA:
        raise BuilderError(
            f"{where}: written by an older builder ({doc['schema']}), which does not record "
            f"the model, HF cache and port the sweep served; {RERUN}"
        )
    choice = doc["chosen"]
    if not choice:
        raise BuilderError(
            f"{where}: the sweep chose no profile at concurrency {doc['choose_at']} "
            "(none passed every gate: builder qualify --compare shows why)"
        )
    problem = _problem(choice)
    if problem:
        raise BuilderError(f"{where}: not a {sweep.CHOSEN_SCHEMA} file ({problem})")
    receipt_path = Path(folder) / choice["receipt"]
    _written_by_its_owner(receipt_path.parent, receipt_path)
    chosen = Chosen(where, choice, _receipt(receipt_path, where), receipt_path)
    _agrees_with_receipt(chosen)
    served = chosen.served_from
    if served["model"] and not served["model"].startswith("/"):
        revision = served["model_revision"]
        if not sweep.is_commit(revision):
            raise BuilderError(
                f"{where}: the sweep served {served['model']} at revision "
                f"{printable(revision or '(none)')}, a branch that moves, not a commit; re-run "
                "the sweep with --set model_revision=COMMIT (or --model DIR)"
            )
    return chosen


def _is_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _problem(choice: dict) -> str | None:
    """What in the choice is not as `sweep.choose` writes it (beyond load_chosen's checks)."""
    receipt = choice.get("receipt")
    if not (
        isinstance(receipt, str)
        and not Path(receipt).is_absolute()
        and ".." not in Path(receipt).parts
    ):
        return "chosen.receipt is not a receipt inside the sweep's folder"
    if not (isinstance(choice.get("image_ref"), str) and isinstance(choice.get("image"), dict)):
        return "chosen.image_ref is not an image"
    if not isinstance(choice.get("partial"), bool):
        return "chosen.partial is not true or false"
    if choice.get("engine") not in (None, *engines.NAMES):
        return f"chosen.engine is not one of {', '.join(engines.NAMES)}"
    served = choice.get("launch")
    if not isinstance(served, dict):
        return "chosen.launch does not say how the server was started"
    for key in ("model", "model_revision", "hf_cache", "api_key_file"):
        if not isinstance(served.get(key), str | None):
            return f"chosen.launch.{key} is not a string"
    for key in ("hf_cache", "api_key_file"):
        if served[key] is not None and not served[key].startswith("/"):
            return f"chosen.launch.{key} is not an absolute path"
    if served["model"] and not served["model"].startswith("/") and _names_a_folder(served["model"]):
        return "chosen.launch.model is neither a folder by its absolute path nor a hub id"
    port = served.get("port")
    if isinstance(port, bool) or not isinstance(port, int):
        return "chosen.launch.port is not a number"
    if not _is_strings(served.get("extra_args")):
        return "chosen.launch.extra_args is not a list of strings"
    return None


def _names_a_folder(model: str) -> bool:
    """A relative folder (taken from wherever deploy-files runs), or neither folder nor hub id."""
    try:
        return launch.model_dir(model) is not None
    except BuilderError:
        return True


def _written_by_its_owner(folder: Path, path: Path) -> None:
    """chosen.json and its receipt name the model folder, the key file and the image a unit
    runs as root: believed only from files and a folder no one but root or this user could
    have written, reached without a link."""
    for each in (folder, path):
        try:
            info = os.lstat(each)
        except OSError:
            return  # not there: reading it says so, in its own words
        if stat.S_ISLNK(info.st_mode):
            raise BuilderError(f"{each}: a symbolic link: not followed ({RERUN} into a folder)")
        problem = _written_by_others(info)
        if problem:
            raise BuilderError(f"{each}: {problem}: what it names is not deployed")


def _written_by_others(info: os.stat_result) -> str | None:
    """Owned by root, this user or the one sudo runs for (`qualify` as the operator, then
    `sudo deploy-files --install`); writable by no one else: not others, and not a group
    but the owner's own (a user-private group, Ubuntu's default with umask 002)."""
    owners = {0, os.geteuid()}
    if os.environ.get("SUDO_UID", "").isdigit():
        owners.add(int(os.environ["SUDO_UID"]))
    if info.st_uid not in owners:
        return f"owned by uid {info.st_uid}, not root or this user"
    if info.st_mode & stat.S_IWOTH:
        return "writable by others"
    if info.st_mode & stat.S_IWGRP and info.st_gid != info.st_uid:
        return f"writable by group {info.st_gid}"
    return None


def _receipt(path: Path, where: Path) -> dict:
    try:
        receipt = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        reason = getattr(exc, "strerror", None) or "not JSON"
        raise BuilderError(f"{where}: its receipt {path} cannot be read ({reason})") from None
    if not (isinstance(receipt, dict) and isinstance(receipt.get("server"), dict)):
        raise BuilderError(f"{where}: its receipt {path} is not a receipt builder qualify wrote")
    if not isinstance(receipt.get("result"), dict):
        raise BuilderError(f"{where}: its receipt {path} is not a receipt builder qualify wrote")
    return receipt


def _agrees_with_receipt(chosen: Chosen) -> None:
    """The image (by digest), profile, params, launch options and partial flag chosen.json
    names are the ones its receipt's server ran."""
    choice, server = chosen.choice, chosen.receipt["server"]
    image = server.get("image") if isinstance(server.get("image"), dict) else {}
    digests = image.get("repo_digests") if _is_strings(image.get("repo_digests")) else []
    ran = {*digests, image.get("id")} - {None}
    cites = f"the receipt it cites ({chosen.receipt_path})"
    if choice["image_ref"] not in ran:
        shown = ", ".join(sorted(map(str, ran))) or "no image"
        raise BuilderError(
            f"{chosen.where}: names image {printable(choice['image_ref'])}, but {cites} ran "
            f"{printable(shown)}"
        )
    facts = (
        ("engine", chosen.engine, server.get("engine") or engines.DEFAULT),
        ("profile", choice["profile"], server.get("profile")),
        ("params", choice["params"], server.get("params")),
        ("launch", choice["launch"], server.get("launch")),
        ("partial", choice["partial"], sweep.is_partial(chosen.receipt)),
    )
    for name, says, recorded in facts:
        if recorded is None and name == "launch":
            raise BuilderError(
                f"{chosen.where}: {cites} does not record how its server was started; {RERUN}"
            )
        if says != recorded:
            raise BuilderError(
                f"{chosen.where}: {name} {printable(json.dumps(says))} is not what {cites} "
                f"records ({printable(json.dumps(recorded))})"
            )


def adopt(args: argparse.Namespace, chosen: Chosen) -> None:
    """The launch options of the server the sweep qualified, into `args`; a flag the
    operator gave that says otherwise is refused, naming both values."""
    _refuse_contradictions(args, chosen)
    served = chosen.served_from
    hf_cache = served["hf_cache"]
    root = launch.state_root(chosen.engine)
    if hf_cache and not launch.in_state_root(hf_cache, root) and args.hf_cache is None:
        raise BuilderError(
            f"{chosen.where}: its HF cache {printable(hf_cache)} is outside "
            f"{root}/: it is mounted read-write only when your own "
            f"--hf-cache {printable(hf_cache)} on this command line says so"
        )
    args.image = chosen.choice["image_ref"]
    args.profile = chosen.choice["profile"]
    args.taken_params = tuple(tuple(pair) for pair in chosen.params)
    args.taken_from = str(chosen.where)
    args.model = served["model"] or None
    args.hf_cache = args.hf_cache if args.hf_cache is not None else hf_cache
    args.port = served["port"]
    args.api_key_file = served["api_key_file"]
    args.extra_arg = list(served["extra_args"])


def _refuse_contradictions(args: argparse.Namespace, chosen: Chosen) -> None:
    where, choice, served = chosen.where, chosen.choice, chosen.served_from
    if args.manifest:
        raise BuilderError("--manifest: with --profile chosen the image is the one the sweep ran")
    image = choice["image"]
    same_image = {choice["image_ref"], image.get("id"), *(image.get("repo_digests") or [])}
    if args.image and args.image not in same_image:
        raise BuilderError(
            f"--image {args.image}: {where} chose {choice['profile']} on "
            f"{printable(choice['image_ref'])}; drop --image (it comes from there)"
        )
    model, hf_cache, key_file = args.model, args.hf_cache, args.api_key_file
    given = {  # as the launch would take them (None: not given)
        "--model": (launch.model_dir(model) or model) if model else None,
        "--hf-cache": launch.host_path(hf_cache, f"--hf-cache {hf_cache}") if hf_cache else None,
        "--port": args.port,
        "--api-key-file": str(Path(key_file).expanduser().resolve()) if key_file else None,
        "--extra-arg": list(args.extra_arg) or None,
    }
    recorded = {
        "--model": served["model"],
        "--hf-cache": served["hf_cache"],
        "--port": served["port"],
        "--api-key-file": served["api_key_file"],
        "--extra-arg": served["extra_args"],
    }
    for flag, value in given.items():
        if value is None or value == recorded[flag]:
            continue
        if flag == "--hf-cache" and recorded[flag] is None:
            continue  # the sweep's model is a folder: no HF cache is mounted either way
        raise BuilderError(
            f"{flag} {_shown(value)}: {where} records {_shown(recorded[flag])}, what the "
            f"sweep's server ran; drop {flag}, or re-run the sweep with it"
        )
    chose = dict(map(tuple, chosen.params))
    for item in args.set:
        named, _, value = item.partition("=")
        profile, key = launch_profiles.split_profile_key(named)
        if profile not in (None, choice["profile"]):
            raise BuilderError(
                f"--set {item}: {where} chose profile {choice['profile']}, not {profile}"
            )
        if key not in chose:
            raise BuilderError(
                f"--set {item}: the sweep's server ran the profile's own {key} ({where} sets "
                "no such param); drop it, or re-run the sweep with it"
            )
        if chose[key] != value:
            raise BuilderError(
                f"--set {item}: {where} records {key}={printable(chose[key])}, what the sweep's "
                "server ran; drop it, or re-run the sweep with it"
            )


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return printable(" ".join(value) or "none")
    return printable(value)


def check_reproduces(recipe: launch.Recipe, chosen: Chosen) -> None:
    """The compose file's server is the receipt's: the same command, argument by argument
    (secrets hidden as the receipt hides them), and the same host folders mounted."""
    server = chosen.receipt["server"]
    entrypoint, command, mounts = (
        server.get("entrypoint"),
        server.get("command"),
        server.get("mounts"),
    )
    if not (_is_strings(entrypoint) and _is_strings(command) and _is_strings(mounts)):
        raise BuilderError(
            f"{chosen.where}: its receipt {chosen.receipt_path} does not record the command and "
            f"mounts its server ran; {RERUN}"
        )
    cannot = f"{chosen.where}: cannot reproduce the server its receipt ran:"
    ours = redacted([*entrypoint, *recipe.args])
    for at, (built, ran) in enumerate(zip_longest(ours, command)):
        if built != ran:
            raise BuilderError(
                f"{cannot} argument {at} would be {_shown(built)} where it ran {_shown(ran)}"
            )
    built_mounts = {f"{host}:{inside}:{mode}" for host, inside, mode in recipe.volumes}
    if built_mounts != set(mounts):
        extra = sorted(built_mounts - set(mounts)) or ["nothing more"]
        missing = sorted(set(mounts) - built_mounts) or ["nothing more"]
        raise BuilderError(
            f"{cannot} it would mount {_shown(extra[0])} where it mounted {_shown(missing[0])}"
        )


def said(chosen: Chosen, image: str) -> str:
    """The line deploy-files prints: what the sweep chose, on what, and how it stood."""
    choice, served = chosen.choice, chosen.served_from
    model = served["model"] or "the profile's model"
    line = (
        f"profile chosen by the sweep ({chosen.where}): {choice['profile']} on {image}, "
        f"{choice['output_throughput']:g} output tok/s at concurrency {choice['concurrency']}; "
        f"model {model}"
    )
    if choice["partial"]:
        line += "; its receipt is partial (verify, the backends or throughput did not run)"
    return printable(line, 600)
