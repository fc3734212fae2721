"""Cheap repeat launches of a Triton kernel, for the decode hot path.

Why: the one-token update runs in ~6 us on an H200, but `kernel[grid](...)` in Triton 3.6 spends
20-30 us of host time per call on that machine's CPU (binding and specialising every argument,
building a cache key string, reading knobs) - so eager decode measured the launcher, not the
kernel. Here the first call of each specialisation goes through Triton as usual and keeps the
CompiledKernel it returns; later calls with the same specialisation launch that compiled kernel
directly through CompiledKernel's own `[grid](*args)` entry.

Our key is at least as fine as Triton's specialisation (so a cached kernel is only reused where
Triton would have picked the same binary): per tensor its dtype and 16-byte alignment; per int
whether it is 1, divisible by 16, and fits in int32; every other value as itself; the constexprs;
num_warps; the device. Anything unusual (launch hooks set by a profiler, the CPU interpreter, a
Triton whose CompiledKernel lacks the entry) takes the ordinary path.
"""

from __future__ import annotations

from typing import Any

import torch

_I32 = 2**31


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -_I32 <= value < _I32)
    return value


class CachedLauncher:
    """Launch `fn` (a @triton.jit function whose constexpr parameters all come last) with
    positional runtime args and constexprs given in signature order."""

    def __init__(self, fn: Any, constexpr_names: tuple[str, ...]) -> None:
        self.fn = fn
        self.constexpr_names = constexpr_names
        names = list(getattr(fn, "arg_names", ()))
        if names and tuple(names[-len(constexpr_names):]) != constexpr_names:
            raise ValueError(f"{fn}: constexprs must be the last parameters, in order")
        self._compiled: dict[tuple, Any] = {}

    def __call__(self, grid: tuple[int, int], args: tuple, constexprs: tuple,
                 num_warps: int) -> None:
        key = (tuple(map(_spec, args)), constexprs, num_warps, args[0].device.index)
        compiled = self._compiled.get(key)
        if compiled is not None and not _hooks_set():
            compiled[grid](*args, *constexprs)
            return
        kernel = self.fn[grid](*args, **dict(zip(self.constexpr_names, constexprs, strict=True)),
                               num_warps=num_warps)
        if args[0].is_cuda and hasattr(kernel, "__getitem__") and hasattr(kernel, "function"):
            self._compiled[key] = kernel


def _hooks_set() -> bool:
    """A profiler (proton, a user hook) wants to see every launch: let Triton do them."""
    rt = _knobs_runtime()
    if rt is None:
        return False
    return rt.launch_enter_hook is not None or rt.launch_exit_hook is not None


_RUNTIME: list[Any] = []


def _knobs_runtime() -> Any:
    if not _RUNTIME:
        try:
            from triton import knobs

            _RUNTIME.append(knobs.runtime)
        except Exception:  # Triton < 3.4 has no knobs; CompiledKernel there reads no hooks
            _RUNTIME.append(None)
    return _RUNTIME[0]
