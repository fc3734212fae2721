"""fastpath's LM head + cross-entropy (kernels/linear_ce) against the float64 spec.

On CPU the Triton chunk step runs under TRITON_INTERPRET=1 (skipped otherwise): the loss, dhidden,
dweight and dbias of never-zero random inputs in fp32/fp16/bf16 against float64 autograd through
torch's cross_entropy on materialised logits; hidden contiguous, row-strided, transposed,
column-strided and stride-0 broadcast, weight contiguous and transposed, labels int64/int32,
strided and broadcast, a broadcast bias; ignore_index
rows (none, some, all: NaN for a mean like torch, 0 for a sum, zero gradients), both reductions,
incoming gradients other than 1, frozen weight or hidden, chunk boundaries (N not a multiple of the
chunk, one-row chunks), rows longer than the kernel's step (V not a multiple of it), a hypothesis
sweep; the torch step (naive.ce_rows_ref_) against the kernel on one chunk; the torch fallback in a
process without the interpreter; bad input; the custom op's fake implementation and autograd under
torch.compile. The `gpu` group runs Qwen3.5-27B's LM head (N=4096, H=5120, V=248,320, bf16)
against torch's float32 cross-entropy on materialised logits, with a peak-memory bound.
Precision rule in fp16/bf16: no further from float64 than twice the materialised torch path in the
same dtype (which rounds logits and dlogits once each, like this op), plus a small floor.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from repo_paths import ROOT  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.linear_ce import fwd_bwd, naive  # noqa: E402
from fastpath.kernels.linear_ce.interface import (  # noqa: E402
    chunk_rows_for,
    linear_ce_fwd,
    linear_cross_entropy,
)

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernels: needs TRITON_INTERPRET=1")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FLOOR = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}  # relative to the max
H_LAYOUTS = ["contiguous", "row-strided", "transposed", "col-strided", "broadcast"]
W_LAYOUTS = ["contiguous", "transposed"]


def _never_zero(t: torch.Tensor) -> torch.Tensor:
    return t + 0.05 * torch.where(t < 0, -1.0, 1.0)


# What fills the part of a strided hidden's buffer its view does not cover: large and finite, so a
# read of it that counts shows up as a wrong loss. Not NaN: the hidden goes through torch's GEMM
# only, and on CPUs with AMX torch 2.13's bf16 matmul (oneDNN 3.12 `brg_matmul:avx10_1_512_amx`)
# reads one element past an odd-length row and multiplies it by a zero pad: NaN * 0 poisons the
# logits of torch's own path too (seen at K = 41; ONEDNN_MAX_CPU_ISA=AVX512_CORE avoids it).
GAP = 1.0e4


def _hidden(n: int, h: int, dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    """(n, h) in `layout`; whatever of the buffer the view does not cover is GAP."""
    values = _never_zero(torch.randn(n, h, generator=gen)).to(dtype)
    if layout == "row-strided":
        out = torch.full((n, 2 * h), GAP, dtype=dtype)[:, :h]
    elif layout == "transposed":
        out = torch.empty(h, n, dtype=dtype).t()
    elif layout == "col-strided":
        out = torch.full((n, h, 2), GAP, dtype=dtype)[..., 0]
    elif layout == "broadcast":  # one row seen n times (row stride 0)
        return values[:1].expand(n, h)
    else:
        return values
    return out.copy_(values)


def _weight(v: int, h: int, dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    values = _never_zero(torch.randn(v, h, generator=gen) * (2.0 / h ** 0.5)).to(dtype)
    if layout == "transposed":
        return torch.empty(h, v, dtype=dtype).t().copy_(values)
    return values


def _labels(n: int, v: int, ignored: str, gen: torch.Generator, dtype: torch.dtype = torch.int64,
            strided: bool | str = False) -> torch.Tensor:
    y = torch.randint(0, v, (n,), generator=gen)
    if n:
        y[0], y[-1] = 0, v - 1  # both ends of the vocabulary
    if ignored == "some":
        y[torch.rand(n, generator=gen) < 0.3] = -100
    elif ignored == "all":
        y[:] = -100
    y = y.to(dtype)
    if strided == "broadcast":  # one label for every row (stride 0)
        return y[:1].expand(n) if n else y
    if strided:
        return torch.stack([y, torch.zeros_like(y)], 1)[:, 0]
    return y


def _grads(loss: torch.Tensor, g: float, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    loss.backward(torch.tensor(g, dtype=loss.dtype))
    return [None if t is None else t.grad for t in tensors]


def _leaf(t: torch.Tensor | None, dtype: torch.dtype | None = None, grad: bool = True) -> torch.Tensor | None:
    if t is None:
        return None
    out = t.detach().to(dtype or t.dtype)
    return out.requires_grad_(grad)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.double() - want).abs().max().item() if want.numel() else 0.0


def _check(n: int, h: int, v: int, dtype: torch.dtype, *, h_layout: str = "contiguous",
           w_layout: str = "contiguous", bias: bool = False, reduction: str = "mean", ignored: str = "some",
           chunk_rows: int | None = None, g: float = 1.0, label_dtype: torch.dtype = torch.int64,
           labels_strided: bool | str = False, bias_broadcast: bool = False, seed: int = 0,
           device: str = "cpu") -> None:
    gen = torch.Generator().manual_seed(seed)
    x = _hidden(n, h, dtype, h_layout, gen).to(device)
    w = _weight(v, h, dtype, w_layout, gen).to(device)
    b = _never_zero(0.5 * torch.randn(v, generator=gen)).to(device, dtype) if bias else None
    if b is not None and bias_broadcast:
        b = b[:1].expand(v)
    y = _labels(n, v, ignored, gen, label_dtype, labels_strided).to(device)
    every_row_ignored = bool((y == -100).all())  # "some" can draw all of a short batch

    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    CALLS.clear()
    loss = linear_cross_entropy(xs, ws, y, reduction=reduction, bias=bs, chunk_rows=chunk_rows)
    assert CALLS["linear_ce_fwd:triton"] == 1, dict(CALLS)
    assert loss.dtype == torch.float32 and loss.shape == ()
    got = _grads(loss, g, xs, ws, bs)

    x64, w64, b64 = _leaf(x, torch.float64), _leaf(w, torch.float64), _leaf(b, torch.float64)
    want_loss = naive.linear_ce_ref(x64, w64, y, b64, reduction=reduction)
    want = _grads(want_loss, g, x64, w64, b64)

    # torch's materialised path in the same dtype: logits in dtype, loss in float32
    xt, wt, bt = _leaf(x), _leaf(w), _leaf(b)
    logits = torch.nn.functional.linear(xt, wt, bt).float()
    torch_loss = torch.nn.functional.cross_entropy(logits, y.long(), reduction=reduction)
    theirs = _grads(torch_loss, g, xt, wt, bt)

    if every_row_ignored and reduction == "mean":
        assert torch.isnan(loss) and torch.isnan(want_loss)
    else:
        scale = abs(want_loss.item()) or 1.0
        e_ours, e_theirs = abs(loss.item() - want_loss.item()), abs(torch_loss.item() - want_loss.item())
        assert e_ours <= 2 * e_theirs + FLOOR[dtype] * scale, (e_ours, e_theirs)
    for name, o, t, ref in zip(("dhidden", "dweight", "dbias"), got, theirs, want, strict=True):
        if ref is None:
            assert o is None
            continue
        assert o is not None and o.dtype == dtype and o.shape == ref.shape, name
        if every_row_ignored:
            assert not o.any(), name
            continue
        e_ours, e_theirs = _err(o, ref), _err(t, ref)
        floor = FLOOR[dtype] * ref.abs().max().item()
        assert e_ours <= 2 * e_theirs + floor, f"{name}: {e_ours:.3e} vs torch {e_theirs:.3e} (floor {floor:.1e})"


# ---------------------------------------------------------------- the kernel path (interpreter)
@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h_layout", H_LAYOUTS)
def test_layouts_and_dtypes(dtype: torch.dtype, h_layout: str) -> None:
    _check(29, 24, 300, dtype, h_layout=h_layout, chunk_rows=8, seed=1)


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_weight_bias_int32_strided_labels(dtype: torch.dtype) -> None:
    _check(21, 16, 257, dtype, w_layout="transposed", bias=True, label_dtype=torch.int32,
           labels_strided=True, chunk_rows=5, seed=2)


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_stride_zero_broadcast_inputs(dtype: torch.dtype) -> None:
    """hidden one row expanded to N, one label for every row, a bias of one value expanded to V."""
    _check(12, 16, 140, dtype, h_layout="broadcast", bias=True, bias_broadcast=True, labels_strided="broadcast",
           ignored="none", chunk_rows=5, seed=14)


@needs_interp
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignored", ["none", "some", "all"])
def test_reductions_and_ignored_rows(reduction: str, ignored: str) -> None:
    _check(17, 16, 130, torch.float32, reduction=reduction, ignored=ignored, bias=True, chunk_rows=6, seed=3)
    _check(17, 16, 130, torch.bfloat16, reduction=reduction, ignored=ignored, chunk_rows=6, g=0.5, seed=4)


@needs_interp
def test_all_ignored_matches_torch_exactly() -> None:
    """Every label ignored: mean -> NaN (torch's 0/0), sum -> 0; every gradient 0 (not NaN)."""
    gen = torch.Generator().manual_seed(5)
    x, w = _leaf(_hidden(6, 8, torch.float32, "contiguous", gen)), _leaf(_weight(40, 8, torch.float32, "contiguous", gen))
    y = torch.full((6,), -100)
    mean = linear_cross_entropy(x, w, y)
    mean.backward()
    assert torch.isnan(mean) and torch.isnan(torch.nn.functional.cross_entropy(torch.randn(6, 40), y))
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.equal(w.grad, torch.zeros_like(w))
    total = linear_cross_entropy(x.detach(), w.detach(), y, reduction="sum")
    assert total.item() == 0.0


@needs_interp
@pytest.mark.parametrize("chunk_rows", [1, 4, 7, 64, None])
def test_chunk_boundaries(chunk_rows: int | None) -> None:
    """N = 23 in chunks of 1 (every row its own GEMM), 4 and 7 (a short last chunk), more than N."""
    _check(23, 16, 200, torch.bfloat16, chunk_rows=chunk_rows, g=3.0, seed=6)
    _check(23, 16, 200, torch.float32, chunk_rows=chunk_rows, bias=True, seed=7)


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_longer_than_the_kernel_step(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """V = 300 in steps of 64 (5 steps, the last partial) and 16: the online max / sum across steps."""
    for step in (64, 16):
        monkeypatch.setattr(fwd_bwd, "MAX_BLOCK_V", step)
        assert fwd_bwd.block_v(300) == step
        _check(13, 16, 300, dtype, chunk_rows=5, bias=True, seed=8 + step)


@needs_interp
def test_frozen_weight_or_hidden_and_no_grad() -> None:
    """Only the wanted gradients are computed (a frozen LM head: no dW); no grad: the loss alone."""
    gen = torch.Generator().manual_seed(9)
    x0, w0 = _hidden(11, 16, torch.float32, "contiguous", gen), _weight(90, 16, torch.float32, "contiguous", gen)
    y = _labels(11, 90, "some", gen)
    want = naive.linear_ce_ref(x0.double(), w0.double(), y)
    x = _leaf(x0)
    linear_cross_entropy(x, w0, y).backward()
    x64 = _leaf(x0, torch.float64)
    naive.linear_ce_ref(x64, w0.double(), y).backward()
    assert _err(x.grad, x64.grad) <= 1e-6
    w = _leaf(w0)
    linear_cross_entropy(x0, w, y).backward()
    assert w.grad is not None and x0.grad is None
    with torch.no_grad():
        assert abs(linear_cross_entropy(_leaf(x0), _leaf(w0), y).item() - want.item()) <= 1e-5


@needs_interp
def test_no_rows() -> None:
    """N = 0: mean NaN (torch's 0/0), sum 0, an empty dhidden and a zero dweight."""
    x, w = torch.empty(0, 8).requires_grad_(), torch.randn(20, 8).requires_grad_()
    y = torch.empty(0, dtype=torch.int64)
    loss = linear_cross_entropy(x, w, y)
    loss.backward()
    assert torch.isnan(loss) and x.grad.shape == (0, 8) and torch.equal(w.grad, torch.zeros_like(w))
    assert linear_cross_entropy(x.detach(), w.detach(), y, reduction="sum").item() == 0.0


@needs_interp
def test_backward_twice_is_a_clear_error() -> None:
    gen = torch.Generator().manual_seed(10)
    x, w = _leaf(_hidden(4, 8, torch.float32, "contiguous", gen)), _leaf(_weight(20, 8, torch.float32, "contiguous", gen))
    loss = linear_cross_entropy(x, w, _labels(4, 20, "none", gen))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_step_equals_torch_step(dtype: torch.dtype) -> None:
    """One chunk through fwd_bwd.ce_rows_ and naive.ce_rows_ref_: the same losses and gradients
    (float32 arithmetic both; the stored gradient rounds once)."""
    gen = torch.Generator().manual_seed(11)
    logits = (3 * torch.randn(9, 300, generator=gen)).to(dtype)
    y = _labels(9, 300, "some", gen)
    scale = torch.tensor([0.25])
    a, b = logits.clone(), logits.clone()
    la = fwd_bwd.ce_rows_(a, y, scale, -100, block=64)
    lb = naive.ce_rows_ref_(b, y, scale, -100)
    torch.testing.assert_close(la, lb, rtol=1e-6, atol=1e-6)
    one_ulp = {torch.float32: 1e-7, torch.float16: 2e-4, torch.bfloat16: 2e-3}[dtype]
    assert (a.double() - b.double()).abs().max().item() <= one_ulp
    c = logits.clone()
    fwd_bwd.ce_rows_(c, y, scale, -100, write_grad=False)
    assert torch.equal(c, logits)


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
def test_access_order_changes_no_bit(dtype: torch.dtype) -> None:
    """A persistent grid (fewer programs than rows, each walking several) and pass 2 walked from the
    row's end give the default launch's losses and gradients bit for bit: rows with ignored and
    out-of-range labels, a partial last block (V = 300, blocks of 64)."""
    gen = torch.Generator().manual_seed(12)
    logits = (3 * torch.randn(7, 300, generator=gen)).to(dtype)
    y = _labels(7, 300, "some", gen)
    y[3] = 300  # out of range: NaN loss and gradient
    scale = torch.tensor([0.5])
    base = logits.clone()
    want = fwd_bwd.ce_rows_(base, y, scale, -100, block=64)
    for programs in (1, 3, 7, 50):
        for reverse in (False, True):
            got_grad = logits.clone()
            got = fwd_bwd.ce_rows_(got_grad, y, scale, -100, block=64, programs=programs, reverse=reverse)
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
            assert torch.equal(got_grad.isnan(), base.isnan())
            assert torch.equal(got_grad.nan_to_num(), base.nan_to_num()), (programs, reverse)
    with pytest.raises(ValueError, match="programs=-1"):
        fwd_bwd.ce_rows_(logits.clone(), y, scale, -100, programs=-1)


@needs_interp
def test_hypothesis_sweep() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=14, deadline=None, suppress_health_check=list(HealthCheck))
    @given(n=st.integers(1, 40), h=st.integers(1, 48), v=st.integers(2, 300), dtype=st.sampled_from(DTYPES),
           h_layout=st.sampled_from(H_LAYOUTS), w_layout=st.sampled_from(W_LAYOUTS), bias=st.booleans(),
           reduction=st.sampled_from(["mean", "sum"]), ignored=st.sampled_from(["none", "some"]),
           chunk_rows=st.one_of(st.none(), st.integers(1, 16)), g=st.sampled_from([1.0, -0.5, 4.0]),
           seed=st.integers(0, 999))
    def sweep(n, h, v, dtype, h_layout, w_layout, bias, reduction, ignored, chunk_rows, g, seed):
        _check(n, h, v, dtype, h_layout=h_layout, w_layout=w_layout, bias=bias, reduction=reduction,
               ignored=ignored, chunk_rows=chunk_rows, g=g, seed=seed)

    sweep()


# ---------------------------------------------------------------- without the interpreter
def test_reference_step_for_float64_and_the_cpu_fallback() -> None:
    """float64 takes the torch step (a one-time warning under the interpreter, where a kernel could
    have run) and equals the spec; a process without TRITON_INTERPRET computes CPU tensors with the
    torch step and matches float64."""
    gen = torch.Generator().manual_seed(12)
    x, w = _leaf(_hidden(10, 8, torch.float64, "contiguous", gen)), _leaf(_weight(50, 8, torch.float64, "contiguous", gen))
    y = _labels(10, 50, "some", gen)
    CALLS.clear()
    loss = linear_cross_entropy(x, w, y, chunk_rows=3)
    assert CALLS["linear_ce_fwd:reference"] == 1 and loss.dtype == torch.float64
    loss.backward()
    x64, w64 = _leaf(x), _leaf(w)
    naive.linear_ce_ref(x64, w64, y).backward()
    assert abs(loss.item() - naive.linear_ce_ref(x64, w64, y).item()) <= 1e-12
    assert _err(x.grad, x64.grad) <= 1e-12 and _err(w.grad, w64.grad) <= 1e-12

    code = (
        "import torch\n"
        "from fastpath.kernels.counters import CALLS\n"
        "from fastpath.kernels.linear_ce.interface import linear_cross_entropy\n"
        "from fastpath.kernels.linear_ce import naive\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(9, 8, generator=g).requires_grad_(); w = (0.5 * torch.randn(70, 8, generator=g)).requires_grad_()\n"
        "y = torch.randint(0, 70, (9,), generator=g); y[2] = -100\n"
        "loss = linear_cross_entropy(x, w, y, chunk_rows=4); loss.backward()\n"
        "x64 = x.detach().double().requires_grad_(); w64 = w.detach().double().requires_grad_()\n"
        "ref = naive.linear_ce_ref(x64, w64, y); ref.backward()\n"
        "assert CALLS['linear_ce_fwd:reference'] == 1 and not CALLS['linear_ce_fwd:triton']\n"
        "assert abs(loss.item() - ref.item()) < 1e-5\n"
        "assert (x.grad.double() - x64.grad).abs().max() < 1e-6 and (w.grad.double() - w64.grad).abs().max() < 1e-6\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_bad_input_is_a_one_line_error() -> None:
    x, w, y = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, -100, 3])
    with pytest.raises(ValueError, match="label 10 is outside"):
        linear_cross_entropy(x, w, torch.tensor([1, 10, 2, 3]))
    with pytest.raises(ValueError, match=r"\(N, H\)"):
        linear_cross_entropy(x, torch.randn(10, 7), y)
    with pytest.raises(ValueError, match="labels"):
        linear_cross_entropy(x, w, y[:3])
    with pytest.raises(ValueError, match="integers"):
        linear_cross_entropy(x, w, y.float())
    with pytest.raises(ValueError, match="one floating dtype"):
        linear_cross_entropy(x, w.double(), y)
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, w, y, reduction="none")
    with pytest.raises(ValueError, match="bias"):
        linear_cross_entropy(x, w, y, bias=torch.randn(9))
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(x, w, y, chunk_rows=-1)


