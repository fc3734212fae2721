"""What the Mamba-1 and Mamba-2 routes share: one decision shape, one device test, one way to read
modeling sources and find the module globals a mixer calls its ops through (transformers' wrappers
are read in routing/hub_wrappers.py), one testing-only device-gate lift and one explain()
classification. routing/ssd_route.py (Mamba-2) and routing/selective_scan_route.py (Mamba-1) keep
only what differs: their ops, signatures, lazy-loader names and kernel limits.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing.hub_wrappers import closure_value, hub_func_name, kernels_func_inner
from fastpath.routing.patch_registry import PatchRegistry

#: enable(mamba_ssm=...): "auto" routes unless a working mamba_ssm is installed
MODES = ("auto", "fastpath", "off")
#: set on every Mamba route: the torch function transformers wrapped (5.15+), or None
TORCH_FN_ATTR = "__fastpath_torch_fn__"


@dataclass
class MambaStatus:
    """What enable() decided for one family of Mamba ops."""

    route: bool          # install fastpath's routes
    impl: str            # "fastpath" | "mamba_ssm" | "off"
    reason: str


def detect(mode: str, label: str, modules: tuple[str, ...], *, broken: str, kept: str,
           extra: Callable[[], str | None] | None = None) -> MambaStatus:
    """Resolve enable(mamba_ssm="auto"|"fastpath"|"off") for the `label` ops (e.g. "Mamba-2") whose
    mamba_ssm implementation lives in `modules`; `broken` / `kept` start the reason when they do
    not import / do. `extra`, when given, is asked after those modules import: a reason to route to
    fastpath anyway (an importable package whose ops raise), or None."""
    if mode == "off":
        return MambaStatus(False, "off", f"mamba_ssm='off': {label} ops left as transformers picks them")
    if mode == "fastpath":
        return MambaStatus(True, "fastpath", "mamba_ssm='fastpath'")
    if importlib.util.find_spec("mamba_ssm") is None:
        return MambaStatus(True, "fastpath", "mamba_ssm is not installed")
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as exc:  # 2.3.2.post1 imports its CUDA extension at the package root
        return MambaStatus(True, "fastpath", f"{broken} ({type(exc).__name__}: {str(exc)[:120]})")
    why = extra() if extra is not None else None
    if why is not None:
        return MambaStatus(True, "fastpath", why)
    return MambaStatus(False, "mamba_ssm", f"{kept}: kept (enable(mamba_ssm='fastpath') routes to fastpath instead)")


def runs_here(t: Any) -> bool:
    """fastpath's Triton kernels take this tensor: CUDA, or CPU under TRITON_INTERPRET=1."""
    return bool(getattr(t, "is_cuda", False)) or triton_interpreter_on()


