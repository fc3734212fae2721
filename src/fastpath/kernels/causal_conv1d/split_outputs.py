"""The conv of a fused projection, written straight into the pieces its caller splits it into.

    outs = conv_split(x (B, D, L), weight (D, W), bias (D,) | None, sizes (n_0, n_1, ...), silu)
    outs[i]: (B, L, n_i) contiguous == act(conv(x))[:, offset_i:offset_i + n_i].transpose(1, 2)

Why: a GatedDeltaNet layer (transformers' Qwen3.5 / Qwen3-Next) convolves its fused q/k/v
projection, transposes it to (B, L, D) and splits it into q, k and v; each piece is then a strided
view that the gated delta rule copies to a contiguous tensor (FLA's kernels index rows of H*K),
and in the backward autograd concatenates dq, dk and dv back into one (B, L, D) gradient
(SplitWithSizesBackward). On an 8-layer Qwen3.5-27B training step that is ~1 ms of copies
(BENCHMARKS.md). The conv is depthwise, so each piece is the conv of its own channels: here each
piece is its own launch of the conv kernel with its own output, contiguous as the rule wants it,
and the backward runs the conv backward per piece on that piece's gradient, writing its channels
of one dx (and of dW / dB). The same kernels per channel as `causal_conv1d_fwd` / `_bwd`: the
pieces are bit for bit the unfused conv's followed by the split; the gradients too in float32,
and in 16-bit dtypes within one rounding (the GPU backward's plan depends on D).

Op (namespace "fastpath"): causal_conv1d_split_fwd(x, weight, bias, sizes, silu) -> Tensor[],
with a fake and registered autograd (backward: causal_conv1d_split_bwd); eager callers reach the
implementation through `conv_split` without the dispatcher, as interface.py does for the conv.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise

import torch
from torch import Tensor

from fastpath.kernels.causal_conv1d.interface import bwd_impl, fwd_into
from fastpath.kernels.counters import CALLS


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, sizes: Sequence[int]) -> None:
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"conv_split: x {tuple(x.shape)} must be (B, D, L) and weight "
                         f"{tuple(weight.shape)} (D, W)")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"conv_split: bias {tuple(bias.shape)} must be ({weight.shape[0]},)")
    if not sizes or any(n <= 0 for n in sizes) or sum(sizes) != x.shape[1]:
        raise ValueError(f"conv_split: sizes {list(sizes)} must be positive and sum to D = {x.shape[1]}")


def _pieces(sizes: Sequence[int]) -> list[slice]:
    return [slice(a, b) for a, b in pairwise(accumulate(sizes, initial=0))]


def _impl(before: int, key: str, pieces: int) -> str:
    """"triton" when every piece's conv launched the kernel (the conv's own counter says so)."""
    return "triton" if CALLS[key] - before == pieces else "reference"


def split_fwd_impl(x: Tensor, weight: Tensor, bias: Tensor | None, sizes: list[int],
                   silu: bool) -> list[Tensor]:
    """One contiguous (B, L, n_i) output per piece; the schema of fastpath::causal_conv1d_split_fwd."""
    _check(x, weight, bias, sizes)
    batch, _, seqlen = x.shape
    outs = []
    before = CALLS["fwd:triton"]
    for part in _pieces(sizes):
        out = x.new_empty((batch, seqlen, part.stop - part.start))
        fwd_into(x[:, part], weight[part], bias[part] if bias is not None else None, None, None, silu,
                 out.transpose(1, 2))
        outs.append(out)
    CALLS["conv_split_fwd:" + _impl(before, "fwd:triton", len(sizes))] += 1
    return outs


def split_bwd_impl(x: Tensor, weight: Tensor, bias: Tensor | None, douts: list[Tensor],
                   silu: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx in x's layout, dweight, dbias or an empty tensor) from one (B, L, n_i) gradient per piece."""
    sizes = [d.shape[-1] for d in douts]
    _check(x, weight, bias, sizes)
    dx = torch.empty_like(x)
    dweight = torch.empty_like(weight)
    dbias = torch.empty_like(bias) if bias is not None else weight.new_empty(0)
    before = CALLS["bwd:triton"]
    for part, dout in zip(_pieces(sizes), douts, strict=True):
        dw, db, _ = bwd_impl(x[:, part], weight[part], bias[part] if bias is not None else None,
                             dout.transpose(1, 2), None, None, None, dx[:, part], silu, False)
        dweight[part] = dw
        if bias is not None:
            dbias[part] = db
    CALLS["conv_split_bwd:" + _impl(before, "bwd:triton", len(sizes))] += 1
    return dx, dweight, dbias


def _douts(x: Tensor, sizes: Sequence[int], grads: Sequence[Tensor | None]) -> list[Tensor]:
    batch, _, seqlen = x.shape
    return [g if g is not None else x.new_zeros((batch, seqlen, n)) for n, g in zip(sizes, grads, strict=True)]


def _grads(ctx, bwd, grads) -> tuple:  # type: ignore[no-untyped-def]
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = bwd(x, weight, bias, _douts(x, ctx.sizes, grads), ctx.silu)
    return dx, dweight, dbias if bias is not None else None, None, None


class _SplitFunction(torch.autograd.Function):
    """Eager autograd, the same saved tensors and backward as the custom op's."""

    @staticmethod
    def forward(ctx, x, weight, bias, sizes, silu):  # type: ignore[override]
        outs = split_fwd_impl(x, weight, bias, sizes, silu)
        _split_setup_context(ctx, (x, weight, bias, sizes, silu), outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        return _grads(ctx, split_bwd_impl, grads)


def conv_split(x: Tensor, weight: Tensor, bias: Tensor | None, sizes: Sequence[int],
               silu: bool) -> tuple[Tensor, ...]:
    """The pieces of act(conv(x)) along D, each (B, L, n_i) contiguous (module docstring)."""
    sizes = [int(n) for n in sizes]
    if torch.compiler.is_compiling():
        return tuple(causal_conv1d_split_fwd(x, weight, bias, sizes, silu))
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _SplitFunction.apply(x, weight, bias, sizes, silu)
    return tuple(split_fwd_impl(x, weight, bias, sizes, silu))


causal_conv1d_split_fwd = torch.library.custom_op("fastpath::causal_conv1d_split_fwd", split_fwd_impl,
                                                  mutates_args=())


@causal_conv1d_split_fwd.register_fake
def _split_fwd_fake(x, weight, bias, sizes, silu):  # type: ignore[no-untyped-def]
    _check(x, weight, bias, sizes)
    return [x.new_empty((x.shape[0], x.shape[2], n)) for n in sizes]


def _split_setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, weight, bias, sizes, silu = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.sizes, ctx.silu = list(sizes), silu


def _split_backward(ctx, grads):  # type: ignore[no-untyped-def]
    return _grads(ctx, causal_conv1d_split_bwd, grads)


causal_conv1d_split_fwd.register_autograd(_split_backward, setup_context=_split_setup_context)

causal_conv1d_split_bwd = torch.library.custom_op("fastpath::causal_conv1d_split_bwd", split_bwd_impl,
                                                  mutates_args=())


@causal_conv1d_split_bwd.register_fake
def _split_bwd_fake(x, weight, bias, douts, silu):  # type: ignore[no-untyped-def]
    dbias = torch.empty_like(bias) if bias is not None else weight.new_empty(0)
    return torch.empty_like(x), torch.empty_like(weight), dbias
