"""The routes enable() installs, declared as one table: ROUTES.

Each entry is a frozen `Route`: its name and the explain() ops it owns, `detect` (the decision for
this enable() call, from its arguments and what is installed; raises for a forced mode that cannot
be met; enable() undoes what earlier detections did through their `leave`), `report` (the EnableReport fields and notes it fills) and `summary` (its lines of
enable()'s summary), `install` (once per enable(), changes recorded in the PatchRegistry: explain()'s
`ACTIVE` markers, autotuner configs), `enter` / `leave` (process state outside the registry: an
environment variable, FLA's backend; entered by enable() and on leaving suspended(), left by
disable(), on entering suspended() and when enable() fails half way), `seed` (transformers'
hub-kernel module: the <=5.14 lazy loader's cache), `patch` (each modeling module, when found or
imported; in table order, so the Hub-kernel wrappers are seen through first and the conv route,
which recomputes the <=5.14 gates from every kernel global, comes after the routes that set them),
`patch_built` (<=5.14 layers that copied globals at __init__), `after_undo` (disable() only, after
the registry's undo), `explain_layer` / `explain_model` (explain()'s rows for one module / the
whole model, besides the transformers hooks explain() reads itself) and `switches` (readers of
the FASTPATH_* variables the route and the kernels it routes to obey, each raising UsageError on
a bad value: check_switches() runs them all before any work).

enable() / disable() / suspended() in routing/engine.py, explain() in routing/explain.py
and EnableReport.summary() loop over this table; nothing else names a route.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fastpath.kernels.dispatch import cuda_capability, triton_interpreter_on
from fastpath.kernels.selective_scan import interface as sscan_kernels
from fastpath.routing import (
    add_norm_route,
    autotune_decisions,
    conv_route,
    embedding_route,
    fla_route,
    fla_selfcheck,
    gates_route,
    lm_head_route,
    modeling_patch,
    norm_route,
    selective_scan_route,
    ssd_route,
    swiglu_route,
    zc_norm_route,
)
from fastpath.routing import hub_kernels as hub_route
from fastpath.routing.patch_registry import PatchRegistry


@dataclass(frozen=True)
class EnableRequest:
    """enable()'s arguments, validated."""

    causal_conv1d_fn: Callable[..., Any] | None = None
    causal_conv1d_update: Callable[..., Any] | None = None
    gated_delta_rule: str = "auto"
    mamba_ssm: str = "auto"
    glue: bool = True
    lift_device_gate: bool = False
    hub_mode: str = "route"
    lm_loss: bool = True


@dataclass
class Session:
    """One enable(): what the routes' functions share. `hooks` (the conv and gated-delta-rule
    callables) is built from the decisions once every route has detected."""

    request: EnableRequest
    registry: PatchRegistry
    report: Any                                   # routing.engine.EnableReport
    decisions: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)
    hooks: modeling_patch.Routes | None = None

    @property
    def conv(self) -> modeling_patch.Routes:
        assert self.hooks is not None, "hooks are built after every route detected"
        return self.hooks


Row = tuple[str, str, bool]  # explain(): (op, impl, fast)


def _nothing(*_: Any) -> None:
    return None


def _no_lines(_: Any) -> list[str]:
    return []


def _report_into(impl_field: str, reason_field: str) -> Callable[[Any, Session], None]:
    """report: the decision's impl and reason into the route's two EnableReport fields."""
    def report(d: Any, s: Session) -> None:
        setattr(s.report, impl_field, d.impl)
        setattr(s.report, reason_field, d.reason)

    return report


def _patch_noting(patch_module: Callable[[ModuleType, Any, PatchRegistry], list[str]]
                  ) -> Callable[[ModuleType, Any, Session], None]:
    """patch: the route module's patch_module(module, decision, registry), its notes into the report."""
    def patch(module: ModuleType, d: Any, s: Session) -> None:
        s.report.notes.extend(patch_module(module, d, s.registry))

    return patch


