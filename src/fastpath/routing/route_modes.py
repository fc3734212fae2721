"""What the routes share for their switches: a mode read from an environment variable (a bad value
is a usage error, never a silent default) and the route / reason decision explain() and
EnableReport print."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar


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
