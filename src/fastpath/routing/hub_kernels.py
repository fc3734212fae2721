"""transformers' hub-kernel machinery: keep it from downloading, and feed it fastpath offline.

* 5.0-5.14 mamba-family layers call `lazy_load_kernel("causal-conv1d")`; with the `kernels`
  package installed that tries only the Hub (and raises air-gapped, through 5.12 regardless of
  USE_HUB_KERNELS). A module pre-seeded in `_KERNEL_MODULE_MAPPING` is returned before any of that.
* 5.25 makes `kernels` a dependency and `from_pretrained(use_kernels=None)` mean True unless
  USE_HUB_KERNELS is false: kernelize() would try to download a Hub kernel for each mapped layer.
  enable() sets USE_HUB_KERNELS=0 (read at call time in 5.25; at import in 5.14-5.24) unless the
  user set it, so loading stays offline and on fastpath's routes.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import fastpath.hub_kernels_env as hub_kernels_env
from fastpath.routing.patch_registry import PatchRegistry

HUB_MODULE = "transformers.integrations.hub_kernels"
ENV = hub_kernels_env.ENV


def conv_route_module(conv_fn: Any, conv_update: Any) -> ModuleType:
    """A real module object (lazy_load_kernel checks isinstance ModuleType) exposing the routes."""
    mod = ModuleType("fastpath_causal_conv1d_route")
    mod.__doc__ = "causal_conv1d routed to fastpath by fastpath.enable()"
    mod.causal_conv1d_fn = conv_fn  # type: ignore[attr-defined]
    mod.causal_conv1d_update = conv_update  # type: ignore[attr-defined]
    mod.__fastpath__ = True  # type: ignore[attr-defined]
    return mod


def seed_lazy_kernel_mapping(hub: ModuleType, route_module: ModuleType, reg: PatchRegistry) -> bool:
    """Pre-seed lazy_load_kernel's cache (5.0-5.14). Returns whether the mapping exists."""
    mapping = getattr(hub, "_KERNEL_MODULE_MAPPING", None)
    if not isinstance(mapping, dict):
        return False
    reg.set_item(mapping, "causal-conv1d", route_module)
    return True


def disable_hub_downloads(reg_env: dict[str, str | None]) -> str:
    """Set USE_HUB_KERNELS=0 unless the user chose a value; returns a one-line note."""
    current = os.environ.get(ENV)
    if current is not None:  # the user's choice stays (hub_kernels_env.value_after_enable)
        if not hub_kernels_env.on(current):
            return f"{ENV}={current} (already set): no Hub kernel downloads"
        return (f"{ENV}={current} was set by you: from_pretrained may kernelize with Hub kernels "
                "(downloads; fails offline). Unset it or set 0 to stay on fastpath offline")
    reg_env.setdefault(ENV, None)
    os.environ[ENV] = hub_kernels_env.value_after_enable(current)
    hub = sys.modules.get(HUB_MODULE)
    if hub is not None and isinstance(getattr(hub, "_kernels_enabled", None), bool):
        # 5.14-5.24 read the variable once, at import; keep the module in step
        reg_env.setdefault("__hub_flag__", "1")
        hub._kernels_enabled = False  # type: ignore[attr-defined]
    return (f"set {ENV}=0: from_pretrained(use_kernels=None) neither downloads Hub kernels nor (5.25) "
            "raises for a missing/old `kernels`; pass use_kernels=True with USE_HUB_KERNELS=1 to opt in")


def restore_env(reg_env: dict[str, str | None]) -> None:
    for key, old in reg_env.items():
        if key == "__hub_flag__":
            hub = sys.modules.get(HUB_MODULE)
            if hub is not None and isinstance(getattr(hub, "_kernels_enabled", None), bool):
                hub._kernels_enabled = _env_true()  # type: ignore[attr-defined]
            continue
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
    reg_env.clear()


def _env_true() -> bool:
    return hub_kernels_env.on(os.environ.get(ENV))


def kernels_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("kernels") is not None
