"""Let Liger Kernel's own Triton kernels run under TRITON_INTERPRET=1 on CPU (test processes only).

Gaps of the Triton interpreter (read in triton 3.9.0, triton/runtime/interpreter.py), not of Liger,
stop liger-kernel 0.8.5's RMSNorm, SwiGLU and fused MoE kernels there, or slow them:
  * `_implicit_cvt` wraps bool / int / pointer arguments as Triton tensors but passes a Python
    float through as is ("TODO: wrap everything in triton tensors"), so Liger's
    `eps.to(tl.float32)` (ops/rms_norm.py) and `gate_multiplier.to(tl.float32)` (ops/swiglu.py)
    raise "AttributeError: 'float' object has no attribute 'to'". Compiled Triton specialises a
    float argument to an fp32 scalar: `float_args_as_fp32` makes the interpreter do the same.
  * `_patch_lang` maps `tl.math.*` to NumPy only while a kernel runs, by attribute; Liger binds
    `rsqrt` from `triton.language.extra.libdevice` by name at import, which the interpreter never
    maps (it returns None). `libdevice_rsqrt_at_call_time` rebinds that name to a function that
    looks `tl.math.rsqrt` up when called.
  * an autotuned kernel (liger's fused MoE experts, ops/fused_moe.py) asks the active driver for a
    benchmarker, which the interpreter has not ("0 active drivers"): `first_config_only` keeps
    each such kernel's first config, as fastpath's own interpreter runs do (norm_route).
  * Liger's MoE router sorts with `tl.sort`, whose bitonic network reduces with `xor_sum` hundreds of
    times a call, element by element in the interpreter (70 % of the Liger compose test's MoE job,
    measured with cProfile): `install` adds interpreter_speed.py's NumPy path for it, and that
    module's once-only listing of tl's builtins (both speed only).
The fused linear cross-entropy kernels run without any of these. The kernels' arithmetic is Liger's,
unchanged; the tests check the results against transformers' float modules.
"""

from __future__ import annotations

from typing import Any

from interpreter_speed import builtins_listed_once, xor_reduce_in_numpy


def float_args_as_fp32() -> bool:
    """Wrap float kernel arguments as fp32 scalars in the interpreter; False when it already does."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._implicit_cvt
    if not isinstance(original(1.5), float) or getattr(original, "__liger_test__", False):
        return False

    def convert(arg: Any) -> Any:
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return original(arg)

    convert.__liger_test__ = True  # type: ignore[attr-defined]
    interpreter._implicit_cvt = convert
    return True


def libdevice_rsqrt_at_call_time() -> bool:
    import triton.language as tl

    try:
        from liger_kernel.ops import rms_norm
    except ImportError:
        return False
    if getattr(rms_norm.rsqrt, "__module__", "") == __name__:
        return False

    def rsqrt(x: Any) -> Any:
        return tl.math.rsqrt(x)

    rms_norm.rsqrt = rsqrt
    return True


def first_config_only(module_name: str = "liger_kernel.ops.fused_moe") -> bool:
    import importlib

    from triton.runtime.autotuner import Autotuner

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    trimmed = False
    for obj in list(vars(module).values()):
        for _ in range(4):  # heuristics -> autotune -> jit
            if isinstance(obj, Autotuner) and len(obj.configs) > 1:
                obj.configs = obj.configs[:1]
                trimmed = True
            obj = getattr(obj, "fn", None)
            if obj is None:
                break
    return trimmed


def install() -> list[str]:
    """The adaptations above; what was changed (for the worker's JSON)."""
    changed = []
    if float_args_as_fp32():
        changed.append("triton interpreter: float kernel arguments as fp32 scalars")
    if libdevice_rsqrt_at_call_time():
        changed.append("liger_kernel.ops.rms_norm.rsqrt looked up as tl.math.rsqrt at call time")
    if xor_reduce_in_numpy():
        changed.append("triton interpreter: xor_sum reduced by NumPy")
    if first_config_only():
        changed.append("liger_kernel.ops.fused_moe autotuned kernels: first config only")
    if builtins_listed_once():
        changed.append("triton interpreter: tl's builtins listed once (interpreter_speed)")
    return changed