def mark(fn: Callable[..., Any], route_attr: str, op: str, torch_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """Tag a route with its op (under the route module's marker) and the torch function it wraps."""
    setattr(fn, route_attr, op)
    setattr(fn, TORCH_FN_ATTR, torch_fn)
    return fn


def torch_fn_of(current: Any) -> Any:
    """The torch function a module global stands for: a route's, or a hub-fallback wrapper's."""
    return getattr(current, TORCH_FN_ATTR, None) or closure_value(current, "torch_function")


def route_op_globals(module: ModuleType, ops: dict[str, str], makers: dict[str, Callable[..., Any]],
                     reg: PatchRegistry, legacy: bool) -> None:
    """Each op's module global (`ops`: op -> global name) -> its route from `makers`, built around
    the torch function transformers 5.15+ wraps there (`legacy`, <= 5.14: none). A Hub kernel that
    enable(hub_kernels="keep") left in place stays."""
    g = module.__dict__
    for op, gname in ops.items():
        torch_fn = None
        if not legacy:
            current = g.get(gname)
            if kernels_func_inner(current) is not None:
                continue
            torch_fn = torch_fn_of(current)
        reg.set_attr(module, gname, makers[op](torch_fn))


def module_source(module: ModuleType) -> str:
    """The text of a modeling module's file ("" when it has none)."""
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def is_legacy_module(text: str, key_op: str) -> bool:
    """<=5.14 modeling source (`text`) of a mixer family whose fused op is `key_op`: it imports the
    ops by name from mamba_ssm (or its lazy loader) instead of wrapping them for the Hub (5.15+)."""
    return key_op in text and "cuda_kernels_forward" in text and \
        f'use_kernel_func_from_hub_with_fallback("{key_op}"' not in text


def op_globals(module: ModuleType, route_attr: str, ops: tuple[str, ...], key_op: str,
               aliases: dict[str, str] | None = None) -> dict[str, str]:
    """op name -> the module global that the mixer calls for it, in this module right now: globals
    holding a route marked `route_attr` or a 5.15+ Hub wrapper of one of `ops`; a module without
    `key_op` is another family's (Mamba-1 and Mamba-2 both wrap selective_state_update) and yields
    {}. A <=5.14 module (is_legacy_module) calls each op under its own name, or under its alias
    where the source names the alias (falcon_mamba_inner_fn for mamba_inner_fn)."""
    found: dict[str, str] = {}
    for gname, value in vars(module).items():
        op = getattr(value, route_attr, None)
        op = op if isinstance(op, str) else hub_func_name(value)
        if op in ops:
            found[op] = gname
    if key_op in found:
        return found
    text = module_source(module)
    if not is_legacy_module(text, key_op):
        return {}
    named = {op: (aliases or {}).get(op) for op in ops}
    return {op: alias if alias and alias in text else op for op, alias in named.items()}


def lift_device_gates(module: ModuleType, reg: PatchRegistry, opens: Callable[[Any, ModuleType], bool]) -> None:
    """Testing only (TRITON_INTERPRET=1): <=5.14 Mamba mixers take `cuda_kernels_forward` only for
    CUDA weights; let a CPU mixer take it when `opens(mixer, module)` says its kernel path is open,
    so the interpreter runs fastpath's kernels there. forward and cuda_kernels_forward share
    parameter names; arguments are passed by name. A mixer whose kernel path enters
    torch.cuda.* (falcon_h1 <=5.14: torch.cuda.device()) cannot run on CPU and is left alone."""
    for obj in list(module.__dict__.values()):
        if not (isinstance(obj, type) and obj.__module__ == module.__name__
                and "cuda_kernels_forward" in obj.__dict__ and "forward" in obj.__dict__):
            continue
        try:
            if "torch.cuda." in inspect.getsource(obj.__dict__["cuda_kernels_forward"]):
                continue
        except (OSError, TypeError):
            continue
        original = obj.__dict__["forward"]
        fwd_sig = inspect.signature(original)
        fast_params = list(inspect.signature(obj.__dict__["cuda_kernels_forward"]).parameters)[1:]

        def forward(self: Any, *args: Any, __orig: Any = original, __mod: Any = module,
                    __sig: Any = fwd_sig, __fast: list[str] = fast_params, **kwargs: Any) -> Any:
            if triton_interpreter_on() and opens(self, __mod):
                bound = __sig.bind(self, *args, **kwargs).arguments
                return self.cuda_kernels_forward(**{k: bound[k] for k in __fast if k in bound})
            return __orig(self, *args, **kwargs)

        forward.__fastpath_lifted__ = True  # type: ignore[attr-defined]
        reg.set_attr(obj, "forward", forward)


def state_update_limit(layer: Any) -> str | None:
    """Why the Triton decode update would hand this layer's calls to the float reference."""
    from fastpath.kernels.ssd.update import MAX_DSTATE

    dstate = getattr(layer, "ssm_state_size", None)
    if isinstance(dstate, int) and dstate > MAX_DSTATE:
        return f"state size {dstate} > {MAX_DSTATE}"
    return None


def classify_route(value: Any, device: str, limit: str | None) -> tuple[str, bool]:
    """explain()'s (impl, fast) for a fastpath Mamba route on `device`, given the kernels' `limit`
    for this layer (None: they take it)."""
    if limit is not None and runs_on(device):
        return f"fastpath (torch reference: {limit})", False
    if device == "cuda":
        return "fastpath-triton", True
    if runs_on(device):
        return "fastpath-triton (interpreter)", True
    if getattr(value, TORCH_FN_ATTR, None) is not None:
        return f"torch ({device} tensors; fastpath routed for CUDA)", False
    return f"fastpath (torch reference on {device})", False


def runs_on(device: str) -> bool:
    """fastpath's Triton kernels run on tensors of `device` here."""
    return device == "cuda" or (device == "cpu" and triton_interpreter_on())
