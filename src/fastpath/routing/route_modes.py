"""What the routes share: a mode read from an environment variable (a bad value is a usage error,
never a silent default), the route / reason decision explain() and EnableReport print, and the
walk over the classes a route replaces the forward of."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from fastpath.routing.patch_registry import PatchRegistry


def env_mode(env: str, modes: tuple[str, ...], default: str = "auto") -> str:
    """The value of `env`, lower-cased, `default` when unset or empty; UsageError when not in `modes`."""
    mode = os.environ.get(env, default).strip().lower() or default
    if mode not in modes:
        from fastpath.shared.errors import UsageError

        raise UsageError(f"{env}={mode!r}: expected one of {', '.join(modes)}")
    return mode


@dataclass
class RouteStatus:
    """enable()'s decision for one route: whether it routes, and why (one line, with the fix when
    it does not). Subclasses name their fast implementation in FAST_IMPL."""

    route: bool
    reason: str

    FAST_IMPL: ClassVar[str] = "fastpath"

    @property
    def impl(self) -> str:
        return self.FAST_IMPL if self.route else "torch"


def classes_to_route(classes: Iterable[type], status: RouteStatus, reg: PatchRegistry, route_attr: str,
                     skip_attr: str) -> list[tuple[type, Any]]:
    """(class, its own forward) for each candidate class whose forward is not routed yet. With the
    route off, none: each candidate is marked with the reason instead (explain() reads it)."""
    found = []
    for cls in classes:
        original = cls.__dict__["forward"]
        if hasattr(original, route_attr):
            continue
        if not status.route:
            reg.set_attr(cls, skip_attr, status.reason)
            continue
        found.append((cls, original))
    return found
