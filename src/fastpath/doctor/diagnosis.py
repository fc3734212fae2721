"""Facts (from any host) -> findings (rules) + the model plan -> one verdict, headline and exit code.

`decide_verdict` is the one function that decides the verdict; the headline, the `--json`
verdict and the exit code are all read from what it returns (VERDICT_EXIT maps one to the other).
Verdicts and exit codes (documented in `fastpath doctor --help` and the README):
- "fast" (0): a GPU is here (or assumed with `--gpu`), no finding blocks, and every op of every
  layer of the model runs a fast kernel both as transformers loads it and after fastpath.enable().
  A Hub kernel counts as fast only when its build is already in the local cache.
- "slow" (1): a GPU is here (or assumed) and an "error" finding fires, or a layer's op is slow
  (torch fallback, a Hub kernel still to download, an op that raises) as loaded or after enable().
- "blocked" (1): no GPU here and none assumed, but something blocks the fast path on any GPU (a
  missing kernel package, a CPU build of torch, an ABI mismatch, a Hub kernel not in the cache).
- "unknown" (3): no GPU here, none assumed, and nothing found that blocks on any GPU: there is no
  kernel path to judge (`--gpu` judges for one).
- 2: bad usage or bad input. 3 also: could not diagnose (target unreachable, timed out, probe
  failed, no facts); `--json` then prints one document with the verdict "error".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastpath.shared.errors import TargetError

SCHEMA_VERSION = 1
EXIT_FAST, EXIT_SLOW, EXIT_USAGE, EXIT_UNDIAGNOSED = 0, 1, 2, 3
VERDICT_EXIT = {"fast": EXIT_FAST, "slow": EXIT_SLOW, "blocked": EXIT_SLOW,
                "unknown": EXIT_UNDIAGNOSED}


@dataclass
class Diagnosis:
    verdict: str  # "fast" | "slow" | "blocked" | "unknown" (decide_verdict)
    headline: str
    findings: list[Any]  # list[fastpath.doctor.rules.Finding]
    facts: dict[str, Any]
    model_plan: dict[str, Any] | None = None
    exit_code: int = 0
    top_remedy: str | None = None
    assumed_gpu: Any = None  # fastpath.doctor.gpu_models.AssumedGpu | None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "headline": self.headline,
            "top_remedy": self.top_remedy,
            "exit_code": self.exit_code,
            "error": None,
            "assumed_gpu": self.assumed_gpu.to_json() if self.assumed_gpu else None,
            "findings": [f.to_dict() for f in self.findings],
            "facts": self.facts,
            "model": self.model_plan,
        }


def failure_json(error: str, exit_code: int, target: str | None = None) -> dict[str, Any]:
    """The one JSON document of a run that could not diagnose (same keys as a diagnosis)."""
    return {"schema_version": SCHEMA_VERSION, "verdict": "error", "headline": f"ERROR: {error}",
            "top_remedy": None, "exit_code": exit_code, "error": error, "target": target,
            "assumed_gpu": None, "findings": [], "facts": None, "model": None}


def _plan(model: str | dict[str, Any] | None, fv: Any) -> dict[str, Any] | None:
    from fastpath.doctor.plan import plan_model
    from fastpath.shared.model_source import load_config, model_label

    if model is None:
        return None
    if isinstance(model, dict):
        return plan_model(model, fv, str(model.get("model_type", "config")))
    config = load_config(model)
    return plan_model(config, fv, model_label(model, config))


SUGGEST_GPU = "judge for your GPU with --gpu (e.g. --gpu sm_120 or --gpu H100)"


@dataclass(frozen=True)
class Verdict:
    name: str  # a VERDICT_EXIT key
    exit_code: int
    headline: str


def _rows(plan: dict[str, Any] | None) -> list[tuple[int, dict[str, Any]]]:
    return [(t["count"], r) for t in (plan or {}).get("layer_types") or [] for r in t["ops"]]


def _layers(plan: dict[str, Any], slow: Any) -> int:
    """How many layers have an op for which `slow(row)` holds."""
    return sum(t["count"] for t in plan.get("layer_types") or [] if any(slow(r) for r in t["ops"]))


def _what_is_slow(rows: list[dict[str, Any]]) -> str:
    """The slow ops as loaded, grouped by why: 'take the torch fallback (a, b); load Hub kernels
    that are not in the local cache (kernels-community/fla: ...); call c, which raises ...'."""
    fallback = sorted({r["op"] for r in rows if r["impl"] not in ("hub-kernel", "raises-when-called")})
    hub = sorted({(r.get("hub") or {}).get("repo", r["op"]) for r in rows if r["impl"] == "hub-kernel"})
    raises = sorted({r["op"] for r in rows if r["impl"] == "raises-when-called"})
    parts = []
    if fallback:
        parts.append(f"take the torch fallback ({', '.join(fallback)})")
    if hub:
        offline = any((r.get("hub") or {}).get("state") == "offline-missing" for r in rows)
        parts.append(f"load Hub kernels that are not in the local cache ({', '.join(hub)}: "
                     + ("HF_HUB_OFFLINE=1, so from_pretrained raises ValueError)" if offline else
                        "downloaded at from_pretrained; offline it raises)"))
    if raises:
        parts.append(f"call {', '.join(raises)}, which raise{'s' if len(raises) == 1 else ''} "
                     "when called")
    return "; ".join(parts)


