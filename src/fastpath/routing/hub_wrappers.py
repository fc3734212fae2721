"""Reading transformers' kernel wrappers, without calling them: the one place that knows their
shapes, for explain(), the routes and the hub-kernel machinery.

* 5.15+ `use_kernel_func_from_hub_with_fallback` (src/transformers/integrations/hub_kernels.py)
  returns a closure over `func_name`, `implementation`, `is_new_implementation`, `package` and
  `torch_function`: the op's name, what it binds, whether that came from the kernel package, and
  transformers' torch fallback. 5.25 adds a device check (`_PACKAGE_SUPPORTED_DEVICES`).
* 5.25 with `kernels` installed: each such global is a `kernels` `Func` nn.Module instance whose
  forward closes over `func` (kernels `_create_func_module`, kernels 0.19.1); kernelize() maps the
  instance, by its `kernel_layer_name`, to a Hub kernel.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


def closure_value(value: Any, name: str) -> Any:
    """The closure variable `name` of function `value`, or None (absent, or an empty cell)."""
    code = getattr(value, "__code__", None)
    if code is None or name not in code.co_freevars:
        return None
    cells = dict(zip(code.co_freevars, value.__closure__ or (), strict=False))
    try:
        return cells[name].cell_contents
    except ValueError:
        return None


def kernels_func_inner(value: Any) -> Any:
    """The function a `kernels` Func module instance wraps (5.25 + `kernels`), else None.

    kernels' Func.forward calls the Hub kernel kernelize() chose for it, else the closure variable
    `func`: transformers' own wrapper (or plain helper) it was built from."""
    cls = type(value)
    # kernels gives the class the wrapped function's __module__: recognise it by shape instead
    if not (hasattr(cls, "kernel_layer_name") and cls.__qualname__.endswith("_create_func_module.<locals>.Func")):
        return None
    inner = closure_value(cls.__dict__.get("forward"), "func")
    return inner if callable(inner) else None


def unwrap(value: Any) -> Any:
    """`value`, seen through a `kernels` Func instance: what runs when no Hub kernel is mapped."""
    inner = kernels_func_inner(value)
    return value if inner is None else inner


def is_hub_fallback(value: Any) -> bool:
    """transformers' use_kernel_func_from_hub_with_fallback closure (itself, not a Func around it)."""
    code = getattr(value, "__code__", None)
    return bool(code is not None and "implementation" in code.co_freevars
                and "is_new_implementation" in code.co_freevars)


def hub_func_name(value: Any) -> str | None:
    """The op name of a hub-fallback wrapper (seen through a `kernels` Func instance), else None."""
    value = unwrap(value)
    code = getattr(value, "__code__", None)
    if code is None or "is_new_implementation" not in code.co_freevars:
        return None
    name = closure_value(value, "func_name")
    return name if isinstance(name, str) else None


def fallback_target(value: Any) -> tuple[Any, bool, str | None]:
    """What a hub-fallback wrapper binds: (implementation, whether the kernel package provided it,
    the package's name)."""
    package = closure_value(value, "package")
    return (closure_value(value, "implementation"), bool(closure_value(value, "is_new_implementation")),
            package if isinstance(package, str) else None)


def gates_devices(value: Any) -> bool:
    """Whether the wrapper checks the input's device against the package's (5.25 does; earlier
    versions do not)."""
    code = value.__code__
    if "_PACKAGE_SUPPORTED_DEVICES" in code.co_names or "_PACKAGE_SUPPORTED_DEVICES" in str(code.co_consts):
        return True
    module = sys.modules.get(getattr(value, "__module__", "") or "")
    hub = sys.modules.get("transformers.integrations.hub_kernels")
    return hub is not None and hasattr(hub, "_PACKAGE_SUPPORTED_DEVICES") and module is not None


@dataclass(frozen=True)
class Layer:
    """One wrapper layer of a hook's value, read without calling it (`peel`).

    hub_name: a `kernels` Func instance's mapping name (`inner` is the function it wraps);
    fallback: a hub-fallback closure (`inner` is what it binds, `provided` whether the kernel
    package provided it, `package` its name, `gated` whether it checks the input's device);
    otherwise a plain value (`inner` None)."""

    hub_name: str | None = None
    fallback: bool = False
    inner: Any = None
    provided: bool = False
    package: str | None = None
    gated: bool = False


def peel(value: Any) -> Layer:
    """What wrapper `value` is, in one read: a `kernels` Func instance, a hub-fallback closure, or
    neither."""
    inner = kernels_func_inner(value)
    if inner is not None:
        name = getattr(type(value), "kernel_layer_name", None)  # its mapping name, e.g. "chunk_gated_delta_rule"
        return Layer(hub_name=name if isinstance(name, str) else None, inner=inner)
    if is_hub_fallback(value):
        impl, provided, package = fallback_target(value)
        return Layer(fallback=True, inner=impl, provided=provided, package=package, gated=gates_devices(value))
    return Layer()
