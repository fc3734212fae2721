"""The causal_conv1d callables enable() puts into transformers, one pair for every version.

transformers has called causal_conv1d with different argument conventions over time
(keywords `x=` in <=5.14, positional `hidden_states` from 5.15, `activation` positional in
updates, a 2-D `x` in 4.57's lfm2 decode, arbitrary model kwargs in 5.15+). These adapters accept
all of them, name `seq_idx` / `cu_seqlens` explicitly (5.15+ filters kwargs by signature), derive
`seq_idx` from the flash-attention `cu_seq_lens_q` a packed batch carries, and then call the
Dao-style implementation enable() chose (fastpath.causal_conv1d unless overridden).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_NATIVE_ACTIVATIONS = (None, "silu", "swish")

#: marker attribute so explain() can recognise the adapters without importing this module's state
FASTPATH_ROUTE_ATTR = "__fastpath_route__"


def seq_idx_from_cu_seqlens(cu_seqlens: torch.Tensor, seqlen: int, device: torch.device) -> torch.Tensor | None:
    """(1, seqlen) int32 sequence ids from cumulative lengths [0, l0, l0+l1, ...], or None
    when they do not describe exactly `seqlen` tokens (e.g. a cache prepended context)."""
    cu = cu_seqlens.to(device=device, dtype=torch.long).flatten()
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != seqlen:
        return None
    lengths = cu[1:] - cu[:-1]
    ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    return ids.to(torch.int32).unsqueeze(0)


def _apply_activation(out: torch.Tensor, activation: str) -> torch.Tensor:
    from transformers.activations import ACT2FN

    return ACT2FN[activation](out)


def make_causal_conv1d_fn(impl: Callable[..., Any]) -> Callable[..., Any]:
    """Adapter with Dao's causal_conv1d_fn signature (plus cu_seqlens and **kwargs)."""

    def causal_conv1d_fn(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        return_final_states: bool = False,
        final_states_out: torch.Tensor | None = None,
        activation: str | None = None,
        cu_seqlens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if seq_idx is None and x.shape[0] == 1:
            cu = cu_seqlens if cu_seqlens is not None else kwargs.get("cu_seq_lens_q")
            if isinstance(cu, torch.Tensor):
                seq_idx = seq_idx_from_cu_seqlens(cu, x.shape[-1], x.device)
        in_dtype = x.dtype
        if x.dtype != weight.dtype:  # transformers' torch path computes in the weight dtype
            x = x.to(weight.dtype)
        native = activation in _NATIVE_ACTIVATIONS
        call_kwargs: dict[str, Any] = {"activation": activation if native else None}
        if seq_idx is not None:
            call_kwargs["seq_idx"] = seq_idx
        if initial_states is not None:
            call_kwargs["initial_states"] = initial_states
        if return_final_states:
            call_kwargs["return_final_states"] = True
            if final_states_out is not None:
                call_kwargs["final_states_out"] = final_states_out
        result = impl(x, weight, bias, **call_kwargs)
        out, final = (result if return_final_states else (result, None))
        if not native:
            out = _apply_activation(out, activation)  # type: ignore[arg-type]
        out = out.to(in_dtype)
        return (out, final) if return_final_states else out

    setattr(causal_conv1d_fn, FASTPATH_ROUTE_ATTR, "causal_conv1d_fn")
    causal_conv1d_fn.__fastpath_impl__ = impl  # type: ignore[attr-defined]
    return causal_conv1d_fn


def make_causal_conv1d_update(impl: Callable[..., Any]) -> Callable[..., Any]:
    """Adapter with Dao's causal_conv1d_update signature (conv_state updated in place)."""

    def causal_conv1d_update(
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        cache_seqlens: torch.Tensor | None = None,
        conv_state_indices: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        in_dtype = x.dtype
        if x.dtype != conv_state.dtype:
            x = x.to(conv_state.dtype)
        native = activation in _NATIVE_ACTIVATIONS
        call_kwargs: dict[str, Any] = {"activation": activation if native else None}
        if cache_seqlens is not None:
            call_kwargs["cache_seqlens"] = cache_seqlens
        if conv_state_indices is not None:
            call_kwargs["conv_state_indices"] = conv_state_indices
        out = impl(x, conv_state, weight, bias, **call_kwargs)
        if not native:
            out = _apply_activation(out, activation)  # type: ignore[arg-type]
        return out.to(in_dtype)

    setattr(causal_conv1d_update, FASTPATH_ROUTE_ATTR, "causal_conv1d_update")
    causal_conv1d_update.__fastpath_impl__ = impl  # type: ignore[attr-defined]
    return causal_conv1d_update
