"""Triton single-step state-space update (the Mamba-2 decode step), mamba_ssm's public signature.

    selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None) -> out

Shapes (the head axis is optional, as in mamba_ssm): state (batch|pool, nheads, dim, dstate),
x / dt / z (batch, nheads, dim), A (nheads, dim, dstate), B / C (batch, ngroups, dstate),
D / dt_bias (nheads, dim) or (nheads,) per head. transformers passes dt, A, D and dt_bias
*expanded* from per-head values (stride 0 along dim and dstate): the kernel sees those strides and
reads one scalar per head instead (TIE_HDIM), so the per-head case costs one exp per head row.

Math per (b, h, p, n), fp32: dt' = softplus?(dt + dt_bias); state = state * exp(A dt') + dt' B x;
out = sum_n state C + D x, times silu(z). The state is updated in place, in its own dtype; the
output uses the fp32 state. `state_batch_indices[b]` picks the state row of a pooled cache; a
negative entry marks a padding row: its output is 0 and no state is touched. So does an entry
past the pool (>= state.shape[0]): checking the indices on the host would cost a device sync
every token, and the kernel never reads or writes outside the state it was given.

One program owns (one batch row, one head, BLOCK_P rows of dim) x all of dstate: it reads its
state tile once and writes it once, so the op runs at memory speed; B and C are loaded once per
program for the program's group (never expanded to heads). Repeat launches go through
kernels/compiled_launch.CachedLauncher: at decode the host launch cost is most of the time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastpath.kernels.compiled_launch import CachedLauncher
from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import TRITON_DTYPES, use_triton

MAX_DSTATE = 256  # one program holds a (BLOCK_P, dstate) fp32 tile in registers


@triton.jit
def _softplus(v):
    """log(1 + e^v) in fp32, identity above 20 (torch's threshold). Below e^v = 1/16 log1p's
    series: log(1 + e) in fp32 loses e's low bits (7e-4 relative at v = -11)."""
    e = tl.exp(tl.minimum(v, 20.0))
    series = e * (1.0 - e * (0.5 - e * (0.3333333333333333 - e * (0.25 - e * (
        0.2 - e * 0.16666666666666666)))))
    return tl.where(v > 20.0, v, tl.where(e < 0.0625, series, tl.log(1.0 + e)))


@triton.jit
def _state_update_kernel(
    STATE, X, DT, DT_BIAS, A, B, C, D, Z, OUT, IDX,
    P, N, HEADS_PER_GROUP, POOL,
    s_sb, s_sh, s_sp, s_sn,
    s_xb, s_xh, s_xp,
    s_tb, s_th, s_tp,
    s_bh, s_bp,
    s_ah, s_ap, s_an,
    s_Bb, s_Bg, s_Bn,
    s_Cb, s_Cg, s_Cn,
    s_dh, s_dp,
    s_zb, s_zh, s_zp,
    s_ob, s_oh, s_op,
    HAS_DT_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_IDX: tl.constexpr,
    TIE_HDIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_p = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    g = h // HEADS_PER_GROUP
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mp = offs_p < P
    mn = offs_n < N
    row = b
    live = mp
    if HAS_IDX:
        row = tl.load(IDX + b).to(tl.int64)
        rows = tl.zeros((BLOCK_P,), dtype=tl.int64) + row
        live = mp & (rows >= 0) & (rows < POOL)  # padding (< 0) and past-the-pool rows: no-ops
        row = tl.minimum(tl.maximum(row, 0), POOL - 1)
    tile = live[:, None] & mn[None, :]
    state_ptrs = STATE + row * s_sb + h * s_sh + offs_p[:, None] * s_sp + offs_n[None, :] * s_sn
    state = tl.load(state_ptrs, mask=tile, other=0.0).to(tl.float32)
    x = tl.load(X + b * s_xb + h * s_xh + offs_p * s_xp, mask=mp, other=0.0).to(tl.float32)
    Bv = tl.load(B + b * s_Bb + g * s_Bg + offs_n * s_Bn, mask=mn, other=0.0).to(tl.float32)
    Cv = tl.load(C + b * s_Cb + g * s_Cg + offs_n * s_Cn, mask=mn, other=0.0).to(tl.float32)
    if TIE_HDIM:  # one dt, A per head (transformers' expanded views)
        dt = tl.load(DT + b * s_tb + h * s_th).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(DT_BIAS + h * s_bh).to(tl.float32)
        if SOFTPLUS:
            dt = _softplus(dt)
        a = tl.load(A + h * s_ah).to(tl.float32)
        decay = tl.exp(a * dt)
        new = state * decay + (dt * x)[:, None] * Bv[None, :]
    else:
        dt = tl.load(DT + b * s_tb + h * s_th + offs_p * s_tp, mask=mp, other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(DT_BIAS + h * s_bh + offs_p * s_bp, mask=mp, other=0.0).to(tl.float32)
        if SOFTPLUS:
            dt = _softplus(dt)
        a = tl.load(A + h * s_ah + offs_p[:, None] * s_ap + offs_n[None, :] * s_an,
                    mask=mp[:, None] & mn[None, :], other=0.0).to(tl.float32)
        decay = tl.exp(a * dt[:, None])
        new = state * decay + (dt * x)[:, None] * Bv[None, :]
    tl.store(state_ptrs, new.to(STATE.dtype.element_ty), mask=tile)
    out = tl.sum(new * Cv[None, :], axis=1)
    if HAS_D:
        out += x * tl.load(D + h * s_dh + offs_p * s_dp, mask=mp, other=0.0).to(tl.float32)
    if HAS_Z:
        zv = tl.load(Z + b * s_zb + h * s_zh + offs_p * s_zp, mask=mp, other=0.0).to(tl.float32)
        out = out * zv * tl.sigmoid(zv)
    out = tl.where(live, out, 0.0)
    tl.store(OUT + b * s_ob + h * s_oh + offs_p * s_op, out.to(OUT.dtype.element_ty), mask=mp)


_LAUNCH = CachedLauncher(
    _state_update_kernel,
    ("HAS_DT_BIAS", "SOFTPLUS", "HAS_D", "HAS_Z", "HAS_IDX", "TIE_HDIM", "BLOCK_P", "BLOCK_N"),
)


def update_config(dim: int, dstate: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_N, num_warps): about 4096 state elements per program (a 16 KiB fp32
    tile in registers across 4 warps); memory-bound, so more programs hide latency."""
    block_n = triton.next_power_of_2(dstate)
    block_p = max(1, min(triton.next_power_of_2(dim), 4096 // block_n))
    return block_p, block_n, 4 if block_n <= 128 else 8


_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {}


def _per_head(t: torch.Tensor | None, nheads: int, dim: int) -> torch.Tensor | None:
    """(nheads,) -> a (nheads, dim) stride-0 view; (nheads, dim) as is."""
    if t is None or t.dim() == 2:
        return t
    return t[:, None].expand(nheads, dim)


def _tied(dt: torch.Tensor, dt_bias: torch.Tensor | None, A: torch.Tensor) -> bool:
    """dt, dt_bias and A hold one value per head (stride 0 along dim, and A along dstate)."""
    def flat(t: torch.Tensor, dims: tuple[int, ...]) -> bool:
        return all(t.stride(d) == 0 or t.shape[d] == 1 for d in dims)

    return flat(dt, (2,)) and (dt_bias is None or flat(dt_bias, (1,))) and flat(A, (1, 2))


def selective_state_update_triton(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
    C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
    dt_softplus: bool, state_batch_indices: torch.Tensor | None,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """4-D state / 3-D x form (the wrapper below normalises); returns out like x."""
    batch, nheads, dim = x.shape
    dstate = state.shape[-1]
    ngroups = B.shape[1]
    out = torch.empty_like(x)
    if out.numel() == 0:
        return out
    if config is None:
        config = _CONFIGS.get((dim, dstate))
        if config is None:
            config = _CONFIGS[(dim, dstate)] = update_config(dim, dstate)
    block_p, block_n, warps = config
    Dv = _per_head(D, nheads, dim)
    bias = _per_head(dt_bias, nheads, dim)
    tie = _tied(dt, bias, A)
    ss, xs, ts, As, Bs, Cs, os_ = (state.stride(), x.stride(), dt.stride(), A.stride(),
                                  B.stride(), C.stride(), out.stride())
    bs = bias.stride() if bias is not None else (0, 0)
    ds = Dv.stride() if Dv is not None else (0, 0)
    zs = z.stride() if z is not None else (0, 0, 0)
    _LAUNCH(
        (triton.cdiv(dim, block_p), batch, nheads),
        (state, x, dt, x if bias is None else bias, A, B, C, x if Dv is None else Dv,
         x if z is None else z, out, x if state_batch_indices is None else state_batch_indices,
         dim, dstate, nheads // ngroups, state.shape[0],
         ss[0], ss[1], ss[2], ss[3], xs[0], xs[1], xs[2], ts[0], ts[1], ts[2], bs[0], bs[1],
         As[0], As[1], As[2], Bs[0], Bs[1], Bs[2], Cs[0], Cs[1], Cs[2], ds[0], ds[1],
         zs[0], zs[1], zs[2], os_[0], os_[1], os_[2]),
        (bias is not None, bool(dt_softplus), Dv is not None, z is not None,
         state_batch_indices is not None, tie, block_p, block_n),
        warps,
    )
    return out


def _unsupported(state: torch.Tensor, x: torch.Tensor, tensors: tuple[torch.Tensor | None, ...]) -> str | None:
    """Why the kernel would not take this call (None: it does)."""
    if state.shape[-1] > MAX_DSTATE:
        return f"dstate {state.shape[-1]} > {MAX_DSTATE}"
    for t in tensors:
        if t is not None and t.dtype not in TRITON_DTYPES:
            return f"dtype {t.dtype}"
    if state.numel() >= 2**31 or x.numel() >= 2**31:
        return "a tensor with >= 2**31 elements"
    return None


def _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices) -> None:
    batch, nheads, dim = x.shape
    dstate = state.shape[-1]
    if state.dim() != 4 or state.shape[1:] != (nheads, dim, dstate):
        raise ValueError(f"selective_state_update: state {tuple(state.shape)} does not match x {tuple(x.shape)}")
    if state_batch_indices is None and state.shape[0] != batch:
        raise ValueError(f"selective_state_update: state batch {state.shape[0]} != x batch {batch} "
                         "(pass state_batch_indices for a pooled cache)")
    if state_batch_indices is not None and tuple(state_batch_indices.shape) != (batch,):
        raise ValueError(f"selective_state_update: state_batch_indices must be ({batch},), "
                         f"got {tuple(state_batch_indices.shape)}")
    if dt.shape != x.shape or (z is not None and z.shape != x.shape):
        raise ValueError("selective_state_update: dt and z must have x's shape")
    if A.shape != (nheads, dim, dstate):
        raise ValueError(f"selective_state_update: A {tuple(A.shape)} != {(nheads, dim, dstate)}")
    if B.dim() != 3 or B.shape != C.shape or B.shape[0] != batch or B.shape[2] != dstate:
        raise ValueError(f"selective_state_update: B/C must be ({batch}, ngroups, {dstate})")
    if nheads % B.shape[1]:
        raise ValueError(f"selective_state_update: ngroups {B.shape[1]} does not divide nheads {nheads}")
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None and tuple(t.shape) not in ((nheads, dim), (nheads,)):
            raise ValueError(f"selective_state_update: {name} {tuple(t.shape)} must be ({nheads}, {dim}) or ({nheads},)")


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """mamba_ssm.ops.triton.selective_state_update.selective_state_update, on fastpath's kernel.

    Without heads: state (batch, dim, dstate), x/dt/z (batch, dim), A (dim, dstate),
    B/C (batch, dstate), D/dt_bias (dim,). The state is updated in place."""
    has_heads = state.dim() == 4
    if not has_heads:
        state, x, dt, A = state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1), A.unsqueeze(0)
        B, C = B.unsqueeze(1), C.unsqueeze(1)
        D = D.unsqueeze(0) if D is not None else None
        z = z.unsqueeze(1) if z is not None else None
        dt_bias = dt_bias.unsqueeze(0) if dt_bias is not None else None
    if B.dim() == 2:  # (batch, dstate) with heads: one group
        B, C = B.unsqueeze(1), C.unsqueeze(1)
    _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    why = _unsupported(state, x, (state, x, dt, A, B, C, D, z, dt_bias))
    if use_triton(x) and why is None:
        CALLS["ssd_update:triton"] += 1
        out = selective_state_update_triton(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                            state_batch_indices)
    else:
        if why is not None and use_triton(x):
            _warn(why)
        CALLS["ssd_update:reference"] += 1
        out = _reference(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
    return out if has_heads else out.squeeze(1)


def _reference(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices) -> torch.Tensor:
    """The float64 spec (kernels/ssd/naive.py), in place on `state` like the kernel."""
    from fastpath.kernels.ssd.naive import selective_state_update_ref

    live = None if state_batch_indices is None else (
        (state_batch_indices >= 0) & (state_batch_indices < state.shape[0]))
    if live is None or bool(live.all()):
        return selective_state_update_ref(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                          dt_softplus=dt_softplus, state_batch_indices=state_batch_indices)
    keep = live.nonzero().flatten()  # padding / past-the-pool rows: output 0, no state touched
    out = torch.zeros_like(x)
    out[keep] = selective_state_update_ref(
        state, x[keep], dt[keep], A, B[keep], C[keep], D=D, z=None if z is None else z[keep],
        dt_bias=dt_bias, dt_softplus=dt_softplus, state_batch_indices=state_batch_indices[keep])
    return out


_WARNED: set[str] = set()


def _warn(why: str) -> None:
    if why in _WARNED:
        return
    _WARNED.add(why)
    import warnings

    warnings.warn(f"fastpath selective_state_update: {why} is not handled by the Triton kernel; "
                  "using the (slower) float64 reference", RuntimeWarning, stacklevel=3)
