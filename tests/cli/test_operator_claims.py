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
from tests.site.test_gates import local_standin  # noqa: F401  (the fixture)

NO_DAEMON = "unix:///nonexistent/docker.sock"


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DOCKER_HOST": NO_DAEMON, "BUILDER_CONFIG": "/nonexistent", **env}
    return subprocess.run(
        [sys.executable, "-m", "builder.cli.main", *args],
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


def code_block_examples(page: Path) -> list[tuple[str, str]]:
    """Every `builder ...` line of a page's code blocks (indented or fenced)."""
    lines, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            lines.append((f"{page.relative_to(REPO_ROOT)}:{number}", line))
    return _joined(lines)


def help_examples() -> list[tuple[str, str]]:
    """Every `builder ...` line of each command's --help `examples:` section."""
    import re

    from builder.cli.main import build_parser
    from builder.cli.tree import command_paths

    found = []
    for name, parser in command_paths(build_parser()).items():
        text = (parser.description or "") + "\n" + (parser.epilog or "")
        marker = re.search(r"\bexamples?:", text)
        if marker:  # `examples:` and lines below it, or `example: builder ...` on its line
            section = text[marker.end() :].splitlines()
            found.extend(_joined([(f"builder {name} --help", line) for line in section]))
    return found


IMAGE = "registry.example.com/ml/sglang-sm120@sha256:" + "0" * 64


def command_part(line: str) -> str:
    """A shell line up to its first unquoted `>`, `<`, `|`, `&&` or `;`: what follows is a
    redirect, a pipe or the next command, not builder's arguments (`2>` leaves its 2 too). A
    `<placeholder>` (the docs' `--onto <version>`) is an argument, not a redirect."""
    import re

    quote = None
    placeholder_end = 0
    for index, char in enumerate(line):
        if index < placeholder_end:
            continue
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]  # a comment: shlex drops it anyway
        elif char == "<" and (placeholder := re.match(r"<[A-Za-z][\w.:-]*>", line[index:])):
            placeholder_end = index + placeholder.end()
        elif char in "<>|;" or line.startswith("&&", index):
            head = line[:index]
            return re.sub(r"(^|\s)\d+$", r"\1", head) if char in "<>" else head
    return line


# The docs' sweeps across engines name ENGINE/PROFILE: each engine's current target.
ENGINE_TARGETS = {"sglang": "sm120", "vllm": "sm120-vllm"}


def check_example(line: str) -> str | None:
    """None when the line parses with builder's own parser, its --image is an image
    reference, and (launch, deploy-files, qualify --start/--sweep; wait-ready and qualify
    given --profile) its profile, --set and --extra-arg resolve against the target's
    profiles; else why not."""
    import contextlib
    import io
    import shlex

    from builder.cli.main import build_parser
    from builder.core import validate
    from builder.core.errors import BuilderError
    from builder.site.commands.launch_options import key_values
    from builder.site.commands.qualify_sweep import sets_for
    from builder.site.sweep import split_entry
    from builder.spec import launch, launch_profiles
    from builder.spec.target import load_target

    words = shlex.split(command_part(line.replace("$IMAGE", IMAGE)), comments=True)[1:]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = build_parser().parse_args(words)
    except SystemExit as done:
        if done.code == 0:  # --version, --help: answered by the parser itself
            return None
        return f"argparse: {errors.getvalue().strip().splitlines()[-1]}"
    command = args.command  # not words[0]: `builder -v doctor` names it second
    try:
        if getattr(args, "image", None) and command != "verify":
            validate.image_reference("--image", args.image)
    except BuilderError as exc:
        return str(exc)
    starts = command in ("launch", "deploy-files") or (
        command == "qualify" and (args.start or args.sweep)
    )
    names_a_profile = command in ("wait-ready", "qualify") and getattr(args, "profile", None)
    if not (starts or names_a_profile) or getattr(args, "profile", None) == "chosen":
        return None
    # No daemon or registry: --image is answered by the target's own profiles.
    # The README's default target, not the suite's BUILDER_TARGET.
    target = args.target if "--target" in words else "sm120"
    known = launch_profiles.Profiles.of(load_target(REPO_ROOT, target).file)
    names = args.sweep.split(",") if getattr(args, "sweep", None) else [args.profile]
    try:
        for name in names:  # a sweep's PROFILE:KEY=VALUE for that profile alone
            sets = sets_for(args.set, name) if getattr(args, "sweep", None) else args.set
            engine, profile = split_entry(name) if name else (None, name)  # ENGINE/PROFILE
            profiles = known
            if engine is not None:
                profiles = launch_profiles.Profiles.of(
                    REPO_ROOT / "images" / ENGINE_TARGETS[engine] / "target.toml"
                )
            overrides = launch.Overrides(
                model=getattr(args, "model", None), port=getattr(args, "port", None),
                params=tuple(key_values("--set", sets)),
                extra_args=tuple(getattr(args, "extra_arg", ())),
                hf_cache=getattr(args, "hf_cache", None),
                container_name=getattr(args, "name", None),
                bind=getattr(args, "bind", "127.0.0.1"),
            )  # fmt: skip
            launch.resolve(profiles, profile, "-", overrides)
    except BuilderError as exc:
        return str(exc)
    return None


