"""Float reference for causal depthwise conv1d: the spec the Triton kernels are tested against.

Semantics follow Dao-AILab causal-conv1d 1.7.0 (its `*_ref` functions are the spec): output
y[b, d, t] = act(bias[d] + sum_k w[d, k] * x[b, d, t - (W-1) + k]); positions before 0 read the
initial state (or zeros); with seq_idx a term counts only if its position has the same seq_idx
as t (the initial state belongs to seq_idx[b, 0]) and seq_idx[b, t] < 0 (padding) gives 0.
Arithmetic is float32 (float64 when any input is float64), cast back to x's dtype at the end.
Written from the documented behaviour, not copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu", "swish")


def check_activation(activation: str | None) -> bool:
    """Return True for SiLU; raise the same error class Dao raises for anything unknown."""
    if activation not in ACTIVATIONS:
        raise NotImplementedError("activation must be None, silu, or swish")
    return activation is not None


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _history(
    x: torch.Tensor, width: int, initial_states: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """x with its W-1 predecessors in front: (B, D, W-1+L)."""
    batch, dim, _ = x.shape
    if initial_states is None:
        front = x.new_zeros((batch, dim, width - 1), dtype=dtype)
    else:
        front = initial_states.to(dtype)
    return torch.cat([front, x.to(dtype)], dim=-1)


def _same_sequence(seq_idx: torch.Tensor, width: int, has_init: bool,
                   dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, L, W): 1 where tap k of output t reads the same sequence as t. The initial state
    belongs to seq_idx[:, 0]; without one, positions before 0 belong to none (-1)."""
    seq = seq_idx.to(torch.long)
    batch = seq.shape[0]
    if has_init:
        front = seq[:, :1].expand(batch, width - 1)
    else:
        front = seq.new_full((batch, width - 1), -1)
    windows = torch.cat([front, seq], dim=-1).unfold(-1, width, 1)  # (B, L, W)
    return (windows == seq.unsqueeze(-1)).to(dtype).unsqueeze(1)


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
    seq_idx: torch.Tensor | None = None,
):
    """Dao-compatible reference (same argument order as Dao's `causal_conv1d_ref`).

    x: (B, D, L); weight: (D, W); bias: (D,); initial_states / final states: (B, D, W-1);
    seq_idx: (B, L) int. Differentiable (autograd) so it also serves as the backward reference.
    """
    silu = check_activation(activation)
    if seq_idx is not None and return_final_states:
        raise NotImplementedError("seq_idx does not support return_final_states")
    dtype = _compute_dtype(x, weight, bias, initial_states)
    dim = x.shape[1]
    width = weight.shape[-1]
    hist = _history(x, width, initial_states, dtype)  # (B, D, W-1+L)
    windows = hist.unfold(-1, width, 1)  # (B, D, L, W): windows[..., t, k] = x[t-(W-1)+k]
    if seq_idx is not None:
        windows = windows * _same_sequence(seq_idx, width, initial_states is not None, dtype)
    out = (windows * weight.to(dtype).view(1, dim, 1, width)).sum(-1)
    if bias is not None:
        out = out + bias.to(dtype).view(1, dim, 1)
    if seq_idx is not None:
        out = out.masked_fill((seq_idx < 0).unsqueeze(1), 0.0)
    if silu:
        out = F.silu(out)
    out = out.to(x.dtype)
    if not return_final_states:
        return out
    final_states = hist[..., hist.shape[-1] - (width - 1) :].to(x.dtype)
    if final_states_out is not None:
        final_states_out.copy_(final_states)
        final_states = final_states_out
    return out, final_states


