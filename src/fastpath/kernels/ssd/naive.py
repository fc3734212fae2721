"""Float references for the Mamba-2 state-space ops: the spec our Triton kernels are tested against.

Semantics follow mamba_ssm 2.x's public ops (mamba_ssm/ops/triton/ssd_combined.py,
selective_state_update.py), written from their documented behaviour, not copied:

  dt' = clamp(softplus?(dt + dt_bias), *dt_limit)          softplus(v) = v where v > 20
  h_t = exp(A_h dt'_t) h_{t-1} + dt'_t x_t B_t^T            h: (P, N) per (batch, head)
  y_t = h_t C_t + D x_t ;  out_t = y_t * silu(z_t)

Heads share B and C within a group (head h reads group h // (H / G)). With seq_idx the state is
reset to zero before every token whose seq_idx differs from its predecessor's; the token before
position 0 counts as seq_idx 0 (mamba_ssm's convention), so initial_states belongs to a leading
segment numbered 0. seq_idx must be non-decreasing along each row (packed sequences).
varlen_states[i] is the state after the last token of sequence i of cu_seqlens (batch 1), running
only over that sequence's tokens, from initial_states[0] for i == 0 and from zeros otherwise.
Arithmetic is float32 (float64 when x is float64); `out` has x's dtype, final states are float32
(float64 for float64 inputs), varlen states have C's dtype like mamba_ssm's.
Everything here is plain differentiable torch: autograd of these functions is the gradient spec.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

NO_LIMIT = (0.0, math.inf)
SOFTPLUS_THRESHOLD = 20.0


def compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def process_dt(
    dt: Tensor,
    dt_bias: Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    dtype: torch.dtype,
) -> Tensor:
    """dt after bias, softplus (identity above 20, as mamba_ssm) and the dt_limit clamp."""
    out = dt.to(dtype)
    if dt_bias is not None:
        out = out + dt_bias.to(dtype)
    if dt_softplus:
        out = torch.where(out <= SOFTPLUS_THRESHOLD, F.softplus(out), out)
    if tuple(dt_limit) != NO_LIMIT:
        out = out.clamp(min=dt_limit[0], max=dt_limit[1])
    return out


@dataclass(frozen=True)
class ScanOptions:
    """The optional inputs and flags of one scan call, in mamba_ssm's order and with its defaults.

    The references, interface.py and split_conv_scan.py pass this one object around instead of
    repeating the seven-parameter tail in every signature; only the mamba_ssm-compatible faces
    and the custom-op schemas spell the parameters out.
    """

    D: Tensor | None = None
    z: Tensor | None = None
    dt_bias: Tensor | None = None
    initial_states: Tensor | None = None
    seq_idx: Tensor | None = None
    dt_softplus: bool = False
    dt_limit: tuple[float, float] = NO_LIMIT

    def process_dt(self, dt: Tensor, dtype: torch.dtype) -> Tensor:
        return process_dt(dt, self.dt_bias, self.dt_softplus, self.dt_limit, dtype)


def _expand_groups(t: Tensor, nheads: int) -> Tensor:
    """(..., G, N) -> (..., H, N); the reference may expand, the kernels never do."""
    return t.repeat_interleave(nheads // t.shape[-2], dim=-2)


def _d_skip(D: Tensor, dtype: torch.dtype) -> Tensor:
    """D as (H, P) or (H, 1), ready to broadcast against (..., H, P)."""
    D = D.to(dtype)
    return D if D.dim() == 2 else D[:, None]


def _finish(y: Tensor, x: Tensor, D: Tensor | None, z: Tensor | None) -> Tensor:
    if D is not None:
        y = y + x.to(y.dtype) * _d_skip(D, y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def _resets(seq_idx: Tensor | None, batch: int, seqlen: int, device) -> Tensor | None:
    """(B, L) bool: True where the state restarts from zero before the token."""
    if seq_idx is None:
        return None
    prev = torch.cat([seq_idx.new_zeros((batch, 1)), seq_idx[:, :-1]], dim=1)
    return (seq_idx != prev).to(device)


def _initial_state(opts: ScanOptions, x: Tensor, B: Tensor, dtype: torch.dtype) -> Tensor:
    """h before the first token, (B, H, P, N): initial_states or zeros."""
    if opts.initial_states is not None:
        return opts.initial_states.to(dtype)
    batch, _, nheads, headdim = x.shape
    return x.new_zeros((batch, nheads, headdim, B.shape[-1]), dtype=dtype)


def _step(
    h: Tensor, x: Tensor, dtp: Tensor, dA: Tensor, B: Tensor, C: Tensor
) -> tuple[Tensor, Tensor]:
    """One token of the recurrence, h (B, H, P, N) -> (y (B, H, P), new h):
    h' = dA h + (dt' x) B^T, y = h' C. dtp broadcasts against x, dA against h, B/C are per head.
    The scan's token loop and the decode step both run this, so they cannot drift apart."""
    h = dA * h + (dtp * x)[..., None] * B[..., None, :]
    return torch.einsum("bhpn,bhn->bhp", h, C), h