def test_every_example_in_the_readme_and_the_help_parses_and_resolves() -> None:
    examples = code_block_examples(REPO_ROOT / "README.md") + help_examples()
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
    assert check_example("builder launch --image REGISTRY/...").startswith("--image REGISTRY/...")
    assert "unknown profile 'nosuch'" in check_example(
        "builder wait-ready http://127.0.0.1:30000 --profile nosuch"
    )
    assert check_example(
        "builder qualify --sweep glm5-nvfp4-tp8,glm5-nvfp4-tp8-mtp "
        "--set glm5-nvfp4-tp8-mtp:speculative_num_steps=2 --set glm5-nvfp4-tp8:nosuch=1"
    ).startswith("--set nosuch")


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
    assert command_part("builder x --onto <version> < in") == "builder x --onto <version> "


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
    from tests.cli.test_cli import _commands

    commands = _commands()
    for before, flag, unit in TIME_FLAGS:
        if before[0] == "launch":
            continue  # launch --run's --poll is hidden
        action = commands[before[0]]._option_string_actions[flag]
        assert action.metavar == unit.upper(), flag
        assert "90s, 20m, 1.5h" in action.help, flag


def test_version_names_builders_commit() -> None:
    import re

    from builder.core.identity import builder_identity

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
    from builder.build.commands import publish
    from builder.build.wheels import BuiltWheel
    from builder.cli import main as cli

    wheel = BuiltWheel("flashinfer", "flashinfer-python", "0.7.2+sm120.gabcdef0",
                       "flashinfer_python-0.7.2+sm120.gabcdef0-py3-none-any.whl", "0" * 64, 1,
                       "k", True, tmp_path / "f.whl")  # fmt: skip
    monkeypatch.setattr(publish, "forks_and_wheels", lambda args, ctx: ({}, {"flashinfer": wheel}))
    uploads = []
    monkeypatch.setattr(publish, "publish_wheels", lambda *a: uploads.append(a) or ({}, None))
    monkeypatch.setattr(publish.build_records, "build_manifest", lambda *a, **k: {})
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


# --- the docs' links resolve --------------------------------------------------------------


def doc_pages(root: Path = REPO_ROOT) -> list[Path]:
    """The pages an operator reads: README.md, bench/README.md and docs/*.md."""
    return [root / "README.md", root / "bench" / "README.md", *sorted(root.glob("docs/*.md"))]


def _prose(text: str, spans: bool = True) -> str:
    """The page with its code blanked out, line for line: fenced and indented blocks, then
    (unless `spans` is false) inline code spans: a link or a path in code is an example."""
    import re

    out, fenced, in_block, blank_before = [], False, False, True
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            out.append("")
            continue
        in_block = line.startswith(("    ", "\t")) and (in_block or blank_before)
        out.append("" if fenced or in_block else line)
        blank_before = not line.strip()
    joined = "\n".join(out)
    if not spans:
        return joined
    return re.sub(r"(`+)(.+?)\1", lambda m: re.sub(r"[^\n]", " ", m.group(0)), joined, flags=re.S)