@dataclass(frozen=True)
class Route:
    """One route of enable(): see the module docstring for when each function runs."""

    name: str
    ops: tuple[str, ...]
    detect: Callable[[Session], Any]
    report: Callable[[Any, Session], None] = _nothing
    summary: Callable[[Any], list[str]] = _no_lines          # EnableReport -> lines
    install: Callable[[Any, Session], None] | None = None
    enter: Callable[[Any, Session], str | None] | None = None  # -> a note for enable()'s report
    leave: Callable[[Any, Session], None] | None = None
    seed: Callable[[ModuleType, Any, Session], None] | None = None
    patch: Callable[[ModuleType, Any, Session], None] | None = None
    patch_built: Callable[[set[str], Any, Session], int] | None = None
    after_undo: Callable[[Any, Session], None] | None = None
    explain_layer: Callable[[Any, str], list[Row]] | None = None
    explain_model: Callable[[Any], list[dict[str, Any]]] | None = None
    switches: tuple[Callable[[], object], ...] = ()


# ---------------------------------------------------------------- transformers 5.25's Hub wrappers
@dataclass
class HubDecision:
    mode: str  # hub_route.MODES


def _hub_detect(s: Session) -> HubDecision:
    return HubDecision(s.request.hub_mode)


def _hub_report(d: HubDecision, s: Session) -> None:
    s.report.hub_kernels = d.mode
    if d.mode == "route" and hub_route.kernels_installed():
        s.report.notes.append("`kernels` is installed: fastpath's routes replace transformers' "
                              "Hub-kernel wrappers; kernelize() maps none of them")


def _hub_summary(report: Any) -> list[str]:
    if report.hub_kernels == "keep":
        return [f"Hub-kernel wrappers -> kept ({hub_route.MODE_ENV}=keep): on transformers 5.25 with "
                "`kernels`, the ops it wraps stay Hub kernels (kernelized models) or transformers' own "
                "path; fastpath routes only the rest"]
    if report.hub_globals:
        return [f"Hub-kernel wrappers -> routed to fastpath ({report.hub_globals} module globals; "
                f"{hub_route.MODE_ENV}=keep keeps Hub kernels)"]
    return []


def _hub_enter(d: HubDecision, s: Session) -> str | None:
    if d.mode == "route":
        return hub_route.disable_hub_downloads(s.env)
    return (f"{hub_route.MODE_ENV}=keep: Hub-kernel wrappers and {hub_route.ENV} left as they are; a "
            "model loaded with use_kernels=True downloads Hub kernels at its first call (offline: torch "
            "fallback)")


def _hub_leave(_: HubDecision, s: Session) -> None:
    hub_route.restore_env(s.env)


def _hub_patch(module: ModuleType, d: HubDecision, s: Session) -> None:
    if d.mode == "route":  # 5.25 + `kernels`: see through the Hub-kernel wrappers before any route
        s.report.hub_globals += len(hub_route.unwrap_module_globals(module, s.registry))


# ---------------------------------------------------------------- Mamba-2 and Mamba-1 ops
def _mamba_report(field_name: str, label: str) -> Callable[[ssd_route.MambaStatus, Session], None]:
    def report(d: ssd_route.MambaStatus, s: Session) -> None:
        setattr(s.report, field_name, d.impl)
        if s.request.mamba_ssm != "auto" or not d.route:
            s.report.notes.append(f"{label}: {d.reason}")

    return report


def _mamba2_seed(hub: ModuleType, d: ssd_route.MambaStatus, s: Session) -> None:
    if d.route:
        ssd_route.seed_lazy_kernel_mapping(hub, s.registry)


def _mamba2_patch(module: ModuleType, d: ssd_route.MambaStatus, s: Session) -> None:
    # before the conv route: it recomputes a <=5.14 `is_fast_path_available` from these globals
    if d.route and ssd_route.patch_module(module, s.conv.conv_fn, s.conv.conv_update, s.registry) \
            and s.request.lift_device_gate:
        ssd_route.lift_device_gates(module, s.registry)


def _mamba1_seed(hub: ModuleType, d: ssd_route.MambaStatus, s: Session) -> None:
    if d.route:
        selective_scan_route.seed_lazy_kernel_mapping(hub, s.registry, s.decisions["mamba_ssd"].route)


def _mamba1_patch(module: ModuleType, d: ssd_route.MambaStatus, s: Session) -> None:
    if d.route and selective_scan_route.patch_module(module, s.conv.conv_fn, s.conv.conv_update,
                                             s.conv.conv_module, s.registry) \
            and s.request.lift_device_gate:
        selective_scan_route.lift_device_gates(module, s.registry)


