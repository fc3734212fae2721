"""The Qwen3.5 glue nobody else fuses -> fastpath's Triton ops, where it computes the same function.

What is routed (after FLA's gated delta rule, fastpath's conv, FLA's gated norm and
Liger's RMSNorm / SwiGLU / fused cross-entropy, these are the eager pieces left in a layer):
* GatedDeltaNet gates: ``g = -exp(A_log) * softplus(a + dt_bias)`` (float32) and
  ``beta = sigmoid(b)``: ~7 elementwise kernels forward and ~12 backward in transformers, one
  kernel each way in ``fastpath.kernels.gdn_gates``;
* GatedDeltaNet's conv, transpose and split into q, k, v, where the module's conv is fastpath's
  own: the conv writes each piece contiguous (``kernels/causal_conv1d/split_outputs.py``), so the gated
  delta rule copies nothing and the backward concatenates nothing;
* gated attention's output gate: ``attn_output * sigmoid(gate)`` with ``gate`` first copied out
  of the q_proj output: a copy and two kernels forward, three backward in transformers; one kernel
  each way reading the strided gate in place in ``fastpath.kernels.sigmoid_gate``;
* gated attention's partial rotate-half RoPE of q and k (``apply_rotary_pos_emb``: slices,
  rotate_half, multiplies and two cats each way in transformers): one kernel each way per tensor in
  ``fastpath.kernels.rotary``, where the module's function is transformers' partial rotary
  (checked on its source when the route is built) and the call fits (3-D cos / sin of (B, L, R),
  R even <= head_dim, no gradient wanted for them); otherwise the module's function as before;
* the projections of one hidden state (GatedDeltaNet's in_proj_qkv / _z / _b / _a, attention's
  q / k / v): autograd adds their input gradients with one kernel per extra projection;
  ``fastpath.kernels.linear_group`` sums them inside the GEMMs (plain un-hooked ``nn.Linear``
  only, else each module is called as usual).
All live inline in the layers' ``forward`` (transformers models/qwen3_5/modeling_qwen3_5.py,
``Qwen3_5GatedDeltaNet.forward`` and ``Qwen3_5Attention.forward``), so the smallest function that
carries them is the forward itself: enable() replaces the class's ``forward`` with fastpath's
(recorded in the PatchRegistry, undone exactly by disable()). Every other step calls what the
original calls, looked up the same way at call time (the module's ``causal_conv1d_fn``,
``torch_chunk_gated_delta_rule``, ``apply_rotary_pos_emb``, attention interface, the layer's own
norms and projections), so the conv / FLA / gated-norm / Liger routes still apply inside.

Same function, checked, not assumed: before routing a class, enable() builds a small float32
instance of it (from the modeling module's own config class), gives every parameter random
values, and compares fastpath's forward with the original on a random input: the output and the
gradients of the input and of every parameter within 1e-5 relative. A class whose forward
computes anything else (another transformers release, another family) is not routed; explain()
says why. Only transformers' call-time-global layout (5.15+) is a candidate. The verdict is kept
for the process per class and forward (route_probe): a later enable() does not probe again.

What keeps the original forward, per call: a cache (decode, chunked prefill), packed-sequence or
other keyword arguments to the GatedDeltaNet (the fused gates do not matter there, the original
passes them on), accelerate offload hooks, tensors the kernels cannot take (CPU without
TRITON_INTERPRET=1, other dtypes).

FASTPATH_GLUE=auto|off (read by enable(), or enable(glue=False)) turns the route off.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing.patch_registry import PatchRegistry
from fastpath.routing.route_modes import GROUPED_HEADS_ATTR, RouteStatus, env_mode, kernel_dtypes
from fastpath.routing.route_probe import probed

ENV_MODE = "FASTPATH_GLUE"
MODES = ("auto", "off")
OP_GATES = "gdn_gates"
OP_OUTPUT_GATE = "attn_output_gate"
IMPL = "fastpath-triton"
#: set on a routed class's forward: which glue op it carries
ROUTE_ATTR = "__fastpath_glue_route__"
#: set on a candidate class enable() did not route: why (one line)
SKIP_ATTR = "__fastpath_glue_skip__"
_PROBE_TOLERANCE = 1e-5
# keyword arguments a decoder layer hands its GatedDeltaNet that change nothing in it (5.17 passes
# use_cache); any other one with a value (packed sequences: cu_seq_lens_q, seq_idx, ...) keeps the
# original forward
_INERT_KWARGS = frozenset({"use_cache", "output_attentions", "output_hidden_states", "return_dict",
                           "position_ids"})
# a small config every Qwen3.5-like family accepts (one GatedDeltaNet layer, one attention layer)
_PROBE_CONFIG = {
    "vocab_size": 32, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
}

#: What enable() decided, for explain(); set through the PatchRegistry so disable() clears it.
ACTIVE: GlueStatus | None = None


@dataclass
class GlueStatus(RouteStatus):
    """enable()'s decision for the glue route."""

    FAST_IMPL: ClassVar[str] = IMPL