def inline_examples(page: Path) -> list[tuple[str, str]]:
    """Each inline code span of a page that runs builder with an option (`builder image
    --plan`; a bare command name is a name, and --help or --version only print)."""
    import re

    found = []
    text = _prose(page.read_text(), spans=False)
    for span in re.finditer(r"(`+)\s*(builder\s[^`]*?)\s*\1", text):
        command = " ".join(span.group(2).split())
        if " -" in command and not re.search(r"\s--(help|version)\b", command):
            number = text.count("\n", 0, span.start()) + 1
            found.append((f"{page.relative_to(REPO_ROOT)}:{number}", command))
    return found


def test_every_example_in_the_docs_pages_parses_and_resolves() -> None:
    """README.md's code blocks are read above; here the code blocks of the pages that took
    its detail (docs/, bench/README.md) and every page's inline `builder --...` commands."""
    readme = REPO_ROOT / "README.md"
    examples = [
        example
        for page in doc_pages()
        for example in (code_block_examples(page) if page != readme else []) + inline_examples(page)
    ]
    docs = [where for where, _ in examples if where.startswith("docs/")]
    assert len(docs) >= 3, examples  # the moved text's commands are still found
    assert any(where.startswith("README.md:") for where, _ in examples)  # its inline ones
    refused = [f"{where}: {line}: {why}" for where, line in examples
               if (why := check_example(line))]  # fmt: skip
    assert not refused, "\n".join(refused)


def github_slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (github-slugger): the rendered text lower-cased,
    everything but letters, digits, `_`, `-` and spaces dropped, each space a `-`."""
    import re

    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every `#anchor` a page's ATX headings make, repeats numbered as GitHub numbers them."""
    import re

    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        heading = re.match(r" {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", line)
        if fenced or not heading:
            continue
        slug = github_slug(heading.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path, root: Path = REPO_ROOT) -> list[str]:
    """Every relative link of a page (`[text](target)`, `[label]: target`, `href=`/`src=`)
    whose file is missing, outside the repository, or whose `#anchor` no heading makes."""
    import re
    from urllib.parse import unquote

    text = _prose(page.read_text())
    targets = [
        (m.start(1), m.group(1))
        for pattern in (
            r"\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)",
            r"(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)",
            r"\b(?:href|src)=\"([^\"]*)\"",
        )
        for m in re.finditer(pattern, text)
    ]
    broken = []
    for offset, target in sorted(targets):
        where = f"{page.relative_to(root)}:{text.count(chr(10), 0, offset) + 1}: {target}"
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|//", target):
            continue  # https:, mailto: ...: not this repository's
        path, _, anchor = unquote(target).partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_relative_to(root.resolve()) or not linked.exists():
            broken.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where}: no heading makes #{anchor}")
        elif anchor and linked.suffix != ".md" and not re.fullmatch(r"L\d+(-L\d+)?", anchor):
            broken.append(f"{where}: #{anchor} in a file that is not Markdown")
    return broken


def missing_paths(page: Path, root: Path = REPO_ROOT) -> list[str]:
    """Every `path` in a page's inline code that names a file of the repository (it starts
    with one of its top-level folders) and is not there. Placeholders (`<target>`, `*`,
    `NAME`) and a `:line` suffix are not paths."""
    import re

    folders = {p.name for p in root.iterdir() if p.is_dir() and p.name != ".git"}
    missing = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for span in re.findall(r"`([^`\s]+)`", line):
            path = re.sub(r":[\d,-]+$", "", span)
            if path.split("/")[0] not in folders or "/" not in path:
                continue
            if re.search(r"[<>*…{}$]", path) or re.search(r"(^|/)[A-Z][A-Z_]+(/|$)", path):
                continue
            if not (root / path).exists():
                missing.append(f"{page.relative_to(root)}:{number}: {span}")
    return missing


