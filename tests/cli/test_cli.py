"""The CLI shows each command exactly the options it uses, each with help, and names the same
thing the same way everywhere."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from builder.cli.main import build_parser
from tests.conftest import REPO_ROOT

FETCH_ONLY = {"--upstream", "--mirror", "--cache-dir"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every leaf command, `patches check` and `jit list` included, by its full name."""
    found = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[prefix] = parser
            return
        for name, child in subs[0].choices.items():
            walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        action.option_strings[0]: action
        for action in parser._actions
        if action.option_strings and action.help != argparse.SUPPRESS
    }


@pytest.mark.parametrize(
    "command",
    ["launch", "deploy-files", "patches list", "verify", "wait-ready", "doctor", "jit list"],
)
def test_commands_that_fetch_nothing_do_not_offer_fetch_options(command: str) -> None:
    shown = set(_options(_commands()[command]))
    allowed_selection = {"--upstream"} if command == "patches list" else set()
    assert not (shown & (FETCH_ONLY - allowed_selection)), shown


def test_every_shown_option_has_help_and_says_its_default() -> None:
    for name, parser in _commands().items():
        for flag, action in _options(parser).items():
            if flag == "-h":
                continue
            assert action.help, f"builder {name} {flag} has no help"
            has_default = action.default not in (None, False, [], argparse.SUPPRESS)
            if has_default and not isinstance(action, argparse._StoreConstAction):
                assert "default" in action.help, f"builder {name} {flag}: default not stated"


def test_image_and_publish_name_the_publishing_options_alike() -> None:
    commands = _commands()
    image, publish = set(_options(commands["image"])), set(_options(commands["publish"]))
    publishing = {"--publish-index", "--publish-simple", "--publish-repository", "--publish-static"}
    assert publishing <= image and publishing <= publish
    assert {"--index", "--static", "--publish"} & (image | publish) == set(), "old names unlisted"


def test_a_usage_error_exits_1_as_the_table_says() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", "launch", "--port", "x"],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 1
    assert "error: builder launch: argument --port: invalid int value: 'x'" in result.stderr


