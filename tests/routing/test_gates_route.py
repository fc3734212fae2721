"""routing/gates_route.py: enable() routes the Qwen3.5 GatedDeltaNet gates and the gated
attention's output gate and RoPE to fastpath's fused ops after a probe, the tiny random model
matches the reference path (logits and every gradient), the RoPE takes fastpath's op only for
transformers' partial rotary and calls that fit, disable() restores exactly, FASTPATH_GLUE=off /
enable(glue=False) turn it off, explain() lists the ops, torch.compile sees no fastpath break."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("triton")

from repo_paths import ROOT, SUPPORT, venv_missing, venv_python  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.routing import gates_route  # noqa: E402
from fastpath.routing.engine import disable, enable, explain  # noqa: E402
from fastpath.shared.errors import UsageError  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(gates_route.ENV_MODE, raising=False)
    disable()
    yield
    disable()


def _module():
    import transformers.models.qwen3_5.modeling_qwen3_5 as module

    return module


def tiny_model(seed: int = 0):
    """Grouped value heads (4 value / 2 key heads), partial rotary, gated attention, fp32."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg)
    with torch.no_grad():  # zero-initialised norm weights and biases get values: every term counts
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()  # enable() fuses the LM head into the loss: no logits, the same loss
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_candidates_are_the_gated_delta_net_and_gated_attention() -> None:
    found = {cls.__name__: op for cls, op in gates_route.candidates(_module())}
    assert found == {"Qwen3_5GatedDeltaNet": gates_route.OP_GATES, "Qwen3_5Attention": gates_route.OP_OUTPUT_GATE}


def test_probe_accepts_transformers_layers_and_rejects_another_function() -> None:
    module = _module()
    assert gates_route.same_function(module.Qwen3_5GatedDeltaNet, gates_route.OP_GATES, module) is None
    assert gates_route.same_function(module.Qwen3_5Attention, gates_route.OP_OUTPUT_GATE, module) is None

    class ShiftedGates(module.Qwen3_5GatedDeltaNet):
        def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
            """Another function: transformers' layer (q/k repeat_interleave and all) with dt_bias
            shifted by 0.5, as a release that changed the gates would compute."""
            with torch.no_grad():
                self.dt_bias.add_(0.5)
            try:
                return module.Qwen3_5GatedDeltaNet.forward(self, hidden_states)
            finally:
                with torch.no_grad():
                    self.dt_bias.sub_(0.5)

    why = gates_route.same_function(ShiftedGates, gates_route.OP_GATES, module)
    assert why is not None and "ShiftedGates" in why and "float32 probe" in why


@pytest.mark.skipif(not INTERP, reason="runs the fused kernels: needs TRITON_INTERPRET=1")
def test_tiny_model_matches_the_reference_path_and_disable_restores() -> None:
    module = _module()
    gdn_forward, attn_forward = module.Qwen3_5GatedDeltaNet.forward, module.Qwen3_5Attention.forward
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    want_loss, want_grads = _step(model, ids)
    report = enable(warn=False)
    assert report.glue == gates_route.IMPL
    assert getattr(module.Qwen3_5GatedDeltaNet.forward, gates_route.ROUTE_ATTR) == gates_route.OP_GATES
    CALLS.clear()
    loss, grads = _step(model, ids)
    for op in ("gdn_gates_fwd", "gdn_gates_bwd", "sigmoid_gate_fwd", "sigmoid_gate_bwd"):
        assert CALLS[f"{op}:triton"] == 1, dict(CALLS)
    # the attention layer's RoPE: one call each way for q and one for k
    assert CALLS["rotary_fwd:triton"] == 2 and CALLS["rotary_bwd:triton"] == 2, dict(CALLS)
    assert not CALLS["rotary_fwd:reference"] and not CALLS["rotary_bwd:reference"], dict(CALLS)
    # the GatedDeltaNet's 4 projections, the attention's 3 and each layer's MLP gate/up pair
    assert CALLS["linear_group:shared"] == 4, dict(CALLS)
    # its conv writes q, k and v apart, one launch per piece each way
    assert CALLS["conv_split_fwd:triton"] == 1 and CALLS["conv_split_bwd:triton"] == 1, dict(CALLS)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    rows = {(r["layer"], r["op"]): r for r in explain(model).rows}
    assert rows[("model.layers.0.linear_attn", "gdn_gates")]["fast"]
    assert rows[("model.layers.1.self_attn", "attn_output_gate")]["impl"] == f"{gates_route.IMPL} (interpreter)"
    disable()
    assert module.Qwen3_5GatedDeltaNet.forward is gdn_forward
    assert module.Qwen3_5Attention.forward is attn_forward
    assert gates_route.ACTIVE is None
    assert not any(r["op"] in ("gdn_gates", "attn_output_gate") for r in explain(model).rows)