def test_chunk_rows_for_the_27b_head() -> None:
    """V = 248,320: 1,024 rows per chunk (float32 logits <= 1 GiB), even chunks otherwise; with a
    bf16 dW wanted (H = 5120), one chunk up to 1,024 + 2 x 5,120 rows (its bf16 logits cost no more
    than a chunk plus the float32 accumulator), chunks beyond."""
    assert chunk_rows_for(4096, 248320, width=5120, itemsize=2, accumulate=True) == 4096
    assert chunk_rows_for(11264, 248320, width=5120, itemsize=2, accumulate=True) == 11264
    assert chunk_rows_for(11265, 248320, width=5120, itemsize=2, accumulate=True) == 939  # 12 even chunks
    assert chunk_rows_for(32768, 248320, width=5120, itemsize=2, accumulate=True) == 1024
    assert chunk_rows_for(4096, 248320) == 1024
    assert chunk_rows_for(4095, 248320) == 1024
    assert chunk_rows_for(4097, 248320) == 820  # 5 even chunks, not 4 + a sliver
    assert chunk_rows_for(10, 248320) == 10
    assert chunk_rows_for(100, 300, chunk_bytes=4 * 300 * 7) == 7
    assert chunk_rows_for(5, 10**12) == 1


def test_fake_implementation_and_schema() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(6, 8, dtype=torch.bfloat16), torch.empty(30, 8, dtype=torch.bfloat16)
        y = torch.empty(6, dtype=torch.int64)
        loss, dx, dw, db = linear_ce_fwd(x, w, y, None, -100, "mean", 0, True, True)
        assert loss.shape == () and loss.dtype == torch.float32
        assert dx.shape == x.shape and dx.dtype == x.dtype and dw.shape == w.shape and db.numel() == 0
    args = (torch.randn(6, 8), torch.randn(30, 8), torch.randint(0, 30, (6,)), torch.randn(30), -100, "sum", 4,
            True, True)
    torch.library.opcheck(linear_ce_fwd, args, test_utils=("test_schema", "test_faketensor"))


