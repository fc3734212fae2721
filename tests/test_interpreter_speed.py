"""tests/support/interpreter_speed.py. Its listing (tl's builtins listed once, not on every call):
a kernel with nested `@triton.jit` helpers, tl.math, reductions, a scan and tl.sort gives the same
bits with and without it; every call maps the same attributes as the interpreter's own listing
(the launch's and each nested helper's); after a launch every tl / tl.core / tl.math member is the
object it was before. Each variant runs in a child process with TRITON_INTERPRET=1 (the listing
patches the interpreter for the rest of the process), on the Triton of this run and, where built,
today's default stack's (.venvs/tf-default, Triton 3.8). Its NumPy path for `xor_sum` (the
interpreter otherwise reduces it element by element in Python): the same integers as the
interpreter's own loop for each integer width, per axis and over the whole block, and `tl.sort` (a
bitonic network of xor reductions) still sorts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import SUPPORT, venv_python

pytest.importorskip("torch")
pytest.importorskip("triton")

CHILD = r'''
import json
import sys

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

@triton.jit
def inner(x):
    return tl.math.exp(x * 0.25) - tl.sqrt(tl.abs(x) + 1.0)

@triton.jit
def outer(x, y):
    return inner(x) * tl.maximum(y, 0.5) + tl.where(x > 0, x, -x)

@triton.jit
def kernel(x_ptr, y_ptr, out_ptr, red_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    z = outer(x, y)
    tl.store(out_ptr + offs, z + tl.cumsum(x, axis=0) + tl.sort(y))
    tl.store(red_ptr, tl.sum(z, axis=0) + tl.max(x, axis=0))

def members():
    mods = {"tl": tl, "core": tl.core, "math": tl.math, "tensor": tl.tensor}
    return {f"{k}.{n}": id(getattr(m, n)) for k, m in mods.items() for n in dir(m)}

sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "listed":
    from interpreter_speed import builtins_listed_once
    assert builtins_listed_once() and not builtins_listed_once()  # installed once

calls = []
patch_lang = interpreter._patch_lang
def recorded(fn):
    scope = patch_lang(fn)
    calls.append(sorted(f"{getattr(o, '__name__', type(o).__name__)}.{n}" for o, n, _ in scope._changes))
    return scope
interpreter._patch_lang = recorded

gen = torch.Generator().manual_seed(5)
x, y = torch.randn(64, generator=gen), torch.randn(64, generator=gen)
out, red = torch.empty(64), torch.empty(1)
before = members()
kernel[(1,)](x, y, out, red, 64)
after = members()
print(json.dumps({"out": out.tolist(), "red": red.tolist(), "calls": calls,
                  "changed": sorted(k for k in before if after.get(k) != before[k])}))
'''


def _run(python: str, variant: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([python, "-c", CHILD, str(SUPPORT), variant], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


PYTHONS = {"this run": sys.executable, "default stack": str(venv_python("default"))}


@pytest.mark.parametrize("stack", list(PYTHONS))
def test_listing_once_maps_the_same_and_computes_the_same(stack: str) -> None:
    python = PYTHONS[stack]
    if not os.path.exists(python):
        pytest.skip(f"{python} not built (scripts/setup_default_stack.sh)")
    own, listed = _run(python, "own"), _run(python, "listed")
    assert own["out"] == listed["out"] and own["red"] == listed["red"]  # the same bits
    assert len(own["calls"]) >= 3  # the launch, outer() and inner() at least
    assert listed["calls"] == own["calls"]  # each call maps exactly what the interpreter's listing does
    assert "triton.language.load" in own["calls"][0]  # the launch mapped the builtins
    assert listed["changed"] == own["changed"]  # and the launch leaves tl as the interpreter's own does


XOR_CHILD = r'''
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
from interpreter_speed import xor_reduce_in_numpy

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
    proc = subprocess.run([sys.executable, "-c", XOR_CHILD, str(SUPPORT)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-3000:]
