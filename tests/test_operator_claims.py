"""Every claim builder prints is one it checked (issue #42): qualify's verdict names what it
did not check, doctor prints every check it could not run, and the examples in README.md and
every `--help` parse and resolve with the real parser and profiles.

No Docker engine, network or GPU: the server is the stand-in (tests/standin_sglang.py) run
as a local process, and the daemon is a socket nobody listens on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.test_gates import local_standin  # noqa: F401  (the fixture)

NO_DAEMON = "unix:///nonexistent/docker.sock"


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DOCKER_HOST": NO_DAEMON, "BUILDER_CONFIG": "/nonexistent", **env}
    return subprocess.run(
        [sys.executable, "-m", "builder.cli", *args],
        capture_output=True, text=True, cwd=cwd or REPO_ROOT, env=environ, timeout=300,
    )  # fmt: skip


QUICK = ["--gsm8k", "none", "--concurrency", "1", "--prompts", "2", "--input-len", "16",
         "--output-len", "4", "--prefill-lens", "64", "--needles", "4096",
         "--arithmetic", "2"]  # fmt: skip


def test_qualify_without_image_or_profile_is_partial_not_qualified(
    local_standin,  # noqa: F811
    tmp_path: Path,
) -> None:
    server = local_standin()
    out = tmp_path / "q"
    result = cli("qualify", server.url, *QUICK, "--out", str(out))
    assert result.returncode == 8, result.stdout + result.stderr
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["result"]["ok"] is False and receipt["result"]["verdict"] == "partial"
    unchecked = {n["what"]: n["why"] for n in receipt["not_checked"]}
    assert unchecked["verify"] == "the image is not known (no --image, no --container)"
    assert unchecked["backends"] == "no --profile"
    assert unchecked["compiled at start-up"] == "no --container to look into"
    assert "NVML" in unchecked["GPU state"]
    last = [line for line in result.stdout.splitlines() if line.startswith("partial")]
    assert last == [
        "partial, not qualified: every check that ran passed; skipped: gsm8k; not checked: "
        "verify (the image is not known (no --image, no --container)); backends (no --profile)"
    ]
    assert "qualified: every check passed" not in result.stdout
    # --allow-partial: exit 0, the receipt still says partial.
    allowed = cli("qualify", server.url, *QUICK, "--out", str(out), "--allow-partial", "--json")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    shown = json.loads(allowed.stdout)
    assert shown["ok"] is True and shown["result"]["verdict"] == "partial"
    # --no-throughput leaves throughput out: partial too, named.
    short = cli("qualify", server.url, *QUICK, "--out", str(out), "--no-throughput")
    assert short.returncode == 8
    assert "throughput (--no-throughput)" in short.stdout


def _fake_nvidia_smi(folder: Path) -> str:
    """nvidia-smi answering as the captured 8x RTX PRO 6000 host (tests/data/nvidia-smi)."""
    data = REPO_ROOT / "tests" / "data" / "nvidia-smi"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text(
        '#!/bin/sh\ncase "$*" in\n'
        f"  *--query-gpu*) cat {data / 'rtx-pro-6000-x8.query.csv'} ;;\n"
        f"  'topo -m') cat {data / 'rtx-pro-6000-x8.topo.txt'} ;;\n"
        "  *) exit 1 ;;\nesac\n"
    )
    script.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def test_doctor_without_daemon_or_registry_checks_the_rest_and_says_what_it_could_not(
    tmp_path: Path,
) -> None:
    """No Docker daemon, a registry that refuses: the GPUs, topology and /dev/shm are still
    checked, every other check is SKIP with why, a verdict line ends it, and exit 9."""
    path = _fake_nvidia_smi(tmp_path / "bin")
    result = cli("doctor", "--image", "127.0.0.1:9/ml/sglang-sm120:x", PATH=path)
    lines = result.stdout.splitlines()
    status = {line[5:].split(":", 1)[0]: line[:4].strip() for line in lines if line[:4] in (
        "ok  ", "FAIL", "SKIP")}  # fmt: skip
    assert status["image recipe"] == "SKIP" and status["gpus"] == "ok"
    assert status["topology"] == "ok" and "shm" in status
    for check in ("gpu count", "driver", "container runtime", "image"):
        assert status[check] == "SKIP", result.stdout
    assert "Connection refused" in result.stdout and "no socket at" in result.stdout
    assert lines[-1].startswith("verdict: ")
    shm_ok = status["shm"] == "ok"
    assert result.returncode == (9 if shm_ok else 1), result.stdout + result.stderr
    if shm_ok:
        assert lines[-1].startswith("verdict: unknown (3 ok, 0 failed, 7 not checked)")
    as_json = cli("doctor", "--image", "127.0.0.1:9/ml/sglang-sm120:x", "--json", PATH=path)
    answer = json.loads(as_json.stdout)
    assert answer["ok"] is False and answer["verdict"] == lines[-1]
    assert {f["check"]: f["status"] for f in answer["findings"]} == status


def test_doctor_v_before_or_after_the_command_shows_the_passing_checks_hints(
    tmp_path: Path,
) -> None:
    """`builder -v doctor` was parsed, then undone by doctor's own --verbose default: the
    hints of passing checks (here the PCIe topology's) show with -v on either side."""
    path = _fake_nvidia_smi(tmp_path / "bin")
    hint = "keep NCCL_P2P_LEVEL=PHB"
    plain = cli("doctor", "--target", "sm120", PATH=path)
    assert plain.stdout.startswith(("ok  ", "FAIL", "SKIP")) and hint not in plain.stdout
    before = cli("-v", "doctor", "--target", "sm120", PATH=path)
    after = cli("doctor", "--target", "sm120", "-v", PATH=path)
    assert hint in before.stdout, before.stdout + before.stderr
    assert before.stdout == after.stdout and before.returncode == after.returncode


def test_image_plan_says_first_that_it_builds_the_wheels(tmp_path: Path) -> None:
    """--plan builds no image, but the tag hashes the wheels: it says so before fetching."""
    refused = "http://127.0.0.1:9"
    result = cli(
        "image", "--plan", "--target", "sm120", "--data-dir", str(REPO_ROOT),
        "--cache-dir", str(tmp_path / "cache"), "--mirror", f"https://github.com/={refused}/",
        "--mirror", f"https://pypi.org/simple={refused}/simple",
    )  # fmt: skip
    first = result.stderr.splitlines()[0]
    assert first.startswith("plan: builds no image and compiles no kernel, but fetches the "
                            "upstreams and builds the patched wheels"), result.stderr  # fmt: skip
    assert result.returncode == 9, result.stderr  # the index did not answer: nothing was built


# --- the docs teach only what works -------------------------------------------------------


def _joined(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(where, line) with `\\` continuations joined, only lines that run builder."""
    found, pending = [], None
    for where, line in lines:
        text = line.strip()
        if pending is None:
            text = text.removeprefix("scripts/setup && ").removeprefix("sudo ")
            text = text.removeprefix(".venv/bin/")
            if not text.startswith("builder "):
                continue
            pending = (where, text)
        else:
            pending = (pending[0], f"{pending[1]} {text}")
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1])
            continue
        found.append(pending)
        pending = None
    return found


def readme_examples() -> list[tuple[str, str]]:
    """Every `builder ...` line of README.md's code blocks (indented or fenced)."""
    lines, fenced = [], False
    for number, line in enumerate((REPO_ROOT / "README.md").read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            lines.append((f"README.md:{number}", line))
    return _joined(lines)


def help_examples() -> list[tuple[str, str]]:
    """Every `builder ...` line of each command's --help `examples:` section."""
    import argparse
    import re

    from builder.cli import build_parser

    found = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        text = (parser.description or "") + "\n" + (parser.epilog or "")
        marker = re.search(r"\bexamples?:", text)
        if marker:  # `examples:` and lines below it, or `example: builder ...` on its line
            section = text[marker.end() :].splitlines()
            found.extend(_joined([(f"builder {name} --help", line) for line in section]))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child_name, child in action.choices.items():
                    walk(child, f"{name} {child_name}".strip())

    walk(build_parser(), "")
    return found


IMAGE = "registry.example.com/ml/sglang-sm120@sha256:" + "0" * 64


def command_part(line: str) -> str:
    """A shell line up to its first unquoted `>`, `<`, `|`, `&&` or `;`: what follows is a
    redirect, a pipe or the next command, not builder's arguments (`2>` leaves its 2 too)."""
    import re

    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]  # a comment: shlex drops it anyway
        elif char in "<>|;" or line.startswith("&&", index):
            head = line[:index]
            return re.sub(r"(^|\s)\d+$", r"\1", head) if char in "<>" else head
    return line


def check_example(line: str) -> str | None:
    """None when the line parses with builder's own parser and (launch, deploy-files,
    qualify --start/--sweep) its profile, --set and --extra-arg resolve against the
    target's profiles; else why not."""
    import contextlib
    import io
    import shlex

    from builder import launch
    from builder.cli import build_parser
    from builder.commands.serve import _key_values
    from builder.errors import BuilderError
    from builder.target import load_target

    words = shlex.split(command_part(line.replace("$IMAGE", IMAGE)), comments=True)[1:]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = build_parser().parse_args(words)
    except SystemExit:
        return f"argparse: {errors.getvalue().strip().splitlines()[-1]}"
    command = args.command  # not words[0]: `builder -v doctor` names it second
    starts = command in ("launch", "deploy-files") or (
        command == "qualify" and (args.start or args.sweep)
    )
    if not starts or getattr(args, "profile", None) == "chosen":
        return None
    # No daemon or registry: --image is answered by the target's own profiles.
    # The README's default target, not the suite's BUILDER_TARGET.
    target = args.target if "--target" in words else "sm120"
    known = launch.Profiles.of(load_target(REPO_ROOT, target).file)
    names = args.sweep.split(",") if getattr(args, "sweep", None) else [args.profile]
    try:
        overrides = launch.Overrides(
            model=args.model, port=args.port, params=tuple(_key_values("--set", args.set)),
            extra_args=tuple(args.extra_arg), hf_cache=args.hf_cache,
            container_name=args.name, bind=args.bind,
        )  # fmt: skip
        for name in names:
            launch.resolve(known, name, "-", overrides)
    except BuilderError as exc:
        return str(exc)
    return None


def test_every_example_in_the_readme_and_the_help_parses_and_resolves() -> None:
    examples = readme_examples() + help_examples()
    assert len(examples) > 40, examples  # the collector still finds them
    assert any("--set" in line for _, line in examples)
    refused = [f"{where}: {line}: {why}" for where, line in examples
               if (why := check_example(line))]  # fmt: skip
    assert not refused, "\n".join(refused)


def test_the_example_checker_refuses_what_builder_refuses() -> None:
    assert "refuse" in (check_example("builder launch --set kv_cache_dtype=bfloat16") or "")
    assert check_example("builder launch --set nosuch=1").startswith("--set nosuch")
    assert check_example("builder lanch --target sm120").startswith("argparse: ")
    assert check_example("builder launch --image $IMAGE --set kv_cache_dtype=fp8_e4m3") is None
    assert check_example("builder -q launch --set nosuch=1").startswith("--set nosuch")


def test_the_example_checker_reads_only_the_command_before_a_redirect_pipe_or_next_one() -> None:
    for line in (
        "builder launch --target sm120 --json > ~/recipe.json",
        "builder doctor --p2p --image $IMAGE --json >p2p.json 2>p2p.err",
        "builder jit list --target sm120 --json | jq .modules",
        "builder jit list --json 2>/dev/null; echo done",
        "builder help patches check && builder help launch",
        "builder launch --target sm120 < /dev/null   # no input",
    ):
        assert check_example(line) is None, line
    # What comes before still counts: a bad command before a redirect is refused.
    assert check_example("builder lanch > out.txt").startswith("argparse: ")
    assert check_example("builder launch --set nosuch=1 | cat").startswith("--set nosuch")
    # Quoted, the characters are the argument's own.
    assert command_part("builder x 'a > b' \"c|d;e\" | y") == "builder x 'a > b' \"c|d;e\" "
    assert command_part("builder x --n 2 2>err") == "builder x --n 2 "


def test_a_server_url_is_a_root_with_or_without_a_port_as_the_readme_says() -> None:
    """README: `http(s)://HOST[:PORT]`, no path, query or credentials; without a port, the
    scheme's (a server behind a proxy)."""
    no_port = cli("wait-ready", "http://127.0.0.1", "--deadline", "0")
    assert no_port.returncode == 4 and "not ready" in no_port.stdout + no_port.stderr
    for url in ("http://127.0.0.1:1/v1", "http://u:p@127.0.0.1:1", "ftp://127.0.0.1:1"):
        refused = cli("wait-ready", url, "--deadline", "0")
        assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr


# --- rough edges --------------------------------------------------------------------------


def test_patches_check_onto_a_ref_names_its_upstream(tmp_path: Path) -> None:
    """A tag names one upstream's history: v0.7.2 is flashinfer's, not sglang's."""
    result = cli("patches", "check", "--target", "sm120", "--onto", "v0.7.2",
                 "--data-dir", str(REPO_ROOT), "--cache-dir", str(tmp_path))  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: builder patches check --onto v0.7.2: which upstream's v0.7.2? pass --upstream "
        "NAME (target sm120: sglang, flashinfer)"
    )


def test_a_bare_number_over_6_h_is_refused_with_the_spelling_it_likely_meant() -> None:
    """`--deadline 1200` is 20 h of minutes, more likely 20 min meant as seconds: one line
    that says how to write either; with its unit, a long time is taken as written."""
    url = "http://127.0.0.1:1"
    for flag in ("--deadline", "--stall-minutes"):
        refused = cli("wait-ready", url, "--deadline", "0", flag, "1200")
        assert refused.returncode == 1 and refused.stderr.strip() == (
            f"error: {flag} 1200: a bare number is minutes here, 20 h; write 1200s for "
            "seconds, or 1200m if you mean 20 h"
        )
    taken = cli("wait-ready", url, "--stall-minutes", "20h", "--deadline", "0s")
    assert taken.returncode == 4 and "error" not in taken.stderr, taken.stderr
    seconds = cli("wait-ready", url, "--poll", "30000")
    assert seconds.stderr.strip() == (
        "error: --poll 30000: a bare number is seconds here, 8.33 h; write 30000s if you mean "
        "8.33 h"
    )


# Every time flag of every command: (the command line before the flag, flag, its bare unit).
TIME_FLAGS = [
    (["wait-ready", "http://127.0.0.1:1"], "--deadline", "minutes"),
    (["wait-ready", "http://127.0.0.1:1"], "--stall-minutes", "minutes"),
    (["wait-ready", "http://127.0.0.1:1"], "--poll", "seconds"),
    (["launch", "--run"], "--poll", "seconds"),
    (["qualify", "http://127.0.0.1:1"], "--deadline", "minutes"),
    (["qualify", "http://127.0.0.1:1"], "--stall-minutes", "minutes"),
    (["qualify", "http://127.0.0.1:1"], "--level-seconds", "seconds"),
    (["doctor", "--p2p", "--target", "sm120"], "--stage-timeout", "seconds"),
]


def test_every_time_flag_refuses_a_bad_duration_in_one_line_naming_itself() -> None:
    for before, flag, unit in TIME_FLAGS:
        result = cli(*before, flag, "90x")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, (flag, result.stderr)
        assert lines[0].startswith(f"error: {flag} 90x: must be a number of {unit}"), lines
        assert lines[0].endswith("(or with a unit: 90s, 20m, 1.5h)"), lines


def test_every_time_flag_says_its_unit_in_its_help() -> None:
    from tests.test_cli import _commands

    commands = _commands()
    for before, flag, unit in TIME_FLAGS:
        if before[0] == "launch":
            continue  # launch --run's --poll is hidden
        action = commands[before[0]]._option_string_actions[flag]
        assert action.metavar == unit.upper(), flag
        assert "90s, 20m, 1.5h" in action.help, flag


def test_version_names_builders_commit() -> None:
    import re

    from builder.identity import builder_identity

    result = cli("--version")
    assert result.returncode == 0
    commit = builder_identity()["commit"]
    expected = rf"builder \S+ \(commit {commit[:12]}(, dirty)?\)" if commit else r"builder \S+ \("
    assert re.fullmatch(expected, result.stdout.strip()), result.stdout


def test_an_unknown_command_or_option_gets_a_suggestion() -> None:
    wrong = cli("lanch")
    assert wrong.returncode == 1 and wrong.stderr.strip().endswith("; did you mean launch?")
    option = cli("wait-ready", "http://127.0.0.1:1", "--stal-minutes", "3")
    assert option.stderr.strip().endswith("; did you mean --stall-minutes?")
    nested = cli("patches", "chek")
    assert nested.stderr.strip().endswith("; did you mean check?")
    far = cli("zzzzzz")
    assert "did you mean" not in far.stderr
    begun = cli("wai")  # too short for a close match, but the start of one command
    assert begun.stderr.strip().endswith("; did you mean wait-ready?")


def test_publish_of_flashinfer_without_a_kernel_wheel_needs_without_kernels(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """No image manifest names a kernel wheel for this flashinfer build: refused in one line
    before anything is uploaded, unless --without-kernels (then warned, and recorded)."""
    from builder import cli
    from builder.commands import publish
    from builder.wheels import BuiltWheel

    wheel = BuiltWheel("flashinfer", "flashinfer-python", "0.7.2+sm120.gabcdef0",
                       "flashinfer_python-0.7.2+sm120.gabcdef0-py3-none-any.whl", "0" * 64, 1,
                       "k", True, tmp_path / "f.whl")  # fmt: skip
    monkeypatch.setattr(publish, "forks_and_wheels", lambda args, ctx: ({}, {"flashinfer": wheel}))
    uploads = []
    monkeypatch.setattr(publish, "publish_wheels", lambda *a: uploads.append(a) or ({}, None))
    monkeypatch.setattr(publish.manifest, "build_manifest", lambda *a, **k: {})
    written = {}
    monkeypatch.setattr(
        publish.manifest, "write", lambda d, record, tag: written.update(record) or d / "m.json"
    )
    common = ["publish", "--target", "sm120", "--data-dir", str(REPO_ROOT),
              "--manifest-dir", str(tmp_path / "manifests"), "--cache-dir", str(tmp_path / "c"),
              "--publish-static", str(tmp_path / "static")]  # fmt: skip
    assert cli.main(common) == 1
    err = capsys.readouterr().err
    assert "no image manifest of flashinfer 0.7.2+sm120.gabcdef0 names a kernel wheel yet: " \
        "run builder image first (it makes one), or pass --without-kernels" in err  # fmt: skip
    assert not uploads
    assert cli.main([*common, "--without-kernels"]) == 0
    assert "publishing without kernels" in capsys.readouterr().err
    assert uploads and written["without_kernels"].startswith("--without-kernels: ")
