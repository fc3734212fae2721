"""routing/lm_head_route: the causal-LM loss of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next through
fastpath's fused LM head + cross-entropy, on tiny random models of each family.

Under TRITON_INTERPRET=1 (the kernel path; skipped otherwise): with the route, a training call
with labels gives transformers' own loss and the gradient of every parameter (float32, within
1e-5 relative), returns logits=None and runs the kernel once; ignore_index labels, shift_labels,
num_items_in_batch and the MoE load-balancing term give the same loss as the original; calls the
route leaves alone (no labels, no grad, logits_to_keep, return_dict=False, skip_logits=False) run
the original forward and keep their logits; undo through the PatchRegistry restores every class
exactly. Without the interpreter: the probe accepts every installed release's classes and rejects
forwards that compute something else; Liger's forward in place is left alone; FASTPATH_LM_LOSS=off;
CPU tensors keep the original. The `gpu` group runs a bf16 Qwen3.5 with the 248,320 vocabulary.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("triton")

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.routing import lm_head_route as route  # noqa: E402
from fastpath.routing.patch_registry import PatchRegistry  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernels: needs TRITON_INTERPRET=1")
TOL = 1e-5
FAMILIES = {  # module -> (class, config class, extra config)
    "transformers.models.qwen3_5.modeling_qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", {}),
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe": (
        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 16}),
    "transformers.models.qwen3_next.modeling_qwen3_next": (
        "Qwen3NextForCausalLM", "Qwen3NextConfig",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 16, "decoder_sparse_step": 1, "mlp_only_layers": []}),
}
VOCAB = 150


def tiny(module_name: str = "transformers.models.qwen3_5.modeling_qwen3_5", seed: int = 0,
         tie: bool = False):
    """A 2-layer (GatedDeltaNet + attention) model of the family, O(1) random weights everywhere
    (zero-centred norms' weights too), float32, training mode."""
    module = importlib.import_module(module_name)
    cls_name, config_name, extra = FAMILIES[module_name]
    config = getattr(module, config_name)(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"],
        tie_word_embeddings=tie, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(module, cls_name)(config).float()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 - 0.5)
            elif p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / max(1, p.shape[-1]) ** 0.5)
    return model.train()


def _inputs(seed: int = 0, batch: int = 2, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=gen)
    labels = ids.clone()
    labels[0, :3] = -100  # a masked prompt
    return ids, labels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    diff = float(torch.linalg.vector_norm(a.double() - b.double()))
    return 0.0 if diff == 0.0 else diff / max(float(torch.linalg.vector_norm(b.double())), 1e-30)


