"""Host-side bookkeeping shared by the two backward kernels (rows and tiles): the gradient
buffers, the empty-problem answer, and the fixed-order reduction of per-chunk dW/dB partials
that keeps weight/bias gradients deterministic (no atomics)."""

from __future__ import annotations

import torch


def begin_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
    return_dinitial_states: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, bool]:
    """(dweight, dbias, dinitial_states, empty). dinit is channel-last like Dao's states and
    exists only when asked for and there are initial states. When the problem has no positions
    (`empty`), the buffers already hold the answer."""
    batch, dim, _ = x.shape
    width = weight.shape[-1]
    dinit = None
    if return_dinitial_states and initial_states is not None:
        dinit = initial_states.new_empty((batch, width - 1, dim)).transpose(1, 2)
    dbias = torch.empty_like(bias) if bias is not None else None
    dweight = torch.empty_like(weight)
    empty = x.numel() == 0
    if empty:
        _fill_empty_problem(dweight, dbias, dinit, dfinal_states)
    return dweight, dbias, dinit, empty


def _fill_empty_problem(
    dweight: torch.Tensor,
    dbias: torch.Tensor | None,
    dinit: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
) -> None:
    """No positions: dW = dB = 0, and the final state *is* the initial state (dinit = dfinal)."""
    dweight.zero_()
    if dbias is not None:
        dbias.zero_()
    if dinit is not None:
        dinit.copy_(dfinal_states if dfinal_states is not None else torch.zeros_like(dinit))


def reduce_chunk_partials(
    partials: tuple[torch.Tensor, torch.Tensor], dweight: torch.Tensor, dbias: torch.Tensor | None
) -> None:
    """Sum the fp32 partials [chunks, W, D] / [chunks, D] in a fixed order into the outputs."""
    dw_part, db_part = partials
    dweight.copy_(dw_part.sum(dim=0).t())
    if dbias is not None:
        dbias.copy_(db_part.sum(dim=0))


def bwd_operands(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
    dx: torch.Tensor,
    dinit: torch.Tensor | None,
    n_chunks: int,
) -> tuple[tuple, tuple, tuple[torch.Tensor, torch.Tensor]]:
    """The backward kernels' shared arguments, in their order: 11 pointers (an absent optional
    one is x, never read: its HAS_* flag is off) and the 23 strides that follow the sizes; plus
    the fp32 dW/dB partials per (batch, chunk) they write, for reduce_chunk_partials."""
    batch, dim, _ = x.shape
    dw_part = torch.empty((batch * n_chunks, weight.shape[-1], dim), device=x.device,
                          dtype=torch.float32)
    db_part = torch.empty((batch * n_chunks, dim), device=x.device, dtype=torch.float32)
    init = initial_states if initial_states is not None else x
    dfin = dfinal_states if dfinal_states is not None else x
    dinit_t = dinit if dinit is not None else x
    ptrs = (x, weight, bias if bias is not None else weight, dout,
            seq_idx if seq_idx is not None else x, init, dfin, dx, dinit_t, dw_part, db_part)
    strides = (*x.stride(), *dout.stride(), *dx.stride(), *weight.stride(), *init.stride(),
               *dfin.stride(), *dinit_t.stride(), seq_idx.stride(0) if seq_idx is not None else 0)
    return ptrs, strides, (dw_part, db_part)
