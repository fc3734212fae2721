"""transformers' Hub kernels (>= 5.25) as the doctor judges them: which Hub repo serves each op,
and whether this environment can load a build of it without the network.

Sources: transformers 5.25.0 src/transformers/integrations/hub_kernels.py (`_build_kernel_mapping`:
`kernels-community/fla` version 3, `kernels-community/mamba-ssm` version 5; the modeling files list
the wrapped functions in `use_kernelized_func`), and kernels 0.19.1 (kernels/_internals/
variants.py: build variant names and how one is chosen; _versions.py: the `v3` ref recorded in the
cache; resolver.py: the offline cache lookup; archs.py: the capability check of metadata.json).
Everything here reads facts; nothing is downloaded: "downloads at from_pretrained" is what follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

import fastpath.shared.hub_kernels_env as hub_kernels_env

TRANSFORMERS_HUB_SOURCE = ("https://github.com/huggingface/transformers/blob/v5.25.0/src/"
                           "transformers/integrations/hub_kernels.py")
FLA_REPO, FLA_VERSION = "kernels-community/fla", 3
MAMBA_REPO, MAMBA_VERSION = "kernels-community/mamba-ssm", 5

# transformers 5.25 `_build_kernel_mapping()`: function -> (repo, version). The fused recurrent
# ops are mapped for inference only (training keeps transformers' own path).
HUB_MAPPED_525: dict[str, tuple[str, int]] = {
    "chunk_gated_delta_rule": (FLA_REPO, FLA_VERSION),
    "fused_recurrent_gated_delta_rule": (FLA_REPO, FLA_VERSION),
    "chunk_kda": (FLA_REPO, FLA_VERSION),
    "fused_recurrent_kda": (FLA_REPO, FLA_VERSION),
    **{name: (MAMBA_REPO, MAMBA_VERSION) for name in (
        "causal_conv1d_fn", "causal_conv1d_update", "mamba_chunk_scan_combined",
        "mamba_split_conv1d_scan_combined", "mamba_inner_fn", "selective_scan_fn",
        "selective_state_update")},
}

# Hub kernel states (HubStatus.state)
CACHED = "cached"                    # a matching build is on disk: loads offline too
DOWNLOAD = "download"                # online, not cached: fetched at from_pretrained
OFFLINE_MISSING = "offline-missing"  # offline, version not cached: from_pretrained raises
OFFLINE_NO_BUILD = "offline-no-build"  # offline, version cached without a matching build


@dataclass(frozen=True)
class HubStatus:
    repo: str
    version: int | None  # None: the repo's main ref (no numbered version)
    state: str
    path: str | None  # the cached build variant's directory (CACHED)
    detail: str       # why, in words (what was found in the cache)

    @property
    def label(self) -> str:
        """The state in the words every report uses (fastpath.shared.hub_kernels_env)."""
        if self.state == CACHED:
            return hub_kernels_env.hub_cached_label(str(self.path))
        if self.state == OFFLINE_MISSING:
            return hub_kernels_env.hub_offline_missing_label(self.repo)
        if self.state == OFFLINE_NO_BUILD:
            return hub_kernels_env.hub_offline_no_build_label(self.repo)
        return hub_kernels_env.hub_download_label(self.repo)

    @property
    def fast(self) -> bool:
        return self.state == CACHED

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo, "version": self.version, "state": self.state,
                "path": self.path, "detail": self.detail, "label": self.label}


# ------------------------------------------------------------------ build variant names


@dataclass(frozen=True)
class Variant:
    """A build variant directory name as `kernels` parses it (only what matching needs)."""

    name: str
    kind: str                    # "torch" | "stable-abi" | "noarch" | "other"
    torch: Version | None = None
    cxx11: bool | None = None
    backend: str = ""            # "cuda" | "rocm" | "cpu" | "universal" | ...
    backend_version: Version | None = None
    python: Version | None = None
    platform: str = ""           # "x86_64-linux"


_LEGACY_TORCH = re.compile(r"^torch(\d)(\d+)$")
_NEW_TORCH = re.compile(r"^(\d+)\.(\d+)$")
_LEGACY_CUDA = re.compile(r"^cu(\d+)(\d)$")


def _backend(parts: list[str], legacy: bool) -> tuple[str, Version | None]:
    if legacy and len(parts) == 1:
        m = _LEGACY_CUDA.match(parts[0])
        if m:
            return "cuda", Version(f"{m.group(1)}.{m.group(2)}")
        m = re.match(r"^(rocm|xpu)(\d)(\d+)$", parts[0])
        if m:
            return m.group(1), Version(f"{m.group(2)}.{m.group(3)}")
        return parts[0], None
    if len(parts) == 2 and _NEW_TORCH.match(parts[1]):
        return parts[0], Version(parts[1])
    return "-".join(parts), None


def parse_variant(name: str) -> Variant:
    """`torch210-cxx11-cu128-x86_64-linux` (legacy), `torch-2.10-cxx11-cuda-12.8-cpython-3.9-
    abi3-x86_64-linux` (new), `torch-stable-abi211-cu128-x86_64-linux`, `torch-universal`,
    `torch-cuda` (noarch); anything else is kind "other" and matches nothing."""
    parts = name.split("-")
    if len(parts) == 2 and parts[0] == "torch" and not parts[1][:1].isdigit():
        return Variant(name, "noarch", backend=parts[1])
    kind, legacy, n, torch_v, cxx11 = "other", True, 0, None, None
    if name.startswith("torch-stable-abi"):
        legacy = not (len(parts) > 3 and parts[2] == "abi")
        n = 3 if legacy else 4
        digits = parts[2][len("abi"):] if legacy else parts[3]
        m = re.match(r"^(\d)(\d+)$", digits) if legacy else _NEW_TORCH.match(digits)
        if m:
            kind, torch_v = "stable-abi", Version(f"{m.group(1)}.{m.group(2)}")
    elif parts[0] == "torch" and len(parts) > 1 and _NEW_TORCH.match(parts[1]):
        kind, legacy, n, torch_v = "torch", False, 2, Version(parts[1])
    elif _LEGACY_TORCH.match(parts[0]):
        m = _LEGACY_TORCH.match(parts[0])
        kind, n, torch_v = "torch", 1, Version(f"{m.group(1)}.{m.group(2)}")
    if kind == "other" or len(parts) < n + 3:
        return Variant(name, "other")
    if parts[n] in ("cxx11", "cxx98"):
        cxx11, n = parts[n] == "cxx11", n + 1
    rest, platform = parts[n:-2], "-".join(parts[-2:])
    python = Version("3.9")
    if not legacy:
        if "cpython" not in rest:
            return Variant(name, "other")
        i = rest.index("cpython")
        try:
            python = Version(rest[i + 1])
        except (IndexError, InvalidVersion):
            return Variant(name, "other")
        rest = rest[:i]
    backend, backend_version = _backend(rest, legacy)
    return Variant(name, kind, torch_v, cxx11, backend, backend_version, python, platform)


def variant_rejected(v: Variant, env: dict[str, Any]) -> str | None:
    """Why `kernels` would not pick build `v` for this environment, None if it would
    (kernels/_internals/variants.py `_check_variants`, for a CUDA torch)."""
    cuda = env.get("cuda")
    if v.kind == "noarch":
        return None if v.backend in ("cuda", "universal") else f"noarch backend {v.backend}"
    if v.kind == "other":
        return "not a build variant kernels matches here"
    if v.platform != env.get("platform"):
        return f"platform {v.platform}, not {env.get('platform')}"
    if env.get("python") is not None and v.python is not None and env["python"] < v.python:
        return f"needs Python >= {v.python}"
    if v.kind == "torch":
        if v.torch != env.get("torch"):
            return f"torch {v.torch}, not {env.get('torch')}"
        if v.cxx11 is not None and env.get("cxx11") is not None and v.cxx11 != env["cxx11"]:
            return "C++11 ABI differs"
    elif env.get("torch") is None or (v.torch is not None and v.torch > env["torch"]):
        return f"stable ABI {v.torch} newer than torch {env.get('torch')}"
    if v.backend != "cuda" or v.backend_version is None or cuda is None:
        return f"backend {v.backend}, not CUDA {cuda}"
    if (v.backend_version.major != cuda.major or v.backend_version.minor > cuda.minor):
        return f"CUDA {v.backend_version} does not run on torch's CUDA {cuda}"
    return None


def _arch_ok(backend: Any, cc: tuple[int, int] | None) -> bool:
    """metadata.json's declared archs run on capability `cc` (kernels/_internals/archs.py);
    True when unknown."""
    archs = backend.get("archs") if isinstance(backend, dict) else None
    if cc is None or not isinstance(archs, list) or not archs:
        return True
    known = []
    for arch in archs:
        m = re.match(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", str(arch))
        if not m:
            continue
        major, minor, suffix, ptx = int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4))
        if suffix == "a":
            known.append(cc == (major, minor))
        elif ptx and not suffix:
            known.append(cc >= (major, minor))
        else:
            known.append(cc[0] == major and cc[1] >= minor)
    return not known or any(known)


# ------------------------------------------------------------------ the one decision


def hub_status(fv: Any, repo: str, version: int | None) -> HubStatus:
    """Whether `repo` (at `version`) can serve a build here: from the local cache (which build,
    where), or only by a download at from_pretrained, or not at all offline. `fv` is a FactsView
    (its torch, host, device capability, env and hub_kernels facts)."""
    cache = fv.hub_cache
    offline = fv.hub_offline
    entry = (cache.get("repos") or {}).get(repo) if isinstance(cache.get("repos"), dict) else None
    where = cache.get("cache_dir") or "the Hub cache"
    if not isinstance(entry, dict):
        detail = f"no {repo} in {where}" if cache else "the Hub cache was not probed"
        return HubStatus(repo, version, OFFLINE_MISSING if offline else DOWNLOAD, None, detail)
    refs = entry.get("refs") if isinstance(entry.get("refs"), dict) else {}
    snapshots = entry.get("snapshots") if isinstance(entry.get("snapshots"), dict) else {}
    ref = f"v{version}" if version is not None else "main"
    commit = refs.get(ref)
    if not commit or not isinstance(snapshots.get(commit), dict):
        detail = f"{repo} is in {where} but not its ref {ref}"
        return HubStatus(repo, version, OFFLINE_MISSING if offline else DOWNLOAD, None, detail)
    env = fv.hub_variant_env
    reasons = []
    for name, info in sorted(snapshots[commit].items()):
        why = variant_rejected(parse_variant(name), env)
        if why is None and not (isinstance(info, dict) and info.get("metadata")):
            why = "no metadata.json"
        if why is None and not _arch_ok((info or {}).get("backend"), fv.device_cc_tuple):
            why = f"its archs do not include {fv.sm}"
        if why is None:
            path = f"{entry.get('path')}/snapshots/{commit}/build/{name}"
            return HubStatus(repo, version, CACHED, path, f"build {name} of {ref} ({commit[:12]})")
        reasons.append(f"{name}: {why}")
    detail = (f"{repo} {ref} is cached without a build for torch {env.get('torch')} / CUDA "
              f"{env.get('cuda')} / {env.get('platform')}"
              + (f" ({'; '.join(reasons[:3])})" if reasons else ""))
    return HubStatus(repo, version, OFFLINE_NO_BUILD if offline else DOWNLOAD, None, detail)


def hub_status_for_op(fv: Any, op_name: str) -> HubStatus | None:
    """The Hub kernel status of a 5.25-mapped op, None for an op no Hub repo serves."""
    hit = HUB_MAPPED_525.get(op_name)
    return None if hit is None else hub_status(fv, *hit)
