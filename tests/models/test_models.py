"""fastpath.models.resolve and build: where verify/bench models come from (presets, config.json, checkpoint dirs),
cutting big presets to N layers with their layer-type pattern, fixed-seed random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from tiny_configs import QWEN35_4L as TINY_QWEN35

from fastpath.models.build import build_model
from fastpath.models.dtypes import torch_dtype
from fastpath.models.resolve import cut_layers, kept_layers, layer_types, transformers_config
from fastpath.shared.errors import UsageError
from fastpath.shared.model_source import load_config


def write_config(tmp_path: Path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_qwen35_27b_cut_to_8_layers_keeps_attention_every_fourth_layer():
    config = transformers_config(load_config("qwen3.5-27b"), layers=8)
    assert config.model_type == "qwen3_5_text"  # the text decoder of the multimodal checkpoint
    assert config.num_hidden_layers == 8
    expected = (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert layer_types(config) == expected
    assert config.hidden_size == 5120 and config.linear_num_value_heads == 48
    # The real module tree, built on the meta device (no memory): layers 3 and 7 are attention.
    built = build_model("qwen3.5-27b", layers=8, device="meta", dtype="bf16")
    kinds = ["self_attn" if hasattr(layer, "self_attn") else "linear_attn" for layer in built.model.model.layers]
    assert kinds == ["linear_attn"] * 3 + ["self_attn"] + ["linear_attn"] * 3 + ["self_attn"]
    assert type(built.model).__name__ == "Qwen3_5ForCausalLM"
    assert "6 linear_attention, 2 full_attention" in built.describe()


def test_lfm2_cut_keeps_its_irregular_pattern():
    full = load_config("lfm2")
    config = transformers_config(full, layers=6)
    assert layer_types(config) == full["layer_types"][:6]
    assert layer_types(config) == ["conv", "conv", "full_attention", "conv", "conv", "full_attention"]


def test_cut_layers_slices_patterns_and_filters_index_lists():
    config = {
        "num_hidden_layers": 6,
        "hybrid_override_pattern": "M-M*M-",
        "attn_layer_indices": [1, 3, 5],
        "mlp_only_layers": [0, 4],
        "eos_token_id": [1, 2, 3, 4, 5, 6],  # not per-layer: left alone
    }
    cut = cut_layers(config, 4)
    assert cut["num_hidden_layers"] == 4
    assert cut["hybrid_override_pattern"] == "M-M*"
    assert cut["attn_layer_indices"] == [1, 3]
    assert cut["mlp_only_layers"] == [0]
    assert cut["eos_token_id"] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(("preset", "layers", "expected"), [
    # the first 2 layers are both linear attention / conv: the first attention layer takes the 2nd place
    ("qwen3.5-27b", 2, ["linear_attention", "full_attention"]),
    ("lfm2-1.2b", 2, ["conv", "full_attention"]),
    ("qwen3.5-27b", 5, ["linear_attention"] * 3 + ["full_attention", "linear_attention"]),
])
def test_layers_keeps_every_layer_type_of_a_hybrid_model(preset, layers, expected):
    config = transformers_config(load_config(preset), layers=layers)
    assert layer_types(config) == expected


def test_layers_on_a_hybrid_override_pattern_keeps_mamba_mlp_and_attention():
    # Nemotron-H: M (Mamba2), - (MLP), * (attention); the first attention layer is layer 7.
    pattern = load_config("nemotron-h-8b")["hybrid_override_pattern"]
    assert kept_layers(list(pattern), 3) == [0, 1, 7]
    cut = cut_layers({"num_hidden_layers": len(pattern), "hybrid_override_pattern": pattern,
                      "attn_layer_indices": [7, 16]}, 3)
    assert cut["hybrid_override_pattern"] == "M-*" and cut["attn_layer_indices"] == [2]


def test_too_few_layers_for_the_layer_types_is_refused_naming_the_flag():
    with pytest.raises(UsageError, match=r"^--layers 1 cannot keep every layer type .*use --layers 2 or more$"):
        transformers_config(load_config("qwen3.5-27b"), layers=1)


@pytest.mark.parametrize("layers", [0, -1, 7])
def test_cut_layers_rejects_impossible_counts(layers):
    with pytest.raises(UsageError):
        cut_layers({"num_hidden_layers": 6}, layers)


def test_random_weights_are_fixed_by_the_seed_and_no_tensor_stays_zero(tmp_path):
    source = write_config(tmp_path, TINY_QWEN35)
    a = build_model(source, device="cpu", seed=3).model.state_dict()
    b = build_model(source, device="cpu", seed=3).model.state_dict()
    c = build_model(source, device="cpu", seed=4).model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    # zero-initialised norm weights / biases get values, so a kernel that drops a term shows up
    assert all(bool(t.any()) for t in a.values() if t.is_floating_point())


def test_dtype_and_device(tmp_path):
    built = build_model(write_config(tmp_path, TINY_QWEN35), dtype="bf16", device="cpu")
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
    assert built.device.type == "cpu" and not built.model.training
    assert torch_dtype("fp16") is torch.float16
    with pytest.raises(UsageError):
        torch_dtype("int8")


def test_checkpoint_directory_loads_its_weights_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    original = build_model(write_config(tmp_path, TINY_QWEN35), device="cpu", seed=11).model
    ckpt = tmp_path / "ckpt"
    original.save_pretrained(ckpt)  # writes config.json + model.safetensors
    assert any(ckpt.glob("*.safetensors"))
    loaded = build_model(str(ckpt), device="cpu", seed=0)  # the seed must not matter for real weights
    assert loaded.source.kind == "dir" and loaded.seed is None
    want, got = original.state_dict(), loaded.model.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    # --layers on a checkpoint: the first layers' weights, the rest dropped
    cut = build_model(str(ckpt), device="cpu", layers=2)
    assert cut.num_layers == 2
    assert torch.equal(cut.model.model.layers[1].mlp.up_proj.weight, original.model.layers[1].mlp.up_proj.weight)


def test_multimodal_qwen35_checkpoint_loads_as_its_text_decoder(tmp_path):
    # Real Qwen3.5 checkpoints are Qwen3_5ForConditionalGeneration (vision + text); verify/bench
    # build the text causal LM, and its weights must be the checkpoint's language-model weights.
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    text = {k: v for k, v in TINY_QWEN35.items() if k != "model_type"}
    config = AutoConfig.for_model("qwen3_5", text_config=text, vision_config={
        "depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 32, "patch_size": 4})
    torch.manual_seed(0)
    vlm = Qwen3_5ForConditionalGeneration(config)
    vlm.save_pretrained(tmp_path / "vlm")
    built = build_model(str(tmp_path / "vlm"), device="cpu")
    assert type(built.model).__name__ == "Qwen3_5ForCausalLM" and built.model_type == "qwen3_5_text"
    assert not any("absent from the checkpoint" in n for n in built.notes)
    want = vlm.state_dict()
    got = built.model.state_dict()
    assert torch.equal(got["model.layers.0.linear_attn.conv1d.weight"],
                       want["model.language_model.layers.0.linear_attn.conv1d.weight"])
    assert torch.equal(got["lm_head.weight"], want["lm_head.weight"])


def test_bad_sources_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="unknown preset"):
        build_model("no-such-preset", device="meta")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="malformed JSON"):
        build_model(str(bad), device="meta")
    with pytest.raises(UsageError):
        build_model(str(tmp_path / "missing" / "config.json"), device="meta")
    empty_dir = tmp_path / "weightless"
    empty_dir.mkdir()
    (empty_dir / "config.json").write_text(json.dumps(TINY_QWEN35))
    with pytest.raises(UsageError, match=r"no \*\.safetensors"):
        build_model(str(empty_dir), device="meta")
    with pytest.raises(UsageError, match=r"unknown model_type|cannot build"):
        build_model(write_config(tmp_path, {"model_type": "no_such_family", "num_hidden_layers": 2}, "x.json"),
                    device="meta")
    with pytest.raises(UsageError, match="--layers"):
        build_model(write_config(tmp_path, TINY_QWEN35, "y.json"), layers=0, device="meta")


def test_cut_layers_reads_the_count_from_the_pattern_when_no_count_key():
    """NemotronHConfig.to_dict() (transformers >= 5.17) has no num_hidden_layers: the pattern
    string/list is the layer count, and every layer type stays represented."""
    from fastpath.models.resolve import cut_layers

    cut = cut_layers({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M-M-M*M-"}, 3)
    assert sorted(set(cut["hybrid_override_pattern"])) == ["*", "-", "M"]
    assert len(cut["hybrid_override_pattern"]) == 3 and "num_hidden_layers" not in cut
    cut = cut_layers({"model_type": "nemotron_h",
                      "layers_block_type": ["mamba", "mlp", "mamba", "attention", "mlp"]}, 3)
    assert cut["layers_block_type"] == ["mamba", "mlp", "attention"]


def test_cut_keeps_an_attention_layer_of_a_model_that_indexes_them():
    """Bamba lists its attention layers (attn_layer_indices) instead of a per-layer pattern: a cut
    to 2 layers of the real preset must keep one Mamba-2 layer and one attention layer, renumbered,
    and the transformers config built from it must agree."""
    from fastpath.models.resolve import cut_layers, layer_types, transformers_config

    config = load_config("bamba-9b")
    assert layer_types(config).count("attention") == 3 and len(layer_types(config)) == 32
    cut = cut_layers(config, 2)
    assert cut["num_hidden_layers"] == 2 and cut["attn_layer_indices"] == [1]
    assert layer_types(cut) == ["mamba", "attention"]
    built = transformers_config(config, 2)
    assert built.attn_layer_indices == [1] and built.num_hidden_layers == 2
