"""fastpath.enable() / disable() / explain() / assert_fast() for transformers 4.57 - 5.25.

enable() works before or after transformers (or a model) exists: it patches the modeling
modules already imported, the layers already built, and installs an import hook for modules
imported later (see modeling_patch for the per-version hooks, hub_kernels for the offline
handling, fla_route for the gated delta rule, norm_route for GatedDeltaNet's gated RMSNorm, zc_norm_route
for Qwen3.5 / Qwen3-Next's zero-centred RMSNorm). Everything goes through one undo log, so
disable() restores exactly what was there and enable/disable/enable works in one process.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastpath.errors import FastpathError, UsageError
from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing import (
    conv_route,
    fla_route,
    glue_route,
    mamba1_route,
    mamba_route,
    norm_route,
    zc_norm_route,
)
from fastpath.routing import hub_kernels as hub_route
from fastpath.routing.explain import Explanation, explain_model
from fastpath.routing.modeling_patch import (
    ModelingImportHook,
    Routes,
    discover_modeling_modules,
    patch_built_layers,
    patch_module,
    unroute_layers_built_while_enabled,
)
from fastpath.routing.patch_registry import PatchRegistry

__all__ = ["EnableReport", "Explanation", "assert_fast", "disable", "enable", "explain", "is_enabled"]

_GDN_MODES = ("auto", "fla", "off")
# The transformers releases enable() knows the hooks of (oldest, newest), as major.minor.
SUPPORTED_TRANSFORMERS = ("4.57", "5.25")
# enable()'s summary goes to stderr, logs and issues: it fits 80 columns.
SUMMARY_WIDTH = 80


@dataclass
class EnableReport:
    """What enable() changed, in words a user can act on."""

    conv_impl: str                      # "fastpath" or "override:<name>"
    gated_delta_rule: str               # "fla" | "fla-fwd+torch-bwd" | "torch"
    gated_delta_rule_reason: str
    transformers_version: str | None
    kda: str = "torch"                  # Kimi-Linear KDA (chunk_kda, fused_recurrent_kda): "fla" | "torch"
    kda_reason: str = ""
    mamba_ssd: str = "fastpath"         # Mamba-2 ops: "fastpath" | "mamba_ssm" | "off"
    mamba1_scan: str = "fastpath"       # Mamba-1 ops (routing/mamba1_route.py): same choices
    gated_norm: str = "torch"           # GatedDeltaNet gated RMSNorm: norm_route.IMPL | "torch"
    gated_norm_reason: str = ""
    glue: str = "torch"                 # GatedDeltaNet gates + attention output gate: glue_route.IMPL | "torch"
    glue_reason: str = ""
    zc_norm: str = "torch"              # Qwen3.5 / Qwen3-Next zero-centred RMSNorm: zc_norm_route.IMPL | "torch"
    zc_norm_reason: str = ""
    hub_kernels: str = "route"          # 5.25 + `kernels` Func globals: hub_route.MODES
    hub_globals: int = 0                # how many such globals enable() put back to transformers' function
    modules_patched: list[str] = field(default_factory=list)
    modules_pending: list[str] = field(default_factory=list)   # patched when imported
    layers_patched: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self, width: int = SUMMARY_WIDTH) -> str:
        """One decision per line, each wrapped between words to `width` columns (80: it is
        printed to stderr, pasted into issues and logs)."""
        tf = self.transformers_version or "not installed yet"
        lines = [
            (f"fastpath enabled (transformers {tf}: {len(self.modules_patched)} modeling modules "
             f"patched, {len(self.modules_pending)} on import, {self.layers_patched} built layers)", ""),
            (f"causal_conv1d -> {self.conv_impl}", "  "),
            (f"gated delta rule -> {self.gated_delta_rule} ({self.gated_delta_rule_reason})", "  "),
        ]
        if self.gated_delta_rule == fla_route.DQKWG_IMPL:  # read now: checks run at first backward
            from fastpath.routing import fla_selfcheck

            lines += [(f"dqkwg {r.config.label()}: {'PASS' if r.passed else 'FAIL'}", "    ")
                      for r in fla_selfcheck.RESULTS.values()]
        lines += [(f"Kimi-Linear KDA -> {self.kda} ({self.kda_reason})", "  "),
                  (f"gated RMSNorm -> {self.gated_norm} ({self.gated_norm_reason})", "  "),
                  (f"zero-centred RMSNorm -> {self.zc_norm} ({self.zc_norm_reason})", "  "),
                  (f"Mamba-2 SSD ops -> {self.mamba_ssd}", "  "),
                  (f"Mamba-1 scan ops -> {self.mamba1_scan}", "  ")]
        if self.hub_kernels == "keep":
            lines.append((f"Hub-kernel wrappers -> kept ({hub_route.MODE_ENV}=keep): on transformers "
                          "5.25 with `kernels`, the ops it wraps stay Hub kernels (kernelized models) "
                          "or transformers' own path; fastpath routes only the rest", "  "))
        elif self.hub_globals:
            lines.append((f"Hub-kernel wrappers -> routed to fastpath ({self.hub_globals} module globals; "
                          f"{hub_route.MODE_ENV}=keep keeps Hub kernels)", "  "))
        return "\n".join(wrapped for text, indent in lines
                         for wrapped in _wrap(text, width, indent))

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(line for n in self.notes
                                            for line in _wrap(f"- {n}", SUMMARY_WIDTH, "  "))])


def _wrap(text: str, width: int, indent: str) -> list[str]:
    """`text` at `indent`, continuation lines two columns deeper; words (and URLs) never split."""
    import textwrap

    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False) or [indent]


@dataclass
class _State:
    registry: PatchRegistry
    env: dict[str, str | None]
    routes: Routes
    hook: ModelingImportHook
    report: EnableReport
    fla: fla_route.FlaStatus
    hub_mode: str = "route"


_LOCK = threading.RLock()
_STATE: _State | None = None


def is_enabled() -> bool:
    return _STATE is not None


def enable(
    *,
    causal_conv1d_fn: Callable[..., Any] | None = None,
    causal_conv1d_update: Callable[..., Any] | None = None,
    gated_delta_rule: str = "auto",
    warn: bool = True,
    lift_device_gate: bool = False,
    mamba_ssm: str = "auto",
    glue: bool = True,
    hub_kernels: str | None = None,
) -> EnableReport:
    """Route transformers' causal_conv1d (and, when safe, the gated delta rule) to fastpath.

    causal_conv1d_fn / causal_conv1d_update: Dao-style callables to route instead of fastpath's
    (tests pass deliberately wrong ones to prove the route is live).
    gated_delta_rule: "auto" (FLA when importable and safe), "fla" (error if FLA unusable), "off".
    lift_device_gate: testing only, needs TRITON_INTERPRET=1: transformers <=5.14 lfm2 and Mamba-2
    mixers gate their kernel path on CUDA tensors; this lets CPU tensors take it so the interpreter
    runs the kernels.
    mamba_ssm: the Mamba-2 ops (mamba_chunk_scan_combined, selective_state_update,
    mamba_split_conv1d_scan_combined; see routing/mamba_route.py) and the Mamba-1 ops
    (selective_scan_fn, mamba_inner_fn, selective_state_update; routing/mamba1_route.py): "auto"
    routes them to fastpath unless a working mamba_ssm is installed, "fastpath" always, "off" never.
    glue: route the Qwen3.5 GatedDeltaNet gates and attention output gate to fastpath's fused
    ops where a probe shows the same function (routing/glue_route.py); FASTPATH_GLUE=off too.
    The zero-centred RMSNorm of Qwen3.5 / Qwen3-Next goes to fastpath's fused kernel likewise
    (routing/zc_norm_route.py; FASTPATH_ZC_NORM=auto|fastpath|torch).
    hub_kernels: transformers 5.25 with `kernels` installed wraps each op in a Hub-kernel module
    (routing/hub_kernels.py). "route" (default; FASTPATH_HUB_KERNELS) sees through the wrappers
    and routes every op to fastpath, offline; "keep" leaves them and USE_HUB_KERNELS alone, so a
    model kernelized by from_pretrained(use_kernels=True) keeps its Hub kernels.
    Calling enable() again replaces the previous routing (disable() first, then enable).
    """
    global _STATE
    version_note = check_transformers_version(_transformers_version())
    if gated_delta_rule not in _GDN_MODES:
        raise UsageError(f"gated_delta_rule must be one of {_GDN_MODES}, got {gated_delta_rule!r}")
    if mamba_ssm not in mamba_route.MODES:
        raise UsageError(f"mamba_ssm must be one of {mamba_route.MODES}, got {mamba_ssm!r}")
    if lift_device_gate and not triton_interpreter_on():
        raise UsageError("lift_device_gate=True is a testing option and needs TRITON_INTERPRET=1")
    hub_mode = hub_route.route_mode(hub_kernels)
    with _LOCK:
        if _STATE is not None:
            disable()
        from fastpath import causal_conv1d as face

        fla = fla_route.detect_fla(gated_delta_rule)
        mamba = mamba_route.detect_mamba(mamba_ssm)
        mamba1 = mamba1_route.detect_mamba1(mamba_ssm)
        norm = norm_route.detect_norm()
        glue_status = glue_route.detect_glue(glue)
        zc_norm = zc_norm_route.detect_zc_norm()
        if gated_delta_rule == "fla" and not fla.route:
            raise FastpathError(f"gated_delta_rule='fla' but FLA cannot be used: {fla.reason}")
        if norm_route.route_mode() == "fla" and not norm.route:
            raise FastpathError(f"{norm_route.ENV_MODE}=fla but FLA's gated RMSNorm cannot be used: {norm.reason}")
        if fla.route:
            fla_route.use_dqkwg_route(fla)  # FLA #640 only; undone by disable()

        fn_impl = causal_conv1d_fn or face.causal_conv1d_fn
        upd_impl = causal_conv1d_update or face.causal_conv1d_update
        conv_fn = conv_route.make_causal_conv1d_fn(fn_impl)
        conv_update = conv_route.make_causal_conv1d_update(upd_impl)
        make_gdn = make_kda = None
        if fla.route:
            def make_gdn(kind: str, torch_fn: Callable[..., Any], _fla: Any = fla) -> Callable[..., Any]:
                return fla_route.make_gdn_route(kind, _fla, torch_fn)
        if fla.kda_route:
            def make_kda(kind: str, torch_fn: Callable[..., Any], _fla: Any = fla) -> Callable[..., Any]:
                return fla_route.make_kda_route(kind, _fla, torch_fn)
        routes = Routes(
            conv_fn=conv_fn,
            conv_update=conv_update,
            conv_module=hub_route.conv_route_module(conv_fn, conv_update),
            make_gdn=make_gdn,
            make_kda=make_kda,
            lift_device_gate=lift_device_gate,
            gated_norm=norm,
        )
        reg = PatchRegistry()
        env: dict[str, str | None] = {}
        overridden = causal_conv1d_fn is not None or causal_conv1d_update is not None
        report = EnableReport(
            conv_impl="override:" + getattr(fn_impl, "__name__", "fn") if overridden else "fastpath",
            gated_delta_rule=fla.chunk_impl if fla.route else "torch",
            gated_delta_rule_reason=fla.reason,
            kda="fla" if fla.kda_route else "torch",
            kda_reason=fla.kda_reason if fla.route else fla.reason,
            transformers_version=_transformers_version(),
            mamba_ssd=mamba.impl,
            mamba1_scan=mamba1.impl,
            gated_norm=norm.impl,
            gated_norm_reason=norm.reason,
            glue=glue_status.impl,
            glue_reason=glue_status.reason,
            zc_norm=zc_norm.impl,
            zc_norm_reason=zc_norm.reason,
            hub_kernels=hub_mode,
        )
        routes.notes = report.notes  # norm classes left alone, also those of modules imported later
        if mamba_ssm != "auto" or not mamba.route:
            report.notes.append(f"Mamba-2 SSD ops: {mamba.reason}")
        if mamba_ssm != "auto" or not mamba1.route:
            report.notes.append(f"Mamba-1 selective scan ops: {mamba1.reason}")
        targets = set(discover_modeling_modules()) | {hub_route.HUB_MODULE}

        def on_loaded(module: Any) -> None:
            if module.__name__ == hub_route.HUB_MODULE:
                hub_route.seed_lazy_kernel_mapping(module, routes.conv_module, reg)
                if mamba.route:
                    mamba_route.seed_lazy_kernel_mapping(module, reg)
                if mamba1.route:
                    mamba1_route.seed_lazy_kernel_mapping(module, reg, mamba.route)
            else:
                if hub_mode == "route":  # 5.25 + `kernels`: see through the Hub-kernel wrappers first
                    report.hub_globals += len(hub_route.unwrap_module_globals(module, reg))
                # before patch_module: it recomputes a <=5.14 `is_fast_path_available` from these
                if mamba.route and mamba_route.patch_module(module, conv_fn, conv_update, reg) \
                        and lift_device_gate:
                    mamba_route.lift_device_gates(module, reg)
                if mamba1.route and mamba1_route.patch_module(module, conv_fn, conv_update,
                                                              routes.conv_module, reg) \
                        and lift_device_gate:
                    mamba1_route.lift_device_gates(module, reg)
                patch_module(module, routes, reg)
                report.notes.extend(glue_route.patch_module(module, glue_status, reg))
                report.notes.extend(zc_norm_route.patch_module(module, zc_norm, reg))
                if module.__name__ in report.modules_pending:
                    report.modules_pending.remove(module.__name__)
                report.modules_patched.append(module.__name__)

        hook = ModelingImportHook(targets, on_loaded)
        try:
            if hub_mode == "route":
                report.notes.append(hub_route.disable_hub_downloads(env))
            else:
                report.notes.append(f"{hub_route.MODE_ENV}=keep: Hub-kernel wrappers and "
                                    f"{hub_route.ENV} left as they are; a model loaded with "
                                    "use_kernels=True downloads Hub kernels at its first call "
                                    "(offline: torch fallback)")
            reg.set_attr(norm_route, "ACTIVE", norm)  # what explain() says of an unrouted norm
            reg.set_attr(glue_route, "ACTIVE", glue_status)
            reg.set_attr(zc_norm_route, "ACTIVE", zc_norm)
            if norm.route and triton_interpreter_on():
                norm_route.interpreter_single_config(reg)
            _provide_causal_conv1d_module(face, reg, report)
            loaded = []
            for name in sorted(targets):
                module = sys.modules.get(name)
                if module is None:
                    if name != hub_route.HUB_MODULE:
                        report.modules_pending.append(name)
                    continue
                on_loaded(module)
                loaded.append(name)
            report.layers_patched = patch_built_layers(set(loaded), routes, reg)
            sys.meta_path.insert(0, hook)
        except BaseException:  # leave nothing half-patched behind
            hook.active = False
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            reg.undo()
            hub_route.restore_env(env)
            if fla.chunk_impl == fla_route.DQKWG_IMPL:
                fla_route.undo_dqkwg_route()
            raise
        if hub_route.kernels_installed() and hub_mode == "route":
            report.notes.append("`kernels` is installed: fastpath's routes replace transformers' "
                                "Hub-kernel wrappers; kernelize() maps none of them")
        if version_note:
            report.notes.append(version_note)
        if lift_device_gate:
            report.notes.append("lift_device_gate: CUDA-gated lfm2 kernel paths run on CPU (Triton interpreter)")
        if fla.chunk_impl == fla_route.DQKWG_IMPL:
            report.notes.append(f"FLA #640 here: {fla.reason}. Real fix: {fla_route.REMEDY_640}")
        elif fla.chunk_impl == "fla-fwd+torch-bwd":
            warnings.warn(f"fastpath: {fla.reason}", RuntimeWarning, stacklevel=2)
        _STATE = _State(reg, env, routes, hook, report, fla, hub_mode)
        if warn:
            print(report.summary(), file=sys.stderr)
        return report


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Inside: the process runs as if disable() had been called; after: enable()'s routing exactly
    as it was, without enable()'s discovery. Modeling modules first imported inside stay unpatched
    (the import hook sleeps too). A no-op when fastpath is not enabled."""
    with _LOCK:
        state = _STATE
        if state is None:
            resume = None
        else:
            state.hook.active = False
            resume = state.registry.suspend()
            dqkwg = state.fla.chunk_impl == fla_route.DQKWG_IMPL
            if dqkwg:
                fla_route.undo_dqkwg_route()
            hub_route.restore_env(state.env)
    try:
        yield
    finally:
        # resume only the state that was suspended: a disable() or enable() inside wins
        if resume is not None and state is not None and _STATE is state:
            with _LOCK:
                if state.hub_mode == "route":
                    hub_route.disable_hub_downloads(state.env)
                if dqkwg:
                    fla_route.use_dqkwg_route(state.fla)
                resume()
                state.hook.active = True


