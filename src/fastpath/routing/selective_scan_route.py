"""Mamba-1 state-space ops -> fastpath: selective_scan_fn, mamba_inner_fn and the Mamba-1
selective_state_update for mamba, falcon_mamba, jamba and zamba, on every transformers version of
the matrix, with no mamba-ssm installed (the kernels: fastpath/kernels/selective_scan/).

How transformers reaches the three ops (read in each release's
src/transformers/models/{mamba,falcon_mamba,jamba,zamba}/modeling_*.py):

* 4.57.6: import time, `if is_mamba_ssm_available(): from mamba_ssm.ops.selective_scan_interface
  import mamba_inner_fn, selective_scan_fn; from mamba_ssm.ops.triton.selective_state_update import
  selective_state_update` (else all three None; falcon_mamba takes mamba_inner_fn from
  transformers' own kernels/falcon_mamba, still behind is_mamba_ssm_available). The check needs
  CUDA and dist-info metadata, so a stand-in package cannot pass it. mamba / falcon_mamba: forward()
  computes `all((selective_state_update, selective_scan_fn, causal_conv1d_fn, causal_conv1d_update,
  mamba_inner_fn))` at call time from the globals and `_lazy_load_causal_conv1d()`'s cache; jamba /
  zamba: a module-level `is_fast_path_available = all(...)`. Every mixer then needs
  `"cuda" in x_proj weight's device.type` (and not dynamo compiling) for `cuda_kernels_forward`:
  all-or-nothing, the causal conv included. jamba / zamba also need `use_mamba_kernels` (zamba
  raises ValueError when it is True and the path is closed; jamba <=5.14 warns and turns it off in
  the config for good).
* 5.0-5.14 (5.12.1 read): each mixer's __init__ runs `lazy_load_kernel("causal-conv1d")` and
  `lazy_load_kernel("mamba-ssm")` (falcon_mamba: `"falcon_mamba-ssm"`, attribute
  `falcon_mamba_inner_fn`) and writes the module globals (`global mamba_ssm, selective_state_update,
  selective_scan_fn, mamba_inner_fn`); selective_state_update through `resolve_internal_import(...,
  "ops.triton.selective_state_update.selective_state_update")`, which tries the package root first.
  jamba / zamba also write `global is_fast_path_available`. Same all-or-nothing + CUDA gate.
  With `kernels` installed lazy_load_kernel tries only the Hub (kernels-community/mamba-ssm).
* 5.15+ (5.17.0, 5.23.0, 5.25.0 read): module-level `@use_kernel_func_from_hub_with_fallback(
  "selective_scan_fn" | "selective_state_update" | "mamba_inner_fn", "mamba_ssm")` wrappers around
  torch functions named `mamba_selective_scan`, `mamba_selective_state_update`, `mamba_inner_fn`
  (the last returns None: the layer then takes its unfused path); forward looks them up as module
  globals at call time (5.25 through the kernelizable `mamba_scan_forward` helper). jamba and zamba
  never call mamba_inner_fn; falcon_mamba calls it in 5.15-5.24 and not at all in 5.25. The torch
  scan is a Python loop over the sequence, torch's associative_scan (>= 2.9, under dynamo only)
  or mambapy's pscan (`use_mambapy`).

What enable() does (exact undo through the PatchRegistry, as routing/ssd_route.py for Mamba-2):
* 5.15+: each wrapper global is replaced by a route with mamba_ssm's signature; CUDA tensors (or CPU
  tensors under TRITON_INTERPRET=1) go to fastpath's kernels, other CPU tensors to the torch
  function transformers wrapped.
* <=5.14: the three globals are set (defined if absent), `is_fast_path_available` recomputed, and
  the lazy loader's cache seeded for "mamba-ssm" and "falcon_mamba-ssm", so layers built later
  resolve to the routes and no Hub download is tried.
* mamba_ssm installed and importing its Mamba-1 ops: kept (mode "auto"); `enable(mamba_ssm=
  "fastpath")` routes anyway, "off" leaves these ops alone.
* An op combination the kernels do not take (complex A, a state size above their limit, float64)
  runs the kernels' float reference with a RuntimeWarning naming it (kernels/dispatch.warn_fallback);
  the routes call the public functions, so that warning reaches the user unchanged.

Falcon-Mamba's fused training op: mamba_ssm's `mamba_inner_fn(..., dt_rms_weight=...)` normalises dt
*after* dt_proj (over dim; state-spaces/mamba PR #543, transformers PR #33195), while transformers'
unfused path, its eval path and inference engines normalise the time-step rank *before* dt_proj
(jamba's 5.17 source says so: "mamba inner fn applies its dt norm at a different time leading to
incompatible implementations"; 5.25 dropped the fused call for falcon_mamba). fastpath computes
the function transformers' reference path computes: a call carrying B/C/dt RMSNorm weights returns
what transformers' fallback returns (None: the unfused path, on the routed conv and scan) on 5.15+,
and <=5.14's training branch, which uses the result directly, gets that unfused function composed
here from the routed ops. No transformers version carries packed sequences (seq_idx) through the
Mamba-1 scan (mamba_ssm's selective_scan_fn has no such argument), so there is nothing to keep.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fastpath.routing import mamba_common, ssd_route
from fastpath.routing.mamba_common import MambaStatus, module_source, runs_here
from fastpath.routing.patch_registry import PatchRegistry
from fastpath.shared.known_issues import mamba1_cuda_scan_missing

MAMBA1_OPS = ("selective_scan_fn", "selective_state_update", "mamba_inner_fn")
ROUTE_ATTR = "__fastpath_mamba1_route__"  # value: the op name
# lazy_load_kernel names (5.0-5.14) -> the attribute the mixer reads its fused op from
LAZY_KERNELS = {"mamba-ssm": "mamba_inner_fn", "falcon_mamba-ssm": "falcon_mamba_inner_fn"}
_RMS_WEIGHTS = ("b_rms_weight", "c_rms_weight", "dt_rms_weight")


def detect_mamba1(mode: str) -> MambaStatus:
    """Resolve enable(mamba_ssm="auto"|"fastpath"|"off") for the Mamba-1 ops."""
    return mamba_common.detect(mode, "Mamba-1", ("mamba_ssm.ops.selective_scan_interface",
                                                 "mamba_ssm.ops.triton.selective_state_update"),
                               broken="mamba_ssm is installed but its Mamba-1 ops do not import",
                               kept="mamba_ssm's Mamba-1 ops import", extra=_scan_extension_missing)


def _scan_extension_missing() -> str | None:
    """mamba_ssm imports, but without the compiled scan its Mamba-1 functions raise when called."""
    extension = importlib.util.find_spec("selective_scan_cuda") is not None
    if mamba1_cuda_scan_missing(True, extension):
        return ("mamba_ssm imports without its selective_scan_cuda extension "
                "(opt-in since https://github.com/state-spaces/mamba/pull/977): its "
                "selective_scan_fn / mamba_inner_fn raise when called, so fastpath routes them")
    return None


# ------------------------------------------------------------------ the routes
def make_scan_route(torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """selective_scan_fn route; `torch_fn` is what CPU tensors take (5.15+), if any."""

    def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                          return_last_state=False, **kwargs):
        if not runs_here(u) and torch_fn is not None:
            return torch_fn(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            return_last_state=return_last_state, **kwargs)
        from fastpath.kernels.selective_scan.interface import selective_scan_fn as impl

        return impl(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus), bool(return_last_state))

    return _mark(selective_scan_fn, "selective_scan_fn", torch_fn)


def make_state_update_route(torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """selective_state_update route (decode, state updated in place). A 4-D state is a Mamba-2 call
    (5.0-5.14 Mamba-2 layers read the same lazily loaded "mamba-ssm" module): Mamba-2's route."""
    mamba2 = ssd_route.make_state_update_route(None)

    def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, **kwargs):
        if state.dim() == 4:
            return mamba2(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                          state_batch_indices=state_batch_indices)
        if not runs_here(x) and torch_fn is not None and state_batch_indices is None:
            return torch_fn(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)
        from fastpath.kernels.selective_scan.update import selective_state_update as impl

        return impl(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=bool(dt_softplus),
                    state_batch_indices=state_batch_indices)

    fn = _mark(selective_state_update, "selective_state_update", torch_fn)
    setattr(fn, ssd_route.ROUTE_ATTR, "selective_state_update")  # explain() of Mamba-2 layers
    return fn


