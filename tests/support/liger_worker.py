"""Runs under one transformers version (a venv's python) and prints one JSON object: Liger Kernel
composed with fastpath.enable(), in both orders, for each family Liger patches that this
transformers has (tests/routing/test_liger_compose.py asserts on the JSON; this file decides nothing).

Per family, one process, weights from one seed everywhere (loaded into every model built):
  reference    plain transformers: logits (no grad), then the mean next-token loss on the logits
               and every parameter gradient
  enable_then_liger   enable(), build, apply_liger_kernel_to_<family>(model=...) through
               fastpath.routing.liger_route.apply_liger; the loss through Liger's fused linear CE
  ... disable  the same model after disable(): Liger still in place, fastpath's routes gone
  liger_then_enable   Liger's class-level patch (no model), then enable(), then build
  ... disable  and the modeling module exactly as it was before enable()
  reenable     enable() again on that model: both sets of kernels again
  liger_alone  (--liger-alone) a fresh model with Liger only (fastpath off): the error Liger's
               kernels bring
(the disable and reenable steps run the logits only: a forward costs minutes in the interpreter)
Each step records: rel. error of logits / loss / gradients against the reference, fastpath's
kernel calls (counters at its entry points), the autograd nodes of the loss (Liger's and
fastpath's autograd Functions appear there only if their kernels ran), explain() rows, and which
modules' forwards are Liger's.

usage: python tests/support/liger_worker.py [--families qwen3_5_text,...] [--device cpu|cuda] [--fla DIR]
                                    [--hide fla,causal_conv1d]
Under TRITON_INTERPRET=1 on CPU, tests/support/liger_interpreter.py lets Liger's kernels run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matrix_worker import FAMILIES, build  # tests/support is on sys.path (above)

LIGER_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "falcon_h1")
MODULE_OF = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}


def tiny(model_type: str, device: str) -> Any:
    """The matrix worker's tiny model with O(1) random weights everywhere (zero-initialised
    zero-centred norm weights would hide a wrong `1 + w` offset)."""
    overrides = {"use_mamba_kernels": True, "time_step_min": 1e-6} if model_type == "falcon_h1" else {}
    saved = dict(FAMILIES[model_type])
    FAMILIES[model_type].update(overrides)
    try:
        model = build(model_type)
    finally:
        FAMILIES[model_type].clear()
        FAMILIES[model_type].update(saved)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 - 0.5)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 - 1.0)
            elif p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / max(1, p.shape[-1]) ** 0.5)
    return model.to(device)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = float(torch.linalg.vector_norm(a.double() - b.double()))
    return 0.0 if diff == 0.0 else diff / max(float(torch.linalg.vector_norm(b.double())), 1e-30)


def graph_nodes(loss: torch.Tensor) -> list[str]:
    """Names of the autograd nodes behind `loss` (each custom autograd Function appears by name)."""
    seen, stack, names = set(), [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return sorted(names)


def run(model: Any, ids: torch.Tensor) -> dict[str, Any]:
    """Logits (no grad), then loss + gradients: through Liger's fused linear CE when in place."""
    from fastpath.routing import liger_route

    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    fused = liger_route.fused_loss_in_place(model)
    if fused:
        loss = liger_route.next_token_loss(model, ids)
    else:
        out = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(out[:, :-1].float().reshape(-1, out.shape[-1]),
                                                 ids[:, 1:].reshape(-1))
    nodes = graph_nodes(loss)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return {"logits": logits, "loss": loss.detach().double(), "grads": grads, "nodes": nodes, "fused": fused}


