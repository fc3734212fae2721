"""Triton forward of the chunked state-space scan (the SSD algorithm), our own kernels.

Three launches, all group-aware (head h reads B/C of group h // (H/G) in place; nothing is
expanded to heads):
1. `_dt_kernel`: dt' = clamp(softplus(dt + bias)) and the within-chunk cumulative log-decay
   cum_t = sum_{k<=t} A dt'_k, both float32, laid out (B, H, NC*Q).
2. `_states_kernel`: per (batch, head, P/N tile), a sequential pass over chunks: stores the state
   entering each chunk (float32) and keeps h <- exp(cum_last) h + sum_u exp(cum_last-cum_u) dt'_u
   x_u B_u^T in float32 registers (one tl.dot per chunk); the last h is the final state.
3. `_out_kernel`: per (batch, chunk, head, block of rows): y_t = exp(cum_t) C_t h_in +
   sum_{u<=t} (C_t.B_u) exp(cum_t-cum_u) dt'_u x_u + D x_t, then * silu(z_t).
With seq_idx a token only sees tokens of its own sequence; the state entering chunk 0 belongs to
sequence 0 (see naive.py). Inputs are read in place when each (batch, token) row is a contiguous
(heads, dim) block (row_layout); offsets of rows are int64.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.ssd import shared_memory

# Tile knobs (benchmarks/ssd.py --sweep times alternatives): output rows per program, the
# P/N tile of the sequential state pass, the blocks of the CB (and backward dCB) programs.
OUT_BLOCK_M = 64
STATE_BLOCK = 64
PAIR_BLOCK_M = 64


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Per-chunk states are kept in the inputs' 16-bit type (the dots read them in it anyway);
    the running state is always accumulated in float32."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs get exact fp32 dots (tf32 would cost ~1e-3 relative)."""
    return "ieee" if dtype == torch.float32 else "default"


def needs_upcast(dtype: torch.dtype) -> bool:
    """Triton's CPU interpreter multiplies bfloat16 dots wrongly (3.9); there we upcast them."""
    return dtype == torch.bfloat16 and triton_interpreter_on()


@triton.jit
def mm(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with float32 accumulation (see needs_upcast for UPCAST)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if PREC == "ieee":
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


# Triton >= 3.4 (triton-lang/triton PR #6261) can keep an autotuner's timings in its cache
# directory beside the binaries, so a later process (and a fleet sharing TRITON_CACHE_DIR, see
# `fastpath warmup`) loads the decision instead of compiling and timing every config again.
_KEEP_DECISIONS = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def light_autotune(key: list[str], loop: bool = False, prune: Callable | None = None):
    """A few warp/stage configs timed once per shape on a compiled device, the decision kept in
    Triton's cache where Triton can; the plain kernel under the interpreter (nothing to time
    there). Safe to re-run: the kernels only overwrite their outputs. `loop`: the kernel streams
    a loop, so deeper pipelining is worth a try. `prune`: an early_config_prune
    (shared_memory.prune: configs past the device's shared memory are not tried)."""
    stages = (2, 3) if loop else (1, 2)
    configs = [triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in stages]
    by = {"prune_configs_by": {"early_config_prune": prune}} if prune is not None else {}

    def wrap(fn):
        if triton_interpreter_on():
            return fn
        return triton.autotune(configs=configs, key=key, **_KEEP_DECISIONS, **by)(fn)

    return wrap


@triton.jit
def _dt_kernel(
    dt_ptr, A_ptr, bias_ptr, dtp_ptr, cum_ptr,
    L, H, NC, Q, dt_min, dt_max,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr,
    BQ: tl.constexpr, BH: tl.constexpr,
):
    pid_bc = tl.program_id(0)
    b = pid_bc // NC
    c = pid_bc % NC
    offs_h = tl.program_id(1) * BH + tl.arange(0, BH)
    offs_t = tl.arange(0, BQ)
    tok = c * Q + offs_t
    valid = (offs_t < Q) & (tok < L)
    hmask = offs_h < H
    m = valid[:, None] & hmask[None, :]
    row = b.to(tl.int64) * L + tok
    dt = tl.load(dt_ptr + row[:, None] * H + offs_h[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + offs_h, mask=hmask, other=0.0).to(tl.float32)[None, :]
    if SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(dt, 20.0))), dt)
    if HAS_LIMIT:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    dt = tl.where(m, dt, 0.0)
    a = tl.load(A_ptr + offs_h, mask=hmask, other=0.0).to(tl.float32)
    cum = tl.cumsum((dt * a[None, :]).to(cum_ptr.dtype.element_ty), axis=0)
    out = (b.to(tl.int64) * H + offs_h[None, :]) * (NC * Q) + (c * Q + offs_t)[:, None]
    sm = (offs_t < Q)[:, None] & hmask[None, :]
    tl.store(dtp_ptr + out, dt, mask=sm)
    tl.store(cum_ptr + out, cum, mask=sm)