def test_compiled_has_no_graph_break_and_matches_eager() -> None:
    """torch.compile(fullgraph=True, aot_eager) keeps the op in one graph and runs its registered
    autograd: the same loss and gradients as the eager call."""
    import torch._dynamo

    def step(x, w, y):
        return linear_cross_entropy(x, w, y, chunk_rows=3) * 2.0

    gen = torch.Generator().manual_seed(13)
    x0, w0 = _hidden(7, 8, torch.float32, "contiguous", gen), _weight(40, 8, torch.float32, "contiguous", gen)
    y = _labels(7, 40, "some", gen)
    torch._dynamo.reset()
    report = torch._dynamo.explain(step)(_leaf(x0), _leaf(w0), y)
    assert report.graph_break_count == 0 and report.graph_count == 1, report.break_reasons
    results = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        x, w = _leaf(x0), _leaf(w0)
        loss = fn(x, w, y)
        loss.backward()
        results.append((loss.detach(), x.grad, w.grad))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_kernel_compiles_for_hopper() -> None:
    """The chunk step at V = 248,320 compiles for sm_90 with Triton's bundled ptxas, no spills, in
    either pass-2 order (benchmarks/kernel_compile_check.py's machinery, in a process without the
    interpreter)."""
    ptxas = Path(sys.modules["triton"].__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this Triton wheel has no bundled ptxas")
    code = (
        "import torch\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import make_backend\n"
        "import kernel_compile_check as k\n"
        "from fastpath.kernels.linear_ce import fwd_bwd\n"
        "target = GPUTarget('cuda', 90, 32); backend = make_backend(target)\n"
        "v = 248320; logits = torch.empty(4, v, dtype=torch.bfloat16); labels = torch.zeros(4, dtype=torch.int64)\n"
        "args = (logits, v, labels, 1, torch.empty(4), torch.ones(1), 4, v, -100)\n"
        "for reverse in (False, True):\n"
        "    kw = dict(WRITE_GRAD=True, RNE=False, BLOCK_V=fwd_bwd.block_v(v), REVERSE=reverse, num_warps=8)\n"
        "    sig, const, attrs, opts, _ = k.specialise(fwd_bwd._ce_rows_kernel, args, kw, backend)\n"
        "    row = k.compile_launch(fwd_bwd._ce_rows_kernel, sig, const, attrs, opts, target)\n"
        "    assert row['spill_store_bytes'] == 0 and 0 < row['regs'] <= 255, row\n"
        "    print('ok', reverse, row)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


# ---------------------------------------------------------------- device only
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
QWEN35_27B_HEAD = {"n": 4096, "hidden": 5120, "vocab": 248320}  # B=1, L=4096; Qwen3.5-27B config.json


def _materialised(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """transformers' path: bf16 logits, float32 cross-entropy, autograd."""
    xt, wt = _leaf(x), _leaf(w)
    loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(xt, wt).float(), y)
    loss.backward()
    return loss.detach(), xt.grad, wt.grad


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("chunk_rows", [None, 1024, 333])
def test_gpu_27b_head_against_float32_cross_entropy(chunk_rows: int | None) -> None:  # pragma: no cover
    """Loss, dhidden and dweight against a float32 computation (float32 GEMMs, TF32 off): no
    further than 1.5x torch's materialised bf16 path plus a floor; dweight bitwise equal run to run.
    Default (one chunk here), 4 chunks and 13 uneven ones (the float32 dW accumulator)."""
    n, h, v = QWEN35_27B_HEAD["n"], QWEN35_27B_HEAD["hidden"], QWEN35_27B_HEAD["vocab"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=gen)
    y[-1] = -100  # the shifted-out last position
    y[::7] = -100
    runs = []
    for _ in range(2):
        CALLS.clear()
        xo, wo = _leaf(x), _leaf(w)
        loss = linear_cross_entropy(xo, wo, y, chunk_rows=chunk_rows)
        loss.backward()
        assert CALLS["linear_ce_fwd:triton"] == 1
        runs.append((loss.detach(), xo.grad, wo.grad))
    assert torch.equal(runs[0][2], runs[1][2]) and torch.equal(runs[0][1], runs[1][1])
    theirs = _materialised(x, w, y)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        x32, w32 = _leaf(x, torch.float32), _leaf(w, torch.float32)
        ref_loss = torch.nn.functional.cross_entropy(x32 @ w32.t(), y)
        ref_loss.backward()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    ref = (ref_loss.detach(), x32.grad, w32.grad)
    for name, o, t, r in zip(("loss", "dhidden", "dweight"), runs[0], theirs, ref, strict=True):
        e_ours = (o.float() - r).abs().max().item()
        e_theirs = (t.float() - r).abs().max().item()
        floor = 2e-3 * r.abs().max().item()
        assert e_ours <= 1.5 * e_theirs + floor, f"{name}: {e_ours:.3e} vs torch {e_theirs:.3e}"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("chunk_rows", [None, 1024])
def test_gpu_27b_head_peak_memory(chunk_rows: int | None) -> None:  # pragma: no cover - device only
    """The extra peak of loss + backward over the inputs. The op holds its logits buffer (default
    here: all 4,096 rows in bf16, 2.0 GB; chunks of 1,024: 0.5 GB plus the float32 dW accumulator,
    5.1 GB), dW (2.5 GB) and dX; the materialised path holds the float32 logits, log-softmax output
    and gradients (~12 GB). Ours must stay within that accounting + 256 MiB, and below 0.45x (one
    chunk) / 0.75x (chunks) of the materialised path's."""
    n, h, v = QWEN35_27B_HEAD["n"], QWEN35_27B_HEAD["hidden"], QWEN35_27B_HEAD["vocab"]
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n, h, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=gen)

    def extra_peak(fn) -> int:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    def ours() -> None:
        xo, wo = _leaf(x), _leaf(w)
        linear_cross_entropy(xo, wo, y, chunk_rows=chunk_rows).backward()

    def materialised() -> None:
        _materialised(x, w, y)

    ours()  # compile the kernel outside the measurement
    peak_ours, peak_theirs = extra_peak(ours), extra_peak(materialised)
    rows = chunk_rows or chunk_rows_for(n, v, width=h, itemsize=2, accumulate=True)
    accumulator = v * h * 4 if rows < n else 0
    budget = rows * v * 2 + accumulator + v * h * 2 + 2 * n * h * 2 + (256 << 20)
    assert peak_ours <= budget, (peak_ours, budget)
    assert peak_ours <= (0.45 if rows == n else 0.75) * peak_theirs, (peak_ours, peak_theirs)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [None, 8])