def versus(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    missing = sorted(set(ref["grads"]) ^ set(got["grads"]))
    grad_rels = {n: rel(got["grads"][n], g) for n, g in ref["grads"].items() if n in got["grads"]}
    worst = max(grad_rels, key=lambda n: grad_rels[n]) if grad_rels else None
    return {"logits_rel": rel(got["logits"], ref["logits"]), "loss_rel": rel(got["loss"], ref["loss"]),
            "grad_rel_max": grad_rels[worst] if worst else None, "grad_worst": worst,
            "grads_missing": missing, "nodes": got["nodes"], "fused_loss": got["fused"]}


def liger_forwards(model: Any) -> dict[str, str]:
    """Submodule name -> the qualname of its forward, for every forward that is Liger's."""
    from fastpath.routing.liger_route import _effective, _from_liger

    out = {}
    for name, module in model.named_modules():
        fn = _effective(module, "forward")
        if _from_liger(fn):
            out[name or "<root>"] = fn.__qualname__
    return out


def module_state(module: Any) -> dict[str, int]:
    """id() of every global of a modeling module and of every attribute of the classes it defines."""
    state = {name: id(value) for name, value in vars(module).items()}
    for name, value in vars(module).items():
        if isinstance(value, type) and value.__module__ == module.__name__:
            state.update({f"{name}.{attr}": id(v) for attr, v in vars(value).items()})
    return state


def fastpath_names(module: Any) -> list[str]:
    """Globals and class attributes of a modeling module whose value is fastpath's."""
    found = []
    for name, value in vars(module).items():
        if str(getattr(value, "__module__", "") or "").startswith("fastpath") or \
                str(getattr(value, "__name__", "")).startswith("fastpath"):
            found.append(name)
        if isinstance(value, type) and value.__module__ == module.__name__:
            found += [f"{name}.{a}" for a, v in vars(value).items()
                      if str(getattr(v, "__module__", "") or "").startswith("fastpath")]
    return found


def step(model: Any, ids: torch.Tensor, ref: dict[str, Any], backward: bool = True) -> dict[str, Any]:
    """One check of `model` as it stands; backward=False: logits only (a forward without grad)."""
    import fastpath
    from fastpath.kernels.counters import CALLS, reset

    reset()
    if backward:
        out = versus(run(model, ids), ref)
    else:
        with torch.no_grad():
            out = {"logits_rel": rel(model(input_ids=ids, use_cache=False).logits.float(), ref["logits"])}
    out["calls"] = dict(CALLS)
    out["explain"] = fastpath.explain(model).rows
    out["liger_forwards"] = liger_forwards(model)
    return out


def family_case(model_type: str, device: str, interp: bool, fla: str | None = None,
                liger_alone: bool = False) -> dict[str, Any]:
    import importlib

    import fastpath
    from fastpath.routing import liger_route

    res: dict[str, Any] = {"family": MODULE_OF.get(model_type, model_type)}
    modeling = importlib.import_module(f"transformers.models.{res['family']}.modeling_{res['family']}")
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    model = tiny(model_type, device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = run(model, ids)
    res["reference"] = {"loss": float(ref["loss"]), "nodes": ref["nodes"], "liger_forwards": liger_forwards(model)}
    built_before_liger = model  # kept: explain()'s note on a model built before Liger's class-level patch
    if fla:  # after transformers bound its kernels: FLA only through enable() (its gated norm)
        sys.path.insert(0, fla)
    pristine = module_state(modeling)

    def fresh() -> Any:
        m = tiny(model_type, device)
        m.load_state_dict(state)
        return m

    # --- order 1: enable(), build, Liger on the built model
    fastpath.enable(warn=False, lift_device_gate=interp)
    try:
        model = fresh()
        try:
            res["apply"] = liger_route.apply_liger(model)
        except liger_route.LigerUnsupported as exc:
            res["liger_unsupported"] = str(exc)
            return res
        res["enable_then_liger"] = step(model, ids, ref)
    finally:
        fastpath.disable()
    res["enable_then_liger_disabled"] = step(model, ids, ref, backward=False)
    after = module_state(modeling)
    changed = sorted(k for k in set(pristine) | set(after) if pristine.get(k) != after.get(k))
    res["after_disable_changed"] = changed
    # a changed name must be one Liger replaced (its class or function now), nothing else
    res["after_disable_changed_not_liger"] = [
        k for k in changed if not liger_route._from_liger(vars(modeling).get(k.split(".")[0]))]
    res["after_disable_fastpath_names"] = fastpath_names(modeling)
    del model

    # --- order 2: Liger's class-level patch, then enable(), then build
    fn = liger_route.patch_function(model_type)
    fn()  # Liger's defaults, no model: module globals and <Model>ForCausalLM.forward
    before_enable = module_state(modeling)
    fastpath.enable(warn=False, lift_device_gate=interp)
    try:
        model = fresh()
        res["liger_then_enable"] = step(model, ids, ref)
    finally:
        fastpath.disable()
    res["liger_then_enable_disabled"] = step(model, ids, ref, backward=False)
    after = module_state(modeling)
    res["liger_then_enable_restored"] = sorted(
        k for k in set(before_enable) | set(after) if before_enable.get(k) != after.get(k))

    # --- and enable() again on the model built under both
    fastpath.enable(warn=False, lift_device_gate=interp)
    try:
        res["reenable"] = step(model, ids, ref, backward=False)
    finally:
        fastpath.disable()
    # --- Liger alone (its class-level patch is still in place, fastpath is off): the error Liger's
    # own kernels bring, which the composed steps are held to (fastpath must add none of its own)
    if liger_alone:
        model = fresh()
        liger_route.apply_liger(model)
        res["liger_alone"] = step(model, ids, ref)
    explained = fastpath.explain(built_before_liger)
    res["built_before_liger"] = {"notes": explained.notes, "liger_forwards": liger_forwards(built_before_liger)}
    return res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--families", default=",".join(LIGER_TYPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--liger-alone", action="store_true", help="also a step with Liger only")
    parser.add_argument("--fla", default=None, help="a directory holding fla-core, importable from enable() on")
    parser.add_argument("--hide", default="", help="comma list of modules made unimportable first (as bench's "
                        "reference hides fla / causal_conv1d: the reference is transformers' torch path)")
    args = parser.parse_args()
    for name in filter(None, args.hide.split(",")):
        sys.modules[name] = None  # type: ignore[assignment]
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    interp = os.environ.get("TRITON_INTERPRET") == "1" and args.device == "cpu"
    out: dict[str, Any] = {"transformers": transformers.__version__, "interpreter": interp, "families": {}}
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    from fastpath.routing import liger_route

    out["liger"] = liger_route.liger_version()
    try:
        import liger_kernel.transformers.monkey_patch  # noqa: F401
    except ImportError as exc:
        out["liger_import_error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out))
        return
    if interp:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from liger_interpreter import install

        out["interpreter_adaptations"] = install()
    for model_type in args.families.split(","):
        if model_type not in CONFIG_MAPPING:
            out["families"][model_type] = {"absent": True}
            continue
        try:
            out["families"][model_type] = family_case(model_type, args.device, interp, args.fla,
                                                      liger_alone=args.liger_alone)
        except Exception as exc:
            out["families"][model_type] = {"error": f"{type(exc).__name__}: {exc}",
                                           "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
