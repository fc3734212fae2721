"""Memory safety on CPU: every kernel case runs under TRITON_INTERPRET=1 on tensors that end (or
begin) at a PROT_NONE page (tests/support/guard_pages.py), in a subprocess, so a load or store one element
past any input or output faults and names the case. compute-sanitizer does the same on the GPU
(benchmarks/device/memcheck.sh); this keeps the masks honest in CI, where no GPU runs.

The conv varlen-states case reproduces an overrun memcheck found on the H200: the last row tile
(state_len < its power-of-two tile) read past the final sequence's last token.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from repo_paths import SUPPORT

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux mmap/mprotect")


def _g(t: torch.Tensor, side: str) -> torch.Tensor:
    from guard_pages import guarded_copy

    return guarded_copy(t, side)  # type: ignore[arg-type]


def _rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def case_conv_varlen_states(side: str) -> None:
    from fastpath.causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states

    for dtype, state_len in ((torch.bfloat16, 5), (torch.float32, 3), (torch.float32, 20)):
        x = _g(_rand(40, 24, dtype=dtype), side)
        cu = _g(torch.tensor([0, 3, 3, 20, 40], dtype=torch.int32), side)
        causal_conv1d_varlen_states(x, cu, state_len)


def case_conv_fn(side: str) -> None:
    from fastpath.causal_conv1d import causal_conv1d_fn

    for dim, length, width in ((5, 7, 4), (33, 19, 3)):
        x = _g(_rand(2, dim, length), side).requires_grad_()
        w = _g(_rand(dim, width, seed=1), side).requires_grad_()
        b = _g(_rand(dim, seed=2), side).requires_grad_()
        init = _g(_rand(2, dim, width - 1, seed=3), side)
        y = causal_conv1d_fn(x, w, b, initial_states=init, activation="silu")
        y.backward(_g(_rand(*y.shape, seed=4), side))


def case_conv_update(side: str) -> None:
    from fastpath.causal_conv1d import causal_conv1d_update

    for dim, state_len in ((5, 3), (33, 6)):
        x = _g(_rand(2, dim, 2), side)
        state = _g(_rand(2, dim, state_len, seed=1), side)
        causal_conv1d_update(x, state, _g(_rand(dim, 4, seed=2), side), _g(_rand(dim, seed=3), side),
                             activation="silu", cache_seqlens=_g(torch.tensor([1, 5], dtype=torch.int32), side))


def case_selective_scan(side: str) -> None:
    from fastpath.kernels.selective_scan.interface import selective_scan_fn

    dim, n, length = 6, 4, 11
    shapes = {"varying": (2, n, length), "invariant": (dim, n)}
    for b_kind, c_kind in (("varying", "varying"), ("invariant", "varying"),
                           ("varying", "invariant"), ("invariant", "invariant")):
        u = _g(_rand(2, dim, length), side).requires_grad_()
        delta = _g(_rand(2, dim, length, seed=1).abs() * 0.5, side).requires_grad_()
        a = _g(-_rand(dim, n, seed=2).abs(), side).requires_grad_()
        bb = _g(_rand(*shapes[b_kind], seed=3), side).requires_grad_()
        cc = _g(_rand(*shapes[c_kind], seed=4), side).requires_grad_()
        d = _g(_rand(dim, seed=5), side).requires_grad_()
        z = _g(_rand(2, dim, length, seed=6), side).requires_grad_()
        bias = _g(_rand(dim, seed=7), side).requires_grad_()
        out, last = selective_scan_fn(u, delta, a, bb, cc, d, z, bias, delta_softplus=True,
                                      return_last_state=True)
        (out.sum() + last.sum()).backward()


def case_selective_state_update(side: str) -> None:
    from fastpath.kernels.selective_scan.update import selective_state_update

    dim, n = 6, 4
    state = _g(_rand(3, dim, n), side)
    selective_state_update(state, _g(_rand(2, dim, seed=1), side), _g(_rand(2, dim, seed=2), side),
                           _g(-_rand(dim, n, seed=3).abs(), side), _g(_rand(2, n, seed=4), side),
                           _g(_rand(2, n, seed=5), side), D=_g(_rand(dim, seed=6), side),
                           z=_g(_rand(2, dim, seed=7), side), dt_bias=_g(_rand(dim, seed=8), side),
                           dt_softplus=True,
                           state_batch_indices=_g(torch.tensor([2, 0], dtype=torch.int32), side))


def case_ssd(side: str) -> None:
    from fastpath.kernels.ssd.interface import mamba_chunk_scan_combined

    batch, length, heads, head_dim, groups, n = 1, 13, 2, 4, 1, 8
    x = _g(_rand(batch, length, heads, head_dim), side).requires_grad_()
    dt = _g(_rand(batch, length, heads, seed=1).abs(), side).requires_grad_()
    a = _g(-_rand(heads, seed=2).abs(), side).requires_grad_()
    bb = _g(_rand(batch, length, groups, n, seed=3), side).requires_grad_()
    cc = _g(_rand(batch, length, groups, n, seed=4), side).requires_grad_()
    y = mamba_chunk_scan_combined(x, dt, a, bb, cc, 8, D=_g(_rand(heads, seed=5), side),
                                  dt_bias=_g(_rand(heads, seed=6), side), dt_softplus=True)
    y.sum().backward()


def case_glue_and_norm(side: str) -> None:
    from fastpath.kernels.gdn_gates.interface import gdn_gates
    from fastpath.kernels.rotary.interface import rotary
    from fastpath.kernels.sigmoid_gate.interface import sigmoid_gate
    from fastpath.kernels.state_stats.interface import state_stats
    from fastpath.kernels.swiglu.interface import silu_mul
    from fastpath.kernels.zc_rmsnorm.interface import zc_rmsnorm

    a = _g(_rand(3, 5, 6), side).requires_grad_()
    b = _g(_rand(3, 5, 6, seed=1), side).requires_grad_()
    g, beta = gdn_gates(a, b, _g(_rand(6, seed=2), side), _g(_rand(6, seed=3), side))
    (g.sum() + beta.sum()).backward()
    x = _g(_rand(7, 12, seed=4), side).requires_grad_()
    sigmoid_gate(x, _g(_rand(7, 12, seed=5), side)).sum().backward()
    for width, rot in ((10, 6), (8, 8)):  # partial and full rotary; q a transpose view of (B, L, H, D)
        q = _g(_rand(2, 5, 3, width, seed=11), side).transpose(1, 2).requires_grad_()
        out = rotary(q, _g(_rand(2, 5, rot, seed=12), side), _g(_rand(2, 5, rot, seed=13), side))
        out.backward(_g(_rand(2, 3, 5, width, seed=14), side))
    silu_mul(_g(_rand(5, 9, seed=8), side).requires_grad_(), _g(_rand(5, 9, seed=9), side)).sum().backward()
    state_stats(_g(_rand(6, 11, seed=10), side))
    y = zc_rmsnorm(_g(_rand(7, 40, seed=6), side).requires_grad_(), _g(_rand(40, seed=7), side).requires_grad_())
    y.sum().backward()


def case_linear_ce(side: str) -> None:
    from fastpath.kernels.linear_ce.interface import linear_cross_entropy

    labels = torch.tensor([3, -100, 0, 40, 7, 2, 40], dtype=torch.int64)
    for chunk_rows in (None, 3):
        x = _g(_rand(7, 12), side).requires_grad_()
        w = _g(_rand(41, 12, seed=1), side).requires_grad_()
        b = _g(_rand(41, seed=2), side).requires_grad_()
        linear_cross_entropy(x, w, _g(labels, side), bias=b, chunk_rows=chunk_rows).backward()


CASES: dict[str, Callable[[str], None]] = {
    name[len("case_"):]: fn for name, fn in list(globals().items()) if name.startswith("case_")
}


@pytest.mark.parametrize("side", ["end", "start"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_access_outside_the_tensors(case: str, side: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    code = f"import test_guard_pages as t; t.CASES[{case!r}]({side!r}); print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode < 0:
        pytest.fail(f"{case} ({side} guard): killed by signal {-proc.returncode}: a kernel touched "
                    f"memory past a tensor's {side}\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