# ---------------------------------------------------------------- the gated delta rule and KDA (FLA)
def _gdn_detect(s: Session) -> fla_route.FlaStatus:
    from fastpath.shared.errors import FastpathError

    fla = fla_route.detect_fla(s.request.gated_delta_rule)
    if s.request.gated_delta_rule == "fla" and not fla.route:
        raise FastpathError(f"gated_delta_rule='fla' but FLA cannot be used: {fla.reason}")
    if fla.route:
        fla_route.use_dqkwg_route(fla)  # FLA #640 only (rewrites fla); left by _gdn_leave
    return fla


def _gdn_enter(fla: fla_route.FlaStatus, _: Session) -> str | None:
    fla_route.enter_dqkwg_route(fla)  # FLA #640 only; installed by _gdn_detect, again on resume
    return None


def _gdn_leave(fla: fla_route.FlaStatus, _: Session) -> None:
    if fla.chunk_impl == fla_route.DQKWG_IMPL:
        fla_route.undo_dqkwg_route()


def _gdn_report(fla: fla_route.FlaStatus, s: Session) -> None:
    import warnings

    s.report.gated_delta_rule = fla.chunk_impl if fla.route else "torch"
    s.report.gated_delta_rule_reason = fla.reason
    if fla.chunk_impl == fla_route.DQKWG_IMPL:
        # the route line above already carries the reason; the note is the one thing to do
        s.report.notes.append(f"FLA #640 here: until `{fla_route.REMEDY_640}`, the gated backward runs "
                              "the self-checked dqkwg route")
    elif fla.chunk_impl == "fla-fwd+torch-bwd":
        warnings.warn(f"fastpath: {fla.reason}", RuntimeWarning, stacklevel=3)


def _gdn_summary(report: Any) -> list[str]:
    lines = [f"gated delta rule -> {report.gated_delta_rule} ({report.gated_delta_rule_reason})"]
    if report.gated_delta_rule == fla_route.DQKWG_IMPL:  # read now: checks run at first backward
        from fastpath.routing import fla_selfcheck

        lines += [f"  dqkwg {r.config.label()}: {'PASS' if r.passed else 'FAIL'}"
                  for r in fla_selfcheck.RESULTS.values()]
    return lines


def _gdn_patch(module: ModuleType, fla: fla_route.FlaStatus, s: Session) -> None:
    if s.conv.make_gdn is not None:
        modeling_patch.patch_gdn_globals(module, s.conv, s.registry)


def _kda_report(fla: fla_route.FlaStatus, s: Session) -> None:
    s.report.kda = "fla" if fla.kda_route else "torch"
    s.report.kda_reason = fla.kda_reason if fla.route else fla.reason


def _kda_patch(module: ModuleType, fla: fla_route.FlaStatus, s: Session) -> None:
    if s.conv.make_kda is not None:
        modeling_patch.patch_kda_globals(module, s.conv, s.registry)


# ---------------------------------------------------------------- GatedDeltaNet's gated RMSNorm (FLA)
def _norm_detect(_: Session) -> norm_route.NormStatus:
    from fastpath.shared.errors import FastpathError

    norm = norm_route.detect_norm()
    if norm_route.route_mode() == "fla" and not norm.route:
        raise FastpathError(f"{norm_route.ENV_MODE}=fla but FLA's gated RMSNorm cannot be used: {norm.reason}")
    return norm


def _norm_install(norm: norm_route.NormStatus, s: Session) -> None:
    s.registry.set_attr(norm_route, "ACTIVE", norm)  # what explain() says of an unrouted norm
    if norm.route and triton_interpreter_on():
        norm_route.interpreter_single_config(s.registry)


def _norm_patch(module: ModuleType, norm: norm_route.NormStatus, s: Session) -> None:
    if norm.route:
        s.report.notes.extend(norm_route.patch_module(module, norm, s.registry))


def _norm_rows(layer: Any, device: str) -> list[Row]:
    child = norm_route.gated_norm_child(layer)
    if child is None:
        return []
    return [(norm_route.OP, *norm_route.describe_layer(child, device))]


# ---------------------------------------------------------------- causal_conv1d
@dataclass
class ConvDecision:
    impl: str                       # "fastpath" or "override:<name>"
    fn: Callable[..., Any]          # the Dao-style implementations the routes call
    update: Callable[..., Any]


