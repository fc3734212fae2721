"""Several Linear layers of one input, the input's gradient accumulated inside the GEMMs.

transformers' Qwen3.5 GatedDeltaNet feeds one hidden state to four projections (in_proj_qkv, _z,
_b, _a), its gated attention to three (q, k, v) and every gated MLP to two (gate, up). Called one
by one, each Linear's backward hands autograd its own gradient of that input, and autograd's input
buffer adds them: one elementwise kernel per extra projection, reading two (tokens, hidden)
gradients and writing one (30 adds, 1.2 ms of an 8-layer Qwen3.5-27B training step on an H100:
BENCHMARKS.md, the model profile's `ViewBackward0` row). Here the backward runs the first
projection's input-gradient GEMM and accumulates the others into its output with ``addmm_``
(cuBLAS reads the running sum in its epilogue, beta = 1), so no add kernel runs and the sum is
rounded once per GEMM in float32 rather than once more per add.

The forward is the modules' own ``F.linear`` calls; weight and bias gradients are the GEMMs and
row sums Linear's backward computes. What keeps the modules' own calls, per call: no gradient
wanted, torch.compile tracing (inductor plans the graph itself), autocast, fewer than two modules,
any module that is not exactly ``torch.nn.Linear`` (LoRA, quantised and offloaded layers are
subclasses or wrappers) or that has a hook (an offload, a user's feature hook, a profiler scope:
all expect the module to be called), a global module hook, a weight of another dtype or device
than the input, and tensor subclasses (DTensor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS

COUNTER = "linear_group:shared"


def _unhooked(module: torch.nn.Module) -> bool:
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _global_hooks() -> bool:
    m = torch.nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
                or m._global_backward_pre_hooks)


def groupable(x: Any, linears: Sequence[Any]) -> bool:
    """True where linears_of_one_input takes the shared-gradient path for x (see the docstring)."""
    if (len(linears) < 2 or not torch.is_grad_enabled() or torch.compiler.is_compiling()
            or type(x) is not torch.Tensor or x.dim() < 1 or _global_hooks()):
        return False
    if torch.is_autocast_enabled(x.device.type):
        return False
    wants_grad = x.requires_grad
    for m in linears:
        if type(m) is not torch.nn.Linear or not _unhooked(m):
            return False
        for p in (m.weight, m.bias):
            if p is None:
                continue
            if type(p) is not torch.nn.Parameter or p.dtype != x.dtype or p.device != x.device:
                return False
            wants_grad = wants_grad or p.requires_grad
    return wants_grad


class _LinearGroup(torch.autograd.Function):
    """forward(x, w0, b0, w1, b1, ...) -> (x @ w0^T + b0, x @ w1^T + b1, ...); b_i may be None."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, *params: Tensor | None) -> tuple[Tensor, ...]:
        weights, biases = params[0::2], params[1::2]
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros GEMM
        ctx.save_for_backward(x, *weights)
        return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases, strict=True))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        x, *weights = ctx.saved_tensors
        need = ctx.needs_input_grad
        rows = x.reshape(-1, x.shape[-1])
        dx: Tensor | None = None
        param_grads: list[Tensor | None] = []
        for i, (w, g) in enumerate(zip(weights, grads, strict=True)):
            dw = db = None
            if g is not None:
                g2 = g.reshape(-1, g.shape[-1])
                if need[0]:
                    dx = torch.mm(g2, w) if dx is None else dx.addmm_(g2, w)
                if need[1 + 2 * i]:
                    dw = g2.t().mm(rows)
                if need[2 + 2 * i]:
                    db = g2.sum(0)
            param_grads += [dw, db]
        return (None if dx is None else dx.view(x.shape), *param_grads)


def linears_of_one_input(x: Tensor, linears: Sequence[torch.nn.Module]) -> tuple[Tensor, ...]:
    """(m(x) for m in linears): through one shared input gradient where groupable(x, linears),
    else each module called as usual (hooks, subclasses and all)."""
    if not groupable(x, linears):
        return tuple(m(x) for m in linears)
    CALLS[COUNTER] += 1
    params: list[Tensor | None] = []
    for m in linears:
        params += [m.weight, m.bias]
    return _LinearGroup.apply(x, *params)
