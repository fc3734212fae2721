"""Every change enable() makes, recorded so disable() can put back exactly what was there.

A function, class or module another library put over one of fastpath's changes after enable() (a
later Liger Kernel `apply_liger_kernel_to_*`, a user's own monkey patch) is theirs: undo() leaves
it in place and names it in `kept`, rather than restoring the value from before enable() over it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

_MISSING = object()


@dataclass
class PatchRegistry:
    """An undo log of attribute / mapping assignments, replayed in reverse by `undo()`."""

    _log: list[tuple[Any, str, Any, bool]] = field(default_factory=list)  # (target, key, old, is_mapping)
    _seen: set[tuple[int, str]] = field(default_factory=set)
    _set: dict[tuple[int, str], Any] = field(default_factory=dict)  # the value fastpath put last
    kept: list[str] = field(default_factory=list)  # what the last undo() left to its later owner

    def set_attr(self, target: Any, name: str, value: Any) -> None:
        """setattr(target, name, value), remembering the first original (or its absence)."""
        key = (id(target), name)
        if key not in self._seen:
            self._seen.add(key)
            self._log.append((_ref(target), name, _current(target, name, False), False))
        self._set[key] = value
        setattr(target, name, value)

    def set_item(self, mapping: Any, key: str, value: Any) -> None:
        """mapping[key] = value, remembering the original (or its absence)."""
        mkey = (id(mapping), f"[{key}]")
        if mkey not in self._seen:
            self._seen.add(mkey)
            self._log.append((_ref(mapping), key, _current(mapping, key, True), True))
        self._set[mkey] = value
        mapping[key] = value

    def suspend(self) -> Callable[[], None]:
        """Undo every change now and return a function that makes exactly the same changes again.

        Why: enable() discovers what to patch (modeling modules on disk, built layers through a
        scan of every live object: ~0.3 s on a small process), so a reference-path moment inside
        an enabled run (capture's row re-checks) should not pay a full disable() + enable()."""
        current = []
        for ref, key, _old, is_mapping in self._log:
            target = ref()
            if target is None:
                continue
            current.append((target, key, _current(target, key, is_mapping), is_mapping))
        self.undo()

        def resume() -> None:
            for target, key, value, is_mapping in current:
                if value is _MISSING:
                    continue
                if is_mapping:
                    self.set_item(target, key, value)
                else:
                    self.set_attr(target, key, value)
        return resume

    def undo(self) -> None:
        self.kept = []
        for ref, key, old, is_mapping in reversed(self._log):
            target = ref()
            if target is None:
                continue
            if self._replaced_since(target, key, is_mapping):
                self.kept.append(_describe(target, key, is_mapping))
                continue
            if is_mapping:
                if old is _MISSING:
                    target.pop(key, None)
                else:
                    target[key] = old
            elif old is _MISSING:
                try:
                    delattr(target, key)
                except AttributeError:
                    pass
            else:
                setattr(target, key, old)
        self._log.clear()
        self._seen.clear()
        self._set.clear()

    def _replaced_since(self, target: Any, key: str, is_mapping: bool) -> bool:
        """Whether another library put its own function / class / module where fastpath had put
        a value. Data (bools, None) and values of fastpath or transformers are restored as before:
        transformers <= 5.14 rewrites some routed globals itself when a layer is built."""
        ours = self._set.get((id(target), f"[{key}]" if is_mapping else key), _MISSING)
        if ours is _MISSING:
            return False
        now = target.get(key, _MISSING) if is_mapping else getattr(target, key, _MISSING)
        if now is ours or not (callable(now) or isinstance(now, ModuleType)):
            return False
        owner = str(getattr(now, "__module__", None) or getattr(now, "__name__", "") or "")
        return not owner.startswith(("fastpath", "transformers"))


def _current(target: Any, key: str, is_mapping: bool) -> Any:
    """What target holds under key now (its own attribute, not an inherited one), or _MISSING."""
    if is_mapping:
        return target.get(key, _MISSING)
    if hasattr(target, "__dict__"):
        return target.__dict__.get(key, _MISSING)
    return getattr(target, key, _MISSING)


def _describe(target: Any, key: str, is_mapping: bool) -> str:
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    return f"{name}[{key!r}]" if is_mapping else f"{name}.{key}"


def _ref(target: Any) -> Any:
    """A weak reference when possible (built layers may be freed while enabled), else a strong one."""
    try:
        return weakref.ref(target)
    except TypeError:
        return lambda: target
