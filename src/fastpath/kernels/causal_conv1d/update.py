"""Triton decode update of causal conv1d: outputs for L new tokens and the in-place state shift.

One program owns (one batch row, BLOCK_D channels): it reads its W-1 history columns and the new
tokens, writes the outputs, then - after a barrier, because other threads of the same program
read the columns it overwrites - writes the new state (shifted window, or the circular-buffer
slots cache_seqlens % state_len). A negative conv_state_indices entry is a padding row: output 0,
state untouched. The wrapper stays thin: at decode the launch itself is most of the cost.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastpath.kernels.causal_conv1d.common import next_pow2, silu_fp32
from fastpath.kernels.compiled_launch import CachedLauncher


@triton.jit
def _causal_conv1d_update_kernel(
    X, STATE, WEIGHT, BIAS, OUT, CACHE_SEQLENS, STATE_IDX,
    L, D, S,
    stride_xb, stride_xd, stride_xl,
    stride_sb, stride_sd, stride_sl,
    stride_ob, stride_od, stride_ol,
    stride_wd, stride_wk,
    WIDTH: tl.constexpr,
    SILU: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CIRCULAR: tl.constexpr,
    HAS_IDX: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    row = pid_b
    md = mask_d[:, None]  # (BLOCK_D, 1): also carries "this row is not padding"
    if HAS_IDX:
        row = tl.load(STATE_IDX + pid_b).to(tl.int64)
        md = md & ((tl.zeros((1, 1), dtype=tl.int64) + row) >= 0)
        row = tl.maximum(row, 0)
    state_base = STATE + row * stride_sb + offs_d[:, None] * stride_sd
    x_base = X + pid_b * stride_xb + offs_d[:, None] * stride_xd
    out_base = OUT + pid_b * stride_ob + offs_d[:, None] * stride_od
    start = 0
    if CIRCULAR:
        start = tl.load(CACHE_SEQLENS + pid_b)
    bias_v = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias_v = tl.load(BIAS + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    out_mask = mask_d[:, None]

    # outputs: y[t] = sum_k w[k] * v[t - (W-1) + k]; v[p < 0] is history from the state
    for t0 in range(0, L, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        acc = tl.zeros((BLOCK_D, BLOCK_T), dtype=tl.float32) + bias_v[:, None]
        for k in tl.static_range(WIDTH):
            p = t - (WIDTH - 1) + k
            xv = tl.load(x_base + p[None, :] * stride_xl,
                         mask=out_mask & ((p >= 0) & (p < L))[None, :], other=0.0).to(tl.float32)
            if CIRCULAR:
                slot = ((start + p) % S + S) % S
            else:
                slot = S + p
            hv = tl.load(state_base + slot[None, :] * stride_sl,
                         mask=md & (p < 0)[None, :], other=0.0).to(tl.float32)
            wk = tl.load(WEIGHT + offs_d * stride_wd + k * stride_wk, mask=mask_d,
                         other=0.0).to(tl.float32)
            acc += (xv + hv) * wk[:, None]
        if SILU:
            acc = silu_fp32(acc)
        acc = tl.where(md, acc, 0.0)  # padding rows: output 0
        tl.store(out_base + t[None, :] * stride_ol, acc.to(OUT.dtype.element_ty),
                 mask=out_mask & (t < L)[None, :])

    if CIRCULAR:
        tl.debug_barrier()  # every history read above precedes the slot writes below
        first = tl.maximum(L - S, 0)  # a short buffer keeps only the last S tokens
        for t0 in range(first, L, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            keep = (t < L)[None, :]
            xv = tl.load(x_base + t[None, :] * stride_xl, mask=md & keep, other=0.0)
            slot = (start + t) % S
            tl.store(state_base + slot[None, :] * stride_sl, xv.to(STATE.dtype.element_ty),
                     mask=md & keep)
    else:
        # new_state[s] = joined[s + L], joined = state ++ x; walk s upwards so a chunk never
        # reads what an earlier chunk wrote (reads are at s + L >= s)
        for s0 in range(0, S, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            src = s + L
            from_state = src < S
            sv = tl.load(state_base + src[None, :] * stride_sl,
                         mask=md & (from_state & (s < S))[None, :], other=0.0)
            xv = tl.load(x_base + (src - S)[None, :] * stride_xl,
                         mask=md & ((~from_state) & (s < S))[None, :], other=0.0)
            new = tl.where(from_state[None, :], sv.to(tl.float32), xv.to(tl.float32))
            tl.debug_barrier()
            tl.store(state_base + s[None, :] * stride_sl, new.to(STATE.dtype.element_ty),
                     mask=md & (s < S)[None, :])


@triton.jit
def _causal_conv1d_update_step_kernel(
    X, STATE, WEIGHT, BIAS, OUT, STATE_IDX,
    D, S,
    stride_xb, stride_xd,
    stride_sb, stride_sd, stride_sl,
    stride_ob, stride_od,
    stride_wd, stride_wk,
    WIDTH: tl.constexpr,
    SILU: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_IDX: tl.constexpr,
    BLOCK_D: tl.constexpr,
    S_PAD: tl.constexpr,
):
    """One new token, shifting state (the transformers decode step): every load is issued
    before the first store, so a program makes one trip to memory."""
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    cols = tl.arange(0, S_PAD)
    row = pid_b
    md = mask_d[:, None]
    if HAS_IDX:
        row = tl.load(STATE_IDX + pid_b).to(tl.int64)
        md = md & ((tl.zeros((1, 1), dtype=tl.int64) + row) >= 0)
        row = tl.maximum(row, 0)
    state_rows = STATE + row * stride_sb + offs_d[:, None] * stride_sd
    # the state shifted left by one column, and the W-1 history columns read as one tile
    shifted = tl.load(state_rows + (cols + 1)[None, :] * stride_sl,
                      mask=md & ((cols + 1) < S)[None, :], other=0.0)
    hist_cols = S - (WIDTH - 1) + cols
    hist = tl.load(state_rows + hist_cols[None, :] * stride_sl,
                   mask=md & (cols < WIDTH - 1)[None, :], other=0.0).to(tl.float32)
    xv = tl.load(X + pid_b * stride_xb + offs_d * stride_xd, mask=mask_d, other=0.0)
    w_rows = WEIGHT + offs_d[:, None] * stride_wd
    w_hist = tl.load(w_rows + cols[None, :] * stride_wk,
                     mask=mask_d[:, None] & (cols < WIDTH - 1)[None, :], other=0.0).to(tl.float32)
    w_last = tl.load(WEIGHT + offs_d * stride_wd + (WIDTH - 1) * stride_wk, mask=mask_d,
                     other=0.0).to(tl.float32)
    acc = tl.sum(hist * w_hist, axis=1) + xv.to(tl.float32) * w_last
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    if SILU:
        acc = silu_fp32(acc)
    valid_d = tl.sum(md.to(tl.int32), axis=1) > 0
    acc = tl.where(valid_d, acc, 0.0)  # padding rows: output 0
    new = tl.where((cols == S - 1)[None, :], xv[:, None].to(tl.float32), shifted.to(tl.float32))
    tl.debug_barrier()  # all reads of this program's state rows precede the writes
    tl.store(OUT + pid_b * stride_ob + offs_d * stride_od, acc.to(OUT.dtype.element_ty),
             mask=mask_d)
    tl.store(state_rows + cols[None, :] * stride_sl, new.to(STATE.dtype.element_ty),
             mask=md & (cols < S)[None, :])


def update_config(dim: int, seqlen: int, state_len: int) -> dict:
    block_t = min(16, next_pow2(seqlen))
    block_s = min(16, next_pow2(state_len))
    return {"BLOCK_D": min(256, next_pow2(dim)), "BLOCK_T": block_t, "BLOCK_S": block_s,
            "num_warps": 4}


_CONFIGS: dict[tuple[int, int, int], dict] = {}


def causal_conv1d_update_triton(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    cache_seqlens: torch.Tensor | None,
    conv_state_indices: torch.Tensor | None,
    config: dict | None = None,
) -> torch.Tensor:
    """x (B, D, L) -> out (B, D, L); conv_state updated in place."""
    batch, dim, seqlen = x.shape
    state_len = conv_state.shape[-1]
    out = torch.empty_like(x)
    if out.numel() == 0:
        return out
    if seqlen == 1 and cache_seqlens is None and state_len <= 16 and config is None:
        return _update_step(x, conv_state, weight, bias, silu, conv_state_indices, out)
    if config is None:
        key = (dim, seqlen, state_len)
        config = _CONFIGS.get(key)
        if config is None:
            config = _CONFIGS[key] = update_config(dim, seqlen, state_len)
    cfg = dict(config)
    block_d = cfg.pop("BLOCK_D")
    grid = (triton.cdiv(dim, block_d), batch)
    _causal_conv1d_update_kernel[grid](
        x, conv_state, weight, bias if bias is not None else weight, out,
        cache_seqlens if cache_seqlens is not None else x,
        conv_state_indices if conv_state_indices is not None else x,
        seqlen, dim, state_len,
        x.stride(0), x.stride(1), x.stride(2),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        weight.stride(0), weight.stride(1),
        WIDTH=weight.shape[-1],
        SILU=silu,
        HAS_BIAS=bias is not None,
        CIRCULAR=cache_seqlens is not None,
        HAS_IDX=conv_state_indices is not None,
        BLOCK_D=block_d,
        **cfg,
    )
    return out


# H200 sweep (2026-12-02): 128 channels / 1 warp and 512 / 4 both ~6.6 us at B=64, D=10240
_STEP_BLOCK_D = 128
_STEP_WARPS = 1


def _update_step(x, conv_state, weight, bias, silu, conv_state_indices, out):
    """Launch the one-token kernel (the decode hot path: keep this thin)."""
    batch, dim, _ = x.shape
    xs = x.stride()
    ss = conv_state.stride()
    os_ = out.stride()
    ws = weight.stride()
    state_len = conv_state.shape[2]
    _STEP_LAUNCH(
        (triton.cdiv(dim, _STEP_BLOCK_D), batch, 1),
        (x, conv_state, weight, weight if bias is None else bias, out,
         x if conv_state_indices is None else conv_state_indices,
         dim, state_len, xs[0], xs[1], ss[0], ss[1], ss[2], os_[0], os_[1], ws[0], ws[1]),
        (weight.shape[1], silu, bias is not None, conv_state_indices is not None,
         _STEP_BLOCK_D, _S_PAD[state_len] if state_len < 17 else 32),
        _STEP_WARPS,
    )
    return out


_STEP_LAUNCH = CachedLauncher(
    _causal_conv1d_update_step_kernel,
    ("WIDTH", "SILU", "HAS_BIAS", "HAS_IDX", "BLOCK_D", "S_PAD"),
)
_S_PAD = [next_pow2(n) for n in range(17)]
