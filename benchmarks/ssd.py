"""The chunked state-space scan (mamba_chunk_scan_combined) on one CUDA device: fastpath's Triton
kernels vs mamba_ssm's Triton SSD vs the torch chunked fallback (naive.ssd_chunked_ref).

Shapes: Nemotron-H-8B's mixer (H=128, P=64, G=8, N=128, chunk 128), bf16 x/B/C/dt, float32
A/D/dt_bias, dt_softplus, D per head, no z (the model gates in its norm); (B, L) = (1, 4096) and
(8, 4096). Reports fwd and fwd+bwd ms (do_bench median), our per-kernel split, and relative L2
errors of out and of every gradient against float64 (the float64 chunked reference on the GPU,
at (1, 4096)).

mamba_ssm is loaded from a source tree (--mamba-src DIR, the folder holding mamba_ssm/, e.g. the
unpacked PyPI sdist) WITHOUT running mamba_ssm/__init__.py (which imports the CUDA extension):
empty parent packages are put in sys.modules and ops/triton/ssd_combined.py is imported below
them. It needs einops importable.

--profile adds, per shape and implementation, the CUDA time of every kernel of one fwd+bwd step
(torch.profiler, averaged over a few steps): where the backward's time goes. --update times the
decode step (selective_state_update) at Nemotron-H's shapes, B in (1, 64), eager, against
mamba_ssm's Triton op from the same source tree.

usage: python benchmarks/ssd.py --out DIR [--mamba-src DIR] [--quick] [--sweep] [--profile]
                                [--update]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
import types
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from fastpath.kernels.ssd import bwd as bwd_mod
from fastpath.kernels.ssd import fwd as fwd_mod
from fastpath.kernels.ssd import mamba_chunk_scan_combined as ours
from fastpath.kernels.ssd.bwd import ssd_scan_bwd_triton
from fastpath.kernels.ssd.fwd import (
    chunk_outputs,
    chunk_states,
    contiguous_inputs,
    prepare_dt,
)
from fastpath.kernels.ssd.naive import ssd_chunked_ref

H, P, G, N, CHUNK = 128, 64, 8, 128, 128
SHAPES = [(1, 4096), (8, 4096)]
GRADS = ("x", "dt", "A", "B", "C", "D", "dt_bias")


def load_mamba(src: str | None, module: str = "ssd_combined", name: str = "mamba_chunk_scan_combined"):
    """An op of mamba_ssm.ops.triton.<module> from a source tree, or (None, why)."""
    if not src:
        return None, "no --mamba-src given"
    root = Path(src).resolve()
    if not (root / "mamba_ssm" / "ops" / "triton" / f"{module}.py").is_file():
        return None, f"{root}/mamba_ssm/ops/triton/{module}.py not found"
    for package in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils"):
        if package in sys.modules:
            continue
        empty = types.ModuleType(package)
        empty.__path__ = [str(root.joinpath(*package.split(".")))]
        sys.modules[package] = empty
    try:
        mod = importlib.import_module(f"mamba_ssm.ops.triton.{module}")
        return getattr(mod, name), "loaded"
    except Exception as exc:  # report, keep benchmarking ours
        return None, f"import failed: {type(exc).__name__}: {exc}"


def make_inputs(batch: int, seqlen: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    return {
        "x": rnd(batch, seqlen, H, P),
        "dt": rnd(batch, seqlen, H, scale=0.5),
        "A": -(torch.rand(H, generator=g, device="cuda") * 8 + 1),
        "B": rnd(batch, seqlen, G, N, scale=0.3),
        "C": rnd(batch, seqlen, G, N, scale=0.3),
        "D": rnd(H, dtype=torch.float32),
        "dt_bias": rnd(H, scale=0.5, dtype=torch.float32) - 3,
    }


def call(fn, t: dict[str, torch.Tensor]):
    return fn(t["x"], t["dt"], t["A"], t["B"], t["C"], CHUNK, D=t["D"], dt_bias=t["dt_bias"],
              dt_softplus=True)


def reference(t: dict[str, torch.Tensor]):
    out, _ = ssd_chunked_ref(t["x"], t["dt"], t["A"], t["B"], t["C"], CHUNK, D=t["D"],
                             dt_bias=t["dt_bias"], dt_softplus=True)
    return out


def bench(fn, leaves=None) -> float:
    return float(do_bench(fn, warmup=25, rep=200, grad_to_none=leaves, return_mode="median"))


def timings(fn, t: dict[str, torch.Tensor]) -> dict[str, float]:
    leaves = [v.detach().clone().requires_grad_() for v in t.values()]
    tl = dict(zip(t, leaves, strict=True))
    dout = torch.randn_like(t["x"])
    with torch.no_grad():
        fwd = bench(lambda: call(fn, t))

    def fwd_bwd():
        call(fn, tl).backward(dout)

    return {"fwd_ms": fwd, "fwd_bwd_ms": bench(fwd_bwd, leaves)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def errors(fns: dict, t: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Relative L2 error of out and each gradient vs the float64 chunked reference."""
    dout = torch.randn_like(t["x"], dtype=torch.float64)
    t64 = {k: v.double().requires_grad_() for k, v in t.items()}
    out64 = reference(t64)
    g64 = torch.autograd.grad(out64, list(t64.values()), dout)
    result = {}
    for name, fn in fns.items():
        tl = {k: v.detach().clone().requires_grad_() for k, v in t.items()}
        out = call(fn, tl)
        grads = torch.autograd.grad(out, list(tl.values()), dout.to(out.dtype))
        result[name] = {"out": rel(out, out64)}
        result[name].update({f"d{k}": rel(g, w) for k, g, w in zip(t, grads, g64, strict=True)})
    return result


