"""qualify's image client for vLLM, `vllm bench serve`, against vLLM 0.34.0's own source (the
pinned release wheel from PyPI, its sha256 checked against forks/vllm/pin.toml): the module
builder runs dispatches `bench serve`; every option builder passes is one its parser declares
(benchmarks/serve.py add_cli_args and the dataset helpers it calls), every value one that
option takes; the prompts have one length, the requests ignore EOS at temperature 0 and carry
the key from the variable builder fills; every result key builder reads is in the JSON that
--save-result writes, in the file builder reads back.

The source is read, not run (importing vLLM starts torch): the parser through builder's
static reader (builder/upstream/pysource.py). The few pure functions whose behaviour is the
promise (the range ratio's lengths, the result file's name, a percentile's key) are compiled
from the wheel's text alone and called.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import logging
import math
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from builder.site import serving_bench
from builder.spec.engines import flag_value, vllm
from builder.upstream.pysource import (
    ClassRef,
    Evaluator,
    FunctionRef,
    SourceTree,
    Unresolvable,
)
from tests.conftest import REPO_ROOT
from tests.upstreams import fetch_release_file

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PIN = tomllib.loads((REPO_ROOT / "forks/vllm/pin.toml").read_text())
VLLM = vllm.ENGINE
SERVE = "vllm.benchmarks.serve"
REQUESTS = "vllm.benchmarks.lib.endpoint_request_func"
OUTPUT_FILE = "/tmp/builder-qualify-0123456789ab.jsonl"
COMMAND = VLLM.bench_command(
    base_url="http://127.0.0.1:8000", model="glm5", tokenizer="lukealonso/GLM-5-NVFP4",
    concurrency=4, prompts=16, input_len=1024, output_len=128, seed=7, deadline_s=600,
    output_file=OUTPUT_FILE,
)  # fmt: skip
_NO_VALUE = {"store_true", "store_false", "store_const", "count", "help", "version"}


class _WheelFiles:
    """The `vllm` package's .py files in the wheel, read where they are (PackageFiles)."""

    def __init__(self, archive: zipfile.ZipFile):
        self.archive = archive
        self.names = {n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")}

    def is_file(self, relative: str) -> bool:
        return f"vllm/{relative}" in self.names

    def read(self, relative: str) -> str:
        return self.archive.read(f"vllm/{relative}").decode()


@pytest.fixture(scope="module")
def ev() -> Iterator[Evaluator]:
    wheel = fetch_release_file("vllm", PIN["ref"])
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == PIN["sha256"]
    with zipfile.ZipFile(wheel) as archive:
        yield Evaluator(SourceTree(_WheelFiles(archive), "vllm"))


def _passed() -> list[str]:
    """What builder gives `vllm bench serve` (after `python3 -m MODULE bench serve`)."""
    at = COMMAND.index("-m")
    assert COMMAND[at + 1 : at + 4] == [VLLM.bench_module, "bench", "serve"], COMMAND
    return COMMAND[at + 4 :]


def _passed_value(flag: str) -> str:
    value = flag_value(_passed(), flag)
    assert value is not None, f"builder passes no {flag}"
    return value


# -- reading the source -------------------------------------------------------------------


def _calls(function: FunctionRef | ast.AST) -> Iterator[ast.Call]:
    node = function.node if isinstance(function, FunctionRef) else function
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _resolve(ev: Evaluator, module: str, node: ast.AST) -> object:
    try:
        return ev.eval(node, module)
    except Unresolvable:
        return None


def _method(ev: Evaluator, module: str, cls: str, name: str) -> FunctionRef:
    return ev.find_method(ev.find_class(module, cls), name)


def _nested(function: FunctionRef, name: str) -> ast.FunctionDef:
    """A function defined inside `function` (benchmark's process_one_metric)."""
    for node in ast.walk(function.node):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{function.qualname} defines no {name}")


def _compiled(ev: Evaluator, module: str, name: str, **names: object) -> Callable:
    """Function `name` of `module`, compiled from its text alone (annotations dropped: they
    name vLLM's types) with `names` as its globals."""
    node = copy.deepcopy(ev.find_function(module, name).node)
    for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
        arg.annotation = None
    node.returns = None
    scope: dict = dict(names)
    path = ev.tree.path_of(module)
    exec(compile(ast.fix_missing_locations(ast.Module([node], [])), f"vllm/{path}", "exec"), scope)
    return scope[name]


@dataclass(frozen=True)
class Option:
    takes_value: bool
    choices: tuple | None  # None: any value
    type: str  # builtins.int, builtins.float, builtins.str, json.loads, ...
    origin: str


def _choices(ev: Evaluator, module: str, node: ast.AST, origin: str) -> tuple:
    """A `choices=` expression's values: a constant expression, or `list(TABLE.keys())`."""
    found = _resolve(ev, module, node)
    if found is None and isinstance(node, ast.Call) and ast.unparse(node.func) == "list":
        inner = node.args[0] if node.args else None
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr == "keys"
        ):
            found = _resolve(ev, module, inner.func.value)
    if isinstance(found, set):
        return tuple(sorted(found))
    if not isinstance(found, list | tuple | dict):
        raise AssertionError(f"{origin}: choices {ast.unparse(node)} cannot be read")
    return tuple(found)


