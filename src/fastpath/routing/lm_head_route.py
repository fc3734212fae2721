"""The causal-LM loss of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next -> fastpath's fused LM head + cross-entropy.

With `labels`, transformers' `<Model>ForCausalLM.forward` (4.57 - 5.25) computes
``logits = self.lm_head(hidden[:, logits_to_keep])`` over the whole vocabulary and
``self.loss_function(logits, labels, vocab_size, **kwargs)`` = ForCausalLMLoss
(transformers/loss/loss_utils.py): ``logits.float()``, labels padded with ignore_index and shifted
by one (or ``shift_labels`` as given), cross_entropy with mean over the counted labels (or a sum
divided by ``num_items_in_batch``). At Qwen3.5's 248,320-token vocabulary the logits, their float32
copy and their gradients dominate a training step's peak memory (4 GB each in float32 at 4,096
tokens) and log-softmax forward + backward costs ~8 ms on an H200.
``fastpath.kernels.linear_ce.linear_cross_entropy`` computes the same loss and gradients without
materialising the logits (chunks of ~1 GiB, each GEMM once).

How: the routed forward calls the original forward (the same decorators, cache arguments, MoE
router outputs in every release) with ``labels=None`` and an empty ``logits_to_keep`` index (the
LM head runs on zero rows), takes the decoder's last hidden state from a forward hook on
``self.model`` held for that call only, and adds the loss: the fused op over the shifted labels,
plus ``router_aux_loss_coef * aux_loss`` where the MoE forward returned one (what the original adds
when labels are given). The output is the original's class with ``logits=None``: like Liger
Kernel's ``skip_logits``, a training forward with labels returns the loss and no logits.

When (per call; anything else runs the original forward, unchanged): labels given; autograd on
(a no-grad call with labels, an evaluation loop, keeps its logits) or ``skip_logits=True``
(``skip_logits=False`` always keeps them); ``logits_to_keep`` 0; a dict output; the model's
``loss_function`` is transformers' ForCausalLMLoss; ``lm_head`` a plain ``nn.Linear`` with a plain
(not DTensor, DeepSpeed-partitioned or offloaded) weight of ``vocab_size`` rows and no hooks of its own; the weight on CUDA
(or on CPU under TRITON_INTERPRET=1); no autocast; no torch.compile tracing (inductor sees the
original graph).

Candidates and the check: the ``*ForCausalLM`` classes of the three families' modeling modules whose
forward has the shape above (source: one ``logits = self.lm_head(`` assignment, the loss from
``self.loss_function(``, ``self.model(``, ``logits_to_keep``). Same function, checked, not assumed:
before routing a class, its original and routed forward run on a tiny float32 model of the
family built from the module's own config class (random weights, some labels ignored): the loss and
every parameter's gradient within 1e-5 relative, once per class and forward in a process
(route_probe). A class failing either is not routed; explain() says why. A class whose forward
Liger Kernel replaced (its class-level patch) is left to Liger.

FASTPATH_LM_LOSS=auto|off (read by detect_lm_head) turns the route off.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing.patch_registry import PatchRegistry
from fastpath.routing.route_modes import RouteStatus, classes_to_route, env_mode, kernel_dtypes
from fastpath.routing.route_probe import probed

ENV_MODE = "FASTPATH_LM_LOSS"
MODES = ("auto", "off")
OP = "lm_loss"
IMPL = "fastpath fused linear cross-entropy"
#: the modeling modules whose causal-LM classes are candidates
MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.qwen3_next.modeling_qwen3_next",
)
#: set on a routed class's forward
ROUTE_ATTR = "__fastpath_lm_head_route__"
#: set on a candidate class that was not routed: why (one line)
SKIP_ATTR = "__fastpath_lm_head_skip__"
_PROBE_TOLERANCE = 1e-5
# attention-only: a gated-delta layer on the CPU probe reaches FLA's Triton kernels wherever
# fla-core is importable, which raise on CPU tensors and would leave the loss unrouted
_PROBE_CONFIG = {
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
    "layer_types": ["full_attention", "full_attention"], "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "tie_word_embeddings": False,
}

#: What the last apply() decided, for explain(); set through the PatchRegistry so undo() clears it.
ACTIVE: LmHeadStatus | None = None


@dataclass
class LmHeadStatus(RouteStatus):
    """The decision for the causal-LM loss route."""

    FAST_IMPL: ClassVar[str] = IMPL


def route_mode() -> str:
    """FASTPATH_LM_LOSS, validated (a bad value is a usage error, not a silent default)."""
    return env_mode(ENV_MODE, MODES)


def detect_lm_head(enabled: bool = True) -> LmHeadStatus:
    """Whether to route the causal-LM loss, per the caller and FASTPATH_LM_LOSS."""
    if not enabled:
        return LmHeadStatus(False, "turned off by the caller")
    if route_mode() == "off":
        return LmHeadStatus(False, f"{ENV_MODE}=off")
    try:
        from fastpath.kernels.linear_ce import interface  # noqa: F401
    except Exception as exc:
        return LmHeadStatus(False, f"fastpath.kernels.linear_ce does not import ({type(exc).__name__}: {exc})")
    how = "CUDA tensors" + (", and CPU tensors under TRITON_INTERPRET=1" if triton_interpreter_on() else "")
    return LmHeadStatus(True, f"training calls with labels on {how} return the loss, no logits "
                              f"({ENV_MODE}=off turns it off)")


# ------------------------------------------------------------------------------ candidates
def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _from_liger(fn: Any) -> bool:
    return str(getattr(fn, "__module__", None) or "").startswith("liger_kernel")


def has_loss_shape(forward: Callable[..., Any]) -> str | None:
    """None when `forward`'s source computes the logits once from lm_head and the loss from
    loss_function (the shape the routed forward relies on); else why not."""
    src = _source(forward)
    if not src:
        return "its forward's source cannot be read"
    needed = ("self.model(", "self.lm_head(", "self.loss_function(", "logits_to_keep", "labels")
    missing = [s for s in needed if s not in src]
    if missing:
        return f"its forward has no {', '.join(missing)}"
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return "its forward's source does not parse"
    writes = [node for node in ast.walk(tree)
              if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
              and any(isinstance(t, ast.Name) and t.id == "logits"
                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    head_call = (len(writes) == 1 and isinstance(writes[0], ast.Assign) and isinstance(writes[0].value, ast.Call)
                 and ast.unparse(writes[0].value.func) == "self.lm_head")
    if not head_call:
        return "its forward changes the logits after lm_head (softcap, scaling, ...)"
    return None


def candidates(module: ModuleType) -> list[type]:
    """The module's own `*ForCausalLM` classes with a forward of their own."""
    if module.__name__ not in MODULES:
        return []
    return [obj for name, obj in list(vars(module).items())
            if isinstance(obj, type) and name.endswith("ForCausalLM") and obj.__module__ == module.__name__
            and "forward" in obj.__dict__]