def ssd_recurrent_ref(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, **options: Any
) -> tuple[Tensor, Tensor]:
    """Token-by-token recurrence (the plainest statement of the op): returns (out, final_states).
    `options` are ScanOptions' fields by keyword.

    Slow (a Python loop over L); tests use it on tiny shapes as the float64 spec.
    """
    opts = ScanOptions(**options)
    dtype = compute_dtype(x)
    batch, seqlen, nheads, _ = x.shape
    dtp = opts.process_dt(dt, dtype)
    dA = torch.exp(dtp * A.to(dtype))  # (B, L, H)
    Bh = _expand_groups(B.to(dtype), nheads)
    Ch = _expand_groups(C.to(dtype), nheads)
    xs = x.to(dtype)
    h = _initial_state(opts, x, B, dtype)
    resets = _resets(opts.seq_idx, batch, seqlen, x.device)
    ys = []
    for t in range(seqlen):
        if resets is not None:
            h = h * (~resets[:, t]).to(dtype)[:, None, None, None]
        y, h = _step(h, xs[:, t], dtp[:, t, :, None], dA[:, t, :, None, None], Bh[:, t], Ch[:, t])
        ys.append(y)
    y = torch.stack(ys, dim=1)
    return _finish(y, x, opts.D, opts.z).to(x.dtype), h


def _segsum_decay(a: Tensor) -> Tensor:
    """exp(sum_{u < k <= t} a_k) for t >= u, else 0: (..., Q) -> (..., Q, Q) (rows t, cols u).

    Built from differences of a masked cumulative sum so no exp of a positive number appears.
    """
    q = a.shape[-1]
    rows = a[..., :, None].expand(*a.shape, q)  # rows[..., k, u] = a_k
    strict = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)  # k > u
    seg = rows.masked_fill(~strict, 0.0).cumsum(dim=-2)  # [t, u] = sum_{u<k<=t} a_k
    keep = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(0)
    return torch.exp(seg.masked_fill(~keep, -math.inf))


def ssd_chunked_ref(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int, **options: Any
) -> tuple[Tensor, Tensor]:
    """The same op by the chunked (SSD) algorithm in torch: the fallback on devices without
    Triton. Differentiable; returns (out, final_states). `options` are ScanOptions' fields."""
    return chunked_scan(x, dt, A, B, C, chunk_size, ScanOptions(**options))