def _step(model, **kwargs) -> tuple[object, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _classes() -> dict[type, object]:
    found = {}
    for name in FAMILIES:
        module = importlib.import_module(name)
        for cls in route.candidates(module):
            found[cls] = cls.__dict__["forward"]
    return found


@pytest.fixture
def routed():
    """The route applied to every family's module (the registry is undone after the test)."""
    for name in FAMILIES:
        importlib.import_module(name)
    reg = PatchRegistry()
    originals = _classes()
    notes = route.apply(reg)
    assert notes == [], notes
    yield reg
    reg.undo()
    assert _classes() == originals and route.ACTIVE is None


# ---------------------------------------------------------------- the kernel path (interpreter)
@needs_interp
@pytest.mark.parametrize("tie", [False, True])
def test_loss_and_every_gradient_equal_transformers(routed, tie: bool) -> None:
    model = tiny(tie=tie)
    ids, labels = _inputs()
    reg = routed
    resume = reg.suspend()  # the original forward, for the reference
    want, want_grads = _step(model, input_ids=ids, labels=labels)
    resume()
    assert route.fused_loss_in_place(model)
    CALLS.clear()
    got, got_grads = _step(model, input_ids=ids, labels=labels)
    assert CALLS["linear_ce_fwd:triton"] == 1
    assert got.logits is None and want.logits is not None
    assert _rel(got.loss, want.loss) <= TOL
    assert got_grads.keys() == want_grads.keys()
    assert ("lm_head.weight" in got_grads) != tie  # a tied head's gradient is the embedding's
    for name, g in want_grads.items():
        assert _rel(got_grads[name], g) <= TOL, name


@needs_interp
@pytest.mark.parametrize("how", ["shift_labels", "num_items_in_batch", "attention_mask", "positional"])
def test_loss_kwargs_as_transformers(routed, how: str) -> None:
    model = tiny(seed=3)
    ids, labels = _inputs(seed=4)
    kwargs: dict = {"input_ids": ids, "labels": labels}
    args: tuple = ()
    if how == "shift_labels":
        shift = torch.roll(labels, -1, dims=1)
        shift[:, -1] = -100
        shift[1, 4] = -100
        kwargs["shift_labels"] = shift
    elif how == "num_items_in_batch":
        kwargs["num_items_in_batch"] = torch.tensor(11)
    elif how == "attention_mask":
        kwargs["attention_mask"] = torch.ones_like(ids)
    else:
        args, kwargs = (ids,), {"labels": labels}
    resume = routed.suspend()
    model.zero_grad(set_to_none=True)
    want = model(*args, **kwargs)
    want.loss.backward()
    want_grad = model.lm_head.weight.grad.clone()
    resume()
    model.zero_grad(set_to_none=True)
    CALLS.clear()
    got = model(*args, **kwargs)
    got.loss.backward()
    assert CALLS["linear_ce_fwd:triton"] == 1 and got.logits is None
    assert _rel(got.loss, want.loss) <= TOL and _rel(model.lm_head.weight.grad, want_grad) <= TOL


@needs_interp
@pytest.mark.parametrize("module_name", list(FAMILIES)[1:])
def test_moe_families_with_router_loss(routed, module_name: str) -> None:
    model = tiny(module_name, seed=5)
    ids, labels = _inputs(seed=6)
    for router in (False, True):
        resume = routed.suspend()
        want, want_grads = _step(model, input_ids=ids, labels=labels, output_router_logits=router)
        resume()
        CALLS.clear()
        got, got_grads = _step(model, input_ids=ids, labels=labels, output_router_logits=router)
        assert CALLS["linear_ce_fwd:triton"] == 1 and got.logits is None
        assert (got.aux_loss is None) == (not router) and (want.aux_loss is None) == (not router)
        assert _rel(got.loss, want.loss) <= TOL, router
        for name, g in want_grads.items():
            assert _rel(got_grads[name], g) <= TOL, (router, name)


@needs_interp
def test_calls_the_route_leaves_alone_keep_their_logits(routed) -> None:
    model = tiny(seed=7)
    ids, labels = _inputs(seed=8)
    resume = routed.suspend()
    with torch.no_grad():
        want = model(input_ids=ids, labels=labels)
    resume()
    CALLS.clear()
    with torch.no_grad():  # an evaluation loop: the logits are what it wants
        out = model(input_ids=ids, labels=labels)
        assert out.logits is not None and _rel(out.loss, want.loss) <= TOL
        out = model(input_ids=ids, labels=labels, skip_logits=True)  # asked for: fused under no_grad too
        assert out.logits is None and _rel(out.loss, want.loss) <= TOL
    assert CALLS["linear_ce_fwd:triton"] == 1
    CALLS.clear()
    assert model(input_ids=ids).logits.shape == (2, 9, VOCAB)  # no labels
    assert model(input_ids=ids, labels=labels, skip_logits=False).logits is not None
    with pytest.raises(ValueError, match="batch_size"):  # transformers' own answer to this combination
        model(input_ids=ids, labels=labels, logits_to_keep=1)
    out = model(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(out, tuple) and out[1].shape == (2, 9, VOCAB)
    assert not CALLS["linear_ce_fwd:triton"]


@needs_interp
def test_explain_rows_and_fused_loss_in_place(routed) -> None:
    model = tiny()
    rows = route.explain_rows(model)
    assert rows == [{"layer": "<root>", "layer_type": "Qwen3_5ForCausalLM", "op": route.OP,
                     "impl": f"{route.IMPL} (interpreter)", "fast": True}]
    assert route.fused_loss_in_place(model)
    model.forward = lambda *a, **k: None  # a user's own instance forward wins over the class's
    assert not route.fused_loss_in_place(model)
    assert route.explain_rows(model)[0]["impl"].startswith("instance forward replaced")
    routed.undo()
    assert route.explain_rows(tiny()) == [] and not route.fused_loss_in_place(tiny())


@needs_interp
def test_liger_instance_patch_is_liger_s_row(routed) -> None:
    pytest.importorskip("liger_kernel")
    from liger_kernel.transformers.model.qwen3_5 import lce_forward

    model = tiny()
    model.forward = lce_forward.__get__(model)  # what apply_liger_kernel_to_qwen3_5(model=...) binds
    assert not route.fused_loss_in_place(model) and route.explain_rows(model) == []


@needs_interp
def test_bench_train_phase_times_the_fused_loss(routed) -> None:
    """bench's train phase takes `model(input_ids, labels=ids).loss` where the route is in place:
    the same gradients as its materialised loop (mean over B x (L-1) predictions)."""
    from fastpath.proof.bench_spec import BenchSettings, _train

    model = tiny(seed=11)
    ids, _ = _inputs(seed=12)
    settings = BenchSettings(source="tiny", seq_len=ids.shape[1], batch=ids.shape[0])
    resume = routed.suspend()
    run, _, tokens = _train(model, ids, settings)
    run()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    resume()
    CALLS.clear()
    run, _, tokens_fused = _train(model, ids, settings)
    run()
    assert CALLS["linear_ce_fwd:triton"] == 1 and tokens == tokens_fused == ids.numel()
    for name, g in want.items():
        assert _rel(model.get_parameter(name).grad, g) <= TOL, name


# ---------------------------------------------------------------- without the kernel
def test_probe_accepts_every_family_of_this_transformers() -> None:
    for name in FAMILIES:
        module = importlib.import_module(name)
        found = route.candidates(module)
        assert [c.__name__ for c in found] == [FAMILIES[name][0]]
        for cls in found:
            assert route.has_loss_shape(cls.__dict__["forward"]) is None
            assert route.same_function(cls, module) is None, cls


def test_probe_routes_with_fla_importable_on_a_cpu_host() -> None:
    """The probe runs on CPU; with fla-core importable, transformers' gated-delta layers call FLA's
    Triton kernels, which raise on CPU tensors. The probe model is attention-only, so every family
    is still routed (a probe with a gated-delta layer left the loss unrouted wherever FLA was
    installed: the GPU test of the 27B vocabulary found it)."""
    import subprocess

    from repo_paths import SRC, fla_path

    aside = fla_path()
    if aside is None:
        pytest.skip("fla-core is not installed here or aside (scripts/setup_fla.sh)")
    code = (
        "import importlib, fla\n"
        "from fastpath.routing import lm_head_route as route\n"
        "from fastpath.routing.patch_registry import PatchRegistry\n"
        f"names = {list(FAMILIES)!r}\n"
        "mods = [importlib.import_module(n) for n in names]\n"
        "reg = PatchRegistry()\n"
        "notes = route.apply(reg, mods)\n"
        "assert notes == [], notes\n"
        "for m in mods:\n"
        "    for c in route.candidates(m):\n"
        "        assert hasattr(c.forward, route.ROUTE_ATTR), c\n"
        "reg.undo()\n"
        "print('routed', len(mods))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), aside) if p)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and f"routed {len(FAMILIES)}" in done.stdout, done.stderr[-2000:]


def _softcapped_forward(self, input_ids=None, labels=None, logits_to_keep=0, **kwargs):
    outputs = self.model(input_ids=input_ids, **kwargs)
    keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(outputs.last_hidden_state[:, keep, :])
    logits = 30.0 * torch.tanh(logits / 30.0)
    return self.loss_function(logits, labels, self.vocab_size)


def _doubled_loss_forward(self, input_ids=None, labels=None, logits_to_keep=0, **kwargs):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs = self.model(input_ids=input_ids, **kwargs)
    keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(outputs.last_hidden_state[:, keep, :])
    loss = None if labels is None else 2 * self.loss_function(logits, labels, self.vocab_size)
    return CausalLMOutputWithPast(loss=loss, logits=logits)


def test_forwards_computing_something_else_are_not_routed() -> None:
    """A softcap after lm_head fails the source check; a forward that passes it but returns another
    loss fails the probe; both are noted and marked for explain()."""
    module = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    cls = module.Qwen3_5ForCausalLM
    assert "changes the logits" in route.has_loss_shape(_softcapped_forward)
    assert route.has_loss_shape(_doubled_loss_forward) is None
    for forward, why in ((_softcapped_forward, "changes the logits"), (_doubled_loss_forward, "rel. error")):
        reg = PatchRegistry()
        reg.set_attr(cls, "forward", forward)
        try:
            notes = route.patch_module(module, route.LmHeadStatus(True, "test"), reg)
            assert len(notes) == 1 and why in notes[0], notes
            assert cls.__dict__["forward"] is forward and why in cls.__dict__[route.SKIP_ATTR]
        finally:
            reg.undo()
    assert route.SKIP_ATTR not in cls.__dict__ and not hasattr(cls.__dict__["forward"], route.ROUTE_ATTR)


def test_liger_class_level_forward_is_left_to_liger() -> None:
    pytest.importorskip("liger_kernel")
    from liger_kernel.transformers.model.qwen3_5 import lce_forward

    module = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    cls = module.Qwen3_5ForCausalLM
    original = cls.__dict__["forward"]
    reg = PatchRegistry()
    reg.set_attr(cls, "forward", lce_forward)  # what apply_liger_kernel_to_qwen3_5() sets
    try:
        notes = route.apply(reg, [module])
        assert any("Liger Kernel" in n for n in notes) and cls.__dict__["forward"] is lce_forward
        assert not route.fused_loss_in_place(tiny())
    finally:
        reg.undo()
    assert cls.__dict__["forward"] is original and route.ACTIVE is None


def test_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(route.ENV_MODE, "off")
    reg = PatchRegistry()
    originals = _classes()
    try:
        notes = route.apply(reg)
        assert notes == [f"{route.OP}: {route.ENV_MODE}=off"]
        assert _classes() == originals
        rows = route.explain_rows(tiny())
        assert rows[0]["impl"] == f"torch (eager; {route.ENV_MODE}=off)" and rows[0]["fast"] is False
    finally:
        reg.undo()
    monkeypatch.setenv(route.ENV_MODE, "sometimes")
    from fastpath.shared.errors import UsageError

    with pytest.raises(UsageError, match=route.ENV_MODE):
        route.detect_lm_head()


def test_cpu_tensors_without_the_interpreter_keep_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route in place, CPU weights, no TRITON_INTERPRET: the original forward (logits and all),
    bit for bit; explain says so; the forward's signature is the original's (Trainer reads it)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = tiny(seed=9)
    ids, labels = _inputs(seed=10)
    want, want_grads = _step(model, input_ids=ids, labels=labels)
    reg = PatchRegistry()
    try:
        route.apply(reg)
        assert inspect.signature(type(model).forward) == inspect.signature(route.candidates(
            sys.modules[type(model).__module__])[0].forward.__wrapped__)
        CALLS.clear()
        got, got_grads = _step(model, input_ids=ids, labels=labels)
        assert not CALLS["linear_ce_fwd:triton"] and not CALLS["linear_ce_fwd:reference"]
        assert torch.equal(got.loss, want.loss) and torch.equal(got.logits, want.logits)
        assert all(torch.equal(got_grads[n], g) for n, g in want_grads.items())
        assert "routed for CUDA" in route.explain_rows(model)[0]["impl"]
    finally:
        reg.undo()


def test_enable_routes_the_loss_and_disable_puts_every_class_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """enable() takes the route from the table: its report, summary and explain() row; the classes
    of modules imported before and after enable(); disable() restores each forward exactly;
    enable(lm_loss=False) leaves them and says why."""
    import fastpath

    monkeypatch.delenv(route.ENV_MODE, raising=False)
    for name in FAMILIES:
        importlib.import_module(name)
    originals = _classes()
    report = fastpath.enable(warn=False)
    try:
        assert (report.lm_loss, route.ENV_MODE in report.lm_loss_reason) == (route.IMPL, True)
        assert f"LM head + loss -> {route.IMPL}" in " ".join(report.summary().split())
        assert all(hasattr(cls.__dict__["forward"], route.ROUTE_ATTR) for cls in originals)
        rows = [r for r in fastpath.explain(tiny()).rows if r["op"] == route.OP]
        assert len(rows) == 1 and rows[0]["fast"] is INTERP, rows
    finally:
        fastpath.disable()
    assert _classes() == originals and route.ACTIVE is None
    report = fastpath.enable(warn=False, lm_loss=False)
    try:
        assert report.lm_loss == "torch" and report.lm_loss_reason == "turned off by the caller"
        assert _classes() == originals
        assert fastpath.explain(tiny()).rows and all(r["op"] != route.OP or not r["fast"]
                                                    for r in fastpath.explain(tiny()).rows)
    finally:
        fastpath.disable()
    assert _classes() == originals and route.ACTIVE is None


def test_enable_hands_autotune_decisions_to_the_process(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FASTPATH_AUTOTUNE_DECISIONS reaches enable(): a file for another device is refused in the
    report (this host has no CUDA GPU), a file that is not one is a usage error before any patch."""
    import fastpath
    from fastpath.kernels.dispatch import cuda_capability
    from fastpath.routing import autotune_decisions
    from fastpath.routing.engine import is_enabled
    from fastpath.shared.errors import UsageError

    if cuda_capability() is not None:
        pytest.skip("checks the refusal on a host without a CUDA GPU")
    doc = {"schema": autotune_decisions.SCHEMA, "device": {"name": "NVIDIA H200", "capability": [9, 0]},
           "versions": {}, "kernels": {}}
    path = tmp_path / "sm_90.json"
    path.write_text(__import__("json").dumps(doc))
    monkeypatch.setenv(autotune_decisions.ENV, str(path))
    report = fastpath.enable(warn=False)
    try:
        assert ("autotune decisions not applied: recorded on compute capability 9.0, this device is not "
                "a CUDA GPU") in report.notes
    finally:
        fastpath.disable()
    path.write_text("{not json")
    originals = _classes()
    with pytest.raises(UsageError, match="cannot read autotune decisions"):
        fastpath.enable(warn=False)
    assert not is_enabled() and _classes() == originals


# ---------------------------------------------------------------- device only
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_gpu_qwen35_with_the_27b_vocabulary() -> None:  # pragma: no cover - device only
    """A 2-layer bf16 Qwen3.5 with hidden 1024 and the 248,320-token vocabulary, B=2, L=1024: the
    routed loss and gradients against transformers' (bf16 logits, float32 loss), and a lower peak.
    Attention layers only: the LM head is under test, and a gated-delta layer would make the
    reference step depend on which FLA is importable (FLA 0.6 refuses its backward on Hopper
    under Triton < 3.7.1, fla-org/flash-linear-attention#640)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=248320, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                               linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=64,
                               linear_value_head_dim=64, layer_types=["full_attention", "full_attention"],
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).to("cuda", torch.bfloat16).train()
    ids = torch.randint(0, 248320, (2, 1024), device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.cuda.synchronize()
        grads = {n: p.grad.float() for n, p in model.named_parameters()}
        return out, grads, torch.cuda.max_memory_allocated() - base

    want, want_grads, want_peak = step()
    reg = PatchRegistry()
    try:
        route.apply(reg)
        CALLS.clear()
        got, got_grads, got_peak = step()
        assert CALLS["linear_ce_fwd:triton"] == 1 and got.logits is None
    finally:
        reg.undo()
    assert _rel(got.loss, want.loss) <= 2e-3
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert _rel(got_grads[name], want_grads[name]) <= 2e-2, name
    assert got_peak < want_peak, (got_peak, want_peak)