def route_mode() -> str:
    """FASTPATH_GLUE, validated (a bad value is a usage error, not a silent default)."""
    return env_mode(ENV_MODE, MODES)


def detect_glue(enabled: bool = True) -> GlueStatus:
    """Whether to route the glue, per enable(glue=...) and FASTPATH_GLUE."""
    if not enabled:
        return GlueStatus(False, "enable(glue=False)")
    if route_mode() == "off":
        return GlueStatus(False, f"{ENV_MODE}=off")
    how = "CUDA tensors" + (", and CPU tensors under TRITON_INTERPRET=1" if triton_interpreter_on() else "")
    return GlueStatus(True, f"fastpath's fused GatedDeltaNet gates, attention RoPE and output gate for {how} "
                            f"({ENV_MODE}=off turns them off)")


# ------------------------------------------------------------------------------ candidates
def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def candidates(module: ModuleType) -> list[tuple[type, str]]:
    """(class, op) for the module's GatedDeltaNet and gated-attention classes whose forward has
    transformers' 5.15+ shape (call-time module globals); others are not candidates."""
    found = []
    for obj in list(vars(module).values()):
        if not (isinstance(obj, type) and obj.__module__ == module.__name__ and "forward" in obj.__dict__):
            continue
        src = _source(obj.__dict__["forward"])
        if obj.__name__.endswith("GatedDeltaNet"):
            conv = "causal_conv1d_forward(" in src or "causal_conv1d_fn(" in src  # 5.25 / 5.15-5.24
            if conv and all(s in src for s in ("self.in_proj_a(", "self.in_proj_b(", "softplus",
                                               "torch_chunk_gated_delta_rule(")) \
                    and "self.causal_conv1d_fn" not in src:
                found.append((obj, OP_GATES))
        elif obj.__name__.endswith("Attention") and "Vision" not in obj.__name__:
            if all(s in src for s in ("torch.sigmoid(gate)", "torch.chunk(", "get_interface(",
                                      "apply_rotary_pos_emb(")):
                found.append((obj, OP_OUTPUT_GATE))
    return found


# ------------------------------------------------------------------------------ the forwards
def _usable(x: Any, interpreter: bool) -> bool:
    import torch

    return (isinstance(x, torch.Tensor) and kernel_dtypes(x)
            and (x.is_cuda or (interpreter and x.device.type == "cpu")))


def is_rotate_half_rope(fn: Any) -> bool:
    """Whether `fn` is transformers' partial rotate-half RoPE (q, k, cos, sin): R = cos.shape[-1]
    features of each head rotated by halves, the rest passed through (what kernels/rotary computes).
    Read from its source once when the route is built; the probe then checks the whole forward."""
    src = _source(fn)
    return callable(fn) and all(s in src for s in ("rotate_half", "cos.shape[-1]", "torch.cat("))


def rope_fits(query: Any, key: Any, cos: Any, sin: Any, force: bool, interpreter: bool) -> bool:
    """Whether fastpath's rotary takes this call: q, k (B, H, L, D) and cos, sin (B, L, R) with R
    even <= D, tensors the kernels take (any, with force: the reference runs off-GPU), cos / sin in
    no wider dtype than q and k, and wanting no gradient (the op gives x's only)."""
    import torch

    from fastpath.kernels.rotary.interface import check_args

    tensors = (query, key, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    if not (force or all(_usable(t, interpreter) for t in tensors)):
        return False
    try:  # the op's own contract (shapes, R even <= D, floating point, one device), for q and for k
        check_args(query, cos, sin)
        check_args(key, cos, sin)
    except ValueError:
        return False
    # the op rounds to x's dtype; transformers' arithmetic promotes (float32 cos with bf16 q: float32)
    table = torch.promote_types(cos.dtype, sin.dtype)
    if any(torch.promote_types(x.dtype, table) != x.dtype for x in (query, key)):
        return False
    return not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))


