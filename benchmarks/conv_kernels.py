"""Side-by-side benchmark of causal_conv1d implementations on one CUDA device, one process.

Implementations: fastpath (Triton), the torch fallback as transformers runs it, FLA's Triton kernel
(if `fla` imports), Dao's CUDA kernel (if `causal_conv1d_cuda` imports), plus device copy
bandwidth as the ceiling. Shapes: D=10240, W=4, bf16, channel-last x ((B, L, D) memory viewed
as (B, D, L)); (B, L) in (1, 4096), (8, 4096), (1, 65536); decode update at B=64 with a state of
length W. Reports fwd ms + GB/s (bytes = read x + write y), fwd+bwd ms, update us (do_bench
median and CUDA-graph replay), rel. error vs a float64 reference. --sweep also times tile configs
of our kernels. Writes JSON to --out.

usage: python benchmarks/conv_kernels.py --out results.json [--sweep] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import fastpath.causal_conv1d as ours
from fastpath.kernels.causal_conv1d.bwd_tile import causal_conv1d_bwd_triton
from fastpath.kernels.causal_conv1d.fwd_tile import causal_conv1d_fwd_triton
from fastpath.kernels.causal_conv1d.interface import update_impl
from fastpath.kernels.causal_conv1d.naive import causal_conv1d_ref
from fastpath.kernels.causal_conv1d.update import causal_conv1d_update_triton

D, W = 10240, 4
DT = torch.bfloat16
SHAPES = [(1, 4096), (8, 4096), (1, 65536)]
UPDATE_B = 64


def bench(fn, rep=200, grad_to_none=None) -> float:
    """Median ms over `rep` ms of repeats (CUDA events), after warm-up. grad_to_none: leaves
    whose .grad is reset before each call, so backward never pays for grad accumulation."""
    return float(do_bench(fn, warmup=50, rep=rep, grad_to_none=grad_to_none,
                          return_mode="median"))


def bench_graph(fn, calls=20) -> float:
    """Median ms per call when `calls` calls are replayed from one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return bench(graph.replay) / calls


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double(), ref.detach()
    return float((got - ref).norm() / ref.norm())


# ------------------------------------------------------------------ implementations
def torch_fallback_fn(x, w, b=None):
    """transformers' fallback: F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=W-1, groups=D)[..., :L])."""
    seqlen = x.shape[-1]
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=w.shape[-1] - 1, groups=x.shape[1])[..., :seqlen])


def torch_fallback_update(x, conv_state, w, b=None):
    """transformers' torch_causal_conv1d_update style: cat, shift the state, conv, silu."""
    seqlen = x.shape[-1]
    state_len = conv_state.shape[-1]
    joined = torch.cat([conv_state, x], dim=-1).to(w.dtype)
    conv_state.copy_(joined[:, :, -state_len:])
    out = F.conv1d(joined, w.unsqueeze(1), b, padding=0, groups=x.shape[1])
    return F.silu(out[:, :, -seqlen:]).to(x.dtype)


def load_fla():
    try:
        mod = importlib.import_module("fla.modules.causal_conv1d")
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return mod, None


def load_dao():
    """Dao's real package, never our alias (we never alias in this process; check anyway)."""
    try:
        importlib.import_module("causal_conv1d_cuda")
        mod = importlib.import_module("causal_conv1d")
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if getattr(mod, "__fastpath__", False):
        return None, "causal_conv1d resolves to fastpath's alias"
    if not hasattr(mod, "causal_conv1d_fn"):
        return None, f"causal_conv1d resolves to {mod.__file__}, not Dao's package"
    return mod, None


