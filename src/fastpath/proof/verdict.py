"""What `fastpath verify` concludes: the result document, the route checks, and the verdict
(PASS / SLOW / FAIL / NOT VERIFIED), drawn from models/judge.py's comparison.

PASS means both: the fast path computes the same function, and every op of it ran a fast kernel.
SLOW is its own verdict (exit 4): the numbers agree, but some op ran slow code (a torch fallback,
fastpath's torch reference, a Hub kernel that is not cached, FLA's route on CPU tensors); which
ops and why come from explain() over the fast path and the kernel-call counters.

Why NOT VERIFIED is its own verdict: on a CPU without the Triton interpreter (or with Triton
lacking a backend) fastpath's kernels hand every call to their torch reference, so both sides run
torch code and agree trivially. Only the kernel-call counters (kernels/counters.py, incremented at
each kernel entry point) say which implementation really executed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fastpath.models.compare import NOISE_SLACK, DecodeCheck, GradDiff, TensorDiff, Tolerance
from fastpath.shared.errors import FastpathError

CONV_OPS = ("fwd", "bwd", "update", "varlen_states")
PASS = "PASS"
FAIL = "FAIL"
NOT_VERIFIED = "NOT VERIFIED"
SLOW = "SLOW"
SLOW_LINE = "SLOW: the fast path computes the same function, but not every op ran a fast kernel"
NOT_VERIFIED_LINE = "NOT VERIFIED: the fast path ran the torch reference here"
NOT_VERIFIED_HINT = ("run on a CUDA GPU, or set TRITON_INTERPRET=1 to run the Triton kernels on CPU "
                     "(a correctness check only; its timings mean nothing)")
# Exit status per verdict (2 stays "bad input", from the CLI).
EXIT_CODES = {PASS: 0, FAIL: 1, NOT_VERIFIED: 3, SLOW: 4}


class CannotVerify(FastpathError):
    """The requested combination cannot be checked here (said before any work): NOT VERIFIED."""

    exit_code = EXIT_CODES[NOT_VERIFIED]


def kernel_impls(calls: dict[str, int]) -> dict[str, int]:
    """{"triton": n, "reference": m}: conv kernel calls by the implementation that executed."""
    out: dict[str, int] = {}
    for key, n in calls.items():
        op, _, impl = key.partition(":")
        if op in CONV_OPS:
            out[impl] = out.get(impl, 0) + n
    return out


def not_verified_reason(fast_calls: dict[str, int]) -> str | None:
    """Why the fast path's numbers prove nothing about the kernels, or None when they do.

    Verified means: every conv kernel call of the fast path executed a Triton kernel. Calls that
    fell to the torch reference (no GPU, no interpreter, no Triton backend) compare torch with
    torch. Zero calls is a routing failure, reported as a problem (FAIL) instead.
    """
    impls = kernel_impls(fast_calls)
    fell_back = sorted({k.split(":")[0] for k, n in fast_calls.items()
                        if n and k.endswith(":reference") and k.split(":")[0] in CONV_OPS})
    if not impls or not fell_back:
        return None
    return (f"{', '.join(fell_back)} ran fastpath's torch reference, not a Triton kernel "
            f"({impls.get('triton', 0)} Triton calls, {impls.get('reference', 0)} reference calls)")


def slow_ops(fast_calls: dict[str, int], explain_rows: list[dict[str, Any]]) -> list[str]:
    """Why the fast path was not all fast kernels, one line per op (empty: every op was).

    Two witnesses: explain() over the fast path's model (an op whose route is a torch fallback, a
    Hub kernel that must be downloaded, FLA's route on CPU tensors, ...) and the counters (a
    fastpath entry point that handed its call to its torch reference: complex A, a too-large
    state, no Triton backend)."""
    counts: dict[tuple[str, str], int] = {}
    for r in explain_rows:
        if "op" in r and not r.get("fast", True):
            key = (str(r["op"]), str(r.get("impl")))
            counts[key] = counts.get(key, 0) + 1
    lines = [f"{op}: {impl} ({n} layer{'s' if n != 1 else ''})" for (op, impl), n in counts.items()]
    fell = {k.partition(":")[0]: n for k, n in fast_calls.items() if n and k.endswith(":reference")}
    lines += [f"{op}: fastpath's torch reference ran {n} call{'s' if n != 1 else ''}"
              for op, n in sorted(fell.items())]
    return lines


@dataclass
class VerifyResult:
    model: dict[str, Any]
    dtype: str
    batch: int
    seq_len: int
    packed: bool
    segments: list[int]
    tolerance: Tolerance
    layers: list[TensorDiff]
    logits: TensorDiff
    grads: list[GradDiff] | None
    decode: DecodeCheck | None
    reference_calls: dict[str, int]
    fast_calls: dict[str, int]
    enable_report: str
    explain: list[dict[str, Any]]
    problems: list[str]
    reference_explain: list[dict[str, Any]] = field(default_factory=list)
    sizing: dict[str, Any] = field(default_factory=dict)

    @property
    def not_verified(self) -> str | None:
        """Why nothing was verified (the fast path ran torch code), or None."""
        return not_verified_reason(self.fast_calls)

    @property
    def slow(self) -> list[str]:
        """The fast path's ops that did not run a fast kernel (empty for PASS)."""
        return slow_ops(self.fast_calls, self.explain)

    @property
    def verdict(self) -> str:
        if self.problems:
            return FAIL
        if self.not_verified:
            return NOT_VERIFIED
        return SLOW if self.slow else PASS

    @property
    def matches(self) -> bool:
        """The numbers agree (PASS or SLOW): the fast path computes the same function."""
        return not self.problems

    @property
    def ok(self) -> bool:
        """PASS: the numbers agree *and* every op of the fast path ran a fast kernel."""
        return self.verdict == PASS

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def first_divergence(self) -> str | None:
        for diff in [*self.layers, self.logits]:
            if not diff.ok:
                return diff.name
        return None

    @property
    def conv_kernel_calls(self) -> int:
        return sum(n for key, n in self.fast_calls.items() if key.split(":")[0] in CONV_OPS)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["verdict"] = self.verdict
        data["not_verified"] = self.not_verified
        data["slow_ops"] = self.slow
        data["first_divergence"] = self.first_divergence
        data["conv_kernel_calls"] = self.conv_kernel_calls
        return data



