"""Compile fastpath's newer Triton kernels for a GPU target on a machine WITHOUT a GPU, exactly as
their launchers would on the device, and report per kernel and config: ok or the compile error,
registers, spill bytes (ptxas -v), stack and shared memory.

Why: CPU tests run Triton's interpreter, which accepts kernels the GPU compiler refuses (a plain
float global read from a jit function passed every CPU test and failed on the H200, Triton 3.6).
Device time is scarce, so every new kernel is compiled here first, for sm_90, under the device's
Triton (3.6, from a venv) and the CI's (3.9).

How: the real launch sites run on CPU tensors with Falcon-Mamba shapes (d_inner 8192, N 16,
one group; GatedDeltaNet/sigmoid-gate shapes of Qwen3-Next/Qwen3.5), with `JITFunction.run`
replaced by a recorder: every `kernel[grid](...)` is captured with its real arguments (dtypes,
strides, alignment, constexprs, num_warps), then specialised by Triton's own binder (the same
ints-equal-to-1 and divisible-by-16 rules as on the device) and compiled with
`triton.compile(ASTSource, target=GPUTarget("cuda", arch, 32))` and Triton's bundled ptxas. The
launchers' later torch work runs on the uninitialised CPU outputs (meaningless, never checked).
Covered: selective_scan (forward default + sweep configs, backward default + every SWEEP config,
flip and reverse-scan adjoints, via mamba_inner_fn's training layout and transformers' prefill
layout; the time-sequential forward of FASTPATH_SSCAN_FWD=seq at every scan_fwd_seq.SEQ_SWEEP
config, same two layouts), the Mamba-1 decode step (kernels/ssd/state_update.py), gdn_gates, sigmoid_gate.

usage: python benchmarks/kernel_compile_check.py [--arch 90] [--dtype bf16 fp32]
       [--only selective_scan state_update gdn_gates sigmoid_gate] [--seqlen 256] [--out FILE.json]
Exit 1 if any compile fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

os.environ.pop("TRITON_INTERPRET", None)  # compile real kernels, not the interpreter's stand-ins
# a fresh cache: every kernel goes through ptxas, whose log gives the spill counts
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="fastpath-compile-check-"))

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from fastpath.kernels.gdn_gates import interface as gates_if
from fastpath.kernels.selective_scan import interface as scan_if
from fastpath.kernels.selective_scan import scan_bwd, scan_fwd, scan_fwd_seq
from fastpath.kernels.sigmoid_gate import interface as gate_if

FAMILIES = ("selective_scan", "state_update", "gdn_gates", "sigmoid_gate")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Falcon-Mamba-7B (tiiuae/falcon-mamba-7b config.json): hidden 4096, d_inner 8192, d_state 16,
# dt_rank 256, conv 4; B/C/dt RMSNorm (falcon_mamba_inner_fn)
FM = {"hidden": 4096, "dim": 8192, "nstate": 16, "rank": 256, "conv": 4}


# ---------------------------------------------------------------- capture and compile
class Recorder:
    """Replaces JITFunction.run while active: each launch is recorded with a label, not run."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, JITFunction, tuple, dict]] = []
        self.label = ""

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        original = JITFunction.run

        def record(fn, *args, grid, warmup, **kwargs):
            self.launches.append((self.label, fn, args, dict(kwargs)))
            return None

        JITFunction.run = record
        try:
            yield self
        finally:
            JITFunction.run = original


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_numbers(log: str) -> dict[str, int]:
    out: dict[str, int] = {}
    if m := _PTXAS_REGS.search(log):
        out["regs"] = int(m[1])
    if m := _PTXAS_FRAME.search(log):
        out.update(stack_bytes=int(m[1]), spill_store_bytes=int(m[2]), spill_load_bytes=int(m[3]))
    return out


