"""Route FLA's gated ``chunk_bwd_dqkwg`` to fastpath's PyTorch implementation.

fla-core 0.6.0 raises in ``fla.ops.common.chunk_o.chunk_bwd_dqkwg`` for gated calls on Hopper with
Triton >= 3.4, < 3.7.1 (its Triton kernel gives wrong results there, FLA issue #640) unless its
TileLang backend is usable. That one op is the only blocker of FLA's gated-delta-rule backward,
so we take exactly that op: per configuration, FLA's own kernel with the refusal switched off where
:mod:`fastpath.routing.fla_selfcheck` validated it on this device (or ``FASTPATH_FLA_DQKWG``
forces a route), else :mod:`fastpath.kernels.gated_delta_rule.interface` (PyTorch, dqkwg.py).

How: FLA wraps the op with ``@dispatch('common')`` (fla/backends.py): each call walks the
backends registered for operation ``'common'`` (sorted by priority), asks
``is_available() and is_enabled()``, then ``<op>_verifier(...)``, then calls ``<op>`` on the
first backend that accepts, else FLA's own function (which holds the guard). We register one
backend class with a ``chunk_bwd_dqkwg`` method only, so no other dispatched op is affected, and
its verifier accepts only gated calls (the ones the guard refuses) that our code supports.
``uninstall`` flips it off (FLA has no unregister; a disabled backend is skipped).

With ``FLA_DISABLE_BACKEND_DISPATCH=1`` FLA bypasses its registry entirely; then we replace the
module-level name in the modules that imported the op (``_IMPORTERS``) and restore it on
uninstall.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

from fastpath.shared.known_issues import fla_640

__all__ = [
    "ROUTE_CALLS",
    "dqkwg_route_installed",
    "dqkwg_route_needed",
    "install_dqkwg_route",
    "uninstall_dqkwg_route",
]

#: Calls taken by the route: "dqkwg:fla" (FLA's kernel, self-checked or forced by
#: FASTPATH_FLA_DQKWG=fla) and "dqkwg:torch" (fastpath's PyTorch implementation).
ROUTE_CALLS: Counter[str] = Counter()

_BACKEND_TYPE = "fastpath"
# After FLA's TileLang backend (priority 5): where tilelang works, FLA's own kernel wins.
_PRIORITY = 6
_OP_MODULE = "fla.ops.common.chunk_o"
# Modules of fla-core 0.6.0 that do `from fla.ops.common.chunk_o import chunk_bwd_dqkwg`.
_IMPORTERS = (
    "fla.ops.common.chunk_o",
    "fla.ops.gated_delta_rule.chunk",
    "fla.ops.precond_gated_delta_rule.chunk",
    "fla.ops.comba.chunk",
    "fla.ops.delta_rule.chunk",
    "fla.ops.simple_gla.chunk",
)

_state: dict[str, Any] = {"active": False, "registered": False, "patched": {}}


def dqkwg_route_needed(device_capability: tuple[int, int], triton_version: str,
                       tilelang_available: bool) -> bool:
    """True where FLA would refuse the gated chunk backward: `known_issues.fla_640`, nothing else."""
    return fla_640(device_capability, triton_version, tilelang_available)


def _route_impl() -> Callable[..., Any]:
    """The implementation our backend hands FLA: per call, FLA's own kernel with the refusal
    switched off where `fla_selfcheck` allows it for the call's configuration (env var, or a
    passed self-check), else fastpath's PyTorch chunk_bwd_dqkwg."""
    from fastpath.kernels.gated_delta_rule.interface import chunk_bwd_dqkwg
    from fastpath.routing import fla_selfcheck

    def routed(*args: Any, **kwargs: Any) -> Any:
        call = _bind(args, kwargs)
        fla_fn = _fla_unguarded()
        if fla_selfcheck.fla_allowed(call, fla_fn, chunk_bwd_dqkwg):
            ROUTE_CALLS["dqkwg:fla"] += 1
            return fla_fn(**call)  # type: ignore[misc]
        ROUTE_CALLS["dqkwg:torch"] += 1
        return chunk_bwd_dqkwg(**call)

    return routed