def _fla_route_on_cpu(module):
    """fastpath's FLA route around transformers' torch rule, as enable() builds it; on CPU tensors
    it runs the torch rule (FLA's kernels are never reached here)."""
    from fastpath.routing import fla_route

    def fla_kernel(*args, **kwargs):
        raise AssertionError("FLA's kernel takes CUDA tensors only; the route keeps CPU ones off it")

    status = fla_route.FlaStatus(True, "fla", "fla", "test", chunk_fn=fla_kernel, recurrent_fn=fla_kernel)
    return fla_route.make_gdn_route("chunk", status, module.torch_chunk_gated_delta_rule)


@pytest.mark.parametrize("grouped_rule", [True, False], ids=["fla-route", "other-rule"])
def test_grouped_heads_reach_a_rule_that_takes_them(grouped_rule: bool) -> None:
    """transformers <= 5.22 repeats q and k to one head per value head before the gated delta rule.
    The routed forward hands them over grouped when the rule is fastpath's FLA route (FLA's kernels
    read the shared key head themselves: no repeated copies, no sum of their gradients), repeated to
    any other rule; the output and every gradient are the original forward's either way."""
    import inspect

    from fastpath.routing import fla_route
    from fastpath.routing.route_modes import GROUPED_HEADS_ATTR

    module = _module()
    original = module.Qwen3_5GatedDeltaNet.forward
    layer = tiny_model(seed=3).model.layers[0].linear_attn  # 2 key heads, 4 value heads
    route = _fla_route_on_cpu(module)
    assert getattr(route, GROUPED_HEADS_ATTR) is True
    seen = []

    def rule(q, k, v, *args, **kwargs):
        seen.append((q.shape[2], k.shape[2], v.shape[2]))
        return route(q, k, v, *args, **kwargs)

    if grouped_rule:
        setattr(rule, GROUPED_HEADS_ATTR, True)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(4), requires_grad=True)
    want = original(layer, x)
    want_grads = torch.autograd.grad(want.square().sum(), [x, *layer.parameters()])
    old = module.torch_chunk_gated_delta_rule
    module.torch_chunk_gated_delta_rule = rule
    try:
        forward = gates_route.make_gdn_forward(original, module, force=True)
        got = forward(layer, x)
        got_grads = torch.autograd.grad(got.square().sum(), [x, *layer.parameters()])
    finally:
        module.torch_chunk_gated_delta_rule = old
    repeats = "repeat_interleave" in inspect.getsource(original)  # 5.23+ hands grouped heads itself
    assert seen == [(2, 2, 4) if grouped_rule or not repeats else (4, 4, 4)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    # the route itself, given grouped heads on CPU, is the torch rule on repeated ones
    q, k = torch.randn(2, 2, 5, 2, 8).unbind(0)
    v = torch.randn(2, 5, 4, 8)
    g, beta = -torch.rand(2, 5, 4), torch.rand(2, 5, 4)
    qr, kr = fla_route.one_key_head_per_value_head(q, k, v)
    assert qr.shape == (2, 5, 4, 8) and torch.equal(qr[:, :, 1], q[:, :, 0]) and torch.equal(kr[:, :, 2], k[:, :, 1])
    torch.testing.assert_close(route(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0],
                               old(qr, kr, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0])


def test_q_k_v_come_contiguous_from_fastpaths_conv_only(monkeypatch) -> None:
    """Where the module's conv is fastpath's own, the routed forward has it write q, k and v as
    three contiguous tensors (the rule copies nothing); any other conv (Dao's, a Hub kernel's: here
    fastpath's numbers through another callable) keeps the original conv, transpose and split.
    The two give the same output and gradients, and both the original forward's (torch's conv)."""
    import fastpath.causal_conv1d as fp_conv
    from fastpath.routing import conv_route

    module = _module()
    original = module.Qwen3_5GatedDeltaNet.forward
    layer = tiny_model(seed=5).model.layers[0].linear_attn
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(6), requires_grad=True)
    params = [x, *layer.parameters()]
    torch_out = original(layer, x)
    torch_grads = torch.autograd.grad(torch_out.square().sum(), params)
    rule = module.torch_chunk_gated_delta_rule
    seen = []

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.is_contiguous(), k.is_contiguous(), v.is_contiguous()))
        return rule(q, k, v, *args, **kwargs)

    def another_conv(*args, **kwargs):
        return fp_conv.causal_conv1d_fn(*args, **kwargs)

    monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", spy)
    forward = gates_route.make_gdn_forward(original, module, force=True)
    results = {}
    for name, impl in (("split", fp_conv.causal_conv1d_fn), ("unsplit", another_conv)):
        monkeypatch.setattr(module, "causal_conv1d_fn", conv_route.make_causal_conv1d_fn(impl))
        CALLS.clear()
        out = forward(layer, x)
        results[name] = (out, torch.autograd.grad(out.square().sum(), params))
        impl_key = "triton" if INTERP else "reference"
        count = int(name == "split")
        assert CALLS[f"conv_split_fwd:{impl_key}"] == count and CALLS[f"conv_split_bwd:{impl_key}"] == count
    # (q and k of the original are contiguous too where it repeats them per value head: <= 5.22)
    assert seen[0] == (True, True, True) and seen[1][2] is False, seen
    (out, grads), (want, want_grads) = results["split"], results["unsplit"]
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-7)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    # against torch's own conv the float32 sums differ in order: a bound on that difference
    torch.testing.assert_close(out, torch_out, rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, torch_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)