def impls(fla, dao, compiled: bool = False):
    """name -> (fwd(x_view, w) -> y_view-like, update(x, state, w) -> y). compiled: also the
    torch fallback under torch.compile (inductor), the strongest no-extension peer."""
    table = {
        "fastpath": (
            lambda x, w: ours.causal_conv1d_fn(x, w, None, activation="silu"),
            lambda x, s, w: ours.causal_conv1d_update(x, s, w, None, "silu"),
        ),
        "torch": (torch_fallback_fn, torch_fallback_update),
    }
    if fla is not None:
        table["fla"] = (
            # FLA takes [B, T, D]; our channel-last view's memory is exactly that
            lambda x, w: fla.causal_conv1d(x.transpose(1, 2), w, activation="silu")[0].transpose(1, 2),
            lambda x, s, w: fla.causal_conv1d_update(x[..., 0], s, None, w, None, "silu")[0],
        )
    if compiled:
        table["torch.compile"] = (torch.compile(torch_fallback_fn, dynamic=False),
                                  torch.compile(torch_fallback_update, dynamic=False))
    if dao is not None:
        table["dao"] = (
            lambda x, w: dao.causal_conv1d_fn(x, w, None, activation="silu"),
            lambda x, s, w: dao.causal_conv1d_update(x, s, w, None, "silu"),
        )
    return table