def chunked_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int, opts: ScanOptions
) -> tuple[Tensor, Tensor]:
    """ssd_chunked_ref with its options as one object (what interface.py calls)."""
    dtype = compute_dtype(x)
    batch, seqlen, nheads, _ = x.shape
    q = chunk_size
    nchunks = -(-seqlen // q)
    pad = nchunks * q - seqlen

    def chunks(t: Tensor, value: float = 0.0) -> Tensor:
        t = t.to(dtype) if t.is_floating_point() else t
        if pad:
            t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad), value=value)
        return t.reshape(batch, nchunks, q, *t.shape[2:])

    dtp = opts.process_dt(dt, dtype)
    a = chunks(dtp * A.to(dtype))  # (B, c, Q, H); padding adds a = 0 (no decay)
    xc = chunks(x)
    vc = xc * chunks(dtp)[..., None]  # dt' x
    Bc = _expand_groups(chunks(B), nheads)
    Cc = _expand_groups(chunks(C), nheads)
    aT = a.permute(0, 1, 3, 2)  # (B, c, H, Q)
    decay = _segsum_decay(aT)  # (B, c, H, Q, Q)
    cum = aT.cumsum(-1)  # (B, c, H, Q) inclusive
    to_end = torch.exp(cum[..., -1:] - cum)  # decay from u to the chunk's end
    from_start = torch.exp(cum)  # decay from the chunk's start to t
    if opts.seq_idx is not None:
        seq = opts.seq_idx.long()
        if pad:  # the padded tail continues the last real token's sequence
            seq = torch.cat([seq, seq[:, -1:].expand(batch, pad)], dim=1)
        sc = seq.reshape(batch, nchunks, q)
        sc_last = sc[..., -1:]
        same = (sc[..., :, None] == sc[..., None, :])[:, :, None]  # (B, c, 1, Q, Q)
        decay = decay * same
        to_end = to_end * (sc == sc_last)[:, :, None]
        prev_last = torch.cat([sc.new_zeros((batch, 1)), sc[:, :-1, -1]], dim=1)  # (B, c)
        from_start = from_start * (sc == prev_last[..., None])[:, :, None]
        carry = (sc[:, :, -1] == prev_last).to(dtype)  # (B, c): state survives the chunk
    else:
        carry = torch.ones((batch, nchunks), dtype=dtype, device=x.device)
    cb = torch.einsum("bctHn,bcuHn->bcHtu", Cc, Bc)
    y = torch.einsum("bcHtu,bcuHp->bctHp", cb * decay, vc)
    states = torch.einsum("bcHu,bcuHp,bcuHn->bcHpn", to_end, vc, Bc)
    h = _initial_state(opts, x, B, dtype)
    gate = torch.exp(cum[..., -1]) * carry[:, :, None]  # (B, c, H)
    entering = []
    for c in range(nchunks):
        entering.append(h)
        h = gate[:, c, :, None, None] * h + states[:, c]
    prev = torch.stack(entering, dim=1)  # (B, c, H, P, N)
    y = y + torch.einsum("bcHt,bctHn,bcHpn->bctHp", from_start, Cc, prev)
    y = y.reshape(batch, nchunks * q, *x.shape[2:])[:, :seqlen]
    return _finish(y, x, opts.D, opts.z).to(x.dtype), h


def varlen_states_ref(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    cu_seqlens: Tensor,
    out_dtype: torch.dtype | None = None,
    **options: Any,
) -> Tensor:
    """Final state of each packed sequence (batch must be 1): (num_seqs, H, P, N), in out_dtype
    (default B's dtype, like mamba_ssm's C-dtype chunk states). Of ScanOptions' fields only
    dt_bias, dt_softplus, dt_limit and initial_states (its row 0) matter."""
    if x.shape[0] != 1:
        raise ValueError("cu_seqlens needs batch size 1 (sequences packed along the length)")
    opts = ScanOptions(**options)
    dtype = compute_dtype(x)
    nheads = x.shape[2]
    dtp = opts.process_dt(dt[0], dtype)  # (L, H)
    a = dtp * A.to(dtype)
    v = x[0].to(dtype) * dtp[..., None]
    Bh = _expand_groups(B.to(dtype), nheads)[0]
    bounds = [int(b) for b in cu_seqlens.tolist()]
    out = []
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        seg = a[start:end]
        # decay from token u to the sequence's end: sum of a over (u, end)
        after = seg.flip(0).cumsum(0).flip(0) - seg
        state = torch.einsum("uH,uHp,uHn->Hpn", torch.exp(after), v[start:end], Bh[start:end])
        if i == 0 and opts.initial_states is not None:
            init = opts.initial_states[0].to(dtype)
            state = state + torch.exp(seg.sum(0))[:, None, None] * init
        out.append(state)
    return torch.stack(out).to(out_dtype or B.dtype)


