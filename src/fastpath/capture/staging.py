"""Row files written by background threads while the device runs the next batch.

Why: at ~40 KB per token (4 states of a 5120-wide model in bf16) a row costs as much to move
and write as to compute, so the copy and the write must overlap the next forward. Per row the
main thread takes a staging slot (a host buffer sized for the longest row; pinned when the
states are on a GPU), builds the layout's tensors on the device (a stack or a concat there is
nearly free) and queues one non-blocking device->host copy of each on a side stream; a writer
thread waits for that copy, writes the files (temp + rename, see writers.atomic_write) and
gives the slot back. `copy` and `queue` are two calls so that the capture loop can start a
batch's copies while its checks are still on the device and queue the rows only once they
passed (`release` when they failed): nothing unchecked is ever written.

Bounded: at most `slots` rows are staged or being written; when all are taken the main thread
waits (the time is counted as `wait_s`), so host memory stays at slots x slot_bytes. A write
that fails is re-raised in the main thread, as a FastpathError naming the row, at its next
`copy` or `wait`. `close` lets every queued row finish (whole files only, so Ctrl-C leaves
complete rows, never half-written ones) and stops the threads without raising.

Each staged tensor gets a storage of exactly its own bytes (`_Slot.carve`): torch.save writes
a tensor's whole storage, so views of one big buffer would change the SpecForge files.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastpath.shared.errors import FastpathError

_ALIGN = 256  # bytes; every staged tensor starts on this boundary
_COPY_STREAMS: dict[Any, Any] = {}  # device -> side stream for device->host copies


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def slot_bytes(shapes: Sequence[tuple[int, ...]], dtype: Any) -> int:
    """Bytes a slot needs to stage tensors of these shapes."""
    import math

    return sum(_aligned(math.prod(s) * dtype.itemsize) for s in shapes)


class _Slot:
    def __init__(self, nbytes: int, pin: bool) -> None:
        import torch

        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.array = self.buffer.numpy()  # shares the memory; numpy slices make exact storages

    def carve(self, tensors: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """(copy targets, tensors to save) for `tensors`: the same bytes of this slot, as views
        of the (pinned) buffer for the copy and as storages of exactly their own size to save."""
        import torch

        targets, saved = [], []
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if offset + n > self.buffer.numel():
                raise FastpathError(f"staging slot of {self.buffer.numel()} bytes is too small for this row")
            targets.append(self.buffer[offset:offset + n].view(t.dtype).view(t.shape))
            saved.append(torch.from_numpy(self.array[offset:offset + n]).view(t.dtype).view(t.shape))
            offset += _aligned(n)
        return targets, saved


@dataclass
class Staged:
    """One row copied (or being copied) into a slot, not yet handed to the writers."""

    idx: int
    slot: _Slot
    event: Any  # the copy's CUDA event; None when the copy was synchronous
    saved: list[Any]
    write: Callable[[list[Any]], None]


class RowWrites:
    """Stage rows to host slots and write them on `threads` background threads (module doc)."""

    def __init__(self, slots: int, nbytes: int, pin: bool, threads: int = 4) -> None:
        self.free: queue.Queue[_Slot] = queue.Queue()
        start = time.perf_counter()
        for _ in range(max(1, slots)):  # allocated now: page-locking is slow, keep it out of the loop
            self.free.put(_Slot(nbytes, pin))
        self.alloc_s = time.perf_counter() - start
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.lock = threading.Lock()
        self.failure: tuple[int, BaseException] | None = None
        self.outstanding = 0
        self.idle = threading.Condition(self.lock)
        self.wait_s = 0.0
        self.threads = [threading.Thread(target=self._work, name=f"fastpath-capture-write-{i}", daemon=True)
                        for i in range(max(1, threads))]
        for thread in self.threads:
            thread.start()

    def copy(self, idx: int, tensors: Sequence[Any], write: Callable[[list[Any]], None], after: Any = None) -> Staged:
        """Take a slot and start the copy of `tensors` (one row's stored tensors, on any device)
        into it (on a GPU: queued on a side stream, nothing waits), without writing anything yet:
        `queue` hands it to the writers, which call write(host tensors); `release` gives the slot
        back unwritten (a batch whose checks failed). Raises a writer thread's earlier failure.
        `after`: the CUDA event the tensors are ready at (default: all work queued so far on the
        current stream; an event lets the copy be queued after later work without waiting for it)."""
        import torch

        slot = self._take()
        try:
            targets, saved = slot.carve(tensors)
            event = None
            if tensors and tensors[0].is_cuda:
                device = tensors[0].device
                stream = _COPY_STREAMS.get(device)
                if stream is None:
                    stream = _COPY_STREAMS[device] = torch.cuda.Stream(device=device)
                if after is not None:
                    stream.wait_event(after)
                else:
                    stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    for src, dst in zip(tensors, targets, strict=True):
                        dst.copy_(src, non_blocking=True)
                        src.record_stream(stream)  # the allocator must not reuse src before the copy ran
                    event = torch.cuda.Event()
                    event.record(stream)
            else:
                for src, dst in zip(tensors, targets, strict=True):
                    dst.copy_(src)
        except BaseException:
            self.free.put(slot)
            raise
        return Staged(idx, slot, event, saved, write)

    def queue(self, staged: Staged) -> None:
        """Hand a copied row to the writer threads."""
        with self.lock:
            self.outstanding += 1
        self.jobs.put((staged.idx, staged.slot, staged.event, staged.saved, staged.write))

    def release(self, staged: Staged) -> None:
        """Give a copied row's slot back unwritten, once its copy has landed (the slot is reused)."""
        if staged.event is not None:
            staged.event.synchronize()
        self.free.put(staged.slot)

    def wait(self) -> None:
        """Return when every queued row is on disk; raise the first failure (with its row)."""
        start = time.perf_counter()
        with self.idle:
            while self.outstanding and self.failure is None:
                self.idle.wait(0.1)
        self.wait_s += time.perf_counter() - start
        self._raise_failure()

    def close(self) -> None:
        """Let queued rows finish, then stop the threads. Never raises (wait() reports)."""
        with self.idle:
            while self.outstanding:
                self.idle.wait(0.1)
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()

    def _take(self) -> _Slot:
        start = time.perf_counter()
        try:
            while True:
                self._raise_failure()
                try:
                    return self.free.get(timeout=0.1)
                except queue.Empty:
                    continue
        finally:
            self.wait_s += time.perf_counter() - start

    def _raise_failure(self) -> None:
        if self.failure is None:
            return
        idx, exc = self.failure
        if isinstance(exc, OSError):
            raise FastpathError(f"writing row {idx} failed: {exc.strerror or exc}")
        raise FastpathError(f"writing row {idx} failed: {exc.__class__.__name__}: {exc}")

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            idx, slot, event, saved, write = job
            try:
                if event is not None:
                    event.synchronize()
                write(saved)
            except BaseException as exc:  # reported in the main thread, with the row
                with self.lock:
                    if self.failure is None:
                        self.failure = (idx, exc)
            finally:
                del saved
                self.free.put(slot)
                with self.idle:
                    self.outstanding -= 1
                    self.idle.notify_all()
