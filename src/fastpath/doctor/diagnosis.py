"""Facts (from any host) -> findings (rules) + the model plan -> one verdict, headline and exit code.

Verdicts and exit codes (documented in `fastpath doctor --help` and the README):
- "fast": a GPU is here (or assumed with `--gpu`) and nothing blocks the fast path: exit 0.
- "slow": a GPU is here (or assumed) and an "error" finding fires or a model layer takes the torch
  fallback: exit 1.
- "unknown": no GPU here and none assumed. Package-level blockers that hold on any GPU (a missing
  kernel package, an extension built for no GPU torch supports, an ABI mismatch) are still
  "error" findings: exit 1 when one fires, else 0. The headline suggests `--gpu`.
- 2: bad usage or bad input. 3: could not diagnose (target unreachable, timed out, probe failed,
  no facts); `--json` still prints one document carrying the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastpath.errors import TargetError

SCHEMA_VERSION = 1
EXIT_FAST, EXIT_SLOW, EXIT_USAGE, EXIT_UNDIAGNOSED = 0, 1, 2, 3


@dataclass
class Diagnosis:
    verdict: str  # "fast" | "slow" | "unknown"
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
    from fastpath.model_source import load_config, model_label

    if model is None:
        return None
    if isinstance(model, dict):
        return plan_model(model, fv, str(model.get("model_type", "config")))
    config = load_config(model)
    return plan_model(config, fv, model_label(model, config))


def _suggest_gpu(fv: Any) -> str:
    return "judge for your GPU with --gpu (e.g. --gpu sm_120 or --gpu H100)"


def _headline(verdict: str, plan: dict[str, Any] | None, findings: list[Any], fv: Any) -> str:
    errors = [f for f in findings if f.severity == "error"]
    where = ""
    if fv.assumed is not None:
        a = fv.assumed
        where = f"on the assumed {a.name + ' (' + a.sm + ')' if a.name else a.sm} GPU (not detected here), "
    fallback = (fv.probe.get("python_fallback") if fv.probe.get("kind") == "sh" else None)
    tail = (f" [sh probe only: {fallback}; torch and package imports not checked]"
            if fallback else "")
    if plan is not None and plan.get("layers_slow"):
        slow_ops = sorted({r["op"] for t in plan["layer_types"] for r in t["ops"] if not r["fast"]})
        layers = f"{plan['layers_slow']} of {plan['layers_total']} layers of {plan['model']}"
        if verdict == "unknown":
            return (f"UNKNOWN: no GPU here; with these packages {layers} would take the torch "
                    f"fallback ({', '.join(slow_ops)}); {_suggest_gpu(fv)}{tail}")
        return f"SLOW: {where}{layers} take the torch fallback ({', '.join(slow_ops)}){tail}"
    if verdict == "unknown":
        if errors:
            return (f"UNKNOWN: no GPU here, but blocked on any GPU: {errors[0].title}; "
                    f"{_suggest_gpu(fv)}{tail}")
        return f"UNKNOWN: no GPU here, so no kernel path to judge; {_suggest_gpu(fv)}{tail}"
    if verdict == "slow":
        return f"SLOW: {where}{errors[0].title}{tail}" if errors else f"SLOW{tail}"
    if plan is not None:
        return (f"FAST: {where}all {plan['layers_total']} layers of {plan['model']} resolve to "
                f"fast kernels{tail}")
    return f"FAST: {where}nothing found that blocks the fast path{tail}"


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
    errors = [f for f in findings if f.severity == "error"]
    if not ctx.gpu_present:
        verdict = "unknown"
    elif errors or (plan is not None and plan.get("layers_slow")):
        verdict = "slow"
    else:
        verdict = "fast"
    exit_code = EXIT_SLOW if verdict == "slow" or errors else EXIT_FAST
    top = next((f for f in findings if f.severity == "error" and f.remedies), None) or next(
        (f for f in findings if f.remedies and f.severity == "warning"), None
    ) or next((f for f in findings if f.remedies), None)
    return Diagnosis(
        verdict=verdict, headline=_headline(verdict, plan, findings, ctx), findings=findings,
        facts=facts, model_plan=plan, exit_code=exit_code,
        top_remedy=top.remedies[0] if top else None, assumed_gpu=assumed,
    )
