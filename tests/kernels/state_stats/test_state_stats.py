"""fastpath's one-pass state health facts (kernels/state_stats) against their float64 reference
and against the eager facts verify judges by (models/compare.tensor_stats).

On CPU the Triton kernel runs under TRITON_INTERPRET=1 (skipped otherwise): random never-zero
states and each fault a capture has to catch, placed anywhere (one NaN, one inf, all zero,
constant, every position equal, one element differing from position 0), fp32 / fp16 / bf16,
contiguous, row-strided (a slice of a wider buffer whose rest is NaN, so a read outside the view
shows) and column-strided (copied) states, shapes around the kernel's blocks, a hypothesis sweep;
the reference path without the interpreter. states_stats (many states at once, one buffer) gives
each state's state_stats, also mixed with states only the reference takes. The `gpu` group checks a
4,096 x 5,120 state and a capture batch's worth at once.
The four facts must be exact; the mean token norm within float32 summation error.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.state_stats.fwd import BLOCK_H, BLOCK_T  # noqa: E402
from fastpath.kernels.state_stats.interface import state_stats, states_stats  # noqa: E402
from fastpath.kernels.state_stats.naive import state_stats_ref  # noqa: E402
from fastpath.models.compare import tensor_stats  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernel: needs TRITON_INTERPRET=1")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "row-strided", "col-strided"]
FAULTS = ["none", "nan", "inf", "-inf", "zero", "constant", "same", "one-differs"]


def _state(shape, dtype, fault, gen, layout="contiguous") -> torch.Tensor:
    t, h = shape
    values = torch.randn(t, h, generator=gen) * torch.exp(torch.randn(t, 1, generator=gen))
    values = values + 0.01 * torch.where(values < 0, -1.0, 1.0)
    r, c = (int(torch.randint(0, t, (1,), generator=gen)), int(torch.randint(0, h, (1,), generator=gen)))
    if fault in ("nan", "inf", "-inf"):
        values[r, c] = float(fault)
    elif fault == "zero":
        values.zero_()
    elif fault == "constant":
        values.fill_(0.75)
    elif fault in ("same", "one-differs"):
        values = values[:1].expand(t, h).clone()
        if fault == "one-differs" and t > 1:
            values[max(r, 1), c] += 1.0
    values = values.to(dtype)
    if layout == "row-strided":  # a slice of a wider [T, 2H] buffer; the other half is NaN
        out = torch.full((t, 2 * h), float("nan"), dtype=dtype)[:, :h]
    elif layout == "col-strided":
        out = torch.full((t, h, 2), float("nan"), dtype=dtype)[..., 0]
    else:
        return values
    return out.copy_(values)


def _check(state: torch.Tensor) -> None:
    got = state_stats(state)
    want = state_stats_ref(state)
    assert got.dtype == torch.float32 and got.shape == (5,) and got.device == state.device
    assert got[:4].tolist() == want[:4].tolist(), (got, want)
    assert got[:4].tolist() == tensor_stats(state.unsqueeze(0)).cpu().tolist()  # verify's facts
    g, w = float(got[4]), float(want[4])
    if w != w or abs(w) == float("inf"):
        assert g != g or g == w
    else:
        assert abs(g - w) <= 1e-5 * max(w, 1e-30), (g, w)


@needs_interp
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_fault_in_every_dtype(fault: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(FAULTS.index(fault))
    CALLS.clear()
    _check(_state((37, 300), dtype, fault, gen))
    assert CALLS["state_stats:triton"] == 1 and not CALLS["state_stats:reference"]


@needs_interp
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", ["none", "nan", "one-differs"])
def test_strided_states_read_only_their_view(layout: str, fault: str) -> None:
    _check(_state((21, 70), torch.bfloat16, fault, torch.Generator().manual_seed(1), layout))


@needs_interp
@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (2, 1), (BLOCK_T - 1, BLOCK_H + 1), (BLOCK_T, BLOCK_H),
                                   (BLOCK_T + 1, BLOCK_H - 1), (3 * BLOCK_T + 5, 2 * BLOCK_H + 3)])
@pytest.mark.parametrize("fault", ["none", "same", "one-differs", "inf"])
def test_shapes_around_the_blocks(shape: tuple[int, int], fault: str) -> None:
    """One position (never "same at every position"), one column, partial and exact blocks."""
    _check(_state(shape, torch.float32, fault, torch.Generator().manual_seed(2)))


@needs_interp
def test_hypothesis_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(t=st.integers(1, 70), h=st.integers(1, 600), dtype=st.sampled_from(DTYPES),
           fault=st.sampled_from(FAULTS), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 999))
    def sweep(t, h, dtype, fault, layout, seed):
        _check(_state((t, h), dtype, fault, torch.Generator().manual_seed(seed), layout))

    sweep()


def test_reference_path_without_the_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(3)
    for fault in FAULTS:
        CALLS.clear()
        _check(_state((9, 40), torch.bfloat16, fault, gen))
        assert CALLS["state_stats:reference"] == 1 and not CALLS["state_stats:triton"]


def test_empty_state_and_bad_shapes() -> None:
    assert state_stats(torch.empty(0, 8)).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]  # judged all-zero
    with pytest.raises(ValueError, match=r"\[T, H\]"):
        state_stats(torch.randn(2, 3, 4))


def _check_many(states: list[torch.Tensor]) -> None:
    got = states_stats(states)
    assert got.dtype == torch.float32 and got.shape == (len(states), 5) and got.device == states[0].device
    for i, state in enumerate(states):
        one = state_stats(state)
        assert got[i, :4].tolist() == one[:4].tolist(), (i, got[i], one)
        g, w = float(got[i, 4]), float(one[4])
        assert (g != g and w != w) or g == w or abs(g - w) <= 1e-6 * max(abs(w), 1e-30), (i, g, w)


@needs_interp
def test_many_states_at_once_with_every_fault_and_length() -> None:
    """One state per fault, lengths from 1 to several blocks (so the shared buffer pads), dtypes
    and layouts mixed: each row equals the state's own state_stats; one kernel call per state."""
    gen = torch.Generator().manual_seed(5)
    states = [_state((t, 70), DTYPES[k % 3], fault, gen, LAYOUTS[k % 3])
              for k, (t, fault) in enumerate(zip([1, 2, BLOCK_T, BLOCK_T + 1, 3 * BLOCK_T + 2, 5, 40, 9], FAULTS, strict=True))]
    CALLS.clear()
    _check_many(states)
    assert CALLS["state_stats:triton"] == 2 * len(states)  # states_stats', then _check_many's own