def make_gdn_forward(original: Callable[..., Any], module: ModuleType, *, force: bool = False) -> Callable[..., Any]:
    """The routed GatedDeltaNet forward: the original's steps with the gates fused. force=True
    (the probe) takes the fused path for any tensors (the ops' float32 reference off-GPU)."""
    import torch

    from fastpath.causal_conv1d import causal_conv1d_fn as fastpath_conv
    from fastpath.kernels.causal_conv1d.split_outputs import conv_split
    from fastpath.kernels.gdn_gates.interface import gdn_gates
    from fastpath.kernels.linear_group.interface import linears_of_one_input

    interpreter = triton_interpreter_on()
    source = _source(original)
    repeat_heads = "repeat_interleave" in source  # <= 5.22; 5.23+ passes grouped heads
    # 5.25 calls the conv through the kernelizable helper `causal_conv1d_forward(conv1d, x, cache,
    # layer_idx, ...)`, which (no cache) calls the module's causal_conv1d_fn; call what it calls
    conv_helper = "causal_conv1d_forward(" in source
    helper = getattr(module, "causal_conv1d_forward", None)
    plain_helper = "causal_conv1d_fn(" in _source(helper)

    def conv_pieces(self: Any, mixed_qkv: Any) -> tuple[Any, ...] | None:
        """q, k, v (B, L, n) contiguous straight from the conv (kernels/causal_conv1d/split_outputs.py)
        where the conv the original would call is fastpath's own, else None (the original's steps)."""
        if getattr(module.causal_conv1d_fn, "__fastpath_impl__", None) is not fastpath_conv:
            return None
        if conv_helper and not (plain_helper and module.causal_conv1d_forward is helper):
            return None  # a kernelized or replaced helper computes what it computes
        weight = self.conv1d.weight
        if self.activation not in ("silu", "swish", None) or mixed_qkv.dtype != weight.dtype:
            return None
        return conv_split(mixed_qkv, weight.squeeze(1), self.conv1d.bias,
                          (self.key_dim, self.key_dim, self.value_dim), self.activation is not None)

    def forward(self: Any, hidden_states: Any, cache_params: Any = None, attention_mask: Any = None,
                **kwargs: Any) -> Any:
        if (cache_params is not None or any(v is not None for k, v in kwargs.items() if k not in _INERT_KWARGS)
                or getattr(self.conv1d, "_hf_hook", None) is not None
                or not (force or _usable(hidden_states, interpreter))):
            if cache_params is not None:  # 5.25 renamed it `cache` (deprecate_kwarg maps the old name, and
                kwargs["cache_params"] = cache_params  # an explicit None would clobber `cache`)
            return original(self, hidden_states, attention_mask=attention_mask, **kwargs)
        kwargs.pop("cache", None)  # 5.25's name for the cache: None here, and a named parameter there
        hidden_states = module.apply_mask_to_padding_states(hidden_states, attention_mask)
        batch, seq_len, _ = hidden_states.shape
        mixed_qkv, z, b, a = linears_of_one_input(
            hidden_states, (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a))
        mixed_qkv = mixed_qkv.transpose(1, 2)
        pieces = conv_pieces(self, mixed_qkv)
        if pieces is not None:
            query, key, value = pieces
        else:
            if conv_helper:
                mixed_qkv = module.causal_conv1d_forward(self.conv1d, mixed_qkv, None, self.layer_idx,
                                                         activation=self.activation, **kwargs)
            else:
                mixed_qkv = module.causal_conv1d_fn(mixed_qkv, self.conv1d.weight.squeeze(1),
                                                    self.conv1d.bias, activation=self.activation, **kwargs)
            mixed_qkv = mixed_qkv.transpose(1, 2)
            query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        query = query.reshape(batch, seq_len, -1, self.head_k_dim)
        key = key.reshape(batch, seq_len, -1, self.head_k_dim)
        value = value.reshape(batch, seq_len, -1, self.head_v_dim)
        g, beta = gdn_gates(a, b, self.A_log, self.dt_bias)
        groups = self.num_v_heads // self.num_k_heads
        chunk_rule = module.torch_chunk_gated_delta_rule
        # fastpath's FLA route takes grouped heads (FLA's kernels index the shared key head): the
        # two repeated copies of q and k, and their gradients' sum over the copies, are not needed
        if repeat_heads and groups > 1 and not getattr(chunk_rule, GROUPED_HEADS_ATTR, False):
            query = query.repeat_interleave(groups, dim=2)
            key = key.repeat_interleave(groups, dim=2)
        core, _ = chunk_rule(query, key, value, g=g, beta=beta, initial_state=None, output_final_state=False,
                             use_qk_l2norm_in_kernel=True, cu_seqlens=None, **kwargs)
        core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(core.reshape(batch, seq_len, -1))

    setattr(forward, ROUTE_ATTR, OP_GATES)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = f"fastpath: fused GatedDeltaNet gates where they fit, else {original.__qualname__}"
    return forward


