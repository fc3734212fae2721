"""fastpath.enable()/disable()/explain()/assert_fast() in-process, with the system python's
transformers (5.17.0) and tiny random models; plus fresh-interpreter cases (enable before import,
CPU without the Triton interpreter, fla-core on the path). Kernel calls are counted at fastpath's
own entry points (fastpath.kernels.counters.CALLS); nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from repo_paths import ROOT, SUPPORT  # noqa: E402

import fastpath  # noqa: E402
from fastpath.kernels.counters import CALLS, reset  # noqa: E402
from fastpath.routing.conv_route import seq_idx_from_cu_seqlens  # noqa: E402
from fastpath.routing.fla_route import chunk_backward_unsafe  # noqa: E402
from fastpath.shared.errors import FastpathError, UsageError  # noqa: E402

FLA_DIR = ROOT / ".venvs" / "fla"
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
ATOL = 1e-4


def tiny_qwen3_5(seed: int = 0):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(cfg).eval()


def tiny_lfm2(seed: int = 0):
    from transformers import Lfm2Config, Lfm2ForCausalLM

    cfg = Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, layer_types=["conv", "full_attention"],
                     conv_L_cache=3, block_auto_adjust_ff_dim=False)
    torch.manual_seed(seed)
    return Lfm2ForCausalLM(cfg).eval()


@pytest.fixture(autouse=True)
def _always_disable():
    fastpath.disable()
    yield
    fastpath.disable()


IDS = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def test_explain_without_enable_names_the_torch_fallback() -> None:
    table = fastpath.explain(tiny_qwen3_5())
    conv = [r for r in table.rows if r["op"].startswith("causal_conv1d")]
    assert {r["layer_type"] for r in table.rows} == {"Qwen3_5GatedDeltaNet"}
    assert {r["op"] for r in table.rows} == {"causal_conv1d_fn", "causal_conv1d_update",
                                             "chunk_gated_delta_rule", "recurrent_gated_delta_rule",
                                             "gated_rmsnorm"}
    assert conv and all(not r["fast"] and r["impl"].startswith("torch fallback") for r in conv)
    assert table.slow_count == len(table.rows)
    with pytest.raises(FastpathError) as err:
        fastpath.assert_fast(tiny_qwen3_5())
    assert "causal_conv1d_fn" in str(err.value) and "torch fallback" in str(err.value)


def test_enable_routes_built_model_and_disable_restores() -> None:
    model = tiny_qwen3_5()
    ref = logits(model)
    report = fastpath.enable(warn=False)
    assert report.conv_impl == "fastpath"
    assert "transformers.models.qwen3_5.modeling_qwen3_5" in report.modules_patched
    reset()
    fast = logits(model)
    assert torch.allclose(fast, ref, atol=ATOL)
    assert sum(n for k, n in CALLS.items() if k.startswith("fwd:")) == 1  # one linear-attention layer
    rows = {r["op"]: r for r in fastpath.explain(model).rows}
    want = "fastpath-triton (interpreter)" if INTERP else "fastpath (torch reference on cpu)"
    assert rows["causal_conv1d_fn"]["impl"] == want
    assert rows["causal_conv1d_update"]["impl"] == want
    fastpath.disable()
    reset()
    assert torch.equal(logits(model), ref)
    assert sum(CALLS.values()) == 0
    assert fastpath.explain(model).rows[0]["impl"].startswith("torch fallback")


def test_generate_with_cache_uses_the_update_kernel() -> None:
    model = tiny_lfm2()
    ids = IDS[:1, :6]
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    fastpath.enable(warn=False)
    reset()
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got, ref)
    assert CALLS["update:triton" if INTERP else "update:reference"] == 3  # 4 tokens: 1 prefill + 3 decode
    assert sum(n for k, n in CALLS.items() if k.startswith("fwd:")) == 1


def test_a_wrong_kernel_routed_through_the_public_api_shows_up() -> None:
    """Proves the route is live: a deliberately wrong causal_conv1d_fn changes the logits."""
    from fastpath import causal_conv1d as face

    def scaled(x, weight, bias=None, **kwargs):
        return 100.0 * face.causal_conv1d_fn(x, weight, bias, **kwargs)

    model = tiny_lfm2()
    ref = logits(model)
    fastpath.enable(causal_conv1d_fn=scaled, warn=False)
    wrong = logits(model)
    assert (wrong - ref).abs().max() > 1e-2
    assert any("override scaled" in r["impl"] for r in fastpath.explain(model).rows)
    fastpath.disable()
    assert torch.equal(logits(model), ref)


def test_enable_disable_enable_in_one_process() -> None:
    model = tiny_lfm2()
    ref = logits(model)
    for _ in range(2):
        fastpath.enable(warn=False)
        fastpath.enable(warn=False)  # re-enable replaces, does not stack
        reset()
        assert torch.allclose(logits(model), ref, atol=ATOL)
        assert sum(n for k, n in CALLS.items() if k.startswith("fwd:")) == 1
        fastpath.disable()
        reset()
        assert torch.equal(logits(model), ref) and not CALLS


def test_suspended_is_the_reference_path_and_resumes_the_same_routing() -> None:
    """capture's re-checks run the reference inside an enabled run: suspended() must be exactly
    disable() inside and exactly the same enable() after (a wrong kernel proves which one runs)."""
    from fastpath import causal_conv1d as face
    from fastpath.routing.engine import is_enabled, suspended

    def scaled(x, weight, bias=None, **kwargs):
        return 100.0 * face.causal_conv1d_fn(x, weight, bias, **kwargs)

    for model in (tiny_lfm2(), tiny_qwen3_5()):
        ref = logits(model)
        fastpath.enable(causal_conv1d_fn=scaled, warn=False)
        wrong = logits(model)
        assert (wrong - ref).abs().max() > 1e-2
        before = [r["impl"] for r in fastpath.explain(model).rows]
        for _ in range(2):
            with suspended():
                reset()
                assert torch.equal(logits(model), ref) and not CALLS
                assert is_enabled()
            assert torch.equal(logits(model), wrong)
            assert [r["impl"] for r in fastpath.explain(model).rows] == before
        fastpath.disable()
        assert torch.equal(logits(model), ref)
    with suspended():  # not enabled: nothing to suspend
        assert not is_enabled()
    model = tiny_lfm2()
    ref = logits(model)
    fastpath.enable(causal_conv1d_fn=scaled, warn=False)
    with suspended():
        fastpath.disable()  # a disable() inside is not undone on the way out
    assert not is_enabled() and torch.equal(logits(model), ref)


def test_model_built_after_enable() -> None:
    ref = logits(tiny_lfm2(seed=3))
    fastpath.enable(warn=False)
    model = tiny_lfm2(seed=3)
    reset()
    assert torch.allclose(logits(model), ref, atol=ATOL)
    assert sum(CALLS.values()) >= 1


@pytest.mark.skipif(not INTERP, reason="on CPU without TRITON_INTERPRET=1 the kernels' reference runs (slow)")
def test_assert_fast_passes_when_every_op_is_routed() -> None:
    model = tiny_lfm2()
    fastpath.enable(warn=False)
    fastpath.assert_fast(model)
    qwen = tiny_qwen3_5()
    with pytest.raises(FastpathError) as err:  # gated delta rule stays torch without fla
        fastpath.assert_fast(qwen)
    assert "chunk_gated_delta_rule" in str(err.value)


def test_assert_fast_without_any_conv_layer_is_an_error() -> None:
    with pytest.raises(FastpathError):
        fastpath.assert_fast(torch.nn.Linear(2, 2))


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        fastpath.enable(gated_delta_rule="sometimes")
    if not INTERP:
        with pytest.raises(UsageError):
            fastpath.enable(lift_device_gate=True)


def test_seq_idx_from_cu_seqlens() -> None:
    got = seq_idx_from_cu_seqlens(torch.tensor([0, 2, 5, 6]), 6, torch.device("cpu"))
    assert got.tolist() == [[0, 0, 1, 1, 1, 2]] and got.dtype == torch.int32
    assert seq_idx_from_cu_seqlens(torch.tensor([0, 2, 5]), 6, torch.device("cpu")) is None


def test_packed_conv_keeps_sequences_apart_via_cu_seq_lens() -> None:
    """5.17's GatedDeltaNet passes the flash-attention kwargs (cu_seq_lens_q) to causal_conv1d_fn
    but not seq_idx; the route derives seq_idx so packed sequences do not leak into each other."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    torch.manual_seed(0)
    x = torch.randn(1, 12, 11)
    w = torch.randn(12, 4)
    ref_fn = m.causal_conv1d_fn.__wrapped__  # transformers' torch reference, unpacked
    sep = torch.cat([ref_fn(x[..., :4], w, None, activation="silu"),
                     ref_fn(x[..., 4:], w, None, activation="silu")], dim=-1)
    fastpath.enable(warn=False)
    got = m.causal_conv1d_fn(x, w, None, activation="silu", cu_seq_lens_q=torch.tensor([0, 4, 11]))
    assert torch.allclose(got, sep, atol=1e-5)
    leaky = m.causal_conv1d_fn(x, w, None, activation="silu")
    assert not torch.allclose(leaky, sep, atol=1e-3)