def _conv_detect(s: Session) -> ConvDecision:
    from fastpath import causal_conv1d as face

    r = s.request
    fn = r.causal_conv1d_fn or face.causal_conv1d_fn
    update = r.causal_conv1d_update or face.causal_conv1d_update
    overridden = r.causal_conv1d_fn is not None or r.causal_conv1d_update is not None
    return ConvDecision("override:" + getattr(fn, "__name__", "fn") if overridden else "fastpath", fn, update)


def _conv_report(d: ConvDecision, s: Session) -> None:
    s.report.conv_impl = d.impl
    if s.request.lift_device_gate:
        s.report.notes.append("lift_device_gate: CUDA-gated lfm2 kernel paths run on CPU (Triton interpreter)")


def _conv_install(_: ConvDecision, s: Session) -> None:
    """`import causal_conv1d` gives fastpath's face when the real package is absent and mamba_ssm
    (which imports it) is installed. transformers itself is routed via module globals, so the face
    is not injected otherwise: that keeps disable() exact for modules imported meanwhile."""
    import importlib
    import importlib.util

    from fastpath import causal_conv1d as face

    if "causal_conv1d" in sys.modules or importlib.util.find_spec("causal_conv1d") is not None:
        s.report.notes.append("a real causal_conv1d package is installed; transformers is still routed to fastpath")
        return
    if importlib.util.find_spec("mamba_ssm") is None:
        return
    s.registry.set_item(sys.modules, "causal_conv1d", face)
    for sub in ("causal_conv1d_interface", "cpp_functions", "causal_conv1d_varlen"):
        mod = importlib.import_module(f"fastpath.causal_conv1d.{sub}")
        s.registry.set_item(sys.modules, f"causal_conv1d.{sub}", mod)
    s.report.notes.append("sys.modules['causal_conv1d'] -> fastpath.causal_conv1d (for mamba_ssm)")


def _conv_seed(hub: ModuleType, _: ConvDecision, s: Session) -> None:
    hub_route.seed_lazy_kernel_mapping(hub, s.conv.conv_module, s.registry)


def _conv_patch(module: ModuleType, _: ConvDecision, s: Session) -> None:
    modeling_patch.patch_conv_globals(module, s.conv, s.registry)


def _conv_patch_built(names: set[str], _: ConvDecision, s: Session) -> int:
    s.report.layers_patched = modeling_patch.patch_built_layers(names, s.conv, s.registry)
    return s.report.layers_patched


def _conv_after_undo(_: ConvDecision, s: Session) -> None:
    if _layers_copy_globals(s.report.transformers_version):
        modeling_patch.unroute_layers_built_while_enabled(set(s.report.modules_patched))


def _layers_copy_globals(version: str | None) -> bool:
    """transformers <= 5.14: GatedDeltaNet layers copy the kernel globals at __init__."""
    from packaging.version import InvalidVersion, Version

    try:
        return version is not None and Version(version).release[:2] <= (5, 14)
    except InvalidVersion:
        return True


# ---------------------------------------------------------------- Qwen3.5 glue and the zero-centred norm
def _glue_rows(layer: Any, device: str) -> list[Row]:
    row = gates_route.describe_layer(layer, device)
    return [row] if row is not None else []


def _class_rows(route_module: ModuleType) -> Callable[[Any, str], list[Row]]:
    """explain_layer: the route module's describe_layer(layer, device) as a row of its OP."""
    def rows(layer: Any, device: str) -> list[Row]:
        found = route_module.describe_layer(layer, device)
        return [(route_module.OP, *found)] if found is not None else []

    return rows


# ---------------------------------------------------------------- autotune decisions (no op of its own)
@dataclass
class AutotuneSeed:
    """The decisions seeded into this process's autotuners (routing/autotune_decisions.py): the
    file FASTPATH_AUTOTUNE_DECISIONS names, else the one shipped for this GPU. Speed only: every
    config an autotuner offers computes the same function."""

    applied: autotune_decisions.SeedReport | None = None


def _seed_enter(d: AutotuneSeed, _: Session) -> str | None:
    d.applied = autotune_decisions.seed_for_process(cuda_capability())
    return d.applied.summary() if d.applied is not None else None


def _seed_leave(d: AutotuneSeed, _: Session) -> None:
    if d.applied is not None:
        d.applied.undo()
        d.applied = None


