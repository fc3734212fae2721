"""verify's comparison maths (models/compare.py) on hand-made tensors: the flags that catch states
wrong on both paths, the whole-tensor and per-token ratios, the decode check."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fastpath.models.compare import TOLERANCES, check_decode, compare, tensor_flags  # noqa: E402
from fastpath.models.greedy import GreedyRun  # noqa: E402


def test_tensor_flags_catch_zero_constant_nonfinite_and_position_independent_states():
    good = torch.randn(2, 8, 16)
    assert tensor_flags(good) == []
    assert tensor_flags(torch.zeros(2, 8, 16)) == ["all-zero"]
    assert tensor_flags(torch.full((2, 8, 16), 0.5)) == ["constant"]
    bad = good.clone()
    bad[0, 3, 1] = float("nan")
    assert tensor_flags(bad) == ["non-finite"]
    assert tensor_flags(good[:, :1, :].expand(2, 8, 16)) == ["same at every position"]


def test_compare_flags_an_all_zero_fast_output_even_when_the_reference_is_tiny():
    ref = torch.randn(1, 4, 8) * 1e-6
    diff = compare("layer 0", torch.zeros_like(ref), ref, TOLERANCES["fp32"])
    assert not diff.ok and "fast: all-zero" in diff.flags
    same = compare("layer 0", ref.clone(), ref, TOLERANCES["fp32"])
    assert same.ok and same.rel == 0.0


def test_error_confined_to_one_token_is_caught_by_the_token_metric():
    ref = torch.randn(1, 64, 32)
    fast = ref.clone()
    fast[0, 5] *= 1.01  # 1% off on one token of 64: whole-tensor ratio ~1.2e-3, token ratio 1e-2
    diff = compare("layer", fast, ref, TOLERANCES["fp32"])
    assert diff.token_rel_max == pytest.approx(0.01, rel=1e-3)
    assert not diff.ok


def _run(tokens, logits):
    return GreedyRun(torch.tensor(tokens), [torch.tensor(row, dtype=torch.float32) for row in logits])


def test_decode_split_at_a_near_tie_is_reported_not_failed():
    ref = _run([[3, 5]], [[[0.0, 1.0]], [[2.0, 2.0]]])
    fast = _run([[3, 6]], [[[0.0, 1.0]], [[2.0, 2.0 + 1e-7]]])
    check = check_decode(fast, ref, TOLERANCES["fp32"])
    assert check.ok and check.near_tie_step == 1 and check.identical_steps == 1


def test_decode_logits_beyond_tolerance_fail_at_that_step():
    ref = _run([[3, 5]], [[[0.0, 1.0]], [[2.0, 1.0]]])
    fast = _run([[3, 5]], [[[0.0, 1.0]], [[2.0, 1.5]]])
    check = check_decode(fast, ref, TOLERANCES["fp32"])
    assert not check.ok and "decode step 1" in check.detail


def _drift(base, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    return base + scale * torch.randn(base.shape, generator=gen)


def test_bf16_decode_drift_passes_only_when_no_further_from_fp32_than_the_reference():
    """Both paths 0.03 from exact arithmetic in independent directions: 0.042 apart, beyond
    bf16's 0.04, yet the fast path is as good as the reference (the granite-4.0-h case)."""
    tol = TOLERANCES["bf16"]
    exact = [torch.randn(2, 512, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    ref = GreedyRun(torch.tensor([[1, 2, 3], [1, 2, 3]]), [_drift(e, 0.03, 10 + i) for i, e in enumerate(exact)])
    fast = GreedyRun(ref.tokens.clone(), [_drift(e, 0.03, 20 + i) for i, e in enumerate(exact)])
    assert not check_decode(fast, ref, tol).ok  # without the oracle: beyond the limit
    check = check_decode(fast, ref, tol, oracle=exact)
    assert check.ok and "no further from an fp32 run" in check.detail and "step 0" in check.detail
    # A fast path that is wrong (three times the reference's distance to fp32) still fails.
    bad = GreedyRun(ref.tokens.clone(), [_drift(e, 0.09, 30 + i) for i, e in enumerate(exact)])
    check = check_decode(bad, ref, tol, oracle=exact)
    assert not check.ok and "decode step 0" in check.detail and "vs fp32: fast" in check.detail


def test_failing_gradients_name_each_paths_distance_to_fp32() -> None:
    """A bf16 gradient that differs from the reference says which path is off (the fp32 oracle)."""
    from fastpath.models.compare import GradDiff, TensorDiff
    from fastpath.proof.verdict import collect_problems

    ok = TensorDiff("logits", 1e-3, 2e-3, 1e-3, True)
    grads = [GradDiff("a.weight", 0.01, True, 0.01, 0.01),
             GradDiff("a.A_log", 0.72, False, 0.65, 0.05)]
    problems = collect_problems([], ok, grads, None, TOLERANCES["bf16"], fast_calls={"fwd:triton": 1},
                                ref_calls={}, explain_rows=None)
    assert problems == ["1 of 2 parameter gradients differ; first a.A_log (0.72), worst a.A_log (0.72) "
                        "(vs fp32: fast 0.65, reference 0.05), limit 0.1"]