def selective_state_step(
    state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, opts: ScanOptions
) -> tuple[Tensor, Tensor]:
    """One decode step, pure: returns (out, new_state) in the compute dtype. Of opts, D, z,
    dt_bias and dt_softplus apply (mamba_ssm's update has no dt_limit, seq_idx or initial state).

    Shapes with heads (mamba_ssm's 4-D form): state (B, H, P, N), x/z (B, H, P), dt (B, H, P),
    A (H, P, N), B/C (B, G, N), D/dt_bias (H, P) or per head (H,) (update.py accepts
    both; mamba_ssm takes (H, P)). The head-less 3-D form (state (B, D, N)) is
    the same with H = 1 after unsqueeze. Arithmetic in float32 (float64 for float64 state).
    """
    dtype = torch.float64 if state.dtype == torch.float64 else torch.float32
    heads = state.dim() == 4
    if not heads:
        state, x, dt, A, B, C = (
            state[:, None], x[:, None], dt[:, None], A[None], B[:, None], C[:, None]
        )
        D, z, dt_bias = opts.D, opts.z, opts.dt_bias
        opts = replace(
            opts,
            D=None if D is None else D[None],
            z=None if z is None else z[:, None],
            dt_bias=None if dt_bias is None else dt_bias[None],
        )
    elif opts.dt_bias is not None and opts.dt_bias.dim() == 1:  # per head (H,), as D in _finish
        opts = replace(opts, dt_bias=opts.dt_bias[:, None])
    nheads = state.shape[1]
    dtp = opts.process_dt(dt, dtype)  # (B, H, P)
    dA = torch.exp(dtp[..., None] * A.to(dtype))  # (B, H, P, N)
    Bh = _expand_groups(B.to(dtype), nheads)  # (B, H, N)
    Ch = _expand_groups(C.to(dtype), nheads)
    y, new = _step(state.to(dtype), x.to(dtype), dtp, dA, Bh, Ch)
    out = _finish(y, x, opts.D, opts.z)
    if not heads:
        out, new = out[:, 0], new[:, 0]
    return out, new


def selective_state_update_ref(
    state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
    z: Tensor | None = None, dt_bias: Tensor | None = None, dt_softplus: bool = False,
    state_batch_indices: Tensor | None = None,
) -> Tensor:
    """mamba_ssm's `selective_state_update`: updates `state` in place, returns out (x's dtype).

    With state_batch_indices (B,), batch row b reads and writes state[state_batch_indices[b]]
    (a pooled cache); otherwise state has the batch size of x.
    """
    rows = state if state_batch_indices is None else state[state_batch_indices.long()]
    opts = ScanOptions(D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)
    out, new = selective_state_step(rows, x, dt, A, B, C, opts)
    with torch.no_grad():
        if state_batch_indices is None:
            state.copy_(new.to(state.dtype))
        else:
            state[state_batch_indices.long()] = new.to(state.dtype)
    return out.to(x.dtype)


def gated_rmsnorm_ref(
    x: Tensor,
    weight: Tensor,
    z: Tensor | None,
    eps: float,
    group_size: int,
    norm_before_gate: bool,
) -> Tensor:
    """RMSNorm over groups of `group_size` channels with an optional SiLU(z) gate, applied
    after the norm (norm_before_gate) or to its input. Arithmetic float32/float64."""
    dtype = compute_dtype(x)
    xs = x.to(dtype)
    if z is not None and not norm_before_gate:
        xs = xs * F.silu(z.to(dtype))
    shape = xs.shape
    g = xs.reshape(*shape[:-1], shape[-1] // group_size, group_size)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    out = g.reshape(shape) * weight.to(dtype)
    if z is not None and norm_before_gate:
        out = out * F.silu(z.to(dtype))
    return out


@dataclass(frozen=True)
class SplitConvCall:
    """One call of mamba_split_conv1d_scan_combined: its arguments, in its order and with its
    defaults. The spec below takes these fields as its arguments, and split_conv_scan.py's face
    builds one, so the composition (split_conv1d_scan) is written once."""

    zxbcdt: Tensor
    conv1d_weight: Tensor
    conv1d_bias: Tensor | None
    dt_bias: Tensor
    A: Tensor
    D: Tensor
    chunk_size: int
    initial_states: Tensor | None = None
    seq_idx: Tensor | None = None
    dt_limit: tuple[float, float] = NO_LIMIT
    return_final_states: bool = False
    activation: str | None = "silu"
    rmsnorm_weight: Tensor | None = None
    rmsnorm_eps: float = 1e-6
    outproj_weight: Tensor | None = None
    outproj_bias: Tensor | None = None
    headdim: int | None = None
    ngroups: int = 1
    norm_before_gate: bool = True


class SplitShapes(NamedTuple):
    nheads: int
    headdim: int
    dim: int
    dstate: int
    d_nonssm: int


def split_shapes(zxbcdt: Tensor, conv1d_weight: Tensor, D: Tensor, headdim: int | None,
                 ngroups: int) -> SplitShapes:
    """The sizes a split-conv call implies, or ValueError naming the mismatch."""
    op = "mamba_split_conv1d_scan_combined"
    if D.dim() == 1:
        if headdim is None:
            raise ValueError(f"{op}: headdim is required when D is per head")
        nheads = D.shape[0]
    else:
        nheads, headdim = D.shape
    if nheads % ngroups:
        raise ValueError(f"{op}: ngroups {ngroups} does not divide nheads {nheads}")
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    total = zxbcdt.shape[-1]
    d_nonssm = (total - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    if dstate <= 0 or d_nonssm < 0 or total != 2 * (d_nonssm + dim + ngroups * dstate) + nheads:
        raise ValueError(f"{op}: zxbcdt last dim {total} does not match conv1d_weight "
                         f"{tuple(conv1d_weight.shape)}, nheads {nheads}, headdim {headdim}, "
                         f"ngroups {ngroups}")
    return SplitShapes(nheads, headdim, dim, dstate, d_nonssm)


# conv(x (B, C, L), weight, bias, seq_idx, activation) -> (B, C, L)
ConvFn = Callable[[Tensor, Tensor, Tensor | None, Tensor | None, str | None], Tensor]
# scan(x, dt, A, B, C, chunk_size, options) -> (out, final_states)
ScanFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, int, ScanOptions], tuple[Tensor, Tensor]]


