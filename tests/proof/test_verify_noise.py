"""`verify --backward` in fp32 failed for some seeds on A_log / dt_bias
gradients. Not a kernel error: those gradients are sums over every token and head of a decay term,
and fp32 rounding alone moves them by up to ~1e-2 (models/compare.py judge_by_noise has the
float64 measurements). verify now judges a gradient beyond its limit against the reference's own
rounding noise, so the verdict is seed-stable, and a kernel whose backward is off by 1% still FAILs.

CPU, Triton interpreter (scripts/test.sh sets TRITON_INTERPRET=1), a 2-layer model 32 wide.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_configs import QWEN35_2L as TINY_QWEN35

import fastpath
from fastpath.causal_conv1d import causal_conv1d_fn as real_causal_conv1d_fn
from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.models.compare import NOISE_SLACK, TOLERANCES
from fastpath.proof.run_paths import verify_model

pytestmark = pytest.mark.skipif(not triton_interpreter_on(), reason="needs TRITON_INTERPRET=1 (kernels on CPU)")

# Seed 6 of this model: dt_bias's gradient differs between the paths by about the fp32 limit (1e-3):
# 2.6e-3 on one CPU, 9.9e-4 on another, 1.8e-2 on an AMD EPYC (the BLAS's summation order), its
# rounding noise 6e-3. The first test lowers the gradient limit to GRAD_LIMIT so that the
# difference is beyond it on every machine and the noise judge must settle it. Both paths take transformers' own loss here
# (FASTPATH_LM_LOSS=off): the difference is then the conv / gated-delta numerics alone. With the
# fused LM-head loss on the fast path the difference depends on that op's rounding too (1.7e-3
# before its log-sum-exp was kept as m + log s, below 1e-3 after), which is not what this test is
# about.
ILL_CONDITIONED_SEED = 6
GRAD_LIMIT = 1e-4


@pytest.fixture(autouse=True)
def _leave_fastpath_disabled(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FASTPATH_LM_LOSS", "off")
    yield
    fastpath.disable()


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_QWEN35))
    return str(path)


def conv_backward_one_percent_off(x, weight, bias=None, seq_idx=None, initial_states=None,
                                  return_final_states=False, final_states_out=None, activation=None):
    """The real kernel's forward, exactly; its gradients scaled by 1.01."""
    out = real_causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, initial_states=initial_states,
                                return_final_states=return_final_states, final_states_out=final_states_out,
                                activation=activation)
    y, state = out if isinstance(out, tuple) else (out, None)
    y = y.detach() + 1.01 * (y - y.detach())  # same values, 1% more gradient
    return (y, state) if isinstance(out, tuple) else y


def test_an_ill_conditioned_gradient_passes_against_the_references_own_rounding_noise(tiny, monkeypatch):
    monkeypatch.setitem(TOLERANCES, "fp32", replace(TOLERANCES["fp32"], grad_rel=GRAD_LIMIT))
    result = verify_model(tiny, dtype="fp32", seq_len=32, batch=2, backward=True, decode_tokens=0,
                          seed=ILL_CONDITIONED_SEED)
    # the same function (no problem); whether every op ran a fast kernel is the verdict's business
    assert not result.problems, result.problems
    judged = {g.name: g for g in result.grads or [] if g.noise is not None}
    assert "model.layers.0.linear_attn.dt_bias" in judged  # beyond the limit: its noise was measured
    dt_bias = judged["model.layers.0.linear_attn.dt_bias"]
    # passed by the noise rule, not the limit (the noise itself is below the difference on some
    # CPUs: 6.2e-3 against 1.8e-2 on an AMD EPYC's MKL, within the slack)
    assert dt_bias.rel > GRAD_LIMIT and dt_bias.ok and dt_bias.rel <= NOISE_SLACK * dt_bias.noise
    # every other gradient kept the plain limit
    assert all(g.rel <= GRAD_LIMIT for g in result.grads or [] if g.noise is None)


def test_a_backward_that_is_one_percent_off_still_fails(tiny):
    result = verify_model(tiny, dtype="fp32", seq_len=32, batch=2, backward=True, decode_tokens=0,
                          seed=ILL_CONDITIONED_SEED, enable_kwargs={"causal_conv1d_fn": conv_backward_one_percent_off})
    assert result.first_divergence is None  # the forward is exact ...
    assert result.verdict == "FAIL"  # ... the gradients are not
    bad = [g for g in result.grads or [] if not g.ok]
    assert any(g.name.endswith("conv1d.weight") for g in bad)
    assert all(g.noise is not None and g.rel > 8 * g.noise for g in bad)
    assert any("rounding noise" in p for p in result.problems)
