"""One interpreter: what the doctor's plan says each GatedDeltaNet op resolves
to after fastpath.enable(), and what explain() says after a real enable(), in THIS environment
(the transformers / `kernels` / USE_HUB_KERNELS of the interpreter running it). Prints JSON.

Run by tests/routing/test_hub_story.py under each side-by-side venv (.venvs/tf-*), like matrix_worker.py.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import transformers

    from fastpath.doctor.diagnosis import diagnose
    from fastpath.doctor.probe import collect
    from fastpath.routing.engine import disable, enable, explain

    facts = collect(skip=["imports"])  # the real probe of this interpreter (static: no imports)
    plan = diagnose(facts, "qwen3.5-27b").model_plan
    doctor = {r["op"]: {"impl": r["impl"], "with_fastpath": r["with_fastpath"],
                        "by": r.get("with_fastpath_by"), "needs": r.get("with_fastpath_needs")}
              for t in plan["layer_types"] for r in t["ops"]}

    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"])
    model = Qwen3_5ForCausalLM(cfg).eval()
    env = os.environ.get("USE_HUB_KERNELS")
    report = enable(warn=False)
    try:
        table = explain(model)
        after = {r["op"]: r["impl"] for r in table.rows if r["layer_type"].endswith("GatedDeltaNet")}
        env_after = os.environ.get("USE_HUB_KERNELS")
    finally:
        disable()
    json.dump({"transformers": transformers.__version__, "env": env, "env_after_enable": env_after,
               "doctor": doctor, "explain": after, "explain_notes": table.notes,
               "notes": report.notes, "env_semantics": _env_semantics()}, sys.stdout)


def _env_semantics() -> dict[str, list[bool]]:
    """fastpath.shared.hub_kernels_env.on(value) next to transformers' own reading of the variable
    (5.25's `_kernels_enabled()` reads it at call time; older releases once, at import)."""
    from transformers.integrations import hub_kernels

    import fastpath.shared.hub_kernels_env as hub_kernels_env

    if not callable(getattr(hub_kernels, "_kernels_enabled", None)):
        return {}
    out = {}
    saved = os.environ.pop("USE_HUB_KERNELS", None)
    try:
        for value in (None, "1", "YES", "y", "true", "ON", "0", "no", "off", "false", "maybe", ""):
            if value is None:
                os.environ.pop("USE_HUB_KERNELS", None)
            else:
                os.environ["USE_HUB_KERNELS"] = value
            out[repr(value)] = [hub_kernels_env.on(value), bool(hub_kernels._kernels_enabled())]
    finally:
        os.environ.pop("USE_HUB_KERNELS", None)
        if saved is not None:
            os.environ["USE_HUB_KERNELS"] = saved
    return out


if __name__ == "__main__":
    main()