def _fresh(code: str, env_extra: dict[str, str] | None = None, pythonpath: list[str] | None = None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([*(pythonpath or []), str(ROOT / "src")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


HELPERS = (f"import sys; sys.path[:0] = {[str(Path(__file__).resolve().parent), str(SUPPORT)]!r}\n"
           "from test_enable import tiny_qwen3_5, tiny_lfm2\n")


def test_enable_before_transformers_is_imported() -> None:
    out = _fresh(HELPERS.replace("from test_enable", "import fastpath\nfastpath.enable(warn=False)\nfrom test_enable") + """
import json, torch
from fastpath.kernels.counters import CALLS
assert "transformers.models.qwen3_5.modeling_qwen3_5" not in sys.modules or True
model = tiny_qwen3_5()
ids = torch.randint(3, 64, (1, 7))
with torch.no_grad():
    fast = model(ids).logits
calls = dict(CALLS)
import transformers.models.qwen3_5.modeling_qwen3_5 as m
patched = getattr(m.causal_conv1d_fn, "__fastpath_route__", None)
fastpath.disable()
restored = hasattr(m.causal_conv1d_fn, "__wrapped__") and not hasattr(m.causal_conv1d_fn, "__fastpath_route__")
with torch.no_grad():
    ref = model(ids).logits
print(json.dumps({"calls": calls, "patched": patched, "restored": restored,
                  "diff": float((fast - ref).abs().max())}))
""")
    assert out["patched"] == "causal_conv1d_fn"
    assert out["restored"]
    assert sum(n for k, n in out["calls"].items() if k.startswith("fwd:")) == 1
    assert out["diff"] <= ATOL


def test_cpu_without_interpreter_takes_the_reference() -> None:
    out = _fresh(HELPERS + """
import json, torch, fastpath
from fastpath.kernels.counters import CALLS
model = tiny_lfm2()
fastpath.enable(warn=False)
with torch.no_grad():
    model(torch.randint(3, 64, (1, 5)))
print(json.dumps({"calls": dict(CALLS), "rows": fastpath.explain(model).rows}))
""", env_extra={"TRITON_INTERPRET": "0"})
    assert out["calls"].get("fwd:reference") == 1 and "fwd:triton" not in out["calls"]
    conv = [r for r in out["rows"] if r["op"] == "causal_conv1d_fn"]
    assert conv[0]["impl"] == "fastpath (torch reference on cpu)" and not conv[0]["fast"]


def test_chunk_backward_guard_matches_fla_640() -> None:
    assert chunk_backward_unsafe((9, 0), "3.6.0", False)
    assert chunk_backward_unsafe((9, 0), "3.4.0", False)
    assert chunk_backward_unsafe((9, 0), "3.7.1", False) is None
    assert chunk_backward_unsafe((9, 0), "3.6.0", True) is None        # tilelang backend works
    assert chunk_backward_unsafe((10, 0), "3.6.0", False) is None       # Blackwell unaffected
    assert chunk_backward_unsafe((9, 0), "3.3.1", False) is None
    assert chunk_backward_unsafe(None, "3.6.0", False) is None          # no GPU: nothing to refuse


def test_fla_forward_torch_backward_gradients_match_autograd() -> None:
    """The #640 fallback's autograd.Function: forward from one implementation, backward recomputed
    through transformers' torch reference. Here both are the torch reference, so gradients must
    equal plain autograd (inputs, initial state and final-state gradient included)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from fastpath.routing.fla_route import _fla_forward_torch_backward

    raw = m.torch_chunk_gated_delta_rule.__wrapped__
    g = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 10, 2, 8, 8
    q, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    gate = -torch.rand(B, T, H, generator=g)
    beta = torch.rand(B, T, H, generator=g)
    h0 = torch.randn(B, H, K, V, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gate, beta, h0)]
    twins = [t.clone().requires_grad_(True) for t in (q, k, v, gate, beta, h0)]
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    o1, s1 = raw(*leaves[:3], g=leaves[3], beta=leaves[4], initial_state=leaves[5], **kw)
    fn = _fla_forward_torch_backward(raw, raw)
    o2, s2 = fn(*twins[:3], g=twins[3], beta=twins[4], initial_state=twins[5], **kw)
    assert torch.allclose(o1, o2) and torch.allclose(s1, s2)
    (o1.square().sum() + s1.sum()).backward()
    (o2.square().sum() + s2.sum()).backward()
    for a, b in zip(leaves, twins, strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-5), (a.grad - b.grad).abs().max()


@pytest.mark.skipif(not (FLA_DIR / "fla" / "__init__.py").exists(),
                    reason="fla-core not installed in .venvs/fla (scripts/setup_fla.sh)")
def test_real_fla_is_routed_for_cuda_and_cpu_stays_on_torch() -> None:
    """fla-core 0.6.0 importable: enable() routes the gated delta rule to it; CPU tensors (FLA's
    kernels need a GPU) keep transformers' torch reference, so CPU results are unchanged."""
    out = _fresh(HELPERS + f"""
import json, torch, fastpath
model = tiny_qwen3_5()
ids = torch.randint(3, 64, (1, 7))
with torch.no_grad():
    ref = model(ids).logits
sys.path.insert(0, {str(FLA_DIR)!r})
report = fastpath.enable(warn=False)
with torch.no_grad():
    fast = model(ids).logits
rows = fastpath.explain(model).rows
print(json.dumps({{"gdn": report.gated_delta_rule, "reason": report.gated_delta_rule_reason,
                  "rows": rows, "diff": float((fast - ref).abs().max())}}))
""")
    assert out["gdn"] == "fla", out["reason"]
    gdn = [r for r in out["rows"] if "gated_delta_rule" in r["op"]]
    assert gdn and all(r["impl"].startswith("torch (cpu tensors; FLA routed for CUDA)") for r in gdn)
    assert out["diff"] <= ATOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fast_path_matches_reference() -> None:  # pragma: no cover - device only
    model = tiny_qwen3_5().cuda()
    ids = IDS.cuda()
    ref = logits(model, ids)
    fastpath.enable(warn=False)
    reset()
    assert torch.allclose(logits(model, ids), ref, atol=1e-3)
    assert CALLS["fwd:triton"] >= 1
