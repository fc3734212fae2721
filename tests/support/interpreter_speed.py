"""Less per-call overhead in the Triton interpreter (TRITON_INTERPRET=1, test processes only).

Read in triton 3.8.0 / 3.9.0, triton/runtime/interpreter.py: every kernel launch and every call of a
`@triton.jit` helper from inside a kernel runs `_patch_lang`, which for each language module calls
`_patch_builtin`, which lists the module's members with `inspect.getmembers` (sorting a few hundred
names) to find the builtins it maps to NumPy. Nothing about that list changes between calls. Under
cProfile, the listing was about 30 % of a tiny hybrid model's forward + backward through fastpath's
interpreted kernels (tests/support/matrix_worker.py's family case).

`builtins_listed_once` lists each module's builtins once, at install, and at each call maps only
those still bound to the original builtin: what `inspect.getmembers` + `is_builtin` would find, as
a member already mapped (by an enclosing call) is a plain lambda, not a builtin. The mapping itself
(`_patch_attr`, the patch scope and its restore) is the interpreter's own, unchanged; so are the
kernels' arithmetic and results (tests/test_interpreter_speed.py compares them).

`ReduceOps.apply_impl` has NumPy paths for sum / min / max / argmin / argmax only; any other combine
function falls back to `generic_reduce`, a Python loop over every element. `tl.sort`'s bitonic
network reduces with `xor_sum` many times a call (Liger's MoE router sorts: tests/support/
liger_interpreter.py installs it). `xor_reduce_in_numpy` gives `xor_sum`'s combine
(`tl.standard._xor_combine`) one `np.bitwise_xor.reduce`: the same integers in any order, as xor
is associative and commutative.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

MARK = "__fastpath_test_listed__"


def builtins_listed_once() -> bool:
    """Install the listing above; False when already installed or this Triton lacks the functions."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    is_builtin = getattr(tl.core, "is_builtin", None)
    if original is None or patch_attr is None or is_builtin is None or getattr(original, MARK, False):
        return False
    packages: list[Any] = [tl, tl.core, tl.tensor, tl.math]
    if hasattr(tl.core, "tensor_descriptor_base"):
        packages.append(tl.core.tensor_descriptor_base)
    listed = {id(pkg): [(name, member) for name, member in inspect.getmembers(pkg) if is_builtin(member)]
              for pkg in packages}

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        members = listed.get(id(pkg))
        if members is None:  # a module this list was not made for: the interpreter's own way
            original(pkg, builder, scope)
            return
        for name, member in members:
            if getattr(pkg, name, None) is member:
                patch_attr(pkg, name, member, builder, scope)

    setattr(patch_builtin, MARK, True)
    interpreter._patch_builtin = patch_builtin
    return True


def xor_reduce_in_numpy() -> bool:
    """`xor_sum` in one NumPy reduction instead of the interpreter's per-element loop; False
    when already installed or when this Triton has no `_xor_combine` / `ReduceOps`."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    ops = getattr(interpreter, "ReduceOps", None)
    combine = getattr(tl.standard, "_xor_combine", None)
    if ops is None or combine is None or getattr(ops.apply_impl, MARK, False):
        return False
    original = ops.apply_impl

    def apply_impl(self: Any, input: Any) -> Any:
        if self.combine_fn is not combine or len(input) != 1:
            return original(self, input)
        data = input[0].handle.data
        out = np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(out, input[0].dtype)

    setattr(apply_impl, MARK, True)
    ops.apply_impl = apply_impl
    return True


def install() -> bool:
    """builtins_listed_once() when the process runs Triton's interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1" and builtins_listed_once()