def make_inner_route(torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """mamba_inner_fn route (training, no cache). 5.15+ wraps a torch function returning None."""

    def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                       out_proj_bias, A, B=None, C=None, D=None, delta_bias=None, B_proj_bias=None,
                       C_proj_bias=None, delta_softplus=True, checkpoint_lvl=1, b_rms_weight=None,
                       c_rms_weight=None, dt_rms_weight=None, b_c_dt_rms_eps=1e-6, **kwargs):
        normed = any(w is not None for w in (b_rms_weight, c_rms_weight, dt_rms_weight))
        if torch_fn is not None and (normed or not runs_here(xz)):
            # what transformers does without the fused kernel: its unfused path (conv and scan routed)
            return torch_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                            out_proj_bias, A, B, C, D, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            b_rms_weight=b_rms_weight, c_rms_weight=c_rms_weight, dt_rms_weight=dt_rms_weight,
                            b_c_dt_rms_eps=b_c_dt_rms_eps)
        if normed:
            return unfused_inner(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                                 out_proj_weight, out_proj_bias, A, D=D, delta_bias=delta_bias,
                                 delta_softplus=delta_softplus, eps=b_c_dt_rms_eps, B=B, C=C)
        from fastpath.kernels.selective_scan.inner import mamba_inner_fn as impl

        return impl(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                    out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, bool(delta_softplus),
                    checkpoint_lvl)

    return _mark(mamba_inner_fn, "mamba_inner_fn", torch_fn)


