"""Mamba-1's selective scan on one device: fastpath's Triton kernels side by side with every
compiler-free alternative transformers offers.

Shapes: Falcon-Mamba-7B's mixer (D = 8192, N = 16), bf16 u/delta/B/C/z, float32 A/D/delta_bias,
delta_softplus, B/C shared (batch, N, L), laid out as transformers 5.17 passes them
(models/falcon_mamba/modeling_falcon_mamba.py: u and z are channel-last views, B/C transposed
(B, L, N) views, delta contiguous); cases (B, L) = (1, 4096) and (8, 4096).
Peers (each skipped with its reason when it cannot run; each capped by --time-cap seconds):
- ours:        fastpath.kernels.selective_scan.interface.selective_scan_fn (its default
               forward, the tile kernel of fwd_tile.py)
- ours-seq:    the same with FASTPATH_SSCAN_FWD=seq (the time-sequential forward,
               kernels/selective_scan/fwd_seq.py); ours-chunked (fwd_chunked.py), ours-tile,
               ours-tile-poly (fwd_tile.py) likewise; in fwdbwd their backward is ours' (the
               same kernel)
- ours-bwd-chunked: ours with FASTPATH_SSCAN_BWD=chunked (the chunked backward,
               kernels/selective_scan/bwd.py, instead of the default time-walking bwd_seq.py);
               fwdbwd only (its forward is ours')
- loop:        transformers' torch fallback `mamba_selective_scan` (its Python loop over L)
- pscan:       the same function with use_mambapy=True (mambapy's pscan, when importable)
- assoc_scan:  torch._higher_order_ops.associative_scan over (exp(dA), dB u) as transformers
               combines them, eager, combine_mode="generic" (transformers itself takes this
               branch only under torch.compile)
- compile:     torch.compile of the loop fallback, in a child process killed after --time-cap
Phases: fwd and fwdbwd (ms, median of CUDA-event timed calls after one untimed warm-up call, so
Triton's compilation never lands in a timing row), update (the decode step at B = 64 vs
transformers' torch step), sweep (our tile configs at the first case), seqsweep (the seq forward's
SEQ_SWEEP configs at every case), copy (the device's copy bandwidth, measured first); sweep also
times the seq backward's BWD_SEQ_SWEEP configs (rows with "variant": "bwd-seq", bwd_ms only). Phase
bwd (not in the default list) times the two backwards alone at every case: the chunked one (bwd.py)
and the seq one (bwd_seq.py) at its default and every BWD_SEQ_SWEEP config, each after an untimed
compile call, with `speedup` over the chunked one and `max_rel_diff` (the largest relative L2
distance of a gradient to the chunked one's). For our forwards the JSON also has `copy_frac`: the
mandatory bytes (read u, delta, B, C, z; write y) over our time, as a fraction of the measured copy
bandwidth. The JSON is rewritten after every measurement.

Forward-variant sweep (--fwd-variants chunked,seq,tile,tile-poly; phase "fwdvariants", alone
unless --phases names others): in one process, every variant (at its default config, then with
--fwd-configs sweep at each config of its sweep list, or explicit configs) at each of
--fwd-cases (8x4096,1x4096; D = 8192, N = 16, bf16) in each of --fwd-layouts (tf: u, z
channel-last as transformers' CUDA path passes them; contiguous: u, delta, z all (B, D, L)
contiguous). Per row: median ms of CUDA-event-timed calls after an untimed first call (the
compile, its seconds recorded), max abs difference of out and last_state against the chunked
kernel's (printed), and `pct_copy`: 100 x the time a torch copy of the same number of bytes
takes (the mandatory bytes: read u, delta, B, C, z, write y; measured in this process) over the
variant's time. Total device time is capped by --budget-s (default 110 s, compiles included:
a row that would start past it is written as skipped), so the whole sweep stays under 120 s.

usage: python benchmarks/selective_scan.py --out DIR
           [--phases copy,fwd,fwdbwd,bwd,update,sweep,seqsweep] [--cases 1x4096,8x4096]
           [--peers ours,ours-seq,ours-tile,ours-tile-poly,ours-bwd-chunked,loop,pscan,assoc_scan,
                    compile]
           [--time-cap 20] [--smoke]
       python benchmarks/selective_scan.py --out DIR --fwd-variants chunked,seq,tile,tile-poly
           [--fwd-configs default|sweep|VARIANT:B/T/W[/...];...] [--fwd-cases 8x4096,1x4096]
           [--fwd-layouts tf,contiguous] [--budget-s 110]
--smoke: tiny shapes, runs on CPU under TRITON_INTERPRET=1 (checks the script, no timing claims;
no cap applies: a slow interpreter call is timed, never skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from fastpath.kernels.selective_scan import bwd as bwd_mod
from fastpath.kernels.selective_scan import bwd_seq, fwd_chunked, fwd_seq, fwd_tile
from fastpath.kernels.selective_scan.interface import (
    BWD_ENV,
    FWD_ENV,
    FWD_KERNELS,
    selective_scan_fn,
)
from fastpath.kernels.selective_scan.update import selective_state_update

DIM, N = 8192, 16
SMOKE_DIM = 16
SMOKE_SWEEP = ((8, 8, 4, True), (16, 8, 2, False))
SMOKE_SEQ_SWEEP = ((8, 2), (16, 4))
SMOKE_BWD_SEQ_SWEEP = ((8, 4, 1, 2, False, False),)  # the default (smoke: T 8) is vector
PEERS = ("ours", "ours-seq", "ours-tile", "ours-tile-poly", "ours-bwd-chunked", "loop", "pscan",
         "assoc_scan", "compile")
# peers that are ours with an environment variable set around the whole step (the backward
# reads FASTPATH_SSCAN_BWD when autograd calls it, after the forward has returned)
PEER_ENV = {"ours-bwd-chunked": (BWD_ENV, "chunked")}
OURS = ("ours", "ours-seq", "ours-tile", "ours-tile-poly")
SWEEP = bwd_mod.SWEEP_CONFIGS


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
    only one timed. cap = inf (--smoke): never skipped, one timed call (the interpreter checks the
    plumbing; its times mean nothing, and each call costs seconds of CI)."""
    warm = wall(fn, device)
    if math.isinf(cap):
        return {"ms": statistics.median(event_ms(fn, device, 1)), "reps": 1, "warmup_s": warm}
    if warm > cap:
        return {"skipped": f"the warm-up call took {warm:.1f} s, over the {cap:.0f} s cap",
                "warmup_s": warm}
    first = wall(fn, device)
    if first > cap / 2:
        return {"ms": first * 1e3, "reps": 1, "warmup_s": warm,
                "note": "one call after the warm-up (slow)"}
    reps = max(3, min(50, int(cap / 4 / max(first, 1e-6))))
    return {"ms": statistics.median(event_ms(fn, device, reps)), "reps": reps, "warmup_s": warm}


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
    if name == "ours" or name in PEER_ENV:
        return lambda t: selective_scan_fn(**t, **kw)
    if name.startswith("ours-") and name[5:] in FWD_KERNELS:
        return lambda t: with_env(FWD_ENV, name[5:], lambda: selective_scan_fn(**t, **kw))
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
        proc = subprocess.run(cmd, timeout=None if math.isinf(cap) else cap, capture_output=True, text=True)
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
    if name in PEER_ENV and phase == "fwd":
        return {**row, "skipped": "its forward is ours' (only the backward differs)"}
    with failure_recorded(row, device):
        fn = peer_fn(name)
        t = make_inputs(batch, length, dim, device, grad=phase == "fwdbwd")
        step = fwd_bwd_fn(fn, t) if phase == "fwdbwd" else (lambda: fn(t))
        if name in PEER_ENV:
            step = functools.partial(with_env, *PEER_ENV[name], step)
        with torch.no_grad() if phase == "fwd" else torch.enable_grad():
            res = timed(step, device, cap)
        row.update(res)
        if name in OURS and phase == "fwd" and "ms" in res:
            row["mandatory_bytes"] = mandatory_bytes(t)
            row["gbps"] = row["mandatory_bytes"] / (row["ms"] / 1e3) / 1e9
    return row


