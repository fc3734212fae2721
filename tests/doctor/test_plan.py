"""Model plans from facts only: per layer type, per op, per transformers version."""

from __future__ import annotations

import copy

from fakeenv import seed_facts

from fastpath.doctor.plan import plan_model
from fastpath.shared.model_source import load_config


def _ok(facts, dist, version="1.0"):
    facts["packages"][dist] = {"version": version, "so_files": [], "source": "fake",
                               "import": {"ok": True, "error_kind": None, "error": None}}


def _impls(plan):
    return {(t["layer_type"], r["op"]): r["impl"] for t in plan["layer_types"] for r in t["ops"]}


def test_counts_for_presets():
    facts = seed_facts()
    expect = {"qwen3.5-27b": (64, 48), "qwen3-next-80b-a3b": (48, 36), "lfm2": (16, 10),
              "mamba2": (64, 64), "nemotron-h-8b": (52, 24), "qwen3.5-35b-a3b": (40, 30)}
    for name, (total, slow) in expect.items():
        p = plan_model(load_config(name), facts, name)
        assert (p["layers_total"], p["layers_slow"]) == (total, slow), name


def test_nested_text_config_and_interval_without_layer_types():
    cfg = {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text",
                                                     "num_hidden_layers": 8,
                                                     "full_attention_interval": 4}}
    p = plan_model(cfg, seed_facts())
    assert p["model_type"] == "qwen3_5_text"
    assert {t["layer_type"]: t["count"] for t in p["layer_types"]} == {
        "linear_attention": 6, "full_attention": 2}


def test_without_transformers_shows_each_release_range():
    facts = seed_facts()
    facts["packages"]["transformers"] = {"version": None, "so_files": [], "source": "fake",
                                         "import": {"ok": False, "error_kind": "not-installed",
                                                    "error": "No module named 'transformers'"}}
    p = plan_model(load_config("qwen3.5-27b"), facts)
    assert p["transformers"] is None
    ranges = {v["range"]: v for v in p["by_version"]}
    # Qwen3.5 arrived in 5.2.0: the range holding it starts there, not at 5.0
    assert list(ranges) == ["4.57.x", "5.2-5.14", "5.15-5.16", "5.17-5.24", ">=5.25"]
    assert ranges["4.57.x"]["supported"] is False
    nemotron = plan_model(load_config("nemotron-h-8b"), facts)  # in transformers since 4.55
    assert [v["range"] for v in nemotron["by_version"]] == ["4.57.x", "5.0-5.14", "5.15-5.16", "5.17-5.24", ">=5.25"]
    assert ranges["5.17-5.24"]["layers_slow"] == 48
    assert "not installed" in p["summary"][0]


def test_514_needs_cuda_and_457_needs_metadata():
    facts = seed_facts()
    _ok(facts, "causal-conv1d", "1.6.1")
    facts["packages"]["transformers"]["version"] = "5.14.0"
    cfg = load_config("qwen3-next-80b-a3b")
    assert _impls(plan_model(cfg, facts))[("linear_attention", "causal_conv1d_fn")] == "fast-kernel"
    no_cuda = copy.deepcopy(facts)
    no_cuda["torch"]["cuda_available"] = False
    r = next(r for t in plan_model(cfg, no_cuda)["layer_types"] for r in t["ops"])
    assert r["impl"] == "torch-fallback" and "CUDA" in r["reason"]
    # 5.15+ has no CUDA check at import
    no_cuda["packages"]["transformers"]["version"] = "5.17.0"
    assert _impls(plan_model(cfg, no_cuda))[("linear_attention", "causal_conv1d_fn")] == "fast-kernel"
    # 4.57 needs dist-info metadata (a sys.modules shim without it is "not available")
    shim = copy.deepcopy(facts)
    shim["packages"]["transformers"]["version"] = "4.57.6"
    shim["packages"]["causal-conv1d"]["version"] = None
    assert _impls(plan_model(cfg, shim))[("linear_attention", "causal_conv1d_fn")] == "torch-fallback"


def test_mamba_all_or_nothing_and_kernels_hub_only():
    facts = seed_facts()
    _ok(facts, "causal-conv1d", "1.6.1")
    p = plan_model(load_config("mamba2"), facts)
    # causal_conv1d imports, but mamba_ssm is missing: every op goes to torch
    assert set(_impls(p).values()) == {"torch-fallback"}
    assert p["layers_slow"] == 64
    _ok(facts, "mamba-ssm", "2.2.4")
    assert plan_model(load_config("mamba2"), facts)["layers_slow"] == 0
    facts["packages"]["transformers"]["version"] = "5.12.1"
    _ok(facts, "kernels", "0.16.2")
    impls = _impls(plan_model(load_config("mamba2"), facts))
    assert impls[("mamba", "causal_conv1d_fn")] == "hub-kernel"


def test_nemotron_h_pattern_and_unknown_family():
    cfg = {"model_type": "nemotron_h", "num_hidden_layers": 6, "hybrid_override_pattern": "M-M*-E"}
    p = plan_model(cfg, seed_facts())
    assert {t["layer_type"]: t["count"] for t in p["layer_types"]} == {
        "mamba": 2, "mlp": 2, "attention": 1, "moe": 1}
    assert p["layers_slow"] == 2
    other = plan_model({"model_type": "llama", "num_hidden_layers": 32}, seed_facts())
    assert other["family"] is None and other["layers_slow"] == 0
