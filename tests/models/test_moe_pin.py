"""verify pins an MoE router's top-k to the reference's choices (models/moe_pin.py), and a wrong
kernel still FAILs with the pin in place.

Why the pin: on the H200 a Kimi-Linear 2-layer bf16 verify failed on router flips alone (worst
token 0.188 in the MoE layer, a decode step 0.13 off) while the only fastpath kernel involved
(causal conv) agreed to 1e-7 in fp32. CPU only: Triton interpreter, a tiny Kimi-Linear with the
48B's structure (KDA layer with a dense MLP, then an MLA layer with a sigmoid-routed MoE).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from tiny_configs import KIMI_LINEAR_2L

import fastpath
from fastpath.causal_conv1d import causal_conv1d_fn as real_causal_conv1d_fn
from fastpath.causal_conv1d import causal_conv1d_update as real_causal_conv1d_update
from fastpath.models.compare import TOLERANCES
from fastpath.models.moe_pin import PinReport, SidePins, TopkPin
from fastpath.proof.run_paths import verify_model

# Kimi-Linear at toy size (tiny_configs), with 32 experts, 8 per token
TINY_KIMI_MOE = {**KIMI_LINEAR_2L, "num_experts": 32, "num_experts_per_token": 8}


def _kimi_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers.models.kimi_linear") is not None


needs_kimi = pytest.mark.skipif(not _kimi_available(), reason="transformers without kimi_linear (< 5.17)")


@pytest.fixture(autouse=True)
def _leave_fastpath_disabled():
    yield
    fastpath.disable()


@pytest.fixture
def kimi(tmp_path: Path) -> str:
    path = tmp_path / "tiny-kimi-moe.json"
    path.write_text(json.dumps(TINY_KIMI_MOE))
    return str(path)


# --- the pin itself ---------------------------------------------------------------------------


def _router(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A sigmoid router as Kimi / DeepSeek write it: top-k of the scores, weights renormalised."""
    scores = x.sigmoid()
    idx = torch.topk(scores, k=k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, idx)
    return weights / weights.sum(-1, keepdim=True), idx


def test_replay_takes_the_recorded_choice_and_counts_the_flip():
    x = torch.tensor([[0.50, 0.40, 0.399, -1.0], [2.0, -2.0, 1.0, 0.0]], dtype=torch.float64)
    pin = TopkPin()
    with pin.recording():
        _, idx_ref = _router(x, 2)
        x.topk(2, dim=-1)
    nudged = x.clone()
    nudged[0, 2] = 0.401  # a near tie that flips row 0's second expert (1 -> 2)
    nudged.requires_grad_(True)
    _, idx_own = _router(nudged.detach(), 2)
    assert set(idx_own[0].tolist()) != set(idx_ref[0].tolist())
    report = PinReport()
    with pin.replaying(report):
        w_fast, idx_fast = _router(nudged, 2)
        values = nudged.topk(2, dim=-1).values  # the method form is pinned as well
    assert torch.equal(idx_fast, idx_ref)
    assert torch.equal(values, nudged.detach().gather(1, x.topk(2, dim=-1).indices))
    # the weights are the fast path's own scores at the reference's experts
    expected = nudged.detach().sigmoid().gather(1, idx_ref)
    assert torch.allclose(w_fast, expected / expected.sum(-1, keepdim=True))
    assert report.calls == 2 and report.rows == 4 and report.flipped_rows == 2  # row 0 in both calls
    w_fast.sum().backward()  # the gradient reaches the router input through the gather
    assert nudged.grad is not None and torch.isfinite(nudged.grad).all()
    assert "2 of 4 rows would have chosen another set" in (report.line() or "")


def test_a_call_of_another_shape_keeps_its_own_choice_and_says_so():
    pin = TopkPin()
    with pin.recording():
        torch.topk(torch.randn(3, 5), 2)
    report = PinReport()
    x = torch.randn(4, 5)
    with pin.replaying(report):
        idx = torch.topk(x, 2)[1]
    assert torch.equal(idx, x.topk(2)[1]) and report.calls == 0
    assert report.unpinned and "not pinned" in (report.line() or "")