def test_rope_is_fused_only_for_transformers_partial_rotary_and_calls_that_fit() -> None:
    """The routed attention calls fastpath's rotary only while the module's apply_rotary_pos_emb is
    transformers' partial rotate-half RoPE and the call fits; else the module's own function."""
    module = _module()
    assert gates_route.is_rotate_half_rope(module.apply_rotary_pos_emb)

    def interleaved(q, k, cos, sin):
        return q * cos, k * sin

    assert not gates_route.is_rotate_half_rope(interleaved)
    q, k, cs = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 3, 4)
    assert gates_route.rope_fits(q, k, cs, cs, True, False)
    assert not gates_route.rope_fits(q, k, cs, cs, False, False)  # CPU tensors, no interpreter
    assert not gates_route.rope_fits(q, k, cs.clone().requires_grad_(True), cs, True, False)
    assert not gates_route.rope_fits(q, k, torch.randn(1, 3, 5), torch.randn(1, 3, 5), True, False)  # R odd
    assert not gates_route.rope_fits(q, k, torch.randn(1, 3, 10), torch.randn(1, 3, 10), True, False)  # R > D
    assert not gates_route.rope_fits(q, k, cs[None], cs[None], True, False)  # not (B, L, R)
    # transformers' arithmetic would give float32 q and k; the op rounds to x's dtype
    assert not gates_route.rope_fits(q.bfloat16(), k.bfloat16(), cs, cs, True, False)
    assert gates_route.rope_fits(q, k, cs.bfloat16(), cs.bfloat16(), True, False)


def test_routed_attention_keeps_the_module_rope_where_cos_wants_a_gradient() -> None:
    """cos / sin that require grad (fastpath's op gives x's gradient only): the module's function
    runs, and the gradients of cos and sin are the original forward's."""
    module = _module()
    cls = module.Qwen3_5Attention
    layer = cls(gates_route._probe_config(module), 1).float()
    routed = gates_route.make_attention_forward(cls.__dict__["forward"], module, force=True)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, layer.config.hidden_size, generator=gen)
    cos, sin = torch.randn(2, 5, 8, generator=gen), torch.randn(2, 5, 8, generator=gen)
    grads = []
    for forward in (cls.__dict__["forward"], routed):
        c, s = cos.clone().requires_grad_(True), sin.clone().requires_grad_(True)
        CALLS.clear()
        forward(layer, x, (c, s), None)[0].square().sum().backward()
        assert not any(key.startswith("rotary") for key in CALLS), dict(CALLS)
        grads.append((c.grad, s.grad))
    torch.testing.assert_close(grads[1], grads[0])