def make_attention_forward(original: Callable[..., Any], module: ModuleType, *,
                           force: bool = False) -> Callable[..., Any]:
    """The routed gated-attention forward: the original's steps with the output gate and, where the
    module's `apply_rotary_pos_emb` is transformers' partial rotate-half RoPE, q's and k's RoPE fused."""
    import torch

    from fastpath.kernels.linear_group.interface import linears_of_one_input
    from fastpath.kernels.rotary.interface import rotary
    from fastpath.kernels.sigmoid_gate.interface import sigmoid_gate

    interpreter = triton_interpreter_on()
    checked_rope = getattr(module, "apply_rotary_pos_emb", None)
    if not is_rotate_half_rope(checked_rope):
        checked_rope = None

    def rope(query: Any, key: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
        # looked up at call time, like the original; fused only while it is the function checked
        apply = module.apply_rotary_pos_emb
        if apply is checked_rope and rope_fits(query, key, cos, sin, force, interpreter):
            return rotary(query, cos, sin), rotary(key, cos, sin)
        return apply(query, key, cos, sin)

    def forward(self: Any, hidden_states: Any, position_embeddings: Any, attention_mask: Any = None,
                past_key_values: Any = None, **kwargs: Any) -> Any:
        # the KV cache: `past_key_values` up to 5.24, `cache` from 5.25 (a cached call keeps the
        # original forward, which updates the cache)
        if (past_key_values is not None or kwargs.get("cache") is not None
                or not (force or _usable(hidden_states, interpreter))):
            if past_key_values is not None:
                kwargs["past_key_values"] = past_key_values
            return original(self, hidden_states, position_embeddings, attention_mask, **kwargs)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q_gate, key, value = linears_of_one_input(hidden_states, (self.q_proj, self.k_proj, self.v_proj))
        query, gate = torch.chunk(q_gate.view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
        query = self.q_norm(query.reshape(hidden_shape)).transpose(1, 2)
        key = self.k_norm(key.view(hidden_shape)).transpose(1, 2)
        value = value.view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = rope(query, key, cos, sin)
        interface = module.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                 module.eager_attention_forward)
        attn_output, attn_weights = interface(self, query, key, value, attention_mask,
                                              dropout=0.0 if not self.training else self.attention_dropout,
                                              scaling=self.scaling, **kwargs)
        attn_output = sigmoid_gate(attn_output.reshape(*input_shape, -1, self.head_dim), gate)
        return self.o_proj(attn_output.reshape(*input_shape, -1)), attn_weights

    setattr(forward, ROUTE_ATTR, OP_OUTPUT_GATE)
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = f"fastpath: fused RoPE and output gate where they fit, else {original.__qualname__}"
    return forward


MAKERS = {OP_GATES: make_gdn_forward, OP_OUTPUT_GATE: make_attention_forward}


# ------------------------------------------------------------------------------ the probe
def _probe_config(module: ModuleType) -> Any:
    """A small config of the module's own family (its text config class when it has one)."""
    configs = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("Config")
               and "Vision" not in n and hasattr(v, "model_type")]
    configs.sort(key=lambda c: not c.__name__.endswith("TextConfig"))
    for cls in configs:
        try:
            config = cls(**_PROBE_CONFIG)
            config._attn_implementation = "eager"  # what a standalone layer would fall back to, quietly
            return config
        except Exception:
            continue
    return None


