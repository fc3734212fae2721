"""explain(model): which implementation each kernel op of each layer resolves to right now.

It reads the same hooks transformers reads at call time (instance attributes, module globals,
the closure of 5.15+ `use_kernel_func_from_hub_with_fallback` wrappers, 4.57's lazy cache, the
<=5.14 all-or-nothing `is_fast_path_available` + CUDA gates), without calling any kernel and
without triggering a Hub download. Rows that a route of routing/routes.py describes itself (a
module it patched: the gated norm, the glue, the zero-centred norm; or the whole model) come from
that route's `explain_layer` / `explain_model`, in table order.
"""

from __future__ import annotations

import inspect
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import Any

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing import selective_scan_route, ssd_route
from fastpath.routing.conv_route import FASTPATH_ROUTE_ATTR
from fastpath.routing.fla_route import DQKWG_IMPL
from fastpath.routing.fla_route import ROUTE_ATTR as GDN_ROUTE_ATTR
from fastpath.routing.hub_kernels import hub_kernel_state
from fastpath.routing.hub_wrappers import is_hub_fallback, peel, unwrap
from fastpath.routing.modeling_patch import FAST_PATH_INPUTS

CONV_OPS = ("causal_conv1d_fn", "causal_conv1d_update")
GDN_OPS = {  # op -> (<=5.14 instance attribute, 5.15+ module global)
    "chunk_gated_delta_rule": ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    "recurrent_gated_delta_rule": ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
}
MAMBA_SSM_NAMES = ("selective_state_update", "selective_scan_fn", "mamba_inner_fn", "falcon_mamba_inner_fn",
                   "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")
# 5.25 `_PACKAGE_SUPPORTED_DEVICES`
PACKAGE_DEVICES = {"causal_conv1d": ("cuda",), "fla": ("cuda", "xpu", "mlu", "npu"), "mamba_ssm": ("cuda",)}


# whether the model being explained was kernelized (transformers 5.25 sets `_use_kernels`)
_KERNELIZED: ContextVar[bool] = ContextVar("fastpath_explain_kernelized", default=False)

# wrapper layers a hook's value is seen through at most (a Func around a hub-fallback closure
# around a module's forward is three)
_MAX_LAYERS = 8

DEFAULT_WIDTH = 100  # columns when there is no terminal to ask (notebooks, pipes)
_HEAD = ("layer", "layer_type", "op", "impl", "fast")
_GAP = "  "
_MIN_IMPL = 32  # columns the impl cell keeps in a table (else the blocks read better)


@dataclass(repr=False)
class Explanation:
    """Rows {layer, layer_type, op, impl, fast}; str() fits `width` columns (default: the
    terminal's width, else 100) without breaking a word: an aligned table whose long cells wrap
    between words inside their column, or, where even that does not fit, one block per layer
    (`layer (class)`, then `[yes] op: impl` lines)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    width: int | None = None

    @property
    def slow_count(self) -> int:
        return sum(1 for r in self.rows if not r["fast"])

    def __str__(self) -> str:
        return self.table(self.width)

    def __repr__(self) -> str:  # notebooks show the table, not a dump of the rows
        return self.table(self.width)

    def table(self, width: int | None = None) -> str:
        if not self.rows:
            return "(no causal_conv1d / gated-delta-rule layers found)"
        if width is None:
            import shutil

            width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
        width = max(int(width), 40)
        cells = [[str(r["layer"]), str(r["layer_type"]), str(r["op"]), str(r["impl"]),
                  "yes" if r["fast"] else "NO"] for r in self.rows]
        widths = _fit_columns([_HEAD, *cells], width)
        if widths is None:
            lines = _blocks(cells, width)
        else:
            lines = [_GAP.join(h.ljust(w) for h, w in zip(_HEAD, widths, strict=True)).rstrip(),
                     _GAP.join("-" * w for w in widths)]
            for row in cells:
                lines += _wrapped_row(row, widths)
        lines.append(f"{len(self.rows) - self.slow_count}/{len(self.rows)} ops fast")
        for note in self.notes:
            lines += _wrap(f"note: {note}", width, "", "  ")
        return "\n".join(lines)


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """Word wrap that never splits a word (a name longer than the width gets its own line)."""
    import textwrap

    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def _fit_columns(rows: list[Any], width: int) -> list[int] | None:
    """Column widths whose sum (plus gaps) fits `width`, or None when no table fits without
    breaking a word: the widest wrappable columns (impl, layer, layer_type) give up space first,
    each never below its longest word (impl never below _MIN_IMPL)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
    minimum = [max(len(word) for r in rows for word in r[i].split() or [""]) for i in range(len(_HEAD))]
    minimum[3] = max(minimum[3], min(widths[3], _MIN_IMPL))  # a narrower impl reads worse than blocks
    budget = width - len(_GAP) * (len(_HEAD) - 1)
    if sum(minimum) > budget:
        return None
    for col in (3, 0, 1, 2):
        excess = sum(widths) - budget
        if excess <= 0:
            break
        widths[col] = max(minimum[col], widths[col] - excess)
    return widths