def test_off_by_env_or_option(monkeypatch) -> None:
    module = _module()
    gdn_forward = module.Qwen3_5GatedDeltaNet.forward
    report = enable(warn=False, glue=False)
    assert report.glue == "torch" and "glue=False" in report.glue_reason
    assert module.Qwen3_5GatedDeltaNet.forward is gdn_forward
    assert not any(r["op"] == "gdn_gates" for r in explain(tiny_model()).rows)
    disable()
    monkeypatch.setenv(gates_route.ENV_MODE, "off")
    report = enable(warn=False)
    assert report.glue == "torch" and module.Qwen3_5Attention.forward is not None
    assert not hasattr(module.Qwen3_5Attention.forward, gates_route.ROUTE_ATTR)
    disable()
    monkeypatch.setenv(gates_route.ENV_MODE, "fast-please")
    with pytest.raises(UsageError, match="FASTPATH_GLUE"):
        enable(warn=False)


def test_cpu_without_interpreter_and_cached_calls_keep_the_original(monkeypatch) -> None:
    """The routed forward hands CPU tensors (no interpreter) and cached decode to the original."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = tiny_model()
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=True).logits
    enable(warn=False)
    CALLS.clear()
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=True).logits
        model(input_ids=ids, use_cache=False)
    assert not any(k.startswith(("gdn_gates", "sigmoid_gate", "rotary", "conv_split")) for k in CALLS), dict(CALLS)
    torch.testing.assert_close(got, want)


def test_compiled_routed_model_has_no_fastpath_graph_break() -> None:
    """torch._dynamo.explain over the routed model's forward + loss: whatever transformers itself
    breaks on, no break comes from fastpath's code (the fused ops are custom ops with fakes)."""
    import torch._dynamo

    model = tiny_model()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))
    enable(warn=False)
    module = _module()
    assert hasattr(module.Qwen3_5GatedDeltaNet.forward, gates_route.ROUTE_ATTR)

    def loss(ids):
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    torch._dynamo.reset()
    report = torch._dynamo.explain(loss)(ids)
    ours = [str(r) for r in report.break_reasons if "fastpath" in str(r)]
    assert not ours, ours
    assert report.graph_count >= 1


_SPLIT_ON_TODAYS_STACK = textwrap.dedent("""
    import json, torch
    from matrix_worker import build  # tests/support is on PYTHONPATH
    import fastpath
    from fastpath.kernels.counters import CALLS
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    model = build("qwen3_5_text")

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = step()
    fastpath.enable(warn=False)
    CALLS.clear()
    got = step()
    print(json.dumps({
        "gdn_layers": sum(hasattr(layer, "linear_attn") for layer in model.model.layers),
        "split": [CALLS["conv_split_fwd:triton"], CALLS["conv_split_bwd:triton"]],
        "loss_diff": float((got[0] - want[0]).abs()),
        "grad_rel": max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got[1], want[1])),
    }))
""")


@pytest.mark.skipif(not INTERP, reason="runs the conv kernels: needs TRITON_INTERPRET=1")
def test_q_k_v_come_apart_on_todays_default_stack() -> None:
    """transformers 5.25 (what `pip install ".[kernels]"` resolves) calls the conv through its
    kernelizable `causal_conv1d_forward`; where that is transformers' own function, the routed
    forward still has fastpath's conv write q, k and v apart, with the original's loss and gradients."""
    python = venv_python("default")
    if not python.exists():
        pytest.skip(venv_missing("default"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(SUPPORT)]),
               TRITON_INTERPRET="1")
    proc = subprocess.run([str(python), "-c", _SPLIT_ON_TODAYS_STACK], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["gdn_layers"] >= 1 and out["split"] == [out["gdn_layers"]] * 2, out
    assert out["loss_diff"] <= 1e-5 and out["grad_rel"] <= 1e-4, out