# ------------------------------------------------------------------ measurements
def make_inputs(batch, seqlen, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    xmem = torch.randn(batch, seqlen, D, device="cuda", dtype=DT, generator=gen)
    w = (torch.randn(D, W, device="cuda", generator=gen) * 0.5).to(DT)
    return xmem.transpose(1, 2), w


def copy_bandwidth(batch, seqlen) -> dict:
    x, _ = make_inputs(batch, seqlen)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    nbytes = 2 * x.numel() * x.element_size()
    return {"ms": ms, "GBps": nbytes / ms / 1e6}


def measure_fn(name, fwd, batch, seqlen, ref_cache) -> dict:
    row: dict = {"impl": name, "B": batch, "L": seqlen}
    x, w = make_inputs(batch, seqlen)
    nbytes = 2 * x.numel() * x.element_size()
    try:
        y = fwd(x, w)
        torch.cuda.synchronize()
        key = (batch, seqlen)
        if key not in ref_cache:
            ref_cache.clear()
            ref_cache[key] = causal_conv1d_ref(x.double(), w.double(), activation="silu")
        row["rel_err"] = rel_err(y, ref_cache[key])
        row["out_stride_matches_x"] = tuple(y.stride()) == tuple(x.stride())
        del y
        ms = bench(lambda: fwd(x, w))
        row["fwd_ms"] = ms
        row["fwd_GBps"] = nbytes / ms / 1e6
        xg = x.detach().requires_grad_()
        wg = w.detach().requires_grad_()
        dout = torch.randn_like(x)

        def step():
            fwd(xg, wg).backward(dout)

        row["fwd_bwd_ms"] = bench(step, rep=300, grad_to_none=[xg, wg])
        if batch == 1 and seqlen == 4096:  # gradient accuracy on the small shape
            xg.grad = wg.grad = None
            step()
            xr = x.detach().double().requires_grad_()
            wr = w.detach().double().requires_grad_()
            causal_conv1d_ref(xr, wr, activation="silu").backward(dout.double())
            row["dx_rel_err"] = rel_err(xg.grad, xr.grad)
            row["dw_rel_err"] = rel_err(wg.grad, wr.grad)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    torch.cuda.empty_cache()
    return row


def measure_update(name, upd) -> dict:
    row: dict = {"impl": name, "B": UPDATE_B}
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(UPDATE_B, D, 1, device="cuda", dtype=DT, generator=gen)
    state = torch.randn(UPDATE_B, D, W, device="cuda", dtype=DT, generator=gen)
    w = (torch.randn(D, W, device="cuda", generator=gen) * 0.5).to(DT)
    try:
        ref_state = state.double().clone()
        s = state.clone()
        y = upd(x, s, w)
        ref = ours.causal_conv1d_interface.causal_conv1d_update_ref(
            x.double(), ref_state, w.double(), None, "silu"
        )
        row["rel_err"] = rel_err(y.reshape(ref.shape), ref)
        row["state_exact"] = bool(torch.equal(s.double(), ref_state))
        row["us_do_bench"] = 1000 * bench(lambda: upd(x, state, w))
        row["us_cuda_graph"] = 1000 * bench_graph(lambda: upd(x, state, w))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    return row


def sweep() -> list[dict]:
    """Tile configs of our kernels at (8, 4096), the decode step, and host-side launch costs."""
    from fastpath.kernels.causal_conv1d import update as conv1d_update
    from fastpath.kernels.causal_conv1d.fwd_bwd_rows import (
        causal_conv1d_bwd_rows,
        causal_conv1d_fwd_rows,
    )

    rows = []
    x, w = make_inputs(8, 4096)
    nbytes = 2 * x.numel() * x.element_size()
    for bd, rws, nw in [(512, 64, 4), (256, 128, 2), (512, 32, 4), (512, 128, 4), (256, 64, 2)]:
        cfg = {"BLOCK_D": bd, "ROWS": rws, "num_warps": nw}
        try:
            ms = bench(lambda cfg=cfg: causal_conv1d_fwd_rows(x, w, None, None, None, True, cfg))
            rows.append({"kernel": "fwd_rows", **cfg, "ms": ms, "GBps": nbytes / ms / 1e6})
        except Exception as exc:
            rows.append({"kernel": "fwd_rows", **cfg, "error": str(exc)[:200]})
    cfg = {"BLOCK_L": 16, "BLOCK_D": 256, "num_warps": 4}
    ms = bench(lambda: causal_conv1d_fwd_triton(x, w, None, None, None, True, cfg))
    rows.append({"kernel": "fwd_tile", **cfg, "ms": ms, "GBps": nbytes / ms / 1e6})
    dout = torch.randn_like(x)
    dx = torch.empty_like(x)
    for bd, rws, nw in [(512, 128, 4), (256, 256, 2), (128, 128, 1), (512, 64, 4),
                        (512, 256, 4)]:
        cfg = {"BLOCK_D": bd, "ROWS": rws, "num_warps": nw}
        try:
            ms = bench(lambda cfg=cfg: causal_conv1d_bwd_rows(
                x, w, None, dout, None, None, None, dx, True, False, cfg))
            rows.append({"kernel": "bwd_rows", **cfg, "ms": ms, "GBps": 1.5 * nbytes / ms / 1e6})
        except Exception as exc:
            rows.append({"kernel": "bwd_rows", **cfg, "error": str(exc)[:200]})
    cfg = {"BLOCK_L": 8, "BLOCK_D": 128, "num_warps": 4, "TARGET_PROGRAMS": 2048}
    ms = bench(lambda: causal_conv1d_bwd_triton(x, w, None, dout, None, None, None, dx, True,
                                                False, cfg))
    rows.append({"kernel": "bwd_tile", **cfg, "ms": ms, "GBps": 1.5 * nbytes / ms / 1e6})
    gen = torch.Generator(device="cuda").manual_seed(1)
    xu = torch.randn(UPDATE_B, D, 1, device="cuda", dtype=DT, generator=gen)
    su = torch.randn(UPDATE_B, D, W, device="cuda", dtype=DT, generator=gen)
    saved = (conv1d_update._STEP_BLOCK_D, conv1d_update._STEP_WARPS)
    for bd, nw in [(128, 1), (256, 2), (512, 4)]:
        conv1d_update._STEP_BLOCK_D, conv1d_update._STEP_WARPS = bd, nw
        try:
            us = 1000 * bench_graph(lambda: causal_conv1d_update_triton(
                xu, su, w, None, True, None, None))
            rows.append({"kernel": "update_step", "BLOCK_D": bd, "num_warps": nw,
                         "us_cuda_graph": us})
        except Exception as exc:
            rows.append({"kernel": "update_step", "BLOCK_D": bd, "error": str(exc)[:200]})
    conv1d_update._STEP_BLOCK_D, conv1d_update._STEP_WARPS = saved
    cfg = {"BLOCK_D": 256, "BLOCK_T": 1, "BLOCK_S": 4, "num_warps": 4}
    us = 1000 * bench_graph(lambda: causal_conv1d_update_triton(xu, su, w, None, True, None,
                                                                None, cfg))
    rows.append({"kernel": "update_general", **cfg, "us_cuda_graph": us})
    rows.extend(host_costs(xu, su, w, {}))
    return rows


def host_costs(xu, su, w, table) -> list[dict]:
    """Where the eager decode step's host time goes (perf_counter over many calls)."""

    def per_call_us(fn, n=3000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return 1e6 * (time.perf_counter() - t0) / n

    out = torch.empty_like(xu)
    res = [
        {"kernel": "host_face_update", "us": per_call_us(
            lambda: ours.causal_conv1d_update(xu, su, w, None, "silu"))},
        {"kernel": "host_update_impl", "us": per_call_us(
            lambda: update_impl(xu, su, w, None, True, None, None))},
        {"kernel": "host_empty_like", "us": per_call_us(lambda: torch.empty_like(xu))},
    ]
    # every implementation's eager update, host side, in the same process (peers included)
    for name, (_, upd) in table.items():
        res.append({"kernel": f"host_update_{name}", "us": per_call_us(lambda u=upd: u(xu, su, w))})
    res.extend(launch_layers(xu, su, w, out, per_call_us))
    return res


def launch_layers(xu, su, w, out, per_call_us) -> list[dict]:
    """The layers of one decode-step launch, each timed alone: our cache key, our cached
    launcher, Triton's kernel[grid](...), CompiledKernel[grid](...), and CompiledKernel.run(...)
    with the stream, function and metadata fetched once (the floor: Triton's C launcher). Our
    launcher is also checked to write exactly what Triton's ordinary launch writes."""
    from fastpath.kernels import compiled_launch as launch
    from fastpath.kernels.causal_conv1d import update as conv1d_update

    bd = conv1d_update._STEP_BLOCK_D
    grid = (triton.cdiv(D, bd), UPDATE_B, 1)
    args = (xu, su, w, w, out, xu, D, W, *xu.stride()[:2], *su.stride(), *out.stride()[:2],
            *w.stride())
    consts = (W, True, False, False, bd, 4)
    warps = conv1d_update._STEP_WARPS
    launcher = conv1d_update._STEP_LAUNCH
    launcher(grid, args, consts, warps)
    launcher(grid, args, consts, warps)
    rows = [
        {"kernel": "host_spec_key", "us": per_call_us(lambda: tuple(map(launch._spec, args)))},
        {"kernel": "host_cached_launcher", "us": per_call_us(
            lambda: launcher(grid, args, consts, warps))},
        {"kernel": "host_raw_stream", "us": per_call_us(
            lambda: torch._C._cuda_getCurrentRawStream(0))},
    ]
    kern = conv1d_update._causal_conv1d_update_step_kernel
    named = dict(zip(launcher.constexpr_names, consts, strict=True))

    def triton_launch():  # Triton's ordinary launch; it returns the CompiledKernel it ran
        return kern[grid](*args, **named, num_warps=warps)

    compiled = triton_launch()
    rows.append({"kernel": "host_plain_launch", "us": per_call_us(triton_launch)})
    rows.append({"kernel": "host_compiled_getitem", "us": per_call_us(
        lambda: compiled[grid](*args, *consts))})
    run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata
    stream = torch._C._cuda_getCurrentRawStream(0)
    rows.append({"kernel": "host_compiled_run_direct", "us": per_call_us(
        lambda: run(grid[0], grid[1], grid[2], stream, fn, meta, None, None, None, *args, *consts))})
    # our cached launcher writes exactly what Triton's ordinary launch writes
    s0 = su.clone()
    triton_launch()
    want_out, want_state = out.clone(), su.clone()
    su.copy_(s0)
    out.fill_(float("nan"))
    launcher(grid, args, consts, warps)
    torch.cuda.synchronize()
    rows.append({"kernel": "host_cached_launch_same_result",
                 "same": bool(torch.equal(out, want_out) and torch.equal(su, want_state))})
    return rows


def extra_checks() -> list[dict]:
    """Our kernels at the real D with seq_idx (padding) / initial + final states, vs float64."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(3)
    b, seqlen = 2, 1000
    for case in ("seq_idx+init", "init+final"):
        xmem = torch.randn(b, seqlen, D, device="cuda", dtype=DT, generator=gen)
        x = xmem.transpose(1, 2).requires_grad_()
        w = (torch.randn(D, W, device="cuda", generator=gen) * 0.5).to(DT).requires_grad_()
        bias = torch.randn(D, device="cuda", generator=gen).to(DT).requires_grad_()
        init = torch.randn(b, W - 1, D, device="cuda", generator=gen).to(DT).transpose(1, 2)
        init.requires_grad_()
        seq = None
        if case == "seq_idx+init":
            seq = torch.zeros(b, seqlen, dtype=torch.int32, device="cuda")
            seq[:, 300:] = 1
            seq[:, 777:] = 2
            seq[1, 950:] = -1
        final = case == "init+final"
        res = ours.causal_conv1d_fn(x, w, bias, seq, init, final, None, "silu")
        outs = list(res) if final else [res]
        leaves = [x, w, bias, init]
        rl = [t.detach().double().requires_grad_() for t in leaves]
        ref = causal_conv1d_ref(*rl, final, None, "silu", seq)
        routs = list(ref) if final else [ref]
        gins = [torch.randn_like(o) for o in outs]
        got = torch.autograd.grad(outs, leaves, gins)
        want = torch.autograd.grad(routs, rl, [g.double() for g in gins])
        row = {"check": case, "out_rel_err": max(rel_err(o, r) for o, r in zip(outs, routs, strict=True))}
        for name, g, r in zip(("dx", "dw", "db", "dinit"), got, want, strict=True):
            row[f"{name}_rel_err"] = rel_err(g, r)
        rows.append(row)
        print(json.dumps(row))
    return rows


# Targets of the small-shape work (H200, one process): ms / fraction of copy / us.
TARGETS = {"fwd_1x4096_ms": 0.045, "fwd_bwd_1x4096_ms": 0.35, "fwd_8x4096_x_copy": 0.92,
           "update_b64_eager_us": 8.0}


def targets(result: dict) -> dict:
    """fastpath's numbers against TARGETS (and Dao's where it ran): met / missed, never guessed."""
    rows = {(r["impl"], r["B"], r["L"]): r for r in result["fn"] if "error" not in r}
    upd = {r["impl"]: r for r in result["update"] if "error" not in r}
    copy = result["copy"].get("8x4096", {}).get("GBps")
    ours_small, ours_big = rows.get(("fastpath", 1, 4096)), rows.get(("fastpath", 8, 4096))
    got = {
        "fwd_1x4096_ms": ours_small and ours_small["fwd_ms"],
        "fwd_bwd_1x4096_ms": ours_small and ours_small["fwd_bwd_ms"],
        "fwd_8x4096_x_copy": ours_big and copy and ours_big["fwd_GBps"] / copy,
        "update_b64_eager_us": upd.get("fastpath", {}).get("us_do_bench"),
    }
    out = {}
    for key, goal in TARGETS.items():
        value = got[key]
        met = None if value is None else (value >= goal if key.endswith("x_copy") else value <= goal)
        out[key] = {"target": goal, "fastpath": value, "met": met}
    dao_small = rows.get(("dao", 1, 4096))
    if dao_small and ours_small:
        out["faster_than_dao_1x4096"] = {"fwd": ours_small["fwd_ms"] < dao_small["fwd_ms"],
                                         "fwd_bwd": ours_small["fwd_bwd_ms"] < dao_small["fwd_bwd_ms"]}
    return out


def env_info() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name, "sms": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def print_table(result: dict) -> None:
    print(f"\ncopy bandwidth: {result['copy']}")
    print(f"{'impl':10s} {'B':>3s} {'L':>6s} {'fwd ms':>8s} {'GB/s':>7s} {'xcopy':>6s} {'fwd+bwd':>8s} {'relerr':>8s}")
    for row in result["fn"]:
        if "error" in row:
            print(f"{row['impl']:10s} {row['B']:3d} {row['L']:6d} ERROR {row['error'][:80]}")
            continue
        copy = result["copy"].get(f"{row['B']}x{row['L']}", {}).get("GBps", float("nan"))
        print(f"{row['impl']:10s} {row['B']:3d} {row['L']:6d} {row['fwd_ms']:8.3f} "
              f"{row['fwd_GBps']:7.0f} {row['fwd_GBps'] / copy:6.2f} {row['fwd_bwd_ms']:8.3f} "
              f"{row['rel_err']:8.1e}")
    print(f"{'impl':10s} update us: do_bench / cuda-graph / rel_err")
    for row in result["update"]:
        if "error" in row:
            print(f"{row['impl']:10s} ERROR {row['error'][:80]}")
            continue
        print(f"{row['impl']:10s} {row['us_do_bench']:7.1f} {row['us_cuda_graph']:7.1f} "
              f"{row['rel_err']:8.1e} state_exact={row['state_exact']}")
    for row in result.get("sweep", []):
        if row["kernel"].startswith("host_"):
            print(f"{row['kernel']:26s} {row.get('us', float('nan')):7.1f} us/call (host, perf_counter) "
                  f"{'' if 'us' in row else row}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--sweep", action="store_true", help="also time tile configs of our kernels")
    ap.add_argument("--quick", action="store_true", help="only (8, 4096) and the update")
    ap.add_argument("--compile", action="store_true",
                    help="also time the torch fallback under torch.compile (adds compile minutes)")
    ap.add_argument("--host-costs", action="store_true",
                    help="also time the host side of the eager decode step")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("causal_conv1d benchmark: error: needs a CUDA device", file=sys.stderr)
        return 2
    fla, fla_why = load_fla()
    dao, dao_why = load_dao()
    result: dict = {"env": env_info(), "peers": {"fla": fla_why or "ok", "dao": dao_why or "ok"},
                    "D": D, "W": W, "dtype": "bfloat16", "layout": "channel-last (B, L, D) memory"}
    shapes = [(8, 4096)] if args.quick else SHAPES
    result["copy"] = {f"{b}x{seqlen}": copy_bandwidth(b, seqlen) for b, seqlen in shapes}
    table = impls(fla, dao, compiled=args.compile)
    result["fn"] = []
    ref_cache: dict = {}
    for b, seqlen in shapes:
        for name, (fwd, _) in table.items():
            result["fn"].append(measure_fn(name, fwd, b, seqlen, ref_cache))
            print(json.dumps(result["fn"][-1]), flush=True)
    ref_cache.clear()
    result["update"] = [measure_update(name, upd) for name, (_, upd) in table.items()]
    result["checks"] = extra_checks()
    if args.host_costs and not args.sweep:
        gen = torch.Generator(device="cuda").manual_seed(1)
        xu = torch.randn(UPDATE_B, D, 1, device="cuda", dtype=DT, generator=gen)
        su = torch.randn(UPDATE_B, D, W, device="cuda", dtype=DT, generator=gen)
        wu = torch.randn(D, W, device="cuda", generator=gen).to(DT)
        result["sweep"] = host_costs(xu, su, wu, table)
    if args.sweep:
        result["sweep"] = sweep()
        for row in result["sweep"]:
            print(json.dumps(row))
    result["targets"] = targets(result)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print_table(result)
    print(json.dumps(result["targets"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
