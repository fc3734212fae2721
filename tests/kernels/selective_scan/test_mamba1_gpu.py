"""GPU: the four Mamba-1 families through enable() on CUDA tensors (no interpreter, no lifted gate,
no mamba-ssm): logits, greedy decode and a training step (mamba's fused mamba_inner_fn, the others'
unfused path) agree with transformers' torch path in float32, and fastpath's Triton scan, its
backward and the decode update ran. `fastpath verify` covers the real shapes in eval mode; this
covers model.train(), where mamba takes the fused op. Run by parts.sh's sscan test group."""

from __future__ import annotations

import pytest
import torch

import fastpath
from fastpath.kernels.counters import CALLS, reset

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("transformers")
from kernel_checks import sscan_bwd_counter, sscan_fwd_counter  # noqa: E402
from matrix_worker import build_mamba1, run_model, train_step  # noqa: E402

TOL = 2e-4  # float32, relative to the logits' scale


@pytest.fixture(autouse=True)
def _disabled():
    fastpath.disable()
    yield
    fastpath.disable()


@pytest.mark.parametrize("family", ["mamba", "falcon_mamba", "jamba", "zamba"])
def test_family_on_cuda_matches_the_torch_path(family: str) -> None:
    model = build_mamba1(family).cuda()
    ids = torch.randint(3, 64, (2, 96), generator=torch.Generator().manual_seed(1)).cuda()
    ref_logits, ref_gen = run_model(model, ids, 4)
    ref_loss, ref_grads = train_step(model, ids)
    fastpath.enable(warn=False, mamba_ssm="fastpath")
    rows = [r for r in fastpath.explain(model).rows if r["op"] in ("selective_scan_fn", "selective_state_update")]
    assert rows and all(r["fast"] and r["impl"] == "fastpath-triton" for r in rows), rows
    reset()
    logits, gen = run_model(model, ids, 4)
    assert CALLS[sscan_fwd_counter()] >= 1 and CALLS["ss_update:triton"] >= 1, dict(CALLS)
    scale = max(1.0, float(ref_logits.abs().max()))
    assert float((logits - ref_logits).abs().max()) <= TOL * scale
    assert gen == ref_gen
    reset()
    loss, grads = train_step(model, ids)
    assert CALLS[sscan_bwd_counter()] >= 1, dict(CALLS)
    assert abs(loss - ref_loss) <= TOL * 10
    for name, g in ref_grads.items():
        rel = float((grads[name] - g).abs().max()) / max(1e-6, float(g.abs().max()))
        assert rel <= 2e-3, (name, rel)
