"""tests/support/liger_interpreter.py's NumPy path for `xor_sum` (the Triton interpreter otherwise
reduces it element by element in Python): the same integers as the interpreter's own loop for
each integer width, per axis and over the whole block, and `tl.sort` (a bitwise network of xor
reductions) still sorts. Run in a child process: the adaptation patches the interpreter for the
rest of the process it runs in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import ROOT

pytest.importorskip("torch")
pytest.importorskip("triton")

CHILD = r'''
import functools
import operator
import sys
import torch
import triton
import triton.language as tl

@triton.jit
def xors(x_ptr, rows_ptr, all_ptr, M: tl.constexpr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :])
    tl.store(rows_ptr + tl.arange(0, M), tl.xor_sum(x, axis=1))
    tl.store(all_ptr, tl.xor_sum(tl.xor_sum(x, axis=0), axis=0))

@triton.jit
def sort(x_ptr, out_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(out_ptr + tl.arange(0, N), tl.sort(x))

def run():
    got = []
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (8, 32), generator=torch.Generator().manual_seed(3),
                          dtype=torch.int64).to(dtype)
        rows, whole = torch.empty(8, dtype=dtype), torch.empty(1, dtype=dtype)
        xors[(1,)](x, rows, whole, 8, 32)
        got.append((x, rows, whole))
    x = torch.randn(64, generator=torch.Generator().manual_seed(4))
    out = torch.empty(64)
    sort[(1,)](x, out, 64)
    assert torch.equal(out, x.sort().values)
    return got

sys.path.insert(0, sys.argv[1])
from liger_interpreter import xor_reduce_in_numpy

loop = run()
assert xor_reduce_in_numpy() and not xor_reduce_in_numpy()  # installed once
numpy_path = run()
for (x, rows_a, whole_a), (_, rows_b, whole_b) in zip(loop, numpy_path):
    assert torch.equal(rows_a, rows_b) and torch.equal(whole_a, whole_b), (rows_a, rows_b)
    # and both are the xor of the rows' integers, reduced here in Python
    assert rows_a.tolist() == [functools.reduce(operator.xor, row) for row in x.tolist()], x.dtype
    assert whole_a.item() == functools.reduce(operator.xor, x.flatten().tolist()), x.dtype
print("ok")
'''


def test_xor_sum_numpy_path_matches_the_interpreters_loop() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "tests" / "support")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-3000:]