def _wrapped_row(row: list[str], widths: list[int]) -> list[str]:
    parts = [_wrap(c, w, "", "") for c, w in zip(row, widths, strict=True)]
    height = max(len(p) for p in parts)
    lines = []
    for i in range(height):
        cells = [(p[i] if i < len(p) else "").ljust(w) for p, w in zip(parts, widths, strict=True)]
        lines.append(_GAP.join(cells).rstrip())
    return lines


def _blocks(cells: list[list[str]], width: int) -> list[str]:
    """One block per layer: `layer (layer_type)`, then `  [yes] op: impl` per op."""
    lines: list[str] = []
    current = None
    for layer, layer_type, op, impl, fast in cells:
        if (layer, layer_type) != current:
            current = (layer, layer_type)
            lines += _wrap(f"{layer} ({layer_type})", width, "", "  ")
        lines += _wrap(f"[{fast}] {op}: {impl}", width, "  ", " " * 8)
    return lines


def explain_model(model: Any) -> Explanation:
    token = _KERNELIZED.set(bool(getattr(model, "_use_kernels", False)))
    try:
        return _explain_model(model)
    finally:
        _KERNELIZED.reset(token)


def _explain_model(model: Any) -> Explanation:
    from fastpath.routing.routes import ROUTES

    out = Explanation()
    layer_rows = [r.explain_layer for r in ROUTES if r.explain_layer is not None]
    for name, layer in model.named_modules():
        cls = type(layer)
        module = sys.modules.get(cls.__module__)
        if module is None or not cls.__module__.startswith("transformers.models."):
            continue
        device = _device_of(layer)
        for op, impl, fast in _hook_rows(layer, module, device) + [row for rows in layer_rows
                                                                     for row in rows(layer, device)]:
            out.rows.append({"layer": name or "<root>", "layer_type": cls.__name__, "op": op,
                             "impl": impl, "fast": fast})
    for r in ROUTES:
        if r.explain_model is not None:
            out.rows.extend(r.explain_model(model))
    if "liger_kernel" in sys.modules:  # Liger's ops, when its patches are in place
        from fastpath.routing import liger_route

        liger_rows = liger_route.explain_rows(model)
        out.rows.extend(liger_rows)
        out.notes.extend(liger_route.explain_notes(model, liger_rows))
    if any(r["impl"] == DQKWG_IMPL for r in out.rows):  # which FLA dqkwg configs were validated
        from fastpath.routing import fla_selfcheck

        out.notes.extend(fla_selfcheck.describe())
    hub = _hub_kernels_note()
    if hub and out.rows:
        out.notes.append(hub)
    return out


def _hook_rows(layer: Any, module: ModuleType, device: str) -> list[tuple[str, str, bool]]:
    """(op, impl, fast) for each kernel op a layer reaches through transformers' hooks."""
    ops = _ops_of_class(type(layer))
    if not ops:
        return []
    resolved = [(op, *_resolve(op, layer, module, device)) for op in ops]
    gate = _all_or_nothing_gate(layer, module, device) or selective_scan_route.config_gate(layer)
    limit = _kernel_limit(layer)
    rows = []
    for op, impl, fast in resolved:
        if gate is not None and (op in CONV_OPS or op in ssd_route.MAMBA_OPS or op in selective_scan_route.MAMBA1_OPS):
            impl, fast = f"torch ({gate})", False
        elif limit is not None and op in CONV_OPS and impl.startswith("fastpath-triton"):
            impl, fast = f"fastpath (torch reference: {limit})", False
        rows.append((op, impl, fast))
    return rows


def _hub_kernels_note() -> str | None:
    """The doctor's plan says "hub-kernel" where transformers >= 5.25 with `kernels` installed
    keeps Hub kernels on (fastpath.shared.hub_kernels_env decides, for both): from_pretrained then
    kernelizes the mapped ops, which a table of this model's hooks cannot show."""
    import os

    import fastpath.shared.hub_kernels_env as hub_kernels_env
    from fastpath.routing.hub_kernels import kernels_installed

    module = sys.modules.get("transformers")
    version = str(getattr(module, "__version__", "0"))
    try:
        new = tuple(int(x) for x in version.split(".")[:2]) >= (5, 25)
    except ValueError:
        new = False
    value = os.environ.get(hub_kernels_env.ENV)
    if not (new and hub_kernels_env.on(value) and kernels_installed()):
        return None
    return (f"{hub_kernels_env.ENV}={value if value is not None else '(unset)'} with `kernels` "
            "installed: from_pretrained(use_kernels=None) kernelizes causal_conv1d and the gated "
            "delta rule with Hub kernels (downloads) in the models it loads; fastpath.enable() "
            f"sets {hub_kernels_env.ENV}=0 unless you set it")