def _add_options(ev: Evaluator, function: FunctionRef, found: dict, seen: set) -> None:
    """Each `*.add_argument` of `function`, and of each function of the package it calls
    with the parser or one of its groups (add_dataset_parser, add_random_dataset_base_args)."""
    seen.add(function.qualname)
    for call in _calls(function):
        origin = ev.tree.rel(function.module, call.lineno)
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            names = [a.value for a in call.args if isinstance(a, ast.Constant)]
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            action = keywords.get("action")
            action_value = _resolve(ev, function.module, action) if action is not None else None
            boolean = action is not None and (
                ev.qualname(action, function.module) == "argparse.BooleanOptionalAction"
            )
            option = Option(
                takes_value=not boolean and action_value not in _NO_VALUE,
                choices=_choices(ev, function.module, keywords["choices"], origin)
                if "choices" in keywords
                else None,
                type=ev.qualname(keywords["type"], function.module) if "type" in keywords else "",
                origin=origin,
            )
            for name in names:
                found[name] = option
                if boolean and name.startswith("--"):
                    found[f"--no-{name[2:]}"] = option
        elif isinstance(call.func, ast.Name) and any(isinstance(a, ast.Name) for a in call.args):
            callee = _resolve(ev, function.module, call.func)
            if isinstance(callee, FunctionRef) and callee.qualname not in seen:
                _add_options(ev, callee, found, seen)


def _bench_serve(ev: Evaluator) -> ClassRef:
    """The `vllm bench` subcommand class named `serve`, in the modules `vllm bench` imports."""
    importer = ev.find_function("vllm.entrypoints.cli.benchmark.main", "_import_bench_subcommand_modules")  # fmt: skip
    modules = [alias.name for node in ast.walk(importer.node) if isinstance(node, ast.Import)
               for alias in node.names]  # fmt: skip
    for module in modules:
        for name, binding in ev.tree.bindings(module).items():
            if binding.kind != "class" or binding.module != module:
                continue
            cls = ev.find_class(module, name)
            bases = {ev.qualname(base, module) for base in cls.node.bases}
            base = "vllm.entrypoints.cli.benchmark.base.BenchmarkSubcommandBase"
            if base in bases and ev.class_attr(cls, "name") == "serve":
                return cls
    raise AssertionError(f"no `serve` subcommand among {modules}")


def _delegate(ev: Evaluator, method: FunctionRef) -> FunctionRef:
    """The package function a one-line method hands its arguments to."""
    for call in _calls(method):
        callee = _resolve(ev, method.module, call.func)
        if isinstance(callee, FunctionRef):
            return callee
    raise AssertionError(f"{method.qualname} calls no function of the package")


@pytest.fixture(scope="module")
def options(ev: Evaluator) -> dict[str, Option]:
    """`vllm bench serve`'s options as its parser is built: the serve subcommand's
    add_cli_args, followed into benchmarks/serve.py and the dataset helpers."""
    add_cli_args = _delegate(ev, ev.find_method(_bench_serve(ev), "add_cli_args"))
    assert add_cli_args.qualname == f"{SERVE}.add_cli_args"
    found: dict[str, Option] = {}
    _add_options(ev, add_cli_args, found, set())
    return found


