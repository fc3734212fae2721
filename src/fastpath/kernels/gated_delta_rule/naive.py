"""The gated delta rule token by token: the spec the dqkwg route and its tests are checked against."""

from __future__ import annotations

import torch


def gated_delta_rule_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor, beta: torch.Tensor,
                               scale: float | None = None) -> torch.Tensor:
    """Token-by-token gated delta rule in the inputs' dtype: the spec that checks use.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g (natural-log decay), beta: [B, T, HV]; value head i
    reads q/k head i // (HV // H). Per step: S *= exp(g_t); S += k_t (beta_t (v_t - S^T k_t))^T;
    o_t = scale * S^T q_t. Differentiable (autograd), zero initial state, returns [B, T, HV, V].
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if scale is None:
        scale = K ** -0.5
    G = HV // H
    q = q.repeat_interleave(G, dim=2)
    k = k.repeat_interleave(G, dim=2)
    state = q.new_zeros(B, HV, K, V)
    outs = []
    for t in range(T):
        state = state * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        err = v[:, t] - torch.einsum("bhkv,bhk->bhv", state, kt)
        state = state + kt[..., None] * (beta[:, t, :, None] * err)[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]) * scale)
    return torch.stack(outs, 1)