@cache
def _ops_of_class(cls: type) -> tuple[str, ...]:
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return ()
    module = sys.modules.get(cls.__module__)
    ops: list[str] = []
    if any(s in src for s in ("causal_conv1d_fn", "causal_conv1d_forward", "_lazy_load_causal_conv1d",
                              'lazy_load_kernel("causal-conv1d")')):
        ops.append("causal_conv1d_fn")
    if any(s in src for s in ("causal_conv1d_update", "causal_conv1d_forward", "_lazy_load_causal_conv1d",
                              'lazy_load_kernel("causal-conv1d")')):
        ops.append("causal_conv1d_update")
    if not ops:
        return ()
    for op, (attr, glob) in GDN_OPS.items():
        if f"self.{attr}" in src or f"{glob}(" in src:
            ops.append(op)
    if module is not None:  # 5.15+: every other hub-fallback op the layer calls (mamba_ssm, fla KDA)
        src = src + _helpers_source(module, src)
        mamba_globals = ssd_route.op_globals(module)  # Mamba-2 ops under their mamba_ssm names
        ops.extend(op for op, gname in mamba_globals.items() if f"{gname}(" in src)
        mamba1_globals = selective_scan_route.op_globals(module)  # Mamba-1 ops likewise
        ops.extend(op for op, gname in mamba1_globals.items() if f"{gname}(" in src)
        for gname, value in vars(module).items():
            routed = hasattr(value, GDN_ROUTE_ATTR)  # a hub-fallback op enable() routed (Kimi's KDA)
            if gname in CONV_OPS or gname in {g for _, g in GDN_OPS.values()} or not (
                    routed or is_hub_fallback(unwrap(value))):
                continue
            if gname in mamba_globals.values() or gname in mamba1_globals.values():
                continue
            if f"{gname}(" in src:
                ops.append(gname)
    return tuple(ops)


def _helpers_source(module: ModuleType, src: str, depth: int = 2) -> str:
    """Source of the module-level helper functions `src` calls (5.25 moves kernel calls into
    kernelizable helpers such as `mamba2_scan_forward`), followed `depth` levels deep."""
    extra = ""
    frontier = src
    seen: set[str] = set()
    for _ in range(depth):
        found = ""
        for name, value in vars(module).items():
            value = unwrap(value)  # 5.25 + `kernels`: helpers are Hub-kernel modules too
            if name in seen or not inspect.isfunction(value) or is_hub_fallback(value):
                continue
            if getattr(value, "__module__", None) != module.__name__ or f"{name}(" not in frontier:
                continue
            seen.add(name)
            try:
                found += inspect.getsource(value)
            except (OSError, TypeError):
                continue
        if not found:
            break
        extra += found
        frontier = found
    return extra


def _kernel_limit(layer: Any) -> str | None:
    """Why fastpath's Triton causal conv would hand this layer's calls to its reference, if it
    would: the kernels' own `kernel_limit`, asked about the layer's depthwise Conv1d."""
    import torch

    from fastpath.kernels.causal_conv1d.interface import kernel_limit

    for child in layer.children():
        if isinstance(child, torch.nn.Conv1d) and child.groups == child.in_channels:
            return kernel_limit(child.kernel_size[0], child.weight.dtype)
    return None


def _device_of(layer: Any) -> str:
    for p in layer.parameters():
        return p.device.type
    return "cpu"


def _all_or_nothing_gate(layer: Any, module: ModuleType, device: str) -> str | None:
    """<=5.14: layers with `cuda_kernels_forward` take it only if every kernel is present and the
    weights are on CUDA; otherwise the whole mixer runs in torch, causal_conv1d included."""
    cls_dict = {k for c in type(layer).__mro__ for k in c.__dict__}
    if "cuda_kernels_forward" not in cls_dict:
        return None
    g = vars(module)
    missing = [n for n in FAST_PATH_INPUTS if n in g and not g[n]]
    cache_value = g.get("_causal_conv1d_cache", ())
    if "_causal_conv1d_cache" in g and not (cache_value and all(cache_value)):
        missing.append("causal_conv1d (lazy cache empty)")
    if missing:
        needs = " (needs mamba_ssm)" if any(m in MAMBA_SSM_NAMES for m in missing) else ""
        return f"all-or-nothing fast path, missing {', '.join(missing)}{needs}"
    if device != "cuda":
        forward = type(layer).__dict__.get("forward")
        if not (getattr(forward, "__fastpath_lifted__", False) and triton_interpreter_on()):
            return "kernel path is gated on CUDA tensors"
    return None