def causal_conv1d_bwd_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    dfinal_states: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gradients (dx, dweight, dbias, dinitial_states), written out by hand (no autograd: this
    runs inside a custom op, below the autograd dispatch key). Tests check it against autograd
    through `causal_conv1d_ref` in float64."""
    if dfinal_states is not None and seq_idx is not None:
        raise NotImplementedError("seq_idx does not support return_final_states")
    dtype = _compute_dtype(x, weight, bias, initial_states, dout)
    _, dim, seqlen = x.shape
    width = weight.shape[-1]
    w = weight.to(dtype)
    hist = _history(x, width, initial_states, dtype)
    windows = hist.unfold(-1, width, 1)  # (B, D, L, W)
    same = None
    if seq_idx is not None:
        same = _same_sequence(seq_idx, width, initial_states is not None, dtype)  # (B, 1, L, W)
        windows = windows * same
    g = dout.to(dtype)
    if silu:
        pre = (windows * w.view(1, dim, 1, width)).sum(-1)
        if bias is not None:
            pre = pre + bias.to(dtype).view(1, dim, 1)
        sig = torch.sigmoid(pre)
        g = g * sig * (1 + pre * (1 - sig))
    if seq_idx is not None:
        g = g.masked_fill((seq_idx < 0).unsqueeze(1), 0.0)
    dhist = torch.zeros_like(hist)
    for k in range(width):
        term = g * w[:, k].view(1, dim, 1)
        if same is not None:
            term = term * same[..., k]
        dhist[..., k : k + seqlen] += term
    if dfinal_states is not None:
        dhist[..., dhist.shape[-1] - (width - 1) :] += dfinal_states.to(dtype)
    dweight = (g.unsqueeze(-1) * windows).sum(dim=(0, 2)).to(weight.dtype)
    dbias = g.sum(dim=(0, 2)).to(bias.dtype) if bias is not None else None
    dx = dhist[..., width - 1 :].to(x.dtype)
    dinit = None
    if initial_states is not None:
        dinit = dhist[..., : width - 1].to(initial_states.dtype)
    return dx, dweight, dbias, dinit


def causal_conv1d_update_ref(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode step reference; updates conv_state in place (Dao's `causal_conv1d_update_ref`,
    plus conv_state_indices: rows gathered from a pool, negative index = padding row: output 0,
    state untouched). With cache_seqlens the state is a circular buffer written at
    cache_seqlens % state_len; when L > state_len only the last state_len tokens land."""
    silu = check_activation(activation)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    batch, dim, seqlen = x.shape
    width = weight.shape[-1]
    state_len = conv_state.shape[-1]
    dtype = _compute_dtype(x, weight, bias, conv_state)
    if conv_state_indices is not None:
        rows = conv_state_indices.to(torch.long)
        valid = rows >= 0
        state = conv_state[rows.clamp(min=0)]
    else:
        rows = None
        valid = torch.ones(batch, dtype=torch.bool, device=x.device)
        state = conv_state
    xs = x.to(dtype)
    if cache_seqlens is None:
        joined = torch.cat([state.to(dtype), xs], dim=-1)  # (B, D, S+L)
        window = joined[..., state_len - (width - 1) :]
        new_state = joined[..., seqlen:]
    else:
        start = cache_seqlens.to(torch.long).view(batch, 1)
        back = torch.arange(-(width - 1), 0, device=x.device).view(1, -1)
        hist_idx = torch.remainder(start + back, state_len).unsqueeze(1).expand(batch, dim, -1)
        window = torch.cat([state.to(dtype).gather(2, hist_idx), xs], dim=-1)
        keep = min(seqlen, state_len)  # later tokens overwrite earlier ones in a short buffer
        pos = torch.arange(seqlen - keep, seqlen, device=x.device).view(1, -1)
        put_idx = torch.remainder(start + pos, state_len).unsqueeze(1).expand(batch, dim, -1)
        new_state = state.to(dtype).scatter(2, put_idx, xs[..., seqlen - keep :])
    out = (window.unfold(-1, width, 1) * weight.to(dtype).view(1, dim, 1, width)).sum(-1)
    if bias is not None:
        out = out + bias.to(dtype).view(1, dim, 1)
    if silu:
        out = F.silu(out)
    out = out.masked_fill(~valid.view(batch, 1, 1), 0.0).to(x.dtype)
    new_state = new_state.to(conv_state.dtype)
    with torch.no_grad():
        if rows is None:
            conv_state.copy_(new_state)
        else:
            conv_state[rows[valid]] = new_state[valid]
    return out.squeeze(-1) if squeeze else out


def causal_conv1d_varlen_states_ref(
    x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int
) -> torch.Tensor:
    """Last `state_len` tokens of each packed sequence as (B, D, state_len), zero-filled in front
    when a sequence is shorter; x is (total_tokens, D)."""
    dim = x.shape[1]
    batch = cu_seqlens.shape[0] - 1
    states = x.new_zeros((batch, state_len, dim)).transpose(1, 2)
    bounds = cu_seqlens.tolist()
    for i in range(batch):
        end = bounds[i + 1]
        start = max(bounds[i], end - state_len)
        if end > start:
            states[i, :, state_len - (end - start) :] = x[start:end].T
    return states
