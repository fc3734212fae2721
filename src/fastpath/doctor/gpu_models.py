"""`--gpu SPEC`: a device that is not here, named by compute capability or product name.

The product table is data: name -> (major, minor), each row with where the number comes from.
Sources: NVIDIA's compute capability list (https://developer.nvidia.com/cuda-gpus) and, for
the Blackwell parts it lists by family, the CUDA C++ Programming Guide's "Compute Capabilities"
table (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#compute-capabilities) and the
CUDA 13.0 release notes (sm_101 renamed sm_110, Jetson Thor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastpath.shared.errors import UsageError

CUDA_GPUS = "https://developer.nvidia.com/cuda-gpus"
CUDA_GUIDE = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/#compute-capabilities"
CUDA_13_NOTES = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/"

# (names as users type them, capability, source). Matching ignores case, spaces, hyphens and a
# leading "NVIDIA"/"GeForce".
GPU_MODELS: tuple[tuple[tuple[str, ...], tuple[int, int], str], ...] = (
    (("V100",), (7, 0), CUDA_GPUS),
    (("T4", "RTX 2080 Ti", "Quadro RTX 8000"), (7, 5), CUDA_GPUS),
    (("A100", "A800", "A30"), (8, 0), CUDA_GPUS),
    (("A10", "A10G", "A40", "A16", "A2", "RTX A6000", "RTX 3090", "RTX 3080"), (8, 6), CUDA_GPUS),
    (("Jetson AGX Orin", "Jetson Orin"), (8, 7), CUDA_GPUS),
    (("L40S", "L40", "L4", "L20", "RTX 6000 Ada", "RTX 4090", "RTX 4080"), (8, 9), CUDA_GPUS),
    (("H100", "H200", "H800", "H20", "GH200"), (9, 0), CUDA_GPUS),
    (("B200", "GB200", "B100", "HGX B200", "DGX B200"), (10, 0), CUDA_GUIDE),
    (("B300", "GB300", "HGX B300", "DGX B300"), (10, 3), CUDA_GUIDE),
    (("Jetson Thor", "Thor"), (11, 0), CUDA_13_NOTES),
    (("RTX PRO 6000", "RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell Server Edition",
      "RTX PRO 5000", "RTX PRO 4000", "RTX 5090", "RTX 5080", "RTX 5070 Ti", "RTX 5070"),
     (12, 0), CUDA_GPUS),
    (("GB10", "DGX Spark"), (12, 1), CUDA_GUIDE),
)

_SM_RE = re.compile(r"^(?:sm_?|compute_?)(\d{1,2})(\d)([af]?)$", re.I)
_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)([af]?)$", re.I)


@dataclass(frozen=True)
class AssumedGpu:
    """A device the verdict is judged for although it is not here."""

    spec: str                    # what the user typed
    capability: tuple[int, int]
    variant: str = ""            # "a" / "f" (arch- or family-specific target), else ""
    name: str | None = None      # product name when the spec was one
    source: str = ""             # where the name -> capability mapping comes from

    @property
    def cc(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}{self.variant}"

    def describe(self) -> str:
        what = f"{self.name} ({self.sm})" if self.name else self.sm
        return f"assumed GPU {what}, not detected here (--gpu {self.spec})"

    def to_json(self) -> dict[str, object]:
        return {"spec": self.spec, "compute_capability": self.cc, "sm": self.sm,
                "name": self.name, "source": self.source or "the --gpu value"}


def _key(name: str) -> str:
    k = re.sub(r"[\s_-]+", "", name.lower())
    for prefix in ("nvidia", "geforce"):
        k = k.removeprefix(prefix)
    return k


_BY_KEY = {_key(n): (n, cc, src) for names, cc, src in GPU_MODELS for n in names}


# The names an error shows (every one is in GPU_MODELS; a test checks): one or two per
# generation, the data-centre parts first. The full list is GPU_MODELS.
EXAMPLE_NAMES = ("V100", "T4", "A100", "A10G", "L4", "L40S", "RTX 4090", "H100", "H200", "GH200",
                 "B200", "GB200", "B300", "RTX PRO 6000", "RTX 5090", "DGX Spark")


def parse_gpu_spec(spec: str) -> AssumedGpu:
    """sm_120 / sm_90a / 12.0 / 120 / a product name -> AssumedGpu; anything else: UsageError."""
    text = (spec or "").strip()
    m = _SM_RE.match(text) or _DOTTED_RE.match(text) or (
        re.match(r"^(\d{1,2})(\d)([af]?)$", text) if text.isalnum() else None)
    if m:
        major, minor = int(m.group(1)), int(m.group(2))
        if 5 <= major <= 15 and minor <= 9:
            return AssumedGpu(text, (major, minor), m.group(3).lower())
    hit = _BY_KEY.get(_key(text)) if text else None
    if hit is not None:
        name, cc, src = hit
        return AssumedGpu(text, cc, "", name, src)
    raise UsageError(f"--gpu {spec!r}: not a compute capability (sm_120, 12.0, sm_90a) or a known "
                     f"GPU name (e.g. {', '.join(EXAMPLE_NAMES)}; all {len(_BY_KEY)} are in "
                     "fastpath/doctor/gpu_models.py)")
