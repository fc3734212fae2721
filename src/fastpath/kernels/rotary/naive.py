"""The spec of partial rotate-half RoPE, forward and backward, in a chosen float precision.

transformers models/qwen3_5/modeling_qwen3_5.py `apply_rotary_pos_emb` (unsqueeze_dim=1):
R = cos.shape[-1]; out[..., :R] = x[..., :R] * cos + rotate_half(x[..., :R]) * sin with
rotate_half(v) = cat(-v[..., R/2:], v[..., :R/2]); out[..., R:] = x[..., R:]. The backward is the
transpose: dx[..., :R] = dout * cos + rotate_half^T(dout * sin), rotate_half^T(u) =
cat(u[..., R/2:], -u[..., :R/2]); dx[..., R:] = dout[..., R:]. x, dout: (B, H, L, D); cos, sin:
(B, L, R), the same for every head. Tests call these in float64 (the oracle); the op calls them in
float32 where its Triton kernel cannot run (the fallback).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _rotate_half(v: Tensor) -> Tensor:
    half = v.shape[-1] // 2
    return torch.cat((-v[..., half:], v[..., :half]), dim=-1)


def _rotate_half_t(u: Tensor) -> Tensor:
    half = u.shape[-1] // 2
    return torch.cat((u[..., half:], -u[..., :half]), dim=-1)


def rotary_ref(x: Tensor, cos: Tensor, sin: Tensor, compute: torch.dtype = torch.float64) -> Tensor:
    r = cos.shape[-1]
    c, s = cos.to(compute).unsqueeze(1), sin.to(compute).unsqueeze(1)
    xc = x.to(compute)
    rot = xc[..., :r] * c + _rotate_half(xc[..., :r]) * s
    return torch.cat((rot, xc[..., r:]), dim=-1)


def rotary_bwd_ref(dout: Tensor, cos: Tensor, sin: Tensor, compute: torch.dtype = torch.float64) -> Tensor:
    r = cos.shape[-1]
    c, s = cos.to(compute).unsqueeze(1), sin.to(compute).unsqueeze(1)
    d = dout.to(compute)
    rot = d[..., :r] * c + _rotate_half_t(d[..., :r] * s)
    return torch.cat((rot, d[..., r:]), dim=-1)
