"""fastpath.enable() / disable() / explain() / assert_fast() for transformers 4.57 - 5.25.

enable() works before or after transformers (or a model) exists: it patches the modeling
modules already imported, the layers already built, and installs an import hook for modules
imported later. What it routes is the table routing/routes.py declares (ROUTES: the Hub-kernel
wrappers, the Mamba-2 and Mamba-1 ops, the gated delta rule and KDA, GatedDeltaNet's gated
RMSNorm, causal_conv1d, the Qwen3.5 glue, the zero-centred RMSNorm, the causal-LM loss, the
autotune decisions); enable(), disable(), suspended() and EnableReport loop over it,
modeling_patch holds the per-version hooks.
Everything goes through one undo log, so disable() restores exactly what was there and
enable/disable/enable works in one process.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.routing import hub_kernels as hub_route
from fastpath.routing import mamba_common
from fastpath.routing.explain import Explanation, explain_model
from fastpath.routing.modeling_patch import ModelingImportHook, discover_modeling_modules
from fastpath.routing.patch_registry import PatchRegistry
from fastpath.routing.routes import (
    ROUTES,
    SUMMARY_ORDER,
    EnableRequest,
    Session,
    build_hooks,
    check_switches,
    route,
    route_of_op,
)
from fastpath.shared.errors import FastpathError, UsageError

__all__ = ["EnableReport", "Explanation", "assert_fast", "disable", "enable", "explain", "is_enabled"]

_GDN_MODES = ("auto", "fla", "off")
# The transformers releases enable() knows the hooks of (oldest, newest), as major.minor.
SUPPORTED_TRANSFORMERS = ("4.57", "5.25")
# enable()'s summary goes to stderr, logs and issues: it fits 80 columns.
SUMMARY_WIDTH = 80


@dataclass
class EnableReport:
    """What enable() changed, in words a user can act on (each route of routing/routes.py fills
    its own fields)."""

    conv_impl: str = "fastpath"         # "fastpath" or "override:<name>"
    gated_delta_rule: str = "torch"     # "fla" | "fla-fwd+torch-bwd" | "torch"
    gated_delta_rule_reason: str = ""
    transformers_version: str | None = None
    kda: str = "torch"                  # Kimi-Linear KDA (chunk_kda, fused_recurrent_kda): "fla" | "torch"
    kda_reason: str = ""
    mamba_ssd: str = "fastpath"         # Mamba-2 ops: "fastpath" | "mamba_ssm" | "off"
    mamba1_scan: str = "fastpath"       # Mamba-1 ops (routing/selective_scan_route.py): same choices
    gated_norm: str = "torch"           # GatedDeltaNet gated RMSNorm: norm_route.IMPL | "torch"
    gated_norm_reason: str = ""
    glue: str = "torch"                 # GatedDeltaNet gates + attention RoPE, output gate: gates_route.IMPL | "torch"
    glue_reason: str = ""
    zc_norm: str = "torch"              # Qwen3.5 / Qwen3-Next zero-centred RMSNorm: zc_norm_route.IMPL | "torch"
    zc_norm_reason: str = ""
    add_norm: str = "torch"             # the decoder's residual add + that norm: add_norm_route.IMPL | "torch"
    add_norm_reason: str = ""
    swiglu: str = "torch"               # the gated MLP's silu(gate) * up: swiglu_route.IMPL | "torch"
    swiglu_reason: str = ""
    embedding: str = "torch"            # the token embedding's weight gradient: embedding_route.IMPL | "torch"
    embedding_reason: str = ""
    lm_loss: str = "torch"              # the causal-LM loss: lm_head_route.IMPL | "torch"
    lm_loss_reason: str = ""
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
        lines = [(f"fastpath enabled (transformers {tf}: {len(self.modules_patched)} modeling modules "
                  f"patched, {len(self.modules_pending)} on import, {self.layers_patched} built layers)", "")]
        for name in SUMMARY_ORDER:
            for text in route(name).summary(self):
                deeper = text.startswith("  ")
                lines.append((text.strip(), "    " if deeper else "  "))
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
    session: Session
    hook: ModelingImportHook


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
    lm_loss: bool = True,
) -> EnableReport:
    """Route transformers' causal_conv1d (and, when safe, the gated delta rule) to fastpath.

    causal_conv1d_fn / causal_conv1d_update: Dao-style callables to route instead of fastpath's
    (tests pass deliberately wrong ones to prove the route is live).
    gated_delta_rule: "auto" (FLA when importable and safe), "fla" (error if FLA unusable), "off".
    lift_device_gate: testing only, needs TRITON_INTERPRET=1: transformers <=5.14 lfm2 and Mamba-2
    mixers gate their kernel path on CUDA tensors; this lets CPU tensors take it so the interpreter
    runs the kernels.
    mamba_ssm: the Mamba-2 ops (mamba_chunk_scan_combined, selective_state_update,
    mamba_split_conv1d_scan_combined; see routing/ssd_route.py) and the Mamba-1 ops
    (selective_scan_fn, mamba_inner_fn, selective_state_update; routing/selective_scan_route.py): "auto"
    routes them to fastpath unless a working mamba_ssm is installed, "fastpath" always, "off" never.
    glue: route the Qwen3.5 GatedDeltaNet gates and the gated attention's RoPE and output gate to
    fastpath's fused ops where a probe shows the same function (routing/gates_route.py);
    FASTPATH_GLUE=off too.
    The zero-centred RMSNorm of Qwen3.5 / Qwen3-Next goes to fastpath's fused kernel likewise
    (routing/zc_norm_route.py; FASTPATH_ZC_NORM=auto|fastpath|torch), and the gated MLP's
    silu(gate) * up (Qwen3.5, Qwen3-Next, OLMo-hybrid, Bamba, Jamba) to fastpath's fused SwiGLU
    product (routing/swiglu_route.py; FASTPATH_SWIGLU=auto|fastpath|torch). The token
    embedding's weight gradient may go to fastpath's one-pass kernel (routing/embedding_route.py;
    FASTPATH_EMBEDDING=auto|fastpath|torch, off by default until measured on a GPU).
    hub_kernels: transformers 5.25 with `kernels` installed wraps each op in a Hub-kernel module
    (routing/hub_kernels.py). "route" (default; FASTPATH_HUB_KERNELS) sees through the wrappers
    and routes every op to fastpath, offline; "keep" leaves them and USE_HUB_KERNELS alone, so a
    model kernelized by from_pretrained(use_kernels=True) keeps its Hub kernels.
    lm_loss: route the causal-LM loss of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next to fastpath's fused
    LM head + cross-entropy (routing/lm_head_route.py): a training forward with labels returns the
    loss and logits=None, as Liger Kernel's skip_logits does; FASTPATH_LM_LOSS=off too.
    Autotune decisions recorded by `fastpath warmup --save-decisions` (FASTPATH_AUTOTUNE_DECISIONS,
    or the file shipped for this GPU) are handed to the autotuners (routing/autotune_decisions.py).
    Calling enable() again replaces the previous routing (disable() first, then enable).
    """
    global _STATE
    version_note = check_transformers_version(_transformers_version())
    if gated_delta_rule not in _GDN_MODES:
        raise UsageError(f"gated_delta_rule must be one of {_GDN_MODES}, got {gated_delta_rule!r}")
    if mamba_ssm not in mamba_common.MODES:
        raise UsageError(f"mamba_ssm must be one of {mamba_common.MODES}, got {mamba_ssm!r}")
    if lift_device_gate and not triton_interpreter_on():
        raise UsageError("lift_device_gate=True is a testing option and needs TRITON_INTERPRET=1")
    check_switches()  # every FASTPATH_* value, before anything is changed
    request = EnableRequest(causal_conv1d_fn, causal_conv1d_update, gated_delta_rule, mamba_ssm, glue,
                            lift_device_gate, hub_route.route_mode(hub_kernels), lm_loss)
    with _LOCK:
        if _STATE is not None:
            disable()
        s = Session(request, PatchRegistry(), EnableReport(transformers_version=_transformers_version()))
        targets = set(discover_modeling_modules()) | {hub_route.HUB_MODULE}
        hook = ModelingImportHook(targets, lambda module: _patch_module(s, module))
        try:
            _apply_routes(s, targets)
            sys.meta_path.insert(0, hook)
        except BaseException:  # leave nothing half-patched behind
            hook.active = False
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            s.registry.undo()
            _leave_all(s)
            raise
        if version_note:
            s.report.notes.append(version_note)
        _STATE = _State(s, hook)
        if warn:
            print(s.report.summary(), file=sys.stderr)
        return s.report


def _patch_module(s: Session, module: Any) -> None:
    """A modeling module (already imported, or at its import): every route's patch. transformers'
    hub-kernel module: every route's seed."""
    if module.__name__ == hub_route.HUB_MODULE:
        for r in ROUTES:
            if r.seed is not None:
                r.seed(module, s.decisions[r.name], s)
        return
    for r in ROUTES:
        if r.patch is not None:
            r.patch(module, s.decisions[r.name], s)
    if module.__name__ in s.report.modules_pending:
        s.report.modules_pending.remove(module.__name__)
    s.report.modules_patched.append(module.__name__)


