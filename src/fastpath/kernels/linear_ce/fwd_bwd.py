"""Triton kernel: per-row cross-entropy over one chunk of logits, gradient written over the logits.

Why: transformers' causal-LM loss upcasts the (N, V) logits to float32, runs log-softmax forward
and backward over them and keeps several (N, V) float32 tensors alive (on an 8-layer Qwen3.5-27B
cut at L=4096, V=248,320: 4 GB each, ~8 ms of log-softmax on an H200). Here one program owns one
row of a chunk (the chunk's logits, in the GEMM's dtype) and makes two passes over it:

  1. online max / sum of exp (one exp per element, a block max per step) -> m, s;
     loss = (m - x[label]) + log(s) (0 for an ignore_index row; NaN for a label outside [0, V));
  2. dlogits = (exp(x - m) / s - onehot(label)) * scale, stored over x in x's dtype (rounded once
     from float32, to nearest even also under the CPU interpreter: kernels/rounding.py), or 0 for
     an ignore_index row.

`scale` is a one-element float32 tensor (1 / number of counted labels for a mean, 1 for a sum), read
by every program: no host synchronisation to learn the count. All arithmetic is float32, as
transformers' `logits.float()` then `cross_entropy`. The log-sum-exp is never formed as m + log(s):
rounding that sum to m's ulp cost a confident row (loss ~1e-5, the label the max) up to 5% of its
loss and of its gradient, where torch's log-softmax keeps x - m and log(s) apart as done here.

Pass 2 reads the row again. At Qwen3.5-27B's vocabulary a row is 485 KiB of bf16, and with a
program per row about a thousand rows are in flight on an H100 (8 programs of 8 warps an SM):
far more than its 50 MB L2 holds, so both reads come from DRAM (read, read, write: 6.1 GB at
4,096 rows, 2.9 TB/s in the 2.07 ms the kernel took on an H100, BENCHMARKS.md Session 26).
`programs` (a persistent grid: program i walks rows i, i + programs, ...) bounds the rows in
flight, and `reverse` walks pass 2 from the row's end, so it starts on the blocks pass 1 read
last, the likeliest to be still in L2. Both move only the order of memory accesses: each row's
arithmetic, and so every bit of the results, is the same. The defaults (a program per row,
forward order) are the order timed there; benchmarks/linear_ce_gpu.py --rows-sweep times the
others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.rounding import store_rounded

MAX_BLOCK_V = 4096  # elements of a row per step: 8 KiB of bf16, a few loads in flight per warp


@triton.jit
def _ce_rows_kernel(logits_ptr, stride_row, labels_ptr, stride_label, loss_ptr, scale_ptr, n_rows,
                    n_cols, ignore_index, WRITE_GRAD: tl.constexpr, RNE: tl.constexpr,
                    BLOCK_V: tl.constexpr, REVERSE: tl.constexpr):
    for r in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _ce_row(logits_ptr, stride_row, labels_ptr, stride_label, loss_ptr, scale_ptr, r, n_cols,
                ignore_index, WRITE_GRAD, RNE, BLOCK_V, REVERSE)


@triton.jit
def _ce_row(logits_ptr, stride_row, labels_ptr, stride_label, loss_ptr, scale_ptr, r, n_cols,
            ignore_index, WRITE_GRAD: tl.constexpr, RNE: tl.constexpr, BLOCK_V: tl.constexpr,
            REVERSE: tl.constexpr):
    """One row's loss and (with WRITE_GRAD) gradient: the two passes of the module doc."""
    row = tl.cast(r, tl.int64)  # (an int under the interpreter, whose range yields ints)
    base = logits_ptr + row * stride_row
    label = tl.load(labels_ptr + row * stride_label).to(tl.int64)
    ignored = label == ignore_index
    bad = (label < 0) | (label >= n_cols)
    offs = tl.arange(0, BLOCK_V)

    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + offs
        x = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    log_s = tl.log(s)

    safe = tl.minimum(tl.maximum(label, 0), n_cols - 1)
    target = tl.load(base + safe).to(tl.float32)
    loss = tl.where(ignored, 0.0, tl.where(bad, float("nan"), (m - target) + log_s))
    tl.store(loss_ptr + row, loss)

    if WRITE_GRAD:
        scale = tl.load(scale_ptr)
        scale = tl.where(ignored, 0.0, tl.where(bad, float("nan"), scale))
        inv_s = 1.0 / s
        n_blocks = tl.cdiv(n_cols, BLOCK_V)
        for i in range(0, n_blocks):
            if REVERSE:
                cols = (n_blocks - 1 - i) * BLOCK_V + offs
            else:
                cols = i * BLOCK_V + offs
            mask = cols < n_cols
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(x - m) * inv_s - tl.where(cols == label, 1.0, 0.0)
            g = tl.where(ignored, 0.0, g * scale)
            store_rounded(base + cols, g, mask, RNE)


def block_v(n_cols: int) -> int:
    """Elements per step of a row: the whole row when short, else MAX_BLOCK_V."""
    return min(MAX_BLOCK_V, triton.next_power_of_2(max(n_cols, 16)))


def ce_rows_(logits: Tensor, labels: Tensor, scale: Tensor, ignore_index: int, *, write_grad: bool = True,
             block: int | None = None, programs: int = 0, reverse: bool = False) -> Tensor:
    """Per-row float32 loss of `logits` (rows, V) with unit column stride; with write_grad the
    rows' (softmax - onehot) * scale replace the logits in place. `block` (tests) forces the step;
    `programs` (0: one per row) and `reverse` pick the access order (module doc), not the result."""
    n_rows, n_cols = logits.shape
    loss = torch.empty(n_rows, device=logits.device, dtype=torch.float32)
    if n_rows == 0:
        return loss
    if programs < 0:
        raise ValueError(f"ce_rows_: programs={programs}: expected 0 (one per row) or a count >= 1")
    blk = block or block_v(n_cols)
    num_warps = 8 if blk >= 2048 else 4
    grid = min(programs, n_rows) if programs else n_rows
    _ce_rows_kernel[(grid,)](
        logits, logits.stride(0), labels, labels.stride(0), loss, scale, n_rows, n_cols, ignore_index,
        WRITE_GRAD=write_grad, RNE=triton_interpreter_on(), BLOCK_V=blk, REVERSE=reverse,
        num_warps=num_warps)
    return loss
