"""What the routes share: a mode read from an environment variable (a bad value is a usage error,
never a silent default), the route / reason decision explain() and EnableReport print, the
detection of a route to one of fastpath's own fused kernels, the walk over the classes a route
replaces the forward of, the dtypes fastpath's kernels take, and explain()'s row for such a class."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from fastpath.kernels.dispatch import TRITON_DTYPES, triton_interpreter_on
from fastpath.routing.patch_registry import PatchRegistry

#: set on a routed gated-delta-rule function that takes q and k with fewer heads than v (grouped
#: value heads, each key head serving HV // H value heads): a layer forward that would repeat q
#: and k to one head per value head (transformers <= 5.22) may hand them over grouped instead
GROUPED_HEADS_ATTR = "__fastpath_grouped_heads__"


def env_mode(env: str, modes: tuple[str, ...], default: str = "auto") -> str:
    """The value of `env`, lower-cased, `default` when unset or empty; UsageError when not in `modes`."""
    mode = os.environ.get(env, default).strip().lower() or default
    if mode not in modes:
        from fastpath.shared.errors import UsageError

        raise UsageError(f"{env}={mode!r}: expected one of {', '.join(modes)}")
    return mode


@dataclass
class RouteStatus:
    """enable()'s decision for one route: whether it routes, and why (one line, with the fix when
    it does not). Subclasses name their fast implementation in FAST_IMPL."""

    route: bool
    reason: str

    FAST_IMPL: ClassVar[str] = "fastpath"

    @property
    def impl(self) -> str:
        return self.FAST_IMPL if self.route else "torch"


def classes_to_route(classes: Iterable[type], status: RouteStatus, reg: PatchRegistry, route_attr: str,
                     skip_attr: str) -> list[tuple[type, Any]]:
    """(class, its own forward) for each candidate class whose forward is not routed yet. With the
    route off, none: each candidate is marked with the reason instead (explain() reads it)."""
    found = []
    for cls in classes:
        original = cls.__dict__["forward"]
        if hasattr(original, route_attr):
            continue
        if not status.route:
            reg.set_attr(cls, skip_attr, status.reason)
            continue
        found.append((cls, original))
    return found


StatusT = TypeVar("StatusT", bound=RouteStatus)


def detect_fused_kernel(status_cls: type[StatusT], env: str, mode: str, kernel: str, what: str) -> StatusT:
    """The decision of a route to fastpath's own kernel `kernel` (kernels/<kernel>/interface.py)
    in `mode` (auto | fastpath | torch, read from `env`): torch turns it off; a kernel that does
    not import turns it off, or is an error in mode fastpath."""
    if mode == "torch":
        return status_cls(False, f"{env}=torch")
    try:
        import triton  # noqa: F401

        importlib.import_module(f"fastpath.kernels.{kernel}.interface")
    except Exception as exc:
        status = status_cls(False, f"fastpath's {kernel} kernel does not import ({type(exc).__name__}: {exc})")
        if mode == "fastpath":
            from fastpath.shared.errors import FastpathError

            raise FastpathError(f"{env}=fastpath but {status.reason}") from None
        return status
    how = "CUDA tensors" + (", and CPU tensors under TRITON_INTERPRET=1" if triton_interpreter_on() else "")
    return status_cls(True, f"fastpath's fused Triton {what} for {how} ({env}=torch turns it off)")


def describe_routed_class(layer: Any, device: str, impl: str, route_attr: str, skip_attr: str
                          ) -> tuple[str, bool] | None:
    """explain()'s (impl, fast) for a module whose class forward a route replaces (marked with
    `route_attr`) or left alone (`skip_attr` says why); None for other modules and for an
    instance whose forward Liger replaced (Liger's own row names it)."""
    cls = type(layer)
    forward = getattr(cls, "forward", None)
    routed = hasattr(forward, route_attr)
    why = None if routed else cls.__dict__.get(skip_attr)
    if not routed and why is None:
        return None
    own = vars(layer).get("forward")
    if own is not None:
        fn = getattr(own, "__func__", own)
        module = str(getattr(fn, "__module__", None) or "unknown")
        if module.startswith("liger_kernel"):
            return None
        if not hasattr(fn, route_attr):
            return f"instance forward replaced ({module})", False
    if not routed:
        return f"torch (eager; {why})", False
    if device == "cuda":
        return impl, True
    if device == "cpu" and triton_interpreter_on():
        return f"{impl} (interpreter)", True
    return f"torch ({device} tensors; fastpath routed for CUDA)", False


def kernel_dtypes(*tensors: Any) -> bool:
    """Whether every tensor is in a dtype fastpath's Triton kernels take (kernels.dispatch)."""
    return all(t.dtype in TRITON_DTYPES for t in tensors)


def runs_kernels_here(x: Any) -> bool:
    """Whether fastpath's Triton kernels take tensor `x` where it lives (CUDA; CPU under
    TRITON_INTERPRET=1), outside torch.compile tracing (inductor fuses the eager ops itself)."""
    import torch

    if torch.compiler.is_compiling() or not isinstance(x, torch.Tensor):
        return False
    return x.is_cuda or (x.device.type == "cpu" and triton_interpreter_on())