def _apply_routes(s: Session, targets: set[str]) -> None:
    """Every route in table order, phase by phase: decisions first (a forced mode that cannot be
    met raises before any patch), then enter, report, install, the modules already imported
    (`targets` not yet imported are pending: the import hook patches them), the layers built."""
    for r in ROUTES:
        s.decisions[r.name] = r.detect(s)
    s.hooks = build_hooks(s)
    for r in ROUTES:
        note = r.enter(s.decisions[r.name], s) if r.enter is not None else None
        if note:
            s.report.notes.append(note)
    for r in ROUTES:
        r.report(s.decisions[r.name], s)
    for r in ROUTES:
        if r.install is not None:
            r.install(s.decisions[r.name], s)
    loaded = []
    for name in sorted(targets):
        module = sys.modules.get(name)
        if module is None:
            if name != hub_route.HUB_MODULE:
                s.report.modules_pending.append(name)
            continue
        _patch_module(s, module)
        loaded.append(name)
    for r in ROUTES:
        if r.patch_built is not None:
            r.patch_built(set(loaded), s.decisions[r.name], s)


def _leave_all(s: Session) -> None:
    """Each route's process state outside the registry, left in reverse table order."""
    for r in reversed(ROUTES):
        if r.leave is not None and r.name in s.decisions:
            r.leave(s.decisions[r.name], s)


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
            resume = state.session.registry.suspend()
            _leave_all(state.session)
    try:
        yield
    finally:
        # resume only the state that was suspended: a disable() or enable() inside wins
        if resume is not None and state is not None and _STATE is state:
            with _LOCK:
                s = state.session
                for r in ROUTES:
                    if r.enter is not None:
                        r.enter(s.decisions[r.name], s)
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
        s = state.session
        state.hook.active = False
        try:
            sys.meta_path.remove(state.hook)
        except ValueError:
            pass
        s.registry.undo()
        for r in ROUTES:
            if r.after_undo is not None:
                r.after_undo(s.decisions[r.name], s)
        _leave_all(s)
        _STATE = None
        if s.registry.kept:  # e.g. Liger Kernel patched over a route after enable()
            warnings.warn(f"fastpath.disable(): {', '.join(s.registry.kept)} changed after enable() "
                          "(another library's patch); left as it is", RuntimeWarning, stacklevel=2)