def _problems(options: dict[str, Option], args: list[str]) -> list[str]:
    """What argparse (or the option's type) would refuse in `args`, one line each."""
    problems = []
    at = 0
    while at < len(args):
        word = args[at]
        option = options.get(word)
        if option is None:
            problems.append(f"{word}: not an option of vllm bench serve")
            # its value, if it has one, is no second problem
            at += 2 if at + 1 < len(args) and not args[at + 1].startswith("--") else 1
            continue
        if not option.takes_value:
            at += 1
            continue
        value = args[at + 1] if at + 1 < len(args) else None
        at += 2
        if value is None or value.startswith("--"):
            problems.append(f"{word}: takes a value, none given")
            at -= 1
            continue
        if option.choices is not None and value not in option.choices:
            problems.append(f"{word} {value}: not one of {', '.join(map(str, option.choices))}")
        convert = {"builtins.int": int, "builtins.float": float}.get(option.type)
        if convert is not None:
            try:
                convert(value)
            except ValueError:
                problems.append(f"{word} {value}: not {convert.__name__} ({option.origin})")
    return problems


# -- the tests ---------------------------------------------------------------------------


def test_the_module_builder_runs_dispatches_bench_serve(ev: Evaluator) -> None:
    module = VLLM.bench_module
    top = ev.tree.module_ast(module)
    assert any(
        isinstance(stmt, ast.If)
        and ast.unparse(stmt.test) == "__name__ == '__main__'"
        and ast.unparse(stmt.body[0]) == "main()"
        for stmt in top.body
    ), f"{module} does not run main() as __main__"
    main = ev.find_function(module, "main")
    commands = next(
        node.value for node in ast.walk(main.node)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CMD_MODULES"
    )  # fmt: skip
    assert "vllm.entrypoints.cli.benchmark.main" in map(ast.unparse, commands.elts)
    bench = ev.find_class("vllm.entrypoints.cli.benchmark.main", "BenchmarkSubcommand")
    assert ev.class_attr(bench, "name") == "bench"
    init = ev.find_function("vllm.entrypoints.cli.benchmark.main", "cmd_init")
    assert "BenchmarkSubcommand()" in ast.unparse(init.node)
    # `vllm bench` adds each BenchmarkSubcommandBase subclass as a subparser by its name,
    # its dispatch_function the class's cmd: serve's hands the args to serve.py's main.
    setup = ast.unparse(ev.find_method(bench, "subparser_init").node)
    assert "BenchmarkSubcommandBase.__subclasses__()" in setup
    assert "add_parser(cmd_cls.name" in setup and "dispatch_function=cmd_cls.cmd" in setup
    serve = _bench_serve(ev)
    assert _delegate(ev, ev.find_method(serve, "cmd")).qualname == f"{SERVE}.main"
    # It runs vLLM's Rust client instead only when VLLM_USE_RUST_BENCH says so (off by
    # default, and builder's exec sets no such variable).
    envs = ast.unparse(ev.tree.module_ast("vllm.envs"))
    assert "os.getenv('VLLM_USE_RUST_BENCH', '0')" in envs


def test_every_option_builder_passes_is_one_vllm_bench_serve_takes(options: dict) -> None:
    assert _problems(options, _passed()) == []


def test_the_reader_finds_the_options_and_their_choices(options: dict) -> None:
    """It reads what 0.34.0 declares (not an empty or partial parser that passes anything)."""
    assert len(options) > 100  # 0.34.0: 101 declared, and --no-self-timed beside one
    assert "random" in options["--dataset-name"].choices
    assert {"vllm", "openai", "openai-chat"} <= set(options["--backend"].choices)
    assert not options["--save-result"].takes_value and options["--result-dir"].takes_value
    assert options["--random-range-ratio"].type == "builtins.str"  # parsed later, as a float
    said = _problems(options, ["--backend", "sglang", "--save-results", "--seed", "x", "--model"])
    assert said == [
        "--backend sglang: not one of " + ", ".join(options["--backend"].choices),
        "--save-results: not an option of vllm bench serve",
        f"--seed x: not int ({options['--seed'].origin})",
        "--model: takes a value, none given",
    ]


