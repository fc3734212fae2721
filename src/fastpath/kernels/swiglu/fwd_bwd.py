"""Triton kernels of the SwiGLU gated product over flat contiguous buffers.

Why: eager transformers runs silu and a multiply forward (two passes, the silu output kept for
backward) and a multiply-backward plus a silu-backward (three more passes); the gate_proj and
up_proj outputs are contiguous (rows, intermediate) buffers, so one flat pass each way reads them
once, computes in float32 and rounds once. Offsets are int64: an 8 x 4096-token batch of a 17k-wide
MLP is over 2^31 / 4 elements already.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.rounding import store_rounded

_BLOCK = 2048


@triton.jit
def _silu_mul_fwd_kernel(g_ptr, u_ptr, out_ptr, n, RNE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    store_rounded(out_ptr + offs, g * tl.sigmoid(g) * u, mask, RNE)


@triton.jit
def _silu_mul_bwd_kernel(g_ptr, u_ptr, do_ptr, dg_ptr, du_ptr, n, RNE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    store_rounded(du_ptr + offs, do * g * s, mask, RNE)
    # 1 - s as sigmoid(-g): exact also where s rounds to 1
    store_rounded(dg_ptr + offs, do * u * s * (1.0 + g * tl.sigmoid(-g)), mask, RNE)


def silu_mul_fwd(gate: Tensor, up: Tensor, out_dtype: torch.dtype) -> Tensor:
    """gate, up: contiguous, one shape; returns contiguous silu(gate) * up in out_dtype."""
    out = torch.empty(gate.shape, device=gate.device, dtype=out_dtype)
    n = gate.numel()
    _silu_mul_fwd_kernel[(triton.cdiv(n, _BLOCK),)](gate, up, out, n, RNE=triton_interpreter_on(),
                                                        BLOCK=_BLOCK, num_warps=8)
    return out


def silu_mul_bwd(gate: Tensor, up: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
    """(dgate in gate's dtype, dup in up's dtype), contiguous; every input contiguous."""
    dg = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    du = torch.empty(up.shape, device=up.device, dtype=up.dtype)
    n = gate.numel()
    _silu_mul_bwd_kernel[(triton.cdiv(n, _BLOCK),)](gate, up, dout, dg, du, n,
                                                        RNE=triton_interpreter_on(), BLOCK=_BLOCK, num_warps=8)
    return dg, du
