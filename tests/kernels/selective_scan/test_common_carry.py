"""common_carry.carry_walk against a float64 loop: every piece count around the tile size, both walking
orders, fewer pieces to read than to write (the tile forward's segments), masked elements."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.kernels.dispatch import use_triton
from fastpath.kernels.selective_scan.common_carry import carry_walk

pytestmark = pytest.mark.skipif(not use_triton(torch.empty(0)),
                                reason="runs the kernel on CPU tensors: needs TRITON_INTERPRET=1")


@triton.jit
def _walk_kernel(PBUF, XBUF, CARRY, OUT, n_pieces, n_read, n_write, n_elems, REVERSE: tl.constexpr,
                 BLOCK: tl.constexpr, K: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < n_elems
    carry = tl.load(CARRY + b * n_elems + e, mask=m, other=0.0)
    base = b * n_pieces * n_elems
    if REVERSE:
        left = carry_walk(PBUF, XBUF, base, e, m, carry, n_write - 1, -1, n_read, n_write,
                          n_elems, K)
    else:
        left = carry_walk(PBUF, XBUF, base, e, m, carry, 0, 1, n_read, n_write, n_elems, K)
    tl.store(OUT + b * n_elems + e, left, mask=m)


def _reference(P, X, carry, n_read, n_write, reverse):
    """The sequential walk in float64: X[c] <- value entering c; carry = P[c] carry + X[c]."""
    P, X, h = P.double(), X.double().clone(), carry.double().clone()
    order = range(n_write - 1, -1, -1) if reverse else range(n_write)
    for c in order:
        x = X[:, c].clone()
        X[:, c] = h
        if c < n_read:  # a piece past n_read is the identity
            h = P[:, c] * h + x
    return X, h


def _run(batch, n_write, n_read, elems, reverse, K, block, seed):
    g = torch.Generator().manual_seed(seed)
    P = torch.rand((batch, n_write, elems), generator=g) * 0.9 + 0.1  # decays in (0.1, 1]
    X = torch.randn((batch, n_write, elems), generator=g)
    carry = torch.randn((batch, elems), generator=g)
    want_X, want_h = _reference(P, X, carry, n_read, n_write, reverse)
    got_X, out, P_before = X.clone(), torch.empty_like(carry), P.clone()
    _walk_kernel[(triton.cdiv(elems, block), batch)](
        P, got_X, carry, out, n_write, n_read, n_write, elems, REVERSE=reverse, BLOCK=block, K=K)
    torch.testing.assert_close(got_X.double(), want_X, rtol=1e-5, atol=1e-5)
    if n_read == n_write:  # the value leaving the last piece read
        torch.testing.assert_close(out.double(), want_h, rtol=1e-5, atol=1e-5)
    assert torch.equal(P, P_before)  # P is only read


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 13])
def test_every_piece_count(n, reverse):
    _run(batch=2, n_write=n, n_read=n, elems=37, reverse=reverse, K=4, block=16, seed=n)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_segments_read_one_fewer(n):
    """The tile forward's combine: n segments enter, n - 1 have a states-pass entry."""
    _run(batch=1, n_write=n, n_read=n - 1, elems=20, reverse=False, K=4, block=16, seed=100 + n)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 20), elems=st.integers(1, 40), reverse=st.booleans(),
       K=st.sampled_from([2, 4, 8]), seed=st.integers(0, 2**16))
def test_hypothesis_sweep(n, elems, reverse, K, seed):
    _run(batch=1, n_write=n, n_read=n, elems=elems, reverse=reverse, K=K, block=16, seed=seed)
