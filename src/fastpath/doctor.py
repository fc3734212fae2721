"""`fastpath doctor`: facts (probe) -> findings (rules) -> report, plus the model plan.

Verdict and exit code (documented choice):
- "unknown" when no GPU is visible (no nvidia-smi GPU, torch sees no CUDA): kernel paths are
  decided on the GPU host, so the doctor does not guess. Exit 0 unless an "error" finding that does
  not depend on the GPU fires (e.g. an extension's ABI mismatch), then 1.
- "slow" when a GPU is visible and an "error" finding fires or any model layer takes the torch
  fallback: exit 1.
- "fast" otherwise: exit 0. Bad usage / bad input (unknown preset, malformed config): exit 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpath.errors import FastpathError, UsageError

SCHEMA_VERSION = 1


@dataclass
class Diagnosis:
    verdict: str  # "fast" | "slow" | "unknown"
    headline: str
    findings: list[Any]  # list[fastpath.rules.Finding]
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
    from fastpath.model_source import load_config, model_label
    from fastpath.plan import plan_model

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
    from fastpath.rules import Context, evaluate

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


# ------------------------------------------------------------------------------ CLI


EXIT_CODES_HELP = (
    "exit status: 0 nothing blocks the fast path (verdict fast, or unknown: no GPU visible to "
    "judge); 1 slow path or a blocking finding; 2 bad usage or bad input."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("--model", metavar="X",
                        help="preset name, config.json path or local model dir: show its layer plan")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--on", metavar="PREFIX",
                        help="probe a remote target through an argv prefix, e.g. 'ssh h pct exec 200 --'")
    parser.add_argument("--python", metavar="PATH",
                        help="interpreter that runs the probe (on the target, or locally)")
    parser.add_argument("--hosts", metavar="FILE", help="probe every target of an inventory file")
    parser.add_argument("--limit", metavar="GROUP", help="only this inventory group (with --hosts)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel targets (with --hosts)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="per-target timeout")
    parser.add_argument("--probe", choices=("full", "static"), default=None,
                        help="full: also import torch, triton and each kernel package in "
                             "subprocesses (~3 CPU-s per target); static: read versions, archs "
                             "and an ELF link check from the files, import nothing (~0.2 CPU-s). "
                             "Default: full for one target, static for --hosts")


def probe_with_python(python: str, timeout: float | None, static: bool = False) -> dict[str, Any]:
    """Run probe.py under another local interpreter (a venv, a conda env) by stdin."""
    src = Path(__file__).with_name("probe.py").read_bytes()
    try:
        out = subprocess.run([python, "-", *(["--static"] if static else [])], input=src,
                             capture_output=True, timeout=timeout or 120)
    except FileNotFoundError:
        raise UsageError(f"--python {python}: no such interpreter") from None
    except subprocess.TimeoutExpired:
        raise FastpathError(f"probe under {python} timed out") from None
    try:
        facts = json.loads(out.stdout)
    except json.JSONDecodeError:
        tail = (out.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise FastpathError(f"probe under {python} failed (exit {out.returncode}): {tail}") from None
    if not isinstance(facts, dict):
        raise FastpathError(f"probe under {python} printed no facts object")
    return facts


def main(args: argparse.Namespace) -> int:
    if args.hosts:
        if args.on:
            raise UsageError("--hosts and --on are exclusive")
        from fastpath.fleet import run_fleet

        return run_fleet(args)
    if args.limit or args.jobs is not None:
        raise UsageError("--limit/--jobs need --hosts")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    static = getattr(args, "probe", None) == "static"
    if args.model:  # bad input fails before any probing
        from fastpath.model_source import load_config

        load_config(args.model)
    if args.on:
        from fastpath.remote import probe_remote

        kwargs = {"python": args.python, "static": static}
        if args.timeout is not None:
            kwargs["timeout"] = args.timeout
        facts = probe_remote(args.on, **kwargs)
    elif args.python:
        facts = probe_with_python(args.python, args.timeout, static)
    else:
        from fastpath.probe import collect

        facts = collect(skip=["imports"] if static else None)
    diagnosis = diagnose(facts, args.model)
    if args.json:
        sys.stdout.write(json.dumps(diagnosis.to_json(), indent=2, default=str) + "\n")
    else:
        from fastpath.report import print_report

        print_report(diagnosis)
    return diagnosis.exit_code
