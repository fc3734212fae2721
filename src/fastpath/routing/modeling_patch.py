"""Find transformers' modeling modules that use causal_conv1d and point them at fastpath.

Discovery is generic: every `transformers.models.<family>.modeling_*` file whose source mentions
`causal_conv1d` (a text scan, nothing imported), so families added after this was written are
covered. Per module, the hooks every transformers era reads are patched:
  * module globals `causal_conv1d_fn` / `causal_conv1d_update` (4.57-5.14 import-time globals,
    5.15+ call-time globals of `use_kernel_func_from_hub_with_fallback`, 5.25 `causal_conv1d_forward`
    reads them too);
  * 4.57 mamba/falcon_mamba `_causal_conv1d_cache`; lfm2's `kernel_modules`/`is_fast_path_available`;
  * <=5.14 GatedDeltaNet instance attributes copied at __init__ (built layers found through gc);
  * gated delta rule globals (5.15+ `torch_*_gated_delta_rule`, <=5.14 `*_gated_delta_rule`)
    when FLA is routed; Kimi-Linear's KDA globals (5.17+) likewise;
Each route of routing/routes.py patches its own hooks (the gated delta rule's and KDA's
here, the conv's last: it recomputes the <=5.14 gates from every global set before it).
Modules imported later are patched by an import hook right after they execute.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing import fla_route
from fastpath.routing.hub_wrappers import kernels_func_inner
from fastpath.routing.patch_registry import PatchRegistry

# names a <=5.14 module-level `is_fast_path_available = all((...))` can be built from
FAST_PATH_INPUTS = (
    "causal_conv1d_fn", "causal_conv1d_update", "selective_state_update", "selective_scan_fn",
    "mamba_inner_fn", "falcon_mamba_inner_fn", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined",
    "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
)


def discover_modeling_modules() -> list[str]:
    """Dotted names of installed transformers modeling modules whose source uses causal_conv1d."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return []
    models_dir = os.path.join(next(iter(spec.submodule_search_locations)), "models")
    found: list[str] = []
    try:
        families = sorted(os.listdir(models_dir))
    except OSError:
        return []
    for family in families:
        fam_dir = os.path.join(models_dir, family)
        if not os.path.isdir(fam_dir):
            continue
        for name in sorted(os.listdir(fam_dir)):
            if not (name.startswith("modeling_") and name.endswith(".py")):
                continue
            try:
                with open(os.path.join(fam_dir, name), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            if "causal_conv1d" in text:
                found.append(f"transformers.models.{family}.{name[:-3]}")
    return found


@dataclass
class Routes:
    """The conv and gated-delta-rule callables enable() installs (built once per enable()): what
    modules and, <=5.14, built layers get."""

    conv_fn: Callable[..., Any]
    conv_update: Callable[..., Any]
    conv_module: ModuleType            # what lazy_load_kernel("causal-conv1d") returns
    make_gdn: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None  # (kind, torch_fn) -> route
    make_kda: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None = None  # Kimi's KDA, same shape
    lift_device_gate: bool = False


def patch_module(module: ModuleType, routes: Routes, reg: PatchRegistry) -> None:
    """Point one modeling module's causal_conv1d (and, when routed, gated delta rule and KDA) hooks
    at fastpath: every hook this module's routes own, in the order enable() uses."""
    if routes.make_gdn is not None:
        patch_gdn_globals(module, routes, reg)
    if routes.make_kda is not None:
        patch_kda_globals(module, routes, reg)
    patch_conv_globals(module, routes, reg)


def patch_kda_globals(module: ModuleType, routes: Routes, reg: PatchRegistry) -> None:
    """5.17+ kimi_linear: the KDA call-time globals -> FLA's KDA (routing/fla_route.py)."""
    g = module.__dict__
    assert routes.make_kda is not None
    for name, kind in fla_route.KDA_GLOBALS.items():
        fn = g.get(name)
        if callable(fn) and hasattr(fn, "__wrapped__"):
            reg.set_attr(module, name, routes.make_kda(kind, fn))


def patch_conv_globals(module: ModuleType, routes: Routes, reg: PatchRegistry) -> None:
    """causal_conv1d's hooks, then the <=5.14 gates computed from every kernel global (run after the
    other routes have set theirs)."""
    g = module.__dict__
    for name, route in (("causal_conv1d_fn", routes.conv_fn), ("causal_conv1d_update", routes.conv_update)):
        # a `kernels` Func still here means enable(hub_kernels="keep"): the Hub kernel stays
        if name in g and kernels_func_inner(g[name]) is None:
            reg.set_attr(module, name, route)
    if "_causal_conv1d_cache" in g:  # 4.57 mamba / falcon_mamba lazy loader
        reg.set_attr(module, "_causal_conv1d_cache", (routes.conv_update, routes.conv_fn))
    if "causal_conv1d" in g and isinstance(g["causal_conv1d"], (ModuleType, type(None))):
        reg.set_attr(module, "causal_conv1d", routes.conv_module)  # 5.x mamba keeps the module too
    if "kernel_modules" in g:  # lfm2 / lfm2_moe <=5.14
        reg.set_attr(module, "kernel_modules", (g.get("causal_conv1d_fn"), g.get("causal_conv1d_update")))
    if isinstance(g.get("is_fast_path_available"), bool):
        inputs = [g[n] for n in FAST_PATH_INPUTS if n in g]
        reg.set_attr(module, "is_fast_path_available", bool(inputs) and all(inputs))
    if routes.lift_device_gate:
        _lift_device_gates(module, reg)


def patch_gdn_globals(module: ModuleType, routes: Routes, reg: PatchRegistry) -> None:
    """The gated delta rule's globals -> FLA's (routing/fla_route.py): 5.15+ call-time wrappers,
    <=5.14 the globals GatedDeltaNet copies at __init__."""
    g = module.__dict__
    assert routes.make_gdn is not None
    # 5.15+: the decorated torch functions are what forward() calls
    for name, kind in (("torch_chunk_gated_delta_rule", "chunk"), ("torch_recurrent_gated_delta_rule", "recurrent")):
        fn = g.get(name)
        if callable(fn) and hasattr(fn, "__wrapped__") and "chunk_gated_delta_rule" not in g:
            reg.set_attr(module, name, routes.make_gdn(kind, fn))
    # <=5.14: globals copied onto each layer at __init__ (`x or torch_x`)
    for name, torch_name, kind in (
        ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule", "chunk"),
        ("fused_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule", "recurrent"),
    ):
        if name in g and callable(g.get(torch_name)):
            reg.set_attr(module, name, routes.make_gdn(kind, g[torch_name]))


def _lift_device_gates(module: ModuleType, reg: PatchRegistry) -> None:
    """Testing only (TRITON_INTERPRET=1): let `"cuda" in device.type` gated layers whose fast path
    needs nothing but causal_conv1d (lfm2 <=5.14) take `cuda_kernels_forward` on CPU tensors."""
    if "kernel_modules" not in module.__dict__:
        return
    for obj in list(module.__dict__.values()):
        if isinstance(obj, type) and obj.__module__ == module.__name__ and "cuda_kernels_forward" in obj.__dict__:
            original = obj.__dict__["forward"]

            # forward(hidden_states, ...) and cuda_kernels_forward(x, ...) take the same arguments
            # in the same order under different first names: translate by position
            rename = dict(zip(list(inspect.signature(original).parameters)[1:],
                              list(inspect.signature(obj.__dict__["cuda_kernels_forward"]).parameters)[1:],
                              strict=False))

            def forward(self: Any, *args: Any, __orig: Any = original, __mod: Any = module,
                        __rename: dict[str, str] = rename, **kwargs: Any) -> Any:
                first = next((a for a in (*args, *kwargs.values()) if hasattr(a, "device")), None)
                if (getattr(__mod, "is_fast_path_available", False) and first is not None
                        and first.device.type == "cpu" and triton_interpreter_on()):
                    return self.cuda_kernels_forward(*args, **{__rename.get(k, k): v for k, v in kwargs.items()})
                return __orig(self, *args, **kwargs)

            forward.__fastpath_lifted__ = True  # type: ignore[attr-defined]
            reg.set_attr(obj, "forward", forward)


def patch_built_layers(module_names: set[str], routes: Routes, reg: PatchRegistry) -> int:
    """<=5.14 layers copied the globals at __init__: repoint already-built instances. Returns count."""
    if not module_names:
        return 0
    import torch

    count = 0
    for obj in _gc_modules(torch.nn.Module):
        if type(obj).__module__ not in module_names:
            continue
        d = obj.__dict__
        touched = False
        if "causal_conv1d_fn" in d:
            reg.set_attr(obj, "causal_conv1d_fn", routes.conv_fn)
            touched = True
        if "causal_conv1d_update" in d:
            reg.set_attr(obj, "causal_conv1d_update", routes.conv_update)
            touched = True
        if routes.make_gdn is not None:
            mod = sys.modules[type(obj).__module__]
            for attr, torch_name, kind in (
                ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule", "chunk"),
                ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule", "recurrent"),
            ):
                if attr in d and callable(getattr(mod, torch_name, None)):
                    reg.set_attr(obj, attr, routes.make_gdn(kind, getattr(mod, torch_name)))
                    touched = True
        count += touched
    return count


# <=5.14 GatedDeltaNet __init__: attribute <- the first non-None of these module globals
_INIT_COPIES = {
    "causal_conv1d_fn": ("causal_conv1d_fn",),
    "causal_conv1d_update": ("causal_conv1d_update", "torch_causal_conv1d_update"),
    "chunk_gated_delta_rule": ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    "recurrent_gated_delta_rule": ("fused_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
}
_ROUTE_MARKS = ("__fastpath_route__", "__fastpath_gdn_route__")  # conv_route / fla_route markers


def unroute_layers_built_while_enabled(module_names: set[str]) -> int:
    """After disable()'s undo: <=5.14 layers *built while enabled* copied fastpath's routes at
    __init__ (layers built before enable() are in the undo log already). Give each what its
    __init__ would copy now, from the module's restored globals. Returns how many were changed."""
    if not module_names:
        return 0
    import torch

    count = 0
    for obj in _gc_modules(torch.nn.Module):
        module = sys.modules.get(type(obj).__module__)
        if module is None or module.__name__ not in module_names:
            continue
        d = obj.__dict__
        for attr, sources in _INIT_COPIES.items():
            if not any(hasattr(d.get(attr), mark) for mark in _ROUTE_MARKS):
                continue
            d[attr] = next((getattr(module, s) for s in sources if getattr(module, s, None) is not None), None)
            count += 1
    return count


def _gc_modules(cls: type) -> Iterator[Any]:
    with warnings.catch_warnings():  # isinstance() on some torch objects warns (deprecated aliases)
        warnings.simplefilter("ignore")
        found = []
        for obj in gc.get_objects():
            try:
                if isinstance(obj, cls):
                    found.append(obj)
            except ReferenceError:
                continue
    yield from found


class ModelingImportHook(importlib.abc.MetaPathFinder):
    """Patches a causal_conv1d-using modeling module right after it is imported for the first time."""

    def __init__(self, targets: set[str], on_loaded: Callable[[ModuleType], None]) -> None:
        self.targets = targets
        self.on_loaded = on_loaded
        self.active = True

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not self.active or fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, hook: ModelingImportHook) -> None:
        self.inner = inner
        self.hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        if self.hook.active:
            self.hook.on_loaded(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tracebacks/inspect
        return getattr(self.inner, name)
