"""Resolve what the user typed (a preset, a config.json, a checkpoint directory) into the model
a command runs: read once, checked once, before anything is built or allocated.

`resolve_model` turns the source and --layers / --dtype / --device into a frozen ResolvedModel
(the raw config, the transformers config cut to the layers asked for, the dtype, the device);
sizing, the build (models/build.py), the weight count and capture's layer and tokenizer checks
read that value, never the string again. A cut keeps the family's layer-type pattern: a cut
Qwen3.5-27B keeps "3 GatedDeltaNet + 1 attention", and a cut that would lose a layer type is
refused with the fewest layers that keep them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from fastpath.models.dtypes import resolve_device, resolve_dtype, torch_dtype
from fastpath.shared.errors import UsageError, first_line

# Keys that hold the number of decoder layers, in the order families use them.
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# Keys that describe the per-layer pattern (one entry / character per layer).
_PATTERN_KEYS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "layers_type")
# Other per-layer lists a config validates against the layer count (Kimi-Linear's dense/sparse MLPs).
_PER_LAYER_KEYS = ("mlp_layer_types",)
# Key that lists the attention layers of a model whose other layers are Mamba-2 (Bamba).
_ATTENTION_INDEX_KEY = "attn_layer_indices"


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
    dtype: str  # the dtype name as the command took it ("bf16"; "auto" resolved), known to be valid
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

        if causal_lm_class(self.config) is None:
            raise UsageError(f"transformers has no causal-LM class for model_type {self.family!r}")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        return sum(p.numel() for p in model.parameters()) * self.torch_dtype.itemsize


def resolve_model(source: str, *, layers: int | None = None, dtype: str = "fp32",
                  device: Any = "auto") -> ResolvedModel:
    """Read `source` once and resolve the dtype ('auto': models/dtypes.resolve_dtype), device and
    (cut) config: every UsageError a bad source, --layers, --dtype or --device gives comes from
    here, before anything is built."""
    src = resolve_source(source)
    dtype = resolve_dtype(dtype, device)
    torch_dtype(dtype)
    target = resolve_device(device)
    full = transformers_config(src.config)
    config = transformers_config(src.config, layers) if layers is not None else full
    return ResolvedModel(src, config, layers, dtype, target, fewest_layers(full))




def causal_lm_class(config: Any) -> Any:
    """The class AutoModelForCausalLM would build for `config`, or None."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return None



def weight_bytes(source: str, *, layers: int | None = None, dtype: str = "fp32") -> int:
    """ResolvedModel.weight_bytes, for a caller that has only the string."""
    return resolve_model(source, layers=layers, dtype=dtype, device="meta").weight_bytes