def _needs(rows: list[dict[str, Any]]) -> str:
    return "; ".join(sorted({str(r["with_fastpath_needs"]) for r in rows
                             if r.get("with_fastpath_needs")}))


def _plan_headline(plan: dict[str, Any], where: str, gpu: bool) -> str | None:
    """What the model plan says is slow, and what fixes it, or None when every op is fast both as
    loaded and after fastpath.enable() (for `gpu` False: ignoring what only a GPU would decide)."""
    rows = [r for _, r in _rows(plan)]
    now = [r for r in rows if not r["fast"] and (gpu or not r.get("device_bound"))]
    after = [r for r in rows if not r.get("with_fastpath_fast", True)
             and (gpu or not r.get("with_fastpath_device_bound"))]
    if not now and not after:
        return None
    total, model = plan["layers_total"], plan["model"]
    keys_now = {id(r) for r in now}
    keys_after = {id(r) for r in after}
    n_now = _layers(plan, lambda r: id(r) in keys_now)
    n_after = _layers(plan, lambda r: id(r) in keys_after)
    if now:
        head = f"{where}{n_now} of {total} layers of {model} {_what_is_slow(now)}"
        if not after:
            return head + "; fastpath.enable() puts all of them on fast kernels"
        return (head + f"; after fastpath.enable() {n_after} still slow ({_needs(after)})")
    return (f"{where}with fastpath.enable(), {n_after} of {total} layers of {model} would be slow "
            f"({_needs(after)}); loaded without it they are fast")


def decide_verdict(ctx: Any, plan: dict[str, Any] | None, findings: list[Any]) -> Verdict:
    """THE verdict of a diagnosis: its name, exit code (VERDICT_EXIT) and headline, from the facts
    view (a GPU here or assumed?), the model plan (per op, as loaded and after enable()) and the
    findings (an "error" blocks). The report, `--json` and the exit status all read this."""
    errors = [f for f in findings if f.severity == "error"]
    where = ""
    if ctx.assumed is not None:
        a = ctx.assumed
        where = f"on the assumed {a.name + ' (' + a.sm + ')' if a.name else a.sm} GPU (not detected here), "
    fallback = (ctx.probe.get("python_fallback") if ctx.probe.get("kind") == "sh" else None)
    tail = (f" [sh probe only: {fallback}; torch and package imports not checked]"
            if fallback else "")
    gpu = ctx.gpu_present
    slow_plan = _plan_headline(plan, where if gpu else "", gpu) if plan is not None else None

    def verdict(name: str, text: str) -> Verdict:
        return Verdict(name, VERDICT_EXIT[name], f"{name.upper()}: {text}{tail}")

    if gpu:
        if slow_plan is not None:
            return verdict("slow", slow_plan)
        if errors:
            return verdict("slow", f"{where}{errors[0].title}")
        if plan is not None:
            return verdict("fast", f"{where}all {plan['layers_total']} layers of {plan['model']} "
                                   "resolve to fast kernels, as loaded and after fastpath.enable()")
        return verdict("fast", f"{where}nothing found that blocks the fast path")
    if slow_plan is not None:
        return verdict("blocked", f"on any GPU (none here): {slow_plan}; {SUGGEST_GPU}")
    if errors:
        return verdict("blocked", f"on any GPU (none here): {errors[0].title}; {SUGGEST_GPU}")
    return verdict("unknown", "no GPU here and none assumed, so no kernel path to judge (nothing "
                              f"found that blocks on any GPU; exit status 3); {SUGGEST_GPU}")


def diagnose(facts: dict[str, Any], model: str | dict[str, Any] | None = None,
             assumed: Any = None) -> Diagnosis:
    """Apply the rules (and the model plan) to a facts dict from any host, judged for the GPU
    there or for `assumed` (a `gpu_models.AssumedGpu` from `--gpu`)."""
    from fastpath.doctor.rules import Context, evaluate

    if not isinstance(facts, dict) or not facts:
        raise TargetError("no facts: the probe printed no facts object")
    ctx = Context(facts, None, assumed)
    plan = _plan(model, ctx)
    ctx.plan = plan
    findings = evaluate(ctx)
    decided = decide_verdict(ctx, plan, findings)
    top = next((f for f in findings if f.severity == "error" and f.remedies), None) or next(
        (f for f in findings if f.remedies and f.severity == "warning"), None
    ) or next((f for f in findings if f.remedies), None)
    return Diagnosis(
        verdict=decided.name, headline=decided.headline, findings=findings,
        facts=facts, model_plan=plan, exit_code=decided.exit_code,
        top_remedy=top.remedies[0] if top else None, assumed_gpu=assumed,
    )
