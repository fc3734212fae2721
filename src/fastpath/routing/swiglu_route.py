"""The gated MLP's silu(gate_proj(x)) * up_proj(x) -> fastpath's fused Triton op, where a class
computes exactly that.

transformers' ``Qwen3_5MLP``, ``Qwen3_5MoeMLP``, ``Qwen3NextMLP`` (also the MoE's shared expert),
``KimiLinearMLP``, ``OlmoHybridMLP``, ``BambaMLP``, ``JambaMLP`` and ``ZambaMLP`` (5.17) compute
``down_proj(act_fn(gate_proj(x)) * up_proj(x))``. With ``hidden_act="silu"`` eager torch runs silu and
a multiply forward (keeping silu's output for backward) and a multiply-backward plus a silu-backward:
five passes over (tokens, intermediate) activations per layer, ~4.4 ms of an 8-layer Qwen3.5-27B
training step on an H100 (benchmarks/model_profile.py). ``fastpath.kernels.swiglu`` does one
pass each way, keeps only the two projections for backward and rounds once from float32. The two
projections of x go through ``fastpath.kernels.linear_group`` (x's gradient summed inside the
GEMMs, not by an add kernel; plain un-hooked ``nn.Linear`` only, else each is called as usual).

Candidates: the ``*MLP`` classes defined in a modeling module enable() patches whose forward body
is that one expression (read from its source: ``return`` of it, or one assignment then its
``return``), one input besides ``self``. Other forms (Falcon-H1's multipliers, Zamba2's fused
gate_up, LFM2's w1/w3, Nemotron-H's relu2) are not candidates. What keeps the class's forward,
per call: an ``act_fn`` that is not SiLU (``transformers.activations.SiLUActivation`` or
``torch.nn.SiLU``; a Hub-kernel SiLU computes the same function; explain() shows no row for
such a module: Zamba's GELU MLP has no SwiGLU product), tensors the kernels do not take
here (CPU without TRITON_INTERPRET=1: bit for bit, the original runs), dtypes other than
fp32/fp16/bf16, torch.compile tracing (inductor fuses the pair itself), and any call after
disable() (a stale bound copy goes back to the original).

FASTPATH_SWIGLU=auto|fastpath|torch (read by enable()): auto (the default) routes when the kernel
imports, fastpath makes enable() fail if it does not, torch keeps transformers' eager MLP.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from fastpath.routing import route_modes
from fastpath.routing.patch_registry import PatchRegistry

ENV_MODE = "FASTPATH_SWIGLU"
MODES = ("auto", "fastpath", "torch")
DEFAULT_MODE = "auto"
OP = "silu_mul"  # explain()'s op name (Liger's row for its own MLP is "swiglu")
IMPL = "fastpath-triton"
#: set on a routed class's forward
ROUTE_ATTR = "__fastpath_swiglu_route__"
#: set on a candidate class enable() did not route: why (one line)
SKIP_ATTR = "__fastpath_swiglu_skip__"
# the one body a candidate's forward may have, `x` standing for its input's name
_EXPRESSION = "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"

#: What enable() decided, for explain() and the routed forward; set through the PatchRegistry so
#: disable() clears it and suspended() suspends it.
ACTIVE: SwigluStatus | None = None


@dataclass
class SwigluStatus(route_modes.RouteStatus):
    """enable()'s decision for the gated MLP's product."""

    FAST_IMPL: ClassVar[str] = IMPL


def route_mode() -> str:
    """FASTPATH_SWIGLU, validated (a bad value is a usage error, not a silent default)."""
    return route_modes.env_mode(ENV_MODE, MODES, DEFAULT_MODE)


def detect_swiglu() -> SwigluStatus:
    """Whether fastpath's SwiGLU product can be routed to, per FASTPATH_SWIGLU and the install."""
    return route_modes.detect_fused_kernel(SwigluStatus, ENV_MODE, route_mode(), "swiglu", "SwiGLU product")


