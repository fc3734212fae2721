"""Facts (from any host) -> findings (rules) + the model plan -> one verdict, headline and exit code.

Verdict and exit code (documented choice):
- "unknown" when no GPU is visible (no nvidia-smi GPU, torch sees no CUDA): kernel paths are
  decided on the GPU host, so the doctor does not guess. Exit 0 unless an "error" finding that does
  not depend on the GPU fires (e.g. an extension's ABI mismatch), then 1.
- "slow" when a GPU is visible and an "error" finding fires or any model layer takes the torch
  fallback: exit 1.
- "fast" otherwise: exit 0. Bad usage / bad input (unknown preset, malformed config): exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastpath.errors import FastpathError

SCHEMA_VERSION = 1


@dataclass
class Diagnosis:
    verdict: str  # "fast" | "slow" | "unknown"
    headline: str
    findings: list[Any]  # list[fastpath.doctor.rules.Finding]
    facts: dict[str, Any]
    model_plan: dict[str, Any] | None = None
    exit_code: int = 0
    top_remedy: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "headline": self.headline,
            "top_remedy": self.top_remedy,
            "exit_code": self.exit_code,
            "findings": [f.to_dict() for f in self.findings],
            "facts": self.facts,
            "model": self.model_plan,
        }


def _plan(model: str | dict[str, Any] | None, facts: dict[str, Any]) -> dict[str, Any] | None:
    from fastpath.doctor.plan import plan_model
    from fastpath.model_source import load_config, model_label

    if model is None:
        return None
    if isinstance(model, dict):
        return plan_model(model, facts, str(model.get("model_type", "config")))
    config = load_config(model)
    return plan_model(config, facts, model_label(model, config))


def _headline(verdict: str, plan: dict[str, Any] | None, findings: list[Any]) -> str:
    errors = [f for f in findings if f.severity == "error"]
    if plan is not None and plan.get("layers_slow"):
        slow_ops = sorted({r["op"] for t in plan["layer_types"] for r in t["ops"] if not r["fast"]})
        layers = f"{plan['layers_slow']} of {plan['layers_total']} layers of {plan['model']}"
        if verdict == "unknown":
            return (f"UNKNOWN: no GPU visible here; with these packages {layers} would take the "
                    f"torch fallback ({', '.join(slow_ops)})")
        return f"SLOW: {layers} take the torch fallback ({', '.join(slow_ops)})"
    if verdict == "unknown":
        return "UNKNOWN: no GPU visible here, so no kernel path to judge (toolchain report only)"
    if verdict == "slow":
        return f"SLOW: {errors[0].title}" if errors else "SLOW"
    if plan is not None:
        return (f"FAST: all {plan['layers_total']} layers of {plan['model']} resolve to fast "
                f"kernels")
    return "FAST: nothing found that blocks the fast path"


def diagnose(facts: dict[str, Any], model: str | dict[str, Any] | None = None) -> Diagnosis:
    """Apply the rules (and the model plan) to a facts dict from any host."""
    from fastpath.doctor.rules import Context, evaluate

    if not isinstance(facts, dict):
        raise FastpathError("facts must be a JSON object from the probe")
    plan = _plan(model, facts)
    findings = evaluate(facts, plan)
    ctx = Context(facts, plan)
    errors = [f for f in findings if f.severity == "error"]
    if not ctx.gpu_present:
        verdict = "unknown"
    elif errors or (plan is not None and plan.get("layers_slow")):
        verdict = "slow"
    else:
        verdict = "fast"
    exit_code = 1 if verdict == "slow" or errors else 0
    top = next((f for f in findings if f.severity == "error" and f.remedies), None) or next(
        (f for f in findings if f.remedies and f.severity == "warning"), None
    ) or next((f for f in findings if f.remedies), None)
    return Diagnosis(
        verdict=verdict, headline=_headline(verdict, plan, findings), findings=findings,
        facts=facts, model_plan=plan, exit_code=exit_code,
        top_remedy=top.remedies[0] if top else None,
    )
