"""mamba_split_conv1d_scan_combined: the fused Mamba-2 training op, as a composition of our kernels.

    out = outproj( [ silu(x0) * z0 | norm_or_gate( scan( conv(xBC) ), z ) ] )

zxbcdt (batch, seqlen, 2*d_nonssm + 2*dim + 2*ngroups*dstate + nheads) splits into
[x0 z0 | z | xBC | dt]; xBC runs through fastpath's causal conv (+ SiLU, seq_idx-aware), the
chunked scan runs with dt_softplus=True, then either the output is gated by silu(z) (no
rmsnorm_weight) or goes through the gated RMSNorm over groups of dim // ngroups channels
(norm_before_gate picks RMSNorm(y) * silu(z) or RMSNorm(y * silu(z))), the optional non-SSM
SwiGLU part is prepended, and the optional out-projection applied. Same signature and semantics as
mamba_ssm's op (mamba_ssm/ops/triton/ssd_combined.py); the float64 spec is
kernels/ssd/naive.mamba_split_conv1d_scan_ref.

Gradients come from autograd through the composition: the conv and the scan are custom ops with
their own backward kernels, the norm and the gates are a few elementwise torch ops.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from fastpath.kernels.counters import CALLS

_ACTIVATIONS = (None, "silu", "swish")


def split_shapes(zxbcdt: Tensor, conv1d_weight: Tensor, D: Tensor, headdim: int | None,
                 ngroups: int) -> tuple[int, int, int, int, int]:
    """(nheads, headdim, dim, dstate, d_nonssm) of a call, or ValueError naming the mismatch."""
    if D.dim() == 1:
        if headdim is None:
            raise ValueError("mamba_split_conv1d_scan_combined: headdim is required when D is per head")
        nheads = D.shape[0]
    else:
        nheads, headdim = D.shape
    if nheads % ngroups:
        raise ValueError(f"mamba_split_conv1d_scan_combined: ngroups {ngroups} does not divide nheads {nheads}")
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    total = zxbcdt.shape[-1]
    d_nonssm = (total - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    if dstate <= 0 or d_nonssm < 0 or total != 2 * d_nonssm + 2 * dim + 2 * ngroups * dstate + nheads:
        raise ValueError(f"mamba_split_conv1d_scan_combined: zxbcdt last dim {total} does not match "
                         f"conv1d_weight {tuple(conv1d_weight.shape)}, nheads {nheads}, headdim {headdim}, "
                         f"ngroups {ngroups}")
    return nheads, headdim, dim, dstate, d_nonssm


def mamba_split_conv1d_scan_combined(
    zxbcdt: Tensor,
    conv1d_weight: Tensor,
    conv1d_bias: Tensor | None,
    dt_bias: Tensor,
    A: Tensor,
    D: Tensor,
    chunk_size: int,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    activation: str | None = "silu",
    rmsnorm_weight: Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: Tensor | None = None,
    outproj_bias: Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined on fastpath's kernels.

    Returns out (batch, seqlen, dim or out_dim), or (out, final_states (batch, nheads, headdim,
    dstate)) with return_final_states."""
    from fastpath.kernels.causal_conv1d.interface import causal_conv1d_fwd
    from fastpath.kernels.ssd.interface import mamba_chunk_scan_combined
    from fastpath.kernels.ssd.naive import gated_rmsnorm_ref

    if activation not in _ACTIVATIONS:
        raise ValueError(f"mamba_split_conv1d_scan_combined: activation must be one of {_ACTIVATIONS}, "
                         f"got {activation!r}")
    if zxbcdt.dim() != 3:
        raise ValueError(f"mamba_split_conv1d_scan_combined: zxbcdt must be (batch, seqlen, d), got "
                         f"{tuple(zxbcdt.shape)}")
    nheads, headdim, dim, dstate, d_nonssm = split_shapes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    if tuple(dt_bias.shape) != (nheads,) or tuple(A.shape) != (nheads,):
        raise ValueError(f"mamba_split_conv1d_scan_combined: dt_bias and A must be ({nheads},)")
    if rmsnorm_weight is not None and tuple(rmsnorm_weight.shape) != (dim,):
        raise ValueError(f"mamba_split_conv1d_scan_combined: rmsnorm_weight must be ({dim},)")
    if outproj_weight is None and outproj_bias is not None:
        raise ValueError("mamba_split_conv1d_scan_combined: outproj_bias without outproj_weight")
    CALLS["ssd_split_conv_scan:composed"] += 1
    batch, seqlen, _ = zxbcdt.shape
    zx0, z, xbc, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    if seq_idx is not None:
        seq_idx = seq_idx.to(torch.int32).contiguous()
    # (B, L, C) -> the channel-last (B, C, L) view the conv kernels take as is
    xbc, _ = causal_conv1d_fwd(xbc.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx, None, False,
                               activation is not None)
    x, B, C = torch.split(xbc.transpose(1, 2), [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    gated_in_scan = rmsnorm_weight is None
    y, final = mamba_chunk_scan_combined(
        x.reshape(batch, seqlen, nheads, headdim), dt, A,
        B.reshape(batch, seqlen, ngroups, dstate), C.reshape(batch, seqlen, ngroups, dstate),
        chunk_size, D=D, z=z.reshape(batch, seqlen, nheads, headdim) if gated_in_scan else None,
        dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
        dt_limit=dt_limit, return_final_states=True,
    )
    out = y.reshape(batch, seqlen, dim)
    if not gated_in_scan:
        out = gated_rmsnorm_ref(out, rmsnorm_weight, z, rmsnorm_eps, dim // ngroups,
                                norm_before_gate).to(out.dtype)
    if d_nonssm > 0:
        x0, z0 = zx0.chunk(2, dim=-1)
        out = torch.cat([(F.silu(x0.float()) * z0.float()).to(out.dtype), out], dim=-1)
    if outproj_weight is not None:
        out = F.linear(out, outproj_weight.to(out.dtype),
                       None if outproj_bias is None else outproj_bias.to(out.dtype))
    return (out, final) if return_final_states else out
