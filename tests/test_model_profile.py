"""benchmarks/model_profile.py's bookkeeping on the CPU: the kernel-family classification the
BENCHMARKS table rests on (kernel names as the H200 reported them in session 5) and the matmul
weight count behind its FLOP numbers. The profiling itself needs CUDA (device only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import model_profile  # noqa: E402

SEEN_ON_H200 = {
    "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT": "gemm",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4": "gemm",
    "void batch_trsm_left_kernel<float, 64, 4, 3, false, true, true>(cublasTrsmBatchParams2<float>": "gemm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x256_4x1x1": "attention",
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "gated delta rule (FLA)",
    "chunk_bwd_kernel_dqkwg": "gated delta rule (FLA)",
    "prepare_wy_repr_bwd_kernel": "gated delta rule (FLA)",
    "recompute_w_u_fwd_kernel": "gated delta rule (FLA)",
    "l2norm_fwd_kernel": "gated delta rule (FLA)",
    "_causal_conv1d_fwd_rows_kernel": "causal conv",
    "void causal_conv1d_channellast_fwd_kernel<Causal_conv1d_channellast_fwd_kernel_traits<128, 4, 64, true, "
    "c10::BFloat16, c10::BFloat16>, false": "causal conv",  # Dao's CUDA kernel
    "layer_norm_gated_fwd_kernel": "norm",
    "_dx_kernel": "ssd",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>": "elementwise/other",
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>": "elementwise/other",
    "Memcpy DtoD (Device -> Device)": "elementwise/other",
}


@pytest.mark.parametrize("name,family", sorted(SEEN_ON_H200.items()))
def test_kernel_names_seen_on_the_h200_land_in_their_family(name: str, family: str) -> None:
    assert model_profile.family(name) == family


def test_linear_weights_count_every_projection_once_and_lm_head_apart() -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hidden, inter, vocab = 64, 96, 128
    cfg = Qwen3_5TextConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, vocab_size=vocab,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
                            linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                            layer_types=["linear_attention", "full_attention"])
    model = Qwen3_5ForCausalLM(cfg)
    body, head = model_profile.linear_params(model)
    assert head == vocab * hidden
    key, value, heads = 2 * 16, 2 * 16, 2 * 32
    gdn = hidden * (2 * key + value) + hidden * value + 2 * hidden * 2 + value * hidden  # qkv, z, b, a, out
    attention = hidden * 2 * heads + 2 * hidden * 32 + heads * hidden  # gated q, k, v, o
    mlp = 3 * hidden * inter
    assert body == gdn + attention + 2 * mlp
