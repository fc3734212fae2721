"""Triton forward of Mamba-1's selective scan: a chunked parallel scan, our own kernel.

Algorithm. One program owns (one batch row, BLOCK_D channels of one B/C group) x all N states
and walks the sequence in chunks of T steps, carrying the state h (BLOCK_D, N) in float32
registers from chunk to chunk. Per chunk it loads u, delta, z as (BLOCK_D, T) tiles and B, C as
(N, T) tiles (the group's rows, read in place: never expanded to channels), and forms
  a_t = exp(delta'_t * A),   x_t = delta'_t * u_t * B_t                (BLOCK_D, N, T)
then runs tl.associative_scan along time with the first-order recurrence combine
  (a1, x1) o (a2, x2) = (a1 a2, a2 x1 + x2)
which gives, for every t of the chunk, (prod_{k<=t} a_k, the state reached from zero). The true
state is h_t = prod_{k<=t} a_k * h_in + that (one FMA), y_t = sum_n h_t C_t + D u_t, out_t =
y_t * silu(z_t) (stored in u's dtype), and h_in of the next chunk is h at the chunk's last step
(masked steps past L have delta' = 0, i.e. a = 1 and x = 0, so they carry h unchanged).

Numerics. delta' = softplus(delta + bias) in float32 (identity above 20, as mamba_ssm); every
product, the scan and the N-reduction are float32; exp is taken only of delta' * A <= 0 for the
usual negative A (never of a cumulative sum, so nothing overflows however long the sequence:
the chunk's running product of decays only shrinks). One exp per (t, d, n) state element, the
same count as a sequential loop, by exp_precise (~1 ulp, unbiased, on the FMA pipe: about a
dozen FMAs where the SFU's exp2 is one instruction): with exp2 of delta' * A * log2(e) the
float32 last state drifted 2-4x further from float64 than mamba_ssm's reference after a few
thousand steps (its test file, sequence lengths widened), since a decay's bias compounds.

Layouts. B and C are read in place, each in its own layout (bc_layout): time-varying
(batch, G, N, L) -- G = 1 for transformers' (batch, N, L) -- or time-invariant (dim, N), loaded once
per program as a (BLOCK_D, N) tile. A program's channels never straddle a group of B or of C
(programs are laid out over lcm(G_B, G_C) channel groups), so each loads one group's rows.

Memory. Reads u, delta, z once and B, C once per channel block; writes out once; nothing of size
(L, N) per channel is materialised. With SAVE_STATES (the backward's first phase) the state
entering each chunk is written, float32 (batch, n_chunks, dim, N): 1/T of the state traffic, and
the output is not written. Strides are taken as given (transformers passes transposed views).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.kernels.rounding import store_rounded

LOG2E = tl.constexpr(1.4426950408889634)  # a jit function may read only constexpr globals

# (BLOCK_D, T, num_warps): channels per program, chunk length, warps. BLOCK_D is clipped to the
# channels of one group; benchmarks/selective_scan.py --sweep times alternatives.
FWD_CONFIG = (8, 32, 4)  # a (8, 16, 32) fp32 tile: 32 values a thread per live tile
# Triton's CPU interpreter runs associative_scan (and tl.flip's xor reductions) element by
# element: there a short chunk keeps the padding of tiny test sequences cheap and the backward
# takes the interpreter's reverse scan (same kernel code; the tests run the flip variant
# explicitly, the GPU tests run the defaults).
INTERPRETER_CHUNK = 8


def default_config(config: tuple[int, ...]) -> tuple[int, ...]:
    if triton_interpreter_on():
        return (config[0], INTERPRETER_CHUNK, *config[2:3], *(False for _ in config[3:]))
    return config


LN2_HI = tl.constexpr(0.693145751953125)  # ln 2 with 12 trailing zero bits: j * LN2_HI is exact
LN2_LO = tl.constexpr(1.4286068203094172e-06)  # ln 2 - LN2_HI
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: v + it rounds v to an integer (|v| < 2**22)
MAGIC_BITS = tl.constexpr(0x4B400000)  # its float32 bit pattern
LN2 = tl.constexpr(0.6931471805599453)
LOG2E_LO = tl.constexpr(1.92596298909109e-08)  # log2(e) - float32(LOG2E)


@triton.jit
def exp_precise(x):
    """e^x in float32 to ~1 ulp, on the FMA pipe: x = j ln2 + r (|r| <= ln2 / 2, Cody-Waite),
    e^r by its degree-7 Taylor polynomial (truncation < 6e-9 relative), j added to the exponent.
    exp2 of x * log2(e) (the SFU's ex2.approx, ~2 ulp, after rounding the product) is biased
    enough that a state decayed over thousands of steps drifts 2-4x further from float64 than
    the reference's exp does. Below -87 (e^x < 1.7e-38) it returns 0, above 88.72 inf; NaN stays."""
    xc = tl.minimum(tl.maximum(x, -87.0), 88.0)
    k = xc * LOG2E + ROUND_MAGIC
    j = k.to(tl.int32, bitcast=True) - MAGIC_BITS
    jf = k - ROUND_MAGIC
    r = xc - jf * LN2_HI
    r = r - jf * LN2_LO
    p = r * 1.984126984126984e-04 + 1.3888888888888889e-03
    p = p * r + 8.333333333333333e-03
    p = p * r + 4.1666666666666664e-02
    p = p * r + 1.6666666666666666e-01
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    y = (p.to(tl.int32, bitcast=True) + (j << 23)).to(tl.float32, bitcast=True)
    y = tl.where(x < -87.0, 0.0, tl.where(x > 88.72, float("inf"), y))
    return tl.where(x == x, y, x)


@triton.jit
def exp_split(x):
    """e^x as the SFU's exp2 of x log2(e) formed in two parts: th = x LOG2E rounded; tlo its
    rounding error plus x times LOG2E's own (two FMAs); e^x = 2^th (1 + tlo ln 2), the dropped
    terms ~1e-14 relative. A plain exp2 of a pre-rounded A log2(e) is off by up to 0.5 ulp of the
    exponent with the same sign at every step of a (channel, state): a bias that grows with the
    steps a state remembers (what the chunked kernel's exp_precise avoids in ~20 FMA-pipe
    instructions; this takes 4 beside the SFU's). Left: ex2.approx's own ~2 ulp. Past |th| = 256
    the correction is dropped (x = -inf gives 0, not NaN); NaN stays NaN."""
    th = x * LOG2E
    tlo = tl.fma(x, LOG2E_LO, tl.fma(x, LOG2E, -th))
    tlo = tl.where(tl.abs(th) < 256.0, tlo, 0.0)
    return tl.exp2(th) * tl.fma(tlo, LN2, 1.0)


@triton.jit
def softplus(v):
    """log(1 + e^v) in float32, within ~1 ulp like torch's log1p(exp(v)); identity above 20 (as
    mamba_ssm and torch's threshold). e^v by exp_precise: the SFU's exp2 of a rounded v * log2(e)
    left delta' 1-2 ulp further from float64 than torch's, and a float32 last state of mamba_ssm's
    tests ~2x further than the reference's. log1p(e) as log(u) + (e - (u - 1)) / u with u = 1 + e
    rounded: the second term puts back the bits of e that rounding u dropped (plain log(1 + e)
    loses e's low bits, relative error ~eps/e: 1e-3 at v = -10, where trained dt biases put
    delta); Triton's log is libdevice's (~1 ulp). A NaN stays NaN: the GPU's min(NaN, 20) is 20,
    which would turn a NaN delta into a finite 20."""
    e = exp_precise(tl.minimum(v, 20.0))
    u = 1.0 + e
    # exact for e <= 1 (Fast2Sum); above, u's rounding is below log(u)'s ulp and the term is noise
    dropped = e - (u - 1.0)
    out = tl.where(v > 20.0, v, tl.log(u) + dropped / u)
    return tl.where(v == v, out, v)


@triton.jit
def first_order(a1, x1, a2, x2):
    """Combine of h_t = a_t h_{t-1} + x_t: segment 1 then segment 2."""
    return a1 * a2, a2 * x1 + x2


@triton.jit
def load_delta(DELTA, DBIAS, row, offs_d, md, offs_t, mt, s_dd, s_dl,
               HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """delta' (BLOCK_D, T) float32, 0 where masked (a = 1, x = 0: an identity step)."""
    mask = md[:, None] & mt[None, :]
    dt = tl.load(DELTA + row + offs_d[:, None] * s_dd + offs_t[None, :] * s_dl, mask=mask,
                 other=0.0).to(tl.float32)
    if HAS_DBIAS:
        dt += tl.load(DBIAS + offs_d, mask=md, other=0.0).to(tl.float32)[:, None]
    if SOFTPLUS:
        dt = softplus(dt)
    return tl.where(mask, dt, 0.0)


@triton.jit
def channel_block(pid, dim_per_group, n_blocks, BLOCK_D: tl.constexpr):
    """(channel group, the block's channels, their mask) of program `pid` along the channel axis.
    Groups here are the programs' groups (bc_programs): no B or C group boundary inside one."""
    g = pid // n_blocks
    local = (pid % n_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    return g, g * dim_per_group + local, local < dim_per_group


@triton.jit
def bc_fixed(M, offs_d, offs_n, mdn, s_d, s_n, VAR: tl.constexpr):
    """A time-invariant B or C, (dim, N), as a (BLOCK_D, BLOCK_N, 1) float32 tile (0 where masked);
    a time-varying one needs nothing here (0.0, never read)."""
    if VAR:
        return 0.0
    else:
        return tl.load(M + offs_d[:, None] * s_d + offs_n[None, :] * s_n, mask=mdn,
                       other=0.0).to(tl.float32)[:, :, None]


@triton.jit
def bc_row(b, g, dim_per_group, dpg_M, s_b, s_g):
    """Element offset of batch row b, in a time-varying B or C, of the group that program
    group g's channels read (int64: b is)."""
    return b * s_b + ((g * dim_per_group) // dpg_M) * s_g


@triton.jit
def bc_tile(M, fixed, row, offs_n, offs_t, mnt, s_n, s_l, VAR: tl.constexpr):
    """B_t or C_t over the chunk as a tile broadcasting against (BLOCK_D, BLOCK_N, T): the
    group's (1, N, T) rows when time-varying, else the (BLOCK_D, N, 1) per-channel tile."""
    if VAR:
        return tl.load(M + row + offs_n[:, None] * s_n + offs_t[None, :] * s_l, mask=mnt,
                       other=0.0).to(tl.float32)[None, :, :]
    else:
        return fixed


@triton.jit
def _fwd_kernel(
    U, DELTA, A, B, C, D, Z, DBIAS, OUT, LAST, STATES,
    L, dim, N, dim_per_group, dpg_B, dpg_C, n_blocks, n_chunks,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_Bb, s_Bg, s_Bn, s_Bl, s_Cb, s_Cg, s_Cn, s_Cl,
    s_zb, s_zd, s_zl, s_ob, s_od, s_ol,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DBIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    SAVE_STATES: tl.constexpr, B_VAR: tl.constexpr, C_VAR: tl.constexpr, RNE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, T: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    g, offs_d, md = channel_block(tl.program_id(0), dim_per_group, n_blocks, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < N
    mdn = md[:, None] & mn[None, :]
    Af = tl.load(A + offs_d[:, None] * s_ad + offs_n[None, :] * s_an, mask=mdn,
                 other=0.0).to(tl.float32)
    if HAS_D:
        Dv = tl.load(D + offs_d, mask=md, other=0.0).to(tl.float32)
    # time-invariant B / C: one (BLOCK_D, N) tile each (s_Bg / s_Cg are their channel strides)
    Bfix = bc_fixed(B, offs_d, offs_n, mdn, s_Bg, s_Bn, B_VAR)
    Cfix = bc_fixed(C, offs_d, offs_n, mdn, s_Cg, s_Cn, C_VAR)
    B_row = bc_row(b, g, dim_per_group, dpg_B, s_Bb, s_Bg)
    C_row = bc_row(b, g, dim_per_group, dpg_C, s_Cb, s_Cg)
    h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    last = (tl.arange(0, T) == T - 1)[None, None, :]
    for c in range(n_chunks):
        offs_t = c * T + tl.arange(0, T)
        mt = offs_t < L
        mdt = md[:, None] & mt[None, :]
        mnt = mn[:, None] & mt[None, :]
        if SAVE_STATES:
            st = STATES + ((b * n_chunks + c) * dim + offs_d[:, None]) * N + offs_n[None, :]
            tl.store(st, h, mask=mdn)
        dt = load_delta(DELTA, DBIAS, b * s_db, offs_d, md, offs_t, mt, s_dd, s_dl,
                        HAS_DBIAS, SOFTPLUS)
        u = tl.load(U + b * s_ub + offs_d[:, None] * s_ud + offs_t[None, :] * s_ul, mask=mdt,
                    other=0.0).to(tl.float32)
        Bt = bc_tile(B, Bfix, B_row, offs_n, offs_t, mnt, s_Bn, s_Bl, B_VAR)
        a = exp_precise(dt[:, None, :] * Af[:, :, None])
        x = (dt * u)[:, None, :] * Bt
        acum, xs = tl.associative_scan((a, x), axis=2, combine_fn=first_order)
        hs = acum * h[:, :, None] + xs
        h = tl.sum(tl.where(last, hs, 0.0), axis=2)
        if not SAVE_STATES:
            Ct = bc_tile(C, Cfix, C_row, offs_n, offs_t, mnt, s_Cn, s_Cl, C_VAR)
            y = tl.sum(hs * Ct, axis=1)
            if HAS_D:
                y += Dv[:, None] * u
            if HAS_Z:
                zv = tl.load(Z + b * s_zb + offs_d[:, None] * s_zd + offs_t[None, :] * s_zl,
                             mask=mdt, other=0.0).to(tl.float32)
                y = y * zv * tl.sigmoid(zv)
            store_rounded(OUT + b * s_ob + offs_d[:, None] * s_od + offs_t[None, :] * s_ol, y,
                          mdt, RNE)
    if not SAVE_STATES:
        tl.store(LAST + (b * dim + offs_d[:, None]) * N + offs_n[None, :], h, mask=mdn)


class BCLayout(NamedTuple):
    """How the kernels read B or C: `variable` (batch, G, N, L) or time-invariant (dim, N);
    strides (batch, group, N, L), the group stride being the channel stride when invariant."""

    tensor: Tensor
    variable: bool
    groups: int
    strides: tuple[int, int, int, int]


def bc_layout(M: Tensor) -> BCLayout:
    """B or C as mamba_ssm accepts them: (dim, N), (batch, N, L) or (batch, G, N, L); no copy."""
    if M.dim() == 2:
        return BCLayout(M, False, 1, (0, M.stride(0), M.stride(1), 0))
    if M.dim() == 3:
        M = M.unsqueeze(1)
    return BCLayout(M, True, M.shape[1], tuple(M.stride()))


def bc_programs(dim: int, Bl: BCLayout, Cl: BCLayout, block_d: int) -> tuple[int, int, int]:
    """(program groups, channels per program group, BLOCK_D): programs tile lcm(G_B, G_C)
    channel groups so that no program straddles a group of B or of C."""
    groups = math.lcm(Bl.groups, Cl.groups)
    dim_per_group = dim // groups
    return groups, dim_per_group, blocking(dim_per_group, block_d)


def per_channel(t: Tensor | None) -> Tensor | None:
    """D or delta_bias (dim,) contiguous: the kernels read them at unit stride (a stride-0
    expand of one value, or a strided slice, is copied: dim elements)."""
    return None if t is None else t.contiguous()


def blocking(dim_per_group: int, block_d: int) -> int:
    """BLOCK_D no wider than a group's channels (a program never straddles two groups)."""
    return max(1, min(block_d, triton.next_power_of_2(dim_per_group)))


def launch_fwd(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
               z: Tensor | None, delta_bias: Tensor | None, delta_softplus: bool,
               out: Tensor | None, last: Tensor | None, states: Tensor | None,
               config: tuple[int, int, int]) -> None:
    """One forward launch: (out, last) written, or with `states` given only the chunk states."""
    batch, dim, length = u.shape
    Bl, Cl = bc_layout(B), bc_layout(C)
    nstate = A.shape[1]
    block_d, chunk, warps = config
    D, delta_bias = per_channel(D), per_channel(delta_bias)
    groups, dim_per_group, block_d = bc_programs(dim, Bl, Cl, block_d)
    n_blocks = triton.cdiv(dim_per_group, block_d)
    n_chunks = triton.cdiv(length, chunk)
    save = states is not None
    dummy = u
    o = out if out is not None else dummy
    os_ = o.stride() if out is not None else (0, 0, 0)
    zs = z.stride() if z is not None else (0, 0, 0)
    _fwd_kernel[(groups * n_blocks, batch)](
        u, delta, A, Bl.tensor, Cl.tensor, dummy if D is None else D, dummy if z is None else z,
        dummy if delta_bias is None else delta_bias, o,
        dummy if last is None else last, dummy if states is None else states,
        length, dim, nstate, dim_per_group, dim // Bl.groups, dim // Cl.groups, n_blocks,
        n_chunks,
        *u.stride(), *delta.stride(), *A.stride(), *Bl.strides, *Cl.strides, *zs, *os_,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DBIAS=delta_bias is not None,
        SOFTPLUS=bool(delta_softplus), SAVE_STATES=save, B_VAR=Bl.variable, C_VAR=Cl.variable,
        RNE=triton_interpreter_on(), BLOCK_D=block_d,
        BLOCK_N=triton.next_power_of_2(nstate), T=chunk, num_warps=warps,
    )


def selective_scan_fwd_triton(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                              D: Tensor | None, z: Tensor | None, delta_bias: Tensor | None,
                              delta_softplus: bool,
                              config: tuple[int, int, int] | None = None
                              ) -> tuple[Tensor, Tensor]:
    """(out in u's dtype, contiguous (batch, dim, L); last_state float32 (batch, dim, N)).
    B/C each (dim, N), (batch, N, L) or (batch, G, N, L), any strides (stride 0 included)."""
    batch, dim, _ = u.shape
    out = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    last = torch.empty((batch, dim, A.shape[1]), dtype=torch.float32, device=u.device)
    if out.numel():
        launch_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, out, last, None,
                   config or default_config(FWD_CONFIG))
    return out, last


def chunk_states(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                 delta_bias: Tensor | None, delta_softplus: bool, chunk: int,
                 config: tuple[int, int, int]) -> Tensor:
    """The float32 state entering each chunk of `chunk` steps: (batch, n_chunks, dim, N).
    C is not read; it is passed so the programs tile the channels as the backward's do."""
    batch, dim, length = u.shape
    n_chunks = triton.cdiv(length, chunk)
    states = torch.empty((batch, n_chunks, dim, A.shape[1]), dtype=torch.float32,
                         device=u.device)
    launch_fwd(u, delta, A, B, C, None, None, delta_bias, delta_softplus, None, None, states,
               (config[0], chunk, config[2]))
    return states
