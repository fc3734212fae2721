"""verify's fp32 oracle for hidden states (models/compare.judge_by_oracle).

In bf16 two correct paths round differently, and through a stack of recurrent layers the gap can
pass the fixed limit (BENCHMARKS.md, Session 7: a 4-layer Mamba-2.8B reached 8.9% at the logits). An fp32 run
decides whose rounding it is. These tensors are built so the answer is known: the rule must rescue
a fast path that is as far from fp32 as the reference, and must keep failing one that is not.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fastpath.models.compare import TOLERANCES, compare, judge_by_oracle  # noqa: E402


def _triple(noise_fast: float, noise_ref: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    exact = torch.randn(2, 64, 32, generator=gen, dtype=torch.float64)
    fast = exact + noise_fast * torch.randn(exact.shape, generator=gen, dtype=torch.float64)
    ref = exact + noise_ref * torch.randn(exact.shape, generator=gen, dtype=torch.float64)
    return fast.float(), ref.float(), exact.float()


def test_both_paths_equally_far_from_fp32_is_rounding_not_an_error():
    fast, ref, exact = _triple(0.05, 0.05)
    diff = compare("layer 3", fast, ref, TOLERANCES["bf16"])
    assert not diff.ok  # ~7% apart: beyond the 4% limit
    judged = judge_by_oracle([diff], [fast], [ref], [exact])[0]
    assert judged.ok
    assert judged.fast_vs_fp32 == pytest.approx(0.05, rel=0.1)
    assert judged.ref_vs_fp32 == pytest.approx(0.05, rel=0.1)


def test_a_fast_path_much_further_from_fp32_still_fails():
    fast, ref, exact = _triple(0.2, 0.01)
    diff = compare("layer 3", fast, ref, TOLERANCES["bf16"])
    judged = judge_by_oracle([diff], [fast], [ref], [exact])[0]
    assert not judged.ok
    assert judged.fast_vs_fp32 > 2 * judged.ref_vs_fp32


def test_one_wrong_token_fails_even_when_the_whole_tensor_is_close():
    """The worst token is judged too: a kernel that breaks one position (a chunk boundary, the
    first token) hides in the tensor-wide norm."""
    fast, ref, exact = _triple(0.03, 0.03)
    fast[0, 17] += 3.0 * fast[0, 17].norm() / fast.shape[-1] ** 0.5
    diff = compare("layer 1", fast, ref, TOLERANCES["bf16"])
    assert not diff.ok
    judged = judge_by_oracle([diff], [fast], [ref], [exact])[0]
    assert not judged.ok


def test_flagged_and_passing_tensors_are_left_alone():
    fast, ref, exact = _triple(0.05, 0.05)
    fast[0, 3] = float("nan")
    nan_diff = compare("layer 0", fast, ref, TOLERANCES["bf16"])
    close = compare("layer 1", ref, ref, TOLERANCES["bf16"])
    judged = judge_by_oracle([nan_diff, close], [fast, ref], [ref, ref], [exact, exact])
    assert not judged[0].ok and judged[0].fast_vs_fp32 is None
    assert judged[1] is close
