"""Mamba-1's selective scan on one device: fastpath's Triton kernels side by side with every
compiler-free alternative transformers offers.

Shapes: Falcon-Mamba-7B's mixer (D = 8192, N = 16), bf16 u/delta/B/C/z, float32 A/D/delta_bias,
delta_softplus, B/C shared (batch, N, L), laid out as transformers 5.17 passes them
(models/falcon_mamba/modeling_falcon_mamba.py: u and z are channel-last views, B/C transposed
(B, L, N) views, delta contiguous); cases (B, L) = (1, 4096) and (8, 4096).
Peers (each skipped with its reason when it cannot run; each capped by --time-cap seconds):
- ours:        fastpath.kernels.selective_scan.interface.selective_scan_fn
- ours-seq:    the same with FASTPATH_SSCAN_FWD=seq (the time-sequential forward,
               kernels/selective_scan/scan_fwd_seq.py; fwd phase only: its backward is ours)
- loop:        transformers' torch fallback `mamba_selective_scan` (its Python loop over L)
- pscan:       the same function with use_mambapy=True (mambapy's pscan, when importable)
- assoc_scan:  torch._higher_order_ops.associative_scan over (exp(dA), dB u) as transformers
               combines them, eager, combine_mode="generic" (transformers itself takes this
               branch only under torch.compile)
- compile:     torch.compile of the loop fallback, in a child process killed after --time-cap
Phases: fwd and fwdbwd (ms, median of CUDA-event timed calls after one untimed warm-up call, so
Triton's compilation never lands in a timing row), update (the decode step at B = 64 vs
transformers' torch step), sweep (our tile configs at the first case), seqsweep (the seq
forward's SEQ_SWEEP configs at every case), copy (the device's copy bandwidth, measured
first). For our forwards the JSON also has `copy_frac`: the mandatory bytes (read u, delta, B,
C, z; write y) over our time, as a fraction of the measured copy bandwidth. The JSON is rewritten after every measurement.

usage: python benchmarks/selective_scan.py --out DIR
           [--phases copy,fwd,fwdbwd,update,sweep,seqsweep] [--cases 1x4096,8x4096]
           [--peers ours,ours-seq,loop,pscan,assoc_scan,compile]
           [--time-cap 20] [--smoke]
--smoke: tiny shapes, runs on CPU under TRITON_INTERPRET=1 (checks the script, no timing claims).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from fastpath.kernels.selective_scan import scan_bwd, scan_fwd, scan_fwd_seq
from fastpath.kernels.selective_scan.interface import (
    FWD_ENV,
    selective_scan_fn,
    selective_state_update,
)

DIM, N = 8192, 16
SMOKE_DIM = 16
SMOKE_SWEEP = ((8, 8, 4, True), (16, 8, 2, False))
SMOKE_SEQ_SWEEP = ((8, 2), (16, 4))
PEERS = ("ours", "ours-seq", "loop", "pscan", "assoc_scan", "compile")
OURS = ("ours", "ours-seq")
SWEEP = scan_bwd.SWEEP_CONFIGS


class Skip(Exception):
    """A peer that cannot run here: the message says why."""


# ---------------------------------------------------------------- timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall(fn: Callable[[], object], device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def timed(fn: Callable[[], object], device: torch.device, cap: float) -> dict:
    """Median ms of repeated calls. One untimed warm-up call comes first (Triton compiles at a
    kernel's first call: the H200 run once reported 3588 ms for a 1x4096 forward that way); then
    one call decides how many repeats fit the cap, and a call that alone eats half the cap is the
    only one timed."""
    warm = wall(fn, device)
    if warm > cap:
        return {"skipped": f"the warm-up call took {warm:.1f} s, over the {cap:.0f} s cap",
                "warmup_s": warm}
    first = wall(fn, device)
    if first > cap / 2:
        return {"ms": first * 1e3, "reps": 1, "warmup_s": warm,
                "note": "one call after the warm-up (slow)"}
    reps = max(3, min(50, int(cap / 4 / max(first, 1e-6))))
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "reps": reps, "warmup_s": warm}


def copy_bandwidth(device: torch.device, smoke: bool) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    n = 2**20 if smoke else 2**29  # 1 GiB of bf16 on the GPU
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), device, 5.0)["ms"]
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


# ---------------------------------------------------------------- inputs
def make_inputs(batch: int, length: int, dim: int, device: torch.device, grad: bool) -> dict:
    """Transformers' layouts: u, z channel-last views, B/C (B, L, N) transposed, delta (B, D, L)."""
    g = torch.Generator(device=device).manual_seed(0)
    bf = torch.bfloat16

    def r(*s, scale=1.0, dtype=bf):
        return (torch.randn(*s, generator=g, device=device) * scale).to(dtype)

    t = {
        "u": r(batch, length, dim).transpose(1, 2),
        "delta": r(batch, dim, length, scale=0.5) - 2.0,
        "A": -torch.exp(r(dim, N, scale=0.5, dtype=torch.float32)),
        "B": r(batch, length, N).transpose(1, 2),
        "C": r(batch, length, N).transpose(1, 2),
        "D": r(dim, dtype=torch.float32),
        "z": r(batch, length, 2 * dim)[..., dim:].transpose(1, 2),
        "delta_bias": r(dim, scale=0.3, dtype=torch.float32),
    }
    if grad:
        t = {k: v.detach().requires_grad_() for k, v in t.items()}
    return t


def mandatory_bytes(t: dict) -> int:
    """Read u, delta, B, C, z; write y (same size and dtype as u)."""
    return sum(t[k].numel() * t[k].element_size() for k in ("u", "delta", "B", "C", "z")) + (
        t["u"].numel() * t["u"].element_size())


# ---------------------------------------------------------------- peers
def transformers_scan() -> Callable:
    from transformers.models.falcon_mamba import modeling_falcon_mamba as fm

    fn = fm.mamba_selective_scan
    return getattr(fn, "__wrapped__", fn)


def peer_fn(name: str) -> Callable[[dict], torch.Tensor]:
    """A callable (inputs -> out) for each peer, or Skip with the reason."""
    kw = {"delta_softplus": True}
    if name == "ours":
        return lambda t: selective_scan_fn(**t, **kw)
    if name == "ours-seq":
        return lambda t: with_env(FWD_ENV, "seq", lambda: selective_scan_fn(**t, **kw))
    if name == "loop":
        fn = transformers_scan()
        return lambda t: fn(t["u"], t["delta"], t["A"], t["B"], t["C"], D=t["D"], z=t["z"],
                            delta_bias=t["delta_bias"], **kw)
    if name == "pscan":
        try:
            import mambapy.pscan  # noqa: F401
        except Exception as exc:
            raise Skip(f"mambapy not importable ({type(exc).__name__})") from exc
        from transformers.utils import import_utils

        if not import_utils.is_mambapy_available():
            raise Skip("transformers does not see mambapy (is_mambapy_available() is False)")
        fn = transformers_scan()
        return lambda t: fn(t["u"], t["delta"], t["A"], t["B"], t["C"], D=t["D"], z=t["z"],
                            delta_bias=t["delta_bias"], use_mambapy=True, **kw)
    if name == "assoc_scan":
        try:
            from torch._higher_order_ops.associative_scan import associative_scan
        except Exception as exc:
            raise Skip(f"torch._higher_order_ops.associative_scan not importable ({exc})") from exc
        return lambda t: assoc_scan(associative_scan, t)
    raise Skip(f"unknown peer {name}")


def with_env(name: str, value: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """fn() with the environment variable set (the interface reads it at every call)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def assoc_scan(associative_scan, t: dict) -> torch.Tensor:
    """transformers' associative-scan branch (same discretisation and combine), eager."""
    u, A = t["u"], t["A"]
    dt = torch.nn.functional.softplus(t["delta"].float() + t["delta_bias"][:, None])
    dA = torch.exp(A[None, :, None, :] * dt[..., None])  # (B, D, L, N)
    dBu = dt[..., None] * t["B"].transpose(1, 2)[:, None].float() * u.float()[..., None]

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, states = associative_scan(combine, (dA, dBu), dim=2, combine_mode="generic")
    y = torch.einsum("bdln,bnl->bdl", states, t["C"].float())
    y = y + t["D"][:, None] * u.float()
    return (y * torch.nn.functional.silu(t["z"].float())).to(u.dtype)


def fwd_bwd_fn(fn: Callable[[dict], torch.Tensor], t: dict) -> Callable[[], None]:
    leaves = [v for v in t.values() if v.requires_grad]

    def step() -> None:
        out = fn(t)
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    return step


# ---------------------------------------------------------------- compile peer (child process)
def compile_child(batch: int, length: int, dim: int, phase: str, out_path: str) -> None:
    """Runs in a child process: torch.compile of the loop fallback, compile time and step ms."""
    device = torch.device("cuda")
    t = make_inputs(batch, length, dim, device, grad=phase == "fwdbwd")
    fn = transformers_scan()
    compiled = torch.compile(lambda t: fn(t["u"], t["delta"], t["A"], t["B"], t["C"], D=t["D"],
                                          z=t["z"], delta_bias=t["delta_bias"],
                                          delta_softplus=True))
    start = time.perf_counter()
    step = fwd_bwd_fn(compiled, t) if phase == "fwdbwd" else (lambda: compiled(t))
    step()
    sync(device)
    compile_s = time.perf_counter() - start
    res = timed(step, device, 10.0)
    res["compile_s"] = compile_s
    Path(out_path).write_text(json.dumps(res))


def run_compile(batch: int, length: int, dim: int, phase: str, cap: float, out_dir: Path) -> dict:
    path = out_dir / f"compile_{batch}x{length}_{phase}.tmp.json"
    cmd = [sys.executable, __file__, "--_compile-child", f"{batch}x{length}x{dim}x{phase}",
           "--out", str(out_dir), "--_child-out", str(path)]
    try:
        proc = subprocess.run(cmd, timeout=cap, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"skipped": f"torch.compile of the loop did not finish within {cap:.0f} s"}
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"child exit {proc.returncode}: {tail[0][:300]}"}
    res = json.loads(path.read_text())
    path.unlink()
    return res


# ---------------------------------------------------------------- phases
class Recorder:
    def __init__(self, out_dir: Path, meta: dict) -> None:
        self.path = out_dir / "selective_scan.json"
        self.data = {"meta": meta, "results": []}
        self.flush()

    def add(self, row: dict) -> None:
        self.data["results"].append(row)
        self.flush()
        print(json.dumps(row), flush=True)

    def flush(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1))


