"""The doctor's plan for the Mamba-2 families: without mamba_ssm every op of every Mamba layer takes
the torch fallback (all-or-nothing), and after fastpath.enable() they are fast on every version."""

from __future__ import annotations

import pytest
from fakeenv import seed_facts

from fastpath.doctor.families import family_for
from fastpath.doctor.plan import VERSION_RANGES, plan_model
from fastpath.shared.model_source import load_config

MAMBA2_PRESETS = {  # preset -> (model_type, layers, Mamba-2 layers)
    "nemotron-h-8b": ("nemotron_h", 52, 24),
    "mamba2-codestral-7b": ("mamba2", 64, 64),
    "granite-4.0-h-small": ("granitemoehybrid", 40, 36),
    "falcon-h1-7b": ("falcon_h1", 44, 44),
    "zamba2-7b": ("zamba2", 81, 81),
    "bamba-9b": ("bamba", 32, 29),
}


def _ok(facts: dict, dist: str, version: str = "1.0") -> None:
    facts["packages"][dist] = {"version": version, "so_files": [], "source": "fake",
                               "import": {"ok": True, "error_kind": None, "error": None}}


@pytest.mark.parametrize("preset", sorted(MAMBA2_PRESETS))
def test_preset_loads_and_is_a_mamba2_family(preset: str) -> None:
    model_type, total, mamba = MAMBA2_PRESETS[preset]
    config = load_config(preset)
    assert config["model_type"] == model_type
    fam = family_for(model_type)
    assert fam is not None and fam.name == "mamba2"
    plan = plan_model(config, seed_facts(), preset)
    assert plan["layers_total"] == total
    assert {t["layer_type"]: t["count"] for t in plan["layer_types"]}.get("mamba") == mamba


@pytest.mark.parametrize("version", ["4.57.6", "5.12.1", "5.17.0", "5.23.0", "5.25.0"])
def test_without_mamba_ssm_every_op_falls_back_and_fastpath_fixes_it(version: str) -> None:
    facts = seed_facts()
    facts["packages"]["transformers"]["version"] = version
    facts["env"]["USE_HUB_KERNELS"] = "0"
    plan = plan_model(load_config("granite-4.0-h-small"), facts, "granite-4.0-h-small")
    assert plan["layers_slow"] == 36
    assert ("36 of 40 layers take the torch fallback for mamba_chunk_scan_combined (mamba_ssm not importable)"
            in plan["summary"])
    rows = {r["op"]: r for t in plan["layer_types"] if t["layer_type"] == "mamba" for r in t["ops"]}
    assert set(rows) == {"causal_conv1d_fn", "causal_conv1d_update", "mamba_chunk_scan_combined",
                         "mamba_split_conv1d_scan_combined", "selective_state_update"}
    assert all(r["with_fastpath"] == "fastpath-triton" for r in rows.values()), rows
    assert plan["layers_slow_with_fastpath"] == 0


def test_nemotron_h_8b_on_5_17() -> None:
    facts = seed_facts()
    plan = plan_model(load_config("nemotron-h-8b"), facts, "nemotron-h-8b")
    assert "24 of 52 layers take the torch fallback for selective_state_update (mamba_ssm not importable)" \
        in plan["summary"]
    assert (plan["layers_slow"], plan["layers_slow_with_fastpath"]) == (24, 0)


def test_working_mamba_ssm_is_kept() -> None:
    facts = seed_facts()
    _ok(facts, "causal-conv1d", "1.6.1")
    _ok(facts, "mamba-ssm", "2.2.4")
    plan = plan_model(load_config("bamba-9b"), facts)
    rows = [r for t in plan["layer_types"] for r in t["ops"]]
    assert all(r["impl"] == "fast-kernel" for r in rows)
    # enable() keeps the working mamba_ssm, and routes causal_conv1d to fastpath as everywhere
    # (modeling_patch.patch_module; explain() says so): the plan tells the same story
    assert {r["op"]: r["with_fastpath"] for r in rows} == {
        "causal_conv1d_fn": "fastpath-triton", "causal_conv1d_update": "fastpath-triton",
        "mamba_chunk_scan_combined": "fast-kernel", "mamba_split_conv1d_scan_combined": "fast-kernel",
        "selective_state_update": "fast-kernel"}


MAMBA1_PRESETS = {  # preset -> (model_type, layers, layers running a Mamba-1 mixer, its ops)
    "mamba-2.8b": ("mamba", 64, 64, {"selective_scan_fn", "selective_state_update", "mamba_inner_fn"}),
    "falcon-mamba-7b": ("falcon_mamba", 64, 64, {"selective_scan_fn", "selective_state_update", "mamba_inner_fn"}),
    "jamba-mini-1.7": ("jamba", 32, 28, {"selective_scan_fn", "selective_state_update"}),
    "zamba-7b": ("zamba", 76, 76, {"selective_scan_fn", "selective_state_update"}),
}


@pytest.mark.parametrize("preset", sorted(MAMBA1_PRESETS))
@pytest.mark.parametrize("version", ["4.57.6", "5.12.1", "5.17.0", "5.25.0"])
def test_mamba1_families_are_slow_without_mamba_ssm_and_fast_after_enable(preset: str, version: str) -> None:
    """routing/selective_scan_route.py routes selective_scan_fn, selective_state_update and mamba_inner_fn."""
    model_type, total, mamba, ops = MAMBA1_PRESETS[preset]
    facts = seed_facts()
    facts["packages"]["transformers"]["version"] = version
    facts["env"]["USE_HUB_KERNELS"] = "0"
    plan = plan_model(load_config(preset), facts, preset)
    assert (plan["model_type"], plan["family"], plan["layers_total"]) == (model_type, "mamba1", total)
    assert plan["layers_slow"] == mamba and plan["layers_slow_with_fastpath"] == 0
    rows = {r["op"]: r for t in plan["layer_types"] if t["layer_type"] == "mamba" for r in t["ops"]}
    assert set(rows) == {"causal_conv1d_fn", "causal_conv1d_update"} | ops
    assert all(r["impl"] == "torch-fallback" and r["with_fastpath"] == "fastpath-triton" for r in rows.values())


def test_every_release_range_is_fast_with_fastpath() -> None:
    facts = seed_facts()
    facts["packages"].pop("transformers", None)
    plan = plan_model(load_config("mamba2-codestral-7b"), facts)
    assert [p["range"] for p in plan["by_version"]] == [r for r, _ in VERSION_RANGES]
    for p in plan["by_version"]:
        assert p["layers_slow"] == 64 and p["layers_slow_with_fastpath"] == 0, p["range"]
