"""Where a model config comes from: a bundled preset, a config.json path, or a model directory.

Presets are real HF config.json contents (shape included: Qwen3.5 keeps its multimodal nesting,
model_type "qwen3_5" with a "text_config"), so code that works on a preset works on the real
checkpoint's config. Each preset records where its numbers come from under `_fastpath_source`;
`load_config` strips that key so the dict can be handed to transformers as is.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from fastpath.errors import UsageError

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
            raise UsageError(f"config file {path} does not exist")
        config = _read_json(path, "config")
    else:
        config = load_preset_with_source(source)
    config = {k: v for k, v in config.items() if k != SOURCE_KEY}
    if "model_type" not in config and "text_config" not in config:
        raise UsageError(f"config from {source!r} has no model_type; is it a transformers config.json?")
    return config


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