compile_gave_up = ""  # once torch.compile of the loop misses the cap, later cases skip it


def measure(name: str, phase: str, batch: int, length: int, dim: int, device: torch.device,
            cap: float, out_dir: Path, smoke: bool) -> dict:
    global compile_gave_up
    row = {"phase": phase, "case": f"{batch}x{length}", "dim": dim, "peer": name}
    if name == "compile":
        if device.type != "cuda":
            return {**row, "skipped": "the compile peer runs on CUDA only"}
        if compile_gave_up:
            return {**row, "skipped": compile_gave_up}
        res = run_compile(batch, length, dim, phase, cap, out_dir)
        if "skipped" in res or "error" in res:
            compile_gave_up = f"not tried: {res.get('skipped') or res.get('error')} at {batch}x{length} {phase}"
            return {**row, **res}
        return {**row, **res}
    if name == "ours-seq" and phase != "fwd":
        return {**row, "skipped": "fwd phase only (its backward is ours')"}
    try:
        fn = peer_fn(name)
        t = make_inputs(batch, length, dim, device, grad=phase == "fwdbwd")
        step = fwd_bwd_fn(fn, t) if phase == "fwdbwd" else (lambda: fn(t))
        with torch.no_grad() if phase == "fwd" else torch.enable_grad():
            res = timed(step, device, cap)
        row.update(res)
        if name in OURS and phase == "fwd" and "ms" in res:
            row["mandatory_bytes"] = mandatory_bytes(t)
            row["gbps"] = row["mandatory_bytes"] / (row["ms"] / 1e3) / 1e9
    except Skip as exc:
        row["skipped"] = str(exc)
    except torch.OutOfMemoryError as exc:
        row["error"] = f"out of memory: {str(exc).splitlines()[0][:200]}"
    except Exception as exc:  # a peer's failure is a result, not the end of the run
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        traceback.print_exc()
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def update_rows(device: torch.device, dim: int, cap: float) -> list[dict]:
    from transformers.models.falcon_mamba import modeling_falcon_mamba as fm

    torch_step = getattr(fm.mamba_selective_state_update, "__wrapped__",
                         fm.mamba_selective_state_update)
    g = torch.Generator(device=device).manual_seed(1)
    batch = 64
    r = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    bf = torch.bfloat16
    state = r(batch, dim, N).to(bf)
    x, dt, z = (r(batch, dim).to(bf) for _ in range(3))
    A, D, bias = -torch.exp(r(dim, N) * 0.5), r(dim), r(dim)
    B, C = r(batch, N).to(bf), r(batch, N).to(bf)
    rows = []
    for name, call in (
        ("ours", lambda: selective_state_update(state, x, dt, A, B, C, D, z=z, dt_bias=bias,
                                                dt_softplus=True)),
        ("torch", lambda: torch_step(state, x, dt, A, B, C, D, dt_bias=bias, dt_softplus=True,
                                     z=z)),
    ):
        res = timed(call, device, cap)
        rows.append({"phase": "update", "case": f"{batch}x1", "dim": dim, "peer": name,
                     **({"us": res["ms"] * 1e3, "reps": res["reps"]} if "ms" in res else res)})
    return rows


