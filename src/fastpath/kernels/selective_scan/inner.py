"""mamba_ssm's fused Mamba-1 training op, its signature, composed of fastpath's differentiable ops:

    mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                   out_proj_weight, out_proj_bias, A, B=None, C=None, D=None, delta_bias=None,
                   B_proj_bias=None, C_proj_bias=None, delta_softplus=True, checkpoint_lvl=1,
                   b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None, b_c_dt_rms_eps=1e-6)
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from fastpath.kernels.causal_conv1d.interface import conv_fwd
from fastpath.kernels.selective_scan import naive as reference
from fastpath.kernels.selective_scan.interface import selective_scan_fn


def mamba_inner_fn(
    xz: Tensor,
    conv1d_weight: Tensor,
    conv1d_bias: Tensor | None,
    x_proj_weight: Tensor,
    delta_proj_weight: Tensor,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    A: Tensor,
    B: Tensor | None = None,
    C: Tensor | None = None,
    D: Tensor | None = None,
    delta_bias: Tensor | None = None,
    B_proj_bias: Tensor | None = None,
    C_proj_bias: Tensor | None = None,
    delta_softplus: bool = True,
    checkpoint_lvl: int = 1,
    b_rms_weight: Tensor | None = None,
    c_rms_weight: Tensor | None = None,
    dt_rms_weight: Tensor | None = None,
    b_c_dt_rms_eps: float = 1e-6,
) -> Tensor:
    """mamba_ssm's Mamba-1 training op: conv (+SiLU) -> x_proj -> delta_proj -> selective scan
    (z gating) -> out_proj, composed of differentiable ops (fastpath's causal conv, matmuls,
    the scan op), so autograd reaches every input. naive.mamba_inner_ref states the semantics
    (B/C RMSNorm over N, the dt RMSNorm over dim after delta_proj, as mamba_ssm).
    xz (batch, 2*dim, L); returns (batch, L, out_features). checkpoint_lvl is accepted for
    signature compatibility; autograd keeps the intermediates.
    """
    if xz.dim() != 3 or xz.shape[1] % 2:
        raise ValueError(f"xz must be (batch, 2*dim, seqlen), got {tuple(xz.shape)}")
    if checkpoint_lvl not in (0, 1):
        raise ValueError(f"checkpoint_lvl must be 0 or 1, got {checkpoint_lvl!r}")
    batch, _, length = xz.shape
    dim = xz.shape[1] // 2
    rank = delta_proj_weight.shape[1]
    nstate = A.shape[-1] * (2 if A.is_complex() else 1)
    rows = rank + nstate * ((B is None) + (C is None))  # x_proj makes only the varying B/C
    if x_proj_weight.dim() != 2 or tuple(x_proj_weight.shape) != (rows, dim):
        raise ValueError(f"x_proj_weight must be (dt_rank + dstate per time-varying B/C = "
                         f"{rows}, {dim}), got {tuple(x_proj_weight.shape)}")
    weight = conv1d_weight.reshape(conv1d_weight.shape[0], conv1d_weight.shape[-1])
    x, z = xz.chunk(2, dim=1)
    x, _ = conv_fwd(x, weight, conv1d_bias, None, None, False, True)
    x_dbl = F.linear(x.transpose(1, 2).reshape(batch * length, dim), x_proj_weight)
    delta = delta_proj_weight @ x_dbl[:, :rank].t()  # (dim, B*L): L fastest, as the scan likes
    if dt_rms_weight is not None:
        delta = reference.rms_norm_ref(delta.t(), dt_rms_weight, b_c_dt_rms_eps).t()
    delta = delta.unflatten(1, (batch, length)).transpose(0, 1)  # (B, dim, L)

    def variable(part: Tensor, bias: Tensor | None, rms: Tensor | None) -> Tensor:
        if bias is not None:
            part = part + bias.to(part.dtype)
        if rms is not None:
            part = reference.rms_norm_ref(part, rms, b_c_dt_rms_eps)
        part = part.unflatten(0, (batch, length))
        if A.is_complex():
            return part.unflatten(-1, (-1, 2)).permute(0, 2, 1, 3).flatten(2)
        return part.transpose(1, 2)

    if B is None:
        B = variable(x_dbl[:, rank:rank + nstate], B_proj_bias, b_rms_weight)
    if C is None:
        C = variable(x_dbl[:, x_dbl.shape[1] - nstate:], C_proj_bias, c_rms_weight)
    y = selective_scan_fn(x, delta, A, B, C, D, z=z, delta_bias=delta_bias,
                          delta_softplus=delta_softplus)
    assert isinstance(y, Tensor)
    return F.linear(y.transpose(1, 2), out_proj_weight, out_proj_bias)
