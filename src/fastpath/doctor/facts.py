"""One read-only view over a probe's facts dict: every value the rules, the plan, the report and
the fleet table derive from the facts is answered here, once.

An assumed device (`doctor --gpu SPEC`) plugs in here: the view then answers with the assumed
capability (and what follows from it: a GPU is present, torch sees it if torch is a CUDA build,
Triton has a GPU backend if its NVIDIA backend is installed) and `device_assumed` says so. The
facts dict itself is never changed: the report still shows what the probe saw.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from packaging.version import Version

import fastpath.shared.hub_kernels_env as hub_kernels_env
from fastpath.doctor.gpu_models import AssumedGpu
from fastpath.doctor.probe import arch_runs_on
from fastpath.shared.known_issues import parse_version

# fla ships as flash-linear-attention (the meta package) or fla-core: either provides `fla`.
_ALIASES = {"flash-linear-attention": ("flash-linear-attention", "fla-core")}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class FactsView:
    """Derived facts of one target. `raw` is the probe's dict, `assumed` the --gpu device."""

    def __init__(self, raw: dict[str, Any], assumed: AssumedGpu | None = None) -> None:
        self.raw = raw
        self.assumed = assumed

    # --- the probe itself ---------------------------------------------------------------------
    @property
    def probe(self) -> dict[str, Any]:
        return _dict(self.raw.get("probe"))

    @property
    def probe_errors(self) -> dict[str, Any]:
        return _dict(self.probe.get("errors"))

    @property
    def static_probe(self) -> bool:
        """The Python probe ran without imports (`--probe static`): import verdicts come from
        files (dist-info, module files, an ELF link check)."""
        return self.probe.get("kind") == "python" and "imports" in (
            _dict(self.probe.get("options")).get("skip") or [])

    @property
    def env(self) -> dict[str, Any]:
        return _dict(self.raw.get("env"))

    # --- torch ----------------------------------------------------------------------------------
    @property
    def torch(self) -> dict[str, Any]:
        return _dict(self.raw.get("torch"))

    @property
    def torch_version(self) -> str | None:
        return self.torch.get("version")

    @property
    def torch_cuda(self) -> str | None:
        """torch.version.cuda ("12.8"), None for a CPU build or no torch."""
        return self.torch.get("cuda") or None

    @property
    def torch_major(self) -> int | None:
        try:
            return int(str(self.torch_cuda).split(".")[0]) if self.torch_cuda else None
        except ValueError:
            return None

    @property
    def torch_arch_list(self) -> list[str]:
        return [str(a) for a in self.torch.get("arch_list") or []]

    @property
    def torch_arch_covered(self) -> bool | None:
        """torch's own kernels run on the device (probe's verdict, or judged for the assumed GPU)."""
        if self.assumed is None:
            return self.torch.get("device_arch_covered")
        if not self.torch_cuda or not self.torch_arch_list:
            return None
        sass = [a for a in self.torch_arch_list if a.startswith("sm_")]
        ptx = [a for a in self.torch_arch_list if a.startswith("compute_")]
        return arch_runs_on(sass, ptx, self.assumed.cc)[0]

    # --- the device -----------------------------------------------------------------------------
    @property
    def device_assumed(self) -> bool:
        return self.assumed is not None

    @property
    def gpus(self) -> list[dict[str, Any]]:
        """The GPUs the probe saw (never the assumed one)."""
        return [g for g in self.raw.get("gpus") or [] if isinstance(g, dict)]

    @property
    def device_cc(self) -> str | None:
        """Compute capability "9.0" of the device judged for: the assumed one, else the first GPU."""
        if self.assumed is not None:
            return self.assumed.cc
        for g in self.gpus:
            if g.get("compute_capability"):
                return str(g["compute_capability"])
        return None

    @property
    def device_cc_tuple(self) -> tuple[int, int] | None:
        """(major, minor) of device_cc, or None when unknown or unreadable."""
        parts = (self.device_cc or "").split(".")
        try:
            return (int(parts[0]), int(parts[1])) if len(parts) == 2 else None
        except ValueError:
            return None

    @property
    def sm(self) -> str:
        if self.assumed is not None:
            return self.assumed.sm
        cc = self.device_cc
        return f"sm_{cc.replace('.', '')}" if cc else "this GPU's arch"

    @property
    def real_gpu(self) -> bool:
        """A GPU is here: nvidia-smi lists one or torch sees one."""
        return bool(self.gpus) or bool(self.torch.get("cuda_available"))

    @property
    def gpu_present(self) -> bool:
        """A GPU to judge for: one the probe saw (nvidia-smi or torch), or the assumed one."""
        return self.assumed is not None or self.real_gpu

    @property
    def cuda_visible(self) -> bool | None:
        """torch.cuda.is_available() on the device judged for (None: no torch and no GPU facts)."""
        if self.assumed is not None:
            if not self.raw.get("torch"):
                return None
            return bool(self.torch_cuda) and self.torch_arch_covered is not False
        if self.raw.get("torch") and self.torch.get("cuda_available") is not None:
            return bool(self.torch["cuda_available"])
        return True if self.gpus else None

    # --- Triton ---------------------------------------------------------------------------------
    @property
    def triton(self) -> dict[str, Any]:
        return _dict(self.raw.get("triton"))

    @property
    def triton_version(self) -> str | None:
        return self.triton.get("version")

    @property
    def triton_gpu_backend(self) -> bool | None:
        """Triton can compile for the device: probed where a GPU is, else (assumed device, or no
        GPU here) whether its NVIDIA backend is installed; None when unknown."""
        if not self.triton_version:
            return None
        if self.assumed is not None or not self.real_gpu:  # nothing here to compile for
            backends = self.triton.get("backends")
            return None if backends is None else "nvidia" in backends
        return self.triton.get("gpu_backend")

    @property
    def fastpath_route_available(self) -> bool:
        """fastpath's Triton kernels can run: Triton with a GPU backend, or installable next to a
        CUDA torch."""
        if self.raw.get("torch") and not self.torch_cuda:
            return False  # a CPU build of torch: no GPU tensors for any kernel
        if self.triton_gpu_backend:
            return True
        return bool(self.torch_cuda) and (not self.triton or self.triton_gpu_backend is None)

    # --- packages -------------------------------------------------------------------------------
    def package(self, dist: str) -> dict[str, Any]:
        return _dict(_dict(self.raw.get("packages")).get(dist))

    def package_ok(self, dist: str) -> bool:
        """Importable per the facts (either name of fla counts)."""
        return any(_dict(self.package(n).get("import")).get("ok") is True
                   for n in _ALIASES.get(dist, (dist,)))

    def package_version(self, dist: str) -> str | None:
        for n in _ALIASES.get(dist, (dist,)):
            v = self.package(n).get("version")
            if v:
                return str(v)
        return None

    def version(self, dist: str) -> Version | None:
        """The installed version as `packaging` reads it, None if absent or unreadable."""
        return parse_version(self.package_version(dist))

    @property
    def hub_kernels_enabled(self) -> bool:
        """transformers' Hub kernels are on in this environment (fastpath.shared.hub_kernels_env)."""
        return hub_kernels_env.on(self._hub_env)

    @property
    def hub_kernels_after_enable(self) -> bool:
        """...and after fastpath.enable(), which turns them off unless the user set them."""
        return hub_kernels_env.on_after_enable(self._hub_env)

    @property
    def _hub_env(self) -> str | None:
        value = self.env.get(hub_kernels_env.ENV)
        return None if value is None else str(value)

    @property
    def hub_offline(self) -> bool:
        """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE put huggingface_hub (and `kernels`) offline."""
        return hub_kernels_env.hub_offline({k: str(v) for k, v in self.env.items()})

    @property
    def hub_cache(self) -> dict[str, Any]:
        """The probe's listing of the `kernels` Hub cache ({} where it was not probed)."""
        return _dict(self.raw.get("hub_kernels"))

    @property
    def hub_variant_env(self) -> dict[str, Any]:
        """What `kernels` matches a build variant against: torch major.minor, its C++ ABI and
        CUDA, the Python version and `<cpu>-<os>` (kernels/_internals/variants.py)."""
        def mm(text: Any) -> Version | None:
            v = parse_version(str(text).split("+")[0]) if text else None
            return Version(f"{v.major}.{v.minor}") if v is not None else None
        host = _dict(self.raw.get("host"))
        return {"torch": mm(self.torch_version), "cxx11": self.torch.get("cxx11_abi"),
                "cuda": mm(self.torch_cuda), "python": mm(host.get("python")),
                "platform": f"{host.get('arch')}-linux" if host.get("arch") else None}

    def extension_module(self, dist: str, name: str) -> bool | None:
        """An extension module of `dist` is installed (True/False), None when not probed."""
        mods = self.package(dist).get("extension_modules")
        if not isinstance(mods, dict) or name not in mods:
            return None
        return mods[name] is not None

    # --- CUDA toolchain -------------------------------------------------------------------------
    @property
    def nvcc_candidates(self) -> list[dict[str, Any]]:
        return [c for c in self.raw.get("nvcc_candidates") or [] if isinstance(c, dict)]

    @cached_property
    def nvccs(self) -> list[dict[str, Any]]:
        """Real nvcc compilers whose version was read."""
        return [c for c in self.nvcc_candidates
                if c.get("kind") == "nvcc" and c.get("major") is not None]

    @property
    def matching_nvcc(self) -> list[dict[str, Any]]:
        return [c for c in self.nvccs if c.get("major") == self.torch_major]

    @property
    def ptxas_only_wheels(self) -> list[dict[str, Any]]:
        return [c for c in self.nvcc_candidates if c.get("kind") == "ptxas-only-wheel"]

    @property
    def cuda_home(self) -> dict[str, Any]:
        return _dict(self.raw.get("cuda_home"))


def view(facts: dict[str, Any] | FactsView, assumed: AssumedGpu | None = None) -> FactsView:
    """A FactsView of `facts` (an existing view is returned as it is)."""
    return facts if isinstance(facts, FactsView) else FactsView(facts, assumed)
