"""Whether transformers' Hub kernels are on: decided here once, for the doctor and for enable().

transformers reads USE_HUB_KERNELS (unset means YES): Hub kernels are on when the value, upper-
cased, is one of 1/ON/YES/TRUE (src/transformers/integrations/hub_kernels.py at v5.14.0-v5.24:
`ENV_VARS_TRUE_VALUES`); 5.25 reads it with `is_env_variable_true`, which also takes "y"
(src/transformers/utils/import_utils.py at v5.25.0). Any other value turns them off.

fastpath.enable() sets USE_HUB_KERNELS=0 when the user has not set it (so from_pretrained stays
offline and on fastpath's routes) and keeps a value the user set. The doctor's plan asks
`on_after_enable` what enable() will leave, and routing/hub_kernels.py asks `value_after_enable`
what to set: the report and the routing cannot disagree.
"""

from __future__ import annotations

ENV = "USE_HUB_KERNELS"
# What enable() sets when the variable is unset.
OFF_VALUE = "0"
_TRUE = frozenset(("1", "on", "yes", "true", "y"))


def on(value: str | None) -> bool:
    """Hub kernels are on for this USE_HUB_KERNELS value (None: unset, which means on)."""
    return value is None or value.lower() in _TRUE


def value_after_enable(value: str | None) -> str:
    """USE_HUB_KERNELS as fastpath.enable() leaves it: OFF_VALUE when unset, else the user's."""
    return OFF_VALUE if value is None else value


def on_after_enable(value: str | None) -> bool:
    """Hub kernels stay on after fastpath.enable() only where the user set a true value."""
    return on(value_after_enable(value))


def kernel_cache_root(environ: dict[str, str] | None = None) -> str:
    """Where the `kernels` package keeps Hub kernels: KERNELS_CACHE, else huggingface_hub's cache
    (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub). Source: kernels 0.19.1
    src/kernels/_internals/hf_hub.py `_get_cache_dir` and huggingface_hub `constants.HF_HUB_CACHE`."""
    import os

    env = os.environ if environ is None else environ
    if env.get("KERNELS_CACHE"):
        return env["KERNELS_CACHE"]
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                              "huggingface")
    return os.path.join(home, "hub")


def cached_kernel_repo(repo_id: str, environ: dict[str, str] | None = None) -> str | None:
    """The local snapshot folder of Hub kernel repo `repo_id` (e.g. kernels-community/fla) when one
    is downloaded (a `kernel` repo folder `kernels--<org>--<name>` with a snapshot), else None."""
    import os

    folder = os.path.join(kernel_cache_root(environ), "kernels--" + repo_id.replace("/", "--"))
    snapshots = os.path.join(folder, "snapshots")
    try:
        if any(os.scandir(snapshots)):
            return folder
    except OSError:
        return None
    return None


# huggingface_hub reads HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as true for these values, upper-
# cased (src/huggingface_hub/constants.py: ENV_VARS_TRUE_VALUES, `_is_true`).
HF_OFFLINE_ENVS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_HF_TRUE = frozenset(("1", "ON", "YES", "TRUE"))


def hub_offline(env: dict[str, str]) -> bool:
    """huggingface_hub (and so `kernels`) is in offline mode for these environment variables."""
    return any(str(env.get(name, "")).upper() in _HF_TRUE for name in HF_OFFLINE_ENVS)


# The names of the states of an op that transformers (>= 5.25) may send to a Hub kernel, one
# wording for every report (doctor plan, explain(), verify, bench). What `kernels` 0.19.1 does
# offline without the build in its cache: `get_kernel` raises ValueError ("Version 3 of
# 'kernels-community/fla' is not available in the local cache and Hugging Face Hub is in offline
# mode", kernels/_internals/_versions.py `resolve_version_spec_as_ref`), which `kernelize` does not
# catch (it falls back only on FileNotFoundError, kernels/_internals/layer/layer.py
# `kernelize_layer`), so from_pretrained onto a GPU raises. A cached ref without a matching build
# raises FileNotFoundError instead, and the op keeps transformers' own path (package, then torch).
ROUTED = "routed to fastpath"


def hub_cached_label(path: str) -> str:
    """A Hub kernel whose build for this environment is already in the local cache."""
    return f"hub kernel cached at {path}"


def hub_download_label(repo: str) -> str:
    """A Hub kernel that is not in the local cache: fetched when from_pretrained places the model
    on a GPU; with HF_HUB_OFFLINE=1 that load raises instead."""
    return f"hub kernel {repo} (downloads at from_pretrained; offline: from_pretrained raises ValueError)"


def hub_offline_missing_label(repo: str) -> str:
    """HF_HUB_OFFLINE is set and no version of the repo is in the cache: from_pretrained raises."""
    return f"hub kernel {repo} not in the local cache and HF_HUB_OFFLINE=1: from_pretrained raises ValueError"


def hub_offline_no_build_label(repo: str) -> str:
    """HF_HUB_OFFLINE is set, the repo's version is cached but not a build for this environment:
    `kernels` raises FileNotFoundError and kernelize keeps transformers' own path."""
    return f"hub kernel {repo} cached without a build for this torch/CUDA (offline: transformers' own path)"