def unfused_inner(xz: Any, conv1d_weight: Any, conv1d_bias: Any, x_proj_weight: Any, delta_proj_weight: Any,
                  out_proj_weight: Any, out_proj_bias: Any, A: Any, *, D: Any, delta_bias: Any,
                  delta_softplus: bool, eps: float, B: Any = None, C: Any = None) -> Any:
    """Falcon-Mamba's mixer as transformers' reference path computes it (<=5.14 cuda_kernels_forward
    without training, 5.17 forward): conv+SiLU, x_proj, weightless RMSNorm of the time-step rank, B and
    C, dt_proj, the scan (z gate, D, dt bias, softplus), out_proj. The norm weights transformers
    passes are non-learnable ones buffers its reference ignores; so does this."""
    import torch
    import torch.nn.functional as F

    from fastpath.causal_conv1d import causal_conv1d_fn
    from fastpath.kernels.selective_scan.interface import selective_scan_fn

    def rms(t: Any) -> Any:
        f = t.float()
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(t.dtype)

    x, z = xz.chunk(2, dim=1)
    weight = conv1d_weight.reshape(conv1d_weight.shape[0], conv1d_weight.shape[-1])
    x = causal_conv1d_fn(x, weight, conv1d_bias, activation="silu")
    rank = delta_proj_weight.shape[1]
    nstate = A.shape[-1]
    time_step, b, c = torch.split(F.linear(x.transpose(1, 2), x_proj_weight), [rank, nstate, nstate], dim=-1)
    delta = delta_proj_weight @ rms(time_step).transpose(1, 2)
    B = rms(b).transpose(1, 2) if B is None else B
    C = rms(c).transpose(1, 2) if C is None else C
    y = selective_scan_fn(x, delta, A, B, C, D, z, delta_bias, delta_softplus)
    bias = None if out_proj_bias is None else out_proj_bias.to(out_proj_weight.dtype)
    return F.linear(y.transpose(1, 2).to(out_proj_weight.dtype), out_proj_weight, bias)


_MAKERS = {"selective_scan_fn": make_scan_route, "selective_state_update": make_state_update_route,
           "mamba_inner_fn": make_inner_route}