def _active(module: ModuleType) -> Callable[[Any, Session], None]:
    """install: the route module's ACTIVE decision (explain() and the routed forwards read it),
    recorded so disable() clears it and suspended() suspends it."""
    def install(d: Any, s: Session) -> None:
        s.registry.set_attr(module, "ACTIVE", d)

    return install


def _embedding_install(d: embedding_route.EmbeddingStatus, s: Session) -> None:
    """install: ACTIVE as every fused-kernel route, and torch.nn.Embedding's forward (a torch
    class, not a modeling module's: every model's embeddings are instances of it)."""
    s.registry.set_attr(embedding_route, "ACTIVE", d)
    embedding_route.install(d, s.registry)


# ---------------------------------------------------------------- the table
ROUTES: tuple[Route, ...] = (
    Route("hub_kernels", (), _hub_detect, report=_hub_report, summary=_hub_summary,
          enter=_hub_enter, leave=_hub_leave, patch=_hub_patch, switches=(hub_route.route_mode,)),
    Route("mamba_ssd", ssd_route.MAMBA_OPS, lambda s: ssd_route.detect_mamba(s.request.mamba_ssm),
          report=_mamba_report("mamba_ssd", "Mamba-2 SSD ops"),
          summary=lambda r: [f"Mamba-2 SSD ops -> {r.mamba_ssd}"], seed=_mamba2_seed, patch=_mamba2_patch),
    Route("mamba1_scan", selective_scan_route.MAMBA1_OPS, lambda s: selective_scan_route.detect_mamba1(s.request.mamba_ssm),
          report=_mamba_report("mamba1_scan", "Mamba-1 selective scan ops"),
          summary=lambda r: [f"Mamba-1 scan ops -> {r.mamba1_scan}"], seed=_mamba1_seed, patch=_mamba1_patch,
          switches=(sscan_kernels.fwd_kernel, sscan_kernels.bwd_kernel)),
    Route("gated_delta_rule", ("chunk_gated_delta_rule", "recurrent_gated_delta_rule"), _gdn_detect,
          report=_gdn_report, summary=_gdn_summary, enter=_gdn_enter, leave=_gdn_leave, patch=_gdn_patch,
          switches=(fla_selfcheck.route_mode,)),
    Route("kda", tuple(fla_route.KDA_GLOBALS), lambda s: s.decisions["gated_delta_rule"],
          report=_kda_report, summary=lambda r: [f"Kimi-Linear KDA -> {r.kda} ({r.kda_reason})"],
          patch=_kda_patch),
    Route("gated_norm", (norm_route.OP,), _norm_detect, report=_report_into("gated_norm", "gated_norm_reason"),
          summary=lambda r: [f"gated RMSNorm -> {r.gated_norm} ({r.gated_norm_reason})"],
          install=_norm_install, patch=_norm_patch, explain_layer=_norm_rows, switches=(norm_route.route_mode,)),
    # after the routes that set kernel globals: it recomputes the <=5.14 gates from all of them
    Route("causal_conv1d", ("causal_conv1d_fn", "causal_conv1d_update"), _conv_detect, report=_conv_report,
          summary=lambda r: [f"causal_conv1d -> {r.conv_impl}"], install=_conv_install, seed=_conv_seed,
          patch=_conv_patch, patch_built=_conv_patch_built, after_undo=_conv_after_undo),
    Route("glue", (gates_route.OP_GATES, gates_route.OP_OUTPUT_GATE), lambda s: gates_route.detect_glue(s.request.glue),
          report=_report_into("glue", "glue_reason"), install=_active(gates_route),
          patch=_patch_noting(gates_route.patch_module), explain_layer=_glue_rows,
          switches=(gates_route.route_mode,)),
    Route("zc_norm", (zc_norm_route.OP,), lambda s: zc_norm_route.detect_zc_norm(),
          report=_report_into("zc_norm", "zc_norm_reason"),
          summary=lambda r: [f"zero-centred RMSNorm -> {r.zc_norm} ({r.zc_norm_reason})"],
          install=_active(zc_norm_route), patch=_patch_noting(zc_norm_route.patch_module),
          explain_layer=_class_rows(zc_norm_route), switches=(zc_norm_route.route_mode,)),
    Route("add_norm", (add_norm_route.OP,), lambda s: add_norm_route.detect_add_norm(),
          report=_report_into("add_norm", "add_norm_reason"),
          summary=lambda r: [f"residual add + post-attention norm -> {r.add_norm} ({r.add_norm_reason})"],
          install=_active(add_norm_route), patch=_patch_noting(add_norm_route.patch_module),
          explain_layer=_class_rows(add_norm_route), switches=(add_norm_route.route_mode,)),
    Route("swiglu", (swiglu_route.OP,), lambda s: swiglu_route.detect_swiglu(),
          report=_report_into("swiglu", "swiglu_reason"),
          summary=lambda r: [f"gated MLP silu(gate) * up -> {r.swiglu} ({r.swiglu_reason})"],
          install=_active(swiglu_route), patch=_patch_noting(swiglu_route.patch_module),
          explain_layer=_class_rows(swiglu_route), switches=(swiglu_route.route_mode,)),
    Route("embedding", (embedding_route.OP,), lambda s: embedding_route.detect_embedding(),
          report=_report_into("embedding", "embedding_reason"),
          summary=lambda r: [f"token embedding weight gradient -> {r.embedding} ({r.embedding_reason})"],
          install=_embedding_install, explain_model=embedding_route.explain_rows,
          switches=(embedding_route.route_mode,)),
    # after the routes that may patch the same modules: it replaces the causal-LM classes' forward
    Route("lm_head_loss", (lm_head_route.OP,), lambda s: lm_head_route.detect_lm_head(s.request.lm_loss),
          report=_report_into("lm_loss", "lm_loss_reason"),
          summary=lambda r: [f"LM head + loss -> {r.lm_loss} ({r.lm_loss_reason})"],
          install=_active(lm_head_route), patch=_patch_noting(lm_head_route.patch_module),
          explain_model=lm_head_route.explain_rows, switches=(lm_head_route.route_mode,)),
    Route("autotune_decisions", (), lambda s: AutotuneSeed(), enter=_seed_enter, leave=_seed_leave,
          switches=(autotune_decisions.check_setting,)),
)

