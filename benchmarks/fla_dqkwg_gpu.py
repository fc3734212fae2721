"""GPU check of fastpath's chunk_bwd_dqkwg route for FLA #640 (run on the H200 by the lead).

    pip install --no-deps .carry/fla_core-0.6.0-py3-none-any.whl einops-*.whl  # fla needs einops
    python3 benchmarks/fla_dqkwg_gpu.py --out FILE

(a) Accuracy: FLA's chunk_gated_delta_rule forward + backward (bf16) with the route installed,
    against a float64 token-by-token recurrence (fastpath.kernels.gated_delta_rule.naive.gated_delta_rule_reference)
    at B=1, T=1024, H=16, HV=48, K=V=128, once per route mode: FASTPATH_FLA_DQKWG=auto (FLA's
    kernel where fastpath's per-configuration self-check passes; the self-check's verdict for
    this exact configuration is reported) and =torch (fastpath's PyTorch dqkwg). FLA's own Triton
    dqkwg with its guard bypassed by flags is measured too, as a contrast.
(b) Speed at B=1, T=4096, same heads: fwd+bwd of chunk_gated_delta_rule per route mode, the
    PyTorch op alone (and FLA's unguarded kernel alone), and the op's FLOP/byte floor.
Prints one JSON line and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from gdn_layer_profile import cuda_times  # same folder: sys.path[0]

from fastpath.kernels.gated_delta_rule.interface import (
    MATMUL_PATHS,
    chunk_bwd_dqkwg,
    floor_seconds,
)
from fastpath.kernels.gated_delta_rule.naive import gated_delta_rule_reference
from fastpath.routing import fla_backend

H, HV, K, V = 16, 48, 128, 128


def _inputs(T: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(1, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(r(1, T, H, K), dim=-1)
    v = r(1, T, HV, V)
    g = torch.nn.functional.logsigmoid(r(1, T, HV) + 3.0)     # decays near 1, like trained GDN
    beta = torch.rand(1, T, HV, device="cuda", generator=gen)
    return [x.to(torch.bfloat16) for x in (q, k, v, g, beta)]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def _fla_grads(fn, leaves, do):
    xs = [x.detach().clone().requires_grad_() for x in leaves]
    o, _ = fn(*xs)
    o.backward(do)
    return o.detach(), [x.grad for x in xs]


def _unguarded():
    """Context: FLA's own Triton dqkwg with its #640 guard flags pretending Triton >= 3.7.1."""
    import fla.ops.common.chunk_o as chunk_o

    class _Ctx:
        def __enter__(self):
            self.saved = chunk_o.TRITON_ABOVE_3_7_1
            chunk_o.TRITON_ABOVE_3_7_1 = True
            fla_backend.uninstall_dqkwg_route()

        def __exit__(self, *exc):
            chunk_o.TRITON_ABOVE_3_7_1 = self.saved
            fla_backend.install_dqkwg_route()

    return _Ctx()


def _calls() -> dict:
    return {k: fla_backend.ROUTE_CALLS[k] for k in ("dqkwg:fla", "dqkwg:torch")}


def accuracy(T: int) -> dict:
    """Per route mode (see the module docstring)."""
    out: dict = {}
    for mode in ("auto", "torch"):
        os.environ["FASTPATH_FLA_DQKWG"] = mode
        out[mode] = _accuracy(T)
    os.environ["FASTPATH_FLA_DQKWG"] = "auto"
    from fastpath.routing import fla_selfcheck

    out["selfcheck"] = fla_selfcheck.describe()
    return out


