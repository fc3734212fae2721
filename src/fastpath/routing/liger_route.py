"""Liger Kernel beside enable(): apply its patch to a built model, and tell which of its ops are in place.

Liger Kernel (`pip install ".[train]"` from a checkout) replaces the generic part of a model with
Triton kernels: RMSNorm (offset 1 for the zero-centred Qwen3.5 / Qwen3-Next norms), the SwiGLU
MLP, and the causal LM's forward with a fused linear cross-entropy that never materialises the
logits. What `apply_liger_kernel_to_<family>` changes (liger-kernel 0.8.5,
liger_kernel/transformers/monkey_patch.py):
  * without `model=`: modeling-module globals (`<Model>RMSNorm`, `<Model>MLP` / `<Model>Experts`,
    falcon_h1's `apply_rotary_pos_emb`) and `<Model>ForCausalLM.forward`: models built afterwards;
  * with `model=`: additionally each built norm / MLP instance's `forward` (bound in the instance
    `__dict__`) and the model instance's `forward`.
fastpath routes other names: the causal_conv1d / gated-delta-rule / Mamba-2 globals and the
GatedDeltaNet gated norm's `forward` (`<Model>RMSNormGated`, which Liger does not touch). The one
shared op, the zero-centred RMSNorm, fastpath routes at the transformers class's `forward`
(routing/zc_norm_route.py), under both of Liger's patches: an instance forward Liger binds wins
for that instance, and a class Liger puts in the module is Liger's, not a candidate. So either
order composes, and disable() undoes only fastpath's own
changes: a Liger patch made before enable() is still there afterwards; one made after enable()
over a name fastpath had routed is kept too (PatchRegistry: `kept`, with a warning).

Liger has no undo; fastpath does not record or undo Liger's patches.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from fastpath.shared.errors import FastpathError, first_line
from fastpath.shared.liger_families import DIST, MODULE

# explain()'s op names for Liger's rows (every such row's impl starts with "liger ")
RMSNORM, LAYERNORM, MLP, ROPE, LM_LOSS = "rmsnorm", "layernorm", "swiglu", "rope", "lm_loss"
OPS = (RMSNORM, LAYERNORM, MLP, ROPE, LM_LOSS)
FUSED_LOSS = "liger fused linear cross-entropy (labels=..., in training or with skip_logits=True)"
_DECODER_LAYER = re.compile(r"^(.*\blayers\.\d+)(\.|$)")


class LigerUnsupported(FastpathError):
    """Liger's patch cannot be applied to this model here (one line: why)."""


def liger_version() -> str | None:
    """The installed liger-kernel's version (package metadata), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DIST)
    except PackageNotFoundError:
        return None


def patch_function(model_type: str | None) -> Any:
    """The installed Liger's `apply_liger_kernel_to_<family>` for `model_type` (its own
    MODEL_TYPE_TO_APPLY_LIGER_FN decides); LigerUnsupported when there is none or it cannot load."""
    from fastpath.shared.extras import require

    require("liger")
    found = liger_version() or "?"
    try:
        from liger_kernel.transformers import monkey_patch
    except ImportError as exc:  # 0.8.5 refuses transformers < 5.0 at import
        raise LigerUnsupported(f"{DIST} {found} does not load with transformers "
                               f"{_transformers_version()}: {first_line(exc)}") from None
    table = getattr(monkey_patch, "MODEL_TYPE_TO_APPLY_LIGER_FN", {})
    fn = table.get(model_type or "")
    if fn is None:
        raise LigerUnsupported(f"{DIST} {found} has no patch for model_type {model_type!r}")
    return fn


def check_usable(model_type: str | None, device: Any, *, interpreter_ok: bool = True) -> str:
    """Before any work (verify --liger): the name of Liger's patch for `model_type`; a UsageError
    (one line) when Liger is missing, has no patch for it, or its kernels cannot run on `device`.
    interpreter_ok: whether CPU tensors under TRITON_INTERPRET=1 count (tests adapt Liger's kernels
    to the interpreter; as shipped they raise at their first call there: the interpreter passes
    float arguments as Python floats, triton/runtime/interpreter.py `_implicit_cvt`)."""
    from fastpath.kernels.dispatch import triton_interpreter_on
    from fastpath.shared.errors import UsageError

    try:
        fn = patch_function(model_type)
    except LigerUnsupported as exc:
        raise UsageError(str(exc)) from None
    kind = getattr(device, "type", str(device))
    interpreted = triton_interpreter_on()
    if kind != "cuda" and not (interpreter_ok and interpreted):
        raise UsageError(f"--liger needs a CUDA device (here: {device}): Liger Kernel's Triton kernels do not "
                         "run on CPU tensors" + (", not under TRITON_INTERPRET=1 either" if interpreted else ""))
    return str(fn.__name__)


def apply_liger(model: Any, **options: Any) -> str:
    """Liger's patch for `model`'s family applied to the built model (`model=`); returns what was
    called. options go to Liger's function (rms_norm=, swiglu=, fused_linear_cross_entropy=, ...).
    A Liger function that raises here is a LigerUnsupported naming it (its patches may be partly in
    place: build the model again to start clean)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    fn = patch_function(model_type)
    call = f"{fn.__name__}(model=...)"
    try:
        fn(model=model, **options)
    except Exception as exc:
        raise LigerUnsupported(f"{DIST} {liger_version() or '?'}: {call} raised on transformers "
                               f"{_transformers_version()}: {first_line(exc, with_type=True)}") from None
    return call