def explain(model: Any) -> Explanation:
    """For each layer of `model`, which implementation each op resolves to right now."""
    return explain_model(model)


def explain_rows(model: Any) -> list[dict[str, Any]]:
    """explain()'s rows as plain dicts for a report; a failure to explain is one row saying so
    (a report is never a reason for the run it describes to fail)."""
    try:
        rows = explain_model(model).rows
    except Exception as exc:
        return [{"error": f"explain failed: {exc.__class__.__name__}: {exc}"}]
    return [dict(r) if isinstance(r, dict) else dict(vars(r)) for r in rows]


def assert_fast(model: Any) -> None:
    """Raise FastpathError (with the explain() table) if any op would take a torch fallback."""
    table = explain_model(model)
    from fastpath.routing.embedding_route import OP as EMBEDDING_OP
    from fastpath.routing.liger_route import is_liger_row

    # Liger's rows and the embedding's say nothing of the layers fastpath exists for
    if all(is_liger_row(r) or r["op"] == EMBEDDING_OP for r in table.rows):
        raise FastpathError(f"no causal_conv1d / gated-delta-rule layers found in {type(model).__name__}")
    if table.slow_count:
        slow = sorted({route_of_op(str(r["op"])) or str(r["op"]) for r in table.rows if not r["fast"]})
        raise FastpathError(f"{table.slow_count} op(s) take a slow path (routes: {', '.join(slow)}):\n{table}")


def check_transformers_version(found: str | None) -> str | None:
    """None when `found` is a supported transformers; a warning text when it is newer than the
    newest release fastpath knows (it may work: the hooks change rarely); an error otherwise."""
    from packaging.version import InvalidVersion, Version

    from fastpath.shared.extras import MissingDependency, raise_one_line

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


def _next_minor(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) + 1}"


def _transformers_version() -> str | None:
    from fastpath.shared.extras import missing_modules

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

