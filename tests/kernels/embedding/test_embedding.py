"""fastpath's token embedding (kernels/embedding): torch's gather forward, and a weight gradient
written in one pass, against its float64 reference and torch's own embedding backward.

On CPU the Triton kernel runs under TRITON_INTERPRET=1 (skipped otherwise): never-zero output
gradients, fp32 / fp16 / bf16, int32 and int64 ids of one to three dimensions with repeated ids
(one id taking many tokens), every option of the signature (padding_idx positive, negative and
None; scale_grad_by_freq), output-gradient layouts (contiguous, row-strided with NaN in the
gaps, transposed, stride-0 broadcast), tables around the kernel's row and column blocks, no tokens
at all, every row of a NaN-filled output overwritten, a hypothesis sweep; the reference fallback;
the custom ops under torch.compile with no graph break. Precision: each gradient element within
one rounding of its float64 value plus float32 accumulation over its terms. The `gpu` group runs
a Qwen3.5-27B-sized table on the device.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kernel_checks import compiled_matches_eager  # noqa: E402

from fastpath.kernels.counters import CALLS  # noqa: E402
from fastpath.kernels.embedding import naive  # noqa: E402
from fastpath.kernels.embedding.interface import embedding, embedding_bwd, embedding_fwd  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="runs the Triton kernel: needs TRITON_INTERPRET=1")
ROUND = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "row-strided", "transposed", "broadcast"]


def _ids(shape: tuple[int, ...], vocab: int, gen: torch.Generator, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    ids = torch.randint(0, vocab, shape, generator=gen)
    flat = ids.view(-1)
    flat[: max(1, flat.numel() // 3)] = vocab // 2  # one id takes a third of the tokens
    return ids.to(dtype)


def _dout(shape: tuple[int, ...], dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    """Never-zero values in `dtype` laid out as `layout`; whatever a view does not cover is NaN."""
    values = torch.randn(shape, generator=gen)
    values = values + 0.01 * torch.where(values < 0, -1.0, 1.0)
    *lead, width = shape
    if layout == "row-strided":
        return torch.full((*lead, 2 * width), float("nan"), dtype=dtype)[..., :width].copy_(values)
    if layout == "transposed" and len(lead) >= 2:
        return torch.empty(lead[1], lead[0], *lead[2:], width, dtype=dtype).transpose(0, 1).copy_(values)
    if layout == "broadcast":
        return values.reshape(-1, width)[0].to(dtype).expand(*lead, width)
    return values.to(dtype)


def _close(got: torch.Tensor, ids: torch.Tensor, dout: torch.Tensor, vocab: int, pad: int | None,
           scale: bool, dtype: torch.dtype) -> None:
    """Each element within one rounding of its float64 value plus float32 accumulation error
    (tokens of the row x 2^-24 x the sum of its terms' magnitudes)."""
    want = naive.embedding_bwd_ref(ids, dout, vocab, pad, scale)
    terms = naive.embedding_bwd_ref(ids, dout.double().abs(), vocab, pad, scale)
    count = torch.bincount(ids.reshape(-1).long(), minlength=vocab).double()[:, None]
    bound = ROUND[dtype] * want.abs() + count * 2.0 ** -24 * terms + torch.finfo(dtype).tiny
    assert got.shape == (vocab, dout.shape[-1]) and got.dtype == dtype and got.is_contiguous()
    err = (got.double() - want).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item():.3e}, bound there {bound.flatten()[err.argmax()].item():.3e}"


def _run(ids: torch.Tensor, vocab: int, width: int, dtype: torch.dtype, layout: str, pad: int | None,
         scale: bool, gen: torch.Generator) -> torch.Tensor:
    weight = torch.randn(vocab, width, generator=gen).to(dtype).requires_grad_(True)
    out = embedding(ids, weight, pad, scale)
    torch.testing.assert_close(out, torch.nn.functional.embedding(ids, weight.detach(), pad), rtol=0, atol=0)
    dout = _dout((*ids.shape, width), dtype, layout, gen)
    out.backward(dout)
    norm_pad = None if pad is None else pad % vocab
    _close(weight.grad, ids, dout, vocab, norm_pad, scale, dtype)
    return weight.grad


@needs_interp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_matches_float64(dtype: torch.dtype, layout: str) -> None:
    gen = torch.Generator().manual_seed(1)
    CALLS.clear()
    _run(_ids((3, 7), 29, gen), 29, 40, dtype, layout, None, False, gen)
    assert CALLS["embedding_bwd:triton"] == 1 and not CALLS["embedding_bwd:reference"]


