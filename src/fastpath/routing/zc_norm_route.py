"""Qwen3.5 / Qwen3-Next zero-centred RMSNorm -> fastpath's fused Triton op, where it computes the same function.

transformers' ``Qwen3_5RMSNorm``, ``Qwen3_5MoeRMSNorm`` and ``Qwen3NextRMSNorm`` (every release
from 4.57 to 5.25) compute ``y = (x * rsqrt(mean(x^2) + eps)) * (1 + weight)`` in float32 and cast
once to x's dtype. In eager torch that is a cast, pow, mean, add, rsqrt, two multiplies and a cast
forward and about twice as many kernels backward, each a full pass over the activations, for every
decoder layer's two norms, the attention's q_norm / k_norm and the final norm.
``fastpath.kernels.zc_rmsnorm`` does it in one kernel each way.

What transformers does by itself: 5.23+ decorates these classes with
``@use_kernel_forward_from_hub("RMSNormZeroCentered")``; with the ``kernels`` package that only
names the class for ``kernelize()``, whose 5.25 mapping has no Hub kernel for that name (it only
silences its log line), so a kernelized model falls back to the class's ``forward``, which is
where enable() routes. Hence the route applies with or without ``kernels`` and in both
FASTPATH_HUB_KERNELS modes.

Candidates: the ``*RMSNorm`` classes (not ``*RMSNormGated``, see norm_route) defined in a modeling
module enable() patches whose forward reads ``1 + self.weight`` or that carry the
``RMSNormZeroCentered`` hub name. Same function, checked, not assumed: before routing a candidate,
enable() runs its original forward on a float32 probe (rows whose mean square spans eps, weights of
both signs) against float64 ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` with eps read from the
instance (``eps`` or ``variance_epsilon``, built with an eps no release uses by default). A
candidate computing anything else (``x * w``, the weight before the norm, a fixed eps) is not
routed; explain() says why.

What keeps transformers' forward, per call: CPU tensors without TRITON_INTERPRET=1 (bit for bit:
the original runs, not a reference copy), other dtypes or shapes, rows wider than the kernel's
limit, extra arguments, torch.compile tracing (inductor fuses the eager norm itself), and any call
after disable() (a stale copy of the routed forward, such as one kernelize bound to an instance,
goes back to the original).

FASTPATH_ZC_NORM=auto|fastpath|torch (read by enable()): auto (the default) routes when the kernel
imports, fastpath makes enable() fail if it does not, torch keeps transformers' eager norm.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from fastpath.routing.patch_registry import PatchRegistry
from fastpath.routing.route_modes import (
    RouteStatus,
    classes_to_route,
    describe_routed_class,
    detect_fused_kernel,
    env_mode,
    kernel_dtypes,
    runs_kernels_here,
)

ENV_MODE = "FASTPATH_ZC_NORM"
MODES = ("auto", "fastpath", "torch")
DEFAULT_MODE = "auto"
OP = "zc_rmsnorm"
IMPL = "fastpath-triton"
HUB_NAME = "RMSNormZeroCentered"  # transformers >= 5.23's kernelize name for these classes
#: set on a routed class's forward: the instance attribute its eps is read from
ROUTE_ATTR = "__fastpath_zc_norm_route__"
#: set on a candidate class enable() did not route: why (one line)
SKIP_ATTR = "__fastpath_zc_norm_skip__"
_EPS_ATTRS = ("eps", "variance_epsilon")
_ONE_PLUS_WEIGHT = re.compile(r"\b1(\.0*)?\s*\+\s*self\.weight\b")
_PROBE_EPS = 1e-3  # no release's default: an eps fixed in the code instead of read shows
_PROBE_TOLERANCE = 1e-5

#: What enable() decided, for explain() and the routed forward; set through the PatchRegistry so
#: disable() clears it and suspended() suspends it.
ACTIVE: ZcNormStatus | None = None


@dataclass
class ZcNormStatus(RouteStatus):
    """enable()'s decision for the zero-centred RMSNorm."""

    FAST_IMPL: ClassVar[str] = IMPL


def route_mode() -> str:
    """FASTPATH_ZC_NORM, validated (a bad value is a usage error, not a silent default)."""
    return env_mode(ENV_MODE, MODES, DEFAULT_MODE)


def detect_zc_norm() -> ZcNormStatus:
    """Whether fastpath's zero-centred RMSNorm can be routed to, per FASTPATH_ZC_NORM and the install."""
    return detect_fused_kernel(ZcNormStatus, ENV_MODE, route_mode(), "zc_rmsnorm", "zero-centred RMSNorm")


def is_candidate(cls: type) -> bool:
    """Whether `cls` says it is a zero-centred RMSNorm (the probe then decides whether it is one)."""
    name = cls.__name__
    if not name.endswith("RMSNorm") or "forward" not in cls.__dict__:
        return False
    if getattr(cls, "kernel_layer_name", None) == HUB_NAME:
        return True
    forward = cls.__dict__["forward"]
    forward = getattr(forward, "__wrapped__", forward) if hasattr(forward, ROUTE_ATTR) else forward
    try:
        src = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return bool(_ONE_PLUS_WEIGHT.search(src))