@triton.jit
def _chunk_bounds(seq_ptr, b, c, L, Q, offs_t, HAS_SEQ: tl.constexpr):
    """Token validity and the seq_idx masks of chunk c: (valid, seq_t, seq_last, seq_prev)."""
    tok = c * Q + offs_t
    valid = (offs_t < Q) & (tok < L)
    n_valid = tl.minimum(Q, L - c * Q)
    if HAS_SEQ:
        base = seq_ptr + b.to(tl.int64) * L
        seq_t = tl.load(base + tok, mask=valid, other=-1)
        seq_last = tl.load(base + c * Q + n_valid - 1)
        seq_prev = tl.load(base + c * Q - 1, mask=c > 0, other=0)
    else:
        seq_t = tl.where(valid, 0, -1)
        seq_last = 0
        seq_prev = 0
    return valid, n_valid, seq_t, seq_last, seq_prev


@triton.jit
def _decay(hi, lo, keep):
    """exp(hi - lo) where keep, else 0, in float32. hi and lo are cumulative log-decays, float64
    for float32 inputs (see cum_dtype): the difference is taken before rounding to float32."""
    return tl.exp(tl.where(keep, (hi - lo).to(tl.float32), -float("inf")))


@triton.jit
def _carry(seq_last, seq_prev, cum_last, HAS_SEQ: tl.constexpr):
    """Decay of the state across a whole chunk; zero when a new sequence starts inside it."""
    if HAS_SEQ:
        return tl.where(seq_last == seq_prev, tl.exp(cum_last.to(tl.float32)), 0.0)
    return tl.exp(cum_last.to(tl.float32))


