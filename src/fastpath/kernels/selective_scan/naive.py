"""Float references for the Mamba-1 ops: the spec our Triton kernels are tested against, and the
runtime fallback for combinations the kernels do not take.

Semantics follow mamba_ssm's public Mamba-1 ops (mamba_ssm/ops/selective_scan_interface.py:
`selective_scan_fn`, `mamba_inner_fn`; mamba_ssm/ops/triton/selective_state_update.py), written
from their documented behaviour, not copied:

  delta' = softplus?(delta + delta_bias)        softplus(v) = v where v > 20 (as mamba_ssm)
  h_t[d, n] = exp(delta'_t[d] A[d, n]) h_{t-1}[d, n] + delta'_t[d] B_t[d, n] u_t[d],  h_{-1} = 0
  y_t[d] = sum_n h_t[d, n] C_t[d, n] + D[d] u_t[d] ;  out_t = y_t * silu(z_t)

u, delta, z: (batch, dim, L). A: (dim, N), real or complex. B and C each one of
  (dim, N)            time-invariant, per channel;
  (batch, N, L)       variable, shared by all channels;
  (batch, G, N, L)    variable, grouped: channel d reads group d // (dim / G).
With complex A a variable B/C holds real and imaginary parts interleaved along time
((batch, N, 2L) / (batch, G, N, 2L)), a time-invariant one is complex, and y takes 2 * Re(.)
(mamba_ssm's convention). last_state is h_{L-1}, (batch, dim, N).
Arithmetic is float32 (float64 when u is float64); `out` has u's dtype, last_state is float32
(float64 for float64 inputs; complex64/128 for complex A).
Everything here is plain differentiable torch: autograd of these functions is the gradient spec.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fastpath.kernels.causal_conv1d.naive import causal_conv1d_ref
from fastpath.kernels.ssd.naive import selective_state_update_ref

SOFTPLUS_THRESHOLD = 20.0

__all__ = [
    "mamba_inner_ref",
    "rms_norm_ref",
    "selective_scan_ref",
    "selective_state_update_ref",
]


def compute_dtype(u: Tensor) -> torch.dtype:
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def process_delta(delta: Tensor, delta_bias: Tensor | None, delta_softplus: bool,
                  dtype: torch.dtype) -> Tensor:
    """delta after its bias (per channel) and softplus (identity above 20, as mamba_ssm)."""
    out = delta.to(dtype)
    if delta_bias is not None:
        out = out + delta_bias.to(dtype)[:, None]
    if delta_softplus:
        out = torch.where(out <= SOFTPLUS_THRESHOLD, F.softplus(out), out)
    return out


def _per_channel(M: Tensor, batch: int, dim: int, complex_a: bool, dtype: torch.dtype) -> Tensor:
    """B or C as (batch, dim, N, L) (an expanded view; complex for complex A), from any of the
    three accepted layouts."""
    if M.dim() == 2:  # (dim, N): time-invariant
        m = M if M.is_complex() else M.to(dtype)
        return m[None, :, :, None]
    if M.dim() == 3:
        M = M[:, None]
    if complex_a:
        M = torch.view_as_complex(M.to(dtype).unflatten(-1, (-1, 2)).contiguous())
    else:
        M = M.to(dtype)
    groups = M.shape[1]
    return M.repeat_interleave(dim // groups, dim=1) if groups > 1 else M


def selective_scan_ref(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """mamba_ssm's `selective_scan_fn` as a step loop over L (module docstring)."""
    dtype = compute_dtype(u)
    batch, dim, length = u.shape
    complex_a = A.is_complex()
    uc = u.to(dtype)
    dt = process_delta(delta, delta_bias, delta_softplus, dtype)
    a = A if complex_a else A.to(dtype)
    Bm = _per_channel(B, batch, dim, complex_a, dtype)
    Cm = _per_channel(C, batch, dim, complex_a, dtype)
    state = torch.zeros((batch, dim, A.shape[1]), dtype=a.dtype, device=u.device)
    ys = []
    for t in range(length):
        bt = Bm[..., min(t, Bm.shape[-1] - 1)]
        ct = Cm[..., min(t, Cm.shape[-1] - 1)]
        dtt = dt[:, :, t, None]
        state = torch.exp(dtt * a) * state + dtt * bt * uc[:, :, t, None]
        y = (state * ct).sum(-1)
        ys.append(2 * y.real if y.is_complex() else y)
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + D.to(dtype)[:, None] * uc
    if z is not None:
        y = y * F.silu(z.to(dtype))
    out = y.to(u.dtype)
    return (out, state) if return_last_state else out


