"""builder.upstream.pysource, the static reader of a Python package's source, on small
packages written to tmp_path. The package is `acme`, not sglang: the reader knows no
upstream. Nothing here is imported; a module that would fail on import reads the same."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from builder.upstream.jit_generators import check_generators
from builder.upstream.pysource import (
    Binding,
    ClassRef,
    Evaluator,
    External,
    ExtractionError,
    ModuleRef,
    SourceTree,
    Unresolvable,
    resolve_relative,
)


def _package(root: Path, files: dict[str, str], top: str = "acme") -> Evaluator:
    for relative, text in files.items():
        path = root / top / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return Evaluator(SourceTree(root / top, top))


def _why(call) -> str:
    """The reason an Unresolvable gives."""
    with pytest.raises(Unresolvable) as raised:
        call()
    return str(raised.value)


def test_relative_imports_resolve_from_modules_and_packages(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "",
            "base.py": "LIMIT = 4\n",
            "sub/__init__.py": "from ..base import LIMIT as CAP\n",
            "sub/mod.py": "from ..base import LIMIT\nfrom . import CAP\nBOTH = [LIMIT, CAP + 1]\n",
        },
    )
    assert ev.lookup("acme.sub.mod", "BOTH") == [4, 5]
    # the same `from .. import` names another module from a package's __init__ than from a module
    node = ast.parse("from .. import x").body[0]
    assert resolve_relative("acme.sub", node, is_package=True) == "acme"
    assert resolve_relative("acme.sub.mod", node, is_package=False) == "acme"
    assert resolve_relative("acme.sub.mod", node, is_package=True) == "acme.sub"
    # above the top package: no package's module (Python: "beyond top-level package")
    too_far = ast.parse("from .... import x").body[0]
    assert resolve_relative("acme.sub.mod", too_far, is_package=False) == ""


def test_a_name_is_followed_through_re_exports_to_its_definition(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "from .api import make_module\n",
            "api.py": "from acme.impl.gen import make_module\nVERSION = 2\n",
            "impl/__init__.py": "",
            "impl/gen.py": "def make_module(dtype, *, heads=8):\n    return dtype\n",
        },
    )
    found = ev.find_function("acme", "make_module")
    assert (found.module, found.node.name, found.node.lineno) == ("acme.impl.gen", "make_module", 1)
    assert (
        _why(lambda: ev.find_function("acme.api", "VERSION"))
        == "acme.api.VERSION is not a function of the package"
    )


def test_a_submodule_and_a_module_alias_read_as_modules(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "",
            "consts.py": "LIMIT = 7\n",
            "use.py": (
                "import acme.consts as C\nfrom acme import consts\nimport argparse\n"
                "A = C.LIMIT\nB = consts.LIMIT\n"
            ),
        },
    )
    assert ev.lookup("acme.use", "C") == ModuleRef("acme.consts")
    assert ev.lookup("acme.use", "consts") == ModuleRef("acme.consts")
    assert (ev.lookup("acme.use", "A"), ev.lookup("acme.use", "B")) == (7, 7)
    assert ev.lookup("acme.use", "argparse") == External("argparse")


def test_conditional_imports_read_as_their_first_branch(tmp_path: Path) -> None:
    """`try`/`except ImportError`, `with contextlib.suppress(ImportError)` and `if
    available():` bind what their first branch imports; an `else` only what that leaves."""
    ev = _package(
        tmp_path,
        {
            "__init__.py": "",
            "fast.py": 'MODE = "fast"\nSPEED = 9\nKIND = "cute"\n',
            "pick.py": """\
                import contextlib
                from .probe import available

                try:
                    from .fast import MODE
                except ImportError:
                    MODE = "slow"
                with contextlib.suppress(ImportError):
                    from .fast import SPEED
                if available():
                    from .fast import KIND
                else:
                    KIND = None
                    FALLBACK = True
                """,
            "probe.py": "def available():\n    return False\n",
        },
    )
    binding = ev.tree.bindings("acme.pick")["MODE"]
    assert (binding.kind, binding.imported) == ("from", "MODE")
    found = [ev.lookup("acme.pick", name) for name in ("MODE", "SPEED", "KIND", "FALLBACK")]
    assert found == ["fast", 9, "cute", True]


def test_names_outside_the_package_are_external_and_not_read(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "",
            "flags.py": (
                "from argparse import BooleanOptionalAction\n"
                "from sglang.srt.server_args import ServerArgs\n"
            ),
        },
    )
    assert ev.lookup("acme.flags", "BooleanOptionalAction") == External(
        "argparse.BooleanOptionalAction"
    )
    # sglang is another package here, even though the reader was written for it
    assert ev.lookup("acme.flags", "ServerArgs") == External("sglang.srt.server_args.ServerArgs")
    assert ev.lookup("acme.flags", "sorted") == External("builtins.sorted")
    assert (
        _why(lambda: ev.lookup("acme.flags", "nowhere")) == "name 'nowhere' not bound in acme.flags"
    )


def test_the_package_name_is_the_trees_own(tmp_path: Path) -> None:
    _package(tmp_path, {"__init__.py": "X = 1\n", "srt/server_args.py": "Y = 2\n"})
    acme = SourceTree(tmp_path / "acme", "acme")
    assert acme.path_of("acme.srt.server_args") == "srt/server_args.py"
    # the same folder read as sglang holds none of sglang's modules (its modules are acme's)
    as_sglang = SourceTree(tmp_path / "acme", "sglang")
    assert as_sglang.path_of("sglang.srt.server_args") == "srt/server_args.py"
    assert as_sglang.path_of("acme.srt.server_args") is None
    assert (
        _why(lambda: as_sglang.module_ast("acme.srt.server_args"))
        == "module acme.srt.server_args not in the source tree"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("def broken(:\n    pass\n",
         "acme/gen/broken.py: cannot be parsed by this Python (invalid syntax"),
        ("x = " + "-" * 100_000 + "1\n", "acme/gen/broken.py: nested too deeply to parse"),
        ("x = 1\0\n", "acme/gen/broken.py: cannot be parsed by this Python (source code"),
    ],
    ids=["syntax", "nested-too-deeply", "null-byte"],
)  # fmt: skip
def test_an_unparsable_file_is_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "from .gen.broken import x\n",
            "gen/__init__.py": "",
            "gen/broken.py": text,
        },
    )
    with pytest.raises(ExtractionError) as raised:
        ev.lookup("acme", "x")
    assert str(raised.value).startswith(message), raised.value
    assert "\n" not in str(raised.value)


def test_imports_in_a_circle_are_unresolvable_not_endless(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {"__init__.py": "", "a.py": "from .b import thing\n", "b.py": "from .a import thing\n"},
    )
    assert (
        _why(lambda: ev.find_function("acme.a", "thing"))
        == "'thing': imports in a circle through acme.b"
    )


def test_literal_members_and_enum_member_names(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "",
            "types.py": """\
                import enum
                from typing import Literal, Optional

                Backend = Literal["b12x", "flashinfer_b12x"]

                class Mode(enum.Enum):
                    NONE = 0
                    FULL = 1
                    OFF = 0  # an alias of NONE: not a member of iteration
                """,
            "config.py": """\
                from typing import Literal, Optional
                from acme.types import Backend, Mode

                class KernelConfig:
                    backend: Backend
                    dtype: Optional[Literal["auto", "fp8"]] = None
                    mode: Mode | None = None
                """,
        },
    )
    config = ev.find_class("acme.config", "KernelConfig")
    fields = {s.target.id: s.annotation for s in config.node.body if isinstance(s, ast.AnnAssign)}
    # Optional[Literal[...]]: unwrapped, then the members
    dtype = ev.unwrap_optional(fields["dtype"], "acme.config")
    assert ev.literal_values(dtype, "acme.config") == ["auto", "fp8"]
    # a Literal behind an alias of another module: its definition, then the members
    alias = ev.tree.definition("acme.config", ast.unparse(fields["backend"]))
    assert isinstance(alias, Binding) and alias.module == "acme.types"
    assert ev.literal_values(alias.node, alias.module) == ["b12x", "flashinfer_b12x"]
    # Mode | None: the enum class, its members by name
    mode = ev.eval(ev.unwrap_optional(fields["mode"], "acme.config"), "acme.config")
    assert isinstance(mode, ClassRef) and ev.is_enum(mode)
    assert [m.name for m in ev.enum_members(mode)] == ["NONE", "FULL"]
    assert (
        _why(lambda: ev.find_class("acme.config", "Literal"))
        == "acme.config.Literal is not a class of the package"
    )


def test_constant_expressions_are_evaluated_across_modules(tmp_path: Path) -> None:
    ev = _package(
        tmp_path,
        {
            "__init__.py": "",
            "names.py": """\
                BASE = ["a", "b"]
                EXTRA = {"c"}

                def choices():
                    from .more import MORE
                    return sorted(set(BASE) | EXTRA | MORE)
                """,
            "more.py": 'MORE = {x.upper() for x in ["d"]}\n',
            "use.py": "from .names import choices, BASE\nALL = choices()\nFIRST = [*BASE, f'{1}']\n",
        },
    )
    assert ev.lookup("acme.use", "ALL") == ["D", "a", "b", "c"]
    assert _why(lambda: ev.lookup("acme.use", "FIRST")) == "f-string"


def test_jit_generators_read_a_wheel_through_pysource(tmp_path: Path) -> None:
    """jit_generators' reader (path -> text or None, a wheel's members) through pysource:
    a generator re-exported by a package's __init__ is found at its definition, and a module
    this Python cannot parse is one line naming it from the wheel's root."""
    members = {
        "flashinfer/__init__.py": "",
        "flashinfer/jit/__init__.py": (
            "try:\n    from .mla import gen_mla_module\nexcept ImportError:\n    pass\n"
        ),
        "flashinfer/jit/mla.py": "def gen_mla_module(dtype, head_dim=64):\n    pass\n",
        "flashinfer/jit/broken.py": "def gen(:\n",
    }
    checks = check_generators(
        [
            "flashinfer.jit:gen_mla_module('bf16')",
            "flashinfer.jit:gen_mla_module()",
            "flashinfer.jit:gen_gone_module",
        ],
        members.get,
    )
    assert [(c.status, c.detail) for c in checks] == [
        ("present", ""),
        ("arguments", "gen_mla_module now also needs dtype"),
        ("missing", "no gen_gone_module in flashinfer.jit"),
    ]
    with pytest.raises(ExtractionError, match=r"^flashinfer/jit/broken\.py: cannot be parsed"):
        check_generators(["flashinfer.jit.broken:gen"], members.get)
