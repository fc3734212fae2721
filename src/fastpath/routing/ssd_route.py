"""Mamba-2 state-space ops -> fastpath: mamba_chunk_scan_combined, selective_state_update and
mamba_split_conv1d_scan_combined for mamba2, nemotron_h, granitemoehybrid (Granite-4.0-H),
falcon_h1, zamba2 and bamba, on every transformers version, with no mamba-ssm installed.

How transformers reaches the three ops (read in each release's models/<family>/modeling_*.py):

* 4.57.x: import time, `if is_mamba_2_ssm_available(): from mamba_ssm.ops.triton.selective_state_update
  import selective_state_update; from mamba_ssm.ops.triton.ssd_combined import
  mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined` (zamba2: is_mamba_ssm_available).
  The check needs CUDA, dist-info metadata and mamba_ssm >= 2.0.4, so an importable stand-in
  module cannot pass it; most families do not even define the two SSD names when it fails. Then
  `is_fast_path_available = all((selective_state_update, causal_conv1d_fn, causal_conv1d_update))`
  at import, and the mixer's forward takes `cuda_kernels_forward` only when that is True AND the
  weights are on CUDA (all-or-nothing: one missing op keeps the whole mixer, conv included, in torch).
  cuda_kernels_forward reads the module globals at call time.
* 5.0-5.14 (5.12.1 read): each mixer's __init__ runs `lazy_load_kernel("causal-conv1d")` and
  `lazy_load_kernel("mamba-ssm")` and writes the module globals (`global selective_state_update,
  ...`) from `resolve_internal_import(mamba_ssm, "ops.triton.ssd_combined.mamba_chunk_scan_combined")`
  (which tries `mamba_ssm.mamba_chunk_scan_combined` first), then `global is_fast_path_available
  = all(...)`. With the `kernels` package installed lazy_load_kernel tries only the Hub
  (kernels-community/mamba-ssm). nemotron_h and zamba2 skip all of it when
  `config.use_mamba_kernels` is False. Same all-or-nothing + CUDA gate in forward.
* 5.15+ (5.17.0, 5.23.0, 5.25.0 read): module-level `@use_kernel_func_from_hub_with_fallback(
  "mamba_chunk_scan_combined" | "selective_state_update" | "mamba_split_conv1d_scan_combined",
  "mamba_ssm")` wrappers around torch functions named `mamba2_chunk_scan`,
  `mamba2_selective_state_update`, `mamba2_split_conv1d_scan_combined` (the last returns None: the
  layer then takes its unfused path). `import mamba_ssm` is tried once, at module import; forward
  looks the wrappers up as module globals at call time (5.25 through the kernelizable
  `mamba2_scan_forward` helper). 5.17 warns on the fallback, 5.21+ raise on packed sequences
  (seq_idx / cu_seqlens) there, 5.25 also falls back for non-CUDA inputs.

What enable() does (exact undo through the PatchRegistry):
* 5.15+: each such wrapper global is replaced by a route with mamba_ssm's signature; CUDA tensors
  (or CPU tensors under TRITON_INTERPRET=1) go to fastpath's kernels, other CPU tensors to the torch
  function transformers wrapped (the split-conv route returns None there, as transformers does).
* <=5.14: the three module globals are set (defined if absent), the conv globals too, and
  `is_fast_path_available` recomputed; 5.0-5.14's lazy loader is pre-seeded with a module
  exposing the routes, so layers built later resolve to them and no Hub download is tried.
* mamba_ssm installed and importing: kept (mode "auto"); `enable(mamba_ssm="fastpath")` routes to
  fastpath anyway, `"off"` leaves the Mamba ops alone.
Caveats found while testing (fastpath follows mamba_ssm's semantics, checked against the float64
recurrence in kernels/ssd/naive.py): zamba2 and nemotron_h <=5.14 `torch_forward` disagree with the
SSD definition once a prompt spans more than one chunk (their kernel path, and fastpath, do not);
mamba_ssm's fused op normalises in groups of dim // ngroups, which 5.17's Mamba2 unfused norm does
not (equal for ngroups = 1; 5.23+ group the unfused norm too).
No `mamba_ssm` stand-in module is injected: 4.57's availability check needs dist-info metadata a
stand-in would have to fake, and module globals reach every version.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fastpath.routing import mamba_common
from fastpath.routing.mamba_common import MODES, MambaStatus, runs_here
from fastpath.routing.patch_registry import PatchRegistry

__all__ = ["MAMBA_OPS", "MODES", "MambaStatus", "classify", "detect_mamba", "op_globals", "patch_module"]

MAMBA_OPS = ("mamba_chunk_scan_combined", "selective_state_update", "mamba_split_conv1d_scan_combined")
ROUTE_ATTR = "__fastpath_mamba_route__"  # value: the op name
LAZY_KERNEL_NAME = "mamba-ssm"


def detect_mamba(mode: str) -> MambaStatus:
    """Resolve enable(mamba_ssm="auto"|"fastpath"|"off") against what is installed."""
    return mamba_common.detect(mode, "Mamba-2", ("mamba_ssm.ops.triton.ssd_combined",
                                                 "mamba_ssm.ops.triton.selective_state_update"),
                               broken="mamba_ssm is installed but does not import", kept="mamba_ssm imports")


def _seq_idx(seq_idx: Any, cu_seqlens: Any, x: Any, kwargs: dict[str, Any]) -> Any:
    """seq_idx as given, else derived from cu_seqlens or a packed batch's flash-attention
    `cu_seq_lens_q` (batch 1, lengths covering exactly the sequence)."""
    if seq_idx is not None or x.shape[0] != 1:
        return seq_idx
    cu = cu_seqlens if cu_seqlens is not None else kwargs.get("cu_seq_lens_q")
    if cu is None or not hasattr(cu, "shape"):
        return None
    from fastpath.routing.conv_route import seq_idx_from_cu_seqlens

    return seq_idx_from_cu_seqlens(cu, x.shape[1], x.device)


def make_chunk_scan_route(torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """mamba_chunk_scan_combined route; `torch_fn` is what CPU tensors take (5.15+), if any."""

    def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                  initial_states=None, seq_idx=None, dt_softplus=False,
                                  dt_limit=(0.0, math.inf), return_final_states=False,
                                  cu_seqlens=None, **kwargs):
        seq_idx = _seq_idx(seq_idx, cu_seqlens, x, kwargs)
        if not runs_here(x) and torch_fn is not None and seq_idx is None:
            return torch_fn(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                            initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                            return_final_states=return_final_states)
        from fastpath.kernels.ssd.interface import mamba_chunk_scan_combined as impl

        result = impl(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                      seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
                      return_final_states=return_final_states)
        # mamba_ssm's out is a fresh contiguous (B, L, H, P) tensor; callers .view() it (falcon_h1)
        if return_final_states:
            return result[0].contiguous(), result[1]
        return result.contiguous()

    return _mark(mamba_chunk_scan_combined, "mamba_chunk_scan_combined", torch_fn)


def make_state_update_route(torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """selective_state_update route (decode); the state is updated in place either way."""

    def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, **kwargs):
        if not runs_here(x) and torch_fn is not None and state_batch_indices is None:
            return torch_fn(state, x, dt, A, B, C, D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)
        from fastpath.kernels.ssd.update import selective_state_update as impl

        return impl(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                    state_batch_indices=state_batch_indices)

    return _mark(selective_state_update, "selective_state_update", torch_fn)


def make_split_conv_scan_route(torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """mamba_split_conv1d_scan_combined route (training, no cache)."""

    def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                         initial_states=None, seq_idx=None, dt_limit=(0.0, math.inf),
                                         return_final_states=False, activation="silu", rmsnorm_weight=None,
                                         rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None,
                                         headdim=None, ngroups=1, norm_before_gate=True,
                                         cu_seqlens=None, **kwargs):
        seq_idx = _seq_idx(seq_idx, cu_seqlens, zxbcdt, kwargs)
        if not runs_here(zxbcdt) and torch_fn is not None:
            return None  # what transformers' fallback returns: the layer takes its unfused path
        from fastpath.kernels.ssd.split_conv_scan import mamba_split_conv1d_scan_combined as impl

        return impl(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                    initial_states=initial_states, seq_idx=seq_idx, dt_limit=tuple(dt_limit),
                    return_final_states=return_final_states, activation=activation,
                    rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps, outproj_weight=outproj_weight,
                    outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups,
                    norm_before_gate=norm_before_gate)

    return _mark(mamba_split_conv1d_scan_combined, "mamba_split_conv1d_scan_combined", torch_fn)


_MAKERS = {"mamba_chunk_scan_combined": make_chunk_scan_route,
           "selective_state_update": make_state_update_route,
           "mamba_split_conv1d_scan_combined": make_split_conv_scan_route}


def _mark(fn: Callable[..., Any], op: str, torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    return mamba_common.mark(fn, ROUTE_ATTR, op, torch_fn)


def route_module() -> ModuleType:
    """What 5.0-5.14's lazy_load_kernel("mamba-ssm") returns after enable(): resolve_internal_import
    finds `selective_state_update` etc. as attributes of the package root first."""
    mod = ModuleType("fastpath_mamba_ssm_route")
    mod.__doc__ = "mamba_ssm's Mamba-2 ops routed to fastpath by fastpath.enable()"
    for op, make in _MAKERS.items():
        setattr(mod, op, make(None))
    mod.__fastpath__ = True  # type: ignore[attr-defined]
    return mod


# ------------------------------------------------------------------ reading transformers' modules
def op_globals(module: ModuleType) -> dict[str, str]:
    """op name -> module global name that forward() calls for it, in this module right now."""
    return mamba_common.op_globals(module, ROUTE_ATTR, MAMBA_OPS, "mamba_chunk_scan_combined")


def _is_legacy_mamba2(module: ModuleType) -> bool:
    """<=5.14 Mamba-2 modeling module: imports the ops by name from mamba_ssm (or its lazy loader)."""
    return mamba_common.is_legacy_module(mamba_common.module_source(module), "mamba_chunk_scan_combined")


# ------------------------------------------------------------------ patching
def patch_module(module: ModuleType, conv_fn: Any, conv_update: Any, reg: PatchRegistry) -> bool:
    """Point one modeling module's Mamba-2 ops at fastpath. Returns whether it is a Mamba-2 module.
    Runs before modeling_patch recomputes a <=5.14 `is_fast_path_available`."""
    ops = op_globals(module)
    if not ops:
        return False
    g = module.__dict__
    legacy = all(op == gname for op, gname in ops.items()) and _is_legacy_mamba2(module)
    mamba_common.route_op_globals(module, ops, _MAKERS, reg, legacy)
    if legacy:
        # 5.0-5.14 __init__ rewrites these globals: record them all (even absent ones) so disable()
        # restores what was there, and give `is_fast_path_available` the value an __init__ without
        # mamba_ssm would compute before enable() turns it on
        for name, value in (("causal_conv1d_fn", conv_fn), ("causal_conv1d_update", conv_update)):
            if name not in g:
                reg.set_attr(module, name, value)
        if not isinstance(g.get("is_fast_path_available"), bool):
            module.is_fast_path_available = False  # type: ignore[attr-defined]
    return True


def seed_lazy_kernel_mapping(hub: ModuleType, reg: PatchRegistry) -> bool:
    """5.0-5.14: `lazy_load_kernel("mamba-ssm")` returns this before trying the Hub or the package."""
    mapping = getattr(hub, "_KERNEL_MODULE_MAPPING", None)
    if not isinstance(mapping, dict):
        return False
    reg.set_item(mapping, LAZY_KERNEL_NAME, route_module())
    return True


def lift_device_gates(module: ModuleType, reg: PatchRegistry) -> None:
    """Testing only (TRITON_INTERPRET=1): <=5.14 Mamba-2 mixers take `cuda_kernels_forward` only for
    CUDA weights; let CPU weights take it too (once `is_fast_path_available`), so the interpreter
    runs fastpath's kernels there (mamba_common.lift_device_gates)."""
    if _is_legacy_mamba2(module):
        mamba_common.lift_device_gates(module, reg, _kernel_path_open)