def test_packed_calls_are_regrouped_per_layer():
    pin = TopkPin()
    a, b = torch.randn(3, 6), torch.randn(5, 6)
    with pin.recording():  # the reference runs each packed sequence alone: 2 "layers" each
        for seg in (a, b):
            torch.topk(seg, 2)
            torch.topk(seg * 2, 3)
    joined = pin.regrouped(2)
    assert [tuple(c.shape) for c in joined.calls] == [(8, 2), (8, 3)]
    report = PinReport()
    with joined.replaying(report):
        torch.topk(torch.cat([a, b]), 2)
        torch.topk(torch.cat([a, b]) * 2, 3)
    assert report.calls == 2 and report.flipped_rows == 0 and not report.unpinned


def test_side_pins_regroup_the_forward_for_the_fast_side_but_not_the_decode():
    pins = SidePins(pieces=2)
    a, b = torch.randn(3, 6), torch.randn(5, 6)
    with pins.around_pass(True):  # the reference side: each packed sequence alone
        for seg in (a, b):
            torch.topk(seg, 2)
    with pins.around_decode(True):
        torch.topk(a, 2)
    with pins.around_pass(False):  # the fast side: one call over both sequences
        torch.topk(torch.cat([a, b]), 2)
    with pins.around_decode(False):
        torch.topk(a, 2)
    assert pins.report.calls == 2 and pins.report.flipped_rows == 0 and not pins.report.unpinned
    assert [tuple(c.shape) for c in pins.forward.calls] == [(3, 2), (5, 2)]  # kept as recorded


# --- verify with the pin ----------------------------------------------------------------------


@needs_kimi
def test_bf16_moe_verify_passes_with_the_reference_choices_pinned(kimi):
    result = verify_model(kimi, dtype="bf16", seq_len=128, batch=1, backward=False, decode_tokens=3)
    assert result.matches, result.problems  # SLOW on a CPU: KDA is FLA's, for CUDA tensors only
    note = next(n for n in result.model["notes"] if n.startswith("top-k (MoE routing) pinned"))
    assert "at 12 calls" in note  # 3 per router pass: the forward, the prefill, 2 decode steps
    moe = result.layers[2]
    assert moe.kind == "full_attention"
    # what is left is rounding, as in the dense layer before it (flipped tokens measured 3e-2 .. 4e-2)
    assert moe.token_rel_max < 3 * max(result.layers[1].token_rel_max, 2e-3)


def conv_shifted_one_step(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                          final_states_out=None, activation=None):
    out = real_causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, initial_states=initial_states,
                                return_final_states=return_final_states, final_states_out=final_states_out,
                                activation=activation)
    y, state = out if isinstance(out, tuple) else (out, None)
    y = torch.cat([torch.zeros_like(y[..., :1]), y[..., :-1]], dim=-1)  # y[t] := y[t-1]
    return (y, state) if isinstance(out, tuple) else y


def update_forgetting_the_state(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                                conv_state_indices=None):
    conv_state.zero_()  # a decode kernel that loses the window: wrong from the first cached step
    return real_causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices)


@needs_kimi
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_wrong_prefill_kernel_still_fails_with_routing_pinned(kimi, dtype):
    result = verify_model(kimi, dtype=dtype, seq_len=32, batch=1, backward=True, decode_tokens=2,
                          enable_kwargs={"causal_conv1d_fn": conv_shifted_one_step})
    assert not result.ok
    assert result.first_divergence == "layer 0" and result.layers[1].kind == "linear_attention"
    assert result.layers[1].rel > TOLERANCES[dtype].rel
    assert not result.layers[2].ok  # the MoE layer after it too: the pin hides nothing upstream


@needs_kimi
def test_a_wrong_decode_kernel_still_fails_with_routing_pinned(kimi):
    result = verify_model(kimi, dtype="bf16", seq_len=32, batch=1, backward=False, decode_tokens=3,
                          enable_kwargs={"causal_conv1d_update": update_forgetting_the_state})
    assert not result.ok
    assert result.first_divergence is None  # the prefill agrees
    assert result.decode is not None and not result.decode.ok
    assert any(n.startswith("top-k (MoE routing) pinned") for n in result.model["notes"])
