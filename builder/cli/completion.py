"""Shell completion scripts (`builder completion bash|zsh|fish`), generated from builder's
own parser: every command, action and option `--help` shows, so a script cannot drift from
the parser it was made from (generate it again after an upgrade).

One walk of the argparse tree gives a table per command path (`""`, `patches`, `patches
check`...): the words that may follow it (its subcommands, or its positional's choices) and
its options. Each shell's script is that table plus one small function that finds the path
on the command line (skipping the value after an option that takes one) and completes from
it; `help` gets the tree's commands as its words (`builder help patches <TAB>`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from builder.cli.tree import command_paths

SHELLS = ("bash", "zsh", "fish")
# Names and flags go into the scripts unquoted (case labels, word lists): anything else in
# the parser is a bug to fix there, not to quote around.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*|--?[A-Za-z0-9][A-Za-z0-9_.+-]*")
_SUMMARY = 72  # characters of help text shown beside a word (zsh, fish)


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]  # "-q", "--quiet"
    help: str
    takes_value: bool
    choices: tuple[str, ...]  # the values it names (--pcie-ipc: auto on off), else ()


@dataclass(frozen=True)
class Command:
    path: str  # "" for builder itself, "patches check" for an action
    words: dict[str, str]  # what may follow: subcommand (or positional choice) -> help
    options: tuple[Option, ...]


def _plain(name: str) -> str:
    if not _PLAIN.fullmatch(name):
        raise ValueError(f"completion: {name!r} cannot be completed unquoted")
    return name


def _summary(text: str | None) -> str:
    """Help text on one line, cut at a word near _SUMMARY characters."""
    line = " ".join((text or "").split())
    if len(line) <= _SUMMARY:
        return line
    return line[: _SUMMARY - 3].rsplit(" ", 1)[0] + "..."


def _help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    try:  # %(default)s and the like, as --help shows them
        return parser._get_formatter()._expand_help(action)
    except (KeyError, TypeError, ValueError):
        return action.help or ""


def commands(parser: argparse.ArgumentParser) -> list[Command]:
    """Every command path of the parser, the top one first; `help` and `help PATH` take the
    commands below PATH as their words."""
    found: list[Command] = []
    for path, node in command_paths(parser).items():
        words: dict[str, str] = {}
        options: list[Option] = []
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {shown.dest: shown.help for shown in action._choices_actions}
                for name in action.choices:
                    words[_plain(name)] = _summary(helps.get(name))
            elif action.help == argparse.SUPPRESS:
                continue  # hidden: not offered
            elif action.option_strings:
                options.append(
                    Option(
                        flags=tuple(_plain(flag) for flag in action.option_strings),
                        help=_summary(_help_of(node, action)),
                        takes_value=action.nargs != 0,
                        choices=tuple(_plain(str(c)) for c in action.choices or ()),
                    )
                )
            elif action.choices:  # a positional with named values: `completion SHELL`
                for choice in action.choices:
                    words[_plain(str(choice))] = _summary(_help_of(node, action))
        found.append(Command(path, words, tuple(options)))
    helper = next((command for command in found if command.path == "help"), None)
    if helper is None:
        return found
    # `builder help [CMD [SUB]]`: below `help`, the tree's commands again (its own node,
    # whose positional names no values, is replaced by the first of them).
    paths = {command.path for command in found}
    below_help = []
    for command in found:
        groups = {
            word: text
            for word, text in command.words.items()
            if f"{command.path} {word}".strip() in paths
        }
        if groups:
            below_help.append(Command(f"help {command.path}".strip(), groups, helper.options))
    return [command for command in found if command.path != "help"] + below_help


def _single_quoted(text: str) -> str:
    """A POSIX (bash, zsh) single-quoted string."""
    return "'" + text.replace("'", "'\\''") + "'"


def _fish_quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _valued(command: Command) -> list[str]:
    return [flag for option in command.options if option.takes_value for flag in option.flags]


def _flags(command: Command) -> list[str]:
    return [flag for option in command.options for flag in option.flags]


def _choices(table: list[Command]) -> list[tuple[str, tuple[str, ...]]]:
    """("PATH OPTION", its values) for every option that names its values."""
    return [
        (f"{command.path} {flag}".strip(), option.choices)
        for command in table
        for option in command.options
        if option.takes_value and option.choices
        for flag in option.flags
    ]


def _case(function: str, comment: str, rows: list[tuple[str, str]], say: str = "echo") -> str:
    """A shell function answering one column of the table: `case` on its argument, one row
    (label, quoted value) per command path that has something to say."""
    body = "".join(f'        "{label}") {say} {value} ;;\n' for label, value in rows)
    return f'{function}() {{  # {comment}\n    case "$1" in\n{body}    esac\n}}\n'


def _words_rows(pairs) -> list[tuple[str, str]]:
    """(label, its words as one single-quoted string), for the labels that have words."""
    return [(label, _single_quoted(" ".join(words))) for label, words in pairs if words]


def _described_rows(pairs) -> list[tuple[str, str]]:
    """(label, zsh `_describe` lines `name:description` as one single-quoted string)."""
    return [
        (label, _single_quoted("\n".join(f"{name}:{text}" for name, text in described)))
        for label, described in pairs
        if described
    ]


def _tables(table: list[Command], zsh: bool) -> str:
    """The four functions both POSIX shells' scripts answer from."""
    say = "print -r --" if zsh else "echo"
    if zsh:  # with each word's description, for _describe
        words = _described_rows((c.path, list(c.words.items())) for c in table)
        options = _described_rows(
            (c.path, [(flag, o.help) for o in c.options for flag in o.flags]) for c in table
        )
    else:
        words = _words_rows((c.path, list(c.words)) for c in table)
        options = _words_rows((c.path, _flags(c)) for c in table)
    return "\n".join(
        [
            _case("_builder_words", "what may follow a command path", words, say),
            _case("_builder_options", "a command path's options", options, say),
            _case(
                "_builder_valued",
                "options that take a value: the next word is that value",
                _words_rows((c.path, _valued(c)) for c in table),
                say,
            ),
            _case(
                "_builder_choices",
                "the values an option names (PATH OPTION)",
                _words_rows(_choices(table)),
                say,
            ),
        ]
    )


