"""Known-bad combinations, each decided once as a pure function of facts.

The doctor (rules) and the routing (enable()) both ask these functions, so a report and a routing
decision can never disagree. Only `packaging` is imported: the module is light and GPU-free.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

FLA_ISSUE_640 = "https://github.com/fla-org/flash-linear-attention/issues/640"

# FLA's own guard (fla/utils/env.py and fla/ops/common/chunk_o.py in fla-core 0.6.0; narrowed to
# this range by FLA PR #983): Hopper with Triton in [3.4.0, 3.7.1) and no TileLang backend.
_FLA_640_LOW = Version("3.4.0")
_FLA_640_HIGH = Version("3.7.1")


def parse_version(text: str | None) -> Version | None:
    """A package version as `packaging` reads it (rc/dev/local parts kept), or None if unreadable."""
    if not text:
        return None
    try:
        return Version(str(text).strip())
    except InvalidVersion:
        return None


def fla_640(compute_capability: tuple[int, int] | None, triton_version: str | None,
            tilelang_available: bool) -> bool:
    """True where FLA refuses its gated chunk backward (`chunk_bwd_dqkwg`) because of FLA #640.

    Compared the way FLA compares (`packaging`), so 3.7.1rc1 is still affected and 3.7.1 is not.
    An unknown device or Triton version is not affected: nothing is claimed without the facts.
    """
    if compute_capability is None or tilelang_available or compute_capability[0] != 9:
        return False
    tv = parse_version(triton_version)
    return tv is not None and _FLA_640_LOW <= tv < _FLA_640_HIGH


DAO_ISSUE_105 = "https://github.com/Dao-AILab/causal-conv1d/issues/105"


def dao_sm103_nvcc13(compute_capability: tuple[int, int] | None, conv_sass: list[str],
                     conv_installed: bool, nvcc_majors: list[int]) -> str | None:
    """Where Dao causal-conv1d's sm_103 code (built by nvcc 13) would compute wrong outputs on a
    B300-class device (Dao-AILab/causal-conv1d#105; its setup.py now skips sm_103), or None.

    Affected: the device is 10.3 and either the installed .so carries sm_103 SASS, or the package
    is not installed yet and this host's nvcc 13 would build it."""
    if compute_capability != (10, 3):
        return None
    for arch in conv_sass:
        if arch.startswith("sm_103"):
            return f"installed build has {arch} SASS"
    if not conv_installed and 13 in nvcc_majors:
        return "a source build with this host's nvcc 13"
    return None


# torch.utils.cpp_extension CUDA_GCC_VERSIONS
# (https://github.com/pytorch/pytorch/blob/main/torch/utils/cpp_extension.py): CUDA -> host gcc
# major (min, max exclusive). Only the versions with a source.
CUDA_GCC_BOUNDS = {"12.8": (6, 14)}


def host_gcc_unsupported(cuda: str | None, gcc_version: str | None) -> tuple[int, int] | None:
    """The (lowest, highest) gcc major nvcc `cuda` accepts when `gcc_version` is outside it
    (a source build of an extension then fails in the host compiler step), else None."""
    bounds = CUDA_GCC_BOUNDS.get(str(cuda))
    if bounds is None or not gcc_version:
        return None
    try:
        major = int(str(gcc_version).split(".")[0])
    except ValueError:
        return None
    return None if bounds[0] <= major < bounds[1] else (bounds[0], bounds[1] - 1)


# speculators' EAGLE-3 verifier norm is the drafter's x̂·w RMSNorm loaded with the verifier's raw
# model.norm.weight (src/speculators/models/eagle3/core.py, 0.9.0); DFlash's
# resolve_verifier_norm_class covers qwen3_5 / qwen3_5_text only (PR #1090); #1145 (open) adds
# qwen3_5_moe; qwen3_next is in no list. These model types store the final norm zero-centred and
# compute x̂·(1 + w) (transformers' Qwen3_5RMSNorm, Qwen3_5MoeRMSNorm, Qwen3NextRMSNorm).
SPECULATORS_NORM_SOURCES = ("https://github.com/vllm-project/speculators/pull/1090",
                            "https://github.com/vllm-project/speculators/pull/1145",
                            "https://github.com/vllm-project/speculators/issues/797")
ZERO_CENTRED_FINAL_NORM = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
_SPECULATORS_DFLASH_OK = ("qwen3_5", "qwen3_5_text")
SPECULATORS_LAST_READ = Version("0.9.0")


def speculators_zero_centred_norm(version: str | None, model_type: str | None) -> str | None:
    """Which of speculators' drafters train against wrong verifier logits for this target (None:
    speculators not installed, or a target whose final norm is x̂·w). model_type None: any target
    of the affected types. A version newer than the one read is reported as unchecked."""
    v = parse_version(version)
    if v is None or (model_type is not None and model_type not in ZERO_CENTRED_FINAL_NORM):
        return None
    if v > SPECULATORS_LAST_READ:
        return f"speculators {v} is newer than {SPECULATORS_LAST_READ}, the last version read: not checked"
    if model_type in _SPECULATORS_DFLASH_OK:
        return "EAGLE-3 (DFlash resolves this target's norm correctly)"
    if model_type is None:
        return "EAGLE-3 for all of them; DFlash for qwen3_5_moe and qwen3_next"
    return "EAGLE-3 and DFlash"


MAMBA_PR_977 = "https://github.com/state-spaces/mamba/pull/977"


def mamba1_cuda_scan_missing(mamba_ssm_imports: bool, selective_scan_cuda: bool | None) -> bool:
    """True where an installed mamba_ssm imports without its `selective_scan_cuda` extension: since
    state-spaces/mamba#977 (main, unreleased) the Mamba-1 CUDA scan is built only with
    MAMBA_KEEP_CUDA_BUILD=TRUE, the package root no longer needs it, and `selective_scan_fn` /
    `mamba_inner_fn` raise when called. transformers still picks them: the package imports.
    `selective_scan_cuda` None: unknown (not probed), never claimed."""
    return mamba_ssm_imports and selective_scan_cuda is False
