"""Host side of the causal-conv1d Triton kernels: one forward and one backward launch path that both
strategies (fwd_bwd_rows.py for channel-last inputs, fwd_tile.py / bwd_tile.py for the rest) go
through.

The forward kernels share their leading arguments (6 pointers, L, D), their 15 strides and their
first 5 constexprs; the backward kernels their 11 pointers, L, D, n_chunks, 23 strides and first
6 constexprs. So a strategy contributes only its kernel and a plan: the grid, the size arguments
between D (and n_chunks) and the strides, the constexprs after the shared ones, and num_warps.
Everything else — the pointer and stride lists in kernel order (an absent optional pointer is x or
weight, never read: its HAS_* flag is off), the empty problem, the fixed-order reduction of the
per-chunk dW/dB partials that keeps weight/bias gradients deterministic (no atomics) — is here,
once. This is the whole per-call host path of a conv, so it stays flat: one plan call, one launch,
no dicts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fastpath.kernels.compiled_launch import CachedLauncher

#: (grid, sizes after D (the backward's n_chunks follows them), own constexprs, num_warps)
Plan = tuple[tuple[int, int, int], tuple[int, ...], tuple, int]
_FWD_CONSTEXPRS = ("WIDTH", "SILU", "HAS_BIAS", "HAS_SEQ", "HAS_INIT")
_BWD_CONSTEXPRS = (*_FWD_CONSTEXPRS, "HAS_DFIN")


def forward_launcher(
    kernel: object, own_constexprs: tuple[str, ...], plan: Callable[[Tensor, dict | None], Plan]
) -> Callable[..., Tensor]:
    """The forward of `kernel`, planned by `plan(x, config)`."""
    launch = CachedLauncher(kernel, (*_FWD_CONSTEXPRS, *own_constexprs))

    def forward(x: Tensor, weight: Tensor, bias: Tensor | None, seq_idx: Tensor | None,
                initial_states: Tensor | None, silu: bool, config: dict | None = None,
                out: Tensor | None = None) -> Tensor:
        """y = act(conv(x)) into `out` (x's shape, any strides; default strides of x); seq_idx is
        int32 contiguous (the face ensures it)."""
        out = torch.empty_like(x) if out is None else out
        if out.numel() == 0:
            return out
        grid, sizes, own, num_warps = plan(x, config)
        init = initial_states if initial_states is not None else x
        launch(
            grid,
            (x, weight, bias if bias is not None else weight, seq_idx if seq_idx is not None else x,
             init, out, x.shape[2], x.shape[1], *sizes,
             *x.stride(), *out.stride(), *weight.stride(), *init.stride(),
             seq_idx.stride(0) if seq_idx is not None else 0),
            (weight.shape[-1], silu, bias is not None, seq_idx is not None,
             initial_states is not None, *own),
            num_warps,
        )
        return out

    return forward


def backward_launcher(
    kernel: object,
    own_constexprs: tuple[str, ...],
    plan: Callable[[Tensor, int, bool, dict | None], Plan],
) -> Callable[..., tuple[Tensor, Tensor | None, Tensor | None]]:
    """The backward of `kernel`, planned by `plan(x, width, has_dinit, config)`; the kernel writes
    fp32 dW/dB partials per (batch row, chunk), grid[1] chunks."""
    launch = CachedLauncher(kernel, (*_BWD_CONSTEXPRS, *own_constexprs))

    def backward(x: Tensor, weight: Tensor, bias: Tensor | None, dout: Tensor,
                 seq_idx: Tensor | None, initial_states: Tensor | None,
                 dfinal_states: Tensor | None, dx: Tensor, silu: bool,
                 return_dinitial_states: bool, config: dict | None = None,
                 ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Writes dx; returns (dweight, dbias or None, dinitial_states or None). dinit is
        channel-last like Dao's states and exists only when asked for and there are initial
        states."""
        batch, dim, seqlen = x.shape
        width = weight.shape[-1]
        dinit = None
        if return_dinitial_states and initial_states is not None:
            dinit = initial_states.new_empty((batch, width - 1, dim)).transpose(1, 2)
        dbias = torch.empty_like(bias) if bias is not None else None
        dweight = torch.empty_like(weight)
        if x.numel() == 0:
            _fill_empty_problem(dweight, dbias, dinit, dfinal_states)
            return dweight, dbias, dinit
        grid, sizes, own, num_warps = plan(x, width, dinit is not None, config)
        n_chunks = grid[1]
        dw_part = torch.empty((batch * n_chunks, width, dim), device=x.device, dtype=torch.float32)
        db_part = torch.empty((batch * n_chunks, dim), device=x.device, dtype=torch.float32)
        init = initial_states if initial_states is not None else x
        dfin = dfinal_states if dfinal_states is not None else x
        dinit_t = dinit if dinit is not None else x
        launch(
            grid,
            (x, weight, bias if bias is not None else weight, dout,
             seq_idx if seq_idx is not None else x, init, dfin, dx, dinit_t, dw_part, db_part,
             seqlen, dim, *sizes, n_chunks,
             *x.stride(), *dout.stride(), *dx.stride(), *weight.stride(), *init.stride(),
             *dfin.stride(), *dinit_t.stride(), seq_idx.stride(0) if seq_idx is not None else 0),
            (width, silu, bias is not None, seq_idx is not None, initial_states is not None,
             dfinal_states is not None, *own),
            num_warps,
        )
        dweight.copy_(dw_part.sum(dim=0).t())  # [chunks, W, D] summed in a fixed order
        if dbias is not None:
            dbias.copy_(db_part.sum(dim=0))
        return dweight, dbias, dinit

    return backward


def _fill_empty_problem(
    dweight: Tensor, dbias: Tensor | None, dinit: Tensor | None, dfinal_states: Tensor | None
) -> None:
    """No positions: dW = dB = 0, and the final state *is* the initial state (dinit = dfinal)."""
    dweight.zero_()
    if dbias is not None:
        dbias.zero_()
    if dinit is not None:
        dinit.copy_(dfinal_states if dfinal_states is not None else torch.zeros_like(dinit))
