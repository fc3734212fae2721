"""Kimi-Linear's KDA routed to FLA by enable() (routing/fla_route.py make_kda_route).

transformers 5.17+ binds `chunk_kimi_delta_attention` / `recurrent_kimi_delta_attention` to FLA's
`chunk_kda` / `fused_recurrent_kda` once, when it imports the modeling module. verify builds its
reference with FLA hidden (models/paths.py), so before this route the fast path kept the torch
KDA (BENCHMARKS.md, Session 7: both paths on the torch fallback). These tests run in a subprocess with
fla-core on sys.path (scripts/setup_fla.sh installs it to .venvs/fla, outside the test
interpreter), like tests/kernels/gated_delta_rule/test_fla_dqkwg.py:
* enable() points both globals at FLA (CUDA tensors) and keeps the torch reference for CPU
  tensors; explain() says so; disable() restores transformers' own objects.
* FLA's fused_recurrent_kda (it runs in the Triton interpreter) computes what transformers'
  torch recurrence computes, with the arguments and the float32 cache state transformers passes,
  continuing from a state the torch *chunk* prefill produced: the decode step after a prefill.
* GPU only: the tiny model with FLA's KDA on both ops matches the torch reference (fp32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from repo_paths import ROOT, fla_aside
from tiny_configs import KIMI_LINEAR_2L as TINY_KIMI

KIMI_MODULE = "transformers.models.kimi_linear.modeling_kimi_linear"


def _kimi_available() -> bool:
    import importlib.util

    return importlib.util.find_spec(KIMI_MODULE) is not None


pytestmark = pytest.mark.skipif(not _kimi_available(), reason="transformers without kimi_linear (< 5.17)")


def _run_with_fla(code: str, tmp_path: Path) -> dict:
    fla = fla_aside()
    if fla is None:
        pytest.skip("fla not installed (run scripts/setup_fla.sh; it installs to .venvs/fla)")
    config = tmp_path / "tiny-kimi.json"
    config.write_text(json.dumps(TINY_KIMI))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), fla]), TRITON_INTERPRET="1",
               KIMI_CONFIG=str(config))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


ROUTE_CHECK = r"""
import json, os, sys, torch
from fastpath.models.build import build_model
from fastpath.models.paths import hidden_compiled_peers
from fastpath.routing import fla_route
from fastpath.routing import engine as routes

with hidden_compiled_peers():  # as verify builds its reference: transformers binds the torch KDA
    built = build_model(os.environ["KIMI_CONFIG"], dtype="fp32", device="cpu", seed=0)
model = built.model
mod = sys.modules["transformers.models.kimi_linear.modeling_kimi_linear"]
names = list(fla_route.KDA_GLOBALS)
original = {n: getattr(mod, n) for n in names}
ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    ref = model(input_ids=ids).logits
reference_rows = {r["op"]: r["impl"] for r in routes.explain(model).rows}
report = routes.enable(warn=False)
routed = {n: getattr(mod, n) for n in names}
rows = {r["op"]: r["impl"] for r in routes.explain(model).rows}
with torch.no_grad():
    fast = model(input_ids=ids).logits
import fla.ops.kda as kda
targets = {n: getattr(routed[n], "__fastpath_fla_fn__", None) for n in names}
routes.disable()
print(json.dumps({
    "summary": report.summary(), "kda": report.kda,
    "reference_rows": {n: reference_rows.get(n) for n in names},
    "rows": {n: rows.get(n) for n in names},
    "targets": {n: (t is kda.chunk_kda, t is kda.fused_recurrent_kda) for n, t in targets.items()},
    "cpu_logits_rel": float((fast - ref).norm() / ref.norm()),
    "restored": all(getattr(mod, n) is original[n] for n in names),
}))
"""


def test_enable_routes_kimi_kda_to_fla_and_disable_restores(tmp_path):
    doc = _run_with_fla(ROUTE_CHECK, tmp_path)
    assert doc["kda"] == "fla" and "Kimi-Linear KDA -> fla" in doc["summary"]
    for op in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
        assert doc["reference_rows"][op].startswith("torch fallback (fla not importable"), doc["reference_rows"]
        assert doc["rows"][op] == "torch (cpu tensors; FLA routed for CUDA)", doc["rows"]
    assert doc["targets"]["chunk_kimi_delta_attention"] == [True, False]
    assert doc["targets"]["recurrent_kimi_delta_attention"] == [False, True]
    assert doc["cpu_logits_rel"] < 1e-5  # CPU: torch KDA (and fastpath's conv in the interpreter)
    assert doc["restored"]


DECODE_STEP_CHECK = r"""
import json, sys, torch
import transformers.models.kimi_linear.modeling_kimi_linear as mod
from fla.ops.kda import fused_recurrent_kda
torch.manual_seed(0)
torch_chunk = mod.chunk_kimi_delta_attention.__wrapped__
torch_rec = mod.recurrent_kimi_delta_attention.__wrapped__
worst = {}
for B, T, H, K, V in ((1, 20, 2, 16, 16), (2, 37, 3, 32, 16)):
    q, k, v = (torch.randn(B, T + 3, H, d) for d in (K, K, V))
    g = -torch.nn.functional.softplus(torch.randn(B, T + 3, H, K)) * torch.rand(1, 1, H, 1)
    beta = torch.rand(B, T + 3, H)
    # prefill on the torch chunk rule, as the reference (and a CPU model) computes it; the cache keeps fp32
    _, state = torch_chunk(q[:, :T], k[:, :T], v[:, :T], g=g[:, :T], beta=beta[:, :T], initial_state=None,
                           output_final_state=True, use_qk_l2norm_in_kernel=True)
    s_ref = s_fla = state.to(torch.float32)
    for t in range(T, T + 3):  # three single-token decode steps, the arguments transformers passes
        args = (q[:, t:t+1], k[:, t:t+1], v[:, t:t+1])
        kw = dict(g=g[:, t:t+1], beta=beta[:, t:t+1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        o_ref, s_ref = torch_rec(*args, initial_state=s_ref, **kw)
        o_fla, s_fla = fused_recurrent_kda(*args, initial_state=s_fla, **kw)
        for name, a, b in (("o", o_fla, o_ref), ("state", s_fla, s_ref)):
            rel = float((a.double() - b.double()).norm() / b.double().norm())
            worst[name] = max(worst.get(name, 0.0), rel)
print(json.dumps(worst))
"""


def test_fla_recurrent_kda_continues_the_torch_prefill_state(tmp_path):
    worst = _run_with_fla(DECODE_STEP_CHECK, tmp_path)
    assert worst["o"] < 1e-5 and worst["state"] < 1e-5, worst


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kimi_kda_on_fla_matches_the_reference_on_cuda(tmp_path):
    pytest.importorskip("fla.ops.kda")
    from fastpath.proof.run_paths import verify_model

    path = tmp_path / "kimi.json"
    path.write_text(json.dumps({**TINY_KIMI, "hidden_size": 256, "linear_attn_config": {
        **TINY_KIMI["linear_attn_config"], "num_heads": 4, "head_dim": 64}}))
    result = verify_model(str(path), dtype="fp32", seq_len=128, batch=2, backward=True, decode_tokens=8,
                          device="cuda")
    fast = {r["op"]: r["impl"] for r in result.explain}
    assert fast["chunk_kimi_delta_attention"] == "fla" and fast["recurrent_kimi_delta_attention"] == "fla"
    assert result.ok, result.problems
