"""GatedDeltaNet's gated RMSNorm -> FLA's fused Triton op, where it computes the same function.

After the gated delta rule, each GatedDeltaNet layer normalises its output per head and gates it:
``y = x * rsqrt(mean(x^2) + eps) * weight * silu(gate)`` over (B*L*heads, head_v_dim) rows. In
eager torch that is about ten elementwise/reduction kernels forward and more backward, each a full
pass over the activations; FLA's ``fla.modules.fused_norm_gate.rms_norm_gated`` does it in one
Triton kernel each way.

What transformers does by itself:
* <= 5.14 (4.57, 5.12): the layer builds FLA's ``FusedRMSNormGated`` instead of its own class
  whenever FLA was importable on a CUDA machine when the modeling module was imported
  (``FusedRMSNormGated(...) if ... else <Model>RMSNormGated(...)`` in qwen3_next / qwen3_5).
* >= 5.15 (5.17, 5.23, 5.25): always its own eager ``<Model>RMSNormGated``; the class's
  ``@use_kernel_forward_from_hub("RMSNormGated")`` swaps in a Hub copy of FLA's layer only under
  the ``kernels`` package + ``kernelize()``, which enable() keeps off (USE_HUB_KERNELS=0, offline).
So enable() routes the eager class (any version) and leaves FLA's own layer alone.

Same function, checked, not assumed: before routing a class, enable() runs its original forward on
a float32 probe (rows whose mean square spans eps, weights of both signs, a wide gate) against
float64 ``x * rsqrt(mean(x^2) + eps) * w * act(gate)`` with ``act`` = the instance's
``activation`` (silu/sigmoid, the two FLA has; default silu) and eps read from
``variance_epsilon``. A class computing anything else (``1 + weight``, gate before the norm, a
group norm, eps elsewhere) is not routed and explain() says why.

Rounding, the one difference: in bf16/fp16 transformers rounds the normalised x to the input
dtype and multiplies by the weight in the weight's dtype before the float32 gate; FLA stays in
float32 up to its single output rounding (the transformers source notes this difference next to
the class). Both round the same real-number function; FLA's result is the nearer to float64
(tests/routing/test_norm_route.py measures both). In float32 the two agree to float32 rounding.

FASTPATH_FLA_NORM=auto|fla|torch (read by enable()): auto (the default) routes when FLA is
importable, fla makes enable() fail if it is not, torch keeps transformers' eager norm. The route
was opt-in until its GPU tests passed on the H200 (tests/routing/test_norm_route.py -m gpu, the
rounding check and a bf16 `verify` with the route, forward and backward; BENCHMARKS.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing.patch_registry import PatchRegistry
from fastpath.routing.route_modes import RouteStatus, env_mode

ENV_MODE = "FASTPATH_FLA_NORM"
MODES = ("auto", "fla", "torch")
DEFAULT_MODE = "auto"
#: set on a routed class's forward: the activation it was proven for
ROUTE_ATTR = "__fastpath_norm_route__"
#: set on a candidate class enable() did not route: why (one line)
SKIP_ATTR = "__fastpath_norm_skip__"
OP = "gated_rmsnorm"
IMPL = "fla fused_norm_gate"
FLA_MODULE = "fla.modules.fused_norm_gate"
_ACTIVATIONS = ("silu", "swish", "sigmoid")  # what FLA's kernel implements
_DTYPES = ("float16", "bfloat16", "float32")
_CLASS_REF = re.compile(r"\b(\w+RMSNormGated)\(")

#: What enable() decided, for explain(); set through the PatchRegistry so disable() clears it.
ACTIVE: NormStatus | None = None


@dataclass
class NormStatus(RouteStatus):
    """enable()'s decision for the gated RMSNorm of GatedDeltaNet layers."""

    FAST_IMPL: ClassVar[str] = IMPL
    fn: Callable[..., Any] | None = None      # FLA's rms_norm_gated


def route_mode() -> str:
    """FASTPATH_FLA_NORM, validated (a bad value is a usage error, not a silent default)."""
    return env_mode(ENV_MODE, MODES, DEFAULT_MODE)


