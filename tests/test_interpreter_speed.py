"""tests/support/interpreter_speed.py (tl's builtins listed once, not on every interpreted call):
a kernel with nested `@triton.jit` helpers, tl.math, reductions, a scan and tl.sort gives the same
bits with and without it; every call maps the same attributes as the interpreter's own listing
(the launch's and each nested helper's); after a launch every tl / tl.core / tl.math member is the
object it was before. Each variant runs in a child process with TRITON_INTERPRET=1 (the listing
patches the interpreter for the rest of the process), on the Triton of this run and, where built,
today's default stack's (.venvs/tf-default, Triton 3.8)."""

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
