"""kernels.compiled_launch: the cached launcher of the conv kernels (decode step, forward, backward). The cached path itself needs a CUDA device
(tests/kernels/causal_conv1d/test_causal_conv1d.py exercises it there, alternating aligned and misaligned inputs);
these tests pin what it rests on, on any machine."""

from __future__ import annotations

import inspect

import pytest
import torch

from fastpath.kernels import compiled_launch as launch


def test_runner_call_matches_installed_triton():
    """`direct` replicates CompiledKernel[grid](...)'s launcher call; if a Triton release changes
    that call, this fails here, and on a GPU the launcher falls back to CompiledKernel[grid]."""
    from triton.compiler.compiler import CompiledKernel

    src = " ".join(inspect.getsource(CompiledKernel.__getitem__).split())
    assert launch._RUNNER_CALL in src


def test_key_separates_alignment_dtype_and_exact_ints():
    buf = torch.randn(64, dtype=torch.bfloat16)
    aligned, shifted = buf[:32], buf[1:33]  # 2-byte offset: not 16-byte aligned
    assert aligned.data_ptr() % 16 == 0
    assert launch._spec(aligned) != launch._spec(shifted)
    assert launch._spec(aligned) != launch._spec(aligned.float())
    assert launch._spec(aligned) == launch._spec(buf[8:40])  # 16 bytes further: same binary
    assert launch._spec(16) != launch._spec(32)  # ints key by value, finer than Triton


def test_profiler_hooks_are_seen():
    knobs = pytest.importorskip("triton.knobs")
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton keeps launch hooks as plain attributes")
    assert launch._hooks_set() is False

    def hook(_metadata):
        return None

    chain.add(hook)
    try:
        assert launch._hooks_set() is True
    finally:
        chain.remove(hook)
    assert launch._hooks_set() is False


def test_constexprs_must_come_last_in_order():
    from fastpath.kernels.causal_conv1d.update import _causal_conv1d_update_step_kernel as kern

    with pytest.raises(ValueError, match="constexprs must be the last"):
        launch.CachedLauncher(kern, ("SILU", "WIDTH", "HAS_BIAS", "HAS_IDX", "BLOCK_D", "S_PAD"))
    launch.CachedLauncher(kern, ("WIDTH", "SILU", "HAS_BIAS", "HAS_IDX", "BLOCK_D", "S_PAD"))
