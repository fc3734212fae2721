"""Triton kernel of the token embedding's weight gradient: each vocabulary row written once.

Why: torch's CUDA embedding backward zero-fills the whole [vocab, hidden] gradient, then sorts the
ids and scatters the segment sums into it: for Qwen3.5-27B's 248k x 5120 bf16 table that is a
2.5 GB fill (0.80 ms of 1.26 ms on an H100, benchmarks/model_profile.py) before a scatter that
touches a few thousand rows. Here the ids are sorted once on the host side (a few thousand
elements), each vocabulary row finds its tokens' segment of the sorted order, and one kernel
writes every row exactly once: the segment's float32 sum (its tokens in order, _TOKENS at a time,
so the result does not depend on the launch) or zeros, rounded once; the padding row's tokens
are not read at all. Offsets are int64 (a 256k x 8192 table is past
2^31 elements).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.rounding import store_rounded

_ROWS = 8
_BLOCK_H = 1024
_TOKENS = 8  # output-gradient rows summed per step (fixed: it sets the summation order)


@triton.jit
def _embedding_bwd_kernel(order_ptr, starts_ptr, dout_ptr, dw_ptr, num_rows, H, dout_stride,
                          padding_idx, SCALE_BY_FREQ: tl.constexpr, RNE: tl.constexpr,
                          ROWS: tl.constexpr, BLOCK_H: tl.constexpr, TOKENS: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    offs_k = tl.arange(0, TOKENS)
    for r in range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(starts_ptr + row)
            end = tl.load(starts_ptr + row + 1)
            # the padding row gets no gradient: its tokens (often most of a padded batch) go unread
            end = tl.where(row == padding_idx, start, end)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            # TOKENS output-gradient rows in flight at once: a frequent id's many tokens are not
            # a chain of dependent loads
            for j in range(start, end, TOKENS):
                k_ok = (j + offs_k) < end
                token = tl.load(order_ptr + j + offs_k, mask=k_ok, other=0).to(tl.int64)
                rows = tl.load(dout_ptr + token[:, None] * dout_stride + cols[None, :],
                               mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                acc += tl.sum(rows.to(tl.float32), axis=0)
            if SCALE_BY_FREQ:
                acc = acc / tl.maximum(end - start, 1).to(tl.float32)
            store_rounded(dw_ptr + row * H + cols, acc, col_ok, RNE)


def segments(ids: Tensor, num_rows: int) -> tuple[Tensor, Tensor]:
    """(order, starts): the token positions in id order (stable: token order within an id) and,
    for each row v, where its tokens begin in that order (starts[v + 1] where they end)."""
    sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
    bounds = torch.arange(num_rows + 1, device=ids.device, dtype=sorted_ids.dtype)
    return order, torch.searchsorted(sorted_ids, bounds)


def weight_grad(ids: Tensor, dout: Tensor, num_rows: int, padding_idx: int | None,
                scale_grad_by_freq: bool, dtype: torch.dtype, out: Tensor | None = None,
                rows_per_program: int = _ROWS, block_h: int = _BLOCK_H) -> Tensor:
    """ids: int32/int64, any shape; dout: ids.shape + (H,), contiguous; returns the contiguous
    [num_rows, H] gradient in `dtype`, written into `out` when given (every element overwritten:
    no zero fill is needed, which is the point). rows_per_program and block_h (a power of two)
    set the launch only (benchmarks/embedding_gpu.py times them); every choice gives the same bits."""
    H = dout.shape[-1]
    rows = dout.reshape(-1, H)
    if out is not None and (out.shape != (num_rows, H) or out.dtype != dtype or not out.is_contiguous()):
        raise ValueError(f"embedding: out must be a contiguous {(num_rows, H)} {dtype} tensor")
    dw = torch.empty(num_rows, H, device=dout.device, dtype=dtype) if out is None else out
    if dw.numel() == 0:
        return dw
    order, starts = segments(ids, num_rows)
    block_h = min(triton.next_power_of_2(H), block_h)
    grid = (triton.cdiv(num_rows, rows_per_program), triton.cdiv(H, block_h))
    _embedding_bwd_kernel[grid](order, starts, rows, dw, num_rows, H, rows.stride(0),
                                -1 if padding_idx is None else padding_idx,
                                SCALE_BY_FREQ=scale_grad_by_freq, RNE=triton_interpreter_on(),
                                ROWS=rows_per_program, BLOCK_H=block_h, TOKENS=_TOKENS,
                                num_warps=max(1, min(8, block_h // 128)))
    return dw