# ------------------------------------------------------------------------------ the forward
def _is_causal_lm_loss(fn: Any) -> bool:
    return getattr(fn, "__name__", None) == "ForCausalLMLoss" and \
        str(getattr(fn, "__module__", "")).startswith("transformers.loss")


def fits(model: Any, kwargs: dict[str, Any], force: bool = False) -> bool:
    """Whether this call's loss can come from the fused op (see the module docstring)."""
    import torch

    if torch.compiler.is_compiling() or torch.is_autocast_enabled():
        return False
    if kwargs.get("return_dict", getattr(model.config, "return_dict", True)) is False:
        return False
    keep = kwargs.get("logits_to_keep", 0)
    if not (isinstance(keep, int) and keep == 0):
        return False
    head = getattr(model, "lm_head", None)
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks \
            or getattr(head, "_hf_hook", None) is not None:
        return False
    weight = head.weight
    if type(weight.data) is not torch.Tensor or hasattr(weight, "ds_id") or weight.dim() != 2 or \
            not kernel_dtypes(weight):
        return False
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and weight.shape[0] != vocab:
        return False
    if not (force or weight.is_cuda or (weight.device.type == "cpu" and triton_interpreter_on())):
        return False
    try:
        loss_fn = model.loss_function
    except Exception:
        return False
    return _is_causal_lm_loss(loss_fn)


def shifted_loss(model: Any, hidden: Any, labels: Any, kwargs: dict[str, Any]) -> Any:
    """ForCausalLMLoss's value and gradients through the fused op: pad + shift (or shift_labels),
    a mean over the counted labels (or a sum / num_items_in_batch)."""
    import torch

    from fastpath.kernels.linear_ce.interface import linear_cross_entropy

    ignore_index = int(kwargs.get("ignore_index", -100))
    shift = kwargs.get("shift_labels")
    if shift is None:
        shift = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    head = model.lm_head
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = shift.reshape(-1).to(flat.device)
    items = kwargs.get("num_items_in_batch")
    if items is None:
        return linear_cross_entropy(flat, head.weight, targets, ignore_index, "mean", head.bias)
    loss = linear_cross_entropy(flat, head.weight, targets, ignore_index, "sum", head.bias)
    if torch.is_tensor(items):
        items = items.to(loss.device)
    return loss / items


