"""Build the model that `fastpath verify` / `fastpath bench` run: from a preset, a config.json or
a local checkpoint directory.

Why a module of its own: verify and bench must run *the same* model on both paths, so the
weights come from one place (a fixed seed, or safetensors on disk) and the layer-type pattern
of a big preset survives `--layers N` (a cut Qwen3.5-27B keeps "3 GatedDeltaNet + 1 attention").
Nothing is ever downloaded: checkpoints load with `local_files_only=True` and hub kernels are
switched off (`USE_HUB_KERNELS=0`) before transformers is imported.

A command reads its model source once: `resolve_model` turns what the user typed (and --layers,
--dtype, --device) into a frozen ResolvedModel, and everything after it (sizing, the build, the
weight count, capture's layer and tokenizer checks) reads that value, never the string again.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from fastpath.models.dtypes import dtype_label, resolve_device, torch_dtype
from fastpath.shared.errors import UsageError, first_line

# Keys that hold the number of decoder layers, in the order families use them.
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# Keys that describe the per-layer pattern (one entry / character per layer).
_PATTERN_KEYS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "layers_type")
# Other per-layer lists a config validates against the layer count (Kimi-Linear's dense/sparse MLPs).
_PER_LAYER_KEYS = ("mlp_layer_types",)
# Key that lists the attention layers of a model whose other layers are Mamba-2 (Bamba).
_ATTENTION_INDEX_KEY = "attn_layer_indices"
# Stddev given to tensors that the family's init leaves at exactly zero (see _exercise_zero_params).
_ZERO_PARAM_NOISE_STD = 0.1


def quiet_hub_environment() -> None:
    """Never download kernels (transformers >= 5.25 defaults `use_kernels=True`)."""
    os.environ.setdefault("USE_HUB_KERNELS", "0")


# ---------------------------------------------------------------------------------------------
# Where the model comes from


@dataclass(frozen=True)
class ModelSource:
    """A resolved model source: what kind it is and its raw config.json content."""

    text: str  # what the user typed
    kind: str  # "preset" | "config" | "dir"
    config: dict[str, Any]
    path: Path | None = None  # the checkpoint directory for kind == "dir"

    @property
    def decoder(self) -> dict[str, Any]:
        """The decoder's part of `config` as given (a multimodal checkpoint's `text_config`)."""
        from fastpath.shared.model_source import text_config

        return text_config(self.config)


def resolve_source(source: str) -> ModelSource:
    """Classify `source` and read its config (UsageError on an unknown preset, bad JSON, no dir)."""
    from fastpath.shared.model_source import load_config

    config = load_config(source)
    path = Path(source).expanduser()
    if path.is_dir():
        if not any(path.glob("*.safetensors")):
            raise UsageError(
                f"model directory {path} has no *.safetensors weights; "
                f"pass {path / 'config.json'} to run it with random weights"
            )
        return ModelSource(source, "dir", config, path)
    if path.is_file():
        return ModelSource(source, "config", config, None)
    return ModelSource(source, "preset", config, None)


# ---------------------------------------------------------------------------------------------
# Configs and the layer pattern


def layer_count_key(config: dict[str, Any]) -> str:
    for key in _LAYER_COUNT_KEYS:
        if isinstance(config.get(key), int):
            return key
    raise UsageError("config has no layer count (num_hidden_layers / n_layer / num_layers)")


def layer_types(config: Any) -> list[str]:
    """Per-layer type names of a transformers config (or dict): the pattern `--layers` keeps."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    for key in _PATTERN_KEYS:
        value = get(key)
        if isinstance(value, (list, str)) and len(value) > 0:
            return [str(v) for v in value]
    count = next((get(k) for k in _LAYER_COUNT_KEYS if isinstance(get(k), int)), 0)
    attention = get(_ATTENTION_INDEX_KEY)
    if isinstance(attention, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in attention):
        # Bamba names its attention layers by index (every other layer is Mamba-2); without this
        # a cut keeps only Mamba layers and the decode cache has no attention layer to size.
        return ["attention" if i in attention else "mamba" for i in range(int(count))]
    return ["decoder"] * int(count)


def _is_index_list_key(key: str) -> bool:
    """Keys holding layer *indices* (filtered on a cut) rather than one entry per layer."""
    return key.endswith(("_idxs", "_indices", "_layers", "_layer_ids"))


