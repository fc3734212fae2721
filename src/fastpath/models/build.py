"""Build the model that `fastpath verify` / `bench` / `capture` run, from a ResolvedModel
(models/resolve.py): random weights from a fixed seed, or safetensors on disk.

Why a module of its own: verify and bench must run *the same* model on both paths, so the
weights come from one place. Nothing is ever downloaded: checkpoints load with
`local_files_only=True` and hub kernels are switched off (`USE_HUB_KERNELS=0`) before
transformers is imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from fastpath.models.dtypes import dtype_label
from fastpath.models.resolve import (
    ModelSource,
    ResolvedModel,
    causal_lm_class,
    layer_types,
    quiet_hub_environment,
    resolve_model,
)
from fastpath.shared.errors import UsageError, first_line

# Stddev given to tensors that the family's init leaves at exactly zero (see _exercise_zero_params).
_ZERO_PARAM_NOISE_STD = 0.1


@dataclass
class BuiltModel:
    """A model ready to run, plus what a report needs to say about it."""

    model: Any
    config: Any  # the transformers (text) config the model was built from
    resolved: ResolvedModel  # what it was built from (skeleton or not, whatever device it went to)
    model_type: str
    layer_types: list[str]
    dtype: Any
    device: Any
    seed: int | None  # None for real checkpoint weights
    notes: list[str] = field(default_factory=list)

    @property
    def dtype_name(self) -> str:
        """"bf16" / "fp16" / "fp32": what reports and tolerance tables say."""
        return dtype_label(self.dtype)

    @property
    def source(self) -> ModelSource:
        return self.resolved.source

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for kind in self.layer_types:
            counts[kind] = counts.get(kind, 0) + 1
        pattern = ", ".join(f"{n} {kind}" for kind, n in counts.items())
        weights = "checkpoint weights" if self.seed is None else f"random weights (seed {self.seed})"
        return (
            f"{self.source.text} [{self.model_type}, {self.num_layers} layers: {pattern}; "
            f"{weights}; {self.dtype_name} on {self.device}]"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.text,
            "source_kind": self.source.kind,
            "model_type": self.model_type,
            "class": type(self.model).__name__,
            "layers": self.num_layers,
            "layer_types": list(self.layer_types),
            "hidden_size": int(getattr(self.config, "hidden_size", 0) or 0),
            "vocab_size": self.vocab_size,
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
            "dtype": self.dtype_name,
            "device": str(self.device),
            "seed": self.seed,
            "notes": list(self.notes),
        }


def _exercise_zero_params(model: Any, std: float) -> list[str]:
    """Give every exactly-zero parameter small random values; return their names.

    Why: families initialise biases (conv, projections) and Qwen-style (1 + w) norm weights
    to zero. A kernel that drops the bias computes the same function on such a model, so
    verify would pass a wrong kernel. Real checkpoints have non-zero values there.
    """
    import torch

    names = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.numel() and not param.is_meta and not bool(param.any()):
                param.normal_(0.0, std)
                names.append(name)
    return names


def build_model(
    source: str,
    *,
    layers: int | None = None,
    dtype: str = "fp32",
    device: str | None = "auto",
    seed: int = 0,
    attn_implementation: str = "sdpa",
    skeleton: bool = False,
) -> BuiltModel:
    """resolve_model + build_resolved, for a caller that has only the string."""
    resolved = resolve_model(source, layers=layers, dtype=dtype, device=device)
    return build_resolved(resolved, seed=seed, attn_implementation=attn_implementation, skeleton=skeleton)


def build_resolved(resolved: ResolvedModel, *, seed: int = 0, attn_implementation: str = "sdpa",
                   skeleton: bool = False) -> BuiltModel:
    """Build the causal LM of `resolved` (see module doc) in eval mode on its device.

    skeleton: shapes only, on the meta device (no checkpoint read, nothing allocated), for
    FSDP2 ranks that receive their shards from rank 0."""
    src, config, target = resolved.source, resolved.config, resolved.device
    torch_type = resolved.torch_dtype
    quiet_hub_environment()
    import torch
    from transformers import AutoModelForCausalLM

    model_class = causal_lm_class(config)
    if model_class is None:
        raise UsageError(f"transformers has no causal-LM class for model_type {config.model_type!r}")
    if attn_implementation == "sdpa" and not getattr(model_class, "_supports_sdpa", False):
        attn_implementation = "eager"  # e.g. Mamba2 (no attention layers to speak of)
    notes: list[str] = []
    if skeleton:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_type, attn_implementation=attn_implementation)
        target = torch.device("meta")
        used_seed = None if src.kind == "dir" else seed
    elif src.kind == "dir":
        model, used_seed = _load_checkpoint(src.path, config, torch_type, target, attn_implementation, notes), None
    else:
        model, used_seed = _random_weights(config, torch_type, target, attn_implementation, seed, notes), seed
    model.eval()
    return BuiltModel(
        model=model,
        config=config,
        resolved=resolved,
        model_type=str(config.model_type),
        layer_types=layer_types(config),
        dtype=torch_type,
        device=target,
        seed=used_seed,
        notes=notes,
    )


def _load_checkpoint(path: Any, config: Any, dtype: Any, target: Any, attn_implementation: str,
                     notes: list[str]) -> Any:
    """The checkpoint in `path`, offline, on `target`; a note names tensors it lacked."""
    from transformers import AutoModelForCausalLM

    # device_map (straight to the GPU, no host copy) needs accelerate; without it, load on the
    # host and move.
    direct = target.type == "cuda" and importlib.util.find_spec("accelerate") is not None
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path),
            config=config,
            dtype=dtype,
            local_files_only=True,
            attn_implementation=attn_implementation,
            output_loading_info=True,
            **({"device_map": str(target)} if direct else {}),
        )
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load the checkpoint in {path}: {first_line(exc)}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        notes.append(f"{len(missing)} tensors absent from the checkpoint were randomly initialised "
                     f"(first: {missing[0]})")
    if not direct and target.type != "cpu":
        model = model.to(target)
    return model


def _random_weights(config: Any, dtype: Any, target: Any, attn_implementation: str, seed: int,
                    notes: list[str]) -> Any:
    """Seeded random weights on `target`, drawn in fp32 so a given seed means the same weights in
    every dtype, no tensor left at exactly zero (a note says how many were)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(target):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
    zeroed = _exercise_zero_params(model, _ZERO_PARAM_NOISE_STD)
    if zeroed:
        notes.append(
            f"{len(zeroed)} zero-initialised tensors (biases, (1+w) norm weights) got "
            f"N(0, {_ZERO_PARAM_NOISE_STD}^2) values so every term is exercised"
        )
    return model.to(dtype=dtype)
