"""Where a model config comes from: a bundled preset, a config.json path, or a model directory.

Presets are real HF config.json contents (shape included: Qwen3.5 keeps its multimodal nesting,
model_type "qwen3_5" with a "text_config"), so code that works on a preset works on the real
checkpoint's config. Each preset records where its numbers come from under `_fastpath_source`;
`load_config` strips that key so the dict can be handed to transformers as is.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from fastpath.shared.errors import UsageError

# Short names people type -> preset file stem.
PRESET_ALIASES: dict[str, str] = {
    "qwen3.5": "qwen3.5-27b",
    "qwen3-next": "qwen3-next-80b-a3b",
    "mamba2": "mamba2-codestral-7b",
    "lfm2": "lfm2-1.2b",
}

SOURCE_KEY = "_fastpath_source"


def _preset_dir() -> Any:
    return resources.files("fastpath") / "presets"


def list_presets() -> list[str]:
    """Names accepted by `load_config` as presets (file stems, sorted)."""
    return sorted(
        entry.name[: -len(".json")]
        for entry in _preset_dir().iterdir()
        if entry.name.endswith(".json")
    )


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.__class__.__name__}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"malformed JSON in {what} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path} is not a JSON object")
    return data


def _resolve_preset(name: str) -> str | None:
    key = name.strip().lower()
    key = PRESET_ALIASES.get(key, key)
    return key if key in list_presets() else None


def load_preset_with_source(name: str) -> dict[str, Any]:
    """A preset with its `_fastpath_source` metadata kept (for reports and docs)."""
    stem = _resolve_preset(name)
    if stem is None:
        raise UsageError(f"unknown preset {name!r}; known presets: {', '.join(list_presets())}")
    with resources.as_file(_preset_dir() / f"{stem}.json") as path:
        return _read_json(Path(path), "preset")


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def preset_for_hub_id(hub_id: str) -> str | None:
    """The bundled preset made from the Hub model `hub_id` (its `_fastpath_source.model`), or
    whose name starts that model's name (`nvidia/Nemotron-H-8B-Reasoning-128K` -> nemotron-h-8b:
    the same architecture)."""
    want = hub_id.strip().lower()
    repo = want.split("/")[-1]
    for stem in list_presets():
        meta = load_preset_with_source(stem).get(SOURCE_KEY, {})
        ids = re.findall(r"\S+/\S+", str(meta.get("model", "")))
        if want in (i.lower().rstrip(")") for i in ids):
            return stem
    return next((stem for stem in sorted(list_presets(), key=len, reverse=True)
                 if repo.startswith(stem)), None)


def _hub_id_hint(source: str) -> str | None:
    """For `--model Qwen/Qwen3.5-27B` (no such path): fastpath reads no Hub, so the error says
    what to pass instead, the matching preset first."""
    if not _HUB_ID.match(source) or source.startswith((".", "~")) or source.endswith(".json"):
        return None
    head = (f"{source}: no such file or directory; it looks like a Hugging Face Hub id, and "
            "fastpath reads no Hub:")
    stem = preset_for_hub_id(source)
    if stem is not None:
        origin = str(load_preset_with_source(stem).get(SOURCE_KEY, {}).get("model", "")).split()[0]
        return (f"{head} use the bundled preset {stem} (built from {origin}'s config), or a local "
                "directory with its config.json")
    return (f"{head} download its config (`hf download {source} config.json --local-dir DIR`) "
            f"and pass DIR, or a preset ({', '.join(list_presets())})")


def load_config(source: str) -> dict[str, Any]:
    """Return the config dict for a preset name, a config.json path or a local model directory.

    Raises UsageError (exit 2) for an unknown name, an unreadable file or malformed JSON.
    """
    if not isinstance(source, str) or not source.strip():
        raise UsageError("empty model source; give a preset name, a config.json path or a model dir")
    path = Path(source).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise UsageError(f"model directory {path} has no config.json")
        config = _read_json(config_path, "config")
    elif path.exists() or source.endswith(".json") or "/" in source:
        if not path.exists():
            raise UsageError(_hub_id_hint(source) or f"config file {path} does not exist")
        config = _read_json(path, "config")
    else:
        config = load_preset_with_source(source)
    config = {k: v for k, v in config.items() if k != SOURCE_KEY}
    if "model_type" not in config and "text_config" not in config:
        raise UsageError(f"config from {source!r} has no model_type; is it a transformers config.json?")
    validate_sizes(config, source)
    return config


# Upper bounds on a config's size fields, far above any released model (405B-class models have
# 126 layers, hidden 16384, intermediate 53248, vocab ~256k) and low enough that nothing that
# walks the layers or allocates weights runs for minutes or asks for terabytes first.
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 4096, "n_layer": 4096, "num_layers": 4096,
    "hidden_size": 1 << 17, "d_model": 1 << 17, "n_embd": 1 << 17,
    "intermediate_size": 1 << 20, "moe_intermediate_size": 1 << 20,
    "shared_expert_intermediate_size": 1 << 20, "block_ff_dim": 1 << 20,
    "vocab_size": 1 << 24,
    "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14, "head_dim": 1 << 14,
    "linear_num_key_heads": 1 << 14, "linear_num_value_heads": 1 << 14,
    "linear_key_head_dim": 1 << 14, "linear_value_head_dim": 1 << 14,
    "linear_conv_kernel_dim": 1 << 10, "conv_kernel": 1 << 10, "conv_L_cache": 1 << 10,
    "d_conv": 1 << 10, "d_state": 1 << 16, "state_size": 1 << 16, "n_groups": 1 << 14,
    "expand": 64, "num_experts": 1 << 16, "num_experts_per_tok": 1 << 16,
    "max_position_embeddings": 1 << 30,
}
_AT_LEAST_ONE = frozenset({"num_hidden_layers", "n_layer", "num_layers", "hidden_size", "d_model",
                           "n_embd", "vocab_size"})
# Per-layer lists (one entry per layer) obey the layer bound too.
_PER_LAYER_KEYS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "layers_type")


def validate_sizes(config: dict[str, Any], source: str = "config") -> None:
    """UsageError (one line, exit 2) for a size field that is not a positive integer or is past
    SIZE_LIMITS (`num_hidden_layers: 1e9`, `hidden_size: -4`), checked in the config and its
    nested `text_config`. Called by load_config, so `doctor --model`, verify and bench all refuse
    such a config before walking its layers or building a model."""
    parts = [("", config)]
    nested = config.get("text_config")
    if isinstance(nested, dict):
        parts.append(("text_config.", nested))
    for prefix, part in parts:
        for key, limit in SIZE_LIMITS.items():
            if key not in part or part[key] is None:
                continue
            value = part[key]
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"config from {source!r}: {prefix}{key} must be a positive "
                                 f"integer, got {str(value)[:40]!r}")
            low = 1 if key in _AT_LEAST_ONE else 0  # elsewhere 0 means "none" (num_experts: 0)
            if value < low or value > limit:
                raise UsageError(f"config from {source!r}: {prefix}{key}={value} is outside "
                                 f"{low}..{limit}")
        for key in _PER_LAYER_KEYS:
            value = part.get(key)
            if isinstance(value, (list, str)) and len(value) > SIZE_LIMITS["num_hidden_layers"]:
                raise UsageError(f"config from {source!r}: {prefix}{key} has {len(value)} "
                                 f"entries (at most {SIZE_LIMITS['num_hidden_layers']} layers)")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder part of a config: the nested `text_config` of multimodal checkpoints, else itself.

    Why: Qwen3.5 checkpoints are `qwen3_5` (vision + text); the layers that need causal_conv1d
    live in `text_config` (`qwen3_5_text`).
    """
    nested = config.get("text_config")
    if isinstance(nested, dict):
        merged = dict(nested)
        merged.setdefault("model_type", config.get("model_type", ""))
        return merged
    return config


def model_label(source: str, config: dict[str, Any]) -> str:
    """A short human label: the preset's model id when known, else the source string."""
    stem = _resolve_preset(source) if "/" not in source and not source.endswith(".json") else None
    if stem is not None:
        meta = load_preset_with_source(stem).get(SOURCE_KEY, {})
        return f"{stem} ({meta.get('model', 'preset')})"
    return source
