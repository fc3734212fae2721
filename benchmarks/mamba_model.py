"""Mamba-2 model benchmark on one CUDA device: a 6-layer Nemotron-H-8B-shaped model (pattern
M-M*M-: hidden 4096, 128 heads x 64, state 128, 8 groups, chunk 128), bf16, B=1, L=4096, random
weights, transformers' NemotronH modeling code, in one process.

Configurations (each timed for prefill = forward without grad and forward+backward in train mode):
  fallback           transformers' torch paths (no mamba_ssm, no causal_conv1d)
  mamba_ssm+torch    mamba_ssm's Triton SSD (chunk scan + state update) from its source tree, torch conv
  mamba_ssm+fpconv   mamba_ssm's Triton SSD + fastpath's causal_conv1d (enable(mamba_ssm="off"))
  fastpath           fastpath.enable(): conv, chunk scan, fused split-conv scan and state update
mamba_ssm is loaded from --mamba-src (a checkout of state-spaces/mamba, or its mamba_ssm folder)
WITHOUT running its package root, which imports the compiled selective_scan_cuda extension; its
fused split-conv op needs causal_conv1d's CUDA module, so in the mamba_ssm rows it is left out
(the layer takes its unfused path, as transformers does when that op returns None).
Also the decode step at B=64 (transformers' call: stride-0 per-head dt/A/D/dt_bias, fp32 and
bf16 state): fastpath's selective_state_update vs mamba_ssm's, and logits/loss agreement of every
configuration with the fallback. Writes <out>/mamba_model.json.

usage: python benchmarks/mamba_model.py --out DIR [--mamba-src PATH] [--seq-len 4096] [--configs a,b]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

os.environ.setdefault("USE_HUB_KERNELS", "0")
CONFIGS = ("fallback", "mamba_ssm+torch", "mamba_ssm+fpconv", "fastpath")
SHAPE = dict(hidden_size=4096, num_hidden_layers=6, hybrid_override_pattern="M-M*M-", mamba_num_heads=128,
             mamba_head_dim=64, ssm_state_size=128, n_groups=8, chunk_size=128, conv_kernel=4,
             intermediate_size=21504, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             vocab_size=131072, use_mamba_kernels=True)


# ------------------------------------------------------------------ mamba_ssm from a source tree
def load_mamba_ssm(src: str) -> dict[str, Any]:
    """mamba_ssm's Triton ops without executing mamba_ssm/__init__.py."""
    root = Path(src)
    pkg = root / "mamba_ssm" if (root / "mamba_ssm").is_dir() else root
    if not (pkg / "ops" / "triton" / "ssd_combined.py").exists():
        raise SystemExit(f"--mamba-src {src}: no mamba_ssm/ops/triton/ssd_combined.py there")
    stub = ModuleType("mamba_ssm")
    stub.__path__ = [str(pkg)]  # type: ignore[attr-defined]
    stub.__version__ = "source"  # type: ignore[attr-defined]
    sys.modules["mamba_ssm"] = stub
    combined = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    update = importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    return {"mamba_chunk_scan_combined": combined.mamba_chunk_scan_combined,
            "selective_state_update": update.selective_state_update}


def _by_signature(fn: Any) -> Any:
    """What transformers' hub wrapper does: keep only the keyword arguments `fn` names."""
    names = set(inspect.signature(fn).parameters)

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v for k, v in kwargs.items() if k in names})

    return call


def use_mamba_ssm(ops: dict[str, Any]) -> list[tuple[Any, str, Any]]:
    """Point nemotron_h's SSD globals at mamba_ssm's ops (split-conv: None). Returns an undo list."""
    from fastpath.routing import ssd_route

    module = sys.modules["transformers.models.nemotron_h.modeling_nemotron_h"]
    undo = []
    for op, gname in ssd_route.op_globals(module).items():
        undo.append((module, gname, getattr(module, gname)))
        if op == "mamba_split_conv1d_scan_combined":
            setattr(module, gname, lambda *a, **k: None)
        else:
            setattr(module, gname, _by_signature(ops[op]))
    return undo