def same_function(cls: type, op: str, module: ModuleType) -> str | None:
    """None when fastpath's forward for `cls` computes what its original forward computes (output
    and every gradient, float32, random parameters); else why not (one line). Once per class and
    forward in a process (route_probe)."""
    return probed((cls, op, cls.__dict__["forward"]), lambda: _compare(cls, op, module))


def _compare(cls: type, op: str, module: ModuleType) -> str | None:
    import torch

    original = cls.__dict__["forward"]
    config = _probe_config(module)
    if config is None:
        return f"no config class in {module.__name__} takes a small probe config"
    gen = torch.Generator().manual_seed(0)
    try:
        layer = cls(config, 0 if op == OP_GATES else 1).float()
    except Exception as exc:
        return f"cannot build {cls.__name__}(config, layer_idx): {type(exc).__name__}"
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    x = torch.randn(2, 6, config.hidden_size, generator=gen)
    args: tuple[Any, ...] = (x,)
    if op == OP_OUTPUT_GATE:
        head_dim = layer.head_dim
        cos = torch.randn(2, 6, head_dim // 2, generator=gen)
        args = (x, (cos, torch.randn(2, 6, head_dim // 2, generator=gen)), None)
    routed = MAKERS[op](original, module, force=True)
    results = []
    for forward in (original, routed):
        inp = x.clone().requires_grad_(True)
        layer.zero_grad(set_to_none=True)
        try:
            out = forward(layer, inp, *args[1:])
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out) + torch.linspace(-1, 1, out.numel()).view(out.shape))
        except Exception as exc:
            return f"{cls.__name__}: the probe raised {type(exc).__name__}: {str(exc)[:120]}"
        grads = [inp.grad] + [p.grad for p in layer.parameters()]
        results.append([out.detach(), *grads])
    for want, got in zip(*results, strict=True):
        if (want is None) != (got is None):
            return f"{cls.__name__}: fastpath's forward does not give the same gradients"
        if want is None:
            continue
        err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
        if not err <= _PROBE_TOLERANCE:
            return (f"{cls.__name__}.forward is not what fastpath's {op} forward computes "
                    f"(rel. error {err:.1e} on a float32 probe)")
    return None


# ------------------------------------------------------------------------------ patching
def patch_module(module: ModuleType, status: GlueStatus, reg: PatchRegistry) -> list[str]:
    """Route one modeling module's glue classes; notes for the candidates left alone."""
    notes = []
    if not status.route:
        return notes
    for cls, op in candidates(module):
        original = cls.__dict__["forward"]
        if hasattr(original, ROUTE_ATTR):
            continue
        why = same_function(cls, op, module)
        if why is not None:
            reg.set_attr(cls, SKIP_ATTR, why)
            notes.append(f"{op} of {cls.__name__} not routed: {why}")
            continue
        reg.set_attr(cls, "forward", MAKERS[op](original, module))
    return notes


def describe_layer(layer: Any, device: str) -> tuple[str, str, bool] | None:
    """explain()'s (op, impl, fast) for a glue-carrying layer while enable() is active, else None."""
    if ACTIVE is None:
        return None
    cls = type(layer)
    forward = getattr(cls, "forward", None)
    op = getattr(forward, ROUTE_ATTR, None)
    if op is None:
        why = cls.__dict__.get(SKIP_ATTR)
        if why is None:
            return None
        op = OP_GATES if cls.__name__.endswith("GatedDeltaNet") else OP_OUTPUT_GATE
        return op, f"torch (eager; {why})", False
    if not ACTIVE.route:
        return None
    if "forward" in vars(layer):
        return op, "torch (instance forward replaced)", False
    if device == "cuda":
        return op, IMPL, True
    if device == "cpu" and triton_interpreter_on():
        return op, f"{IMPL} (interpreter)", True
    return op, f"torch ({device} tensors; fastpath routed for CUDA)", False
