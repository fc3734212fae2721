"""Which hidden states are captured, how they are taken from the model, and what the stored
final state means.

Layer ids use the *capture-before* convention: id i is the input of decoder layer i (= the
output of layer i-1, residual included), id 0 is the embeddings, id L (the layer count) is the
last layer's output before the final norm. That is how vLLM collects EAGLE-3 auxiliary states
(`aux_hidden_states.append(hidden_states + residual)` at the top of the layer loop, e.g.
vllm/model_executor/models/llama.py) and what speculators asks vLLM for: its default
`[2, L // 2, L - 3]` plus `L` for the verifier's last state (speculators scripts/launch_vllm.py).
It is also index i of transformers' `output_hidden_states`, except for i = L, where transformers
returns the state *after* the final norm.

The off-by-one: SGLang and SpecForge count *capture-after* (id j is the output of layer j):
SGLang's `set_eagle3_layers_to_capture` adds 1 to every id before capturing
(python/sglang/srt/models/llama.py), and SpecForge's default `[1, L // 2 - 1, L - 4]`
(specforge/algorithms/model_providers.py) is the same three states as `[2, L // 2, L - 3]` here
(for even L). speculators' DFlash converter makes the same shift (`i + 1`,
src/speculators/convert/dflash/converter.py). `--layer-convention after` accepts ids counted
that way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastpath.shared.errors import UsageError

# Attribute names of the final norm on a decoder stack, in the order families use them.
_FINAL_NORM_NAMES = ("norm", "final_layernorm", "embedding_norm", "norm_f", "ln_f")


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's three auxiliary states, capture-before: [2, L // 2, L - 3]."""
    ids = [2, num_layers // 2, num_layers - 3]
    if not (0 < ids[0] < ids[1] < ids[2] < num_layers):
        raise UsageError(f"the default EAGLE-3 layers [2, L//2, L-3] collide for a {num_layers}-layer model; "
                         "pass --layers explicitly")
    return ids


def parse_layers(text: str | None, num_layers: int, convention: str = "before") -> list[int]:
    """`--layers 2,16,29` -> capture-before ids, sorted; validated against the layer count."""
    if text is None or not str(text).strip():
        return default_aux_layers(num_layers)
    if convention not in ("before", "after"):
        raise UsageError(f"--layer-convention must be 'before' or 'after', got {convention!r}")
    try:
        ids = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--layers must be comma-separated integers, got {text!r}") from None
    if convention == "after":
        ids = [i + 1 for i in ids]
    if not ids:
        raise UsageError("--layers is empty")
    low, high = (0, num_layers) if convention == "before" else (1, num_layers)
    bad = [i for i in ids if not low <= i <= high]
    if bad:
        shown = bad[0] - (1 if convention == "after" else 0)
        raise UsageError(f"--layers {shown} is outside this {num_layers}-layer model (capture-{convention})")
    if len(set(ids)) != len(ids):
        raise UsageError(f"--layers has a repeated layer: {text}")
    return sorted(ids)


@dataclass
class DecoderParts:
    base: Any  # the decoder stack (model.model)
    layers: Any  # its ModuleList of decoder layers
    norm: Any  # its final norm
    norm_name: str


def decoder_parts(model: Any) -> DecoderParts:
    """The decoder stack, its layers and its final norm (UsageError for an unknown layout)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or len(layers) == 0:
        raise UsageError(f"{type(model).__name__}: cannot find its decoder layers (model.model.layers)")
    for name in _FINAL_NORM_NAMES:
        norm = getattr(base, name, None)
        if norm is not None and hasattr(norm, "weight"):
            return DecoderParts(base, layers, norm, name)
    raise UsageError(f"{type(base).__name__}: cannot find its final norm ({', '.join(_FINAL_NORM_NAMES)})")


@dataclass
class Captured:
    """States of one forward: capture-before id -> [B, T, H]; `final_post` is after the norm."""

    states: dict[int, Any] = field(default_factory=dict)
    final_post: Any = None


@contextmanager
def capture_hooks(parts: DecoderParts, ids: Sequence[int]) -> Iterator[Captured]:
    """Hooks that record the states `ids` (capture-before) and the final norm's output while a
    forward runs. The hooks only read; they are removed on exit."""
    num_layers = len(parts.layers)
    box = Captured()
    handles = []

    def before(layer_id: int) -> Any:
        def hook(_module: Any, args: tuple, kwargs: dict) -> None:
            box.states[layer_id] = args[0] if args else kwargs["hidden_states"]
        return hook

    def after_last(_module: Any, _args: Any, output: Any) -> None:
        box.states[num_layers] = output[0] if isinstance(output, tuple) else output

    def after_norm(_module: Any, _args: Any, output: Any) -> None:
        box.final_post = output

    try:
        for i in ids:
            if i < num_layers:
                handles.append(parts.layers[i].register_forward_pre_hook(before(i), with_kwargs=True))
        if num_layers in ids:
            handles.append(parts.layers[num_layers - 1].register_forward_hook(after_last))
        handles.append(parts.norm.register_forward_hook(after_norm))
        yield box
    finally:
        for handle in handles:
            handle.remove()


def norm_convention(norm: Any) -> str:
    """What the final norm multiplies by: 'rmsnorm(x) * (1 + w)' (Qwen3.5's zero-centred weight,
    transformers' Qwen3_5RMSNorm), 'rmsnorm(x) * w', or 'unknown'.

    Why recorded: a trainer that rebuilds the post-norm state from the stored pre-norm one with
    `model.norm.weight` and the other convention is silently wrong. Decided by running the module
    on a probe input, not by its class name.
    """
    import torch

    weight = getattr(norm, "weight", None)
    if weight is None:
        return "unknown"
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(4, weight.shape[-1], generator=gen).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        y = norm(x).float()
        xf = x.float()
        r = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        w = weight.float()
        candidates = {"rmsnorm(x) * (1 + w)": r * (1.0 + w), "rmsnorm(x) * w": r * w}
        errs = {k: float(torch.linalg.vector_norm(y - v) / max(float(torch.linalg.vector_norm(y)), 1e-30))
                for k, v in candidates.items()}
    best = min(errs, key=lambda k: errs[k])
    return best if errs[best] < 2e-2 else "unknown"