def specialise(fn: JITFunction, args: tuple, kwargs: dict, backend):
    """Triton's own binding of a launch: (signature, constexprs, attrs, options, cache key)."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # as JITFunction.run sets
        if hasattr(knobs.compilation, name):
            kwargs[name] = getattr(knobs.compilation, name)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    key = (fn.__name__, str(spec), str(options))
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    return signature, constexprs, attrs, options, key


def compile_launch(fn: JITFunction, signature, constexprs, attrs, options, target) -> dict:
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    started = time.time()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
    row: dict = {"compile_s": round(time.time() - started, 1)}
    row.update(_ptxas_numbers(log.getvalue()))
    row["shared_bytes"] = compiled.metadata.shared
    return row


def _describe(fn: JITFunction, signature: dict, constexprs: dict) -> dict:
    names = fn.arg_names
    consts = {names[path[0]]: value for path, value in constexprs.items() if len(path) == 1}
    ptrs = {k: v for k, v in signature.items() if str(v).startswith("*")}
    return {"constexprs": {k: (v if isinstance(v, (bool, int, float, str)) else str(v))
                           for k, v in consts.items()},
            "pointer_dtypes": sorted(set(map(str, ptrs.values())))}


# ---------------------------------------------------------------- the launch sites
@contextlib.contextmanager
def triton_on(*modules) -> Iterator[None]:
    """The interfaces' `use_triton` says yes for CPU tensors (the launches are only recorded)."""
    saved = [m.use_triton for m in modules]
    for m in modules:
        m.use_triton = lambda t: True
    try:
        yield
    finally:
        for m, s in zip(modules, saved, strict=True):
            m.use_triton = s


def _fwd_configs() -> list[tuple[int, int, int]]:
    out = [scan_fwd.FWD_CONFIG]
    for c in scan_bwd.SWEEP_CONFIGS[:3]:  # scan_bwd: "fwd uses the first 3"
        if tuple(c[:3]) not in out:
            out.append(tuple(c[:3]))
    return out


def _bwd_configs() -> list[tuple[int, int, int, bool]]:
    out = [scan_bwd.BWD_CONFIG]
    out += [c for c in scan_bwd.SWEEP_CONFIGS if c not in out]
    return out


@contextlib.contextmanager
def sweep_scan(rec: Recorder) -> Iterator[None]:
    """The interface's calls of the Triton scan run once per config (each launch labelled)."""
    fwd, bwd = scan_fwd.selective_scan_fwd_triton, scan_bwd.selective_scan_bwd_triton

    def fwd_all(*args, **kwargs):
        for cfg in _fwd_configs():
            rec.label = f"fwd {cfg}"
            result = fwd(*args, **{**kwargs, "config": cfg})
        return result

    def bwd_all(*args, **kwargs):
        for cfg in _bwd_configs():
            rec.label = f"bwd {cfg}"
            result = bwd(*args, **{**kwargs, "config": cfg})
        return result

    scan_fwd.selective_scan_fwd_triton, scan_bwd.selective_scan_bwd_triton = fwd_all, bwd_all
    try:
        yield
    finally:
        scan_fwd.selective_scan_fwd_triton, scan_bwd.selective_scan_bwd_triton = fwd, bwd


@contextlib.contextmanager
def sweep_seq(rec: Recorder) -> Iterator[None]:
    """FASTPATH_SSCAN_FWD=seq while active; the interface's seq forward runs once per
    scan_fwd_seq.SEQ_SWEEP config (each launch labelled). The backward's chunk states still come
    from the chunked kernel (covered by the default pass)."""
    fwd = scan_fwd_seq.selective_scan_fwd_seq_triton

    def fwd_all(*args, **kwargs):
        for cfg in scan_fwd_seq.SEQ_SWEEP:
            rec.label = f"fwd-seq {cfg}"
            result = fwd(*args, **{**kwargs, "config": cfg})
        return result

    saved = os.environ.get(scan_if.FWD_ENV)
    os.environ[scan_if.FWD_ENV] = "seq"
    scan_fwd_seq.selective_scan_fwd_seq_triton = fwd_all
    try:
        yield
    finally:
        scan_fwd_seq.selective_scan_fwd_seq_triton = fwd
        if saved is None:
            os.environ.pop(scan_if.FWD_ENV, None)
        else:
            os.environ[scan_if.FWD_ENV] = saved


def scan_training(dtype: torch.dtype, seqlen: int) -> None:
    """falcon_mamba_inner_fn's call (transformers' training path) with Falcon-Mamba-7B's sizes:
    forward and backward through the real mamba_inner_fn, so the scan sees its real layouts."""
    dim, n, r = FM["dim"], FM["nstate"], FM["rank"]
    mk = lambda *s, dt=dtype: (torch.randn(*s, dtype=dt) * 0.02).requires_grad_()  # noqa: E731
    xz = mk(1, seqlen, 2 * dim).transpose(1, 2)  # in_proj(h).transpose(1, 2), as transformers
    A = (-torch.rand(dim, n) - 0.5).requires_grad_()  # -exp(A_log.float()): float32
    y = scan_if.mamba_inner_fn(
        xz, mk(dim, 1, FM["conv"]), mk(dim), mk(r + 2 * n, dim), mk(dim, r), mk(FM["hidden"], dim),
        None, A, None, None, mk(dim, dt=torch.float32), mk(dim, dt=torch.float32),
        delta_softplus=True, b_rms_weight=mk(n), c_rms_weight=mk(n), dt_rms_weight=mk(dim),
    )
    y.float().sum().backward()