def split_conv1d_scan(
    call: SplitConvCall, conv: ConvFn, scan: ScanFn
) -> Tensor | tuple[Tensor, Tensor]:
    """mamba_ssm's `mamba_split_conv1d_scan_combined`, unfused, around a given conv and scan:
    the spec passes the torch references, split_conv_scan.py fastpath's kernels.

    zxbcdt (B, L, 2*d_nonssm + 2*dim + 2*G*N + H) splits into [x0 z0 | z | xBC | dt]; xBC goes
    through the causal conv (+ activation, seq_idx-aware), the scan runs with dt_softplus=True,
    then either z gating, or the gated RMSNorm over dim // ngroups channels; the non-SSM part
    is silu(x0) * z0 in front; optional out-projection. Returns out, or (out, final_states).
    """
    nheads, headdim, dim, dstate, d_nonssm = split_shapes(
        call.zxbcdt, call.conv1d_weight, call.D, call.headdim, call.ngroups
    )
    batch, seqlen, _ = call.zxbcdt.shape
    ngroups = call.ngroups
    zx0, z, xbc, dt = torch.split(
        call.zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1
    )
    xbc = conv(
        xbc.transpose(1, 2), call.conv1d_weight, call.conv1d_bias, call.seq_idx, call.activation
    ).transpose(1, 2)
    x, B, C = torch.split(xbc, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    heads, groups = (batch, seqlen, nheads, headdim), (batch, seqlen, ngroups, dstate)
    gated_in_scan = call.rmsnorm_weight is None
    opts = ScanOptions(
        D=call.D, z=z.reshape(heads) if gated_in_scan else None, dt_bias=call.dt_bias,
        initial_states=call.initial_states, seq_idx=call.seq_idx, dt_softplus=True,
        dt_limit=call.dt_limit,
    )
    y, final = scan(
        x.reshape(heads), dt, call.A, B.reshape(groups), C.reshape(groups), call.chunk_size, opts
    )
    y = y.reshape(batch, seqlen, dim)
    if not gated_in_scan:
        y = gated_rmsnorm_ref(
            y, call.rmsnorm_weight, z, call.rmsnorm_eps, dim // ngroups, call.norm_before_gate
        ).to(y.dtype)
    if d_nonssm > 0:
        x0, z0 = zx0.chunk(2, dim=-1)
        y = torch.cat([(F.silu(x0.float()) * z0.float()).to(y.dtype), y], dim=-1)
    if call.outproj_weight is not None:
        bias = call.outproj_bias
        y = F.linear(y, call.outproj_weight.to(y.dtype), None if bias is None else bias.to(y.dtype))
    return (y, final) if call.return_final_states else y


def _conv_ref(x: Tensor, weight: Tensor, bias: Tensor | None, seq_idx: Tensor | None,
              activation: str | None) -> Tensor:
    from fastpath.kernels.causal_conv1d.naive import causal_conv1d_ref

    return causal_conv1d_ref(x, weight, bias, activation=activation, seq_idx=seq_idx)


def mamba_split_conv1d_scan_ref(*args: Any, **kwargs: Any) -> Tensor | tuple[Tensor, Tensor]:
    """mamba_ssm's `mamba_split_conv1d_scan_combined` in float torch: split_conv1d_scan on the
    torch references. Arguments as mamba_ssm's (SplitConvCall's fields, in order)."""
    return split_conv1d_scan(SplitConvCall(*args, **kwargs), _conv_ref, chunked_scan)
