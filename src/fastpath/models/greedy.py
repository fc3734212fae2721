"""Greedy decoding with a cache, written out step by step.

Why not `model.generate`: verify needs every step's logits from both paths, and bench needs to
time the single-token steps (where `causal_conv1d_update` runs) apart from the prefill,
without generate's per-step Python machinery in the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DecodeState:
    """What a cached model needs for its next single-token step."""

    cache: Any
    cache_kwarg: str  # "past_key_values" (most families) or "cache_params" (Mamba-style)
    position: int  # tokens already in the cache
    next_token: Any  # [B, 1] token ids to feed next
    logits: Any  # [B, V] fp32 logits that chose next_token


@dataclass
class GreedyRun:
    """N greedily chosen tokens per row and the fp32 logits each was chosen from."""

    tokens: Any  # [B, N] int64
    logits: list[Any] = field(default_factory=list)  # N x [B, V] float32


def _cache_of(output: Any) -> tuple[Any, str]:
    cache = getattr(output, "past_key_values", None)
    if cache is not None:
        return cache, "past_key_values"
    cache = getattr(output, "cache_params", None)
    if cache is not None:
        return cache, "cache_params"
    raise RuntimeError(f"{type(output).__name__} carries no cache; cannot decode with a cache")


def prefill(model: Any, input_ids: Any) -> DecodeState:
    """Run the prompt with use_cache=True; the next token is the argmax of the last logits."""
    output = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    cache, kwarg = _cache_of(output)
    logits = output.logits[:, -1].float()
    return DecodeState(cache, kwarg, int(input_ids.shape[1]), logits.argmax(-1, keepdim=True), logits)


def step(model: Any, state: DecodeState) -> DecodeState:
    """Feed `state.next_token` through the cache; returns the state after it."""
    import torch

    kwargs: dict[str, Any] = {state.cache_kwarg: state.cache, "use_cache": True}
    if state.cache_kwarg == "cache_params":
        kwargs["cache_position"] = torch.tensor([state.position], device=state.next_token.device)
    output = model(input_ids=state.next_token, **kwargs)
    cache, kwarg = _cache_of(output)
    logits = output.logits[:, -1].float()
    return DecodeState(cache, kwarg, state.position + 1, logits.argmax(-1, keepdim=True), logits)


def greedy_decode(model: Any, input_ids: Any, new_tokens: int) -> GreedyRun:
    """Prefill `input_ids`, then choose `new_tokens` tokens greedily (new_tokens - 1 cached steps)."""
    import torch

    with torch.no_grad():
        state = prefill(model, input_ids)
        tokens = [state.next_token]
        logits = [state.logits]
        for _ in range(new_tokens - 1):
            state = step(model, state)
            tokens.append(state.next_token)
            logits.append(state.logits)
    return GreedyRun(torch.cat(tokens, dim=1), logits)
