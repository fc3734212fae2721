"""fastpath capture's background writes and shard choice: staged rows give the same bytes as
writing the stacked tensors directly, a failed write names its row in the main thread, staged
rows never exceed the slots, and --shard auto picks FSDP only when the weights do not fit.

CPU, no model forwards (the end-to-end runs, FSDP included, are in tests/capture/test_capture.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("datasets")

import torch

from fastpath.capture.distributed import choose_shard
from fastpath.capture.staging import RowWrites, slot_bytes
from fastpath.capture.writers import (
    SpecForgeWriter,
    SpeculatorsWriter,
    atomic_write,
    remove_stale_temps,
)
from fastpath.shared.errors import FastpathError, UsageError

# One key: safetensors keeps metadata in a Rust HashMap, so with several keys their order in the
# header changes from call to call (it did before staging too); the tensor bytes never do.
META = {"fastpath_path": "fast"}


def _states(seq: int, hidden: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    aux = [torch.randn(seq, hidden, generator=gen).to(torch.bfloat16) for _ in range(3)]
    pre = torch.randn(seq, hidden, generator=gen).to(torch.bfloat16)
    post = torch.randn(seq, hidden, generator=gen).to(torch.bfloat16)
    return aux, pre, post


def _stage_all(writer, rows: dict[int, tuple], slots: int = 2, threads: int = 2, device: str = "cpu") -> RowWrites:
    hidden = next(iter(rows.values()))[1].shape[-1]
    longest = max(aux[0].shape[0] for aux, *_ in rows.values())
    meta_state = torch.empty(longest, hidden, dtype=torch.bfloat16, device="meta")
    shapes = [tuple(t.shape) for t in writer.layout([meta_state] * 3, meta_state, meta_state)]
    writes = RowWrites(slots, slot_bytes(shapes, torch.bfloat16), pin=device == "cuda", threads=threads)
    try:
        for idx, (aux, pre, post, ids, mask) in rows.items():
            aux, pre, post = [a.to(device) for a in aux], pre.to(device), post.to(device)
            stored = writer.layout(aux, pre if writer.needs_pre else None, post if writer.needs_post else None)
            after = None
            if device == "cuda":  # as the capture loop: the copy waits for the layout, not later work
                after = torch.cuda.Event()
                after.record()
                torch.cuda._sleep(1_000_000)

            def write(saved, idx=idx, ids=ids, mask=mask):
                writer.write_row(idx, ids, mask, saved, META)

            writes.queue(writes.copy(idx, stored, write, after=after))
        writes.wait()
    finally:
        writes.close()
    return writes


def _rows(lengths: list[int], hidden: int = 24) -> dict[int, tuple]:
    rows = {}
    for idx, n in enumerate(lengths):
        aux, pre, post = _states(n, hidden, seed=idx)
        rows[idx] = (aux, pre, post, torch.arange(n) + idx, (torch.arange(n) % 2).long())
    return rows


_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs a CUDA GPU")])


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_staged_rows_are_byte_identical_to_writing_the_stacked_tensors(fmt, device, tmp_path):
    """On a GPU this covers the pinned slots, the side-stream copies waiting on the layout's event
    (with later work queued behind it) and the event the writer threads wait on: 2 slots for 12
    rows, so slots are reused while copies are in flight."""
    import safetensors.torch as st

    writer = (SpeculatorsWriter if fmt == "speculators" else SpecForgeWriter)(tmp_path / "staged")
    rows = _rows([7, 13, 5, 13, 64, 1, 9, 33, 13, 2, 40, 8], hidden=256 if device == "cuda" else 24)
    _stage_all(writer, rows, device=device)
    for idx, (aux, pre, post, ids, mask) in rows.items():
        staged = writer.row_paths(idx)[0]
        direct = tmp_path / "direct" / staged.relative_to(tmp_path / "staged")
        if fmt == "speculators":  # what the writer did before staging: stack on the host, save
            tensors = {"hidden_states": torch.stack([*aux, pre], dim=1).contiguous(), "token_ids": ids}
            atomic_write(direct, lambda tmp, t=tensors: st.save_file(t, str(tmp), metadata=META))
        else:  # torch.save names its archive after the file: the same temp name, another folder
            record = {"input_ids": ids, "loss_mask": mask,
                      "aux_hidden_state": torch.cat(aux, dim=-1).unsqueeze(0).contiguous(),
                      "hidden_state": post.unsqueeze(0).contiguous()}
            atomic_write(direct, lambda tmp, r=record: torch.save(r, tmp))
        assert staged.read_bytes() == direct.read_bytes(), idx


def test_a_failed_write_names_its_row_in_the_main_thread(tmp_path):
    (tmp_path / "hidden_states").write_text("a file where the row folder should be")
    writer = SpeculatorsWriter(tmp_path)
    with pytest.raises(FastpathError, match=r"^writing row 0 failed: "):
        _stage_all(writer, _rows([6]))
    assert not list(tmp_path.rglob(".*.tmp*"))


def test_staged_rows_never_exceed_the_slots():
    """4 threads, 2 slots: at most 2 rows are ever between staging and written."""
    lock = threading.Lock()
    state = {"now": 0, "most": 0, "written": []}
    writes = RowWrites(2, slot_bytes([(8, 4)], torch.float32), pin=False, threads=4)
    try:
        for idx in range(8):
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])

            def write(saved, idx=idx):
                time.sleep(0.01)  # a slow disk: the main thread must wait for a slot
                state["written"].append((idx, saved[0].clone()))
                with lock:
                    state["now"] -= 1

            writes.queue(writes.copy(idx, [torch.full((8, 4), float(idx))], write))
        writes.wait()
    finally:
        writes.close()
    assert state["most"] <= 3  # 2 in slots + the one being staged
    assert sorted(i for i, _ in state["written"]) == list(range(8))
    assert all(torch.equal(t, torch.full((8, 4), float(i))) for i, t in state["written"])
    assert writes.wait_s > 0


@pytest.mark.parametrize("device", ["cpu", _CUDA])
def test_a_released_copy_is_never_written_and_its_slot_is_reused(device):
    """copy -> release (a batch whose checks failed) writes nothing; copy -> queue writes the
    row's own bytes, also when the copy is still in flight on the GPU's side stream."""
    written = []
    writes = RowWrites(1, slot_bytes([(64, 32)], torch.float32), pin=device == "cuda", threads=1)
    try:
        for idx in range(4):  # one slot: every copy needs the one before given back
            row = torch.full((64, 32), float(idx), device=device)
            staged = writes.copy(idx, [row], lambda saved, idx=idx: written.append((idx, saved[0].clone())))
            if idx % 2:
                writes.release(staged)
            else:
                writes.queue(staged)
                writes.wait()
    finally:
        writes.close()
    assert [i for i, _ in written] == [0, 2]
    assert all(torch.equal(t, torch.full((64, 32), float(i))) for i, t in written)


def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path):
    keep = tmp_path / "hidden_states" / "hs_0.safetensors"
    keep.parent.mkdir()
    keep.write_bytes(b"x")
    (keep.parent / ".hs_1.safetensors.tmp4242").write_bytes(b"cut")
    (tmp_path / ".index.tmp77").mkdir()
    (tmp_path / ".index.tmp77" / "state.json").write_text("{}")
    (tmp_path / ".notes.tmpfile").write_text("not ours")
    assert remove_stale_temps(tmp_path) == 2
    assert keep.exists() and (tmp_path / ".notes.tmpfile").exists()
    assert not (tmp_path / ".index.tmp77").exists()


def test_shard_auto_picks_fsdp_only_when_the_weights_do_not_fit_one_gpu():
    gib = 2**30

    def never() -> int:
        raise AssertionError("sizes are only needed under torchrun on GPUs")

    assert choose_shard("auto", 1, "cuda", never, never) == "replicate"
    assert choose_shard("auto", 2, "cpu", never, never) == "replicate"
    assert choose_shard("auto", 8, "cuda", lambda: 54 * gib, lambda: 141 * gib) == "replicate"
    assert choose_shard("auto", 8, "cuda", lambda: 140 * gib, lambda: 141 * gib) == "fsdp"
    assert choose_shard("fsdp", 2, "cpu", never, never) == "fsdp"
    assert choose_shard("replicate", 8, "cuda", never, never) == "replicate"
    with pytest.raises(UsageError, match="needs torchrun with 2 or more processes"):
        choose_shard("fsdp", 1, "cuda", never, never)
    with pytest.raises(UsageError, match="--shard must be one of"):
        choose_shard("zero3", 2, "cuda", never, never)


def test_weight_bytes_counts_the_built_model(tmp_path: Path):
    import json

    from fastpath.models.build import build_model
    from fastpath.models.resolve import weight_bytes

    config = tmp_path / "lfm2.json"
    config.write_text(json.dumps({
        "model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "conv_bias": True,
        "layer_types": ["conv", "full_attention", "conv", "conv"]}))
    built = build_model(str(config), dtype="bf16", device="cpu")
    held = sum(p.numel() * p.element_size() for p in built.model.parameters())
    assert weight_bytes(str(config), dtype="bf16") == held
    assert weight_bytes(str(config), dtype="fp32") == 2 * held