def bash(parser: argparse.ArgumentParser, version: str) -> str:
    tables = _tables(commands(parser), zsh=False)
    return f"""\
# bash completion for builder, generated by `builder completion bash` from builder {version}'s
# own parser: generate it again after an upgrade.
#   this shell:   source <(builder completion bash)
#   every shell:  builder completion bash > ~/.local/share/bash-completion/completions/builder

{tables}
_builder() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmdpath="" word value_next=0 i
    # The command path is each word that names a command of the path so far; the word
    # after an option that takes a value is that value, never a command.
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if ((value_next)); then
            value_next=0
        elif [[ $word == -* ]]; then
            if [[ $word != *=* && " $(_builder_valued "$cmdpath") " == *" $word "* ]]; then
                value_next=1
            fi
        elif [[ " $(_builder_words "$cmdpath") " == *" $word "* ]]; then
            cmdpath="${{cmdpath:+$cmdpath }}$word"
        fi
    done
    if ((value_next)); then
        local choices
        choices="$(_builder_choices "${{cmdpath:+$cmdpath }}${{COMP_WORDS[COMP_CWORD - 1]}}")"
        if [[ -n $choices ]]; then
            COMPREPLY=($(compgen -W "$choices" -- "$cur"))
        fi
        return 0  # a value it does not name: -o default offers file names
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_builder_options "$cmdpath")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_builder_words "$cmdpath")" -- "$cur"))
    fi
}}
complete -o default -F _builder builder
"""


