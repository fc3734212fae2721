"""Tiny model configs more than one test folder builds (config.json dicts, CPU-sized)."""

from __future__ import annotations

# the tiny Qwen3.5 hybrid (3 GatedDeltaNet layers + 1 attention) of the model tests and decode graphs
TINY_QWEN35 = {
    "model_type": "qwen3_5_text", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "vocab_size": 64,
}