def _accuracy(T: int) -> dict:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    leaves = _inputs(T, seed=0)
    do = torch.randn(1, T, HV, V, device="cuda").to(torch.bfloat16)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ref = gated_delta_rule_reference(*ref_leaves)
    ref.backward(do.double())
    names = ["q", "k", "v", "g", "beta"]
    out: dict = {"shape": {"B": 1, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": "bf16"},
                 "reference": "float64 token recurrence (autograd)"}
    before = _calls()
    o, grads = _fla_grads(chunk_gated_delta_rule, leaves, do)
    out["route_calls"] = {k: v - before[k] for k, v in _calls().items()}
    out["fastpath_route"] = {"o": _rel(o, ref), **{
        "d" + n: _rel(gr, rl.grad) for n, gr, rl in zip(names, grads, ref_leaves, strict=True)}}
    try:
        with _unguarded():
            o2, grads2 = _fla_grads(chunk_gated_delta_rule, leaves, do)
        out["fla_triton_unguarded_CONTRAST_ONLY"] = {"o": _rel(o2, ref), **{
            "d" + n: _rel(gr, rl.grad) for n, gr, rl in zip(names, grads2, ref_leaves, strict=True)}}
    except Exception as exc:
        out["fla_triton_unguarded_CONTRAST_ONLY"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _time(fn, iters: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = sorted(cuda_times(fn, iters))
    return times[len(times) // 2] / 1e3


def speed(T: int) -> dict:
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg as fla_op
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    leaves = [x.requires_grad_() for x in _inputs(T, seed=1)]
    do = torch.randn(1, T, HV, V, device="cuda").to(torch.bfloat16)

    def fwd():
        with torch.no_grad():
            chunk_gated_delta_rule(*leaves)

    def fwd_bwd():
        o, _ = chunk_gated_delta_rule(*leaves)
        o.backward(do)

    out: dict = {"shape": {"B": 1, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": "bf16"}}
    out["fwd_s"] = _time(fwd)
    for mode in ("auto", "torch"):
        os.environ["FASTPATH_FLA_DQKWG"] = mode
        before = _calls()
        out[f"fwd_bwd_{mode}_s"] = _time(fwd_bwd)
        out[f"route_calls_{mode}"] = {k: v - before[k] for k, v in _calls().items()}
        out[f"tokens_per_s_fwd_bwd_{mode}"] = T / out[f"fwd_bwd_{mode}_s"]
    os.environ["FASTPATH_FLA_DQKWG"] = "auto"

    # The op alone, on inputs of the shapes FLA's backward passes it.
    BT, NT = 64, math.ceil(T / 64)
    bf = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(2)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    steps = torch.nn.functional.logsigmoid(r(1, T, HV) + 3.0) / math.log(2.0)
    g = torch.cat([steps[:, s:s + BT].cumsum(1) for s in range(0, T, BT)], 1)
    kw = dict(q=r(1, T, H, K).to(bf), k=r(1, T, H, K).to(bf), v=r(1, T, HV, V).to(bf),
              do=r(1, T, HV, V).to(bf), h=(r(1, NT, HV, K, V) * 0.1).to(bf),
              dh=(r(1, NT, HV, K, V) * 0.1).to(bf), w=r(1, T, HV, K).to(bf),
              dv=r(1, T, HV, V).to(bf), g=g, scale=K ** -0.5, chunk_size=BT)
    MATMUL_PATHS.clear()
    out["op_route_s"] = _time(lambda: chunk_bwd_dqkwg(**kw))
    # "widened" here means cuBLAS out_dtype=float32 was unavailable: slower, same results.
    out["op_matmul_paths"] = dict(MATMUL_PATHS)
    # The cuBLAS out_dtype paths vs the plain float32 path on the same values: rounding-level
    # differences (~1e-3) are expected, O(1) would mean a broken fast path.
    kw32 = {n: (x.float() if torch.is_tensor(x) and x.is_floating_point() else x)
            for n, x in kw.items()}
    out["op_bf16_vs_fp32_inputs_rel"] = {
        n: _rel(a, b) for n, a, b in zip(("dq", "dk", "dw", "dg"), chunk_bwd_dqkwg(**kw),
                                         chunk_bwd_dqkwg(**kw32), strict=True)}
    del kw32
    floor = floor_seconds(1, T, H, HV, K, V, BT)
    out["op_floor"] = floor
    out["op_route_vs_floor"] = out["op_route_s"] / floor["floor_s"]
    try:
        with _unguarded():
            out["op_fla_triton_unguarded_s"] = _time(lambda: fla_op(**kw))
            mine, theirs = chunk_bwd_dqkwg(**kw), fla_op(**kw)
        out["op_route_vs_fla_unguarded_rel"] = {
            n: _rel(a, b) for n, a, b in zip(("dq", "dk", "dw", "dg"), mine, theirs, strict=True)}
    except Exception as exc:
        out["op_fla_triton_unguarded_s"] = f"{type(exc).__name__}: {exc}"
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    chunk_bwd_dqkwg(**kw)
    torch.cuda.synchronize()
    out["op_route_extra_mem_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--acc-T", type=int, default=1024)
    ap.add_argument("--speed-T", type=int, default=4096)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fla_dqkwg_gpu: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception as exc:  # einops is fla-core's one requirement besides torch/triton
        print(f"fla_dqkwg_gpu: error: fla does not import ({type(exc).__name__}: {exc}); "
              "install fla-core 0.6.0 and einops (pip install --no-deps <wheels>)", file=sys.stderr)
        return 1

    cap = torch.cuda.get_device_capability()
    try:
        import importlib.util

        tilelang = importlib.util.find_spec("tilelang") is not None
    except Exception:
        tilelang = False
    result: dict = {
        "bench": "fla_dqkwg_gpu",
        "device": torch.cuda.get_device_name(), "capability": list(cap),
        "torch": torch.__version__, "triton": triton.__version__,
        "route_needed": fla_backend.dqkwg_route_needed(cap, triton.__version__, tilelang),
        "installed": fla_backend.install_dqkwg_route(),
    }
    if not result["installed"]:
        print("fla_dqkwg_gpu: error: fla does not import (pip install --no-deps fla-core einops)",
              file=sys.stderr)
        return 1
    for name, fn, arg in (("accuracy", accuracy, args.acc_T), ("speed", speed, args.speed_T)):
        try:
            result[name] = fn(arg)
        except Exception as exc:  # keep the other half's numbers
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        torch.cuda.empty_cache()
    line = json.dumps(result)
    print(line)
    Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
