"""model_source: presets, config.json paths, model dirs, and bad input (UsageError)."""

from __future__ import annotations

import json

import pytest

from fastpath.shared.errors import UsageError
from fastpath.shared.model_source import (
    SOURCE_KEY,
    list_presets,
    load_config,
    load_preset_with_source,
    text_config,
)


def test_required_presets_exist():
    names = set(list_presets())
    assert {"qwen3.5-27b", "qwen3-next-80b-a3b", "mamba2-codestral-7b", "lfm2-1.2b"} <= names


def test_every_preset_records_its_source_and_load_config_strips_it():
    for name in list_presets():
        meta = load_preset_with_source(name)[SOURCE_KEY]
        assert meta["model"] and meta["numbers"], name
        assert SOURCE_KEY not in load_config(name)


def test_qwen35_27b_keeps_multimodal_shape_and_real_numbers():
    cfg = load_config("qwen3.5-27b")
    assert cfg["model_type"] == "qwen3_5"
    text = text_config(cfg)
    assert text["model_type"] == "qwen3_5_text"
    assert text["num_hidden_layers"] == 64 == len(text["layer_types"])
    assert text["layer_types"].count("linear_attention") == 48
    assert [i for i, t in enumerate(text["layer_types"]) if t == "full_attention"] == list(
        range(3, 64, 4)
    )
    assert text["hidden_size"] == 5120
    conv_dim = (
        2 * text["linear_num_key_heads"] * text["linear_key_head_dim"]
        + text["linear_num_value_heads"] * text["linear_value_head_dim"]
    )
    assert conv_dim == 10240
    assert text["linear_conv_kernel_dim"] == 4


def test_aliases_and_case():
    assert load_config("MAMBA2")["model_type"] == "mamba2"
    assert load_config("lfm2")["model_type"] == "lfm2"


def test_config_path_and_model_dir(tmp_path):
    cfg = {"model_type": "lfm2", "num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_config(str(tmp_path)) == cfg
    assert load_config(str(tmp_path / "config.json")) == cfg


@pytest.mark.parametrize(
    "content, message",
    [("{not json", "malformed JSON"), ("[1, 2]", "not a JSON object"), ("{}", "no model_type")],
)
def test_bad_config_files(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        load_config(str(path))


def test_unknown_preset_missing_file_empty_dir(tmp_path):
    with pytest.raises(UsageError, match="unknown preset"):
        load_config("no-such-model")
    with pytest.raises(UsageError, match="does not exist"):
        load_config(str(tmp_path / "missing.json"))
    with pytest.raises(UsageError, match=r"no config\.json"):
        load_config(str(tmp_path))


def test_unreadable_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="cannot read"):
        load_config(str(path))
