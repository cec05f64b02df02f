"""Which FlashInfer generator call made each module a server had to compile itself.

Installed into the image's site-packages as `builder_jit_journal` with a .pth line, so
every Python process of the server (sglang starts one per GPU) loads it. When
`flashinfer.jit.core` is imported, it wraps its spec registry: a spec that is not compiled
yet (no kernel-wheel or workspace .so) gets a line in
`<flashinfer workspace>/<version>/<arch>/generators.jsonl`:

    {"name": "silu_and_mul",
     "generator": "flashinfer.jit.activation:gen_act_and_mul_module(act_func_name='silu')"}

`builder jit harvest` reads it to tell the next build what to compile. It carries names and
literal arguments only, never code: the build host recompiles each module from its own
flashinfer source and checks that the call makes a module of that name. Nothing here may
stop a server, so every failure is swallowed.
"""

import contextlib
import importlib.abc
import inspect
import json
import math
import os
import re
import sys

_CORE = "flashinfer.jit.core"
JOURNAL = "generators.jsonl"


# What builder accepts back (builder/spec/jit/packs.py check_generator): a FlashInfer
# generator whose arguments only choose among FlashInfer's own templates. A string is a
# short identifier, never source text; `gen_customize_*` take C++ source and are never noted.
_PLAIN_STRING = re.compile(r"[A-Za-z0-9_.]{0,64}")


def _literal(value):
    """The source text of a generator argument, or None: plain literals and torch dtypes."""
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value)  # torch.float16
    if isinstance(value, str):
        return repr(value) if _PLAIN_STRING.fullmatch(value) else None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return None


def _generator_call(frame) -> str | None:
    """`module:gen_function(name=value, ...)` of the innermost public FlashInfer generator on
    the stack whose arguments are all plain literals."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        name = frame.f_code.co_name
        function = inspect.unwrap(frame.f_globals.get(name, None) or (lambda: None))
        if (
            module.startswith("flashinfer.jit.")
            and module != _CORE  # gen_jit_spec itself
            and name.startswith("gen_")
            and "customize" not in name
            and getattr(function, "__code__", None) is frame.f_code  # functools.cache too
        ):
            info = inspect.getargvalues(frame)
            if not info.varargs and not info.keywords:
                rendered = [(arg, _literal(info.locals.get(arg))) for arg in info.args]
                if all(text is not None for _, text in rendered):
                    return f"{module}:{name}({', '.join(f'{a}={t}' for a, t in rendered)})"
        frame = frame.f_back
    return None


def _note(core, spec) -> None:
    if spec.is_compiled:
        return
    call = _generator_call(sys._getframe(2))
    if call is None:
        return
    line = json.dumps({"name": spec.name, "generator": call}) + "\n"
    folder = os.path.dirname(os.fspath(core.jit_env.FLASHINFER_JIT_DIR))  # <version>/<arch>
    os.makedirs(folder, exist_ok=True)
    journal = os.path.join(folder, JOURNAL)
    descriptor = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode())  # one write: lines of several processes stay whole
    finally:
        os.close(descriptor)


def _wrap(core) -> None:
    registry = core.jit_spec_registry
    register = registry.register

    def journaled_register(spec):
        register(spec)
        with contextlib.suppress(Exception):
            _note(core, spec)

    registry.register = journaled_register


class _AfterCoreImport(importlib.abc.MetaPathFinder):
    """Wraps flashinfer.jit.core's registry once that module has run; any failure leaves
    the import as it would have been without this hook."""

    def __init__(self) -> None:
        self._searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != _CORE or self._searching:
            return None
        self._searching = True
        try:
            spec = next(
                (
                    found
                    for finder in sys.meta_path
                    if finder is not self
                    and hasattr(finder, "find_spec")
                    and (found := finder.find_spec(fullname, path, target)) is not None
                ),
                None,
            )
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                with contextlib.suppress(Exception):
                    _wrap(module)
                    sys.meta_path.remove(self)  # done: later imports pay nothing

            spec.loader.exec_module = exec_module
            return spec
        except Exception:
            return None
        finally:
            self._searching = False


if not any(type(finder).__name__ == "_AfterCoreImport" for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterCoreImport())