# ------------------------------------------------------------------ model
def build_model(seq_len: int) -> Any:
    from transformers import AutoModelForCausalLM, NemotronHConfig

    config = NemotronHConfig(**SHAPE, max_position_embeddings=max(4096, seq_len))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def timed(fn: Any, warmup: int, iters: int) -> float:
    """Median seconds per call (CUDA-synchronised wall time)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def model_steps(model: Any, ids: torch.Tensor) -> tuple[Any, Any]:
    """The two timed steps: prefill (forward without grad, returns logits) and train (forward +
    backward in train mode, returns the loss); also used by mamba1_model.py."""

    def prefill() -> Any:
        with torch.no_grad():
            return model(ids, use_cache=False).logits

    def train() -> float:
        model.train()
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        model.eval()
        return float(loss.detach())

    return prefill, train


def run_config(model: Any, ids: torch.Tensor, iters: int) -> dict[str, Any]:
    tokens = ids.numel()
    prefill, train = model_steps(model, ids)
    logits = prefill().float()
    loss = train()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None
             and ".mixer." in n and n.endswith(("in_proj.weight", "A_log", "dt_bias", "conv1d.weight"))}
    t_pre = timed(prefill, 1, iters)
    t_fb = timed(train, 1, iters)
    return {"prefill_s": t_pre, "prefill_tok_s": tokens / t_pre, "fwd_bwd_s": t_fb,
            "fwd_bwd_tok_s": tokens / t_fb, "_logits": logits, "_loss": loss, "_grads": grads}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(b.norm(), 1e-12))


# ------------------------------------------------------------------ decode step
def decode_case(state_dtype: torch.dtype, batch: int = 64, gated: bool = False) -> dict[str, torch.Tensor]:
    """Decode-step inputs at Nemotron-H's mixer shapes as transformers passes them: dt, A, D and
    dt_bias expanded from per-head values (stride 0); z too when `gated`."""
    H, P, N, G = 128, 64, 128, 8
    g = torch.Generator(device="cuda").manual_seed(1)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, device="cuda", generator=g)

    return {"state": r(batch, H, P, N).to(state_dtype), "x": r(batch, H, P).bfloat16(),
            "dt": r(batch, H, 1).bfloat16().expand(batch, H, P),
            "A": (-torch.rand(H, device="cuda", generator=g))[:, None, None].expand(H, P, N),
            "B": r(batch, G, N).bfloat16(), "C": r(batch, G, N).bfloat16(),
            "D": r(H)[:, None].expand(H, P), "dt_bias": r(H)[:, None].expand(H, P),
            "z": r(batch, H, P).bfloat16() if gated else None}


def bench_decode(fn: Any, case: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    from triton.testing import do_bench

    state = case["state"].clone()

    def call() -> Any:
        return fn(state, case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"], z=case["z"],
                  dt_bias=case["dt_bias"], dt_softplus=True)

    state0 = case["state"].clone()
    out = fn(state0, case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"], z=case["z"],
             dt_bias=case["dt_bias"], dt_softplus=True)
    ms = float(do_bench(call, warmup=25, rep=200, return_mode="median"))
    return ms * 1000.0, out.float()


def decode_rows(mamba_ops: dict[str, Any] | None) -> list[dict[str, Any]]:
    from fastpath.kernels.ssd.naive import selective_state_update_ref
    from fastpath.kernels.ssd.update import (
        selective_state_update,
        selective_state_update_triton,
    )

    rows = []
    for state_dtype in (torch.float32, torch.bfloat16):
        case = decode_case(state_dtype)
        ref_state = case["state"].double().clone()
        ref = selective_state_update_ref(ref_state, *(case[k].double() for k in ("x", "dt", "A", "B", "C")),
                                         D=case["D"].double(), dt_bias=case["dt_bias"].double(),
                                         dt_softplus=True).float()
        impls = {"fastpath": selective_state_update}
        if mamba_ops is not None:
            impls["mamba_ssm"] = mamba_ops["selective_state_update"]
        for name, fn in impls.items():
            us, out = bench_decode(fn, case)
            rows.append({"impl": name, "batch": 64, "state_dtype": str(state_dtype), "us": us,
                         "rel_err_vs_float64": rel(out, ref)})
        for block_p in (4, 8, 16, 32):  # tile sweep of our kernel (BLOCK_P rows x all of dstate)
            for warps in (2, 4, 8):
                def tuned(*a, _cfg=(block_p, 128, warps), **k):
                    return selective_state_update_triton(*a[:7], k.get("z"), k.get("dt_bias"),
                                                         k.get("dt_softplus", False), None, config=_cfg)
                us, out = bench_decode(tuned, case)
                rows.append({"impl": f"fastpath BLOCK_P={block_p} warps={warps}", "batch": 64,
                             "state_dtype": str(state_dtype), "us": us, "rel_err_vs_float64": rel(out, ref)})
    return rows


# ------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="output directory (mamba_model.json)")
    ap.add_argument("--mamba-src", default=None, help="state-spaces/mamba checkout (its mamba_ssm folder or root)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    wanted = [c for c in args.configs.split(",") if c]
    bad = [c for c in wanted if c not in CONFIGS]
    if bad:
        print(f"unknown config(s) {bad}; choose from {CONFIGS}", file=sys.stderr)
        return 2
    # mamba_ssm is loaded only after the fallback row: once its package is in sys.modules,
    # transformers' hub wrappers resolve "mamba_ssm" to it, and the fallback row would call
    # mamba_ssm's fused split-conv op (which needs causal_conv1d's CUDA module).
    mamba_ops: dict[str, Any] | None = None
    import transformers

    import fastpath

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "shape": {**SHAPE, "batch": 1, "seq_len": args.seq_len, "dtype": "bf16"},
        "versions": {"torch": torch.__version__, "triton": importlib.import_module("triton").__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
        "device": torch.cuda.get_device_name(), "mamba_src": args.mamba_src, "configs": {}, "errors": {},
    }
    model = build_model(args.seq_len)
    ids = torch.randint(3, SHAPE["vocab_size"], (1, args.seq_len), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(2))
    base: dict[str, Any] | None = None
    for name in wanted:
        if name.startswith("mamba_ssm") and mamba_ops is None and args.mamba_src:
            mamba_ops = load_mamba_ssm(args.mamba_src)
        if name.startswith("mamba_ssm") and mamba_ops is None:
            result["errors"][name] = "skipped: no --mamba-src"
            continue
        undo: list[tuple[Any, str, Any]] = []
        t0 = time.perf_counter()
        try:
            if name == "mamba_ssm+fpconv":
                fastpath.enable(warn=False, mamba_ssm="off")
            elif name == "fastpath":
                fastpath.enable(warn=False, mamba_ssm="fastpath")
            if name.startswith("mamba_ssm"):
                undo = use_mamba_ssm(mamba_ops)  # type: ignore[arg-type]
            row = run_config(model, ids, args.iters)
            row["explain"] = [f"{r['op']}: {r['impl']}" for r in fastpath.explain(model).rows[:5]]
        except Exception as exc:
            result["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
            continue
        finally:
            for module, gname, old in reversed(undo):
                setattr(module, gname, old)
            fastpath.disable()
        row["setup_and_run_s"] = time.perf_counter() - t0
        if base is None and name == "fallback":
            base = row
        if base is not None and base is not row:
            row["logits_rel_vs_fallback"] = rel(row["_logits"], base["_logits"])
            row["loss_abs_diff_vs_fallback"] = abs(row["_loss"] - base["_loss"])
            row["grad_rel_vs_fallback"] = max((rel(row["_grads"][k], g) for k, g in base["_grads"].items()
                                               if k in row["_grads"]), default=math.nan)
        result["configs"][name] = {k: v for k, v in row.items() if not k.startswith("_")}
        print(f"{name:18s} prefill {row['prefill_tok_s'] / 1e3:8.1f}k tok/s   fwd+bwd "
              f"{row['fwd_bwd_tok_s'] / 1e3:7.1f}k tok/s", flush=True)
    if mamba_ops is None and args.mamba_src:
        mamba_ops = load_mamba_ssm(args.mamba_src)
    try:
        result["decode_update"] = decode_rows(mamba_ops)
        for r in result["decode_update"]:
            print(f"decode B=64 {r['impl']:10s} state {r['state_dtype']:15s} {r['us']:8.1f} us  "
                  f"rel {r['rel_err_vs_float64']:.2e}", flush=True)
    except Exception as exc:
        result["errors"]["decode_update"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
    path = out_dir / "mamba_model.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}; errors: {list(result['errors']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
