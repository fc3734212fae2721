"""Mamba-1 family model benchmark on one CUDA device: Falcon-Mamba-7B and Jamba shaped
models cut to a few layers, random weights, bf16, B=1, L=4096, transformers' own modeling code.

Configurations (each timed for prefill = forward without grad, and forward+backward in train mode;
the same weights and inputs for all, one process):
  loop              transformers' torch fallback as shipped: a Python loop over the sequence
  associative_scan  the same with `use_associative_scan` on each mixer (torch >= 2.9's HOP)
  mambapy           the same with `use_mambapy` on each mixer (mambapy's pscan; needs mambapy)
  fastpath          fastpath's enable(): selective scan, mamba_inner_fn, state update, conv
Every configuration's logits and loss are compared with the loop's, and the JSON is rewritten after
each configuration, so a run cut by its limit keeps what it measured. A configuration whose first
(warm-up) step takes longer than --time-cap is timed once and marked so.

usage: python benchmarks/mamba1_model.py --out DIR [--models falcon-mamba-7b:4,jamba-mini-1.7:4]
       [--configs loop,associative_scan,mambapy,fastpath] [--seq-len 4096] [--iters 3]
On a CPU (--device cpu, tiny --seq-len) it only smoke-tests the script: no timing data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mamba_model import model_steps, rel

os.environ.setdefault("USE_HUB_KERNELS", "0")
CONFIGS = ("loop", "associative_scan", "mambapy", "fastpath")
FLAGS = {"loop": {}, "associative_scan": {"use_associative_scan": True}, "mambapy": {"use_mambapy": True},
         "fastpath": {}}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def set_mixer_flags(model: Any, flags: dict[str, bool]) -> int:
    """Set transformers' per-mixer fallback switches; returns how many mixers took them."""
    count = 0
    for module in model.modules():
        if hasattr(module, "use_mambapy") and hasattr(module, "use_associative_scan"):
            module.use_mambapy = flags.get("use_mambapy", False)
            module.use_associative_scan = flags.get("use_associative_scan", False)
            count += 1
    return count


def unavailable(config: str) -> str | None:
    if config == "mambapy":
        try:
            import mambapy.pscan  # noqa: F401
        except ImportError:
            return "mambapy is not importable"
    if config == "associative_scan":
        try:
            from torch._higher_order_ops.associative_scan import associative_scan  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no associative_scan"
    return None


def measure(model: Any, ids: torch.Tensor, iters: int, time_cap: float, device: torch.device) -> dict[str, Any]:
    tokens = ids.numel()
    prefill, train = model_steps(model, ids)
    row: dict[str, Any] = {}
    for name, fn in (("prefill", prefill), ("train", train)):
        sync(device)
        t0 = time.perf_counter()
        value = fn()
        sync(device)
        first = time.perf_counter() - t0
        times = [first]
        if first < time_cap:
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                sync(device)
                times.append(time.perf_counter() - t0)
        else:
            row[f"{name}_note"] = f"first step {first:.1f} s > time cap {time_cap:.0f} s: timed once"
        seconds = sorted(times)[len(times) // 2]
        row[f"{name}_s"] = seconds
        row[f"{name}_tok_s"] = tokens / seconds
        row[f"_{name}"] = value
    return row


def run_model(source: str, layers: int, args: argparse.Namespace, doc: dict[str, Any], save: Any) -> None:
    from fastpath.models.build import build_model
    from fastpath.routing import engine as routes

    device = torch.device(args.device)
    routes.disable()
    built = build_model(source, layers=layers, dtype=args.dtype, device=args.device, seed=0)
    model = built.model
    entry: dict[str, Any] = {"model": built.to_json(), "configs": {}}
    doc["models"][f"{source}:{layers}"] = entry
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, built.vocab_size, (args.batch, args.seq_len), generator=gen).to(device)
    base: dict[str, Any] | None = None
    for config in args.configs:
        why = unavailable(config)
        if why:
            entry["configs"][config] = {"skipped": why}
            save()
            continue
        try:
            if config == "fastpath":
                entry["enable_report"] = str(routes.enable(warn=False))
                set_mixer_flags(model, {})
                entry["explain"] = [dict(r) for r in routes.explain(model).rows]
            else:
                routes.disable()
                entry.setdefault("mixers", set_mixer_flags(model, FLAGS[config]))
            row = measure(model, ids, args.iters, args.time_cap, device)
        except Exception as exc:  # a configuration that fails is a finding, not the end of the run
            entry["configs"][config] = {"error": f"{type(exc).__name__}: {exc}",
                                        "trace": traceback.format_exc(limit=4)}
            save()
            continue
        finally:
            routes.disable()
        logits, loss = row.pop("_prefill"), row.pop("_train")
        if base is None:
            base = {"config": config, "logits": logits.float(), "loss": loss}
        else:
            row["logits_rel_vs"] = {base["config"]: rel(logits.float(), base["logits"])}
            row["loss_vs"] = {base["config"]: [loss, base["loss"]]}
        row["loss"] = loss
        entry["configs"][config] = row
        print(json.dumps({"model": source, "config": config,
                          **{k: v for k, v in row.items() if not k.startswith("_")}}), flush=True)
        save()
    fast = entry["configs"].get("fastpath", {})
    best = {}
    for phase in ("prefill", "train"):
        torch_rows = {c: r[f"{phase}_tok_s"] for c, r in entry["configs"].items()
                      if c != "fastpath" and f"{phase}_tok_s" in r}
        if torch_rows and f"{phase}_tok_s" in fast:
            name = max(torch_rows, key=torch_rows.get)
            best[phase] = {"best_torch": name, "speedup": fast[f"{phase}_tok_s"] / torch_rows[name]}
    entry["fastpath_vs_best_torch"] = best
    save()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (mamba1_model.json)")
    ap.add_argument("--models", default="falcon-mamba-7b:4,jamba-mini-1.7:4",
                    help="comma list of preset:layers")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--time-cap", type=float, default=20.0, help="seconds; a slower first step is timed once")
    args = ap.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configs {bad}; use {', '.join(CONFIGS)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA device (use --device cpu with a tiny --seq-len to smoke-test)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers
    import triton

    doc: dict[str, Any] = {
        "timing_data": args.device.startswith("cuda"),
        "environment": {"torch": torch.__version__, "triton": triton.__version__,
                        "transformers": transformers.__version__, "python": platform.python_version(),
                        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "models": {},
    }

    def save() -> None:
        (out / "mamba1_model.json").write_text(json.dumps(doc, indent=1, default=str))

    for spec in args.models.split(","):
        source, _, layers = spec.strip().partition(":")
        try:
            run_model(source, int(layers or 4), args, doc, save)
        except Exception as exc:
            doc["models"][spec] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=6)}
            save()
            print(f"{spec}: {type(exc).__name__}: {exc}", file=sys.stderr)
    save()
    for key, entry in doc["models"].items():
        print(key, json.dumps(entry.get("fastpath_vs_best_torch", entry.get("error"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