@needs_interp
def test_many_states_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    state = st.tuples(st.integers(1, 50), st.sampled_from(DTYPES), st.sampled_from(FAULTS), st.sampled_from(LAYOUTS))

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(specs=st.lists(state, min_size=1, max_size=6), h=st.integers(1, 300), seed=st.integers(0, 999))
    def sweep(specs, h, seed):
        gen = torch.Generator().manual_seed(seed)
        _check_many([_state((t, h), dtype, fault, gen, layout) for t, dtype, fault, layout in specs])

    sweep()


def test_many_states_where_the_kernel_cannot_take_one() -> None:
    """A float64 state (no Triton dtype) among others: every state goes to the reference, the
    rows still equal state_stats; without the interpreter the same."""
    gen = torch.Generator().manual_seed(6)
    states = [_state((7, 33), torch.float32, "none", gen), _state((4, 33), torch.float32, "nan", gen).double()]
    _check_many(states)


def test_many_states_refuse_nothing_and_mixed_devices() -> None:
    with pytest.raises(ValueError, match="no states"):
        states_stats([])
    with pytest.raises(ValueError, match="several devices"):
        states_stats([torch.randn(3, 4), torch.randn(3, 4, device="meta")])
    with pytest.raises(ValueError, match=r"\[T, H\]"):
        states_stats([torch.randn(3, 4), torch.randn(3)])


def test_partials_refuse_a_buffer_of_the_wrong_shape() -> None:
    from fastpath.kernels.state_stats.fwd import FIELDS, state_partials

    with pytest.raises(ValueError, match="out must be contiguous float32"):
        state_partials(torch.randn(BLOCK_T + 1, 8), out=torch.empty(1, FIELDS))


# ---------------------------------------------------------------- device only

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fault", FAULTS)
def test_gpu_at_27b_state_size(fault: str) -> None:  # pragma: no cover - device only
    """A 4,096-token Qwen3.5-27B state (hidden 5120) in bf16, each fault placed at random."""
    state = _state((4096, 5120), torch.bfloat16, fault, torch.Generator().manual_seed(4)).cuda()
    CALLS.clear()
    _check(state)
    assert CALLS["state_stats:triton"] == 1


@pytest.mark.gpu
@needs_cuda
def test_gpu_a_capture_batch_at_once() -> None:  # pragma: no cover - device only
    """Four 2,048-token rows x five 5,120-wide bf16 states (a capture batch), faults mixed in."""
    gen = torch.Generator().manual_seed(7)
    states = [_state((2048 - 37 * k, 5120), torch.bfloat16, FAULTS[k % len(FAULTS)], gen).cuda() for k in range(20)]
    _check_many(states)
