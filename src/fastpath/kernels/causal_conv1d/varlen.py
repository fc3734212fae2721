"""Triton gather of each packed sequence's last `state_len` tokens into conv states.

x is (total_tokens, D); sequence b spans cu_seqlens[b]:cu_seqlens[b+1]. The state is
(B, D, state_len) with channel-last memory (B, state_len, D), zero where a sequence is shorter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastpath.kernels.causal_conv1d.common import next_pow2


@triton.jit
def _varlen_states_kernel(
    X, CU, STATES, D, S,
    stride_xt, stride_xd, stride_sb, stride_ss, stride_sd,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    end = tl.load(CU + pid_b + 1).to(tl.int64)
    begin = tl.maximum(tl.load(CU + pid_b).to(tl.int64), end - S)
    for s0 in range(0, S, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        tok = end - S + s
        in_state = s < S  # the last tile may reach past S: those rows would read past `end`
        v = tl.load(X + tok[:, None] * stride_xt + offs_d[None, :] * stride_xd,
                    mask=((tok >= begin) & in_state)[:, None] & mask_d[None, :], other=0.0)
        tl.store(STATES + pid_b * stride_sb + s[:, None] * stride_ss + offs_d[None, :] * stride_sd,
                 v, mask=in_state[:, None] & mask_d[None, :])


def causal_conv1d_varlen_states_triton(
    x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int
) -> torch.Tensor:
    dim = x.shape[1]
    batch = cu_seqlens.shape[0] - 1
    states = x.new_empty((batch, state_len, dim)).transpose(1, 2)
    if states.numel() == 0:
        return states
    cu = cu_seqlens.contiguous()
    block_d = min(256, next_pow2(dim))
    block_s = min(16, next_pow2(state_len))
    _varlen_states_kernel[(triton.cdiv(dim, block_d), batch)](
        x, cu, states, dim, state_len,
        x.stride(0), x.stride(1), states.stride(0), states.stride(2), states.stride(1),
        BLOCK_S=block_s, BLOCK_D=block_d,
    )
    return states