def rms_norm_ref(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm over the last axis in float32 (float64 for float64 input), back to x's dtype
    (mamba_ssm's rms_norm_forward without bias or residual)."""
    dtype = compute_dtype(x)
    xf = x.to(dtype)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    return y.to(x.dtype)


def mamba_inner_ref(
    xz: Tensor, conv1d_weight: Tensor, conv1d_bias: Tensor | None, x_proj_weight: Tensor,
    delta_proj_weight: Tensor, out_proj_weight: Tensor, out_proj_bias: Tensor | None, A: Tensor,
    B: Tensor | None = None, C: Tensor | None = None, D: Tensor | None = None,
    delta_bias: Tensor | None = None, B_proj_bias: Tensor | None = None, C_proj_bias: Tensor | None = None,
    delta_softplus: bool = True, checkpoint_lvl: int = 1, b_rms_weight: Tensor | None = None,
    c_rms_weight: Tensor | None = None, dt_rms_weight: Tensor | None = None, b_c_dt_rms_eps: float = 1e-6,
) -> Tensor:
    """mamba_ssm's `mamba_inner_fn` as a composition (checkpoint_lvl only trades memory there):

    x, z = xz.chunk(2, dim=1); x = silu(causal_conv1d(x) + bias); x_dbl = x^T x_proj_weight^T
    (rows (dt_rank | N | N)); delta = delta_proj_weight @ dt_part; B/C = the x_dbl parts (+ their
    proj bias) as (batch, N, L) unless given; optional RMSNorms: B and C over N, delta over dim
    (after delta_proj, before delta_bias and softplus: mamba_ssm's order); y = selective scan
    with z gating; out = y^T out_proj_weight^T + out_proj_bias, (batch, L, out_features).
    """
    del checkpoint_lvl
    batch, _, length = xz.shape
    rank = delta_proj_weight.shape[1]
    nstate = A.shape[-1] * (2 if A.is_complex() else 1)
    x, z = xz.chunk(2, dim=1)
    x = causal_conv1d_ref(x, conv1d_weight.reshape(conv1d_weight.shape[0], -1), conv1d_bias,
                          activation="silu")
    x_dbl = F.linear(x.transpose(1, 2).reshape(batch * length, -1), x_proj_weight)  # (BL, r+2N)
    delta = (delta_proj_weight @ x_dbl[:, :rank].t()).unflatten(1, (batch, length))  # (dim, B, L)
    if dt_rms_weight is not None:
        delta = rms_norm_ref(delta.permute(1, 2, 0), dt_rms_weight, b_c_dt_rms_eps).permute(2, 0, 1)
    delta = delta.transpose(0, 1)  # (B, dim, L)

    def variable(part: Tensor, bias: Tensor | None, weight: Tensor | None) -> Tensor:
        if bias is not None:
            part = part + bias.to(part.dtype)
        if weight is not None:
            part = rms_norm_ref(part, weight, b_c_dt_rms_eps)
        part = part.unflatten(0, (batch, length))  # (B, L, N)
        if A.is_complex():  # mamba_ssm's "(b l) (n two) -> b n (l two)"
            return part.unflatten(-1, (-1, 2)).permute(0, 2, 1, 3).flatten(2)
        return part.transpose(1, 2)  # (B, N, L)

    if B is None:
        B = variable(x_dbl[:, rank:rank + nstate], B_proj_bias, b_rms_weight)
    if C is None:
        C = variable(x_dbl[:, x_dbl.shape[1] - nstate:], C_proj_bias, c_rms_weight)
    y = selective_scan_ref(x, delta, A, B, C, D, z=z, delta_bias=delta_bias,
                           delta_softplus=delta_softplus)
    assert isinstance(y, Tensor)
    return F.linear(y.transpose(1, 2), out_proj_weight, out_proj_bias)