def _resolve(op: str, layer: Any, module: ModuleType, device: str) -> tuple[str, bool]:
    """(impl, fast) of one op: the value transformers reads for it (_hook), classified once, by
    the Mamba route that owns the op where there is one, else by _classify."""
    value, unresolved, route = _hook(op, layer, module)
    if unresolved is not None:
        return unresolved, False
    return (route.classify(value, device, layer) if route is not None else None) or _classify(value, device)


def _hook(op: str, layer: Any, module: ModuleType) -> tuple[Any, str | None, Any]:
    """Where transformers reads `op` for `layer` right now: (its value, the impl when there is
    nothing to classify, the Mamba route module that classifies it or None)."""
    g = vars(module)
    if op in CONV_OPS:
        value = layer.__dict__.get(op, g.get(op))
        if "_causal_conv1d_cache" in g and op not in layer.__dict__:
            cached = g.get("_causal_conv1d_cache")
            if not cached:
                return None, "unresolved until first forward (4.57 lazy loader)", None
            value = cached[1] if op == "causal_conv1d_fn" else cached[0]
        return value, "torch (F.conv1d in the layer)" if value is None else None, None
    if op in GDN_OPS:
        attr, glob = GDN_OPS[op]
        return layer.__dict__.get(attr, g.get(glob)), None, None  # None: _classify says "torch"
    mamba1_globals = selective_scan_route.op_globals(module) if op in selective_scan_route.MAMBA1_OPS else {}
    if mamba1_globals:  # a Mamba-1 module: 5.15+ wrapper global names, <=5.14 mamba_ssm's
        return g.get(mamba1_globals.get(op, op)), None, selective_scan_route
    if op in ssd_route.MAMBA_OPS:  # 5.15+ under its wrapper's global name, <=5.14 its own
        return g.get(ssd_route.op_globals(module).get(op, op)), None, ssd_route
    return g.get(op), None, None


def _classify(value: Any, device: str) -> tuple[str, bool]:
    """(impl, fast) of what a hook holds, seen through its wrapper layers one at a time (a
    `kernels` Func instance, fastpath's and FLA's routes, transformers' hub-fallback closure, an
    nn.Module's forward), down to a plain function, named by its module."""
    for _ in range(_MAX_LAYERS):
        if value is None:
            return "torch", False
        layer = peel(value)
        if layer.hub_name is not None:
            # 5.25 + `kernels`, a Hub-kernel wrapper fastpath did not unwrap: a kernelized model
            # runs the Hub kernel on CUDA (fast when it is in the local cache; else it was
            # downloaded at from_pretrained, which raises offline); otherwise what it wraps runs
            state = hub_kernel_state(layer.hub_name) if device == "cuda" and _KERNELIZED.get() else None
            if state is not None:
                return state, state.startswith("hub kernel cached at ")
            value = layer.inner
            continue
        route = getattr(value, FASTPATH_ROUTE_ATTR, None)
        if route is not None:
            impl = getattr(value, "__fastpath_impl__", None)
            if impl is not None and not getattr(impl, "__module__", "").startswith("fastpath."):
                return f"fastpath route -> override {getattr(impl, '__name__', impl)}", True
            if device == "cuda":
                return "fastpath-triton", True
            if device == "cpu" and triton_interpreter_on():
                return "fastpath-triton (interpreter)", True
            return f"fastpath (torch reference on {device})", False
        gdn = getattr(value, GDN_ROUTE_ATTR, None)
        if gdn is not None:
            if device == "cuda":
                return str(gdn), gdn != "torch"
            return f"torch ({device} tensors; FLA routed for CUDA)", False
        if layer.fallback:
            pkg = layer.package
            if not layer.provided:
                return f"torch fallback ({pkg or 'package'} not importable when transformers imported the layer)", False
            devices = PACKAGE_DEVICES.get(pkg or "", None)
            if devices is not None and layer.gated and device not in devices:
                return f"torch fallback ({pkg} gated to {'/'.join(devices)})", False
            value = layer.inner  # what it binds: a plain function
            break
        forward = getattr(value, "forward", None)
        if forward is None or not callable(value) or inspect.isfunction(value):
            break
        value = getattr(forward, "__func__", forward)  # a module instance: its forward runs
    mod = getattr(value, "__module__", "") or ""
    if mod.startswith("fastpath."):
        return ("fastpath-triton", True) if device == "cuda" or triton_interpreter_on() else (
            f"fastpath (torch reference on {device})", False)
    top = mod.split(".")[0]
    if top in ("causal_conv1d", "fla", "mamba_ssm"):
        return top, device == "cuda"
    if top == "kernels" or "kernels_community" in mod or mod.startswith("kernels"):
        return f"hub kernel ({mod})", device == "cuda"
    return "torch fallback", False
