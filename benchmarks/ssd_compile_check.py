"""Compile the SSD scan kernels for a GPU target on a machine WITHOUT a GPU and report registers,
stack (spill) bytes and shared memory per kernel and warp count: a compile-error and
register-pressure check at Nemotron-H-8B's tile sizes (P=64, N=128, chunk 128, bf16) that needs
only Triton's bundled ptxas/cuobjdump.

usage: python benchmarks/ssd_compile_check.py [--arch 90] [--dtype bf16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile real kernels, not the interpreter's stand-ins

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fastpath.kernels.ssd import bwd, fwd, shared_memory, varlen

FP32_PTRS = {"dtp_ptr", "cum_ptr", "A_ptr", "bias_ptr", "D_ptr", "final_ptr", "init_ptr",
             "dfinal_ptr", "dinit_ptr", "ddt_ptr", "dA_ptr", "dD_ptr"}
INT_PTRS = {"seq_ptr", "cu_ptr"}


def _jit(kernel):
    """The JITFunction below an autotuner (or the kernel itself)."""
    return kernel if isinstance(kernel, triton.JITFunction) else kernel.fn


def _usage(cubin: bytes) -> dict[str, int]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", text)
    if not found:
        return {}
    return {"regs": int(found[1]), "stack_bytes": int(found[2])}


def compile_one(kernel, dtype: str, consts: dict, target: GPUTarget, warps: int, stages: int):
    fn = _jit(kernel)
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in FP32_PTRS:
            sig[name] = "*fp32"
        elif name in INT_PTRS:
            sig[name] = "*i32"
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        elif name in ("dt_min", "dt_max"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    started = time.time()
    compiled = triton.compile(src, target=target,
                              options={"num_warps": warps, "num_stages": stages})
    row = {"kernel": fn.__name__, "warps": warps, "stages": stages,
           "compile_s": round(time.time() - started, 1)}
    row.update(_usage(compiled.asm["cubin"]))
    row["shared_bytes"] = compiled.metadata.shared
    return row


def cases(dtype: str, arch: int):
    """The kernels at Nemotron-H-8B's sizes, with the tiles the launchers pick for `arch`'s
    shared memory (ssd/shared_memory.py)."""
    common = {"PREC": "ieee" if dtype == "fp32" else "default", "UPCAST": False}
    full = {"BP": 64, "BN": 128}
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    cpu = torch.device("cpu")
    with shared_memory.assume_limit(shared_memory.ARCH_LIMITS.get(arch, 101376), arch):
        bp, bn = shared_memory.state_tile(cpu, torch_dtype, 128, fwd.STATE_BLOCK, fwd.STATE_BLOCK)
        varlen_bq = shared_memory.varlen_block(cpu, torch_dtype, 128, 64, 64, 3)
        dbc_bn = shared_memory.dbc_tile(cpu, torch_dtype, bwd.DBC_BLOCK_M, bwd.DBC_BLOCK_N)
    tile = {"BP": bp, "BN": bn}
    seq = {"HAS_SEQ": True}
    yield fwd._dt_kernel, {"HAS_BIAS": True, "SOFTPLUS": True, "HAS_LIMIT": True,
                           "BQ": 128, "BH": 16}
    yield fwd._states_kernel, {**seq, "HAS_INIT": True, "STORE_STATES": True, "BQ": 128,
                               **tile, **common}
    yield fwd._out_kernel, {**seq, "HAS_D": True, "D_PER_CHANNEL": False, "HAS_Z": True,
                            "BM": fwd.OUT_BLOCK_M, **full, **common}
    yield bwd._dstates_kernel, {**seq, "HAS_DFINAL": True, "BQ": 128, **tile, **common}
    yield bwd._dx_kernel, {**seq, "HAS_D": True, "D_PER_CHANNEL": False,
                           "BM": bwd.DX_BLOCK_M, **full, **common}
    yield bwd._dbc_kernel, {**seq, "BM": bwd.DBC_BLOCK_M, "BP": 64, "BN": dbc_bn,
                            **common}
    yield varlen._varlen_states_kernel, {"HAS_INIT": True, "CUM64": dtype == "fp32",
                                         "BQ": varlen_bq, "BP": 64, "BN": 64, **common}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90 = H100/H200)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    target = GPUTarget("cuda", args.arch, 32)
    rows = []
    for kernel, consts in cases(args.dtype, args.arch):
        for warps in (4, 8):
            try:
                row = compile_one(kernel, args.dtype, consts, target, warps, 2)
            except Exception as exc:
                row = {"kernel": _jit(kernel).__name__, "warps": warps,
                       "error": f"{type(exc).__name__}: {exc}"[:400]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": args.arch, "dtype": args.dtype, "triton": triton.__version__,
                       "rows": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
