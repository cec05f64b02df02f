"""Which generator calls the kernel-builder container may run: one rule for the target's
`[[jit.modules]]`, `--jit-modules` and kernel packs.

The warm-up imports the module and calls the function a generator entry names, inside a
container of the kernel-builder stage, and what it makes is native code in every image. So
an entry must be a public `gen_*` function of a `flashinfer.jit` module (none of the
`gen_customize_*` ones, which take C++ source), with plain arguments only: numbers, bool,
None, short identifier-like strings and `torch.<dtype>`, what chooses among FlashInfer's
own templates. Standard library only: the target loader reads it.
"""

from __future__ import annotations

import ast
import re

_GENERATOR = re.compile(r"flashinfer\.jit(\.[a-z_][a-z0-9_]*)*:gen_\w+(\(.*\))?", re.DOTALL)
_TORCH_NAME = re.compile(r"[a-z][a-z0-9_]*")
_PLAIN_STRING = re.compile(r"[A-Za-z0-9_.]{0,64}")  # as images/sm120/jit_journal.py notes
_MAX_LENGTH = 2000
RULE = "flashinfer.jit.<module>:gen_<name>(plain arguments)"


def _plain_argument(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, str):
            return bool(_PLAIN_STRING.fullmatch(value))
        return value is None or type(value) in (bool, int, float)
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and bool(_TORCH_NAME.fullmatch(node.attr))
    )


def is_flashinfer_call(entry: str) -> bool:
    """`flashinfer.jit.x:gen_y` or `flashinfer.jit.x:gen_y(plain, arguments=...)`."""
    if len(entry) > _MAX_LENGTH or not _GENERATOR.fullmatch(entry):
        return False
    function = entry.partition(":")[2]
    if "customize" in function.split("(")[0]:
        return False
    try:
        call = ast.parse(function, mode="eval").body
    except SyntaxError:
        return False
    if isinstance(call, ast.Name):
        return True
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return False
    if any(keyword.arg is None for keyword in call.keywords):
        return False
    return all(_plain_argument(node) for node in [*call.args, *(k.value for k in call.keywords)])