@contextlib.contextmanager
def failure_recorded(row: dict, device: torch.device) -> Iterator[None]:
    """A measurement's failure becomes its row's result ("skipped" with a Skip's reason, else
    "error"), not the end of the run; the allocator's cache goes back to the device either way, so
    one peer's high-water mark never starves the next."""
    try:
        yield
    except Skip as exc:
        row["skipped"] = str(exc)
    except torch.OutOfMemoryError as exc:
        row["error"] = f"out of memory: {str(exc).splitlines()[0][:200]}"
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        traceback.print_exc()
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


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


def bwd_inputs(batch: int, length: int, dim: int, device: torch.device
               ) -> tuple[dict, tuple, torch.Tensor]:
    """(inputs, the backward launchers' arguments after dout and dlast_state, dout)."""
    t = make_inputs(batch, length, dim, device, grad=False)
    args = (t["u"], t["delta"], t["A"], t["B"][:, None], t["C"][:, None], t["D"], t["z"],
            t["delta_bias"], True)
    # seeded like the inputs: the rows' max_rel_diff must not depend on what ran before in the process
    g = torch.Generator(device=device).manual_seed(2)
    return t, args, torch.randn(t["u"].shape, generator=g, device=device).to(torch.bfloat16)


def sweep_rows(batch: int, length: int, dim: int, device: torch.device, cap: float,
               copy_bw: float | None, configs: tuple, seq_configs: tuple = ()) -> list[dict]:
    t, args, dout = bwd_inputs(batch, length, dim, device)
    rows = []
    for cfg in configs:
        row = {"phase": "sweep", "case": f"{batch}x{length}", "dim": dim, "config": list(cfg)}
        try:
            fwd = timed(lambda cfg=cfg: fwd_chunked.selective_scan_fwd_triton(*args, config=cfg[:3]),
                        device, cap)
            bwd = timed(lambda cfg=cfg: bwd_mod.selective_scan_bwd_triton(dout, None, *args,
                                                                           config=cfg),
                        device, cap)
            row.update(fwd_ms=fwd.get("ms"), bwd_ms=bwd.get("ms"))
            # a config whose first call (its compile) outlasts the cap is not timed: say so
            row.update({f"{name}_skipped": r["skipped"] for name, r in (("fwd", fwd), ("bwd", bwd))
                        if "skipped" in r})
            if copy_bw and "ms" in fwd:
                row["copy_frac"] = mandatory_bytes(t) / (fwd["ms"] / 1e3) / copy_bw
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    for cfg in seq_configs:  # the seq backward (bwd_seq.py): its own configs, backward only
        row = {"phase": "sweep", "case": f"{batch}x{length}", "dim": dim, "variant": "bwd-seq",
               "config": list(cfg)}
        try:
            bwd = timed(functools.partial(bwd_seq.selective_scan_bwd_seq_triton, dout, None,
                                          *args, config=cfg), device, cap)
            row.update({"bwd_ms": bwd["ms"]} if "ms" in bwd else {"bwd_skipped": bwd["skipped"]})
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def bwd_rows(batch: int, length: int, dim: int, device: torch.device, cap: float,
             seq_configs: tuple) -> Iterator[dict]:
    """Phase bwd: the chunked backward at its default, then the seq backward at its default and
    each of `seq_configs`, alone (no forward), after an untimed first call (the compile, its
    seconds recorded); each seq row with its speedup over the chunked one and the largest
    relative L2 distance of its gradients to the chunked one's."""
    _, args, dout = bwd_inputs(batch, length, dim, device)
    items = [("chunked", None)] + [("seq", cfg) for cfg in
                                   dict.fromkeys((None, *(tuple(c) for c in seq_configs)))]
    base, base_ms = None, None
    for kernel, cfg in items:
        shown = cfg or (bwd_mod.default_config(bwd_mod.BWD_CONFIG) if kernel == "chunked"
                        else bwd_seq.default_seq_config())
        row = {"phase": "bwd", "case": f"{batch}x{length}", "dim": dim, "kernel": kernel,
               "config": list(shown), "default": cfg is None}
        launch = (bwd_mod.selective_scan_bwd_triton if kernel == "chunked"
                  else bwd_seq.selective_scan_bwd_seq_triton)
        call = functools.partial(launch, dout, None, *args, config=cfg)
        with failure_recorded(row, device):
            start = time.perf_counter()
            grads = call()
            sync(device)
            row["compile_s"] = time.perf_counter() - start
            if base is None:
                base = grads
            else:
                row["max_rel_diff"] = max(rel_diff(a, b) for a, b in zip(grads, base, strict=True)
                                          if a is not None)
            del grads
            row.update(timed(call, device, cap))
            if kernel == "chunked":
                base_ms = row.get("ms")
            elif base_ms and "ms" in row:
                row["speedup"] = base_ms / row["ms"]
        yield row


