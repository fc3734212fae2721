"""verify on a CUDA GPU (run on the device machine: `pytest -m gpu`): bf16 kernels, sdpa
attention, packed sequences, decode with a cache. Skipped without CUDA."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY_QWEN35 = {
    "model_type": "qwen3_5_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4, "vocab_size": 1024,
}


@pytest.fixture
def qwen(tmp_path):
    path = tmp_path / "qwen.json"
    path.write_text(json.dumps(TINY_QWEN35))
    return str(path)


# Known and measured (BENCHMARKS.md, Session 5): in bf16 this tiny model's A_log / dt_bias
# gradients come out 0.5 from an fp32 run on FLA's chunked backward vs 0.1 on the reference. With
# transformers' default init the log-decays are ~-11 per token, and dA_log = sum(dg * g) over the
# tokens is ill-conditioned (sum|terms| / |sum| up to 47 per head), which amplifies FLA's bf16
# rounding of dg. verify's FAIL is the true verdict for that configuration; the 8-layer
# Qwen3.5-27B verify passes. Kept visible as an expected failure, not skipped.
BF16_CONDITIONING = pytest.mark.xfail(reason="ill-conditioned per-head decay gradients in bf16 "
                                      "(FLA chunked dg); see BENCHMARKS.md Session 5", strict=False)


@pytest.mark.parametrize("dtype", [pytest.param("bf16", marks=BF16_CONDITIONING), "fp32"])
def test_verify_passes_on_cuda(qwen, dtype):
    from fastpath.proof.run_paths import verify_model

    result = verify_model(qwen, dtype=dtype, seq_len=128, batch=2, backward=True, decode_tokens=8, device="cuda")
    assert result.ok, result.problems
    assert result.model["device"].startswith("cuda")
    assert result.fast_calls.get("fwd:triton", 0) > 0 and result.fast_calls.get("update:triton", 0) > 0