def candidates(module: ModuleType) -> list[type]:
    """The zero-centred RMSNorm candidates defined in `module` (another library's class put in
    its place, such as Liger's, is not one)."""
    import torch

    return [obj for obj in list(vars(module).values())
            if isinstance(obj, type) and obj.__module__ == module.__name__
            and issubclass(obj, torch.nn.Module) and is_candidate(obj)]


def same_function(cls: type, forward: Callable[..., Any]) -> tuple[str | None, str | None]:
    """(eps attribute, None) when `forward` of a `cls(hidden_size, eps=...)` computes
    x * rsqrt(mean(x^2) + eps) * (1 + weight) to float32 rounding, with eps read from that
    attribute of the instance; (None, why) otherwise."""
    import torch

    d = 24
    try:
        norm = cls(d, eps=_PROBE_EPS)
    except Exception as exc:
        return None, f"cannot build {cls.__name__}(hidden_size, eps=...): {type(exc).__name__}"
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.nn.Parameter) or tuple(weight.shape) != (d,):
        return None, f"{cls.__name__} has no `weight` of shape (hidden_size,)"
    eps_attr = next((a for a in _EPS_ATTRS if getattr(norm, a, None) == _PROBE_EPS), None)
    if eps_attr is None:
        return None, f"{cls.__name__} keeps eps in none of {', '.join(_EPS_ATTRS)}"
    gen = torch.Generator().manual_seed(0)
    scale = torch.logspace(-3, 0, 8).unsqueeze(1)  # mean square from 1e-6 (eps dominates) to 1
    x = torch.randn(8, d, generator=gen) * scale
    with torch.no_grad():
        weight.copy_(torch.randn(d, generator=gen))  # both signs, far from 0: `x * w` would show
        try:
            got = forward(norm, x)
        except Exception as exc:
            return None, f"{cls.__name__}.forward(x) raised {type(exc).__name__}"
    x64, w64 = x.double(), weight.detach().double()
    want = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + _PROBE_EPS) * (1.0 + w64)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != x.dtype:
        return None, f"{cls.__name__}.forward returns another shape/dtype than its input"
    err = ((got.double() - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
    if not err <= _PROBE_TOLERANCE:
        return None, (f"{cls.__name__}.forward is not x*rsqrt(mean(x^2)+eps)*(1+weight) with the instance's eps "
                      f"(rel. error {err:.1e} on a float32 probe)")
    return eps_attr, None


def fits(norm: Any, x: Any) -> bool:
    """Whether fastpath's kernel takes this call as the module would compute it; anything else
    keeps transformers' forward (see the module docstring)."""
    import torch

    from fastpath.kernels.zc_rmsnorm.interface import MAX_WIDTH

    weight = getattr(norm, "weight", None)
    if not runs_kernels_here(x) or not isinstance(weight, torch.Tensor):
        return False
    return (x.dim() >= 1 and x.numel() > 0 and weight.dim() == 1 and x.shape[-1] == weight.shape[0]
            and x.shape[-1] <= MAX_WIDTH and weight.device == x.device
            and kernel_dtypes(x, weight))


def make_forward(original: Callable[..., Any], eps_attr: str) -> Callable[..., Any]:
    """The routed `forward(hidden_states)`: fastpath's op where `fits` while enabled, else `original`."""
    from fastpath.kernels.zc_rmsnorm.interface import zc_rmsnorm

    def forward(self: Any, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        active = ACTIVE
        if args or kwargs or active is None or not active.route or not fits(self, hidden_states):
            return original(self, hidden_states, *args, **kwargs)
        return zc_rmsnorm(hidden_states, self.weight, float(getattr(self, eps_attr)))

    setattr(forward, ROUTE_ATTR, eps_attr)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = f"fastpath: fused zero-centred RMSNorm where it fits, else {original.__qualname__}"
    return forward


def patch_module(module: ModuleType, status: ZcNormStatus, reg: PatchRegistry) -> list[str]:
    """Route the zero-centred RMSNorm classes of one modeling module; notes for the candidates
    left alone (a route turned off marks every candidate with its reason, for explain())."""
    notes = []
    for cls, original in classes_to_route(candidates(module), status, reg, ROUTE_ATTR, SKIP_ATTR):
        eps_attr, why = same_function(cls, original)
        if why is not None:
            reg.set_attr(cls, SKIP_ATTR, why)
            notes.append(f"zero-centred RMSNorm {cls.__name__} not routed: {why}")
            continue
        assert eps_attr is not None
        reg.set_attr(cls, "forward", make_forward(original, eps_attr))
    return notes


def describe_layer(layer: Any, device: str) -> tuple[str, bool] | None:
    """explain()'s (impl, fast) for a zero-centred RMSNorm module while enable() is active, else
    None (also for an instance whose forward Liger replaced: Liger's own row names it)."""
    if ACTIVE is None:
        return None
    return describe_routed_class(layer, device, IMPL, ROUTE_ATTR, SKIP_ATTR)
