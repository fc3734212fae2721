"""Every change enable() makes, recorded so disable() can put back exactly what was there."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_MISSING = object()


@dataclass
class PatchRegistry:
    """An undo log of attribute / mapping assignments, replayed in reverse by `undo()`."""

    _log: list[tuple[Any, str, Any, bool]] = field(default_factory=list)  # (target, key, old, is_mapping)
    _seen: set[tuple[int, str]] = field(default_factory=set)

    def set_attr(self, target: Any, name: str, value: Any) -> None:
        """setattr(target, name, value), remembering the first original (or its absence)."""
        key = (id(target), name)
        if key not in self._seen:
            self._seen.add(key)
            self._log.append((_ref(target), name, _current(target, name, False), False))
        setattr(target, name, value)

    def set_item(self, mapping: Any, key: str, value: Any) -> None:
        """mapping[key] = value, remembering the original (or its absence)."""
        mkey = (id(mapping), f"[{key}]")
        if mkey not in self._seen:
            self._seen.add(mkey)
            self._log.append((_ref(mapping), key, _current(mapping, key, True), True))
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
        for ref, key, old, is_mapping in reversed(self._log):
            target = ref()
            if target is None:
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


def _current(target: Any, key: str, is_mapping: bool) -> Any:
    """What target holds under key now (its own attribute, not an inherited one), or _MISSING."""
    if is_mapping:
        return target.get(key, _MISSING)
    if hasattr(target, "__dict__"):
        return target.__dict__.get(key, _MISSING)
    return getattr(target, key, _MISSING)


def _ref(target: Any) -> Any:
    """A weak reference when possible (built layers may be freed while enabled), else a strong one."""
    try:
        return weakref.ref(target)
    except TypeError:
        return lambda: target