def scan_prefill(dtype: torch.dtype, seqlen: int) -> None:
    """transformers' MambaMixer/FalconMambaMixer cuda_kernels_forward outside training: u after
    the conv, delta = dt_proj.weight @ time_step^T, B/C `.transpose(1, 2).contiguous()`, z the
    second half of in_proj(h).transpose(1, 2), A/D/delta_bias float32, last state returned."""
    dim, n = FM["dim"], FM["nstate"]
    proj = torch.randn(1, seqlen, 2 * dim, dtype=dtype).transpose(1, 2)
    u, z = torch.randn(1, dim, seqlen, dtype=dtype), proj.chunk(2, dim=1)[1]
    delta = torch.randn(1, dim, seqlen, dtype=dtype)
    B, C = (torch.randn(1, seqlen, n, dtype=dtype).transpose(1, 2).contiguous() for _ in "BC")
    scan_if.selective_scan_fn(u, delta, -torch.rand(dim, n), B, C, torch.randn(dim), z=z,
                              delta_bias=torch.randn(dim), delta_softplus=True,
                              return_last_state=True)


def state_update(rec: Recorder, dtype: torch.dtype) -> None:
    """transformers' Mamba-1 decode step: selective_state_update(ssm_state, x[..., 0],
    dt[..., 0], A, B[:, 0], C[:, 0], D, z[..., 0], dt_bias, dt_softplus=True), state in the
    model dtype; batch 1 and a pooled cache with state_batch_indices."""
    dim, n = FM["dim"], FM["nstate"]
    for batch, pooled in ((1, False), (4, True)):
        rec.label = f"decode batch {batch}" + (" pooled" if pooled else "")
        state = torch.randn(8 if pooled else batch, dim, n, dtype=dtype)
        col = lambda rows=batch: torch.randn(rows, dim, 1, dtype=dtype)[..., 0]  # noqa: E731
        BC = lambda rows=batch: torch.randn(rows, 1, n, dtype=dtype)[:, 0]  # noqa: E731
        idx = torch.arange(batch, dtype=torch.int32) if pooled else None
        scan_if.selective_state_update(state, col(), col(), -torch.rand(dim, n), BC(), BC(),
                                       torch.randn(dim), col(), torch.randn(dim),
                                       dt_softplus=True, state_batch_indices=idx)


def gdn_gates(rec: Recorder, dtype: torch.dtype) -> None:
    """GatedDeltaNet gates: a, b (batch, L, heads) (contiguous, and views of one (.., 2*heads)
    projection), A_log/dt_bias in the model dtype; every backward (dg, dbeta) presence."""
    rows = 512
    for heads in (16, 32, 48, 64):  # Qwen3-Next / Qwen3.5 value-head counts
        ba = torch.randn(1, rows, 2 * heads, dtype=dtype)
        for how, a, b in (("views", ba[..., :heads], ba[..., heads:]),
                          ("contiguous", torch.randn(1, rows, heads, dtype=dtype),
                           torch.randn(1, rows, heads, dtype=dtype))):
            rec.label = f"heads {heads} {how}"
            a_log, dt_bias = torch.randn(heads, dtype=dtype), torch.randn(heads, dtype=dtype)
            gates_if.fwd_impl(a, b, a_log, dt_bias)
            dg, dbeta = torch.randn(1, rows, heads), torch.randn(1, rows, heads, dtype=dtype)
            for pair in ((dg, dbeta), (dg, None), (None, dbeta)):
                gates_if.bwd_impl(a, b, a_log, dt_bias, *pair)


def sigmoid_gate(rec: Recorder, dtype: torch.dtype) -> None:
    """Qwen3-Next-style output gate: x (batch, L, width) contiguous, the gate a strided view of
    q_proj's (.., heads, 2*head_dim) output; widths of 16 and 24 heads of 256, and 32 x 128."""
    rows = 512
    for heads, hd in ((16, 256), (24, 256), (32, 128)):
        rec.label = f"{heads} heads x {hd}"
        q = torch.randn(1, rows, heads, 2 * hd, dtype=dtype)
        gate = q[..., hd:].reshape(1, rows, heads * hd)
        x = torch.randn(1, rows, heads * hd, dtype=dtype)
        gate_if.fwd_impl(x, gate)
        gate_if.bwd_impl(x, gate, torch.randn(1, rows, heads * hd, dtype=dtype))