def _fla_unguarded() -> Callable[..., Any] | None:
    """FLA's chunk_bwd_dqkwg without its #640 refusal (built once from the original function,
    which `_patch_importers` may have replaced in FLA's module)."""
    if "unguarded" not in _state:
        from fastpath.routing.fla_selfcheck import unguarded_fla_dqkwg

        _state["unguarded"] = unguarded_fla_dqkwg(_state["patched"].get(_OP_MODULE))
    return _state["unguarded"]


@functools.cache
def _signature() -> inspect.Signature:
    from fastpath.kernels.gated_delta_rule.interface import chunk_bwd_dqkwg

    return inspect.signature(chunk_bwd_dqkwg)


def _bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Named view of a chunk_bwd_dqkwg call (FLA's callers pass keywords, but be general)."""
    bound = _signature().bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _accepts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, str | None]:
    """Take gated calls our implementation supports; leave the rest to FLA's Triton kernel."""
    from fastpath.kernels.gated_delta_rule.interface import unsupported_reason

    call = _bind(args, kwargs)
    if call["g"] is None:
        return False, "ungated call: FLA's Triton kernel is not affected by #640"
    reason = unsupported_reason(call["q"], call["k"], call["v"], call["h"], w=call["w"],
                                g=call["g"], g_gamma=call["g_gamma"], dv=call["dv"],
                                cu_seqlens=call["cu_seqlens"],
                                chunk_indices=call["chunk_indices"],
                                chunk_size=call["chunk_size"])
    return (reason is None), reason


def _backend_class() -> type:
    """FLA backend class, built lazily so importing this module does not import fla."""
    from fla.backends import BaseBackend

    impl = _route_impl()

    class FastpathDqkwgBackend(BaseBackend):
        """fastpath's PyTorch chunk_bwd_dqkwg for FLA #640 (Hopper + Triton 3.4-3.7.0)."""

        backend_type = _BACKEND_TYPE
        priority = _PRIORITY

        @classmethod
        def is_available(cls) -> bool:
            return bool(_state["active"])

        def is_enabled(self) -> bool:
            return bool(_state["active"])

        def chunk_bwd_dqkwg_verifier(self, *args: Any, **kwargs: Any) -> tuple[bool, str | None]:
            return _accepts(args, kwargs)

        def chunk_bwd_dqkwg(self, *args: Any, **kwargs: Any) -> Any:
            return impl(*args, **kwargs)

    return FastpathDqkwgBackend


def _dispatch_disabled() -> bool:
    import fla.backends

    return bool(getattr(fla.backends, "_DISPATCH_DISABLED", False))


def _patch_importers() -> None:
    """Fallback when FLA's dispatch is off: rebind the name in each importing module."""
    impl = _route_impl()
    for name in _IMPORTERS:
        try:
            mod = importlib.import_module(name)
        except Exception:  # an fla version without this module (or one that fails to import)
            continue
        original = getattr(mod, "chunk_bwd_dqkwg", None)
        if original is None or name in _state["patched"]:
            continue

        def routed(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            ok, _ = _accepts(args, kwargs)
            return impl(*args, **kwargs) if ok else _original(*args, **kwargs)

        _state["patched"][name] = original
        mod.chunk_bwd_dqkwg = routed


def install_dqkwg_route() -> bool:
    """Send FLA's gated chunk_bwd_dqkwg to fastpath's implementation; False if fla is absent.

    Idempotent. Only gated calls are taken, so FLA's guard (the sole place it refuses) is
    bypassed for this op alone; every other FLA op still runs FLA's own kernels.
    """
    try:
        importlib.import_module(_OP_MODULE)
        from fla.backends import register
    except Exception:  # fla missing or broken: nothing to route; the caller decides
        return False
    _state["active"] = True
    if _dispatch_disabled():
        _patch_importers()
        return True
    if not _state["registered"]:
        register("common")(_backend_class())
        _state["registered"] = True
    return True


def uninstall_dqkwg_route() -> None:
    """Undo install_dqkwg_route (FLA's own chunk_bwd_dqkwg, guard included, is used again)."""
    _state["active"] = False
    patched: dict[str, Callable[..., Any]] = _state["patched"]
    for name, original in list(patched.items()):
        mod = importlib.import_module(name)
        mod.chunk_bwd_dqkwg = original
        del patched[name]


def dqkwg_route_installed() -> bool:
    """Whether the route is currently taking gated chunk_bwd_dqkwg calls."""
    return bool(_state["active"])
