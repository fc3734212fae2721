"""A Triton kernel may read a module global only when it is a `tl.constexpr`.

The interpreter (TRITON_INTERPRET=1, how CI runs the kernels) reads any global, but the GPU
compiler refuses a plain float ("Cannot access global variable ... from within @jit'ed function"):
the H200 caught `LOG2E = 1.44...` in the selective scan that every CPU test had passed. This test
finds such globals on the CPU, from each kernel's bytecode.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import fastpath.kernels as kernels_pkg  # noqa: E402


def _kernel_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(kernels_pkg.__path__, "fastpath.kernels."))


def _jit_functions(module) -> list:
    """The module's own @triton.jit functions: JITFunction, or InterpretedFunction under
    TRITON_INTERPRET=1 (how CI runs); both keep the Python function as `.fn`."""
    kinds = tuple(k for k in (getattr(triton.runtime.jit, "JITFunction", None),
                              getattr(getattr(triton.runtime, "interpreter", None), "InterpretedFunction", None))
                  if k is not None)
    return [v for v in vars(module).values()
            if isinstance(v, kinds) and getattr(getattr(v, "fn", None), "__module__", None) == module.__name__]


@pytest.mark.parametrize("name", _kernel_modules())
def test_jit_functions_read_only_constexpr_globals(name: str):
    module = importlib.import_module(name)
    for jit in _jit_functions(module):
        for global_name in jit.fn.__code__.co_names:
            value = jit.fn.__globals__.get(global_name)
            if isinstance(value, (bool, int, float)) and not isinstance(value, tl.constexpr):
                pytest.fail(f"{name}.{jit.fn.__name__} reads the plain global {global_name} = "
                            f"{value!r}: make it tl.constexpr(...) or pass it as an argument")


def test_the_check_sees_kernels():
    """The walk finds the jit functions (a check that inspects nothing proves nothing)."""
    found = sum(len(_jit_functions(importlib.import_module(n))) for n in _kernel_modules())
    assert found >= 10