def detect_norm() -> NormStatus:
    """Whether FLA's fused gated RMSNorm can be routed to, per FASTPATH_FLA_NORM and the install."""
    mode = route_mode()
    if mode == "torch":
        return NormStatus(False, f"{ENV_MODE}=torch")
    if importlib.util.find_spec("fla") is None:
        return NormStatus(False, "fla is not installed: pip install fla-core")
    try:
        fn = importlib.import_module(FLA_MODULE).rms_norm_gated
    except Exception as exc:
        return NormStatus(False, f"{FLA_MODULE} does not import ({type(exc).__name__}: {exc})")
    how = "CUDA tensors" + (", and CPU tensors under TRITON_INTERPRET=1" if triton_interpreter_on() else "")
    return NormStatus(True, f"FLA's fused Triton gated RMSNorm for {how} ({ENV_MODE}=torch turns it off)", fn)


def gdn_norm_classes(module: ModuleType) -> list[type]:
    """The `*RMSNormGated` classes of `module` that its GatedDeltaNet classes build (not FLA's)."""
    g = vars(module)
    found: list[type] = []
    for obj in list(g.values()):
        if not (isinstance(obj, type) and "GatedDeltaNet" in obj.__name__ and obj.__module__ == module.__name__):
            continue
        try:
            src = inspect.getsource(obj)
        except (OSError, TypeError):
            continue
        for name in _CLASS_REF.findall(src):
            cls = g.get(name)
            if isinstance(cls, type) and cls.__module__ == module.__name__ and cls not in found:
                found.append(cls)
    return found