def split(t: dict[str, torch.Tensor]) -> dict[str, float]:
    """Our kernels one by one (forward, then the backward as one call)."""
    x, B, C, _, _ = contiguous_inputs(t["x"], t["B"], t["C"], None, None)
    dtp, cum = prepare_dt(t["dt"], t["A"], t["dt_bias"], CHUNK, True, (0.0, float("inf")))
    states, _ = chunk_states(x, B, dtp, cum, None, None, CHUNK)
    dout = torch.randn_like(x)
    return {
        "dt_cumsum_ms": bench(lambda: prepare_dt(t["dt"], t["A"], t["dt_bias"], CHUNK, True,
                                                 (0.0, float("inf")))),
        "chunk_states_ms": bench(lambda: chunk_states(x, B, dtp, cum, None, None, CHUNK)),
        "chunk_outputs_ms": bench(lambda: chunk_outputs(x, B, C, None, t["D"], dtp, cum, None,
                                                        states, CHUNK)),
        "backward_ms": bench(lambda: ssd_scan_bwd_triton(
            dout, None, x, t["dt"], t["A"], B, C, t["D"], None, t["dt_bias"], None, None,
            CHUNK, True, (0.0, float("inf")))),
    }


def profile(fn, t: dict[str, torch.Tensor], steps: int = 5) -> list[dict]:
    """CUDA time per kernel name of one fwd+bwd step (mean over `steps`), largest first."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    leaves = {k: v.detach().clone().requires_grad_() for k, v in t.items()}
    dout = torch.randn_like(t["x"])
    for _ in range(3):
        call(fn, leaves).backward(dout)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call(fn, leaves).backward(dout)
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": ev.key[:90], "ms_per_step": round(us / steps / 1e3, 4),
                         "calls_per_step": ev.count / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:25]


def update_timings(mamba_update) -> list[dict]:
    """The eager decode step per batch size (1 and 64), ours and mamba_ssm's, on equal inputs
    (mamba_model.py's decode case, gated, fp32 state)."""
    from mamba_model import bench_decode, decode_case

    from fastpath.kernels.ssd.update import selective_state_update

    impls = {"fastpath": selective_state_update}
    if mamba_update is not None:
        impls["mamba_ssm"] = mamba_update
    rows = []
    for batch in (1, 64):
        case = decode_case(torch.float32, batch, gated=True)
        row: dict = {"batch": batch}
        outs = {}
        for name, fn in impls.items():
            try:
                us, outs[name] = bench_decode(fn, case)
                row[f"{name}_us"] = round(us, 2)
            except Exception as exc:
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        if len(outs) == 2:
            row["max_abs_diff_vs_mamba"] = float((outs["fastpath"] - outs["mamba_ssm"]).abs().max())
        rows.append(row)
        print(json.dumps(row))
    return rows


KNOBS = {  # module, attribute, values to try (the first listed default is restored after)
    "OUT_BLOCK_M": (fwd_mod, (32, 64, 128)),
    "STATE_BLOCK": (fwd_mod, (32, 64, 128)),
    "DX_BLOCK_M": (bwd_mod, (32, 64, 128)),
    "DBC_BLOCK_M": (bwd_mod, (32, 64, 128)),
    "DBC_BLOCK_N": (bwd_mod, (32, 64, 128)),
    "PAIR_BLOCK_M": (fwd_mod, (32, 64, 128)),
}


def sweep(t: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Each tile knob alone, the others at their defaults: fwd and fwd+bwd ms of our op."""
    result = {}
    for name, (module, values) in KNOBS.items():
        default = getattr(module, name)
        result[name] = {}
        for value in values:
            setattr(module, name, value)
            try:
                result[name][str(value)] = timings(ours, t)
            except Exception as exc:
                result[name][str(value)] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                setattr(module, name, default)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (ssd.json is written there)")
    ap.add_argument("--mamba-src", default=None, help="folder holding mamba_ssm/ (source tree)")
    ap.add_argument("--quick", action="store_true", help="only (1, 4096), no fallback timing")
    ap.add_argument("--no-fallback", action="store_true", help="skip timing the torch fallback")
    ap.add_argument("--profile", action="store_true",
                    help="also the CUDA time per kernel of a fwd+bwd step, per implementation")
    ap.add_argument("--update", action="store_true",
                    help="also the decode step (selective_state_update) at B=1 and B=64")
    ap.add_argument("--sweep", action="store_true",
                    help="also time each tile knob (fwd.py / bwd.py constants) alone")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/ssd.py: needs a CUDA device", file=sys.stderr)
        return 2
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    mamba, mamba_status = load_mamba(args.mamba_src)
    print(f"mamba_ssm: {mamba_status}")
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "mamba_ssm": mamba_status,
        "config": {"H": H, "P": P, "G": G, "N": N, "chunk": CHUNK, "dtype": "bfloat16",
                   "D": "per head", "dt_softplus": True, "z": None},
        "shapes": [],
    }
    impls = {"fastpath": ours}
    if mamba is not None:
        impls["mamba_ssm"] = mamba
    started = time.time()
    for batch, seqlen in SHAPES[:1] if args.quick else SHAPES:
        t = make_inputs(batch, seqlen)
        row: dict = {"batch": batch, "seqlen": seqlen}
        for name, fn in impls.items():
            try:
                row[name] = timings(fn, t)
            except Exception:
                row[name] = {"error": traceback.format_exc(limit=3)}
        if not (args.quick or args.no_fallback):
            try:
                row["torch_chunked"] = timings(
                    lambda *a, **k: ssd_chunked_ref(*a, **k)[0], t)
            except Exception:
                row["torch_chunked"] = {"error": traceback.format_exc(limit=2)}
            torch.cuda.empty_cache()
        try:
            row["fastpath_split"] = split(t)
        except Exception:
            row["fastpath_split"] = {"error": traceback.format_exc(limit=3)}
        if args.profile:
            row["profile"] = {}
            for name, fn in impls.items():
                try:
                    row["profile"][name] = profile(fn, t)
                except Exception:
                    row["profile"][name] = {"error": traceback.format_exc(limit=3)}
        if args.sweep:
            row["sweep"] = sweep(t)
        if batch == 1:
            try:
                row["rel_err_vs_float64"] = errors(impls, t)
            except Exception:
                row["rel_err_vs_float64"] = {"error": traceback.format_exc(limit=3)}
        report["shapes"].append(row)
        print(json.dumps(row, indent=1))
        torch.cuda.empty_cache()
    if args.update:
        mamba_update, why = load_mamba(args.mamba_src, "selective_state_update",
                                       "selective_state_update")
        report["update"] = {"mamba_ssm": why, "rows": update_timings(mamba_update)}
    report["wall_s"] = round(time.time() - started, 1)
    (outdir / "ssd.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {outdir / 'ssd.json'} in {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
