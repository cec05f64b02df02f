"""`builder completion bash|zsh|fish`: scripts generated from the parser. bash's is driven
for real (sourced, its function called as bash's completion calls it); zsh's and fish's are
read as text (every command and option in them, their blocks closed), and checked by the
shell itself where it is installed."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli import completion
from builder.cli.main import build_parser
from builder.cli.tree import command_paths
from tests.conftest import REPO_ROOT


def _script(shell: str) -> str:
    """The script as a user gets it: from the command."""
    done = subprocess.run(
        [sys.executable, "-m", "builder.cli.main", "completion", shell],
        capture_output=True, text=True, cwd=REPO_ROOT, check=True,
    )  # fmt: skip
    assert done.stderr == ""
    return done.stdout


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("completion")
    written = {}
    for shell in completion.SHELLS:
        written[shell] = folder / f"builder.{shell}"
        written[shell].write_text(_script(shell))
    return written


def _table() -> dict[str, completion.Command]:
    return {command.path: command for command in completion.commands(build_parser())}


def _shown_options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
    }


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command path of the real parser, groups included ("" is builder itself)."""
    return command_paths(build_parser())


# --- bash, for real ---------------------------------------------------------------------


def complete(script: Path, *words: str) -> list[str]:
    """COMPREPLY for `builder WORDS...`, the last word the one being completed, as bash's
    programmable completion calls the function (COMP_WORDS, COMP_CWORD)."""
    line = " ".join(shlex.quote(word) for word in ("builder", *words))
    program = (
        f"source {shlex.quote(str(script))}\n"
        f"COMP_WORDS=({line})\nCOMP_CWORD={len(words)}\nCOMPREPLY=()\n"
        "_builder\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
        "complete -p builder\n"  # registered, with the file-name fallback
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    *replies, registered = done.stdout.splitlines()
    assert registered == "complete -o default -F _builder builder"
    return [reply for reply in replies if reply]


def test_bash_completes_every_command_from_the_parser(scripts) -> None:
    commands = set(_table()[""].words)
    assert {"image", "launch", "wait-ready", "patches", "help", "completion"} <= commands
    assert set(complete(scripts["bash"], "")) == commands
    assert complete(scripts["bash"], "wait") == ["wait-ready"]
    assert set(complete(scripts["bash"], "patches", "")) == {"list", "check", "refresh", "export"}
    assert set(complete(scripts["bash"], "completion", "")) == {"bash", "zsh", "fish"}


def test_bash_completes_each_command_s_own_options(scripts) -> None:
    for path, parser in _parsers().items():
        offered = complete(scripts["bash"], *path.split(), "-")
        assert set(offered) == _shown_options(parser), f"builder {path}"
    assert complete(scripts["bash"], "wait-ready", "http://h:1", "--st") == ["--stall-minutes"]
    assert "--poll" in complete(scripts["bash"], "launch", "--")  # launch --run waits too
    assert "--output" not in complete(scripts["bash"], "lock", "--")  # hidden: its old name


def test_bash_reads_the_command_past_global_flags_and_option_values(scripts) -> None:
    # -v before the command; an option's value that happens to be a command's name.
    assert complete(scripts["bash"], "-v", "pat") == ["patch", "patches"]
    assert complete(scripts["bash"], "launch", "--model", "patches", "--ru") == ["--run"]
    assert complete(scripts["bash"], "-q", "jit", "-v", "") == ["list", "harvest", "keygen"]


def test_bash_completes_the_values_an_option_names_else_files(scripts) -> None:
    assert complete(scripts["bash"], "doctor", "--pcie-ipc", "o") == ["on", "off"]
    assert set(complete(scripts["bash"], "qualify", "--client", "")) == {
        "auto", "image", "builder"
    }  # fmt: skip
    # A value it names not (a path): nothing from the script, bash's -o default completes.
    assert complete(scripts["bash"], "launch", "--model", "") == []


def test_bash_help_completes_the_command_tree(scripts) -> None:
    assert set(complete(scripts["bash"], "help", "")) == set(_table()[""].words)
    assert set(complete(scripts["bash"], "help", "jit", "")) == {"list", "harvest", "keygen"}


# --- zsh and fish, as text (and by the shell where installed) ------------------------------


def _balanced(script: str, opens: re.Pattern, closes: re.Pattern) -> bool:
    depth = 0
    for line in script.splitlines():
        stripped = line.strip()
        depth += bool(opens.match(stripped)) - bool(closes.match(stripped))
        if depth < 0:
            return False
    return depth == 0


def test_zsh_script_holds_every_command_and_option(scripts) -> None:
    text = scripts["zsh"].read_text()
    assert text.startswith("#compdef builder\n")
    assert "compdef _builder builder" in text and '_builder "$@"' in text
    for path, command in _table().items():
        if command.words:
            assert f'"{path}") print -r -- ' in text, path
        for word, described in command.words.items():  # quoted in the script: ' as '\\''
            assert f"{word}:{described}".replace("'", "'\\''") in text, (path, word)
        for option in command.options:
            for flag in option.flags:
                assert f"\n{flag}:" in text or f"'{flag}:" in text, (path, flag)
    assert text.count('case "$1" in') == text.count("esac") == 4
    assert _balanced(text, re.compile(r"^\w+\(\) \{"), re.compile(r"^\}$"))
    assert _balanced(text, re.compile(r"^(if|for) "), re.compile(r"^(fi|done)$"))
    # $path is zsh's $PATH array: the script never assigns it.
    assert not re.search(r"\blocal\b[^\n]*\bpath\b|^\s*path=", text, re.MULTILINE)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh not installed")
def test_zsh_parses_the_script_and_completes_from_it(scripts) -> None:
    done = subprocess.run(["zsh", "-n", str(scripts["zsh"])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    def zsh_complete(*words: str) -> list[str]:
        """What _builder hands zsh's completion system for `builder WORDS...`: its
        functions stood in for by ones that print what they are given (no prefix filter)."""
        program = (
            "_describe() { shift 3; print -rl -- ${(P)1} }\n"
            "compadd() { shift; print -rl -- ${(P)1} }\n"
            "_files() { print -r -- '<files>' }\n"
            "compdef() { }\n"
            f"source {shlex.quote(str(scripts['zsh']))}\n"
            f"words=({' '.join(shlex.quote(w) for w in ('builder', *words))})\n"
            f"CURRENT={len(words) + 1}\n"
            "_builder\n"
        )
        done = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return [line.split(":", 1)[0] for line in done.stdout.splitlines()]

    assert zsh_complete("patches", "") == ["list", "check", "refresh", "export"]
    assert zsh_complete("-v", "help", "jit", "") == ["list", "harvest", "keygen"]
    assert zsh_complete("doctor", "--pcie-ipc", "") == ["auto", "on", "off"]
    assert zsh_complete("launch", "--model", "") == ["<files>"]
    launch = zsh_complete("launch", "--model", "patches", "--r")
    assert "--run" in launch and set(launch) == _shown_options(_parsers()["launch"])


def test_fish_script_holds_every_command_and_option(scripts) -> None:
    text = scripts["fish"].read_text()
    for path, command in _table().items():
        at = f"complete -c builder -n \"__builder_at '{path}'\""
        for word in command.words:
            assert f"{at} -f -a {word} -d " in text, (path, word)
        for option in command.options:
            names = " ".join(
                f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in option.flags
            )
            assert f"{at} {names}" in text, (path, option.flags)
    assert "-l pcie-ipc -x -a 'auto on off'" in text
    blocks = re.compile(r"^(function|switch|for|if|while|begin) ")
    assert _balanced(text, blocks, re.compile(r"^end$"))


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed")
def test_fish_completes_from_the_script(scripts) -> None:
    def fish_complete(line: str) -> set[str]:
        program = f"source {shlex.quote(str(scripts['fish']))}; complete -C {shlex.quote(line)}"
        done = subprocess.run(["fish", "-c", program], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return {row.split("\t")[0] for row in done.stdout.splitlines()}

    assert {"list", "check", "refresh", "export"} == fish_complete("builder patches ")
    assert "--stall-minutes" in fish_complete("builder wait-ready --st")
    assert fish_complete("builder -v pat") == {"patch", "patches"}
    assert fish_complete("builder launch --model patches --ru") == {"--run"}
    assert fish_complete("builder help jit ") == {"list", "harvest", "keygen"}
    assert fish_complete("builder doctor --pcie-ipc ") == {"auto", "on", "off"}