def fused_loss_in_place(model: Any) -> bool:
    """Whether `model`'s forward is Liger's fused-linear-cross-entropy forward (it takes
    `skip_logits`: with labels it returns the loss and no logits)."""
    fn = _effective(model, "forward")
    if not _from_liger(fn):
        return False
    import inspect

    try:
        return "skip_logits" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def next_token_loss(model: Any, ids: Any) -> Any:
    """The mean next-token loss of `ids` through Liger's fused linear cross-entropy (the model
    shifts the labels itself), or None when that forward is not in place."""
    if not fused_loss_in_place(model):
        return None
    return model(input_ids=ids, labels=ids, use_cache=False, skip_logits=True).loss


def explain_rows(model: Any) -> list[dict[str, Any]]:
    """explain()'s rows for Liger's ops in place on `model`: one per decoder layer and op kind
    (which children), one for falcon_h1's rope, one for the loss. Empty when Liger is not applied."""
    groups: dict[tuple[str, str], list[str]] = {}
    impls: dict[tuple[str, str], set[str]] = {}
    owner_types: dict[str, str] = {}
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if not name:
            continue
        fn = _effective(module, "forward")
        if not _from_liger(fn):
            continue
        op = _op_of(fn)
        match = _DECODER_LAYER.match(name)
        owner = match.group(1) if match else name
        child = name[len(owner) + 1:] if match and name != owner else name.rsplit(".", 1)[-1]
        groups.setdefault((owner, op), []).append(child)
        impls.setdefault((owner, op), set()).add(fn.__qualname__.split(".")[0])
        owner_types[owner] = type(modules.get(owner, module)).__name__
    # Liger's Triton kernels run on GPUs only: on another device an op is in place but not fast
    device = next((p.device.type for p in model.parameters()), "cpu")
    where = "" if device == "cuda" else f"; {device} tensors: Liger's Triton kernels need a GPU"
    fast = device == "cuda"
    rows = [{"layer": owner, "layer_type": owner_types[owner], "op": op,
             "impl": f"liger {'/'.join(sorted(impls[(owner, op)]))} ({', '.join(children)}{where})",
             "fast": fast}
            for (owner, op), children in groups.items()]
    home = sys.modules.get(type(model).__module__)
    rope = getattr(home, "apply_rotary_pos_emb", None) if home is not None else None
    if _from_liger(rope):
        rows.append({"layer": "<root>", "layer_type": type(model).__name__, "op": ROPE,
                     "impl": f"liger {rope.__name__} ({type(model).__module__}.apply_rotary_pos_emb{where})",
                     "fast": fast})
    if fused_loss_in_place(model):
        rows.append({"layer": "<root>", "layer_type": type(model).__name__, "op": LM_LOSS,
                     "impl": FUSED_LOSS + (f" ({where[2:]})" if where else ""), "fast": fast})
    else:
        import torch.nn.functional as F

        if _from_liger(F.cross_entropy):  # Liger's cross_entropy=True patches torch's own function
            rows.append({"layer": "<root>", "layer_type": type(model).__name__, "op": LM_LOSS,
                         "impl": f"liger cross-entropy (torch.nn.functional.cross_entropy{where})",
                         "fast": fast})
    return rows


def explain_notes(model: Any, rows: list[dict[str, Any]]) -> list[str]:
    """A note when Liger's class-level patch is in the model's modeling module but `model` was
    built before it (Liger's documented pitfall: its norms and MLPs are then transformers')."""
    home = sys.modules.get(type(model).__module__)
    if home is None or any(r["op"] in (RMSNORM, MLP) for r in rows):
        return []
    patched = sorted(name for name, obj in vars(home).items()
                     if isinstance(obj, type) and obj.__module__.startswith(MODULE + ".")
                     and not name.startswith("Liger"))
    if not patched:
        return []
    return [f"Liger's class-level patch replaced {', '.join(patched)} in {home.__name__} after this model "
            f"was built: its modules are still transformers'; apply_liger_kernel_to_<family>(model=model) "
            f"patches a built model"]


def _effective(obj: Any, name: str) -> Any:
    """What `obj.name` runs: an instance-dict override (Liger binds methods there) or the class's."""
    fn = vars(obj).get(name) if hasattr(obj, "__dict__") else None
    if fn is None:
        fn = getattr(type(obj), name, None)
    return getattr(fn, "__func__", fn)


def _from_liger(fn: Any) -> bool:
    return str(getattr(fn, "__module__", None) or "").startswith(MODULE + ".")


def _op_of(fn: Any) -> str:
    owner = fn.__qualname__.split(".")[0]
    if "RMSNorm" in owner:
        return RMSNORM
    if "LayerNorm" in owner:
        return LAYERNORM
    if any(k in owner for k in ("SwiGLU", "GEGLU", "MLP", "Experts")):
        return MLP
    return f"liger {owner}"


def _transformers_version() -> str:
    module = sys.modules.get("transformers")
    return str(getattr(module, "__version__", "?"))


def is_liger_row(row: dict[str, Any]) -> bool:
    """Whether an explain() row is one of Liger's (not a hybrid-layer kernel op)."""
    return str(row.get("impl", "")).startswith("liger ")