def record(family: str, dtype_name: str, seqlen: int) -> list[tuple[str, JITFunction, tuple, dict]]:
    rec = Recorder()
    dtype = DTYPES[dtype_name]
    with rec.active():
        if family == "selective_scan":
            with triton_on(scan_if), sweep_scan(rec):
                scan_training(dtype, seqlen)
                for i, launch in enumerate(rec.launches):
                    rec.launches[i] = (f"train {launch[0]}", *launch[1:])
                n = len(rec.launches)
                scan_prefill(dtype, seqlen)
                for i in range(n, len(rec.launches)):
                    rec.launches[i] = (f"prefill {rec.launches[i][0]}", *rec.launches[i][1:])
            with triton_on(scan_if), sweep_scan(rec), sweep_seq(rec):  # FASTPATH_SSCAN_FWD=seq
                for name, site in (("train", scan_training), ("prefill", scan_prefill)):
                    n = len(rec.launches)
                    site(dtype, seqlen)
                    for i in range(n, len(rec.launches)):
                        rec.launches[i] = (f"seq-{name} {rec.launches[i][0]}",
                                           *rec.launches[i][1:])
        elif family == "state_update":
            with triton_on(scan_if):
                state_update(rec, dtype)
        elif family == "gdn_gates":
            with triton_on(gates_if):
                gdn_gates(rec, dtype)
        elif family == "sigmoid_gate":
            with triton_on(gate_if):
                sigmoid_gate(rec, dtype)
    return rec.launches


def run(families: list[str], dtypes: list[str], arch: int, seqlen: int,
        emit: Callable[[dict], None]) -> None:
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    seen: set = set()
    for family in families:
        for dtype_name in dtypes:
            try:
                launches = record(family, dtype_name, seqlen)
            except Exception as exc:  # a launcher that fails on CPU: say so, go on
                row = {"family": family, "dtype": dtype_name, "kernel": "(launch site)",
                       "error": f"{type(exc).__name__}: {exc}"[:600]}
                emit(row)
                continue
            if not launches:
                row = {"family": family, "dtype": dtype_name, "kernel": "(launch site)",
                       "error": "no Triton launch recorded (the interface fell back?)"}
                emit(row)
            for label, fn, args, kwargs in launches:
                row = {"family": family, "dtype": dtype_name, "case": label, "kernel": fn.__name__,
                       "num_warps": kwargs.get("num_warps", 4)}
                try:
                    signature, constexprs, attrs, options, key = specialise(fn, args, kwargs, backend)
                except Exception as exc:
                    row["error"] = f"binding: {type(exc).__name__}: {exc}"[:600]
                    emit(row)
                    continue
                if key in seen:  # the same binary as an earlier row
                    continue
                seen.add(key)
                row.update(_describe(fn, signature, constexprs))
                try:
                    row.update(compile_launch(fn, signature, constexprs, attrs, options, target))
                    row["ok"] = True
                except Exception as exc:
                    row["ok"] = False
                    row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                emit(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90 = H100/H200)")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--only", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--seqlen", type=int, default=256,
                    help="prefill/training length (a multiple of 16 as usual; only specialisation "
                         "depends on it)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here (rewritten per row)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    header = {"arch": args.arch, "triton": triton.__version__, "torch": torch.__version__,
              "seqlen": args.seqlen, "shapes": FM}
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        brief = {k: row[k] for k in ("family", "dtype", "case", "kernel", "num_warps", "ok", "regs",
                                     "spill_store_bytes", "spill_load_bytes", "stack_bytes",
                                     "shared_bytes", "compile_s") if k in row}
        brief["constexprs"] = row.get("constexprs")
        print(json.dumps(brief), flush=True)
        if "error" in row:
            print("  ERROR: " + row["error"].replace("\n", "\n  "), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({**header, "rows": rows}, f, indent=1)

    print(json.dumps(header), flush=True)
    run(args.only, args.dtype, args.arch, args.seqlen, emit)
    failed = [r for r in rows if "error" in r]
    print(f"{len(rows) - len(failed)} compiled, {len(failed)} failed (Triton {triton.__version__}, "
          f"sm_{args.arch})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
