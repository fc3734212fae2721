"""Shared-memory fit of the SSD kernels' configs: one answer per device, used at launch.

An H100/H200/B200 block may use 227 KB of shared memory, an sm_120 GPU (RTX 50xx, RTX PRO 6000)
99 KB (CCCL arch_traits: https://github.com/NVIDIA/cccl/blob/main/libcudacxx/include/cuda/__device/arch_traits.h).
The state passes (`_states_kernel`, `_dstates_kernel`, `_varlen_states_kernel`) stage a whole
chunk of rows per loop step, so at float32 and chunk 128-256 every config fastpath uses on Hopper
is past the sm_120 limit, and Triton raises OutOfResources at load. So the launchers ask here:

- `target(device)`: the per-block opt-in limit and compute capability of the device the tensors
  live on (None off CUDA, unless a caller states a target with `assume_limit`, as the CPU
  compile check does per arch);
- `tile(...)`: the largest state tile (or, for the varlen walk, token block) whose cheapest config
  fits; unchanged when it already fits (so on Hopper nothing changes);
- `prune(estimate)`: an autotune `early_config_prune` dropping configs estimated over the limit.

The estimates are upper bounds fitted to ptxas's numbers for these kernels (Triton 3.9, sm_90,
sm_100, sm_120, every config: benchmarks/results/kernel_compile_sm90_sm100_sm120.json; the compile
check, benchmarks/kernel_compile_check.py, is the proof): a software pipeline of `num_stages`
keeps about (stages - 0.45) copies of the loop's dot operands for float32 on every arch, more for
16-bit operands on Hopper and B200 (per-arch offsets below), plus a little scratch. Near the limit
they err on the side of dropping a config; on Hopper every config they drop is one that does not
fit anyway.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch

SCRATCH = 4096  # layout-conversion and reduction scratch beyond the staged operands
# cudaDevAttrMaxSharedMemoryPerBlockOptin by compute capability (CCCL arch_traits, above): what
# Triton checks when it loads a kernel; for targets named without a device (the compile check)
ARCH_LIMITS = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 103: 232448,
               120: 101376, 121: 101376}
# 16-bit operands are staged differently per arch (Hopper and datacenter Blackwell keep extra
# copies for their MMA layouts): copies over float32's (stages - 0.45), measured (see the tests)
_STATE_PASS_16BIT = {90: 0.55, 100: 0.8, 120: 0.05}
_DBC_16BIT = {90: 0.0, 100: 0.25, 120: 0.0}
_ASSUMED: list[tuple[int, int]] = []  # a stated (limit, arch), innermost last


@contextlib.contextmanager
def assume_limit(limit: int, arch: int) -> Iterator[None]:
    """While inside, launches on non-CUDA tensors fit their configs to `limit` bytes on compute
    capability `arch` (90 for sm_90; the CPU compile check records each target this way)."""
    _ASSUMED.append((limit, arch))
    try:
        yield
    finally:
        _ASSUMED.pop()


@functools.cache
def _cuda_target(index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(index)
    arch = props.major * 10 + props.minor
    value = getattr(props, "shared_memory_per_block_optin", None)
    if not value:
        import triton

        value = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return int(value), arch


def target(device: torch.device) -> tuple[int, int] | None:
    """(bytes of shared memory one block may use, compute capability) of `device`; None when
    nothing bounds it (CPU tensors under Triton's interpreter)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_target(index)
    return _ASSUMED[-1] if _ASSUMED else None


def limit(device: torch.device) -> int | None:
    found = target(device)
    return found[0] if found else None


def _family(arch: int) -> int | None:
    """The measured arch a capability stages like (None: not measured, take the largest)."""
    return 120 if arch >= 120 else 100 if arch >= 100 else 90 if arch >= 90 else None


def _extra(table: dict[int, float], elem: int, arch: int) -> float:
    if elem >= 4:
        return 0.0
    family = _family(arch)
    return table[family] if family in table else max(table.values())


# ---------------------------------------------------------------- estimates (bytes)
def state_pass_bytes(BQ: int, BP: int, BN: int, elem: int, stages: int, arch: int = 0) -> int:
    """A state pass (`_states_kernel`, `_dstates_kernel`, `_varlen_states_kernel`): per loop step
    a (BQ, BP) and a (BQ, BN) operand of the dot."""
    copies = max(stages, 1) - 0.45 + _extra(_STATE_PASS_16BIT, elem, arch)
    return int(copies * BQ * (BP + BN) * elem) + SCRATCH


def dbc_bytes(BM: int, BN: int, elem: int, stages: int, arch: int = 0) -> int:
    """`_dbc_kernel`: two loops, each a (BM, BM) and a (BM, BN) operand per step."""
    copies = max(stages, 1) - 0.7 + _extra(_DBC_16BIT, elem, arch)
    return int(copies * 2 * BM * (BM + BN) * elem) + SCRATCH


def _elem(dtype: torch.dtype) -> int:
    """Bytes per staged element: float32 inputs are staged as float32 (exact "ieee" dots)."""
    return 4 if dtype == torch.float32 else 2


# ---------------------------------------------------------------- choices at launch
def state_tile(device: torch.device, dtype: torch.dtype, BQ: int, BP: int, BN: int,
               stages: int = 2) -> tuple[int, int]:
    """(BP, BN) for a state pass over chunks of BQ rows: the given tile when a `stages`-deep
    config of it fits, else the larger side halved (P first) until one does (down to 16)."""
    found = target(device)
    elem = _elem(dtype)
    while found and state_pass_bytes(BQ, BP, BN, elem, stages, found[1]) > found[0] and max(BP, BN) > 16:
        if BP >= BN:
            BP //= 2
        else:
            BN //= 2
    return BP, BN


def varlen_block(device: torch.device, dtype: torch.dtype, BQ: int, BP: int, BN: int,
                 stages: int) -> int:
    """Tokens per step of the varlen walk (not tied to the chunk): BQ, halved until the launch
    fits (down to 16)."""
    found = target(device)
    elem = _elem(dtype)
    while found and state_pass_bytes(BQ, BP, BN, elem, stages, found[1]) > found[0] and BQ > 16:
        BQ //= 2
    return BQ


def dbc_tile(device: torch.device, dtype: torch.dtype, BM: int, BN: int,
             stages: int = 2) -> int:
    """BN of `_dbc_kernel`, halved until a `stages`-deep config fits (down to 16)."""
    found = target(device)
    elem = _elem(dtype)
    while found and dbc_bytes(BM, BN, elem, stages, found[1]) > found[0] and BN > 16:
        BN //= 2
    return BN


def _first_tensor(args: dict) -> torch.Tensor | None:
    return next((v for v in args.values() if isinstance(v, torch.Tensor)), None)


def prune(estimate: Callable[[dict, int, int, int], int]) -> Callable:
    """An autotune `early_config_prune`: drops the configs whose estimate (from the launch's
    constexprs, the staged element size and the config's num_stages) is over the device's limit;
    the cheapest is kept if none fits (the launcher's tile choice makes that not happen)."""

    def early_config_prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        first = _first_tensor(named_args)
        found = target(first.device) if first is not None else None
        if not found:
            return configs
        elem = 4 if args.get("PREC") == "ieee" or args.get("UPCAST") else 2
        cost = {id(c): estimate(args, elem, c.num_stages, found[1]) for c in configs}
        kept = [c for c in configs if cost[id(c)] <= found[0]]
        return kept or [min(configs, key=lambda c: cost[id(c)])]

    return early_config_prune


def state_pass_estimate(args: dict, elem: int, stages: int, arch: int) -> int:
    return state_pass_bytes(args["BQ"], args["BP"], args["BN"], elem, stages, arch)


def dbc_estimate(args: dict, elem: int, stages: int, arch: int) -> int:
    return dbc_bytes(args["BM"], args["BN"], elem, stages, arch)
