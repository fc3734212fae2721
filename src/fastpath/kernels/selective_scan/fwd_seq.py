"""Triton forward of Mamba-1's selective scan that walks time step by step: our own kernel.

Why. The chunked forward (fwd_chunked.py) runs tl.associative_scan over (BLOCK_D, N, T) tiles; on
an H200 (Triton 3.6) it reached about 2% of copy bandwidth at Falcon-Mamba-7B shapes (BENCHMARKS.md).
A scan of a first-order recurrence needs no parallel prefix when there are enough independent
channels to fill the machine: each program here owns (one batch row, BLOCK_D channels of one B/C
group) and carries its state h (BLOCK_D, N) in float32 registers through all L steps, so every
state element costs one exp2 and two FMAs per step and no shuffles along time. (At N = 16 the
exp2s alone, B*D*L*N of them on the SFU at about 16/clk/SM, bound an H200 at roughly 1 ms for
(8, 4096) at D = 8192: about half of copy bandwidth over the mandatory bytes.)

Per step t: delta'_t = softplus(delta + bias) (float32), dA = exp2(delta'_t * A * log2(e)),
  h = dA * h + (delta'_t u_t) B_t,   y_t = sum_n h C_t + D u_t,   out_t = y_t * silu(z_t)
stored in u's dtype; the state after the last step is last_state (float32). The loads of step
t + 1 are issued before step t's arithmetic (carried through the loop) so their latency overlaps
it; u, delta, z of one channel are strided along t, so one cache line serves many steps from L1.

Scope. Only (out, last_state) are produced. The backward never reads the forward's buffers: it
recomputes its chunk-boundary states itself (fwd_chunked.chunk_states, called from bwd), so this
kernel can serve training and inference alike. Selected with FASTPATH_SSCAN_FWD=seq (interface.py);
the default forward is the tile kernel (fwd_tile.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.selective_scan.fwd_chunked import (
    LOG2E,
    bc_layout,
    bc_programs,
    bc_row,
    channel_block,
    per_channel,
    softplus,
    store_rounded,
)

# (BLOCK_D, num_warps): channels per program and warps. BLOCK_D = 32 * num_warps gives one
# channel (N states) per thread: B * D / 32 warps in all (256 at D = 8192, B = 1).
SEQ_CONFIG = (32, 1)
# alternatives timed by benchmarks/selective_scan.py (sweep phase) and compiled by
# benchmarks/kernel_compile_check.py
SEQ_SWEEP = ((32, 1), (16, 1), (64, 2), (128, 4), (32, 2), (64, 4), (64, 1))


@triton.jit
def _step_loads(U, DELTA, Z, B, C, t, L, u_row, d_row, z_row, B_row, C_row, offs_d, md, offs_n,
                mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl, s_Bn, s_Bl, s_Cn, s_Cl,
                HAS_Z: tl.constexpr, B_VAR: tl.constexpr, C_VAR: tl.constexpr):
    """The raw inputs of step t (zeros past L): u, delta, z (BLOCK_D,), B, C (BLOCK_N,) (zeros
    for a time-invariant one, never read: its tile is loaded once, outside the loop)."""
    mdt = md & ((offs_d * 0 + t) < L)  # tensor masks: the interpreter's t is a Python int
    mnt = mn & ((offs_n * 0 + t) < L)
    u = tl.load(U + u_row + offs_d * s_ud + t * s_ul, mask=mdt, other=0.0)
    dt = tl.load(DELTA + d_row + offs_d * s_dd + t * s_dl, mask=mdt, other=0.0)
    if HAS_Z:
        z = tl.load(Z + z_row + offs_d * s_zd + t * s_zl, mask=mdt, other=0.0)
    else:
        z = u
    if B_VAR:
        Bt = tl.load(B + B_row + offs_n * s_Bn + t * s_Bl, mask=mnt, other=0.0)
    else:
        Bt = offs_n.to(tl.float32) * 0.0  # a tensor: loop-carried values keep their type
    if C_VAR:
        Ct = tl.load(C + C_row + offs_n * s_Cn + t * s_Cl, mask=mnt, other=0.0)
    else:
        Ct = offs_n.to(tl.float32) * 0.0
    return u, dt, z, Bt, Ct


@triton.jit
def _bc_step(M, fixed, VAR: tl.constexpr):
    """B_t / C_t as an (N, BLOCK_D)-broadcastable float32 tile."""
    if VAR:
        return M.to(tl.float32)[:, None]
    else:
        return fixed


@triton.jit
def _bc_fixed_t(M, offs_d, offs_n, mdn, s_d, s_n, VAR: tl.constexpr):
    """A time-invariant (dim, N) B or C as an (N, BLOCK_D) float32 tile (0.0 when varying)."""
    if VAR:
        return 0.0
    else:
        return tl.load(M + offs_n[:, None] * s_n + offs_d[None, :] * s_d, mask=mdn,
                       other=0.0).to(tl.float32)


# A and LAST unspecialised (no 16-byte alignment promise): with it, Triton would vectorise their
# accesses four channels a thread and spread N across lanes, shuffling the sum over N every step.
@triton.jit(do_not_specialize=["A", "LAST"])
def _fwd_seq_kernel(
    U, DELTA, A, B, C, D, Z, DBIAS, OUT, LAST,
    L, dim, N, dim_per_group, dpg_B, dpg_C, n_blocks,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_Bb, s_Bg, s_Bn, s_Bl, s_Cb, s_Cg, s_Cn, s_Cl,
    s_zb, s_zd, s_zl, s_ob, s_od, s_ol,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    B_VAR: tl.constexpr, C_VAR: tl.constexpr, RNE: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    g, offs_d, md = channel_block(tl.program_id(0), dim_per_group, n_blocks, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < N
    # state tiles are (N, BLOCK_D): channels along the fast axis, so Triton's default layout puts
    # lanes on channels and a thread holds all N states of its channel(s): the sum over N stays
    # in registers and softplus/sigmoid (per channel) run once per channel, not once per lane
    mdn = mn[:, None] & md[None, :]
    A2 = tl.load(A + offs_n[:, None] * s_an + offs_d[None, :] * s_ad, mask=mdn,
                 other=0.0).to(tl.float32) * LOG2E
    if HAS_D:
        Dv = tl.load(D + offs_d, mask=md, other=0.0).to(tl.float32)
    if HAS_DBIAS:
        bias = tl.load(DBIAS + offs_d, mask=md, other=0.0).to(tl.float32)
    Bfix = _bc_fixed_t(B, offs_d, offs_n, mdn, s_Bg, s_Bn, B_VAR)
    Cfix = _bc_fixed_t(C, offs_d, offs_n, mdn, s_Cg, s_Cn, C_VAR)
    u_row = b * s_ub
    d_row = b * s_db
    z_row = b * s_zb
    o_row = b * s_ob
    B_row = bc_row(b, g, dim_per_group, dpg_B, s_Bb, s_Bg)
    C_row = bc_row(b, g, dim_per_group, dpg_C, s_Cb, s_Cg)
    h = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    u, dt, z, Bt, Ct = _step_loads(U, DELTA, Z, B, C, 0, L, u_row, d_row, z_row, B_row, C_row,
                                   offs_d, md, offs_n, mn, s_ud, s_ul, s_dd, s_dl, s_zd, s_zl,
                                   s_Bn, s_Bl, s_Cn, s_Cl, HAS_Z, B_VAR, C_VAR)
    for t in range(L):
        # next step's loads first (masked off past L): their latency hides behind this step
        u_n, dt_n, z_n, B_n, C_n = _step_loads(U, DELTA, Z, B, C, t + 1, L, u_row, d_row, z_row,
                                               B_row, C_row, offs_d, md, offs_n, mn, s_ud, s_ul,
                                               s_dd, s_dl, s_zd, s_zl, s_Bn, s_Bl, s_Cn, s_Cl,
                                               HAS_Z, B_VAR, C_VAR)
        uf = u.to(tl.float32)
        d = dt.to(tl.float32)
        if HAS_DBIAS:
            d += bias
        if SOFTPLUS:
            d = softplus(d)
        d = tl.where(md, d, 0.0)
        dA = tl.exp2(d[None, :] * A2)
        h = dA * h + (d * uf)[None, :] * _bc_step(Bt, Bfix, B_VAR)
        y = tl.sum(h * _bc_step(Ct, Cfix, C_VAR), axis=0)
        if HAS_D:
            y += Dv * uf
        if HAS_Z:
            zf = z.to(tl.float32)
            y = y * zf * tl.sigmoid(zf)
        store_rounded(OUT + o_row + offs_d * s_od + t * s_ol, y, md, RNE)
        u, dt, z, Bt, Ct = u_n, dt_n, z_n, B_n, C_n
    tl.store(LAST + (b * N + offs_n[:, None]) * dim + offs_d[None, :], h, mask=mdn)


def n_fastest(M: Tensor) -> Tensor:
    """B or C with N the contiguous axis: each step then reads its N values as a few vector
    loads instead of N scalar ones (transformers' prefill passes (B, N, L) contiguous). A copy
    of batch*G*L*N elements; time-invariant (dim, N) and stride-0-in-time inputs stay views."""
    if M.dim() == 2 or M.stride(-2) == 1 or M.stride(-1) == 0 or M.shape[-2] == 1:
        return M
    return M.transpose(-2, -1).contiguous().transpose(-2, -1)


def selective_scan_fwd_seq_triton(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                                  D: Tensor | None, z: Tensor | None, delta_bias: Tensor | None,
                                  delta_softplus: bool,
                                  config: tuple[int, int] | None = None
                                  ) -> tuple[Tensor, Tensor]:
    """Same contract as fwd_chunked.selective_scan_fwd_triton: (out in u's dtype, contiguous
    (batch, dim, L); last_state float32 (batch, dim, N)); B/C each (dim, N), (batch, N, L) or
    (batch, G, N, L), any strides."""
    batch, dim, length = u.shape
    nstate = A.shape[1]
    out = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    if not out.numel():
        return out, torch.empty((batch, dim, nstate), dtype=torch.float32, device=u.device)
    # A and the last state travel channel-fastest, (N, dim) and (batch, N, dim): every 2-D access
    # then runs along channels, so Triton lays the (N, BLOCK_D) state tiles out with lanes on
    # channels (an N-fastest access would make it put lanes on N and shuffle every step)
    A = A.t().contiguous()
    D, delta_bias = per_channel(D), per_channel(delta_bias)
    Bl, Cl = bc_layout(n_fastest(B)), bc_layout(n_fastest(C))
    last = torch.empty((batch, nstate, dim), dtype=torch.float32, device=u.device)
    block_d, warps = config or SEQ_CONFIG
    groups, dim_per_group, block_d = bc_programs(dim, Bl, Cl, block_d)
    n_blocks = triton.cdiv(dim_per_group, block_d)
    dummy = u
    zs = z.stride() if z is not None else (0, 0, 0)
    _fwd_seq_kernel[(groups * n_blocks, batch)](
        u, delta, A, Bl.tensor, Cl.tensor, dummy if D is None else D, dummy if z is None else z,
        dummy if delta_bias is None else delta_bias, out, last,
        length, dim, nstate, dim_per_group, dim // Bl.groups, dim // Cl.groups, n_blocks,
        *u.stride(), *delta.stride(), A.stride(1), A.stride(0), *Bl.strides, *Cl.strides, *zs,
        *out.stride(),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DBIAS=delta_bias is not None,
        SOFTPLUS=bool(delta_softplus), B_VAR=Bl.variable, C_VAR=Cl.variable,
        RNE=triton_interpreter_on(), BLOCK_D=block_d,
        BLOCK_N=triton.next_power_of_2(nstate), num_warps=warps,
    )
    return out, last.transpose(1, 2).contiguous()