def test_gpu_small_odd_shapes(dtype: torch.dtype, chunk_rows: int | None) -> None:  # pragma: no cover
    """Odd sizes on the device (a vocabulary and rows that fill no block, ignored rows, a bias,
    several chunks): the compiled kernels against float64, and small enough for memcheck."""
    _check(37, 72, 1001, dtype, bias=True, chunk_rows=chunk_rows, g=0.7, device="cuda")


@pytest.mark.gpu
@needs_cuda
def test_gpu_inductor_fullgraph() -> None:  # pragma: no cover - device only
    """Inductor on the device: one graph with the custom op inside, the same loss and gradients as
    eager (a Qwen3.5-27B-wide head on 1,024 rows, bf16, forced into 3 chunks)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    x0 = torch.randn(1024, 5120, device="cuda", generator=gen).to(torch.bfloat16)
    w0 = (0.02 * torch.randn(248320, 5120, device="cuda", generator=gen)).to(torch.bfloat16)
    y = torch.randint(0, 248320, (1024,), device="cuda", generator=gen)

    def step(x, w):
        return linear_cross_entropy(torch.nn.functional.silu(x), w, y, chunk_rows=400) * 0.5

    outs = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        x, w = _leaf(x0), _leaf(w0)
        loss = fn(x, w)
        loss.backward()
        outs.append((loss.detach(), x.grad, w.grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=2e-2, atol=1e-4)
    torch.testing.assert_close(outs[0][2], outs[1][2], rtol=2e-2, atol=1e-4)
