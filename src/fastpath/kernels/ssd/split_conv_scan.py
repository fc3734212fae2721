"""mamba_split_conv1d_scan_combined: the fused Mamba-2 training op, as a composition of our kernels.

    out = outproj( [ silu(x0) * z0 | norm_or_gate( scan( conv(xBC) ), z ) ] )

zxbcdt (batch, seqlen, 2*d_nonssm + 2*dim + 2*ngroups*dstate + nheads) splits into
[x0 z0 | z | xBC | dt]; xBC runs through fastpath's causal conv (+ SiLU, seq_idx-aware), the
chunked scan runs with dt_softplus=True, then either the output is gated by silu(z) (no
rmsnorm_weight) or goes through the gated RMSNorm over groups of dim // ngroups channels
(norm_before_gate picks RMSNorm(y) * silu(z) or RMSNorm(y * silu(z))), the optional non-SSM
SwiGLU part is prepended, and the optional out-projection applied. Same signature and semantics as
mamba_ssm's op (mamba_ssm/ops/triton/ssd_combined.py); the float64 spec is
kernels/ssd/naive.mamba_split_conv1d_scan_ref. The composition is written once, as
naive.split_conv1d_scan: this module validates the call and plugs in fastpath's conv and scan.

Gradients come from autograd through the composition: the conv and the scan are custom ops with
their own backward kernels, the norm and the gates are a few elementwise torch ops.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.ssd.naive import SplitConvCall, split_conv1d_scan, split_shapes

_ACTIVATIONS = (None, "silu", "swish")


def _conv_kernel(x: Tensor, weight: Tensor, bias: Tensor | None, seq_idx: Tensor | None,
                 activation: str | None) -> Tensor:
    """fastpath's causal conv on the channel-last (B, C, L) view, taken as is."""
    from fastpath.kernels.causal_conv1d.interface import causal_conv1d_fwd

    out, _ = causal_conv1d_fwd(x, weight, bias, seq_idx, None, False, activation is not None)
    return out


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
    from fastpath.kernels.ssd.interface import chunk_scan

    if activation not in _ACTIVATIONS:
        raise ValueError(f"mamba_split_conv1d_scan_combined: activation must be one of {_ACTIVATIONS}, "
                         f"got {activation!r}")
    if zxbcdt.dim() != 3:
        raise ValueError(f"mamba_split_conv1d_scan_combined: zxbcdt must be (batch, seqlen, d), got "
                         f"{tuple(zxbcdt.shape)}")
    nheads, _, dim, _, _ = split_shapes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    if tuple(dt_bias.shape) != (nheads,) or tuple(A.shape) != (nheads,):
        raise ValueError(f"mamba_split_conv1d_scan_combined: dt_bias and A must be ({nheads},)")
    if rmsnorm_weight is not None and tuple(rmsnorm_weight.shape) != (dim,):
        raise ValueError(f"mamba_split_conv1d_scan_combined: rmsnorm_weight must be ({dim},)")
    if outproj_weight is None and outproj_bias is not None:
        raise ValueError("mamba_split_conv1d_scan_combined: outproj_bias without outproj_weight")
    CALLS["ssd_split_conv_scan:composed"] += 1
    if seq_idx is not None:
        seq_idx = seq_idx.to(torch.int32).contiguous()
    call = SplitConvCall(
        zxbcdt=zxbcdt, conv1d_weight=conv1d_weight, conv1d_bias=conv1d_bias, dt_bias=dt_bias, A=A,
        D=D, chunk_size=chunk_size, initial_states=initial_states, seq_idx=seq_idx,
        dt_limit=dt_limit, return_final_states=return_final_states, activation=activation,
        rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps, outproj_weight=outproj_weight,
        outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups,
        norm_before_gate=norm_before_gate,
    )
    return split_conv1d_scan(call, _conv_kernel, chunk_scan)
