"""Which hybrid model families Liger Kernel patches, and what composing it with enable() measured.

Stdlib only, no imports of Liger: the doctor reads this for a `--model` without importing
anything, routing/liger_route.py for its messages. In-process, the installed Liger's own
`MODEL_TYPE_TO_APPLY_LIGER_FN` (liger_kernel/transformers/monkey_patch.py) decides what applies;
this table is what liger-kernel 0.8.5 has for the families fastpath routes (read in its
monkey_patch.py: `apply_liger_kernel_to_qwen3_5`, `_qwen3_5_moe`, `_qwen3_next`, `_falcon_h1`).
"""

from __future__ import annotations

DIST = "liger-kernel"
MODULE = "liger_kernel"
READ_VERSION = "0.8.5"
#: liger-kernel 0.8.5's monkey_patch.py raises ImportError below this transformers release
MIN_TRANSFORMERS = "5.0.0"

#: config model_type -> Liger's patch function (liger-kernel 0.8.5, for the hybrid families)
PATCH_FUNCTIONS: dict[str, str] = {
    "qwen3_5": "apply_liger_kernel_to_qwen3_5",
    "qwen3_5_text": "apply_liger_kernel_to_qwen3_5",
    "qwen3_5_moe": "apply_liger_kernel_to_qwen3_5_moe",
    "qwen3_5_moe_text": "apply_liger_kernel_to_qwen3_5_moe",
    "qwen3_next": "apply_liger_kernel_to_qwen3_next",
    "falcon_h1": "apply_liger_kernel_to_falcon_h1",
}

#: measured on the H200 (BENCHMARKS.md; 8-layer Qwen3.5-27B shape, bf16, B=1, L=4096, train step)
MEASURED_EFFECT = ("enable() + Liger: 21.05 GiB peak vs ~39 GiB for enable() alone (-46 %), "
                   "~15 % fewer tokens/s (16.4-16.6k vs 19.4-19.8k), same loss")
SOURCE = "https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/transformers/monkey_patch.py"


def patch_function(model_type: str | None) -> str | None:
    """Liger's `apply_liger_kernel_to_<family>` for a config model_type, or None."""
    return PATCH_FUNCTIONS.get(model_type or "")