@needs_interp
@pytest.mark.parametrize("pad", [None, 0, 5, -1, -29])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_every_option(pad: int | None, scale: bool, id_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    ids = _ids((2, 3, 5), 29, gen, id_dtype)
    if pad is not None:
        ids.view(-1)[-3:] = pad % 29  # the padding row is looked up, and still gets no gradient
    grad = _run(ids, 29, 24, torch.bfloat16, "contiguous", pad, scale, gen)
    if pad is not None:
        assert not grad[pad].any()


@needs_interp
@pytest.mark.parametrize(("vocab", "width"), [(1, 1), (7, 1), (8, 33), (9, 1024), (17, 1025), (3, 2100)])
def test_tables_around_the_blocks(vocab: int, width: int) -> None:
    """One row and one column, a partial row block, exactly one, one over; a column block and one
    column more; several column blocks."""
    gen = torch.Generator().manual_seed(3)
    _run(_ids((11,), vocab, gen), vocab, width, torch.float32, "contiguous", None, False, gen)


@needs_interp
def test_every_row_is_written() -> None:
    """The kernel replaces a zero fill: given a NaN-filled output, no element keeps its NaN, and
    the rows no token looks up are exactly zero."""
    from fastpath.kernels.embedding.bwd import weight_grad

    gen = torch.Generator().manual_seed(4)
    ids = _ids((13,), 21, gen)
    dout = _dout((13, 70), torch.bfloat16, "contiguous", gen)
    out = torch.full((21, 70), float("nan"), dtype=torch.bfloat16)
    got = weight_grad(ids, dout, 21, None, False, torch.bfloat16, out=out)
    assert got.data_ptr() == out.data_ptr() and not got.isnan().any()
    unused = torch.ones(21, dtype=torch.bool)
    unused[ids] = False
    assert unused.any() and not got[unused].any()
    _close(got, ids, dout, 21, None, False, torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        weight_grad(ids, dout, 21, None, False, torch.float32, out=out)


@needs_interp
def test_launch_choices_change_no_bit() -> None:
    """Rows per program and the column block only move work between programs: same bits."""
    from fastpath.kernels.embedding.bwd import weight_grad

    gen = torch.Generator().manual_seed(9)
    ids = _ids((19,), 23, gen)
    dout = _dout((19, 150), torch.bfloat16, "contiguous", gen)
    first = weight_grad(ids, dout, 23, 2, True, torch.bfloat16)
    for rows, block in ((1, 32), (3, 64), (8, 128), (16, 1024)):
        assert torch.equal(weight_grad(ids, dout, 23, 2, True, torch.bfloat16, rows_per_program=rows,
                                       block_h=block), first), (rows, block)


@needs_interp
def test_no_tokens() -> None:
    weight = torch.randn(6, 10, requires_grad=True)
    out = embedding(torch.empty(0, dtype=torch.long), weight)
    out.sum().backward()
    assert out.shape == (0, 10) and weight.grad is not None and not weight.grad.any()


@needs_interp
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_no_worse_than_torch(dtype: torch.dtype) -> None:
    """torch's own embedding backward in the same dtype, as the bar: no further from float64 than
    twice its distance (on the CPU torch sums in the table's dtype; the kernel sums in float32)."""
    gen = torch.Generator().manual_seed(5)
    ids = _ids((64,), 40, gen)
    dout = _dout((64, 48), dtype, "contiguous", gen)
    theirs = torch.randn(40, 48, generator=gen).to(dtype).requires_grad_(True)
    torch.nn.functional.embedding(ids, theirs).backward(dout)
    ours = theirs.detach().clone().requires_grad_(True)
    embedding(ids, ours).backward(dout)
    want = naive.embedding_bwd_ref(ids, dout, 40)
    d_ours = (ours.grad.double() - want).abs().max().item()
    d_theirs = (theirs.grad.double() - want).abs().max().item()
    assert d_ours <= 2 * d_theirs + 1e-12, (d_ours, d_theirs)


@needs_interp
@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(1, 40), width=st.integers(1, 300), tokens=st.integers(0, 40),
       dtype=st.sampled_from(DTYPES), layout=st.sampled_from(LAYOUTS), scale=st.booleans(),
       pad=st.one_of(st.none(), st.integers(-40, 39)), seed=st.integers(0, 2**16))
def test_hypothesis_sweep(vocab: int, width: int, tokens: int, dtype: torch.dtype, layout: str,
                          scale: bool, pad: int | None, seed: int) -> None:
    if pad is not None and not -vocab <= pad < vocab:
        pad = pad % vocab
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (tokens,), generator=gen)
    _run(ids, vocab, width, dtype, layout if tokens else "contiguous", pad, scale, gen)


