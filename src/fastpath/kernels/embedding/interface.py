"""The token embedding as torch custom ops: torch's gather forward, fastpath's one-pass backward.

    out = embedding(ids, weight, padding_idx=None, scale_grad_by_freq=False)

ids: int32/int64 of any shape, every id in [0, vocab); weight: (vocab, H) float32/float16/
bfloat16, any strides; out = weight[ids] (torch.nn.functional.embedding itself: the forward is
a gather torch already does at memory speed). The weight gradient is the op's own: a contiguous
(vocab, H) tensor in weight's dtype, each row written once (bwd.py), equal to torch's within one
rounding of the float32 sum. padding_idx (negative counts from the end, as torch's) gets a zero
row; scale_grad_by_freq divides each row by its id's count. ids get no gradient.
Ops (namespace "fastpath"): embedding_fwd(ids, weight, padding_idx, scale_grad_by_freq) -> out and
embedding_bwd(ids, dout, num_rows, padding_idx, scale_grad_by_freq) -> dweight, with fake
implementations and registered autograd (no graph break under torch.compile); eager callers skip
the dispatcher, as in causal_conv1d/interface.py. Where the Triton kernel cannot run (CPU without
TRITON_INTERPRET=1, float64) the float32 reference in naive.py runs, with a one-time warning when
a kernel could otherwise have run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.embedding import naive

FAMILY = "embedding"


def _padding(padding_idx: int | None, num_rows: int) -> int | None:
    if padding_idx is None:
        return None
    if not -num_rows <= padding_idx < num_rows:
        raise ValueError(f"embedding: padding_idx {padding_idx} is outside a table of {num_rows} rows")
    return padding_idx + num_rows if padding_idx < 0 else padding_idx


def _check(ids: Tensor, weight: Tensor) -> None:
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"embedding: ids must be int32 or int64, got {ids.dtype}")
    if weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError(f"embedding: weight must be a floating (vocab, H) table, got {tuple(weight.shape)} {weight.dtype}")


def fwd_impl(ids: Tensor, weight: Tensor, padding_idx: int | None, scale_grad_by_freq: bool) -> Tensor:
    _check(ids, weight)
    CALLS["embedding_fwd:torch"] += 1
    return F.embedding(ids, weight, _padding(padding_idx, weight.shape[0]))


def bwd_impl(ids: Tensor, dout: Tensor, num_rows: int, padding_idx: int | None,
             scale_grad_by_freq: bool) -> Tensor:
    if dout.shape[:-1] != ids.shape:
        raise ValueError(f"embedding: dout {tuple(dout.shape)} must be ids' shape {tuple(ids.shape)} + (H,)")
    pad = _padding(padding_idx, num_rows)
    if dout.numel() and use_triton(dout) and dtypes_fit("bwd", FAMILY, dout):
        from fastpath.kernels.embedding.bwd import weight_grad

        CALLS["embedding_bwd:triton"] += 1
        return weight_grad(ids, dout.contiguous(), num_rows, pad, scale_grad_by_freq, dout.dtype)
    CALLS["embedding_bwd:reference"] += 1
    dw = naive.embedding_bwd_ref(ids, dout, num_rows, pad, scale_grad_by_freq, compute=torch.float32)
    return dw.to(dout.dtype)


def _setup_context(ctx, inputs, output) -> None:
    ids, weight, padding_idx, scale_grad_by_freq = inputs
    ctx.save_for_backward(ids)
    ctx.num_rows, ctx.padding_idx, ctx.scale = weight.shape[0], padding_idx, scale_grad_by_freq


def _grads(ctx, dout, bwd):
    """(None, dweight, None, None) from `bwd`: bwd_impl eagerly, the custom op under compile."""
    (ids,) = ctx.saved_tensors
    return None, bwd(ids, dout, ctx.num_rows, ctx.padding_idx, ctx.scale), None, None


class _EmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, padding_idx, scale_grad_by_freq):  # type: ignore[override]
        _setup_context(ctx, (ids, weight, padding_idx, scale_grad_by_freq), None)
        return fwd_impl(ids, weight, padding_idx, scale_grad_by_freq)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        return _grads(ctx, dout, bwd_impl)


def embedding(ids: Tensor, weight: Tensor, padding_idx: int | None = None,
              scale_grad_by_freq: bool = False) -> Tensor:
    """weight[ids] with fastpath's weight gradient: the custom op while torch.compile traces,
    otherwise the implementation directly, under autograd only when weight wants a gradient."""
    if torch.compiler.is_compiling():
        return embedding_fwd(ids, weight, padding_idx, scale_grad_by_freq)
    if torch.is_grad_enabled() and weight.requires_grad:
        return _EmbeddingFunction.apply(ids, weight, padding_idx, scale_grad_by_freq)
    return fwd_impl(ids, weight, padding_idx, scale_grad_by_freq)


embedding_fwd = torch.library.custom_op("fastpath::embedding_fwd", fwd_impl, mutates_args=())


@embedding_fwd.register_fake
def _fwd_fake(ids, weight, padding_idx, scale_grad_by_freq):
    return weight.new_empty((*ids.shape, weight.shape[1]))


embedding_fwd.register_autograd(lambda ctx, dout: _grads(ctx, dout, embedding_bwd),
                                setup_context=_setup_context)

embedding_bwd = torch.library.custom_op("fastpath::embedding_bwd", bwd_impl, mutates_args=())


@embedding_bwd.register_fake
def _bwd_fake(ids, dout, num_rows, padding_idx, scale_grad_by_freq):
    return dout.new_empty((num_rows, dout.shape[-1]))