def seq_sweep_rows(batch: int, length: int, dim: int, device: torch.device, cap: float,
                   copy_bw: float | None, configs: tuple) -> list[dict]:
    """The seq forward (fwd_seq) at each (BLOCK_D, num_warps) config."""
    t = make_inputs(batch, length, dim, device, grad=False)
    args = (t["u"], t["delta"], t["A"], t["B"][:, None], t["C"][:, None], t["D"], t["z"],
            t["delta_bias"], True)
    rows = []
    for cfg in configs:
        row = {"phase": "seqsweep", "case": f"{batch}x{length}", "dim": dim, "config": list(cfg)}
        try:
            res = timed(lambda cfg=cfg: fwd_seq.selective_scan_fwd_seq_triton(
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


# ---------------------------------------------------------------- forward-variant sweep
FWD_CASES = "8x4096,1x4096"
FWD_LAYOUTS = ("tf", "contiguous")
SMOKE_FWD_CASES = ((2, 21), (1, 21))
SWEEP_PRIORITY = ("tile", "tile-poly", "seq", "chunked")


def fwd_variant_launcher(variant: str) -> Callable:
    """(u, delta, A, B, C, D, z, delta_bias, delta_softplus, config=...) -> (out, last_state)."""
    if variant == "chunked":
        return fwd_chunked.selective_scan_fwd_triton
    if variant == "seq":
        return fwd_seq.selective_scan_fwd_seq_triton
    return fwd_tile.selective_scan_fwd_tile_triton


def fwd_variant_configs(variant: str, smoke: bool) -> tuple:
    """(default config, the configs --fwd-configs sweep adds) of a variant."""
    if variant == "chunked":
        extra = tuple(dict.fromkeys(tuple(c[:3]) for c in SWEEP[:3]))
        return fwd_chunked.FWD_CONFIG, extra[:1] if smoke else extra
    if variant == "seq":
        return fwd_seq.SEQ_CONFIG, fwd_seq.SEQ_SWEEP[:2] if smoke else fwd_seq.SEQ_SWEEP
    if variant == "tile":
        return fwd_tile.TILE_CONFIG, fwd_tile.TILE_SWEEP[:2] if smoke else fwd_tile.TILE_SWEEP
    sweep = fwd_tile.TILE_POLY_SWEEP
    return fwd_tile.TILE_POLY_CONFIG, sweep[:2] if smoke else sweep


def parse_fwd_config(variant: str, text: str, smoke: bool = False) -> tuple[int, ...]:
    """A/B/C... -> a config of `variant`, its width checked (the tile kernels' last three numbers,
    STAGES, SEGMENTS and PRECISE, may be left out), so a wrong one fails here, not at a GPU
    launch."""
    try:
        values = tuple(int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"{text!r} is not integers joined by '/'") from None
    width = len(fwd_variant_configs(variant, smoke)[0])
    widths = range(5, 9) if variant.startswith("tile") else range(width, width + 1)
    if len(values) not in widths:
        told = f"{widths[0]} to {widths[-1]}" if len(widths) > 1 else str(width)
        raise ValueError(f"{variant} takes {told} numbers a config, got {text!r}")
    return values


def parse_case(case: str) -> tuple[int, int]:
    """BxL -> (B, L), both positive."""
    parts = case.split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"case {case!r} is not BxL (e.g. 1x4096)")
    return int(parts[0]), int(parts[1])


def parse_fwd_items(variants: list[str], spec: str, smoke: bool) -> list[tuple[str, tuple]]:
    """[(variant, config)]: every variant's default first (the rows that matter most come before
    the budget can run out), then the swept or explicitly named configs."""
    bad = [v for v in variants if v not in FWD_KERNELS]
    if bad or not variants:
        raise ValueError(f"--fwd-variants: unknown {', '.join(bad) or '(none given)'}; expected "
                         f"some of {', '.join(FWD_KERNELS)}")
    items = [(v, tuple(fwd_variant_configs(v, smoke)[0])) for v in variants]
    if spec == "default":
        return items
    if spec == "sweep":  # the candidates first, the known-slow kernels' configs last
        order = sorted(variants, key=lambda v: SWEEP_PRIORITY.index(v))
        extra = [(v, tuple(c)) for v in order for c in fwd_variant_configs(v, smoke)[1]]
    else:
        extra = []
        for part in filter(None, spec.split(";")):
            name, _, configs = part.partition(":")
            if name not in variants or not configs:
                raise ValueError(f"--fwd-configs: {part!r} is not VARIANT:A/B/C[,A/B/C] with "
                                 f"VARIANT one of --fwd-variants ({', '.join(variants)})")
            for cfg in configs.split(","):
                try:
                    values = parse_fwd_config(name, cfg, smoke)
                except ValueError as exc:
                    raise ValueError(f"--fwd-configs: {exc}") from None
                extra.append((name, values))
    return list(dict.fromkeys(items + extra))


def fwd_inputs(batch: int, length: int, dim: int, device: torch.device, layout: str) -> dict:
    """make_inputs' tensors (transformers' layouts); `contiguous`: u, z copied to (B, D, L)."""
    t = make_inputs(batch, length, dim, device, grad=False)
    if layout == "contiguous":
        t["u"], t["z"] = t["u"].contiguous(), t["z"].contiguous()
    t["B"], t["C"] = t["B"][:, None], t["C"][:, None]  # (B, 1, N, L) as the op passes them
    return t


def event_ms(fn: Callable[[], object], device: torch.device, reps: int) -> list[float]:
    """Per-call milliseconds of `reps` calls (CUDA events on a GPU)."""
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
    return times


def copy_ms_for(nbytes: int, device: torch.device) -> float:
    """Median ms of a torch copy that moves `nbytes` (read + write) on the device."""
    src = torch.empty(max(1, nbytes // 4), dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    return statistics.median(event_ms(lambda: dst.copy_(src), device, 20))


def fwd_variant_rows(variants: list[str], spec: str, cases: list[tuple[int, int]],
                     layouts: list[str], dim: int, device: torch.device, deadline: float,
                     smoke: bool) -> Iterator[dict]:
    """The forward-variant sweep (see the module docstring); yields rows as they are made."""
    items = parse_fwd_items(variants, spec, smoke)
    setups = {}
    for layout in layouts:
        for batch, length in cases:
            t = fwd_inputs(batch, length, dim, device, layout)
            args = (t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["delta_bias"],
                    True)
            ref_out, ref_last = fwd_chunked.selective_scan_fwd_triton(*args)
            nbytes = mandatory_bytes(t)
            setups[(layout, batch, length)] = (args, ref_out, ref_last, nbytes,
                                               copy_ms_for(nbytes, device))
    for variant, cfg in items:
        launch = fwd_variant_launcher(variant)
        for (layout, batch, length), (args, ref_out, ref_last, nbytes, copy_ms) in setups.items():
            row = {"phase": "fwdvariants", "variant": variant, "config": list(cfg),
                   "layout": layout, "case": f"{batch}x{length}", "dim": dim,
                   "mandatory_bytes": nbytes, "copy_ms": copy_ms}
            if time.perf_counter() > deadline:
                yield {**row, "skipped": "past --budget-s"}
                continue
            try:
                started = time.perf_counter()
                out, last = launch(*args, config=cfg)
                sync(device)
                row["first_call_s"] = time.perf_counter() - started  # the compile, mostly
                row["max_abs_diff_out"] = (out.float() - ref_out.float()).abs().max().item()
                row["max_abs_diff_last"] = (last - ref_last).abs().max().item()
                row["finite"] = bool(torch.isfinite(out).all().item())
                del out, last
                call = functools.partial(launch, *args, config=cfg)
                probe = 1.0 if smoke else event_ms(call, device, 1)[0]
                reps = 1 if smoke else max(3, min(25, int(250 / max(probe, 1e-3))))
                ms = statistics.median(event_ms(call, device, reps))
                row.update(ms=ms, reps=reps, gbps=nbytes / (ms / 1e3) / 1e9,
                           pct_copy=100.0 * copy_ms / ms)
            except Exception as exc:  # a variant's failure is a result, not the end of the sweep
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                traceback.print_exc()
            yield row


def best_fwd_rows(rows: list[dict]) -> list[dict]:
    """The fastest timed row per (layout, case)."""
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["layout"], r["case"])
        if "ms" in r and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    return [{k: r[k] for k in ("layout", "case", "variant", "config", "ms", "pct_copy",
                               "max_abs_diff_out")} for r in best.values()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", required=True, help="output directory (selective_scan.json)")
    ap.add_argument("--phases", default=None,
                    help="copy,fwd,fwdbwd,update,sweep,seqsweep (all) unless --fwd-variants is "
                         "given (then fwdvariants alone); bwd (both backwards alone) on request")
    ap.add_argument("--cases", default="1x4096,8x4096", help="BxL list")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--time-cap", type=float, default=10.0, help="seconds per peer and case")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; CPU interpreter works")
    ap.add_argument("--fwd-variants", default=None,
                    help=f"forward-variant sweep: some of {','.join(FWD_KERNELS)} (one process; "
                         "device time <= --budget-s, 110 s by default, compiles included, so the "
                         "sweep stays under 120 s)")
    ap.add_argument("--fwd-configs", default="default",
                    help="default | sweep (each variant's sweep list) | "
                         "VARIANT:A/B/C[,A/B/C][;VARIANT:...] (tile, tile-poly: BLOCK_D/T/"
                         "warps/POLY_N/AUX[/STAGES[/SEGMENTS[/PRECISE]]])")
    ap.add_argument("--fwd-cases", default=FWD_CASES, help="BxL list for the sweep")
    ap.add_argument("--fwd-layouts", default=",".join(FWD_LAYOUTS),
                    help="tf (u, z channel-last views) and/or contiguous (u, delta, z (B, D, L))")
    ap.add_argument("--budget-s", type=float, default=110.0,
                    help="seconds from the start after which no new sweep row starts")
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
    started = time.perf_counter()
    if args.phases is None:
        args.phases = ("fwdvariants" if args.fwd_variants
                       else "copy,fwd,fwdbwd,update,sweep,seqsweep")
    phases = set(args.phases.split(","))
    dim = SMOKE_DIM if args.smoke else DIM
    fwd_variants: list[str] = []
    fwd_cases: list[tuple[int, int]] = []
    if "fwdvariants" in phases or args.fwd_variants:
        phases.add("fwdvariants")
        fwd_variants = [v for v in (args.fwd_variants or ",".join(FWD_KERNELS)).split(",") if v]
        layouts = [v for v in args.fwd_layouts.split(",") if v]
        try:
            parse_fwd_items(fwd_variants, args.fwd_configs, args.smoke)
            try:
                fwd_cases = [parse_case(c) for c in args.fwd_cases.split(",")]
            except ValueError as exc:
                raise ValueError(f"--fwd-cases {args.fwd_cases!r}: {exc}") from None
            if not layouts or set(layouts) - set(FWD_LAYOUTS):
                raise ValueError(f"--fwd-layouts {args.fwd_layouts!r}: expected some of "
                                 f"{','.join(FWD_LAYOUTS)}")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.smoke:
            fwd_cases = list(SMOKE_FWD_CASES)
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    if args.smoke:
        cases = [(1, 12), (2, 12)]
    import transformers
    import triton

    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "dim": dim, "N": N, "dtype": "bfloat16", "smoke": args.smoke,
            "fwd_config": list(fwd_chunked.FWD_CONFIG), "bwd_config": list(bwd_mod.BWD_CONFIG),
            "seq_config": list(fwd_seq.SEQ_CONFIG),
            "bwd_seq_config": list(bwd_seq.BWD_SEQ_CONFIG)}
    rec = Recorder(out_dir, meta)
    start = time.perf_counter()
    if "fwdvariants" in phases:
        rec.data["meta"]["budget_s"] = args.budget_s
        fwd_rows = []
        for row in fwd_variant_rows(fwd_variants, args.fwd_configs, fwd_cases, layouts, dim,
                                    device, started + args.budget_s, args.smoke):
            fwd_rows.append(row)
            rec.add(row)
        rec.data["meta"]["fwd_best"] = best_fwd_rows(fwd_rows)
        for b in rec.data["meta"]["fwd_best"]:
            print("best", json.dumps(b), flush=True)
    # --time-cap per peer and case; a swept config whose warm-up passes 4 s is not worth timing on
    # a GPU; under --smoke (the interpreter takes seconds for any call) nothing is capped
    peer_cap = math.inf if args.smoke else args.time_cap
    config_cap = math.inf if args.smoke else min(args.time_cap, 4.0)
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
                row = measure(name, phase, batch, length, dim, device, peer_cap, out_dir,
                              args.smoke)
                if copy_bw and "gbps" in row:
                    row["copy_frac"] = row["gbps"] * 1e9 / copy_bw
                rec.add(row)
    if "bwd" in phases:
        seq_configs = SMOKE_BWD_SEQ_SWEEP if args.smoke else bwd_seq.BWD_SEQ_SWEEP
        for batch, length in cases:
            for row in bwd_rows(batch, length, dim, device, config_cap, seq_configs):
                rec.add(row)
    if "update" in phases:
        for row in update_rows(device, dim, peer_cap):
            rec.add(row)
    if "sweep" in phases:
        batch, length = cases[0]
        configs = SMOKE_SWEEP if args.smoke else SWEEP
        seq_configs = SMOKE_BWD_SEQ_SWEEP if args.smoke else bwd_seq.BWD_SEQ_SWEEP
        for row in sweep_rows(batch, length, dim, device, config_cap, copy_bw,
                              configs, seq_configs):
            rec.add(row)
    if "seqsweep" in phases:
        configs = SMOKE_SEQ_SWEEP if args.smoke else fwd_seq.SEQ_SWEEP
        for batch, length in cases:
            for row in seq_sweep_rows(batch, length, dim, device, config_cap,
                                      copy_bw, configs):
                rec.add(row)
    rec.data["meta"]["wall_s"] = time.perf_counter() - start
    rec.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