def test_reference_path_on_cpu(monkeypatch) -> None:
    """Without the interpreter a CPU call takes the float32 reference, counted as such."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(6)
    CALLS.clear()
    _run(_ids((4, 5), 13, gen), 13, 16, torch.bfloat16, "transposed", 3, True, gen)
    assert CALLS["embedding_bwd:reference"] == 1 and not CALLS["embedding_bwd:triton"]


@needs_interp
def test_float64_falls_back_with_one_warning() -> None:
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(9, 8, dtype=torch.float64, requires_grad=True)
    CALLS.clear()
    with pytest.warns(RuntimeWarning, match="float32, float16, bfloat16"):
        embedding(_ids((6,), 9, gen), weight).sum().backward()
    assert CALLS["embedding_bwd:reference"] == 1


def test_bad_arguments() -> None:
    weight = torch.randn(5, 4, requires_grad=True)
    with pytest.raises(ValueError, match="int32 or int64"):
        embedding(torch.zeros(3), weight)
    with pytest.raises(ValueError, match="padding_idx 5 is outside"):
        embedding(torch.zeros(3, dtype=torch.long), weight, padding_idx=5)
    with pytest.raises(ValueError, match=r"\(vocab, H\)"):
        embedding(torch.zeros(3, dtype=torch.long), torch.randn(5))
    with pytest.raises(ValueError, match="ids' shape"):
        embedding_bwd(torch.zeros(3, dtype=torch.long), torch.randn(4, 4), 5, None, False)


@needs_interp
def test_custom_ops_under_torch_compile() -> None:
    """One graph, no break; the registered backward runs once; gradients equal eager's bit for bit."""
    ids = _ids((2, 6), 11, torch.Generator().manual_seed(8))

    def step(weight: torch.Tensor) -> torch.Tensor:
        return (embedding(ids, weight, 4, True) * torch.arange(1.0, 14.0)).sum()

    compiled_matches_eager(step, (torch.randn(11, 13),), "embedding_bwd")
    fake = embedding_fwd(ids, torch.randn(11, 13), None, False)
    assert fake.shape == (2, 6, 13)


# ---------------------------------------------------------------- device only

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_at_27b_vocabulary(dtype: torch.dtype) -> None:  # pragma: no cover - device only
    """Qwen3.5-27B's table (vocab 248,320 x hidden 5,120, Qwen/Qwen3.5-27B config.json) over 4,096
    tokens with a repeated id, then a small odd table with padding and frequency scaling: the rows
    looked up within one rounding of float64 and no further than twice torch's CUDA backward, every
    other row exactly zero (the kernel writes every row: no NaN of a poisoned allocation survives)."""
    from fastpath.kernels.embedding.bwd import weight_grad

    gen = torch.Generator().manual_seed(13)
    for vocab, width, tokens, pad, scale in ((248320, 5120, 4096, None, False), (1001, 333, 517, 7, True)):
        ids = _ids((1, tokens), vocab, gen).cuda()
        dout = _dout((1, tokens, width), dtype, "contiguous", gen).cuda()
        out = torch.full((vocab, width), float("nan"), dtype=dtype, device="cuda")
        CALLS.clear()
        got = weight_grad(ids, dout, vocab, pad, scale, dtype, out=out)
        torch.cuda.synchronize()
        looked_up, compact = torch.unique(ids.reshape(-1), return_inverse=True)
        keep = looked_up != (-1 if pad is None else pad)
        rest = torch.ones(vocab, dtype=torch.bool, device="cuda")
        rest[looked_up[keep]] = False
        assert not got.isnan().any() and not got[rest].any()
        want = naive.embedding_bwd_ref(compact, dout, looked_up.numel(), None, scale)[keep]
        theirs = torch.zeros(vocab, width, dtype=dtype, device="cuda", requires_grad=True)
        torch.nn.functional.embedding(ids, theirs, pad, scale_grad_by_freq=scale).backward(dout)
        rows = looked_up[keep]
        d_ours = (got[rows].double() - want).abs().max().item()
        d_theirs = (theirs.grad[rows].double() - want).abs().max().item()
        assert d_ours <= 2 * d_theirs + ROUND[dtype] * want.abs().max().item(), (d_ours, d_theirs)