def test_every_json_answer_is_one_object_with_ok_and_its_version() -> None:
    """The --json contract: success and failure alike carry `ok` and `json_version`."""
    import json

    def run(*args: str) -> tuple[int, dict]:
        done = subprocess.run(
            [sys.executable, "-m", "builder.cli.main", *args, "--json"],
            capture_output=True, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
        return done.returncode, json.loads(done.stdout)

    code, listed = run("jit", "list", "--target", "sm120")
    assert code == 0 and listed["ok"] is True and listed["json_version"] == 1
    assert listed["modules"]
    code, failed = run("jit", "list", "--target", "sm999")
    assert code == 1 and failed["ok"] is False and failed["json_version"] == 1
    assert failed["exit_code"] == 1 and "unknown target 'sm999'" in failed["error"]
    code, usage = run("launch", "--port", "x")  # argparse's own error
    assert code == 1 and usage["ok"] is False and "invalid int value: 'x'" in usage["error"]


def test_every_command_s_help_shows_an_example_as_written() -> None:
    def leaves(parser: argparse.ArgumentParser, words: list[str]):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield words, parser
        for action in subs:
            for name, sub in action.choices.items():
                yield from leaves(sub, [*words, name])

    missing = [
        " ".join(words)
        for words, parser in leaves(build_parser(), [])
        # On a line of its own in the rendered page: not wrapped into the prose above it.
        if not any(line.startswith("example") for line in parser.format_help().splitlines())
    ]
    assert missing == []


def test_a_bad_option_is_refused_before_the_pipeline_loads() -> None:
    """`--help` and a usage error load none of the stages' heavy libraries (the Docker SDK,
    pygit2, the SBOM library): they loaded at every start before, 0.7 s on 2 cores, paid by
    every `builder` call. A command loads them when it first uses a stage."""
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['builder', 'image', '--no-such-option']\n"
        "try:\n"
        "    runpy.run_module('builder.cli.main', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('docker', 'pygit2', 'cyclonedx', 'builder.build.pipeline', 'builder.build.image')\n"
        "print(sorted(m for m in heavy if m in sys.modules"
        " and type(sys.modules[m]).__name__ != '_LazyModule'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert "--no-such-option" in result.stderr
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize(
    "words",
    [
        ["-q", "-v", "--json", "jit", "list"],
        ["jit", "list", "-q", "-v", "--json"],
        ["-q", "jit", "-v", "list", "--json"],  # on the group's parser too
        ["--quiet", "doctor", "--verbose", "--json"],
        ["doctor", "--json", "-qv"],
    ],
)
def test_q_v_and_json_are_taken_before_or_after_the_command(words: list[str]) -> None:
    args = build_parser().parse_args(words)
    assert (args.quiet, args.verbose, args.json) == (True, True, True)


@pytest.mark.parametrize("words", [["jit", "list"], ["doctor"], ["patches", "list"]])
def test_without_the_global_flags_they_are_off_not_missing(words: list[str]) -> None:
    args = build_parser().parse_args(words)
    assert (args.quiet, args.verbose, args.json) == (False, False, False)


def test_every_command_offers_q_and_v_and_says_so_in_its_help() -> None:
    for name, parser in _commands().items():
        shown = _options(parser)
        assert {"-q", "-v"} <= set(shown), f"builder {name}"
        assert "--quiet" in parser.format_help() and "--verbose" in parser.format_help()


def test_v_after_the_command_shows_the_traceback(monkeypatch, capsys) -> None:
    """`-v` is not only parsed after the command: main() acts on it (a traceback)."""
    from builder.cli import main as cli
    from builder.site.commands import jit

    def broken(args) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(jit, "cmd_jit_list", broken)
    assert cli.main(["jit", "list", "-v"]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["jit", "list"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_json_before_the_command_answers_as_after_it() -> None:
    import json

    def run(*args: str) -> tuple[int, dict]:
        done = subprocess.run(
            [sys.executable, "-m", "builder.cli.main", *args],
            capture_output=True, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
        return done.returncode, json.loads(done.stdout)

    before = run("--json", "-q", "jit", "list", "--target", "sm120")
    after = run("jit", "list", "--target", "sm120", "-q", "--json")
    assert before == after and before[0] == 0 and before[1]["ok"] is True


# --- builder help -------------------------------------------------------------------------


@pytest.mark.parametrize("words", [[], ["wait-ready"], ["patches"], ["patches", "check"]])
def test_help_prints_the_page_of_what_it_names(words: list[str], capsys) -> None:
    from builder.cli import main as cli

    assert cli.main(["help", *words]) == 0
    helped = capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main([*words, "--help"])
    assert exited.value.code == 0
    assert helped.out == capsys.readouterr().out and helped.err == ""
    assert helped.out.startswith(f"usage: {' '.join(['builder', *words])} ")


@pytest.mark.parametrize(
    ("words", "line"),
    [
        (["lanch"], "no command 'lanch'; did you mean launch?"),
        (["wait"], "no command 'wait'; did you mean wait-ready?"),  # the one it begins
        (["patches", "chek"], "`builder patches` has no action 'chek'; did you mean check?"),
        (["launch", "x"], "`builder launch` has no actions ('x' given)"),
        (["zzzzzz"], "no command 'zzzzzz'"),
    ],
)
def test_help_refuses_an_unknown_name_in_one_line(words: list[str], line: str, capsys) -> None:
    from builder.cli import main as cli

    assert cli.main(["help", *words]) == 1
    shown = capsys.readouterr()
    assert shown.err.splitlines() == [f"error: builder help: {line}"] and shown.out == ""


@pytest.mark.parametrize(
    "words",
    [["--json", "help"], ["help", "--json"], ["help", "launch", "--json"],
     ["--json", "completion", "bash"], ["completion", "fish", "--json"]],
)  # fmt: skip
def test_help_and_completion_refuse_json_in_one_line(words: list[str], capsys) -> None:
    import json

    from builder.cli import main as cli

    assert cli.main(words) == 1
    shown = capsys.readouterr()
    assert len(shown.err.splitlines()) == 1 and "run it without --json" in shown.err
    answer = json.loads(shown.out)  # the --json contract holds for the refusal too
    assert answer["ok"] is False and answer["exit_code"] == 1


def test_every_command_answers_json_or_refuses_it() -> None:
    for name, parser in _commands().items():
        assert "--json" in parser._option_string_actions, f"builder {name}"
        hidden = parser._option_string_actions["--json"].help == argparse.SUPPRESS
        assert hidden == bool(parser.get_default("json_refused")), f"builder {name}"


def test_bare_builder_shows_the_overview() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "builder.cli.main"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: builder")
    assert "exit codes:" in shown.stdout and shown.stderr == ""


def test_a_reader_that_stops_reading_is_no_internal_error() -> None:
    """`builder … | head -1`: the pipe's reader is gone before builder writes (its end is
    closed here first, so the write always meets it)."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "builder.cli.main", "completion", "bash"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141


def test_python_m_builder_is_the_builder_command() -> None:
    ran = [
        subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True)
        for module in ("builder", "builder.cli.main")
    ]
    assert ran[0].returncode == 0 and ran[0].stdout.startswith("builder ")
    assert ran[0].stdout == ran[1].stdout
