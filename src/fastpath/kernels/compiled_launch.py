"""Cheap repeat launches of a Triton kernel: the decode step and the causal-conv forward/backward.

Why: the one-token update runs in ~6 us on an H200 (a B=1 L=4096 conv forward in ~0.03 ms),
but `kernel[grid](...)` in Triton 3.6 costs ~24 us of host time per call on that machine's CPU
(binding and specialising every argument, building a cache key, reading knobs), so eager calls
measured the launcher, not the kernel. Measured there
(benchmarks/results/h200-2026-12-02-session2/causal_conv1d_dao.json, host_* rows): Triton's
launch 23.7 us, CompiledKernel[grid](...) 9.1 us, CompiledKernel.run(...) with the stream,
function and metadata fetched once 7.1 us (and it wrote exactly what the ordinary launch wrote).

So the first call of each specialisation (one `CachedLauncher` per kernel) goes through Triton
as usual and keeps the CompiledKernel it returns; later calls with the same key call its C
launcher directly. The key is finer than Triton's specialisation, so a cached binary is only
reused where Triton would have picked the same one: per tensor its dtype and 16-byte alignment,
every other argument as its exact value (ints included), the constexprs, num_warps and the
device.

Limits, on purpose: launch hooks (a profiler such as proton) are honoured when set before the
first call of a specialisation; one set later does not see these launches. Where the installed
Triton's CompiledKernel does not launch the way this module replicates (checked once, from its
source), cached calls use CompiledKernel[grid](...) instead, which works on every Triton 3.x.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

Launch = Callable[[tuple[int, int, int], tuple, tuple], None]
_MAX_KEYS = 1024


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    return value


class CachedLauncher:
    """Launch `fn` (a @triton.jit function whose constexpr parameters all come last) with
    positional runtime args and the constexprs in signature order."""

    def __init__(self, fn: Any, constexpr_names: tuple[str, ...]) -> None:
        self.fn = fn
        self.constexpr_names = constexpr_names
        names = tuple(getattr(fn, "arg_names", ()))
        if names and names[-len(constexpr_names):] != constexpr_names:
            raise ValueError(f"{fn}: constexprs must be the last parameters, in order")
        self._cached: dict[tuple, Launch] = {}

    def __call__(self, grid: tuple[int, int, int], args: tuple, constexprs: tuple,
                 num_warps: int) -> None:
        key = (*map(_spec, args), *constexprs, num_warps, args[0].get_device())
        launch = self._cached.get(key)
        if launch is not None:
            launch(grid, args, constexprs)
            return
        kernel = self.fn[grid](*args, **dict(zip(self.constexpr_names, constexprs, strict=True)),
                               num_warps=num_warps)
        if args[0].is_cuda and hasattr(kernel, "packed_metadata"):
            if len(self._cached) >= _MAX_KEYS:  # exact ints in the key: bound the table
                self._cached.clear()           # (Triton keeps its compiled kernels anyway)
            self._cached[key] = _launcher_for(kernel, args[0].get_device())


def _launcher_for(kernel: Any, device: int) -> Launch:
    """The cheapest launch of `kernel` this Triton allows (see the module docstring)."""
    if _direct_ok() and not _hooks_set():
        run, function, meta = kernel.run, kernel.function, kernel.packed_metadata
        stream = torch._C._cuda_getCurrentRawStream  # what Triton's own launch path asks too

        def direct(grid: tuple[int, int, int], args: tuple, constexprs: tuple) -> None:
            run(grid[0], grid[1], grid[2], stream(device), function, meta, None, None, None,
                *args, *constexprs)

        return direct

    def via_compiled(grid: tuple[int, int, int], args: tuple, constexprs: tuple) -> None:
        kernel[grid](*args, *constexprs)

    return via_compiled


# The call CompiledKernel[grid](...) makes (read in the Triton 3.6 and 3.9 sources); `direct` above
# makes the same one, and only where this text is found in the installed Triton.
_RUNNER_CALL = ("self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, "
                "launch_metadata,")


@cache
def _direct_ok() -> bool:
    try:
        from triton.compiler.compiler import CompiledKernel

        src = " ".join(inspect.getsource(CompiledKernel.__getitem__).split())
    except Exception:
        return False
    return _RUNNER_CALL in src and hasattr(torch._C, "_cuda_getCurrentRawStream")


def _hooks_set() -> bool:
    """A profiler wants to see every launch: leave those to Triton. Triton >= 3.5 keeps the hooks
    as HookChains (empty = nothing to call); older ones as None or a callable."""
    try:
        from triton import knobs
    except ImportError:  # Triton < 3.4 keeps the hooks on CompiledKernel
        from triton.compiler.compiler import CompiledKernel as holder
    else:
        holder = knobs.runtime
    hooks = (getattr(holder, "launch_enter_hook", None), getattr(holder, "launch_exit_hook", None))
    return any(h is not None and (not hasattr(h, "calls") or bool(h.calls)) for h in hooks)