def _kernel_path_open(mixer: Any, module: ModuleType) -> bool:
    weight = getattr(getattr(mixer, "in_proj", None), "weight", None)
    return bool(getattr(module, "is_fast_path_available", False)) and weight is not None \
        and weight.device.type == "cpu"


# ------------------------------------------------------------------ explain
def kernel_limit(op: str, layer: Any) -> str | None:
    """Why fastpath's Triton kernels would hand this layer's `op` calls to the float reference."""
    if op == "selective_state_update":
        return mamba_common.state_update_limit(layer)
    headdim = getattr(layer, "head_dim", None)
    dstate = getattr(layer, "ssm_state_size", None)
    chunk = getattr(layer, "chunk_size", None)
    from fastpath.kernels.ssd import interface

    if not interface.KERNELS_READY:
        return "the Triton SSD scan kernels are not in this build"
    for name, value, limit in (("head dim", headdim, interface.MAX_HEADDIM),
                               ("state size", dstate, interface.MAX_DSTATE),
                               ("chunk size", chunk, interface.MAX_CHUNK)):
        if isinstance(value, int) and value > limit:
            return f"{name} {value} > {limit}"
    return None


def classify(value: Any, device: str, layer: Any = None) -> tuple[str, bool] | None:
    """explain()'s (impl, fast) for a fastpath Mamba route, or None if `value` is not one."""
    op = getattr(value, ROUTE_ATTR, None)
    if op is None:
        return None
    limit = kernel_limit(op, layer) if mamba_common.runs_on(device) and layer is not None else None
    return mamba_common.classify_route(value, device, limit)
