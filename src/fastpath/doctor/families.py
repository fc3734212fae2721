"""Model families as DATA: which layers need which kernels, and how to read the layer layout.

Sources: transformers' modeling files (src/transformers/models/<family>/modeling_<family>.py at
v4.57.6, v5.14.0 and v5.25.0: the kernel imports and `use_kernel_func_from_hub_with_fallback` calls).
Adding a family = one FAMILIES entry. Layer layouts come from the config only, so plans work for
remote targets from facts alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Op:
    """A kernel function transformers may route to a compiled package or its torch fallback."""

    name: str
    dist: str  # distribution that provides it (what `pip install` takes)
    module: str  # import name transformers tries
    fastpath: bool = False  # fastpath.enable() routes it to fastpath's Triton kernels


CONV_OPS = (
    Op("causal_conv1d_fn", "causal-conv1d", "causal_conv1d", fastpath=True),
    Op("causal_conv1d_update", "causal-conv1d", "causal_conv1d", fastpath=True),
)
GDN_OPS = (
    Op("chunk_gated_delta_rule", "flash-linear-attention", "fla"),
    Op("fused_recurrent_gated_delta_rule", "flash-linear-attention", "fla"),
)
KDA_OPS = (
    Op("chunk_kda", "flash-linear-attention", "fla"),
    Op("fused_recurrent_kda", "flash-linear-attention", "fla"),
)
# Mamba-2 families: fastpath routes all three (routing/ssd_route.py)
MAMBA2_OPS = (
    Op("mamba_chunk_scan_combined", "mamba-ssm", "mamba_ssm", fastpath=True),
    Op("mamba_split_conv1d_scan_combined", "mamba-ssm", "mamba_ssm", fastpath=True),
    Op("selective_state_update", "mamba-ssm", "mamba_ssm", fastpath=True),
)
# Mamba-1 families: fastpath routes all three (routing/selective_scan_route.py); mamba and falcon_mamba
# also call mamba_inner_fn (the fused training op) where jamba and zamba only need it importable
# (<=5.14 all-or-nothing gate, same mamba-ssm distribution)
MAMBA1_OPS = (
    Op("selective_scan_fn", "mamba-ssm", "mamba_ssm", fastpath=True),
    Op("selective_state_update", "mamba-ssm", "mamba_ssm", fastpath=True),
)
MAMBA1_FUSED_OPS = (*MAMBA1_OPS, Op("mamba_inner_fn", "mamba-ssm", "mamba_ssm", fastpath=True))


def _int(config: dict[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = config.get(k)
        if isinstance(v, int):
            return v
    return default


def layers_from_layer_types(config: dict[str, Any], interval_default: str) -> list[str]:
    """`layer_types` when present, else every `full_attention_interval`-th layer is attention."""
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return [str(t) for t in types]
    n = _int(config, "num_hidden_layers")
    interval = _int(config, "full_attention_interval", default=4)
    return ["full_attention" if (i + 1) % interval == 0 else interval_default for i in range(n)]


def layers_lfm2(config: dict[str, Any]) -> list[str]:
    if isinstance(config.get("layer_types"), list):
        return [str(t) for t in config["layer_types"]]
    attn = set(config.get("full_attn_idxs") or [])
    return ["full_attention" if i in attn else "conv" for i in range(_int(config, "num_hidden_layers"))]


def layers_all_mamba(config: dict[str, Any]) -> list[str]:
    return ["mamba"] * _int(config, "num_hidden_layers", "n_layer")


def layers_nemotron_h(config: dict[str, Any]) -> list[str]:
    pattern = config.get("hybrid_override_pattern") or ""
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    return [names.get(ch, ch) for ch in pattern]


def layers_jamba(config: dict[str, Any]) -> list[str]:
    period = _int(config, "attn_layer_period", default=8)
    offset = _int(config, "attn_layer_offset", default=4)
    return ["attention" if i % period == offset else "mamba"
            for i in range(_int(config, "num_hidden_layers"))]


def layers_kimi(config: dict[str, Any]) -> list[str]:
    kda = set((config.get("linear_attn_config") or {}).get("kda_layers") or [])  # 1-based
    return ["kda" if i + 1 in kda else "full_attention"
            for i in range(_int(config, "num_hidden_layers"))]


def layers_bamba(config: dict[str, Any]) -> list[str]:
    if isinstance(config.get("layer_types"), list):
        return [str(t) for t in config["layer_types"]]
    attn = set(config.get("attn_layer_indices") or [])
    return ["attention" if i in attn else "mamba" for i in range(_int(config, "num_hidden_layers"))]


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    layers: Callable[[dict[str, Any]], list[str]]
    ops_by_layer: dict[str, tuple[Op, ...]]  # layer type -> ops it needs (others need none)
    all_or_nothing: bool = False  # Mamba-style: one missing op sends every op to torch
    min_transformers: str | None = None  # first release with the family, where known
    note: str = ""


FAMILIES: tuple[Family, ...] = (
    Family("gated-deltanet", ("qwen3_next",), lambda c: layers_from_layer_types(c, "linear_attention"),
           {"linear_attention": CONV_OPS + GDN_OPS}, min_transformers="4.57.0"),
    Family("gated-deltanet", ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
           lambda c: layers_from_layer_types(c, "linear_attention"),
           {"linear_attention": CONV_OPS + GDN_OPS}, min_transformers="5.2.0"),
    Family("gated-deltanet", ("olmo_hybrid",), lambda c: layers_from_layer_types(c, "linear_attention"),
           {"linear_attention": CONV_OPS + GDN_OPS},
           note="5.14 used fla ShortConvolution (Triton) instead of causal_conv1d"),
    Family("kda", ("kimi_linear",), layers_kimi, {"kda": CONV_OPS + KDA_OPS},
           min_transformers="5.17.0"),
    Family("conv", ("lfm2", "lfm2_moe"), layers_lfm2, {"conv": CONV_OPS},
           min_transformers="4.55.0"),
    Family("mamba2", ("mamba2",), layers_all_mamba, {"mamba": CONV_OPS + MAMBA2_OPS},
           all_or_nothing=True, min_transformers="4.44.0"),
    Family("mamba2", ("bamba", "granitemoehybrid"), layers_bamba, {"mamba": CONV_OPS + MAMBA2_OPS},
           all_or_nothing=True),
    Family("mamba2", ("nemotron_h",), layers_nemotron_h, {"mamba": CONV_OPS + MAMBA2_OPS},
           all_or_nothing=True),
    Family("mamba2", ("falcon_h1",), layers_all_mamba, {"mamba": CONV_OPS + MAMBA2_OPS},
           all_or_nothing=True, note="every layer runs a Mamba-2 mixer in parallel with attention"),
    Family("mamba2", ("zamba2",), layers_all_mamba, {"mamba": CONV_OPS + MAMBA2_OPS},
           all_or_nothing=True, note="hybrid blocks also run the Mamba-2 mixer"),
    Family("mamba1", ("mamba", "falcon_mamba"), layers_all_mamba, {"mamba": CONV_OPS + MAMBA1_FUSED_OPS},
           all_or_nothing=True, min_transformers="4.39.0"),
    Family("mamba1", ("jamba",), layers_jamba, {"mamba": CONV_OPS + MAMBA1_OPS},
           all_or_nothing=True),
    Family("mamba1", ("zamba",), layers_all_mamba, {"mamba": CONV_OPS + MAMBA1_OPS},
           all_or_nothing=True, note="hybrid blocks also run the Mamba-1 mixer"),
)

CONV_MODEL_TYPES = frozenset(t for f in FAMILIES for t in f.model_types)


def family_for(model_type: str) -> Family | None:
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    return None