def kept_layers(types: list[str], layers: int) -> list[int]:
    """Indices of the layers `--layers N` keeps: the first N, except that every layer type of the
    model stays represented (the last kept layers of a repeated type give way to the first layer
    of each missing type).

    Why: the first 2 layers of Qwen3.5 or LFM2 are both linear-attention / conv layers; a model
    without its attention layer cannot even build a decode cache (transformers raises
    "`get_seq_length` can only be called on Attention layers"), and verify would not exercise
    the layer types the full model has.
    """
    distinct = list(dict.fromkeys(types))
    if layers < len(distinct):
        raise UsageError(f"--layers {layers} cannot keep every layer type of this model "
                         f"({', '.join(distinct)}); use --layers {len(distinct)} or more")
    keep = list(range(layers))
    for kind in distinct:
        if any(types[i] == kind for i in keep):
            continue
        for pos in range(len(keep) - 1, -1, -1):
            if sum(types[i] == types[keep[pos]] for i in keep) > 1:
                keep.pop(pos)
                break
        keep.append(types.index(kind))
    return sorted(keep)


def check_layers(layers: Any) -> None:
    """`--layers N`: a positive integer (UsageError, one line, otherwise). The one check every
    command's option and every cut goes through, before any work."""
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise UsageError(f"--layers must be a positive integer, got {layers!r}")


def cut_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """Keep `layers` decoder layers of a (text) config dict (see kept_layers), pattern included.

    Per-layer lists and pattern strings are gathered at the kept indices; lists of layer indices
    are filtered and renumbered. The result is checked: its layer types must be the original's
    types at the kept indices. The one place `--layers` is validated: every cut comes here.
    """
    check_layers(layers)
    pattern = next((config[k] for k in _PATTERN_KEYS
                    if isinstance(config.get(k), (list, str)) and len(config[k]) > 0), None)
    if pattern is not None and not any(isinstance(config.get(k), int) for k in _LAYER_COUNT_KEYS):
        # e.g. NemotronHConfig.to_dict() on transformers >= 5.17: the pattern is the layer count
        count_key, total = None, len(pattern)
    else:
        count_key = layer_count_key(config)
        total = int(config[count_key])
    if layers > total:
        raise UsageError(f"--layers {layers} is more than the model's {total} layers")
    before = layer_types(config)
    keep = kept_layers(before, layers) if len(before) == total else list(range(layers))
    cut: dict[str, Any] = {}
    for key, value in config.items():
        if key == count_key:
            cut[key] = layers
        elif _is_index_list_key(key) and isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            cut[key] = [keep.index(v) for v in value if v in keep]
        elif key in _PATTERN_KEYS + _PER_LAYER_KEYS and isinstance(value, (list, str)) and len(value) == total:
            picked = [value[i] for i in keep]
            cut[key] = "".join(picked) if isinstance(value, str) else picked
        else:
            cut[key] = value
    after = layer_types(cut)
    if before and len(before) == total and after != [before[i] for i in keep]:
        raise UsageError(f"cannot cut this config to {layers} layers keeping its layer-type pattern")
    return cut


def transformers_config(config: dict[str, Any], layers: int | None = None) -> Any:
    """A transformers config for the *text* causal LM, cut to `layers` when given.

    Multimodal checkpoints (Qwen3.5: model_type "qwen3_5" with a nested "text_config") are
    reduced to their decoder config, because the layers that need causal_conv1d live there.
    """
    quiet_hub_environment()
    from transformers import AutoConfig

    raw = dict(config)
    model_type = raw.pop("model_type", None)
    if not model_type:
        raise UsageError("config has no model_type")
    try:
        full = AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"transformers cannot build a {model_type!r} config: {first_line(exc)}") from None
    except TypeError as exc:
        raise UsageError(f"malformed {model_type!r} config: {first_line(exc)}") from None
    text = full.get_text_config() if hasattr(full, "get_text_config") else full
    if layers is None:
        return text
    data = text.to_dict()
    try:
        cut = type(text).from_dict(cut_layers(data, layers))
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"cannot cut {model_type!r} to {layers} layers: {first_line(exc)}") from None
    lost = _lost_block_types(text, cut)
    if lost:
        enough = fewest_layers(text)
        more = f"; use --layers {enough}" if enough > layers else ""
        raise UsageError(f"--layers {layers} of {model_type!r} keeps too few {', '.join(lost)} layers "
                         f"(its pattern comes from a period and offset, which a cut cannot move){more}")
    return cut


# Layers that share weights across the pattern: transformers ties the shared block of one hybrid
# layer to the others, and raises when a cut leaves only one (Zamba's `tie_weights_keys`).
_MIN_BLOCKS = {"zamba": {"hybrid": 2}}