def collect_problems(layers: list[TensorDiff], logits: TensorDiff, grads: list[GradDiff] | None,
                     decode: DecodeCheck | None, tol: Tolerance, *, fast_calls: dict[str, int],
                     ref_calls: dict[str, int], explain_rows: list[dict[str, Any]] | None) -> list[str]:
    """Every reason the comparison fails, one line each (empty: the numbers agree).

    explain_rows: the fast path's routes, given for packed inputs (packed_route_problems).
    """
    problems = [f"{d.name}: {', '.join(d.flags)}" for d in [*layers, logits] if d.flags]
    first = next((d for d in [*layers, logits] if not d.ok), None)
    if first is not None:
        problems.append(
            f"first diverging: {first.name}{f' ({first.kind})' if first.kind else ''}: relative error "
            f"{first.rel:.3g} (limit {tol.rel:g}), worst token {first.token_rel_max:.3g} (limit {tol.token_rel:g})"
        )
    bad = [g for g in grads or [] if not g.ok]
    if bad:
        worst = max(bad, key=lambda g: g.rel)
        oracle = ""
        if worst.fast_vs_fp32 is not None and worst.ref_vs_fp32 is not None:
            # which path is off: each one's distance to an fp32 run of the reference
            oracle = f" (vs fp32: fast {worst.fast_vs_fp32:.3g}, reference {worst.ref_vs_fp32:.3g})"
        if worst.noise is not None:
            oracle += f" (the reference's own rounding noise {worst.noise:.3g}, allowed {NOISE_SLACK:g}x)"
        problems.append(f"{len(bad)} of {len(grads or [])} parameter gradients differ; first {bad[0].name} "
                        f"({bad[0].rel:.3g}), worst {worst.name} ({worst.rel:.3g}){oracle}, "
                        f"limit {tol.grad_rel:g}")
    if decode is not None and not decode.ok:
        problems.append(f"decode: {decode.detail}")
    if not kernel_impls(fast_calls):
        problems.append("the fast path executed 0 conv kernel calls: enable() did not route this model, "
                        "so nothing was verified")
    if explain_rows is not None:
        problems += packed_route_problems(explain_rows)
    if kernel_impls(ref_calls):
        problems.append(f"the reference path ran fastpath kernels ({ref_calls}): disable() did not restore it")
    return problems


# Ops that must see cu_seqlens to keep packed sequences apart. transformers' torch fallbacks take
# no cu_seqlens: the 5.15+ wrapper filters it out by signature (<=5.17 silently; 5.21+ raises).
_PACKING_OPS = ("chunk_gated_delta_rule", "chunk_kda")


def packed_route_problems(explain_rows: list[dict[str, Any]]) -> list[str]:
    """Packed inputs through a torch gated-delta-rule fallback leak state across sequences.

    Why a route check and not only numbers: with random weights most heads decay within a few
    tokens, so the leak measured only 3e-6 .. 2e-5 relative on hidden states (fp32, tiny
    Qwen3.5): caught by the fp32 limit, lost in bf16 rounding, while the gradients of A_log /
    dt_bias were off by 10%. A trained model's slow-decaying heads leak far more.
    """
    slow = sorted({r["layer"] for r in explain_rows if r.get("op") in _PACKING_OPS and not r.get("fast", True)})
    if not slow:
        return []
    return [f"packed sequences: {len(slow)} layers run the gated delta rule on transformers' torch fallback, "
            f"which ignores cu_seqlens, so state leaks from one sequence into the next "
            f"(first: {slow[0]}; FLA on a GPU keeps them apart)"]
