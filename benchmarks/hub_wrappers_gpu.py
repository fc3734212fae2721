"""transformers >= 5.25 with `kernels` installed, on a GPU, offline: what each op runs before and
after fastpath.enable(), and what from_pretrained does with Hub kernels on (its default).

Per tiny random model (Qwen3.5, Qwen3-Next, Nemotron-H, Falcon-Mamba; bf16 on CUDA):
  * explain() rows before enable() and after it;
  * one forward + backward without fastpath (ran, or the exception the user would get), then one
    after enable(): kernel-call counters (fastpath's entry points), loss and logits against the
    same weights in float32 on the CPU;
  * save_pretrained, then from_pretrained(dir) with HF_HUB_OFFLINE=1 and USE_HUB_KERNELS as the
    user left it, with and without enable(): loaded or the exception, and the explain() rows.
Writes one JSON document (--out). Run by benchmarks/device/parts.sh (part `hub`) with transformers
5.25 + kernels 0.19.1 carried as wheels.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # matrix_worker

FAMILIES = ("qwen3_5_text", "qwen3_next", "nemotron_h", "falcon_mamba")


def _rows(model: Any) -> list[dict[str, Any]]:
    import fastpath

    return [{k: r[k] for k in ("layer", "op", "impl", "fast")} for r in fastpath.explain(model).rows]


def _step(model: Any, ids: Any) -> tuple[float, Any]:
    """One training step's loss, and the logits. Under enable() the fused LM-head loss route
    returns the loss without logits (logits=None) for a call with labels, as a user's training
    step gets it; the logits then come from a second, gradient-free forward without labels."""
    import torch

    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    logits = out.logits
    if logits is None:
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits
    return float(out.loss.detach()), logits.detach().float()


def family(model_type: str, device: str) -> dict[str, Any]:
    import torch
    from matrix_worker import build

    import fastpath
    from fastpath.kernels.counters import CALLS, reset

    res: dict[str, Any] = {}
    model = build(model_type).to(device, torch.bfloat16)
    ids = torch.randint(3, 64, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
    res["explain_before"] = _rows(model)
    # The reference: the same weights in float32 on the CPU (transformers' torch path). Not the
    # plain GPU model: with fla-core installed, its gated-delta-rule backward raises on Hopper with
    # Triton >= 3.4, < 3.7.1 (FLA #640), which is what the user gets without fastpath; recorded.
    ref_model = copy.deepcopy(model).to("cpu", torch.float32)
    ref_loss, ref_logits = _step(ref_model, ids.cpu())
    del ref_model
    try:
        _step(model, ids)
        res["plain_step"] = "ran"
    except Exception as exc:  # the user's stack without fastpath: recorded, not fatal
        res["plain_step"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    reset()
    report = fastpath.enable(warn=False)
    try:
        res["enable"] = str(report)
        res["explain_after"] = _rows(model)
        loss, logits = _step(model, ids)
        res["calls"] = dict(CALLS)
        res["loss"], res["ref_loss"] = loss, ref_loss
        res["logits_rel"] = float((logits.cpu() - ref_logits).norm() / ref_logits.norm())
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            res["load_enabled"] = _load(tmp, device)
            fastpath.disable()
            res["load_plain"] = _load(tmp, device)
    finally:
        fastpath.disable()
    return res


def _load(path: str, device: str) -> dict[str, Any]:
    """from_pretrained onto the GPU, offline, Hub kernels as transformers defaults them."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        placed = {"device_map": device} if device != "cpu" else {}  # (device_map needs accelerate)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **placed)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return {"kernelized": bool(getattr(model, "_use_kernels", False)), "explain": _rows(model)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--device", default="cuda", help="cuda (the point); cpu only to try the script")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"comma list of model types (default {','.join(FAMILIES)})")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        ap.error(f"unknown model type(s) {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    import torch
    import transformers

    doc: dict[str, Any] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "env": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "USE_HUB_KERNELS")},
                           "families": {}}
    try:
        import kernels

        doc["kernels"] = getattr(kernels, "__version__", "?")
    except Exception as exc:
        doc["kernels"] = f"not importable: {exc}"
    for model_type in families:
        try:
            doc["families"][model_type] = family(model_type, args.device)
        except Exception as exc:
            doc["families"][model_type] = {"error": f"{type(exc).__name__}: {exc}",
                                           "traceback": traceback.format_exc()[-2000:]}
        Path(args.out).write_text(json.dumps(doc, indent=1))
        res = doc["families"][model_type]
        slow = [f"{r['op']}: {r['impl']}" for r in res.get("explain_after", []) if not r["fast"]]
        calls = res.get('calls')
        print(f"{model_type}: {res.get('error') or f'{len(slow)} slow after enable(); calls {calls}'}")
        if "plain_step" in res:
            print(f"  without fastpath: {res['plain_step'][:150]}")
        if "logits_rel" in res:
            print(f"  loss {res['loss']:.5f} vs float32 CPU {res['ref_loss']:.5f}; "
                  f"logits rel {res['logits_rel']:.2e}")
        for line in slow:
            print(f"  slow: {line}")
        for key in ("load_enabled", "load_plain"):
            if key in res:
                print(f"  {key}: {res[key].get('error') or 'loaded, kernelized=' + str(res[key]['kernelized'])}")
    # the exit status says whether every family was measured (a family that raised is not)
    return 1 if any("error" in res for res in doc["families"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