def fewest_layers(text: Any) -> int:
    """The smallest --layers that keeps every layer type of the (uncut) text config: one layer per
    type where the pattern is a list a cut can rearrange (kept_layers), else the shortest prefix
    with every block type (Jamba's attention layer sits at index 4 of each period of 8: 5 layers),
    and Zamba's two hybrid blocks. The memory guard suggests no cut below it."""
    kinds = len(set(layer_types(text))) or 1
    blocks = _block_count(text)
    if not blocks:
        return kinds
    data = text.to_dict()
    for n in range(kinds, blocks + 1):
        try:
            cut = type(text).from_dict(cut_layers(data, n))
        except (ValueError, TypeError, KeyError):
            continue
        if not _lost_block_types(text, cut):
            return n
    return blocks


def _block_count(config: Any) -> int:
    return len(getattr(config, "layers_block_type", None) or [])


def _lost_block_types(full: Any, cut: Any) -> list[str]:
    """Block types (computed by the config class from a period and offset, e.g. Jamba's and
    Zamba's `layers_block_type`) that the full model has and the cut has too few of."""
    before = list(getattr(full, "layers_block_type", None) or [])
    after = list(getattr(cut, "layers_block_type", None) or [])
    if not before:
        return []
    need = _MIN_BLOCKS.get(getattr(full, "model_type", ""), {})
    return [kind for kind in dict.fromkeys(before)
            if after.count(kind) < min(need.get(kind, 1), before.count(kind))]


@dataclass(frozen=True)
class ResolvedModel:
    """A model source read and checked once, before anything is allocated: what verify, bench and
    capture size, build and report from. Made by resolve_model; `on(device)` moves it without
    reading anything again."""

    source: ModelSource  # what was typed, its kind, the raw config.json content, the checkpoint dir
    config: Any  # the transformers (text) config, cut to `layers`
    layers: int | None  # the --layers cut (None: every layer)
    dtype: str  # the dtype name as the command took it ("bf16"), known to be valid
    device: Any  # torch.device
    min_layers: int  # the fewest layers that keep every layer type

    @property
    def family(self) -> str:
        """transformers' model_type of the (text) decoder, e.g. "qwen3_5_text"."""
        return str(self.config.model_type)

    @property
    def model_dir(self) -> Path | None:
        """The checkpoint directory (weights, tokenizer), or None for a preset or a config.json."""
        return self.source.path if self.source.kind == "dir" else None

    @property
    def preset(self) -> str | None:
        """The preset name as typed, or None for a file or directory."""
        return self.source.text if self.source.kind == "preset" else None

    @property
    def torch_dtype(self) -> Any:
        return torch_dtype(self.dtype)

    def build_line(self, seed: int) -> str:
        """What the (possibly minute-long) build will do, said before it starts."""
        layers = getattr(self.config, "num_hidden_layers", None)
        what = f"building the model: {self.family}" + (f", {layers} layers" if layers else "")
        if self.model_dir is not None:
            return f"{what}, loading the checkpoint in {self.model_dir} as {self.dtype} onto {self.device}"
        return (f"{what}, random weights (seed {seed}) initialised in fp32 on {self.device}"
                + (f", then cast to {self.dtype}" if self.dtype != "fp32" else ""))

    def on(self, device: Any) -> ResolvedModel:
        """The same model on another device (a rank's GPU, the host for FSDP's rank 0)."""
        return replace(self, device=resolve_device(device))

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes of the causal LM's parameters (shared ones once) in `dtype`, counted on the meta
        device: nothing is allocated and no checkpoint is read, so a caller can decide how to
        place a model before loading it. Computed at the first use (it imports the modeling
        module), then kept."""
        quiet_hub_environment()
        import torch
        from transformers import AutoModelForCausalLM

        if _causal_lm_class(self.config) is None:
            raise UsageError(f"transformers has no causal-LM class for model_type {self.family!r}")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        return sum(p.numel() for p in model.parameters()) * self.torch_dtype.itemsize


def resolve_model(source: str, *, layers: int | None = None, dtype: str = "fp32",
                  device: Any = "auto") -> ResolvedModel:
    """Read `source` once and resolve the dtype, device and (cut) config: every UsageError a bad
    source, --layers, --dtype or --device gives comes from here, before anything is built."""
    src = resolve_source(source)
    torch_dtype(dtype)
    target = resolve_device(device)
    full = transformers_config(src.config)
    config = transformers_config(src.config, layers) if layers is not None else full
    return ResolvedModel(src, config, layers, dtype, target, fewest_layers(full))


# ---------------------------------------------------------------------------------------------
# The model


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


def _causal_lm_class(config: Any) -> Any:
    """The class AutoModelForCausalLM would build for `config`, or None."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return None


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

    model_class = _causal_lm_class(config)
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


def weight_bytes(source: str, *, layers: int | None = None, dtype: str = "fp32") -> int:
    """ResolvedModel.weight_bytes, for a caller that has only the string."""
    return resolve_model(source, layers=layers, dtype=dtype, device="meta").weight_bytes
