"""Runs under one transformers version (a venv's python) and prints one JSON object.

For every hybrid family that version has: build a tiny random model, run forward + a short greedy
generate (with cache) on the reference path, then again after fastpath.enable() (the model built
BEFORE enable, and a second one built AFTER it), count calls at fastpath's kernel entry points
(fastpath.kernels.counters.CALLS) and record fastpath.explain(). Also: lfm2 packed sequences vs the
sequences run one by one, and (with --offline-load) save_pretrained + from_pretrained offline.
tests/routing/test_enable_matrix.py asserts on the JSON; this file decides nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from typing import Any

import torch

# config model_type -> constructor overrides (tiny); sizes a family does not know are dropped
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, max_position_embeddings=128, tie_word_embeddings=False,
              initializer_range=0.2, use_mamba_kernels=False)
GDN = dict(linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
           linear_value_head_dim=8, linear_conv_kernel_dim=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=32, num_local_experts=4)
MAMBA2 = dict(state_size=8, mamba_d_state=8, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
              mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, n_groups=1, num_heads=4,
              chunk_size=8, expand=2, conv_kernel=4)
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3_next": {**COMMON, **GDN, **MOE, "layer_types": ["linear_attention", "full_attention"]},
    "qwen3_5_text": {**COMMON, **GDN, "layer_types": ["linear_attention", "full_attention"]},
    "qwen3_5_moe_text": {**COMMON, **GDN, **MOE, "layer_types": ["linear_attention", "full_attention"]},
    "olmo_hybrid": {**COMMON, **GDN, "layer_types": ["linear_attention", "full_attention"]},
    "kimi_linear": {**COMMON, **MOE, "linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2],
                    "num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4}, "first_k_dense_replace": 2,
                    "num_key_value_heads": 2, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
                    "kv_lora_rank": 16, "q_lora_rank": None},
    "lfm2": {**COMMON, "layer_types": ["conv", "full_attention"], "conv_L_cache": 3, "block_ff_dim": 64,
             "block_auto_adjust_ff_dim": False},
    "lfm2_moe": {**COMMON, **MOE, "layer_types": ["conv", "full_attention"], "conv_L_cache": 3,
                 "num_dense_layers": 1},
    "mamba": {**COMMON, "state_size": 8, "expand": 2, "conv_kernel": 4, "time_step_rank": 4},
    "falcon_mamba": {**COMMON, "state_size": 8, "expand": 2, "conv_kernel": 4, "time_step_rank": 4},
    "mamba2": {**COMMON, **MAMBA2, "head_dim": 16},
    "jamba": {**COMMON, **MOE, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 4,
              "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {**COMMON, **MAMBA2, "attn_layer_indices": [1]},
    "falcon_h1": {**COMMON, **MAMBA2, "mamba_d_ssm": 64},
    "granitemoehybrid": {**COMMON, **MAMBA2, **MOE, "layer_types": ["mamba", "attention"],
                         "shared_intermediate_size": 32},
    "nemotron_h": {**COMMON, **MAMBA2, "hybrid_override_pattern": "M*", "layers_block_type": ["mamba", "attention"],
                   "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8},
    "zamba": {**COMMON, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 4,
              "layers_block_type": ["mamba", "hybrid"], "n_mamba_heads": 2, "attention_head_dim": 16},
    "zamba2": {**COMMON, **MAMBA2, "layers_block_type": ["mamba", "hybrid"], "mamba_headdim": 16,
               "n_mamba_heads": 4, "attention_head_dim": 16, "use_mem_rope": False, "num_mem_blocks": 1},
    # 5.25 newcomers found by discovery (no hard-coded routing for them in fastpath)
    "lfm3": {**COMMON, **GDN, **MOE, "layer_types": ["conv", "full_attention"]},
    "lara_mini": {**COMMON, **GDN, **MOE},
    "bailing_hybrid": {**COMMON, **GDN, **MOE, "layer_types": ["linear_attention", "full_attention"],
                       "num_key_value_heads": 2, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
                       "kv_lora_rank": 16, "q_lora_rank": None},
}
# constructor-only keys (not attributes of the config) that must reach __init__
ALWAYS_PASS = ("linear_attn_config", "layers_block_type")
# family (modeling module dir) of each config model_type
MODULE_OF = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}


def build(model_type: str, seed: int = 0) -> Any:
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    known = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
    kwargs = {k: v for k, v in FAMILIES[model_type].items() if k in known or k in ALWAYS_PASS}
    config = cls(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    return model.float().eval()


def run_model(model: Any, ids: torch.Tensor, gen_tokens: int) -> tuple[torch.Tensor, list[list[int]]]:
    with torch.no_grad():
        logits = model(ids).logits
        gen = model.generate(ids, max_new_tokens=gen_tokens, do_sample=False, min_new_tokens=gen_tokens,
                             pad_token_id=0)
    return logits, gen.tolist()


def calls() -> dict[str, int]:
    from fastpath.kernels.counters import CALLS

    return dict(CALLS)


def family_case(model_type: str, interp: bool, gen_tokens: int) -> dict[str, Any]:
    import fastpath
    from fastpath.kernels.counters import reset

    res: dict[str, Any] = {"family": MODULE_OF.get(model_type, model_type)}
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    model = build(model_type)
    ref_logits, ref_gen = run_model(model, ids, gen_tokens)
    ref_loss, ref_grads = train_step(model, ids)
    res["scale"] = float(ref_logits.abs().max())
    res["explain_before"] = fastpath.explain(model).rows
    reset()
    report = fastpath.enable(warn=False, lift_device_gate=interp)
    try:
        res["explain"] = fastpath.explain(model).rows
        fast_logits, fast_gen = run_model(model, ids, gen_tokens)
        res["calls"] = calls()
        res["max_abs_diff"] = float((fast_logits - ref_logits).abs().max())
        res["gen_equal"] = fast_gen == ref_gen
        fast_loss, fast_grads = train_step(model, ids)  # one training step: loss and every gradient
        res["loss_diff"] = abs(fast_loss - ref_loss)
        res["grad_diff"] = max((float((fast_grads[n] - g).abs().max()) / max(float(g.abs().max()), 1e-12)
                                for n, g in ref_grads.items()), default=0.0)
        res["grad_names_equal"] = set(fast_grads) == set(ref_grads)
        reset()
        model2 = build(model_type)  # built after enable()
        with torch.no_grad():
            res["after_build_diff"] = float((model2(ids).logits - ref_logits).abs().max())
        res["calls_after_build"] = calls()
        res["explain_after_build"] = fastpath.explain(model2).rows
        res["report"] = str(report)
    finally:
        fastpath.disable()
    reset()
    with torch.no_grad():
        res["disabled_diff"] = float((model(ids).logits - ref_logits).abs().max())
    res["calls_after_disable"] = calls()
    res["explain_after_disable"] = fastpath.explain(model).rows
    return res


def packed_lfm2(interp: bool) -> dict[str, Any]:
    """Two sequences packed into one row (seq_idx) must equal the two run separately."""
    FAMILIES["lfm2"]["layer_types"] = ["conv", "conv"]  # conv only: packing isolates the kernel
    try:
        model = build("lfm2")
    finally:
        FAMILIES["lfm2"]["layer_types"] = ["conv", "full_attention"]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # O(1) weights so a leak across the sequence boundary is visible
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if p.dim() > 1 else 0.1) + (p.dim() == 1))
    return packed_vs_one_by_one(model, 6, interp, leak_with_positions=True)


def offline_load(model_type: str) -> dict[str, Any]:
    """save_pretrained a tiny model, then from_pretrained it with the Hub unreachable."""
    from transformers import AutoModelForCausalLM

    import fastpath
    from fastpath.kernels.counters import reset

    out: dict[str, Any] = {}
    model = build(model_type)
    ids = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(ids).logits
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        try:  # what the same load does without fastpath (5.25: use_kernels defaults to True)
            AutoModelForCausalLM.from_pretrained(tmp)
            out["baseline_error"] = None
        except Exception as exc:
            out["baseline_error"] = f"{type(exc).__name__}: {exc}"
        reset()
        fastpath.enable(warn=False)
        try:
            out["env_USE_HUB_KERNELS"] = os.environ.get("USE_HUB_KERNELS")
            loaded = AutoModelForCausalLM.from_pretrained(tmp).float().eval()
            out["use_kernels"] = bool(getattr(loaded, "use_kernels", False))
            with torch.no_grad():
                got = loaded(ids).logits
            out["diff"] = float((got - ref).abs().max())
            out["calls"] = calls()
            out["explain"] = fastpath.explain(loaded).rows
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc()[-2000:]
        finally:
            fastpath.disable()
    out["env_after_disable"] = os.environ.get("USE_HUB_KERNELS")
    return out


# ---------------------------------------------------------------- Mamba-2 families
MAMBA2_TYPES = ("mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba2")
# layer layouts with no attention, so a packed row has nothing but Mamba-2 mixers to keep apart
MAMBA_ONLY = {"bamba": {"attn_layer_indices": []}, "granitemoehybrid": {"layer_types": ["mamba", "mamba"]},
              "nemotron_h": {"hybrid_override_pattern": "MM", "layers_block_type": ["mamba", "mamba"]},
              "zamba2": {"layers_block_type": ["mamba", "mamba"]}}


def build_mamba(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny model of a Mamba-2 family with its kernel path allowed (use_mamba_kernels) and O(1)
    random weights everywhere, so every op's contribution reaches the logits."""
    import transformers

    saved = dict(FAMILIES[model_type])
    FAMILIES[model_type].update(use_mamba_kernels=True, time_step_min=1e-6, **overrides)
    old = tuple(map(int, transformers.__version__.split(".")[:2])) <= (5, 14)
    if model_type in ("zamba2", "nemotron_h") and old:
        # their <=5.14 torch_forward disagrees with the SSD definition once a prompt spans two chunks
        # (fastpath's path matches the float64 recurrence there): compare on single-chunk prompts
        FAMILIES[model_type].update(chunk_size=16, mamba_chunk_size=16)
    try:
        model = build(model_type, seed)
    finally:
        FAMILIES[model_type].clear()
        FAMILIES[model_type].update(saved)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 - 0.5)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 - 1.0)
            elif p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / max(1, p.shape[-1]) ** 0.5)
    return model