def disable() -> None:
    """Undo enable(): every patched global, built layer, mapping and env var gets its old value,
    except one another library replaced after enable() (theirs now: kept, with a warning)."""
    global _STATE
    with _LOCK:
        state = _STATE
        if state is None:
            return
        state.hook.active = False
        try:
            sys.meta_path.remove(state.hook)
        except ValueError:
            pass
        state.registry.undo()
        if _layers_copy_globals(state.report.transformers_version):
            unroute_layers_built_while_enabled(set(state.report.modules_patched))
        if state.fla.chunk_impl == fla_route.DQKWG_IMPL:
            fla_route.undo_dqkwg_route()
        hub_route.restore_env(state.env)
        _STATE = None
        if state.registry.kept:  # e.g. Liger Kernel patched over a route after enable()
            warnings.warn(f"fastpath.disable(): {', '.join(state.registry.kept)} changed after enable() "
                          "(another library's patch); left as it is", RuntimeWarning, stacklevel=2)


def explain(model: Any) -> Explanation:
    """For each layer of `model`, which implementation each op resolves to right now."""
    return explain_model(model)


def assert_fast(model: Any) -> None:
    """Raise FastpathError (with the explain() table) if any op would take a torch fallback."""
    table = explain_model(model)
    from fastpath.routing.liger_route import is_liger_row

    if all(is_liger_row(r) for r in table.rows):
        raise FastpathError(f"no causal_conv1d / gated-delta-rule layers found in {type(model).__name__}")
    if table.slow_count:
        raise FastpathError(f"{table.slow_count} op(s) take a slow path:\n{table}")