def zsh(parser: argparse.ArgumentParser, version: str) -> str:
    tables = _tables(commands(parser), zsh=True)
    return f"""\
#compdef builder
# zsh completion for builder, generated by `builder completion zsh` from builder {version}'s
# own parser: generate it again after an upgrade.
#   builder completion zsh > ~/.zfunc/_builder   (a folder in $fpath, before compinit runs)
#   or, after compinit:  source <(builder completion zsh)

{tables}
_builder() {{
    # `cmdpath`, not `path`: zsh ties $path to $PATH.
    local cmdpath="" word value_next=0 i
    local -a names valued described
    for ((i = 2; i < CURRENT; i++)); do
        word=${{words[i]}}
        if ((value_next)); then
            value_next=0
        elif [[ $word == -* ]]; then
            valued=($(_builder_valued "$cmdpath"))
            if [[ $word != *=* ]] && (( ${{valued[(Ie)$word]}} )); then
                value_next=1
            fi
        else
            names=(${{${{(f)"$(_builder_words "$cmdpath")"}}%%:*}})
            if (( ${{names[(Ie)$word]}} )); then
                cmdpath=${{cmdpath:+$cmdpath }}$word
            fi
        fi
    done
    if ((value_next)); then
        described=($(_builder_choices "${{cmdpath:+$cmdpath }}${{words[CURRENT-1]}}"))
        if (( $#described )); then
            compadd -a described
        else
            _files
        fi
        return
    fi
    if [[ ${{words[CURRENT]}} == -* ]]; then
        described=(${{(f)"$(_builder_options "$cmdpath")"}})
        _describe -t options option described
    else
        described=(${{(f)"$(_builder_words "$cmdpath")"}})
        if (( $#described )); then
            _describe -t commands command described
        else
            _files
        fi
    fi
}}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _builder "$@"
else
    compdef _builder builder
fi
"""


def _fish_switch(function: str, comment: str, rows: list[tuple[str, list[str]]]) -> str:
    body = "".join(
        f"        case {_fish_quoted(label)}\n            printf '%s\\n' {' '.join(values)}\n"
        for label, values in rows
        if values
    )
    return (
        f"function {function} --argument-names cmdpath --description {_fish_quoted(comment)}\n"
        f'    switch "$cmdpath"\n{body}    end\nend\n'
    )


def fish(parser: argparse.ArgumentParser, version: str) -> str:
    table = commands(parser)
    lines = []
    for command in table:
        at = f"-n \"__builder_at '{command.path}'\""
        for word, text in command.words.items():
            lines.append(f"complete -c builder {at} -f -a {word} -d {_fish_quoted(text)}")
        for option in command.options:
            names = " ".join(
                f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
                for flag in option.flags
            )
            if option.choices:
                value = f" -x -a {_fish_quoted(' '.join(option.choices))}"
            else:
                value = " -r" if option.takes_value else ""
            lines.append(f"complete -c builder {at} {names}{value} -d {_fish_quoted(option.help)}")
    completes = "\n".join(lines)
    words = _fish_switch(
        "__builder_words",
        "what may follow a command path",
        [(c.path, list(c.words)) for c in table],
    )
    valued = _fish_switch(
        "__builder_valued",
        "options that take a value: the next word is that value",
        [(c.path, _valued(c)) for c in table],
    )
    return f"""\
# fish completion for builder, generated by `builder completion fish` from builder {version}'s
# own parser: generate it again after an upgrade.
#   builder completion fish > ~/.config/fish/completions/builder.fish

{words}
{valued}
function __builder_path --description 'the command path the line names so far'
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l cmdpath ''
    set -l value_next 0
    for word in $tokens
        if test $value_next = 1
            set value_next 0
        else if string match -q -- '-*' $word
            if not string match -q -- '*=*' $word
                and contains -- $word (__builder_valued "$cmdpath")
                set value_next 1
            end
        else if contains -- $word (__builder_words "$cmdpath")
            set cmdpath (string trim -- "$cmdpath $word")
        end
    end
    echo $cmdpath
end

function __builder_at --argument-names wanted --description 'the line names this command path'
    set -l here (__builder_path)
    test "$here" = "$wanted"
end

{completes}
"""


def script(shell: str, parser: argparse.ArgumentParser, version: str) -> str:
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](parser, version)