def sweep_rows(batch: int, length: int, dim: int, device: torch.device, cap: float,
               copy_bw: float | None, configs: tuple) -> list[dict]:
    t = make_inputs(batch, length, dim, device, grad=False)
    B4, C4 = t["B"][:, None], t["C"][:, None]
    args = (t["u"], t["delta"], t["A"], B4, C4, t["D"], t["z"], t["delta_bias"], True)
    dout = torch.randn(t["u"].shape, device=device, dtype=torch.bfloat16)
    rows = []
    for cfg in configs:
        row = {"phase": "sweep", "case": f"{batch}x{length}", "dim": dim, "config": list(cfg)}
        try:
            fwd = timed(lambda cfg=cfg: scan_fwd.selective_scan_fwd_triton(*args, config=cfg[:3]),
                        device, cap)
            bwd = timed(lambda cfg=cfg: scan_bwd.selective_scan_bwd_triton(dout, None, *args,
                                                                           config=cfg),
                        device, cap)
            row.update(fwd_ms=fwd.get("ms"), bwd_ms=bwd.get("ms"))
            if copy_bw and "ms" in fwd:
                row["copy_frac"] = mandatory_bytes(t) / (fwd["ms"] / 1e3) / copy_bw
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def seq_sweep_rows(batch: int, length: int, dim: int, device: torch.device, cap: float,
                   copy_bw: float | None, configs: tuple) -> list[dict]:
    """The seq forward (scan_fwd_seq) at each (BLOCK_D, num_warps) config."""
    t = make_inputs(batch, length, dim, device, grad=False)
    args = (t["u"], t["delta"], t["A"], t["B"][:, None], t["C"][:, None], t["D"], t["z"],
            t["delta_bias"], True)
    rows = []
    for cfg in configs:
        row = {"phase": "seqsweep", "case": f"{batch}x{length}", "dim": dim, "config": list(cfg)}
        try:
            res = timed(lambda cfg=cfg: scan_fwd_seq.selective_scan_fwd_seq_triton(
                *args, config=cfg), device, cap)
            row.update(res)
            if "ms" in res:
                row["gbps"] = mandatory_bytes(t) / (res["ms"] / 1e3) / 1e9
                if copy_bw:
                    row["copy_frac"] = row["gbps"] * 1e9 / copy_bw
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (selective_scan.json)")
    ap.add_argument("--phases", default="copy,fwd,fwdbwd,update,sweep,seqsweep")
    ap.add_argument("--cases", default="1x4096,8x4096", help="BxL list")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--time-cap", type=float, default=10.0, help="seconds per peer and case")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; CPU interpreter works")
    ap.add_argument("--_compile-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._compile_child:
        b, length, dim, phase = args._compile_child.split("x")
        compile_child(int(b), int(length), int(dim), phase, args._child_out)
        return 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("no CUDA device: set TRITON_INTERPRET=1 (with --smoke) to run the kernels on CPU",
              file=sys.stderr)
        return 2
    phases = set(args.phases.split(","))
    dim = SMOKE_DIM if args.smoke else DIM
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    if args.smoke:
        cases = [(1, 12), (2, 12)]
    import transformers
    import triton

    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "dim": dim, "N": N, "dtype": "bfloat16", "smoke": args.smoke,
            "fwd_config": list(scan_fwd.FWD_CONFIG), "bwd_config": list(scan_bwd.BWD_CONFIG),
            "seq_config": list(scan_fwd_seq.SEQ_CONFIG)}
    rec = Recorder(out_dir, meta)
    start = time.perf_counter()
    copy_bw = None
    if "copy" in phases:
        copy_bw = copy_bandwidth(device, args.smoke)
        rec.data["meta"]["copy_gbps"] = copy_bw / 1e9
        rec.add({"phase": "copy", "gbps": copy_bw / 1e9})
    peers = [p for p in args.peers.split(",") if p]
    for phase in ("fwd", "fwdbwd"):
        if phase not in phases:
            continue
        for batch, length in cases:
            for name in peers:
                row = measure(name, phase, batch, length, dim, device, args.time_cap, out_dir,
                              args.smoke)
                if copy_bw and "gbps" in row:
                    row["copy_frac"] = row["gbps"] * 1e9 / copy_bw
                rec.add(row)
    if "update" in phases:
        for row in update_rows(device, dim, args.time_cap):
            rec.add(row)
    if "sweep" in phases:
        batch, length = cases[0]
        configs = SMOKE_SWEEP if args.smoke else SWEEP
        for row in sweep_rows(batch, length, dim, device, min(args.time_cap, 4.0), copy_bw,
                              configs):
            rec.add(row)
    if "seqsweep" in phases:
        configs = SMOKE_SEQ_SWEEP if args.smoke else scan_fwd_seq.SEQ_SWEEP
        for batch, length in cases:
            for row in seq_sweep_rows(batch, length, dim, device, min(args.time_cap, 4.0),
                                      copy_bw, configs):
                rec.add(row)
    rec.data["meta"]["wall_s"] = time.perf_counter() - start
    rec.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