def test_every_relative_link_and_anchor_in_the_docs_resolves() -> None:
    pages = doc_pages()
    assert len(pages) >= 5 and all(page.is_file() for page in pages), pages
    broken = [problem for page in pages for problem in broken_links(page)]
    assert not broken, "\n".join(broken)
    # The README links each page that took its detail (the checker still finds links).
    readme = _prose((REPO_ROOT / "README.md").read_text())
    for page in ("docs/sglang-release.md", "docs/supply-chain.md", "docs/kernels.md",
                 "docs/test-times.md"):  # fmt: skip
        assert f"]({page}" in readme, page


def test_every_page_anchor_the_code_names_resolves() -> None:
    """A help text, script or workflow that names `README.md#anchor` or `docs/PAGE.md#anchor`
    points at a heading that is there (the README's sections move to docs/ pages)."""
    import re

    files = [*REPO_ROOT.glob("builder/**/*.py"), *REPO_ROOT.glob("scripts/*"),
             *REPO_ROOT.glob(".github/**/*.yml"), REPO_ROOT / "pyproject.toml"]  # fmt: skip
    pattern = r"((?:bench/)?README\.md|docs/[\w.-]+\.md)#([\w-]+)"
    named = [(path, page, anchor) for path in files if path.is_file()
             for page, anchor in re.findall(pattern, path.read_text(errors="replace"))]  # fmt: skip
    broken = [f"{path.relative_to(REPO_ROOT)}: {page}#{anchor}" for path, page, anchor in named
              if not (REPO_ROOT / page).is_file() or anchor not in anchors(REPO_ROOT / page)]  # fmt: skip
    assert not broken, "\n".join(broken)


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = [problem for page in doc_pages() for problem in missing_paths(page)]
    assert not missing, "\n".join(missing)


def test_the_link_checker_finds_a_broken_link_or_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "README.md").write_text("# Bench\n")
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## Run on a `GPU` VM: one, two\n\n## Twice\n\n## Twice\n\n```\n# not a heading\n```\n"
    )
    (tmp_path / "README.md").write_text(
        "# Top\n\nSee [the page](docs/a.md), [its VM part](docs/a.md#run-on-a-gpu-vm-one-two),\n"
        "[the second](docs/a.md#twice-1), [a\nsplit link](#top), [web](https://example.com/x),\n"
        "`[in code](nowhere.md)` and\n\n    [indented code](nowhere.md)\n\n"
        "Broken: [gone](docs/gone.md), [no anchor](docs/a.md#not-a-heading),\n"
        "[fenced](docs/a.md#not-a-heading-1), [up](../outside.md), [self](#nope),\n"
        "[bench](bench/README.md#bench) [ref]\n\n[ref]: docs/a.md#twice-2\n"
        "`docs/a.md` `docs/b.md` `images/<target>/x` `docs/NAME` `bench/run.py:12`\n"
    )
    assert anchors(tmp_path / "docs" / "a.md") == {"a-page", "run-on-a-gpu-vm-one-two",
                                                   "twice", "twice-1"}  # fmt: skip
    assert broken_links(tmp_path / "README.md", tmp_path) == [
        "README.md:10: docs/gone.md: no such file",
        "README.md:10: docs/a.md#not-a-heading: no heading makes #not-a-heading",
        "README.md:11: docs/a.md#not-a-heading-1: no heading makes #not-a-heading-1",
        "README.md:11: ../outside.md: no such file",
        "README.md:11: #nope: no heading makes #nope",
        "README.md:14: docs/a.md#twice-2: no heading makes #twice-2",
    ]
    assert missing_paths(tmp_path / "README.md", tmp_path) == [
        "README.md:15: docs/b.md",
        "README.md:15: bench/run.py:12",
    ]
    assert doc_pages(tmp_path)[2:] == [tmp_path / "docs" / "a.md"]