def _provide_causal_conv1d_module(face: Any, reg: PatchRegistry, report: EnableReport) -> None:
    """Make `import causal_conv1d` give fastpath's face when the real package is absent and
    mamba_ssm (which imports it) is installed. transformers itself is routed via module globals, so
    the face is not injected otherwise: that keeps disable() exact for modules imported meanwhile."""
    if "causal_conv1d" in sys.modules or importlib.util.find_spec("causal_conv1d") is not None:
        report.notes.append("a real causal_conv1d package is installed; transformers is still routed to fastpath")
        return
    if importlib.util.find_spec("mamba_ssm") is None:
        return
    reg.set_item(sys.modules, "causal_conv1d", face)
    for sub in ("causal_conv1d_interface", "cpp_functions", "causal_conv1d_varlen"):
        mod = importlib.import_module(f"fastpath.causal_conv1d.{sub}")
        reg.set_item(sys.modules, f"causal_conv1d.{sub}", mod)
    report.notes.append("sys.modules['causal_conv1d'] -> fastpath.causal_conv1d (for mamba_ssm)")


def check_transformers_version(found: str | None) -> str | None:
    """None when `found` is a supported transformers; a warning text when it is newer than the
    newest release fastpath knows (it may work: the hooks change rarely); an error otherwise."""
    from packaging.version import InvalidVersion, Version

    from fastpath.extras import MissingDependency, raise_one_line

    oldest, newest = SUPPORTED_TRANSFORMERS
    supported = f"fastpath.enable() supports transformers {oldest} to {newest}"
    pin = f'pip install "transformers>={oldest},<{_next_minor(newest)}"'
    if found is None:
        raise_one_line(MissingDependency(f"{supported}, and transformers is not installed; run: {pin}",
                                         "transformers"))
    try:
        release = Version(found).release[:2]
    except InvalidVersion:
        return f"{supported}; cannot read the installed version {found!r}"
    if release < Version(oldest).release[:2]:
        raise UsageError(f"{supported}; transformers {found} is too old: {pin}")
    if release > Version(newest).release[:2]:
        text = (f"{supported}; transformers {found} is newer than fastpath knows: routing may miss "
                f"changed hooks (check fastpath.explain(model)), or {pin}")
        warnings.warn(f"fastpath: {text}", RuntimeWarning, stacklevel=3)
        return text
    return None


def _layers_copy_globals(version: str | None) -> bool:
    """transformers <= 5.14: GatedDeltaNet layers copy the kernel globals at __init__."""
    from packaging.version import InvalidVersion, Version

    try:
        return version is not None and Version(version).release[:2] <= (5, 14)
    except InvalidVersion:
        return True


def _next_minor(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) + 1}"


def _transformers_version() -> str | None:
    from fastpath.extras import missing_modules

    if missing_modules(("transformers",)):  # not installed, or made unimportable (None in sys.modules)
        return None
    module = sys.modules.get("transformers")
    if module is not None:
        return getattr(module, "__version__", None)
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return None