def train_step(model: Any, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.eval()
    return float(loss), grads


def routed_case(build: Any, model_type: str, interp: bool, gen_tokens: int, seq_len: int) -> dict[str, Any]:
    """Reference path vs enable() on build(model_type): logits, greedy decode (cache), one training
    step (loss and every parameter gradient), explain() before/with/after, kernel entry counts,
    exact disable()."""
    import fastpath
    from fastpath.kernels.counters import reset

    res: dict[str, Any] = {"family": model_type}
    ids = torch.randint(3, 64, (2, seq_len), generator=torch.Generator().manual_seed(1))
    model = build(model_type)
    ref_logits, ref_gen = run_model(model, ids, gen_tokens)
    ref_loss, ref_grads = train_step(model, ids)
    res["scale"] = float(ref_logits.abs().max())
    res["explain_before"] = fastpath.explain(model).rows
    reset()
    report = fastpath.enable(warn=False, lift_device_gate=interp)
    try:
        res["report"] = str(report)
        res["explain"] = fastpath.explain(model).rows
        fast_logits, fast_gen = run_model(model, ids, gen_tokens)
        res["calls"] = calls()
        res["max_abs_diff"] = float((fast_logits - ref_logits).abs().max())
        res["gen_equal"] = fast_gen == ref_gen
        reset()
        loss, grads = train_step(model, ids)
        res["train_calls"] = calls()
        res["loss_diff"] = abs(loss - ref_loss)
        res["grad_names_equal"] = sorted(grads) == sorted(ref_grads)
        res["grad_rel_diff"] = max(float((grads[n] - g).abs().max()) / max(1e-6, float(g.abs().max()))
                                   for n, g in ref_grads.items() if n in grads)
        reset()
        model2 = build(model_type)  # built after enable()
        with torch.no_grad():
            res["after_build_diff"] = float((model2(ids).logits - ref_logits).abs().max())
        res["calls_after_build"] = calls()
    finally:
        fastpath.disable()
    reset()
    with torch.no_grad():
        res["disabled_diff"] = float((model(ids).logits - ref_logits).abs().max())
        res["disabled_diff_built_during"] = float((model2(ids).logits - ref_logits).abs().max())
    res["calls_after_disable"] = calls()
    res["explain_after_disable"] = fastpath.explain(model).rows
    return res


def mamba_case(model_type: str, interp: bool, gen_tokens: int) -> dict[str, Any]:
    """routed_case for a Mamba-2 family."""
    return routed_case(build_mamba, model_type, interp, gen_tokens, seq_len=9)


def packed_vs_one_by_one(model: Any, second: int, interp: bool, *, leak_with_positions: bool) -> dict[str, Any]:
    """Two sequences (5 and `second` tokens) packed in one row (seq_idx, position_ids) through
    enable()'s path vs the two run one by one; `leak_diff`: the reference path on the packed row
    without seq_idx (position_ids too where `leak_with_positions`), the leak the check must see."""
    import fastpath
    from fastpath.kernels.counters import reset

    a = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(2))
    b = torch.randint(3, 64, (1, second), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        sep = torch.cat([model(a, use_cache=False).logits, model(b, use_cache=False).logits], dim=1)
    packed = torch.cat([a, b], dim=1)
    seq_idx = torch.tensor([[0] * 5 + [1] * second], dtype=torch.int32)
    position_ids = torch.tensor([list(range(5)) + list(range(second))])
    out: dict[str, Any] = {"scale": float(sep.abs().max())}
    leak_kwargs = {"position_ids": position_ids} if leak_with_positions else {}
    with torch.no_grad():
        out["leak_diff"] = float((model(packed, use_cache=False, **leak_kwargs).logits - sep).abs().max())
    reset()
    fastpath.enable(warn=False, lift_device_gate=interp)
    try:
        with torch.no_grad():
            got = model(packed, seq_idx=seq_idx, position_ids=position_ids, use_cache=False).logits
        out["diff"] = float((got - sep).abs().max())
        out["calls"] = calls()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        fastpath.disable()
    return out


def mamba_packed(model_type: str, interp: bool) -> dict[str, Any]:
    """Two sequences packed in one row (seq_idx, position_ids) vs the two run one by one."""
    model = build_mamba(model_type, **MAMBA_ONLY.get(model_type, {}))
    return packed_vs_one_by_one(model, 7, interp, leak_with_positions=False)


def mamba_main(interp: bool, gen_tokens: int, wanted: list[str]) -> dict[str, Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    out: dict[str, Any] = {"families": {}, "packed": {}}
    for model_type in wanted or MAMBA2_TYPES:
        if model_type not in CONFIG_MAPPING_NAMES:
            continue
        for key, fn in (("families", lambda t=model_type: mamba_case(t, interp, gen_tokens)),
                        ("packed", lambda t=model_type: mamba_packed(t, interp))):
            try:
                out[key][model_type] = fn()
            except Exception as exc:
                out[key][model_type] = {"error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc()[-3000:]}
    return out


# ---------------------------------------------------------------- Mamba-1 families
MAMBA1_TYPES = ("mamba", "falcon_mamba", "jamba", "zamba")


def build_mamba1(model_type: str, seed: int = 0) -> Any:
    """A tiny Mamba-1 family model with O(1) random weights (every op reaches the logits).
    use_mamba_kernels stays False: <=5.14 zamba raises on CPU with it (its kernel path is CUDA-only)
    and jamba turns it off; enable(lift_device_gate=True) lets the interpreter past both gates."""
    saved = dict(FAMILIES[model_type])
    FAMILIES[model_type].update(time_step_min=1e-3, use_mamba_kernels=False)
    try:
        model = build(model_type, seed)
    finally:
        FAMILIES[model_type].clear()
        FAMILIES[model_type].update(saved)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 - 0.5)
            elif name.endswith(("dt_proj.bias", "dt_proj_bias")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 - 1.0)
            elif p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / max(1, p.shape[-1]) ** 0.5)
    return model


def mamba1_case(model_type: str, interp: bool, gen_tokens: int) -> dict[str, Any]:
    """routed_case for a Mamba-1 family (no packed case: no release carries seq_idx to its scan)."""
    return routed_case(build_mamba1, model_type, interp, gen_tokens, seq_len=5)


def mamba1_main(interp: bool, gen_tokens: int, wanted: list[str]) -> dict[str, Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    out: dict[str, Any] = {"families": {}}
    for model_type in wanted or MAMBA1_TYPES:
        if model_type not in CONFIG_MAPPING_NAMES:
            continue
        try:
            out["families"][model_type] = mamba1_case(model_type, interp, gen_tokens)
        except Exception as exc:
            out["families"][model_type] = {"error": f"{type(exc).__name__}: {exc}",
                                           "traceback": traceback.format_exc()[-3000:]}
    return out


def _stack_versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide how transformers reaches each op."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("transformers", "kernels", "torch", "triton", "fla-core"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="", help="comma list of config model_types (default: all present)")
    ap.add_argument("--gen-tokens", type=int, default=3)
    ap.add_argument("--offline-load", default="", help="model_type to save/load offline")
    ap.add_argument("--skip-packed", action="store_true")
    ap.add_argument("--mamba", action="store_true", help="only the Mamba-2 family checks")
    ap.add_argument("--mamba1", action="store_true", help="only the Mamba-1 family checks")
    ap.add_argument("--scan-reference", action="store_true",
                    help="run the SSD chunk scan on its float reference (its Triton kernels are slow under "
                         "the CPU interpreter; one version runs them, the others check the routing)")
    args = ap.parse_args()
    import interpreter_speed  # this script's folder, tests/support, is first on sys.path

    interpreter_speed.install()
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    import fastpath.routing.modeling_patch as mp

    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if args.mamba1:
        if args.scan_reference:
            from fastpath.kernels.selective_scan import interface as scan_interface

            scan_interface.KERNELS_READY = False
        result = {"scan_reference": args.scan_reference, "transformers": transformers.__version__, "interp": interp,
                  **mamba1_main(interp, args.gen_tokens, [f for f in args.families.split(",") if f])}
        json.dump(result, sys.stdout)
        return 0
    if args.mamba:
        if args.scan_reference:
            from fastpath.kernels.ssd import interface as ssd_interface

            ssd_interface.KERNELS_READY = False
        result = {"scan_reference": args.scan_reference, "transformers": transformers.__version__, "interp": interp,
                  **mamba_main(interp, args.gen_tokens, [f for f in args.families.split(",") if f])}
        json.dump(result, sys.stdout)
        return 0
    # the Mamba families' scans run their float reference here (routed through fastpath all the
    # same): tests/routing/test_mamba_matrix.py (--mamba) and test_mamba1_matrix.py (--mamba1) run
    # their Triton kernels, which under the CPU interpreter cost minutes per version
    from fastpath.kernels.selective_scan import interface as scan_interface
    from fastpath.kernels.ssd import interface as ssd_interface

    scan_interface.KERNELS_READY = False
    ssd_interface.KERNELS_READY = False
    wanted = [f for f in (args.families.split(",") if args.families else FAMILIES) if f]
    result: dict[str, Any] = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "kernels_installed": __import__("importlib.util").util.find_spec("kernels") is not None,
        "stack": _stack_versions(),
        "discovered": [m.split(".")[2] for m in mp.discover_modeling_modules()],
        "families": {},
    }
    result["skipped"] = {}
    for model_type in wanted:
        if model_type not in CONFIG_MAPPING_NAMES:
            continue
        if MODULE_OF.get(model_type, model_type) not in result["discovered"]:
            result["skipped"][model_type] = "its modeling code does not use causal_conv1d in this version"
            continue
        try:
            result["families"][model_type] = family_case(model_type, interp, args.gen_tokens)
        except Exception as exc:
            result["families"][model_type] = {"error": f"{type(exc).__name__}: {exc}",
                                              "traceback": traceback.format_exc()[-3000:]}
    if not args.skip_packed and "lfm2" in CONFIG_MAPPING_NAMES and (not args.families or "lfm2" in wanted):
        try:
            result["packed_lfm2"] = packed_lfm2(interp)
        except Exception as exc:
            result["packed_lfm2"] = {"error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-3000:]}
    if args.offline_load:
        result["offline_load"] = offline_load(args.offline_load)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
