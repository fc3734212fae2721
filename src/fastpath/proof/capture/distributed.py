"""The same command under `torchrun --nproc-per-node N`: one process per GPU, the target
replicated on each, batches dealt out round-robin (packing.batches_for_rank), rank 0 writing the
index. Outside torchrun everything here is a no-op with rank 0 of 1.

Why a status all-reduce after every step: a rank whose check fails must stop the others, or they
would wait forever at the final barrier; every rank runs the same number of steps (some empty).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_from_env() -> World:
    """RANK / WORLD_SIZE / LOCAL_RANK as torchrun sets them (0 / 1 / 0 otherwise)."""
    def num(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return World(num("RANK", 0), max(1, num("WORLD_SIZE", 1)), num("LOCAL_RANK", 0))


def init(world: World, device: Any) -> tuple[bool, bool]:
    """Join the process group (NCCL on CUDA, gloo on CPU). Returns (active, owned): active when
    there is more than one process, owned when this call created the group (a caller such as a
    benchmark may have created it already, and then keeps it)."""
    if world.size == 1:
        return False, False
    import torch.distributed as dist

    if dist.is_initialized():
        return True, False
    backend = "nccl" if getattr(device, "type", "cpu") == "cuda" else "gloo"
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, **kwargs)
    return True, True


def any_failed(failed: bool, device: Any, active: bool) -> bool:
    """True on every rank when any rank reports failure."""
    if not active:
        return failed
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if failed else 0], dtype=torch.int32,
                        device=device if getattr(device, "type", "cpu") == "cuda" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def barrier(active: bool) -> None:
    if active:
        import torch.distributed as dist

        dist.barrier()


def shutdown(active: bool) -> None:
    if active:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
