"""Tiny model configs (config.json dicts, CPU-sized) that more than one test file builds."""

from __future__ import annotations

# Qwen3.5 hybrid, 3 GatedDeltaNet layers + 1 attention (the model tests, the decode graphs)
QWEN35_4L = {
    "model_type": "qwen3_5_text", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "vocab_size": 64,
}
# Qwen3.5 hybrid, one GatedDeltaNet layer + one attention layer (verify, bench, warmup, Liger)
QWEN35_2L = {
    "model_type": "qwen3_5_text", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "vocab_size": 64, "layer_types": ["linear_attention", "full_attention"],
}
# LFM2, 3 conv layers + 1 attention, a 512-token vocabulary (capture)
LFM2_4L = {
    "model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "conv_bias": True,
    "layer_types": ["conv", "full_attention", "conv", "conv"],
}
# LFM2, one conv layer + one attention layer: a family Liger has no patch for
LFM2_2L = {"model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64, "conv_L_cache": 3,
           "layer_types": ["conv", "full_attention"], "block_auto_adjust_ff_dim": False}

# Kimi-Linear 48B's structure at toy size: KDA layer, MLA attention layer with sigmoid-routed MoE.
KIMI_LINEAR_2L = {
    "model_type": "kimi_linear", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "mla_use_nope": True, "num_experts": 8, "num_experts_per_token": 2,
    "num_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1, "routed_scaling_factor": 2.446,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2,
    "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1], "num_heads": 2, "head_dim": 16,
                           "short_conv_kernel_size": 4},
}
