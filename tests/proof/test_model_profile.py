"""benchmarks/model_profile.py's bookkeeping on the CPU: the kernel-family classification the
BENCHMARKS table rests on (kernel names as the H200 reported them, BENCHMARKS.md Session 5) and the matmul
weight count behind its FLOP numbers. The profiling itself needs CUDA (device only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from repo_paths import ROOT, import_benchmark

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

model_profile = import_benchmark("model_profile")

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


class _Gate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.gate = _Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.proj(x)).exp()


def test_each_kernel_is_attributed_to_its_module_and_op_forward_and_backward() -> None:
    from torch.profiler import ProfilerActivity, profile

    block = _Block()
    x = torch.randn(4, 8, requires_grad=True)
    with model_profile.module_scopes(block), profile(activities=[ProfilerActivity.CPU]) as prof:
        block(x).sum().backward()
    assert not any(h for m in block.modules() for h in m._forward_hooks.values())  # hooks removed
    rows = model_profile.attributed_kernels(list(prof.events()), cpu=True)
    sources = {source for _name, source, _us in rows}
    assert "_Gate: aten::sigmoid" in sources
    assert "_Block: aten::exp" in sources  # the outer module, not the child that ran before
    assert "_Gate: SigmoidBackward0 (backward)" in sources  # found through the sequence number
    assert "_Block: ExpBackward0 (backward)" in sources
    assert not any(name in model_profile.NO_KERNEL_OPS for name, _s, _us in rows)
    split = model_profile.other_split(rows, steps=1, top=3)
    assert len(split["kernels"]) <= 3 and len(split["sources"]) <= 3
    assert split["ms"] >= max(k["ms"] for k in split["kernels"]) > 0
    assert all(s["kernels"] and s["calls"] >= 1 for s in split["sources"])


def test_scopes_leave_the_lm_head_unhooked_so_the_fused_loss_still_fits() -> None:
    """A hook on lm_head makes fastpath's fused-loss route keep transformers' loss: the profile of
    the train phase would then show log-softmax the timed step never ran."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from fastpath.routing import lm_head_route

    config = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               layer_types=["full_attention"], tie_word_embeddings=False)
    model = Qwen3_5ForCausalLM(config)
    assert lm_head_route.fits(model, {}, force=True)
    with model_profile.module_scopes(model):
        assert model.model._forward_pre_hooks and not model.lm_head._forward_pre_hooks
        assert lm_head_route.fits(model, {}, force=True)


def test_scopes_leave_the_fused_post_attention_norms_unhooked(monkeypatch) -> None:
    """With FASTPATH_ADD_NORM=auto a hooked post-attention norm keeps the separate add and norm:
    the profile would time a step the benchmark does not run. Its hook is left off (and the other
    modules keep theirs); without the route every module is hooked as before."""
    import fastpath
    from fastpath.routing import add_norm_route

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "routing"))
    from test_zc_norm_route import tiny_qwen3_5

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FASTPATH_ADD_NORM", "auto")
    fastpath.enable(warn=False)
    try:
        model = tiny_qwen3_5()
        layer = model.model.layers[0]
        assert hasattr(type(layer).forward, add_norm_route.ROUTE_ATTR)
        with model_profile.module_scopes(model):
            assert layer._forward_pre_hooks and layer.input_layernorm._forward_pre_hooks
            assert not layer.post_attention_layernorm._forward_pre_hooks
            assert add_norm_route._routed_norm_eps(layer.post_attention_layernorm) is not None
    finally:
        fastpath.disable()
    with model_profile.module_scopes(model):
        assert layer.post_attention_layernorm._forward_pre_hooks


def test_liger_configurations_name_a_bench_configuration() -> None:
    assert model_profile.split_config("fastpath+liger") == ("fastpath", True)
    assert model_profile.split_config("reference") == ("reference", False)
    assert model_profile.main(["--out", "/nonexistent-unused", "--configs", "nope+liger", "--smoke"]) == 2