def _mark(fn: Callable[..., Any], op: str, torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    return mamba_common.mark(fn, ROUTE_ATTR, op, torch_fn)


def route_module(kernel_name: str, base: ModuleType | None = None) -> ModuleType:
    """What 5.0-5.14's lazy_load_kernel(kernel_name) returns after enable(): the Mamba-1 routes as
    package-root attributes (resolve_internal_import tries the root first), added to `base` (the
    Mamba-2 route module for "mamba-ssm") when given."""
    mod = base if base is not None else ModuleType(f"fastpath_{kernel_name.replace('-', '_')}_route")
    if base is None:
        mod.__doc__ = "mamba_ssm's Mamba-1 ops routed to fastpath by fastpath.enable()"
        mod.__fastpath__ = True  # type: ignore[attr-defined]
    mod.selective_scan_fn = make_scan_route(None)  # type: ignore[attr-defined]
    mod.selective_state_update = make_state_update_route(None)  # type: ignore[attr-defined]
    setattr(mod, LAZY_KERNELS[kernel_name], make_inner_route(None))
    return mod


def seed_lazy_kernel_mapping(hub: ModuleType, reg: PatchRegistry, mamba2_routed: bool) -> bool:
    """5.0-5.14: `lazy_load_kernel("mamba-ssm" | "falcon_mamba-ssm")` returns these before trying the
    Hub or the package. "mamba-ssm" is shared with the Mamba-2 families: extended when Mamba-2 is
    routed too, left alone when a working mamba_ssm serves Mamba-2 (then <=5.14 Mamba-1 layers built
    after enable() keep what the loader finds)."""
    mapping = getattr(hub, "_KERNEL_MODULE_MAPPING", None)
    if not isinstance(mapping, dict):
        return False
    shared = mapping.get("mamba-ssm")
    if getattr(shared, "__fastpath__", False):
        route_module("mamba-ssm", shared)  # the module enable() just seeded for Mamba-2
    elif not mamba2_routed:
        reg.set_item(mapping, "mamba-ssm", route_module("mamba-ssm"))
    reg.set_item(mapping, "falcon_mamba-ssm", route_module("falcon_mamba-ssm"))
    return True


# ------------------------------------------------------------------ reading transformers' modules
def op_globals(module: ModuleType) -> dict[str, str]:
    """op name -> module global name that the mixer calls for it, in this module right now."""
    return mamba_common.op_globals(module, ROUTE_ATTR, MAMBA1_OPS, "selective_scan_fn",
                                   aliases={"mamba_inner_fn": "falcon_mamba_inner_fn"})


def is_legacy_mamba1(module: ModuleType) -> bool:
    """<=5.14 Mamba-1 modeling module: imports the ops by name from mamba_ssm (or its lazy loader)."""
    return mamba_common.is_legacy_module(module_source(module), "selective_scan_fn")


def _global_names(module: ModuleType) -> set[str]:
    """Names the module's functions declare `global` (5.0-5.14 __init__ rewrites them)."""
    names: set[str] = set()
    for line in re.findall(r"^\s*global\s+(.+)$", module_source(module), flags=re.MULTILINE):
        names.update(n.strip() for n in line.split(","))
    return names


# ------------------------------------------------------------------ patching
def patch_module(module: ModuleType, conv_fn: Any, conv_update: Any, conv_module: ModuleType,
                 reg: PatchRegistry) -> bool:
    """Point one modeling module's Mamba-1 ops at fastpath. Returns whether it is a Mamba-1 module.
    Runs before modeling_patch recomputes a <=5.14 `is_fast_path_available`."""
    ops = op_globals(module)
    if not ops:
        return False
    g = module.__dict__
    legacy = is_legacy_mamba1(module)
    mamba_common.route_op_globals(module, ops, _MAKERS, reg, legacy)
    if legacy:
        # 5.0-5.14 __init__ rewrites these globals from the lazy loader: record each (absent ones too)
        # so disable() restores what was there; give them the value a mixer built now would find
        seeded = {"mamba_ssm": route_module("mamba-ssm"), "falcon_mamba_ssm": route_module("falcon_mamba-ssm"),
                  "causal_conv1d": conv_module, "causal_conv1d_fn": conv_fn, "causal_conv1d_update": conv_update}
        for name in sorted(_global_names(module) & set(seeded)):
            if name not in g:
                reg.set_attr(module, name, seeded[name])
        for name in ("causal_conv1d_fn", "causal_conv1d_update"):
            if name not in g:
                reg.set_attr(module, name, seeded[name])
        if not isinstance(g.get("is_fast_path_available"), bool) and "is_fast_path_available" in _global_names(module):
            reg.set_attr(module, "is_fast_path_available", False)  # recomputed by modeling_patch
    return True


def fast_path_open(module: ModuleType) -> bool:
    """<=5.14: every op the all-or-nothing gate needs is there (module globals, 4.57's conv cache)."""
    g = vars(module)
    if isinstance(g.get("is_fast_path_available"), bool) and not g["is_fast_path_available"]:
        return False
    if not all(g.get(name) for name in op_globals(module).values()):
        return False
    cache = g.get("_causal_conv1d_cache")
    if "_causal_conv1d_cache" in g:
        return bool(cache) and all(cache)
    return bool(g.get("causal_conv1d_fn")) and bool(g.get("causal_conv1d_update"))


def lift_device_gates(module: ModuleType, reg: PatchRegistry) -> None:
    """Testing only (TRITON_INTERPRET=1): <=5.14 Mamba-1 mixers take `cuda_kernels_forward` only for
    CUDA weights (jamba / zamba also only with use_mamba_kernels); let CPU weights take it when every
    op is routed, so the interpreter runs fastpath's kernels there (mamba_common.lift_device_gates)."""
    if is_legacy_mamba1(module):
        mamba_common.lift_device_gates(module, reg, _kernel_path_open)


def _kernel_path_open(mixer: Any, module: ModuleType) -> bool:
    weight = next(iter(mixer.parameters()), None)
    return weight is not None and weight.device.type == "cpu" and fast_path_open(module)


# ------------------------------------------------------------------ explain
def kernel_limit(op: str, layer: Any) -> str | None:
    """Why fastpath's Triton kernels would hand this layer's `op` calls to the float reference."""
    if op == "selective_state_update":
        return mamba_common.state_update_limit(layer)
    dstate = getattr(layer, "ssm_state_size", None)
    from fastpath.kernels.selective_scan import interface

    if not interface.KERNELS_READY:
        return "the Triton selective-scan kernels are not in this build"
    if isinstance(dstate, int) and dstate > interface.MAX_DSTATE:
        return f"state size {dstate} > {interface.MAX_DSTATE}"
    return None


def _normed_fused(layer: Any) -> bool:
    """Falcon-Mamba: its fused call carries B/C/dt RMSNorm weights (declined; see the docstring)."""
    return any(hasattr(layer, n) for n in ("b_c_rms", "b_layernorm", "dt_layernorm")) and \
        "Jamba" not in type(layer).__name__


def classify(value: Any, device: str, layer: Any = None) -> tuple[str, bool] | None:
    """explain()'s (impl, fast) for a fastpath Mamba-1 route, or None if `value` is not one."""
    op = getattr(value, ROUTE_ATTR, None)
    if op is None:
        return None
    if op == "mamba_inner_fn" and layer is not None and _normed_fused(layer):
        if getattr(value, mamba_common.TORCH_FN_ATTR, None) is not None:
            return "declined: transformers' unfused path (conv + scan routes below)", True
        op = "selective_scan_fn"  # <=5.14: composed here from the conv and the scan
    limit = kernel_limit(op, layer) if mamba_common.runs_on(device) and layer is not None else None
    return mamba_common.classify_route(value, device, limit)


def config_gate(layer: Any) -> str | None:
    """<=5.14 jamba / zamba take their kernel path only with use_mamba_kernels (read at call time
    from the config in jamba, copied at __init__ in zamba as `use_fast_kernels`)."""
    module = inspect.getmodule(type(layer))
    if module is None or not is_legacy_mamba1(module):
        return None
    forward = type(layer).__dict__.get("forward")
    if getattr(forward, "__fastpath_lifted__", False):
        return None  # testing: the lifted forward takes the kernel path whatever the flag says
    if getattr(layer, "use_fast_kernels", True) is False:
        return "use_mamba_kernels=False in the config this layer was built from"
    try:
        src = inspect.getsource(type(layer).forward)
    except (OSError, TypeError):
        return None
    config = getattr(layer, "config", None)
    if "config.use_mamba_kernels" in src and getattr(config, "use_mamba_kernels", True) is False:
        return "config.use_mamba_kernels=False"
    return None