def test_the_vllm_backend_streams_completions_greedy_and_to_the_length(ev: Evaluator) -> None:
    """--backend vllm is the completions request function, one of the OpenAI-compatible
    backends (else --temperature is refused, serve.py:2242-2245); that function puts
    ignore_eos and the sampling parameters (--temperature's) into each request."""
    table = ev.lookup(REQUESTS, "ASYNC_REQUEST_FUNCS")
    request = table[_passed_value("--backend")]
    assert request.qualname == f"{REQUESTS}.async_request_openai_completions"
    compatible = ev.tree.bindings(REQUESTS)["OPENAI_COMPATIBLE_BACKENDS"].node
    assert request.node.name in {n.id for n in ast.walk(compatible) if isinstance(n, ast.Name)}
    assert _passed_value("--temperature") == "0" and "--ignore-eos" in _passed()
    common = ev.find_function(REQUESTS, "_update_payload_common")
    assert "_update_payload_common(payload, request_func_input)" in ast.unparse(request.node)
    written = ast.unparse(common.node)
    assert "payload['ignore_eos'] = request_func_input.ignore_eos" in written
    assert "payload.update(request_func_input.extra_body)" in written
    main = ast.unparse(ev.find_function(SERVE, "main_async").node)
    assert "'temperature': args.temperature" in main  # a sampling parameter when given
    assert "extra_body = {**sampling_params, **extra_body}" in main


def test_range_ratio_0_gives_every_prompt_and_output_one_length(ev: Evaluator) -> None:
    """As RandomDataset.sample draws them: every prompt of --random-input-len tokens less
    the special tokens the tokenizer adds (the server adds them back to a text prompt:
    completion/protocol.py:118-124), every output of --random-output-len (a 0.5 ratio
    spreads them: the same code, another answer)."""
    sample = _method(ev, "vllm.benchmarks.datasets.datasets", "RandomDataset", "sample")
    called = {_resolve(ev, sample.module, c.func) for c in _calls(sample)}
    sampler = ev.find_function("vllm.benchmarks.datasets.utils", "get_sampling_params")
    assert sampler in called
    datasets, utils = "vllm.benchmarks.datasets.datasets", "vllm.benchmarks.datasets.utils"
    parse_ratio = _compiled(ev, datasets, "_parse_range_ratio", json=json)
    resolve = _compiled(ev, utils, "_resolve_range_ratios")
    draw = _compiled(
        ev, utils, "get_sampling_params", math=math, np=np, _resolve_range_ratios=resolve,
        logger=logging.getLogger("vllm-0.34.0"),
    )  # fmt: skip

    class Tokenizer:  # one that adds two special tokens to a prompt
        vocab_size = 151_000

        def num_special_tokens_to_add(self) -> int:
            return 2

    input_len = int(_passed_value("--random-input-len"))
    output_len = int(_passed_value("--random-output-len"))
    prompts = int(_passed_value("--num-prompts"))

    def lengths(ratio: str) -> tuple[set, set]:
        rng = np.random.default_rng(int(_passed_value("--seed")))
        inputs, outputs, _ = draw(rng, prompts, parse_ratio(ratio), input_len, output_len, Tokenizer())  # fmt: skip
        return set(inputs.tolist()), set(outputs.tolist())

    assert lengths(_passed_value("--random-range-ratio")) == ({input_len - 2}, {output_len})
    spread_inputs, spread_outputs = lengths("0.5")
    assert len(spread_inputs) > 1 and len(spread_outputs) > 1