def same_function(cls: type, forward: Callable[..., Any]) -> tuple[str | None, str | None]:
    """(activation, None) when `forward` of a `cls(hidden_size, eps=...)` computes
    x * rsqrt(mean(x^2) + eps) * weight * act(gate) to float32 rounding; (None, why) otherwise."""
    import torch

    d, eps = 24, 1e-3
    try:
        norm = cls(d, eps=eps)
    except Exception as exc:
        return None, f"cannot build {cls.__name__}(hidden_size, eps=...): {type(exc).__name__}"
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.nn.Parameter) or tuple(weight.shape) != (d,):
        return None, f"{cls.__name__} has no `weight` of shape (hidden_size,)"
    if getattr(norm, "variance_epsilon", None) != eps:
        return None, f"{cls.__name__} does not keep eps in `variance_epsilon`"
    act = getattr(norm, "activation", "silu")
    if act not in _ACTIVATIONS:
        return None, f"{cls.__name__} gates with {act!r}; FLA's op has silu/sigmoid"
    gen = torch.Generator().manual_seed(0)
    scale = torch.logspace(-3, 0, 8).unsqueeze(1)  # mean square from 1e-6 (eps dominates) to 1
    x = torch.randn(8, d, generator=gen) * scale
    gate = torch.randn(8, d, generator=gen) * 3
    with torch.no_grad():
        weight.copy_(torch.randn(d, generator=gen))  # both signs, far from 1: `1 + w` would show
        try:
            got = forward(norm, x, gate)
        except Exception as exc:
            return None, f"{cls.__name__}.forward(x, gate) raised {type(exc).__name__}"
    x64, g64, w64 = x.double(), gate.double(), weight.detach().double()
    gated = g64 * torch.sigmoid(g64) if act in ("silu", "swish") else torch.sigmoid(g64)
    want = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w64 * gated
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != x.dtype:
        return None, f"{cls.__name__}.forward returns another shape/dtype than its input"
    err = ((got.double() - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
    if not err <= 1e-5:
        return None, (f"{cls.__name__}.forward is not x*rsqrt(mean(x^2)+eps)*weight*{act}(gate) "
                      f"(rel. error {err:.1e} on a float32 probe)")
    return act, None


def fits(norm: Any, x: Any, gate: Any, activation: str) -> bool:
    """Whether FLA's kernel takes this call as the module would compute it; anything else (other
    dtypes or shapes, a changed activation, torch.compile tracing, CPU without the interpreter)
    keeps transformers' forward."""
    import torch

    if torch.compiler.is_compiling():  # inductor fuses the eager norm itself, without a graph break
        return False
    weight = getattr(norm, "weight", None)
    if not (isinstance(x, torch.Tensor) and isinstance(gate, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if not (x.is_cuda or (x.device.type == "cpu" and triton_interpreter_on())):
        return False
    return (getattr(norm, "activation", activation) == activation
            and x.shape == gate.shape and x.dim() >= 1 and x.numel() > 0
            and weight.dim() == 1 and x.shape[-1] == weight.shape[0]
            and x.dtype == gate.dtype and str(x.dtype).removeprefix("torch.") in _DTYPES
            and str(weight.dtype).removeprefix("torch.") in _DTYPES
            and weight.device == x.device == gate.device
            and x.shape[-1] * x.element_size() <= 65536)  # FLA's limit for one row in one block


def make_forward(original: Callable[..., Any], activation: str, fla_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The routed `forward(hidden_states, gate)`: FLA's op where `fits`, else `original`."""
    from fastpath.kernels.counters import CALLS

    def forward(self: Any, hidden_states: Any, gate: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not fits(self, hidden_states, gate, activation):
            return original(self, hidden_states, gate, *args, **kwargs)
        CALLS[f"{OP}:fla"] += 1
        return fla_fn(hidden_states, gate, self.weight, None, activation=activation,
                      eps=float(self.variance_epsilon))

    setattr(forward, ROUTE_ATTR, activation)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = f"fastpath: FLA's fused gated RMSNorm where it fits, else {original.__qualname__}"
    return forward


def patch_module(module: ModuleType, status: NormStatus, reg: PatchRegistry) -> list[str]:
    """Route the GatedDeltaNet norm classes of one modeling module; notes for the ones left alone."""
    notes = []
    for cls in gdn_norm_classes(module):
        original = cls.__dict__.get("forward")
        if original is None or hasattr(original, ROUTE_ATTR):
            continue
        activation, why = same_function(cls, original)
        if why is not None:
            reg.set_attr(cls, SKIP_ATTR, why)
            notes.append(f"gated RMSNorm {cls.__name__} not routed: {why}")
            continue
        assert activation is not None and status.fn is not None
        reg.set_attr(cls, "forward", make_forward(original, activation, status.fn))
    return notes


def interpreter_single_config(reg: PatchRegistry) -> None:
    """Under TRITON_INTERPRET=1 there is no benchmarker for Triton's autotuner to choose with
    (it raises '0 active drivers'): keep the first config of FLA's norm kernels, undone by disable()."""
    from triton.runtime.autotuner import Autotuner

    module = importlib.import_module(FLA_MODULE)
    for obj in list(vars(module).values()):
        for _ in range(4):  # heuristics -> autotune -> jit
            if isinstance(obj, Autotuner) and len(obj.configs) > 1:
                reg.set_attr(obj, "configs", obj.configs[:1])
            obj = getattr(obj, "fn", None)
            if obj is None:
                break


def gated_norm_child(layer: Any) -> Any:
    """A GatedDeltaNet layer's gated RMSNorm (transformers' class or FLA's FusedRMSNormGated)."""
    if "GatedDeltaNet" not in type(layer).__name__:
        return None
    for child in layer.children():
        if type(child).__name__.endswith("RMSNormGated"):
            return child
    return None


def describe_layer(norm: Any, device: str) -> tuple[str, bool]:
    """explain()'s (impl, fast) for a GatedDeltaNet layer's gated-norm child module."""
    cls = type(norm)
    if cls.__module__.split(".")[0] == "fla":
        return "fla (transformers built FLA's FusedRMSNormGated)", device == "cuda" or triton_interpreter_on()
    if "forward" in vars(norm):
        fn = vars(norm)["forward"]
        return f"instance forward replaced ({getattr(fn, '__module__', None) or 'unknown'})", False
    forward = getattr(cls, "forward", None)
    if hasattr(forward, ROUTE_ATTR):
        if device == "cuda":
            return IMPL, True
        if device == "cpu" and triton_interpreter_on():
            return f"{IMPL} (interpreter)", True
        return f"torch ({device} tensors; FLA routed for CUDA)", False
    why = cls.__dict__.get(SKIP_ATTR)
    if why is None and ACTIVE is not None and not ACTIVE.route:
        why = ACTIVE.reason
    return (f"torch (eager; {why})" if why else "torch (eager)"), False
