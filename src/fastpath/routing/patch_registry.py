"""Every change enable() makes, recorded so disable() can put back exactly what was there."""

from __future__ import annotations

import weakref
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
            old = target.__dict__.get(name, _MISSING) if hasattr(target, "__dict__") else getattr(
                target, name, _MISSING)
            ref = _ref(target)
            self._log.append((ref, name, old, False))
        setattr(target, name, value)

    def set_item(self, mapping: Any, key: str, value: Any) -> None:
        """mapping[key] = value, remembering the original (or its absence)."""
        mkey = (id(mapping), f"[{key}]")
        if mkey not in self._seen:
            self._seen.add(mkey)
            self._log.append((_ref(mapping), key, mapping.get(key, _MISSING), True))
        mapping[key] = value

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


def _ref(target: Any) -> Any:
    """A weak reference when possible (built layers may be freed while enabled), else a strong one."""
    try:
        return weakref.ref(target)
    except TypeError:
        return lambda: target