def _written_keys(ev: Evaluator) -> set[str]:
    """The keys benchmark() returns for a generation run with builder's percentile options:
    its result dict's own, and process_one_metric's `mean_`/`median_`/`p{N}_` ones, each
    percentile word made by 0.34.0's own expression."""
    benchmark = ev.find_function(SERVE, "benchmark")
    result = next(
        node.value for node in ast.walk(benchmark.node)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "result"
        and isinstance(node.value, ast.Dict)
        and "output_throughput" in {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    )  # fmt: skip
    keys = {k.value for k in result.keys if isinstance(k, ast.Constant)}
    metric = _nested(benchmark, "process_one_metric")
    reported = {
        call.args[0].value for call in _calls(benchmark)
        if ast.unparse(call.func) == "process_one_metric" and isinstance(call.args[0], ast.Constant)
    }  # fmt: skip
    selected = _passed_value("--percentile-metrics").split(",")
    assert set(selected) <= reported, f"0.34.0 reports no {set(selected) - reported}"
    word = next(
        node.value for node in ast.walk(metric)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "p_word"
    )  # fmt: skip
    words = [
        eval(compile(ast.Expression(word), "serve.py", "eval"), {"str": str, "int": int}, {"p": float(p)})
        for p in _passed_value("--metric-percentiles").split(",")
    ]  # fmt: skip
    templates = [
        node.targets[0].slice for node in ast.walk(metric)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
        and ast.unparse(node.targets[0].value) == "result"
        and isinstance(node.targets[0].slice, ast.JoinedStr)
    ]  # fmt: skip
    for template in templates:
        for name in selected:
            for p_word in words:
                values = {"metric_attribute_name": name, "p_word": p_word}
                keys.add(
                    "".join(
                        part.value if isinstance(part, ast.Constant) else values[part.value.id]
                        for part in template.values
                    )
                )
    return keys


def test_every_key_builder_reads_is_in_the_saved_result(ev: Evaluator) -> None:
    written = _written_keys(ev)
    assert set(VLLM.bench_result_keys) <= written, set(VLLM.bench_result_keys) - written
    main = ev.find_function(SERVE, "main_async")
    # The file holds benchmark()'s result merged in, less the per-request arrays (without
    # --save-detailed), as one json.dump: one line, the last line run_level reads.
    merged = [
        node for node in ast.walk(main.node)
        if isinstance(node, ast.Dict) and ast.unparse(node) == "{**result_json, **benchmark_result}"
    ]  # fmt: skip
    assert merged, "main_async no longer merges benchmark()'s result into the saved JSON"
    dropped = next(
        set(ast.literal_eval(node.iter)) for node in ast.walk(main.node)
        if isinstance(node, ast.For) and ast.unparse(node.target) == "field"
    )  # fmt: skip
    assert not dropped & set(VLLM.bench_result_keys), dropped & set(VLLM.bench_result_keys)
    saves = [
        node for node in ast.walk(main.node)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "args.save_result or args.append_result"
    ]  # fmt: skip
    dumps = [c for save in saves for c in _calls(save) if ast.unparse(c.func) == "json.dump"]
    assert [ast.unparse(d) for d in dumps] == ["json.dump(result_json, outfile)"]
    assert "--save-result" in _passed()
    # ... and each is a figure of the receipt's level.
    level = serving_bench.level_from_result(
        VLLM.bench_result(dict.fromkeys(written, 1.0)), concurrency=4, prompts=1, seed=7
    )
    for metric in ("ttft_ms", "tpot_ms", "e2e_latency_ms"):
        assert None not in level[metric].values(), (metric, level[metric])


def test_the_result_is_saved_where_builder_reads_it(ev: Evaluator, tmp_path: Path) -> None:
    """compute_result_filename, called with builder's --result-dir and --result-filename
    (qualify's file, here under tmp_path): the very path builder cats."""
    name = _compiled(ev, SERVE, "compute_result_filename", os=__import__("os"))
    passed = _passed()
    args = argparse.Namespace(
        plot_timeline=False, save_result="--save-result" in passed, append_result=False,
        max_concurrency=int(_passed_value("--max-concurrency")), backend="vllm",
        ramp_up_strategy=None, request_rate=float("inf"),
        result_dir=str(tmp_path) + _passed_value("--result-dir"),
        result_filename=_passed_value("--result-filename"),
    )  # fmt: skip
    assert name(args, "glm5", None, "20260101-000000") == str(tmp_path) + OUTPUT_FILE


def test_the_key_is_read_from_the_variable_builder_fills(ev: Evaluator) -> None:
    """Every request of the vllm backend takes its headers from _get_headers, which reads
    the key from the environment variable serving_bench puts the server's key in."""
    request = ev.lookup(REQUESTS, "ASYNC_REQUEST_FUNCS")[_passed_value("--backend")]
    assert "headers = _get_headers()" in ast.unparse(request.node)
    headers = ev.find_function(REQUESTS, "_get_headers")
    read = [
        call.args[0].value for call in _calls(headers)
        if ast.unparse(call.func) == "os.environ.get" and isinstance(call.args[0], ast.Constant)
    ]  # fmt: skip
    assert read == [serving_bench.API_KEY_ENV]
    assert "headers['Authorization'] = f'Bearer {api_key}'" in ast.unparse(headers.node)