def make_forward(original: Callable[..., Any], *, force: bool = False) -> Callable[..., Any]:
    """The routed `<Model>ForCausalLM.forward`: the fused loss and no logits where `fits`, else
    `original`. force=True (the probe) takes the fused path on any device."""
    import torch

    signature = inspect.signature(original)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        extra = arguments.pop(next((p.name for p in signature.parameters.values()
                                    if p.kind is inspect.Parameter.VAR_KEYWORD), "kwargs"), {})
        skip_logits = extra.pop("skip_logits", None)
        labels = arguments.get("labels")
        everything = {**arguments, **extra}
        wanted = skip_logits if skip_logits is not None else torch.is_grad_enabled()
        active = ACTIVE
        if (labels is None or not wanted or not (force or (active is not None and active.route))
                or not fits(self, everything, force)):
            return original(self, *args, **{k: v for k, v in kwargs.items() if k != "skip_logits"})
        captured: list[Any] = []

        def keep_hidden(_module: Any, _inputs: Any, output: Any) -> None:
            captured.append(getattr(output, "last_hidden_state", None) if not isinstance(output, tuple)
                            else output[0])

        arguments["labels"] = None
        arguments["logits_to_keep"] = torch.empty(0, dtype=torch.long, device=self.lm_head.weight.device)
        call = {k: v for k, v in arguments.items() if k != "self"}
        handle = self.model.register_forward_hook(keep_hidden)
        try:
            out = original(self, **call, **extra)
        finally:
            handle.remove()
        if len(captured) != 1 or captured[0] is None:
            raise RuntimeError(f"fastpath's fused LM loss: {type(self).__name__}.model ran {len(captured)} "
                               f"times in one forward; set {ENV_MODE}=off")
        loss = shifted_loss(self, captured[0], labels, extra)
        aux = getattr(out, "aux_loss", None)
        if aux is not None and hasattr(self, "router_aux_loss_coef"):
            loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
        fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
        return type(out)(loss=loss, logits=None, **fields)

    setattr(forward, ROUTE_ATTR, True)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__signature__ = signature  # type: ignore[attr-defined]
    forward.__doc__ = (f"fastpath: with labels in training, the loss from the fused LM head + cross-entropy "
                       f"and logits=None; else {original.__qualname__}")
    return forward


# ------------------------------------------------------------------------------ the probe
def _probe_model(cls: type, module: ModuleType) -> Any:
    import torch

    configs = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("Config")
               and "Vision" not in n and hasattr(v, "model_type")]
    configs.sort(key=lambda c: not c.__name__.endswith("TextConfig"))
    for config_cls in configs:
        try:
            config = config_cls(**_PROBE_CONFIG)
            config._attn_implementation = "eager"
            model = cls(config).float()
        except Exception:
            continue
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        return model.train()
    return None


def same_function(cls: type, module: ModuleType) -> str | None:
    """None when the routed forward gives the original's loss and gradients on a tiny float32
    model of the family; else why not. Once per class and forward in a process (route_probe)."""
    return probed((cls, "lm_head", cls.__dict__["forward"]), lambda: _compare(cls, module))


def _compare(cls: type, module: ModuleType) -> str | None:
    import torch

    from fastpath.kernels.counters import CALLS

    original = cls.__dict__["forward"]
    model = _probe_model(cls, module)
    if model is None:
        return f"no config class in {module.__name__} builds a small {cls.__name__}"
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, _PROBE_CONFIG["vocab_size"], (2, 7), generator=gen)
    labels = ids.clone()
    labels[0, :2] = -100
    kwargs: dict[str, Any] = {"input_ids": ids, "labels": labels, "use_cache": False}
    if "output_router_logits" in inspect.signature(original).parameters:
        kwargs["output_router_logits"] = True  # the MoE's load-balancing term joins the loss
    results = []
    for forward in (original, make_forward(original, force=True)):
        model.zero_grad(set_to_none=True)
        before = sum(n for k, n in CALLS.items() if k.startswith("linear_ce_fwd:"))
        try:
            out = forward(model, **kwargs)
            out.loss.backward()
        except Exception as exc:
            return f"{cls.__name__}: the probe raised {type(exc).__name__}: {str(exc)[:120]}"
        fused = sum(n for k, n in CALLS.items() if k.startswith("linear_ce_fwd:")) > before
        if fused != (forward is not original) or (fused and out.logits is not None):
            return f"{cls.__name__}: the routed forward did not take the fused loss on the probe"
        results.append([out.loss.detach()] + [p.grad for p in model.parameters()])
    for want, got in zip(*results, strict=True):
        if (want is None) != (got is None):
            return f"{cls.__name__}: the fused loss does not give the same gradients"
        if want is None:
            continue
        err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
        if not err <= _PROBE_TOLERANCE:
            return (f"{cls.__name__}.forward's loss is not what the fused loss computes "
                    f"(rel. error {err:.1e} on a float32 probe)")
    return None