#: the order enable()'s summary lists the routes in
SUMMARY_ORDER = ("causal_conv1d", "gated_delta_rule", "kda", "gated_norm", "zc_norm", "add_norm", "swiglu", "mamba_ssd",
                 "mamba1_scan", "glue", "embedding", "lm_head_loss", "hub_kernels", "autotune_decisions")


def route(name: str) -> Route:
    """The table's entry named `name`."""
    for r in ROUTES:
        if r.name == name:
            return r
    raise KeyError(name)


def route_of_op(op: str) -> str | None:
    """The name of the route that owns explain()'s op `op`, or None (Liger's ops, other hooks)."""
    return next((r.name for r in ROUTES if op in r.ops), None)


def check_switches() -> None:
    """Every FASTPATH_* switch enable() and the kernels read (the table's `switches`), validated
    now (UsageError, one line). enable() calls it before it changes anything; verify, bench,
    capture and warmup before any work (a kernel's switch is otherwise read at its first call,
    after the reference side has run); `fastpath run` before it starts the program, whose
    processes enable() only later, at their first import of transformers."""
    for r in ROUTES:
        for read in r.switches:
            read()


def build_hooks(s: Session) -> modeling_patch.Routes:
    """The conv and gated-delta-rule callables every module and built layer gets, from the decisions."""
    conv: ConvDecision = s.decisions["causal_conv1d"]
    fla: fla_route.FlaStatus = s.decisions["gated_delta_rule"]
    conv_fn = conv_route.make_causal_conv1d_fn(conv.fn)
    conv_update = conv_route.make_causal_conv1d_update(conv.update)
    make_gdn = make_kda = None
    if fla.route:
        def make_gdn(kind: str, torch_fn: Callable[..., Any]) -> Callable[..., Any]:
            return fla_route.make_gdn_route(kind, fla, torch_fn)
    if fla.kda_route:
        def make_kda(kind: str, torch_fn: Callable[..., Any]) -> Callable[..., Any]:
            return fla_route.make_kda_route(kind, fla, torch_fn)
    return modeling_patch.Routes(conv_fn=conv_fn, conv_update=conv_update,
                                 conv_module=hub_route.conv_route_module(conv_fn, conv_update),
                                 make_gdn=make_gdn, make_kda=make_kda,
                                 lift_device_gate=s.request.lift_device_gate)