def computes_swiglu(forward: Callable[..., Any]) -> bool:
    """Whether `forward(self, x)`'s body is exactly `return <_EXPRESSION>` or `y = <_EXPRESSION>;
    return y` (a docstring aside), read from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return False
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return False
    args = fn.args
    if (len(args.args) != 2 or args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs
            or args.args[0].arg != "self"):
        return False
    want = _EXPRESSION.replace("(x)", f"({args.args[1].arg})")
    body = fn.body[1:] if (fn.body and isinstance(fn.body[0], ast.Expr)
                           and isinstance(fn.body[0].value, ast.Constant)) else fn.body
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return ast.unparse(body[0].value) == want
    if (len(body) == 2 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
            and isinstance(body[0].targets[0], ast.Name) and isinstance(body[1], ast.Return)
            and isinstance(body[1].value, ast.Name) and body[1].value.id == body[0].targets[0].id):
        return ast.unparse(body[0].value) == want
    return False


def candidates(module: ModuleType) -> list[type]:
    """The gated-MLP classes defined in `module` (another library's class put in its place, such
    as Liger's, is not one)."""
    import torch

    found = []
    for obj in list(vars(module).values()):
        if not (isinstance(obj, type) and obj.__module__ == module.__name__ and obj.__name__.endswith("MLP")
                and issubclass(obj, torch.nn.Module) and "forward" in obj.__dict__):
            continue
        forward = obj.__dict__["forward"]
        if computes_swiglu(getattr(forward, "__wrapped__", forward) if hasattr(forward, ROUTE_ATTR) else forward):
            found.append(obj)
    return found


def is_silu(act: Any) -> bool:
    """torch's nn.SiLU or transformers' SiLUActivation (Hub-kernel forwards of it compute the same
    function); a look-alike class elsewhere is not taken on its name."""
    import torch

    cls = type(act)
    return isinstance(act, torch.nn.SiLU) or (cls.__name__ == "SiLUActivation"
                                              and cls.__module__.startswith("transformers."))


def _takes(gate: Any, up: Any) -> bool:
    return gate.shape == up.shape and gate.device == up.device and route_modes.kernel_dtypes(gate, up)


def make_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The routed `forward(x)`: down_proj(silu_mul(gate_proj(x), up_proj(x))) while enabled, where
    act_fn is SiLU and the kernels take the tensors; else `original`."""
    from fastpath.kernels.linear_group.interface import linears_of_one_input
    from fastpath.kernels.swiglu.interface import silu_mul

    def forward(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        active = ACTIVE
        if (args or kwargs or active is None or not active.route or not route_modes.runs_kernels_here(x)
                or not is_silu(getattr(self, "act_fn", None))):
            return original(self, x, *args, **kwargs)
        gate, up = linears_of_one_input(x, (self.gate_proj, self.up_proj))
        product = silu_mul(gate, up) if _takes(gate, up) else self.act_fn(gate) * up
        return self.down_proj(product)

    setattr(forward, ROUTE_ATTR, True)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = f"fastpath: fused silu(gate) * up where it fits, else {original.__qualname__}"
    return forward


def patch_module(module: ModuleType, status: SwigluStatus, reg: PatchRegistry) -> list[str]:
    """Route the gated-MLP classes of one modeling module (a route turned off marks every
    candidate with its reason, for explain())."""
    for cls, original in route_modes.classes_to_route(candidates(module), status, reg, ROUTE_ATTR, SKIP_ATTR):
        reg.set_attr(cls, "forward", make_forward(original))
    return []


def describe_layer(layer: Any, device: str) -> tuple[str, bool] | None:
    """explain()'s (impl, fast) for a gated-MLP module while enable() is active, else None; also
    None where act_fn is not SiLU (Zamba's GELU MLP has no SwiGLU product to route)."""
    if ACTIVE is None or not is_silu(getattr(layer, "act_fn", None)):
        return None
    return route_modes.describe_routed_class(layer, device, IMPL, ROUTE_ATTR, SKIP_ATTR)
