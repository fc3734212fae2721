"""The token embedding's weight gradient -> fastpath's one-pass Triton kernel (kernels/embedding).

Every transformers model looks its tokens up through ``torch.nn.Embedding`` (subclasses such as a
scaled word embedding call its forward through ``super()``). Its backward on CUDA zero-fills the
whole (vocab, hidden) gradient, then scatters the tokens' rows into it: for Qwen3.5-27B's
248,320 x 5,120 bf16 table a 2.5 GB fill (0.80 ms) plus 0.46 ms of sorting and scattering per
training step on an H100 (benchmarks/model_profile.py, BENCHMARKS.md). The kernel writes each row
once instead.

How: while enable() is active, ``torch.nn.Embedding.forward`` (the class attribute, recorded in the
PatchRegistry, so disable() puts torch's own function back) calls ``kernels.embedding.embedding``
where that changes something: the table wants a gradient under autograd, it is float32/float16/
bfloat16 on CUDA (CPU under TRITON_INTERPRET=1), the ids are int32/int64, and the module has no
``max_norm`` (which renormalises the table in place during the lookup) and is not ``sparse``.
Every other call, and every call after disable(), runs torch's forward. The forward value is
torch's own gather either way; the gradient equals torch's within one rounding of the float32 sum.

FASTPATH_EMBEDDING=auto|fastpath|torch (read by enable()). The default is torch until the kernel
has run its GPU tests and a training step measured faster with it (BENCHMARKS.md); auto routes
where the kernel imports, fastpath makes enable() fail if it does not. explain() lists
`embedding_bwd` for each embedding module while the route is on; with it off torch's own backward
is no slow fallback, so there is no row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing import route_modes
from fastpath.routing.patch_registry import PatchRegistry

ENV_MODE = "FASTPATH_EMBEDDING"
MODES = ("auto", "fastpath", "torch")
DEFAULT_MODE = "torch"  # not yet run on a GPU (module docstring)
OP = "embedding_bwd"
IMPL = "fastpath-triton"
#: set on the routed forward
ROUTE_ATTR = "__fastpath_embedding_route__"
_ID_DTYPES = ("torch.int32", "torch.int64")

#: What enable() decided, for explain() and the routed forward; set through the PatchRegistry so
#: disable() clears it and suspended() suspends it.
ACTIVE: EmbeddingStatus | None = None


@dataclass
class EmbeddingStatus(route_modes.RouteStatus):
    """enable()'s decision for the embedding's weight gradient."""

    FAST_IMPL: ClassVar[str] = IMPL


def route_mode() -> str:
    """FASTPATH_EMBEDDING, validated (a bad value is a usage error, not a silent default)."""
    return route_modes.env_mode(ENV_MODE, MODES, DEFAULT_MODE)


def detect_embedding() -> EmbeddingStatus:
    """Whether fastpath's embedding backward can be routed to, per FASTPATH_EMBEDDING and the install."""
    return route_modes.detect_fused_kernel(EmbeddingStatus, ENV_MODE, route_mode(), "embedding",
                                           "one-pass embedding weight gradient")


def takes(layer: Any) -> str | None:
    """Why `layer`'s calls keep torch's forward whatever the tensors (None: they may take the kernel)."""
    if layer.max_norm is not None:
        return "max_norm renormalises the table during the lookup"
    if layer.sparse:
        return "sparse gradient"
    return None


def make_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The routed `forward(input)`: fastpath's embedding where it changes the gradient (module
    docstring), else `original`."""
    import torch

    from fastpath.kernels.embedding.interface import embedding

    def forward(self: Any, input: Any) -> Any:
        active = ACTIVE
        weight = self.weight
        if (active is None or not active.route or not torch.is_grad_enabled() or not weight.requires_grad
                or takes(self) is not None or not isinstance(input, torch.Tensor)
                or str(input.dtype) not in _ID_DTYPES or not route_modes.runs_kernels_here(weight)
                or not route_modes.kernel_dtypes(weight)):
            return original(self, input)
        return embedding(input, weight, self.padding_idx, self.scale_grad_by_freq)

    setattr(forward, ROUTE_ATTR, True)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = f"fastpath: one-pass weight gradient where it applies, else {original.__qualname__}"
    return forward


def install(status: EmbeddingStatus, reg: PatchRegistry) -> None:
    """Route torch.nn.Embedding's forward (once per enable(); the registry restores it)."""
    import torch

    if not status.route:
        return
    original = torch.nn.Embedding.__dict__["forward"]
    if not hasattr(original, ROUTE_ATTR):
        reg.set_attr(torch.nn.Embedding, "forward", make_forward(original))


def describe_layer(layer: Any, device: str) -> tuple[str, bool]:
    """(impl, fast) of one embedding module while the route is on: torch's own backward where the
    route leaves the module to it is no slow path."""
    import torch

    if not hasattr(torch.nn.Embedding.__dict__["forward"], ROUTE_ATTR):
        return "torch (torch.nn.Embedding.forward was replaced after enable())", False
    own = vars(layer).get("forward")
    if own is not None:
        return f"instance forward replaced ({getattr(own, '__module__', None) or 'unknown'})", False
    why = takes(layer)
    if why is not None:
        return f"torch ({why}: torch's own backward)", True
    if not layer.weight.requires_grad:
        return "torch (frozen table: no weight gradient)", True
    if device == "cuda":
        return IMPL, True
    if device == "cpu" and triton_interpreter_on():
        return f"{IMPL} (interpreter)", True
    return f"torch ({device} tensors; fastpath routed for CUDA)", False


def explain_rows(model: Any) -> list[dict[str, Any]]:
    """explain()'s row for each embedding module of `model` while the route is on (none while it
    is off: torch's own backward is then no slow fallback)."""
    import torch

    if ACTIVE is None or not ACTIVE.route:
        return []
    rows = []
    for name, layer in model.named_modules():
        if isinstance(layer, torch.nn.Embedding):
            impl, fast = describe_layer(layer, layer.weight.device.type)
            rows.append({"layer": name or "<root>", "layer_type": type(layer).__name__, "op": OP,
                         "impl": impl, "fast": fast})
    return rows