@triton.jit
def _state_tile(H, G, P, N, BP: tl.constexpr, BN: tl.constexpr):
    """The (P, N) tile and (batch, head) of a sequential state-pass program (forward states and
    backward dstates): (offs_p, offs_n, b, h, g, pn_mask, pn_off, bh)."""
    n_nb = tl.cdiv(N, BN)
    pid_pn = tl.program_id(0)
    offs_p = (pid_pn // n_nb) * BP + tl.arange(0, BP)
    offs_n = (pid_pn % n_nb) * BN + tl.arange(0, BN)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // (H // G)
    pn_mask = (offs_p[:, None] < P) & (offs_n[None, :] < N)
    pn_off = offs_p[:, None] * N + offs_n[None, :]
    return offs_p, offs_n, b, h, g, pn_mask, pn_off, b.to(tl.int64) * H + h


@triton.jit
def _start_tile(ptr, bh, P, N, pn_off, pn_mask, HAS: tl.constexpr, BP: tl.constexpr,
                BN: tl.constexpr):
    """The float32 state a pass starts from: the given one, or zeros."""
    if HAS:
        return tl.load(ptr + bh * P * N + pn_off, mask=pn_mask, other=0.0).to(tl.float32)
    return tl.zeros((BP, BN), dtype=tl.float32)


@triton.jit
def _chunk_rows(head_ptr, group_ptr, rows, valid, SH, SG, h, g, P, N, offs_p, offs_n):
    """One chunk's rows of a per-head tensor (x or dy: BQ x BP) and of a per-group one (B or C:
    BQ x BN), zero where the token is not valid."""
    head = tl.load(head_ptr + rows[:, None] * SH + h * P + offs_p[None, :],
                   mask=valid[:, None] & (offs_p[None, :] < P), other=0.0)
    group = tl.load(group_ptr + rows[:, None] * SG + g * N + offs_n[None, :],
                    mask=valid[:, None] & (offs_n[None, :] < N), other=0.0)
    return head, group


@light_autotune(["Q", "P", "N", "BP", "BN"], loop=True,
                prune=shared_memory.prune(shared_memory.state_pass_estimate))
@triton.jit
def _states_kernel(
    x_ptr, B_ptr, dtp_ptr, cum_ptr, seq_ptr, init_ptr, states_ptr, final_ptr,
    L, H, G, P, N, NC, Q, SX, SB,
    HAS_SEQ: tl.constexpr, HAS_INIT: tl.constexpr, STORE_STATES: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
    BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    offs_p, offs_n, b, h, g, pn_mask, pn_off, bh = _state_tile(H, G, P, N, BP, BN)
    state = _start_tile(init_ptr, bh, P, N, pn_off, pn_mask, HAS_INIT, BP, BN)
    offs_t = tl.arange(0, BQ)
    for c in range(NC):
        valid, n_valid, seq_t, seq_last, seq_prev = _chunk_bounds(
            seq_ptr, b, c, L, Q, offs_t, HAS_SEQ
        )
        if STORE_STATES:
            st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
            tl.store(states_ptr + st_off + pn_off, state.to(states_ptr.dtype.element_ty),
                     mask=pn_mask)
        cbase = bh * NC * Q + c * Q
        dtp = tl.load(dtp_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum = tl.load(cum_ptr + cbase + offs_t, mask=valid, other=0.0)
        cum_last = tl.load(cum_ptr + cbase + n_valid - 1)
        keep = valid & (seq_t == seq_last)
        w = _decay(cum_last, cum, keep) * dtp
        rows = b.to(tl.int64) * L + c * Q + offs_t
        x, Bt = _chunk_rows(x_ptr, B_ptr, rows, valid, SX, SB, h, g, P, N, offs_p, offs_n)
        xw = (x.to(tl.float32) * w[:, None]).to(x.dtype)
        gate = _carry(seq_last, seq_prev, cum_last, HAS_SEQ)
        state = state * gate + mm(tl.trans(xw), Bt, PREC, UPCAST)
    tl.store(final_ptr + bh * P * N + pn_off, state, mask=pn_mask)


@triton.jit
def _pair_block(G, NC, Q, BM: tl.constexpr):
    """A (row block t, column block u) program of one chunk and group (CB, dCB):
    (b, c, g, mt, mu, offs_t, offs_u)."""
    n_m = tl.cdiv(Q, BM)
    mt = tl.program_id(0) // n_m
    mu = tl.program_id(0) % n_m
    pid = tl.program_id(1)
    g = pid % G
    b = (pid // G) // NC
    c = (pid // G) % NC
    return b, c, g, mt, mu, mt * BM + tl.arange(0, BM), mu * BM + tl.arange(0, BM)


@light_autotune(["Q", "N", "BM"])
@triton.jit
def _cb_kernel(
    B_ptr, C_ptr, cb_ptr, L, G, N, NC, Q, SB, SC,
    PREC: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):
    """CB[b, c, g, t, u] = C_t . B_u (float32) for one BM x BM block of chunk c; padding rows
    and columns come out 0. Blocks above the diagonal are computed too (never read)."""
    b, c, g, _, _, offs_t, offs_u = _pair_block(G, NC, Q, BM)
    offs_n = tl.arange(0, BN)
    n_ok = offs_n[None, :] < N
    valid_t = (offs_t < Q) & (c * Q + offs_t < L)
    valid_u = (offs_u < Q) & (c * Q + offs_u < L)
    rows_t = b.to(tl.int64) * L + c * Q + offs_t
    rows_u = b.to(tl.int64) * L + c * Q + offs_u
    Ct = tl.load(C_ptr + rows_t[:, None] * SC + g * N + offs_n[None, :],
                 mask=valid_t[:, None] & n_ok, other=0.0)
    Bu = tl.load(B_ptr + rows_u[:, None] * SB + g * N + offs_n[None, :],
                 mask=valid_u[:, None] & n_ok, other=0.0)
    cb = mm(Ct, tl.trans(Bu), PREC, UPCAST)
    base = ((b.to(tl.int64) * NC + c) * G + g) * Q * Q
    tl.store(cb_ptr + base + offs_t[:, None] * Q + offs_u[None, :], cb,
             mask=(offs_t[:, None] < Q) & (offs_u[None, :] < Q))


@triton.jit
def _head_block(L, H, G, NC, Q, BM: tl.constexpr):
    """A per-head row-block program, the head the fastest launch axis (a group's heads run side
    by side and share its CB, B and C tiles in L2): (b, c, h, g, m, offs_m, CB block offset,
    offset of the chunk in the (B, H, NC*Q) dt'/cum layout, token rows of the block)."""
    h = tl.program_id(0)
    pid = tl.program_id(1)
    n_m = tl.cdiv(Q, BM)
    m = pid % n_m
    b = (pid // n_m) // NC
    c = (pid // n_m) % NC
    g = h // (H // G)
    offs_m = m * BM + tl.arange(0, BM)
    cbb = ((b.to(tl.int64) * NC + c) * G + g) * Q * Q
    cbase = (b.to(tl.int64) * H + h) * NC * Q + c * Q
    return b, c, h, g, m, offs_m, cbb, cbase, b.to(tl.int64) * L + c * Q + offs_m


@light_autotune(["Q", "P", "N", "BM"])
@triton.jit
def _out_kernel(
    x_ptr, C_ptr, cb_ptr, z_ptr, D_ptr, dtp_ptr, cum_ptr, seq_ptr, states_ptr, out_ptr,
    L, H, G, P, N, NC, Q, SX, SC, SZ,
    HAS_SEQ: tl.constexpr, HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr,
    HAS_Z: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BM: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
):
    """One program: BM output rows of one chunk and head; the causal sum walks the chunk's
    column blocks up to the diagonal (small tiles keep everything in registers), reading the
    group's CB. The head is the fastest launch axis: a group's heads share CB and C in L2."""
    b, c, h, g, m, offs_m, cbb, cbase, rows_m = _head_block(L, H, G, NC, Q, BM)
    valid_m, _, seq_m, _, seq_prev = _chunk_bounds(seq_ptr, b, c, L, Q, offs_m, HAS_SEQ)
    cum_m = tl.load(cum_ptr + cbase + offs_m, mask=valid_m, other=0.0)
    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, BN)
    n_ok = offs_n[None, :] < N
    p_ok = offs_p[None, :] < P
    Cm = tl.load(C_ptr + rows_m[:, None] * SC + g * N + offs_n[None, :],
                 mask=valid_m[:, None] & n_ok, other=0.0)
    y = tl.zeros((BM, BP), dtype=tl.float32)
    for kb in range(0, (m + 1) * BM, BM):
        offs_k = kb + tl.arange(0, BM)
        valid_k, _, seq_k, _, _ = _chunk_bounds(seq_ptr, b, c, L, Q, offs_k, HAS_SEQ)
        dtp_k = tl.load(dtp_ptr + cbase + offs_k, mask=valid_k, other=0.0)
        cum_k = tl.load(cum_ptr + cbase + offs_k, mask=valid_k, other=0.0)
        rows_k = b.to(tl.int64) * L + c * Q + offs_k
        xk = tl.load(x_ptr + rows_k[:, None] * SX + h * P + offs_p[None, :],
                     mask=valid_k[:, None] & p_ok, other=0.0)
        cb = tl.load(cb_ptr + cbb + offs_m[:, None] * Q + offs_k[None, :],
                     mask=(offs_m[:, None] < Q) & (offs_k[None, :] < Q), other=0.0)
        pair = (offs_m[:, None] >= offs_k[None, :]) & (seq_m[:, None] == seq_k[None, :])
        pair = pair & valid_m[:, None] & valid_k[None, :]
        decay = _decay(cum_m[:, None], cum_k[None, :], pair)
        y += mm((cb * decay * dtp_k[None, :]).to(xk.dtype), xk, PREC, UPCAST)
    # inter-chunk: exp(cum_t) C_t h_in for tokens of the sequence that entered the chunk
    st_off = ((b.to(tl.int64) * NC + c) * H + h) * P * N
    h_in = tl.load(states_ptr + st_off + offs_p[:, None] * N + offs_n[None, :],
                   mask=(offs_p[:, None] < P) & n_ok, other=0.0)
    inter = mm(Cm, tl.trans(h_in.to(Cm.dtype)), PREC, UPCAST)
    prev_ok = valid_m & (seq_m == seq_prev)
    y += inter * _decay(cum_m, 0.0, prev_ok)[:, None]
    hp = h * P + offs_p[None, :]
    mp = valid_m[:, None] & p_ok
    if HAS_D:
        xm = tl.load(x_ptr + rows_m[:, None] * SX + hp, mask=mp, other=0.0).to(tl.float32)
        if D_PER_CHANNEL:
            d = tl.load(D_ptr + h * P + offs_p, mask=offs_p < P, other=0.0).to(tl.float32)
            y += xm * d[None, :]
        else:
            y += xm * tl.load(D_ptr + h).to(tl.float32)
    if HAS_Z:
        zz = tl.load(z_ptr + rows_m[:, None] * SZ + hp, mask=mp, other=0.0).to(tl.float32)
        y = y * zz * tl.sigmoid(zz)
    tl.store(out_ptr + rows_m[:, None] * (H * P) + hp, y.to(out_ptr.dtype.element_ty), mask=mp)


# ---------------------------------------------------------------- launchers
def cum_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 cumulative log-decays for float32 inputs: the kernels take exp(cum_t - cum_u), and
    a float32 running sum of a chunk's A dt' (hundreds in magnitude at chunk 256 with strong
    decays) keeps only ~1e-5 of that difference; in float64 it is exact to float32's rounding.
    16-bit inputs keep float32 sums (their own rounding is far coarser)."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def prepare_dt(dt: Tensor, A: Tensor, dt_bias: Tensor | None, chunk_size: int, dt_softplus: bool,
               dt_limit: tuple[float, float], cum_type: torch.dtype = torch.float32,
               ) -> tuple[Tensor, Tensor]:
    """(dt' float32, cum in cum_type), both (B, H, NC*Q)."""
    batch, seqlen, nheads = dt.shape
    nchunks = triton.cdiv(seqlen, chunk_size)
    dtp = torch.empty((batch, nheads, nchunks * chunk_size), device=dt.device,
                      dtype=torch.float32)
    cum = torch.empty_like(dtp, dtype=cum_type)
    has_limit = tuple(dt_limit) != (0.0, math.inf)
    bh = min(16, pow2(nheads, 1))
    grid = (batch * nchunks, triton.cdiv(nheads, bh))
    _dt_kernel[grid](
        dt.contiguous(), A.contiguous(), dt_bias.contiguous() if dt_bias is not None else dt,
        dtp, cum, seqlen, nheads, nchunks, chunk_size,
        float(dt_limit[0]), float(dt_limit[1]),
        HAS_BIAS=dt_bias is not None, SOFTPLUS=dt_softplus, HAS_LIMIT=has_limit,
        BQ=pow2(chunk_size), BH=bh,
    )
    return dtp, cum


def chunk_states(x: Tensor, B: Tensor, dtp: Tensor, cum: Tensor, seq_idx: Tensor | None,
                 initial_states: Tensor | None, chunk_size: int,
                 store_states: bool = True) -> tuple[Tensor, Tensor]:
    """States entering each chunk (B, NC, H, P, N; state_dtype) and the final state
    (B, H, P, N, float32)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2:]
    nchunks = triton.cdiv(seqlen, chunk_size)
    states = torch.empty(
        (batch, nchunks, nheads, headdim, dstate) if store_states else (0,),
        device=x.device, dtype=state_dtype(x.dtype),
    )
    final = torch.empty((batch, nheads, headdim, dstate), device=x.device, dtype=torch.float32)
    bp, bn = min(pow2(headdim), STATE_BLOCK), min(pow2(dstate), STATE_BLOCK)
    bp, bn = shared_memory.state_tile(x.device, x.dtype, pow2(chunk_size), bp, bn)
    grid = (triton.cdiv(headdim, bp) * triton.cdiv(dstate, bn), batch * nheads)
    _states_kernel[grid](
        x, B, dtp, cum, seq_idx if seq_idx is not None else dtp,
        initial_states.contiguous() if initial_states is not None else dtp, states, final,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size, x.stride(1), B.stride(1),
        HAS_SEQ=seq_idx is not None, HAS_INIT=initial_states is not None,
        STORE_STATES=store_states, PREC=dot_precision(x.dtype), UPCAST=needs_upcast(x.dtype),
        BQ=pow2(chunk_size), BP=bp, BN=bn,
    )
    return states, final


def chunk_cb(B: Tensor, C: Tensor, chunk_size: int) -> Tensor:
    """CB = C B^T within each chunk, per group: (B, NC, G, Q, Q) float32."""
    batch, seqlen, ngroups, dstate = B.shape
    nchunks = triton.cdiv(seqlen, chunk_size)
    cb = torch.empty((batch, nchunks, ngroups, chunk_size, chunk_size), device=B.device,
                     dtype=torch.float32)
    bm = min(PAIR_BLOCK_M, pow2(chunk_size))
    _cb_kernel[(triton.cdiv(chunk_size, bm) ** 2, batch * nchunks * ngroups)](
        B, C, cb, seqlen, ngroups, dstate, nchunks, chunk_size, B.stride(1), C.stride(1),
        PREC=dot_precision(B.dtype), UPCAST=needs_upcast(B.dtype), BM=bm, BN=pow2(dstate),
    )
    return cb


def chunk_outputs(x: Tensor, B: Tensor, C: Tensor, z: Tensor | None, D: Tensor | None,
                  dtp: Tensor, cum: Tensor, seq_idx: Tensor | None, states: Tensor,
                  chunk_size: int, cb: Tensor | None = None) -> Tensor:
    """y per token and head; `cb` (chunk_cb) when the caller has it already."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2:]
    nchunks = triton.cdiv(seqlen, chunk_size)
    if cb is None:
        cb = chunk_cb(B, C, chunk_size)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    bm = min(OUT_BLOCK_M, pow2(chunk_size))
    grid = (nheads, batch * nchunks * triton.cdiv(chunk_size, bm))
    _out_kernel[grid](
        x, C, cb, z if z is not None else x, D.contiguous() if D is not None else x,
        dtp, cum, seq_idx if seq_idx is not None else dtp, states, out,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, chunk_size,
        x.stride(1), C.stride(1), z.stride(1) if z is not None else 0,
        HAS_SEQ=seq_idx is not None, HAS_D=D is not None,
        D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        PREC=dot_precision(x.dtype), UPCAST=needs_upcast(x.dtype),
        BM=bm, BP=pow2(headdim), BN=pow2(dstate),
    )
    return out


def row_layout(t: Tensor) -> Tensor:
    """t (batch, seqlen, K, D) as batch*seqlen rows, each a contiguous (K, D) block, one row
    stride apart (contiguous tensors and mamba's split-off views of xBC both are); else a copy.
    The kernels address element (row, k, d) as row * t.stride(1) + k * D + d."""
    batch, seqlen, k, d = t.shape
    s0, s1, s2, s3 = t.stride()
    if (s3 == 1 or d == 1) and (s2 == d or k == 1) and (batch == 1 or s0 == seqlen * s1):
        return t
    return t.contiguous()


def contiguous_inputs(x, B, C, z, seq_idx):
    """The kernels' layout: x/B/C/z in row_layout (no copy for contiguous tensors or views
    split off a wider last axis), int32 seq_idx; B and C take x's dtype so the tensor-core
    dots see one input type."""
    x = row_layout(x)
    B = row_layout(B.to(x.dtype))
    C = row_layout(C.to(x.dtype))
    z = row_layout(z) if z is not None else None
    seq_idx = seq_idx.to(torch.int32).contiguous() if seq_idx is not None else None
    return x, B, C, z, seq_idx


def ssd_scan_fwd_triton(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, chunk_size,
                        dt_softplus, dt_limit):
    """(out, final_states float32)."""
    x, B, C, z, seq_idx = contiguous_inputs(x, B, C, z, seq_idx)
    dtp, cum = prepare_dt(dt, A, dt_bias, chunk_size, dt_softplus, dt_limit, cum_dtype(x.dtype))
    states, final = chunk_states(x, B, dtp, cum, seq_idx, initial_states, chunk_size)
    out = chunk_outputs(x, B, C, z, D, dtp, cum, seq_idx, states, chunk_size)
    return out, final
