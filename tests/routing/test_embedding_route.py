"""The route of the token embedding's weight gradient to fastpath's one-pass kernel
(routing/embedding_route.py) on a tiny random Qwen3.5: off by default (no explain() row, torch's
class untouched); FASTPATH_EMBEDDING=auto routes torch.nn.Embedding's forward, the model's loss and
every other gradient stay bit for bit what the same enable() without it gives and the table's
gradient is within float32 rounding, explain() lists the module; disable() restores torch's
function exactly; suspended() runs torch's; calls the kernel would not change (max_norm, sparse,
a frozen table, no autograd, float64, CPU tensors without the interpreter) keep torch's forward
bit for bit; a subclass reaching the forward through super() is routed; the route's row alone
does not make assert_fast() pass on a model without the layers fastpath is for; a bad switch
value is a usage error and mode `fastpath` without Triton fails enable() in one line.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_class_routes import enable_without_triton  # noqa: E402
from test_zc_norm_route import tiny_qwen3_5  # noqa: E402

import fastpath  # noqa: E402
from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.routing import embedding_route  # noqa: E402
from fastpath.routing.engine import suspended  # noqa: E402
from fastpath.shared.errors import FastpathError, UsageError  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the kernel: needs TRITON_INTERPRET=1")
IDS = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
TORCH_FORWARD = torch.nn.Embedding.__dict__["forward"]
ENV = embedding_route.ENV_MODE


@pytest.fixture(autouse=True)
def _always_disable():
    fastpath.disable()
    yield
    fastpath.disable()
    assert torch.nn.Embedding.__dict__["forward"] is TORCH_FORWARD


def _step(model):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=IDS, labels=IDS, use_cache=False)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rows(model):
    return [r for r in fastpath.explain(model).rows if r["op"] == embedding_route.OP]


def test_off_by_default_with_no_row(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    report = fastpath.enable(warn=False)
    assert report.embedding == "torch" and report.embedding_reason == f"{ENV}=torch"
    assert f"token embedding weight gradient -> torch ({ENV}=torch)" in report.summary()
    assert torch.nn.Embedding.__dict__["forward"] is TORCH_FORWARD
    assert not _rows(tiny_qwen3_5())


@needs_interp
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -8)])
def test_routed_gradient_and_exact_undo(dtype, tol, monkeypatch) -> None:
    model = tiny_qwen3_5(dtype=dtype)
    pure_loss, pure_grads = _step(model)
    monkeypatch.setenv(ENV, "torch")
    fastpath.enable(warn=False)
    ref_loss, ref_grads = _step(model)
    monkeypatch.setenv(ENV, "auto")
    report = fastpath.enable(warn=False)
    assert report.embedding == embedding_route.IMPL and ENV in report.embedding_reason
    assert "token embedding weight gradient -> fastpath-triton" in report.summary()
    assert hasattr(torch.nn.Embedding.forward, embedding_route.ROUTE_ATTR)
    CALLS.clear()
    loss, grads = _step(model)
    assert CALLS["embedding_bwd:triton"] == 1 and not CALLS["embedding_bwd:reference"]
    assert torch.equal(loss, ref_loss) and set(grads) == set(ref_grads)
    table = "model.embed_tokens.weight"
    for name, g in ref_grads.items():
        if name != table:
            assert torch.equal(grads[name], g), name
    want = grads[table].double()  # the float64 sum of the same output gradients
    err = (grads[table].double() - ref_grads[table].double()).abs().max().item()
    assert err <= tol * want.abs().max().item() * 2, err
    assert _rows(model) == [{"layer": "model.embed_tokens", "layer_type": "Embedding", "op": "embedding_bwd",
                             "impl": "fastpath-triton (interpreter)", "fast": True}]
    fastpath.disable()
    assert torch.nn.Embedding.__dict__["forward"] is TORCH_FORWARD and embedding_route.ACTIVE is None
    CALLS.clear()
    loss, grads = _step(model)
    assert torch.equal(loss, pure_loss) and all(torch.equal(grads[n], g) for n, g in pure_grads.items())
    assert not any(k.startswith("embedding") for k in CALLS) and not _rows(model)


@needs_interp
def test_suspended_runs_torch_and_resumes(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "auto")
    model = tiny_qwen3_5()
    fastpath.enable(warn=False)
    with suspended():
        CALLS.clear()
        _step(model)
        assert not CALLS["embedding_bwd:triton"]
    CALLS.clear()
    _step(model)
    assert CALLS["embedding_bwd:triton"] == 1


def _lookup(layer: torch.nn.Module, ids: torch.Tensor, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    layer.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        out = layer(ids)
    if out.requires_grad:
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape))
    return out.detach(), layer.weight.grad


CALLS_LEFT_TO_TORCH = {
    "max_norm": lambda: torch.nn.Embedding(12, 6, max_norm=1.0),
    "sparse": lambda: torch.nn.Embedding(12, 6, sparse=True),
    "frozen": lambda: torch.nn.Embedding(12, 6).requires_grad_(False),
    "float64": lambda: torch.nn.Embedding(12, 6, dtype=torch.float64),
}


@needs_interp
@pytest.mark.parametrize("case", [*CALLS_LEFT_TO_TORCH, "no_grad"])
def test_calls_the_kernel_would_not_change_keep_torch(case: str, monkeypatch) -> None:
    make = CALLS_LEFT_TO_TORCH.get(case, lambda: torch.nn.Embedding(12, 6))
    ids = torch.tensor([[1, 4, 4, 11]])
    torch.manual_seed(3)
    theirs = _lookup(make(), ids, grad=case != "no_grad")
    monkeypatch.setenv(ENV, "auto")
    fastpath.enable(warn=False)
    torch.manual_seed(3)
    layer = make()
    CALLS.clear()
    ours = _lookup(layer, ids, grad=case != "no_grad")
    assert not any(k.startswith("embedding") for k in CALLS), dict(CALLS)
    assert torch.equal(ours[0], theirs[0])
    assert (ours[1] is None) == (theirs[1] is None)
    if ours[1] is not None:
        assert torch.equal(ours[1].to_dense(), theirs[1].to_dense())
    impl, fast = embedding_route.describe_layer(layer, "cpu")
    assert (fast and impl.startswith("torch (")) or case in ("float64", "no_grad"), (impl, fast)


def test_cpu_without_interpreter_keeps_torch_and_explain_says_so(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(ENV, "auto")
    model = tiny_qwen3_5()
    fastpath.enable(warn=False)
    CALLS.clear()
    _step(model)
    assert not any(k.startswith("embedding") for k in CALLS), dict(CALLS)
    assert _rows(model) == [{"layer": "model.embed_tokens", "layer_type": "Embedding", "op": "embedding_bwd",
                             "impl": "torch (cpu tensors; fastpath routed for CUDA)", "fast": False}]


@needs_interp
def test_a_subclass_through_super_is_routed(monkeypatch) -> None:
    class Scaled(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 2.0

    monkeypatch.setenv(ENV, "auto")
    fastpath.enable(warn=False)
    layer = Scaled(10, 4)
    CALLS.clear()
    _, grad = _lookup(layer, torch.tensor([0, 3, 3, 9]))
    assert CALLS["embedding_bwd:triton"] == 1
    want = torch.zeros(10, 4, dtype=torch.float64)
    want.index_add_(0, torch.tensor([0, 3, 3, 9]), 2 * torch.linspace(-1, 1, 16, dtype=torch.float64).view(4, 4))
    assert (grad.double() - want).abs().max().item() < 1e-6


def test_the_row_alone_does_not_pass_assert_fast(monkeypatch) -> None:
    """A Llama has no conv / gated-delta-rule layer: with the route on its only row is the
    embedding's, and assert_fast() still says there is nothing fastpath is for."""
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(ENV, "auto")
    fastpath.enable(warn=False)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert [r["op"] for r in fastpath.explain(model).rows] == ["embedding_bwd"]
    with pytest.raises(FastpathError, match="no causal_conv1d / gated-delta-rule layers found"):
        fastpath.assert_fast(model)


def test_bad_switch_value_is_a_usage_error(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "fast-please")
    with pytest.raises(UsageError, match=ENV):
        fastpath.enable(warn=False)
    assert torch.nn.Embedding.__dict__["forward"] is TORCH_FORWARD


def test_fastpath_mode_needs_the_kernel(tmp_path) -> None:
    """FASTPATH_EMBEDDING=fastpath with no Triton: enable() fails in one line instead of going slow."""
    out = enable_without_triton(tmp_path, {"FASTPATH_ZC_NORM": "torch", "FASTPATH_SWIGLU": "torch", ENV: "fastpath"})
    assert f"{ENV}=fastpath" in out and "does not import" in out, out
