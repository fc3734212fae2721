"""fastpath verify: passes with the real kernels, FAILS when a deliberately wrong kernel is routed
in through the public API (fastpath.enable(causal_conv1d_fn=...)), and says where.

CPU only: the kernels run in the Triton interpreter (TRITON_INTERPRET=1, set by scripts/test.sh);
tiny models (hidden 32-64, 3-4 layers, 16-24 tokens) keep this under a minute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

import fastpath
from fastpath.causal_conv1d import causal_conv1d_fn as real_causal_conv1d_fn
from fastpath.models.compare import TOLERANCES
from fastpath.models.inputs import make_inputs
from fastpath.proof.run_paths import verify_model
from fastpath.routing.engine import is_enabled as fastpath_is_enabled
from fastpath.shared.errors import FastpathError

# Qwen3.5's GatedDeltaNet: conv without bias, 3 linear-attention layers + 1 attention layer.
TINY_QWEN35 = {
    "model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "vocab_size": 256,
}
# LFM2 with conv_bias=True: transformers 5.17 passes `self.conv.bias` to causal_conv1d_fn
# (modeling_lfm2.Lfm2ShortConv.forward), so a kernel that drops the bias changes the function.
TINY_LFM2_BIAS = {
    "model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "conv_bias": True,
    "layer_types": ["conv", "full_attention", "conv"],
}


@pytest.fixture(autouse=True)
def _leave_fastpath_disabled():
    yield
    fastpath.disable()


@pytest.fixture
def qwen(tmp_path: Path) -> str:
    path = tmp_path / "tiny-qwen3_5.json"
    path.write_text(json.dumps(TINY_QWEN35))
    return str(path)


@pytest.fixture
def lfm2(tmp_path: Path) -> str:
    path = tmp_path / "tiny-lfm2.json"
    path.write_text(json.dumps(TINY_LFM2_BIAS))
    return str(path)


# --- deliberately wrong kernels, with Dao's signature (transformers filters kwargs by it) -------


def conv_dropping_bias(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                       final_states_out=None, activation=None):
    return real_causal_conv1d_fn(x, weight, None, seq_idx=seq_idx, initial_states=initial_states,
                                 return_final_states=return_final_states, final_states_out=final_states_out,
                                 activation=activation)


def conv_shifted_one_step(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                          final_states_out=None, activation=None):
    out = real_causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, initial_states=initial_states,
                                return_final_states=return_final_states, final_states_out=final_states_out,
                                activation=activation)
    y, state = out if isinstance(out, tuple) else (out, None)
    y = torch.cat([torch.zeros_like(y[..., :1]), y[..., :-1]], dim=-1)  # y[t] := y[t-1]
    return (y, state) if isinstance(out, tuple) else y


# --- passes -------------------------------------------------------------------------------------


def _slow_only_for_fla_on_cpu(result) -> None:
    """The numbers agree, and the only ops not on a fast kernel are FLA's (the delta rule and the
    gated norm: torch code on a CPU, FLA routed or not installed): SLOW (4), not PASS."""
    assert result.matches, result.problems
    assert result.verdict == "SLOW" and result.exit_code == 4 and not result.ok, result.slow
    assert result.slow and all(("gated_delta_rule" in line or "gated_rmsnorm" in line) and "fla" in line.lower()
                               for line in result.slow), result.slow


def test_qwen35_fast_path_matches_reference_forward_backward_and_decode(qwen):
    result = verify_model(qwen, dtype="fp32", seq_len=24, batch=2, backward=True, decode_tokens=4)
    _slow_only_for_fla_on_cpu(result)
    assert result.first_divergence is None
    assert [d.name for d in result.layers] == ["embeddings", "layer 0", "layer 1", "layer 2", "layer 3 + final norm"]
    assert [d.kind for d in result.layers[1:]] == ["linear_attention"] * 3 + ["full_attention"]
    tol = TOLERANCES["fp32"]
    assert all(d.rel <= tol.rel and d.token_rel_max <= tol.token_rel for d in [*result.layers, result.logits])
    # the fast path really ran: forward, backward and decode-update kernels were called
    assert result.conv_kernel_calls > 0
    assert {k.split(":")[0] for k in result.fast_calls} >= {"fwd", "bwd", "update"}
    assert not any(k.split(":")[0] in ("fwd", "bwd", "update") for k in result.reference_calls)
    assert result.grads and all(g.ok for g in result.grads)
    assert {g.name for g in result.grads} >= {"model.layers.0.linear_attn.conv1d.weight"}
    assert result.decode is not None and result.decode.identical_steps == 4
    assert any(r.get("op") == "causal_conv1d_fn" and r.get("fast") for r in result.explain)
    # the backward went through the loss a training call takes: enable()'s fused LM head + CE
    assert result.fast_calls.get("linear_ce_fwd:triton", 0) == 1, result.fast_calls
    assert not any(k.startswith("linear_ce") for k in result.reference_calls)
    assert any(r.get("op") == "lm_loss" and r.get("fast") for r in result.explain)
    doc = result.to_json()
    assert doc["ok"] is False and doc["verdict"] == "SLOW" and doc["slow_ops"] == result.slow
    assert doc["conv_kernel_calls"] == result.conv_kernel_calls
    json.dumps(doc)  # serialisable as is


def test_lfm2_packed_sequences_match_each_sequence_run_alone(lfm2):
    result = verify_model(lfm2, dtype="fp32", seq_len=16, batch=2, packed=True, decode_tokens=2)
    assert result.ok, result.problems
    assert len(result.segments) == 2 and sum(result.segments) == 32
    assert min(result.segments) >= 4 and result.segments[0] != result.segments[1]
    assert result.fast_calls.get("fwd:triton", 0) > 0


def test_bf16_passes_with_its_own_tolerance(lfm2):
    result = verify_model(lfm2, dtype="bf16", seq_len=16, batch=2, decode_tokens=2)
    assert result.ok, result.problems
    assert result.dtype == "bf16" and result.tolerance == TOLERANCES["bf16"]


def test_mamba2_hidden_states_are_labelled_without_embeddings(tmp_path):
    # Mamba-style families return each layer's output and then the final norm (no embeddings).
    path = tmp_path / "tiny-mamba2.json"
    path.write_text(json.dumps({"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 8,
                                "head_dim": 16, "state_size": 16, "n_groups": 1, "vocab_size": 128, "expand": 2}))
    result = verify_model(str(path), seq_len=16, batch=1, decode_tokens=2)
    assert result.ok, result.problems
    assert [d.name for d in result.layers] == ["layer 0", "layer 1", "final norm"]
    assert result.fast_calls.get("fwd:triton", 0) > 0


# --- fails ----------------------------------------------------------------------------------------


def test_kernel_that_drops_the_bias_fails_at_the_first_conv_layer(lfm2):
    result = verify_model(lfm2, dtype="fp32", seq_len=16, batch=2, decode_tokens=2,
                          enable_kwargs={"causal_conv1d_fn": conv_dropping_bias})
    assert not result.ok
    assert result.first_divergence == "layer 0"
    layer0 = result.layers[1]
    assert layer0.kind == "conv" and not layer0.ok
    assert layer0.rel > 100 * TOLERANCES["fp32"].rel
    assert result.layers[0].ok  # embeddings do not involve the kernel
    assert any("first diverging: layer 0 (conv)" in p for p in result.problems)
    assert result.conv_kernel_calls > 0  # the wrong kernel did run (it wraps the real one)


def test_kernel_shifted_by_one_step_fails_at_the_first_linear_attention_layer(qwen):
    result = verify_model(qwen, dtype="fp32", seq_len=16, batch=2, decode_tokens=2,
                          enable_kwargs={"causal_conv1d_fn": conv_shifted_one_step})
    assert not result.ok
    assert result.first_divergence == "layer 0"
    assert result.layers[1].kind == "linear_attention"
    assert all(not d.ok for d in result.layers[1:]) and not result.logits.ok
    assert result.decode is not None and not result.decode.ok  # the prefill inside decode is shifted too


def test_packed_gated_delta_rule_on_torch_fallback_is_reported(qwen):
    # No FLA on CPU: the gated delta rule runs transformers' torch fallback, which drops
    # cu_seqlens, so packed sequences leak into each other. verify must not call that a pass:
    # it says so before any work, with the NOT VERIFIED exit code ...
    from fastpath.proof.verdict import CannotVerify

    with pytest.raises(CannotVerify, match="--packed on qwen3_5_text: packed sequences need FLA") as info:
        verify_model(qwen, dtype="fp32", seq_len=16, batch=2, packed=True, decode_tokens=0)
    assert info.value.exit_code == 3
    # ... and should a route still take the fallback, the route check names it (a FAIL).
    from fastpath.proof.verdict import packed_route_problems

    rows = [{"layer": "model.layers.0.linear_attn", "op": "chunk_gated_delta_rule", "fast": False}]
    assert any("packed sequences" in p and "cu_seqlens" in p for p in packed_route_problems(rows))


def test_a_kernel_that_raises_is_a_one_line_failure_not_a_traceback(lfm2):
    def conv_refusing(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                      final_states_out=None, activation=None):
        raise RuntimeError("no kernel image is available for execution on the device\n(more detail)")

    with pytest.raises(FastpathError, match=r"^fast path: forward raised RuntimeError: no kernel image is available") as info:
        verify_model(lfm2, seq_len=8, batch=1, decode_tokens=0, enable_kwargs={"causal_conv1d_fn": conv_refusing})
    assert "\n" not in str(info.value) and info.value.exit_code == 1
    assert not fastpath_is_enabled()  # left disabled


def test_reference_is_the_torch_fallback_even_with_fla_installed(qwen):
    # With FLA importable, transformers would bind it for the reference path (and its backward
    # refuses to run on Hopper with Triton < 3.7.1). verify hides the compiled peers while the
    # model is built, so the reference stays transformers' torch fallback.
    import os
    import subprocess
    import sys

    from repo_paths import fla_aside

    fla = fla_aside()
    if fla is None:
        pytest.skip("fla not installed (run scripts/setup_fla.sh; it installs to .venvs/fla)")
    src = str(Path(fastpath.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, fla]), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "fastpath", "verify", qwen, "--seq-len", "16", "--batch", "1",
                           "--decode-tokens", "2", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 4, proc.stderr[-2000:]  # SLOW: FLA's delta rule ran torch on CPU tensors
    doc = json.loads(proc.stdout)
    reference = {(r["op"], r["impl"]) for r in doc["reference_explain"]}
    assert ("chunk_gated_delta_rule", "torch fallback (fla not importable when transformers imported the layer)") in reference
    fast = {r["op"]: r["impl"] for r in doc["explain"]}
    assert fast["causal_conv1d_fn"].startswith("fastpath-triton")
    assert "FLA routed for CUDA" in fast["chunk_gated_delta_rule"]  # enable() still saw FLA


# --- the pieces -----------------------------------------------------------------------------------


def test_packed_inputs_carry_flattening_collator_arguments():
    inputs = make_inputs(vocab=50, batch=3, seq_len=10, packed=True, seed=0, device=torch.device("cpu"))
    assert inputs.packed_ids.shape == (1, 30) and sum(inputs.segments) == 30 and len(inputs.segments) == 3
    kw = inputs.packed_kwargs
    starts = [0, inputs.segments[0], inputs.segments[0] + inputs.segments[1]]
    assert kw["cu_seq_lens_q"].tolist() == [*starts, 30]
    assert kw["position_ids"][0, starts[1]].item() == 0 and kw["position_ids"][0, starts[1] - 1].item() > 0
    assert kw["seq_idx"][0].tolist() == [i for i, n in enumerate(inputs.segments) for _ in range(n)]


# --- the command line --------------------------------------------------------------------------------


def test_cli_verify_json_exit_0_or_4(qwen, lfm2, capsys):
    """PASS (0) where every op ran a fast kernel (lfm2: the conv is its only kernel op); a Qwen3.5
    on CPU computes the same function but its delta rule ran torch code: SLOW (4), each op named."""
    from fastpath.cli import main

    code = main(["verify", lfm2, "--seq-len", "16", "--batch", "1", "--decode-tokens", "2", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"] == "PASS" and doc["ok"] is True and doc["slow_ops"] == []
    code = main(["verify", qwen, "--seq-len", "16", "--batch", "1", "--decode-tokens", "2", "--json"])
    out = capsys.readouterr().out
    assert code == 4
    doc = json.loads(out)
    assert doc["ok"] is False and doc["dtype"] == "fp32" and doc["conv_kernel_calls"] > 0
    assert doc["verdict"] == "SLOW" and doc["not_verified"] is None and not doc["problems"]
    assert any("chunk_gated_delta_rule" in line for line in doc["slow_ops"]), doc["slow_ops"]
    assert len(doc["layers"]) == 5 and doc["decode"]["identical_steps"] == 2
    assert doc["sizing"]["parameters"] == doc["model"]["parameters"]


def test_without_a_gpu_or_the_interpreter_nothing_is_verified(qwen, capsys, monkeypatch):
    # On a CPU without TRITON_INTERPRET=1 the kernels hand every call to their torch reference:
    # both sides run torch code, so the numbers agree and prove nothing.
    from fastpath.cli import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code = main(["verify", qwen, "--seq-len", "16", "--batch", "1", "--decode-tokens", "2"])
    captured = capsys.readouterr()
    assert code == 3
    assert "NOT VERIFIED: the fast path ran the torch reference here" in captured.out
    assert "TRITON_INTERPRET=1" in captured.out and "PASS" not in captured.out
    assert "verify: reference path: forward" in captured.err and "verify: fast path: forward" in captured.err
    result = verify_model(qwen, dtype="fp32", seq_len=16, batch=1, decode_tokens=0)
    assert not result.problems and result.verdict == "NOT VERIFIED" and not result.ok
    assert result.fast_calls and all(k.endswith(":reference") for k in result.fast_calls)


def test_layers_on_a_hybrid_model_keeps_its_attention_layer(tmp_path):
    # The first two layers are conv layers; a cut to them alone could not build a decode cache
    # ("get_seq_length can only be called on Attention layers"), blamed on the reference path.
    config = dict(TINY_LFM2_BIAS, num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"])
    path = tmp_path / "lfm2-4.json"
    path.write_text(json.dumps(config))
    result = verify_model(str(path), dtype="fp32", seq_len=12, batch=1, layers=2, decode_tokens=2)
    assert result.ok, result.problems
    assert result.model["layer_types"] == ["conv", "full_attention"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["verify", "no-such-preset"], "unknown preset"),
        (["verify", "{tmp}/missing/config.json"], "does not exist"),
        (["verify", "{tmp}/malformed.json"], "malformed JSON"),
        (["verify", "{tmp}/empty-dir"], "config.json"),
        (["verify", "qwen3.5-27b", "--layers", "0"], "--layers"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    from fastpath.cli import main

    (tmp_path / "malformed.json").write_text('{"model_type": "qwen3_5_text",')
    (tmp_path / "empty-dir").mkdir()
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fastpath verify: error:") and message in err[0]


def test_bf16_decode_beyond_the_limit_is_judged_against_an_fp32_run(qwen, monkeypatch):
    """With a decode limit no bf16 run can meet, verify computes the fp32 oracle of the decode
    steps (a teacher-forced fp32 copy) and names both paths' distances to it; in fp32 it never
    does (there is nothing more exact to compare with)."""
    from fastpath.models.compare import Tolerance
    from fastpath.proof import run_paths

    strict = Tolerance(rel=1e-12, token_rel=1e-12, grad_rel=1e-12)
    monkeypatch.setitem(run_paths.TOLERANCES, "bf16", strict)
    result = verify_model(qwen, dtype="bf16", seq_len=16, batch=1, backward=False, decode_tokens=3)
    assert result.decode is not None and "vs fp32: fast" in result.decode.detail, result.decode.detail
    monkeypatch.setitem(run_paths.TOLERANCES, "fp32", strict)
    result = verify_model(qwen, dtype="fp32", seq_len=16, batch=1, backward=False, decode_tokens=3)
    assert result.decode is not None and "vs fp32" not in result.decode.detail
