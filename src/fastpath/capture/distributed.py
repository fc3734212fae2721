"""The same command under `torchrun --nproc-per-node N`: one process per GPU, batches dealt out
round-robin (packing.batches_for_rank), each rank writing its own rows, rank 0 writing the index.
Outside torchrun everything here is a no-op with rank 0 of 1.

The target is either replicated on every rank or sharded with FSDP2 (`--shard`, see
choose_shard): `fully_shard` on every decoder layer, then on the decoder stack, the module the
capture calls (its embeddings and final norm form the root's group; the LM head is never run
and stays where it was loaded). Activations are not sharded, so the capture hooks on the layers
see the full hidden states; transformers' own `output_hidden_states` does not (it looks the
model's class up by name in `_CAN_RECORD_REGISTRY`, transformers/utils/output_capturing.py, and
FSDP2 swaps in a subclass), which is why the capture uses its own hooks.

Why a status all-reduce after every step: a rank whose check fails must stop the others, or they
would wait forever at the final barrier; every rank runs the same number of steps (some empty).
Sharded, every forward is a collective (each layer all-gathers its weights), so within a step
every rank also runs the same number of forwards: the ranks agree on the step's count first
(ForwardBudget) and a rank with fewer rows, fewer re-checks or a failed check pads with
one-token forwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    """Free the sharded model, then destroy the group, both while the interpreter is alive.

    FSDP2 modules sit in reference cycles (their hooks), so only the garbage collector frees
    them, and they hold the group and the last collectives' gloo work objects. Left to the
    collector at interpreter exit, those C++ objects were destroyed after the interpreter was
    gone and the process aborted ("terminate called without an active exception", 2 of about
    11 2-process CPU runs; none in 50 since) after it had written everything."""
    if active:
        import gc

        import torch.distributed as dist

        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()


SHARD_MODES = ("auto", "replicate", "fsdp")
AUTO_FSDP_FRACTION = 0.75  # auto shards when the weights need more than this share of one GPU


def choose_shard(mode: str, world_size: int, device_type: str, weight_bytes: Callable[[], int],
                 device_bytes: Callable[[], int]) -> str:
    """'replicate' or 'fsdp' for --shard MODE.

    auto: fsdp under torchrun on GPUs when the weights (counted from the config, in the capture
    dtype) take more than AUTO_FSDP_FRACTION of one GPU's memory, leaving the rest for the
    activations of --batch-tokens; replicate otherwise (one process, or CPU). The sizes are
    callables so they are only computed when the answer depends on them."""
    from fastpath.shared.errors import UsageError

    if mode not in SHARD_MODES:
        raise UsageError(f"--shard must be one of {', '.join(SHARD_MODES)}, got {mode!r}")
    if mode == "fsdp" and world_size < 2:
        raise UsageError("--shard fsdp needs torchrun with 2 or more processes (one process holds the whole model)")
    if mode != "auto":
        return mode
    if world_size < 2 or device_type != "cuda":
        return "replicate"
    return "fsdp" if weight_bytes() > AUTO_FSDP_FRACTION * device_bytes() else "replicate"


def shard_decoder(parts: Any, device: Any, world: World) -> None:
    """fully_shard every decoder layer, then the decoder stack (module doc), and fill every
    rank's shards from rank 0's weights.

    Only rank 0 holds the checkpoint (on the host); the other ranks built the same modules on
    the meta device. The full state dict of rank 0's stack is taken before sharding, then
    `set_model_state_dict(..., broadcast_from_rank0=True)` sends each tensor once and every rank
    keeps its own shard on `device` (this rank's GPU, or the CPU under gloo), so neither the
    host nor one GPU ever needs more than one whole copy. Buffers are not sharded and not all
    in the state dict (rotary inverse frequencies are non-persistent): they are broadcast
    from rank 0 as they are. A stack that is sharded already is left alone."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(parts.base, FSDPModule):
        return
    full = dict(parts.base.state_dict()) if world.is_main else {}
    mesh = init_device_mesh(getattr(device, "type", "cpu"), (world.size,))
    for layer in parts.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(parts.base, mesh=mesh)
    if not world.is_main:
        # this rank's shards, allocated where they will live; the broadcast below fills them
        parts.base.to_empty(device=device)
    set_model_state_dict(parts.base, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    full.clear()
    _broadcast_buffers(parts.base, torch.device(device))
    left = [n for n, t in [*parts.base.named_parameters(), *parts.base.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"rank {world.rank}: {len(left)} tensors of the sharded model were never filled "
                           f"(first: {left[0]})")


def _broadcast_buffers(module: Any, device: Any) -> None:
    """Every buffer of `module` on `device`, with rank 0's values (meta ones allocated first)."""
    import torch
    import torch.distributed as dist

    for sub in module.modules():
        for name, buf in list(sub._buffers.items()):
            if buf is None:
                continue
            if buf.is_meta or buf.device != device:
                buf = torch.empty_like(buf, device=device) if buf.is_meta else buf.to(device)
                sub._buffers[name] = buf
            dist.broadcast(buf, src=0)


@contextmanager
def unsharded_root(parts: Any) -> Iterator[None]:
    """The decoder stack's own weights (embeddings, final norm) whole for a moment, when it is
    sharded (a collective: every rank enters); nothing to do when it is not."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(parts.base, FSDPModule):
        yield
        return
    parts.base.unshard()
    try:
        yield
    finally:
        parts.base.reshard()


class ForwardBudget:
    """Equal forward counts per step on every rank of a sharded model (module doc).

    plan(has_work, rechecks) agrees on the step's budget (1 + the most re-checks of any rank, or
    nothing when no rank has rows); pad() tops this rank up with one-token forwards of the
    decoder stack. Forwards are counted by a pre-hook on the stack, so re-check forwards count
    too and a failure part-way leaves an exact remainder."""

    def __init__(self, parts: Any, device: Any, active: bool) -> None:
        self.parts, self.device, self.active = parts, device, active
        self.count = 0
        self.budget = 0
        self.padded = 0  # padding forwards run, over the whole loop
        self.handle = parts.base.register_forward_pre_hook(self._counted)

    def _counted(self, *_: Any, **__: Any) -> None:
        self.count += 1

    def plan(self, has_work: bool, rechecks: int) -> None:
        import torch
        import torch.distributed as dist

        want = torch.tensor([1 if has_work else 0, rechecks], dtype=torch.int64,
                            device=self.device if getattr(self.device, "type", "cpu") == "cuda" else "cpu")
        if self.active:
            dist.all_reduce(want, op=dist.ReduceOp.MAX)
        work, most = (int(x) for x in want.tolist())
        self.budget = 1 + most if work else 0
        self.count = 0

    def pad(self) -> None:
        import torch

        if self.count > self.budget:
            raise RuntimeError(f"ran {self.count} forwards in a step planned for {self.budget}")
        if self.count == self.budget:
            return
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with torch.no_grad():
            while self.count < self.budget:
                self.parts.base(input_ids=ids, use_cache=False)
                self.padded += 1

    def close(self) -> None:
        self.handle.remove()
