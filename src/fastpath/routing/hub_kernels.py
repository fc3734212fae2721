"""transformers' hub-kernel machinery: keep it from downloading, see through it, feed it fastpath.

* 5.0-5.14 mamba-family layers call `lazy_load_kernel("causal-conv1d")`; with the `kernels`
  package installed that tries only the Hub (and raises air-gapped, through 5.12 regardless of
  USE_HUB_KERNELS). A module pre-seeded in `_KERNEL_MODULE_MAPPING` is returned before any of that.
* 5.25 makes `kernels` a dependency and `from_pretrained(use_kernels=None)` mean True unless
  USE_HUB_KERNELS is false: kernelize() would try to download a Hub kernel for each mapped layer.
  enable() sets USE_HUB_KERNELS=0 (read at call time in 5.25; at import in 5.14-5.24) unless the
  user set it, so loading stays offline and on fastpath's routes.
* 5.25 with `kernels` installed: every `use_kernel_func_from_hub_with_fallback` op (and helpers
  such as `causal_conv1d_forward`) is a module global that is no longer a function but an instance
  of a `kernels` `Func` nn.Module wrapping transformers' fallback closure (kernels
  `use_kernel_forward_from_hub` applied to a function: src/kernels/_internals/layer/layer.py,
  `_create_func_module`, kernels 0.19.1); `kernelize()` maps that instance to a Hub kernel. With
  `FASTPATH_HUB_KERNELS=route` (the default) enable() puts the wrapped function back as the
  module global (recorded, undone exactly), so every route sees the shape 5.15-5.24 have and
  fastpath wins where its kernel applies; `keep` leaves those globals (and USE_HUB_KERNELS) alone
  so a kernelized model keeps its Hub kernels.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import fastpath.shared.hub_kernels_env as hub_kernels_env
from fastpath.routing.hub_wrappers import kernels_func_inner
from fastpath.routing.patch_registry import PatchRegistry

HUB_MODULE = "transformers.integrations.hub_kernels"
ENV = hub_kernels_env.ENV
#: enable(hub_kernels=...) / FASTPATH_HUB_KERNELS: "route" ops to fastpath, or "keep" Hub kernels
MODE_ENV = "FASTPATH_HUB_KERNELS"
MODES = ("route", "keep")


def route_mode(requested: str | None = None) -> str:
    """enable(hub_kernels=...) if given, else FASTPATH_HUB_KERNELS, else "route"; validated."""
    mode = requested if requested is not None else (os.environ.get(MODE_ENV, "").strip().lower() or "route")
    if mode not in MODES:
        from fastpath.shared.errors import UsageError

        raise UsageError(f"hub_kernels / {MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


# transformers 5.25 `_build_kernel_mapping` (src/transformers/integrations/hub_kernels.py): the Hub
# repo of each mapped op on CUDA, for when the mapping itself cannot be read
_REPO_OF = {**dict.fromkeys(("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda",
                             "fused_recurrent_kda", "RMSNormGated"), "kernels-community/fla"),
            **dict.fromkeys(("causal_conv1d_fn", "causal_conv1d_update", "mamba_chunk_scan_combined",
                             "mamba_split_conv1d_scan_combined", "mamba_inner_fn", "selective_scan_fn",
                             "selective_state_update"), "kernels-community/mamba-ssm")}


def hub_repo(layer_name: str) -> str | None:
    """The Hub repo transformers' kernel mapping sends `layer_name` to on CUDA, else None."""
    hub = sys.modules.get(HUB_MODULE)
    getter = getattr(hub, "get_kernel_mapping_transformers", None)
    try:
        entry = getter().get(layer_name) if callable(getter) else None
    except Exception:
        entry = None
    for device, repo in (entry or {}).items():
        if str(getattr(device, "type", device)) != "cuda":
            continue
        repos = list(repo.values()) if isinstance(repo, dict) else [repo]
        repo_id = next((getattr(r, "_repo_id", None) for r in repos if getattr(r, "_repo_id", None)), None)
        if isinstance(repo_id, str):
            return repo_id
    return _REPO_OF.get(layer_name) if entry is None else None


def hub_kernel_state(layer_name: str) -> str | None:
    """How a kernelized model runs `layer_name` on CUDA, in hub_kernels_env's words (the doctor's):
    cached, to be downloaded at from_pretrained, or (offline, nothing cached) a load that raises.
    None when transformers maps nothing to it for CUDA."""
    repo = hub_repo(layer_name)
    if repo is None:
        return None
    cached = hub_kernels_env.cached_kernel_repo(repo)
    if cached is not None:
        return hub_kernels_env.hub_cached_label(cached)
    if hub_kernels_env.hub_offline(dict(os.environ)):
        return hub_kernels_env.hub_offline_missing_label(repo)
    return hub_kernels_env.hub_download_label(repo)


def unwrap_module_globals(module: ModuleType, reg: PatchRegistry) -> list[str]:
    """Replace every `kernels` Func module global of a modeling module by the function it wraps
    (recorded in `reg`). Returns the names replaced. transformers' forwards look these globals up
    at call time, so the layer then calls transformers' fallback wrapper, which fastpath's routes
    replace like on 5.15-5.24; a kernelized model's Hub mapping (keyed by the Func instance) no
    longer applies to them."""
    names = []
    for name, value in list(vars(module).items()):
        inner = kernels_func_inner(value)
        if inner is not None and getattr(inner, "__module__", None) == module.__name__:
            reg.set_attr(module, name, inner)
            names.append(name)
    return names


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
