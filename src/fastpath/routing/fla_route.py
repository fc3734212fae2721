"""Gated delta rule -> flash-linear-attention (FLA), only where FLA is importable and correct.

FLA's Triton kernels are what transformers' GatedDeltaNet layers want (`chunk_gated_delta_rule`
for prefill/training, `fused_recurrent_gated_delta_rule` for decode). One known hazard decides
how the chunk rule is routed: fla-core 0.6.0 refuses the *gated chunk backward* on Hopper with
Triton >= 3.4, < 3.7.1 unless tilelang is installed (wrong results upstream, FLA issue #640,
fla/ops/common/chunk_o.py `chunk_bwd_dqkwg`). There, the route uses FLA for the forward and
recomputes the backward through transformers' own torch reference under autograd: correct,
slower, labelled "fla-fwd+torch-bwd", with the real remedy in the warning. Where FLA has its
backend registry (fla/backends.py), only the refused op is taken instead (`use_dqkwg_route`),
and FLA's own kernel still runs it wherever fastpath's self-check validated it
(routing/fla_selfcheck.py).
Kimi-Linear's KDA (transformers 5.17+ `chunk_kimi_delta_attention` / `recurrent_kimi_delta_attention`,
bound once at import to FLA's `chunk_kda` / `fused_recurrent_kda` or their torch fallbacks) takes
the same road: where FLA is importable, enable() points both globals at FLA for CUDA tensors, so a
model whose modeling module was imported while FLA was not importable (verify builds its reference
that way) still gets FLA's KDA. KDA's backward has its own fused dq/dk/dg kernel (fla/ops/kda/
chunk_bwd.py), not the `chunk_bwd_dqkwg` that #640 refuses, so it is routed whole.
CPU tensors always take the torch function transformers had (FLA kernels need a GPU).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastpath.routing.route_modes import GROUPED_HEADS_ATTR
from fastpath.shared.known_issues import FLA_ISSUE_640, fla_640

REMEDY_640 = "pip install -U 'triton>=3.7.1'  (or: pip install tilelang)"
ROUTE_ATTR = "__fastpath_gdn_route__"
# transformers 5.17+ kimi_linear module globals (use_kernel_func_from_hub_with_fallback("chunk_kda" /
# "fused_recurrent_kda", "fla")) -> which FLA KDA function replaces them
KDA_GLOBALS = {"chunk_kimi_delta_attention": "chunk", "recurrent_kimi_delta_attention": "recurrent"}



def chunk_backward_unsafe(compute_capability: tuple[int, int] | None, triton_version: str | None,
                          tilelang_available: bool) -> str | None:
    """Why FLA's gated chunk backward would refuse to run here (FLA #640), or None if it runs.

    The decision is `known_issues.fla_640`, the one the doctor uses too; this adds the words."""
    if not fla_640(compute_capability, triton_version, tilelang_available):
        return None
    assert compute_capability is not None
    return (f"FLA refuses the gated chunk backward on Hopper (sm_{compute_capability[0]}"
            f"{compute_capability[1]}) with Triton {triton_version} (>=3.4,<3.7.1; {FLA_ISSUE_640})")


@dataclass
class FlaStatus:
    """What enable() decided for the gated delta rule."""

    route: bool                 # route the ops to FLA at all
    chunk_impl: str             # "fla" | "fla-fwd+torch-bwd" | "torch"
    recurrent_impl: str         # "fla" | "torch"
    reason: str                 # why (one line), with the fix when not routed
    chunk_fn: Callable[..., Any] | None = None
    recurrent_fn: Callable[..., Any] | None = None
    kda_chunk_fn: Callable[..., Any] | None = None      # fla.ops.kda.chunk_kda, when it imports
    kda_recurrent_fn: Callable[..., Any] | None = None  # fla.ops.kda.fused_recurrent_kda
    kda_reason: str = "fla not routed"

    @property
    def kda_route(self) -> bool:
        return self.route and self.kda_chunk_fn is not None and self.kda_recurrent_fn is not None


def detect_fla(mode: str) -> FlaStatus:
    """Resolve gated_delta_rule="auto"|"fla"|"off" against what is installed and the GPU."""
    if mode == "off":
        return FlaStatus(False, "torch", "torch", "gated_delta_rule='off'")
    if importlib.util.find_spec("fla") is None:
        return FlaStatus(False, "torch", "torch",
                         "fla is not installed: pip install fla-core (pure Python, Triton kernels)")
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
        chunk = module.chunk_gated_delta_rule
        recurrent = module.fused_recurrent_gated_delta_rule
    except Exception as exc:
        return FlaStatus(False, "torch", "torch",
                         f"fla is installed but does not import ({type(exc).__name__}: {exc}); "
                         "reinstall fla-core matching your Triton")
    from fastpath.kernels.dispatch import cuda_capability

    cc = cuda_capability()
    triton_version = _triton_version()
    tilelang = importlib.util.find_spec("tilelang") is not None
    unsafe = chunk_backward_unsafe(cc, triton_version, tilelang)
    if cc is None and mode == "auto":
        reason = "fla importable; no CUDA device now, so CPU tensors keep the torch path"
    else:
        reason = "fla importable and safe on this GPU/Triton"
    chunk_impl = "fla"
    if unsafe:
        chunk_impl = "fla-fwd+torch-bwd"
        reason = f"{unsafe}; backward recomputed in torch. Fix: {REMEDY_640}"
    status = FlaStatus(True, chunk_impl, "fla", reason, chunk, recurrent)
    try:
        kda = importlib.import_module("fla.ops.kda")
        status.kda_chunk_fn, status.kda_recurrent_fn = kda.chunk_kda, kda.fused_recurrent_kda
        status.kda_reason = ("fla importable (chunk_kda, fused_recurrent_kda)"
                             + ("; CPU tensors keep the torch path" if cc is None else ""))
    except Exception as exc:
        status.kda_reason = f"fla.ops.kda does not import ({type(exc).__name__}: {exc})"
    return status


# Model types whose linear-attention layers run a gated delta rule (or KDA) through FLA; packed
# sequences need FLA's cu_seqlens there (transformers' torch fallbacks ignore it, <=5.17 silently,
# 5.21+ raise). The Mamba-2 / conv families take seq_idx in fastpath's own kernels.
PACKED_NEEDS_FLA = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "olmo_hybrid",
                    "kimi_linear")


def packed_unverifiable(config: Any, device: Any, backward: bool, gated_delta_rule: str = "auto") -> str | None:
    """Why packed sequences cannot be checked on this model here (one line), or None when they can.

    Decided from the config, the device and what is installed, before anything is built: the fast
    path would either raise (fastpath refuses cu_seqlens on the torch fallback) or mix the
    sequences. The device comes first: on a CPU, installing fla-core would not help. While verify
    builds its reference, FLA is hidden from transformers (models/paths.hidden_compiled_peers);
    an installed FLA is then found on the path without importing it, and its import and GPU
    checks wait for the second call, once the model is built.
    """
    import importlib.machinery
    import sys

    model_type = str(getattr(config, "model_type", ""))
    if model_type not in PACKED_NEEDS_FLA:
        return None
    if model_type != "kimi_linear" and "linear_attention" not in (getattr(config, "layer_types", None) or []):
        return None  # a cut that kept only attention layers
    what = f"--packed on {model_type}: packed sequences need FLA's gated delta rule (cu_seqlens)"
    hidden = "fla" in sys.modules and sys.modules["fla"] is None
    installed = importlib.machinery.PathFinder.find_spec("fla") is not None if hidden else None
    if getattr(device, "type", str(device)) != "cuda":
        if hidden:
            have = "installed" if installed else "not installed either"
        else:
            status = detect_fla(gated_delta_rule)
            have = "installed" if status.route else f"not usable either: {status.reason}"
        return f"{what}, whose kernels run on CUDA tensors only (device here: {device}; fla-core is {have})"
    if hidden:
        if installed:
            return None  # imported and checked once the model is built
        return f"{what}; fla is not installed: pip install fla-core (pure Python, Triton kernels)"
    status = detect_fla(gated_delta_rule)
    if not status.route:
        return f"{what}; {status.reason}"
    if backward and status.chunk_impl == "fla-fwd+torch-bwd":
        return f"{what} and its backward, which FLA refuses here: {status.reason}"
    return None


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except Exception:
        return None


def _filter_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _fla_forward_torch_backward(fla_fn: Callable[..., Any], torch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A chunk rule whose forward is FLA's kernel and whose backward re-runs `torch_fn` under autograd."""
    import torch

    class _FlaFwdTorchBwd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta, initial_state, kwargs):  # type: ignore[override]
            ctx.save_for_backward(q, k, v, g, beta, initial_state)
            ctx.kwargs = kwargs
            with torch.no_grad():
                out, state = fla_fn(q, k, v, g=g, beta=beta, initial_state=initial_state,
                                    **_filter_kwargs(fla_fn, kwargs))
            ctx.has_state = state is not None
            return out, (state if state is not None else out.new_zeros(0))

        @staticmethod
        def backward(ctx, d_out, d_state):  # type: ignore[override]
            q, k, v, g, beta, initial_state = ctx.saved_tensors
            leaves = [t.detach().requires_grad_(True) if t is not None else None
                      for t in (q, k, v, g, beta, initial_state)]
            with torch.enable_grad():
                out, state = torch_fn(leaves[0], leaves[1], leaves[2], g=leaves[3], beta=leaves[4],
                                      initial_state=leaves[5], **_filter_kwargs(torch_fn, ctx.kwargs))
                outputs, grads = [out], [d_out]
                if ctx.has_state and state is not None and d_state is not None and d_state.numel():
                    outputs.append(state)
                    grads.append(d_state)
                inputs = [t for t in leaves if t is not None]
                got = torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
            it = iter(got)
            result = [next(it) if t is not None else None for t in leaves]
            return (*result, None)

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        kw = dict(kwargs, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
        if not torch.is_grad_enabled():
            return fla_fn(q, k, v, g=g, beta=beta, initial_state=initial_state, **_filter_kwargs(fla_fn, kw))
        out, state = _FlaFwdTorchBwd.apply(q, k, v, g, beta, initial_state, kw)
        return out, (state if output_final_state else None)

    return chunk_gated_delta_rule


_WARNED: set[str] = set()

DQKWG_IMPL = "fla (bwd dqkwg: self-checked FLA kernel or fastpath torch, FLA #640)"
_DQKWG_WORDS = {
    "auto": ("FLA's gated chunk_bwd_dqkwg is self-checked per configuration at its first backward "
             "(FLA's kernel where the check passes, fastpath's PyTorch dqkwg elsewhere; "
             "FASTPATH_FLA_DQKWG=fla|torch forces one)"),
    "fla": "FLA's own gated chunk_bwd_dqkwg forced on, unchecked (FASTPATH_FLA_DQKWG=fla)",
    "torch": ("FLA's gated chunk_bwd_dqkwg routed to fastpath's PyTorch implementation "
              "(FASTPATH_FLA_DQKWG=torch)"),
}


def use_dqkwg_route(status: FlaStatus) -> bool:
    """In the FLA #640 case, take FLA's one refused op (gated chunk_bwd_dqkwg) into our FLA backend
    (fastpath.routing.fla_backend): per configuration FLA's own kernel where fla_selfcheck
    validated it (or FASTPATH_FLA_DQKWG forces a route), else fastpath's PyTorch dqkwg; FLA
    keeps its own kernels for everything else. Falls back to "fla-fwd+torch-bwd" when the
    backend cannot be installed. A bad FASTPATH_FLA_DQKWG value raises UsageError."""
    if status.chunk_impl != "fla-fwd+torch-bwd":
        return False
    from fastpath.routing.fla_selfcheck import route_mode

    mode = route_mode()
    try:
        from fastpath.routing.fla_backend import install_dqkwg_route
    except Exception:
        return False
    if not install_dqkwg_route():
        return False
    status.chunk_impl = DQKWG_IMPL
    status.reason = status.reason.replace("backward recomputed in torch", _DQKWG_WORDS[mode])
    return True


def enter_dqkwg_route(status: FlaStatus) -> None:
    """enable() and the end of suspended(): the FLA #640 dqkwg route back in place when `status`
    says it is routed (use_dqkwg_route installed it the first time and rewrote `status`)."""
    if status.chunk_impl == DQKWG_IMPL:
        from fastpath.routing.fla_backend import install_dqkwg_route

        install_dqkwg_route()


def undo_dqkwg_route() -> None:
    try:
        from fastpath.routing.fla_backend import uninstall_dqkwg_route
    except Exception:
        return
    uninstall_dqkwg_route()


def make_gdn_route(kind: str, status: FlaStatus, torch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap transformers' gated-delta-rule function: CUDA tensors -> FLA, CPU -> the pure torch
    reference (5.15+ decorates it; `__wrapped__` is the undecorated function, which never calls FLA)."""
    raw = getattr(torch_fn, "__wrapped__", torch_fn)
    if kind == "chunk":
        fla_fn = status.chunk_fn
        impl = status.chunk_impl
        if impl == "fla-fwd+torch-bwd":
            fla_fn = _fla_forward_torch_backward(status.chunk_fn, raw)  # type: ignore[arg-type]
    else:
        fla_fn = status.recurrent_fn
        impl = status.recurrent_impl
    assert fla_fn is not None

    def gated_delta_rule(q, k, v, *args, cu_seqlens=None, **kwargs):
        if not q.is_cuda:
            if cu_seqlens is not None:
                raise ValueError("fastpath: packed sequences (cu_seqlens) in the gated delta rule need FLA "
                                 "on a CUDA device; the torch reference would mix the sequences")
            q, k = one_key_head_per_value_head(q, k, v)
            return raw(q, k, v, *args, **_filter_kwargs(raw, kwargs))
        if impl == "fla-fwd+torch-bwd":
            q, k = one_key_head_per_value_head(q, k, v)  # its backward is the torch reference's
            if cu_seqlens is not None and torch_grad_enabled():
                raise NotImplementedError(
                    "fastpath: training on packed sequences (cu_seqlens) needs FLA's own backward, "
                    f"which FLA refuses here (#640). Fix: {REMEDY_640}")
            if "fla-fwd+torch-bwd" not in _WARNED:
                _WARNED.add("fla-fwd+torch-bwd")
                warnings.warn(f"fastpath: {status.reason}", RuntimeWarning, stacklevel=2)
        kw = dict(kwargs, cu_seqlens=cu_seqlens)
        return fla_fn(q, k, v, *args, **_filter_kwargs(fla_fn, kw))

    setattr(gated_delta_rule, ROUTE_ATTR, impl)
    if kind == "chunk":  # FLA's chunk kernels read key head i // (HV // H) themselves (GVA)
        setattr(gated_delta_rule, GROUPED_HEADS_ATTR, True)
    gated_delta_rule.__wrapped__ = raw  # type: ignore[attr-defined]
    return gated_delta_rule


def one_key_head_per_value_head(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """q and k repeated to v's head count (dim 2), as transformers <= 5.22 hands them to its torch
    reference, which pairs head i of q, k and v; unchanged when the counts already agree."""
    groups = v.shape[2] // q.shape[2]
    if groups <= 1:
        return q, k
    return q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)


def make_kda_route(kind: str, status: FlaStatus, torch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap transformers' KDA function (`kind` "chunk" | "recurrent"): CUDA tensors -> FLA's
    chunk_kda / fused_recurrent_kda, CPU -> the undecorated torch reference. Arguments are
    filtered to the target's named parameters, as transformers' own wrapper does."""
    raw = getattr(torch_fn, "__wrapped__", torch_fn)
    fla_fn = status.kda_chunk_fn if kind == "chunk" else status.kda_recurrent_fn
    assert fla_fn is not None

    def kimi_delta_attention(q, k, v, *args, cu_seqlens=None, **kwargs):
        if not q.is_cuda:
            if cu_seqlens is not None:
                raise ValueError("fastpath: packed sequences (cu_seqlens) in KDA need FLA on a CUDA "
                                 "device; the torch reference would mix the sequences")
            return raw(q, k, v, *args, **_filter_kwargs(raw, kwargs))
        kw = dict(kwargs, cu_seqlens=cu_seqlens)
        return fla_fn(q, k, v, *args, **{n: x for n, x in kw.items() if n in named})

    named = set(inspect.signature(fla_fn).parameters)  # transformers passes named ones only
    setattr(kimi_delta_attention, ROUTE_ATTR, "fla")
    kimi_delta_attention.__fastpath_fla_fn__ = fla_fn  # type: ignore[attr-defined]
    kimi_delta_attention.__wrapped__ = raw  # type: ignore[attr-defined]
    return kimi_delta_attention


def torch_grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()