def test_smoke_profile_splits_elementwise_other_for_fastpath_and_liger(tmp_path: Path) -> None:
    """The whole script on the CPU (tiny Qwen3.5, leaf CPU ops as kernels): one JSON row per
    configuration, each phase with the elementwise/other split naming GatedDeltaNet sources."""
    import importlib.util
    import json

    rc = model_profile.main(["--out", str(tmp_path), "--smoke", "--configs", "fastpath,fastpath+liger",
                             "--steps", "1", "--seq-len", "16", "--top", "5"])
    assert rc == 0
    doc = json.loads((tmp_path / "model_profile.json").read_text())
    rows = {r["config"]: r for r in doc["configs"]}
    assert set(rows) == {"fastpath", "fastpath+liger"}
    fast = rows["fastpath"]
    assert set(fast["phases"]) == {"prefill", "train"}, fast
    for phase in fast["phases"].values():
        split = phase["other_split"]
        assert 0 < len(split["sources"]) <= 5 and 0 < len(split["kernels"]) <= 5
        # the kernels end to end and the rest of the un-profiled step's wall; no CUDA, no sync scan
        assert phase["kernel_ms"] > 0 and phase["device_idle_ms"] >= 0 and "sync_points" not in phase
        assert phase["kernel_ms"] >= split["ms"]
    train_sources = [s["name"] for s in fast["phases"]["train"]["other_split"]["sources"]]
    assert any(s.startswith("Qwen3_5GatedDeltaNet: ") and s.endswith("(backward)") for s in train_sources)
    liger = rows["fastpath+liger"]
    if importlib.util.find_spec("liger_kernel") is None:
        assert liger["skipped"] == "not importable: liger_kernel"
    else:  # applied on the built model; Liger's Triton kernels need a GPU (the interpreter fails
        # inside them), so on this CPU each phase reports its one-line error and the run goes on
        assert liger["liger"] == "apply_liger_kernel_to_qwen3_5(model=...)"
        assert set(liger["phases"]) == {"prefill", "train"}
        for phase in liger["phases"].values():
            assert "other_split" in phase or "\n" not in phase["error"]


def test_device_time_counts_each_kernel_once_and_unclaimed_kernels_join_the_split() -> None:
    """Device-side events only: the launching op (CPU), the module scope mirrored on the device
    and a user annotation add nothing; a kernel no op claimed joins the rows as UNCLAIMED, so the
    split and the step's device time add up to what the device ran."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(i: int, name: str, start: int, end: int, device: bool, **kw) -> FunctionEvent:
        kind = DeviceType.CUDA if device else DeviceType.CPU
        return FunctionEvent(i, name, 0, start, end, device_type=kind, **kw)

    events = [event(0, "aten::mm", 0, 900, False), event(1, "nvjet_sm90_gemm", 10, 810, True),
              event(2, "_silu_mul_fwd_kernel", 820, 870, True), event(3, "Memset (Device)", 870, 875, True),
              event(4, model_profile.MODULE_SCOPE + "Qwen3_5MLP", 10, 875, True),
              event(5, "my range", 0, 875, True, is_user_annotation=True)]
    device = model_profile.device_kernels(events)
    assert device == {"nvjet_sm90_gemm": 800.0, "_silu_mul_fwd_kernel": 50.0, "Memset (Device)": 5.0}
    rows = [("nvjet_sm90_gemm", "Qwen3_5MLP: aten::mm", 800.0), ("Memset (Device)", "Qwen3_5MLP: aten::mm", 5.0)]
    rest = model_profile.unclaimed(rows, device)
    assert rest == [("_silu_mul_fwd_kernel", model_profile.UNCLAIMED, 50.0)]
    split = model_profile.other_split(rows + rest, 1, 5)
    assert split["ms"] == pytest.approx(0.055)  # the memset and the unclaimed Triton kernel
    assert model_profile.idle_split(855.0 * 2, 2, 1.0) == pytest.approx({"kernel_ms": 0.855, "device_idle_ms": 0.145})
    assert model_profile.idle_split(855.0, 1, 0.5)["device_idle_ms"] == 0.0  # profiler skew


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sync_points_name_the_line_that_synchronised() -> None:
    """A `.item()` mid-work is reported at its own line; work without one reports nothing."""
    import torch

    x = torch.randn(1024, device="cuda")
    line = sys._getframe().f_lineno + 1
    found = model_profile.sync_points(lambda: (x * 2).sum().item())
    assert [s["where"] for s in found] == [f"{__file__}:{line}"] and found[0]["count"] == 1
    assert model_profile.sync_points(lambda: torch.cumsum(x, 0)) == []
