"""`fastpath doctor` arguments and entry point: pick where the facts come from (here, another
interpreter, a remote prefix, a fleet), then hand them to `diagnosis.diagnose` and a renderer."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fastpath.doctor.diagnosis import diagnose
from fastpath.doctor.facts_check import check_json
from fastpath.doctor.remote import arrived, positive_int, positive_seconds, probe_with_python
from fastpath.shared.errors import FastpathError, UsageError
from fastpath.shared.redact import redact_facts

EXIT_CODES_HELP = (
    "exit status (the verdict decides it): 0 FAST: every op of every layer runs a fast kernel, as "
    "loaded and after fastpath.enable() (a Hub kernel only when already in the local cache), and "
    "nothing blocks; 1 SLOW: something is slow or blocks on the GPU here or assumed with --gpu; "
    "1 BLOCKED: no GPU here, but something blocks on any GPU (a missing kernel package, a CPU "
    "torch, a Hub kernel not in the cache); 2 bad usage or bad input; 3 could not diagnose: "
    "UNKNOWN (no GPU here, none assumed and nothing blocks; --gpu judges for one), or the target "
    "was unreachable, timed out, the probe failed or sent no facts. Fleets (--hosts): 1 if any target is slow or blocked, else 3 "
    "if any could not be diagnosed, else 0. --json prints exactly one JSON document on stdout "
    "(its verdict and exit_code are the headline's), also when the target could not be diagnosed."
)


def _arg(parse: Any) -> Any:
    """An argparse `type=` whose ValueError message becomes the one-line usage error (exit 2)."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES_HELP
    parser.add_argument("--model", metavar="X",
                        help="preset name, config.json path or local model dir: show its layer plan")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--gpu", metavar="SPEC",
                        help="judge this environment for a GPU that is not here: a compute "
                             "capability (sm_120, 12.0, sm_90a) or a product name (H100, H200, "
                             "A100, L40S, B200, GB200, 'RTX PRO 6000', 'RTX 5090', ...); e.g. in "
                             "a Dockerfile: RUN fastpath doctor --gpu sm_120 --model qwen3.5-27b")
    parser.add_argument("--on", metavar="PREFIX",
                        help="probe a remote target through an argv prefix, e.g. 'ssh h pct exec 200 --'")
    parser.add_argument("--python", metavar="PATH",
                        help="interpreter that runs the probe (on the target, or locally)")
    parser.add_argument("--hosts", metavar="FILE", help="probe every target of an inventory file")
    parser.add_argument("--limit", metavar="GROUP", help="only this inventory group (with --hosts)")
    parser.add_argument("--jobs", type=_arg(positive_int), default=None,
                        help="parallel targets (with --hosts)")
    parser.add_argument("--timeout", type=_arg(positive_seconds), default=None, metavar="SECONDS",
                        help="per-target timeout")
    parser.add_argument("--probe", choices=("full", "static"), default=None,
                        help="full: also import torch, triton and each kernel package in "
                             "subprocesses (~3 CPU-s per target); static: read versions, archs "
                             "and an ELF link check from the files, import nothing (~0.2 CPU-s). "
                             "Default: full for one target, static for --hosts")


def _check_usage(args: argparse.Namespace) -> Any:
    """Every usage error before anything is probed; returns the assumed GPU (or None)."""
    if args.hosts is not None and args.on is not None:
        raise UsageError("--hosts and --on are exclusive")
    if args.on is not None and not args.on.strip():
        raise UsageError("--on needs a command prefix, e.g. --on 'ssh HOST'")
    if args.hosts is None and (args.limit or args.jobs is not None):
        raise UsageError("--limit/--jobs need --hosts")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    if args.python is not None and not args.python.strip():
        raise UsageError("--python needs an interpreter path")
    from fastpath.doctor.probe import probe_timeout

    try:
        probe_timeout(os.environ.get("FASTPATH_PROBE_TIMEOUT"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    assumed = None
    if getattr(args, "gpu", None) is not None:
        from fastpath.doctor.gpu_models import parse_gpu_spec

        assumed = parse_gpu_spec(args.gpu)
    if args.model:  # bad input fails before any probing
        from fastpath.shared.model_source import load_config

        load_config(args.model)
    return assumed


def _facts(args: argparse.Namespace, static: bool) -> dict[str, Any]:
    if args.on:
        from fastpath.doctor.remote import probe_remote

        kwargs = {"python": args.python, "static": static}
        if args.timeout is not None:
            kwargs["timeout"] = args.timeout
        return probe_remote(args.on, **kwargs)
    if args.python:
        return probe_with_python(args.python, args.timeout, static)
    from fastpath.doctor.probe import collect

    return collect(skip=["imports"] if static else None)


def main(args: argparse.Namespace) -> int:
    try:
        assumed = _check_usage(args)
        if args.hosts:
            from fastpath.doctor.fleet import run_fleet

            args.assumed_gpu = assumed
            return run_fleet(args)
        static = getattr(args, "probe", None) == "static"
        # One pass for every source (local too): checked against the schema, secrets redacted.
        diagnosis = diagnose(arrived(_facts(args, static)), args.model, assumed)
    except FastpathError as exc:
        if args.json:  # stdout stays one JSON document; the one-line error goes to stderr
            from fastpath.doctor.diagnosis import failure_json

            target = args.on or args.python or args.hosts
            sys.stdout.write(json.dumps(failure_json(str(exc), exc.exit_code, target),
                                        indent=2) + "\n")
        raise
    if args.json:
        doc = redact_facts(check_json(diagnosis.to_json()))
        sys.stdout.write(json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
    else:
        from fastpath.doctor.report import print_report

        print_report(diagnosis)
    return diagnosis.exit_code