# ------------------------------------------------------------------------------ patching
def patch_module(module: ModuleType, status: LmHeadStatus, reg: PatchRegistry) -> list[str]:
    """Route one modeling module's causal-LM classes (those of MODULES; any other module: none);
    notes for the candidates left alone."""
    if module.__name__ not in MODULES:
        return []
    notes: list[str] = []
    for cls, original in classes_to_route(candidates(module), status, reg, ROUTE_ATTR, SKIP_ATTR):
        if _from_liger(original):
            why = "Liger Kernel's fused linear cross-entropy forward is in place (its class-level patch)"
        else:
            why = has_loss_shape(original) or same_function(cls, module)
        if why is not None:
            reg.set_attr(cls, SKIP_ATTR, why)
            notes.append(f"{OP} of {cls.__name__} not routed: {why}")
            continue
        reg.set_attr(cls, "forward", make_forward(original))
    return notes


def apply(reg: PatchRegistry, modules: Iterable[ModuleType] | None = None,
          status: LmHeadStatus | None = None) -> list[str]:
    """Route the causal-LM loss of `modules` (default: those of MODULES already imported), every
    change through `reg` (reg.undo() puts back exactly what was there); returns notes. A route
    table calls patch_module per module as it is imported instead, after setting ACTIVE the same way."""
    status = status or detect_lm_head()
    reg.set_attr(sys.modules[__name__], "ACTIVE", status)
    if modules is None:
        modules = [sys.modules[name] for name in MODULES if name in sys.modules]
    notes: list[str] = []
    for module in modules:
        notes.extend(patch_module(module, status, reg))
    if not status.route:
        notes.append(f"{OP}: {status.reason}")
    return notes


# ------------------------------------------------------------------------------ reading it back
def _instance_forward(model: Any) -> Any:
    own = vars(model).get("forward") if hasattr(model, "__dict__") else None
    return getattr(own, "__func__", own)


def fused_loss_in_place(model: Any) -> bool:
    """Whether `model(..., labels=...)` in training takes the fused loss (and returns no logits):
    its class's forward is routed, nothing replaced it on the instance, the route is active."""
    if ACTIVE is None or not ACTIVE.route or _instance_forward(model) is not None:
        return False
    return hasattr(getattr(type(model), "forward", None), ROUTE_ATTR)


def explain_rows(model: Any) -> list[dict[str, Any]]:
    """explain()'s row for the model's loss while the route is active (none for a model of another
    class, or whose instance forward Liger replaced: Liger's row names it)."""
    if ACTIVE is None:
        return []
    cls = type(model)
    forward = getattr(cls, "forward", None)
    routed = hasattr(forward, ROUTE_ATTR)
    why = None if routed else cls.__dict__.get(SKIP_ATTR)
    if not routed and why is None:
        return []
    row = {"layer": "<root>", "layer_type": cls.__name__, "op": OP}
    own = _instance_forward(model)
    if own is not None:
        if _from_liger(own):
            return []
        return [{**row, "impl": f"instance forward replaced ({getattr(own, '__module__', None) or 'unknown'})",
                 "fast": False}]
    if not routed:
        return [{**row, "impl": f"torch (eager; {why})", "fast": False}]
    if not ACTIVE.route:
        return [{**row, "impl": f"torch ({ACTIVE.reason})", "fast": False}]
    weight = getattr(getattr(model, "lm_head", None), "weight", None)
    device = getattr(getattr(weight, "device", None), "type", "cpu")
    if device == "cuda":
        return [{**row, "impl": f"{IMPL} (labels + autograd: the loss, no logits)", "fast": True}]
    if device == "cpu" and triton_interpreter_on():
        return [{**row, "impl": f"{IMPL} (interpreter)", "fast": True}]
    return [{**row, "impl": f"torch ({device} tensors; fused loss routed for CUDA)", "fast": False}]
