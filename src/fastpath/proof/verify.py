"""`fastpath verify MODEL`: prove that the fast path computes the same function as the reference.

One process, one set of weights, one set of inputs: the model runs once with `fastpath.disable()`
(transformers' own path) and once with `fastpath.enable()`; every layer's output hidden states,
the logits, optionally every parameter gradient, and a greedy cached decode are compared with
tolerances chosen per dtype. Why every layer: drafters have been trained on hidden states that
were silently all zero, and a fallback once drifted by 0.125 in the logits. Only a comparison at
every layer says *where* a kernel goes wrong, and a flag on zero / constant / non-finite states
catches outputs that are wrong on both paths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fastpath.errors import FastpathError, UsageError, first_line


@dataclass(frozen=True)
class Tolerance:
    """Pass limits for one dtype.

    rel: ||fast - ref|| / ||ref|| over a whole layer output (or the logits).
    token_rel: the same ratio for the worst single token; looser, because one token's norm is
        a small sample, but it catches an error confined to a few positions (the first token,
        a packed-sequence boundary) that the whole-tensor ratio would average away.
    grad_rel: per-parameter gradient ratio; gradients pass through every layer twice.
    """

    rel: float
    token_rel: float
    grad_rel: float


# Calibration (CPU, torch 2.13, Triton 3.9 interpreter, tiny Qwen3.5 / LFM2 / Mamba2 models,
# 2-4 layers; see tests/test_verify.py): correct kernels measured fp32 <= 4e-7 on hidden states
# and logits (worst token <= 5e-7), <= 3e-5 on gradients (A_log, a sum over every token); a
# packed batch whose gated delta rule leaked state across sequences measured 2e-5 (token 1e-4),
# so the fp32 limits sit between the two. fp32 means fp32: verify turns TF32 off on CUDA
# (cuDNN's default would put the reference's F.conv1d at ~1e-3). The kernel and torch's conv accumulate in different orders, so
# in bf16 (unit roundoff 2^-8 = 3.9e-3) every layer's output differs by a rounding step and
# the difference is carried through the residual stream: ~1e-2 after a few layers. fp16 has
# 3 more mantissa bits (2^-11 = 4.9e-4). A kernel that drops the conv bias or shifts by one
# step measures 1e-1 .. 1 (tests), far outside every limit below.
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(rel=1e-5, token_rel=5e-5, grad_rel=1e-3),
    "fp16": Tolerance(rel=1e-2, token_rel=4e-2, grad_rel=4e-2),
    "bf16": Tolerance(rel=4e-2, token_rel=1e-1, grad_rel=1e-1),
}

CONV_OPS = ("fwd", "bwd", "update", "varlen_states")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class TensorDiff:
    """How far the fast path's tensor is from the reference's, and what looks wrong in either."""

    name: str
    rel: float
    token_rel_max: float
    token_rel_mean: float
    ok: bool
    flags: list[str] = field(default_factory=list)
    kind: str = ""  # layer type ("linear_attention", "conv", ...) for decoder layers


@dataclass
class GradDiff:
    """One parameter's gradient. In bf16/fp16, `fast_vs_fp32` / `ref_vs_fp32` are each path's
    relative distance to an fp32 run of the reference (None in fp32)."""

    name: str
    rel: float
    ok: bool
    fast_vs_fp32: float | None = None
    ref_vs_fp32: float | None = None


@dataclass
class DecodeCheck:
    steps: int
    identical_steps: int  # leading steps where every row chose the same token on both paths
    logits_rel_max: float  # worst per-step logits ratio over the compared steps
    near_tie_step: int | None  # step where tokens split while logits stayed within tolerance
    ok: bool
    detail: str


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

    @property
    def ok(self) -> bool:
        return not self.problems

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
        data["first_divergence"] = self.first_divergence
        data["conv_kernel_calls"] = self.conv_kernel_calls
        return data


# ---------------------------------------------------------------------------------------------
# Comparing tensors


def tensor_flags(tensor: Any) -> list[str]:
    """What is wrong with a hidden state regardless of any reference: the drafter-killers."""
    import torch

    t = tensor.detach()
    if not bool(torch.isfinite(t).all()):
        return ["non-finite"]
    if not bool(t.any()):
        return ["all-zero"]
    if bool(t.max() == t.min()):
        return ["constant"]
    if t.dim() >= 3 and t.shape[-2] > 1 and bool((t == t[..., :1, :]).all()):
        return ["same at every position"]
    return []


def compare(name: str, fast: Any, ref: Any, tol: Tolerance) -> TensorDiff:
    """Relative error of `fast` against `ref` (both [..., T, H]); flags from both."""
    import torch

    a = fast.detach().float()
    b = ref.detach().float()
    if a.shape != b.shape:
        return TensorDiff(name, float("inf"), float("inf"), float("inf"), False,
                          [f"shape {tuple(a.shape)} != reference {tuple(b.shape)}"])
    flags = [f"fast: {f}" for f in tensor_flags(fast)] + [f"reference: {f}" for f in tensor_flags(ref)]
    diff = a - b
    ref_norm = float(torch.linalg.vector_norm(b))
    rel = float(torch.linalg.vector_norm(diff)) / max(ref_norm, 1e-30)
    token_ref = torch.linalg.vector_norm(b, dim=-1)
    floor = max(float(token_ref.mean()) * 1e-6, 1e-30)
    token_rel = torch.linalg.vector_norm(diff, dim=-1) / token_ref.clamp_min(floor)
    token_max = float(token_rel.max()) if token_rel.numel() else 0.0
    token_mean = float(token_rel.mean()) if token_rel.numel() else 0.0
    finite = all(x == x and x != float("inf") for x in (rel, token_max))
    ok = finite and not flags and rel <= tol.rel and token_max <= tol.token_rel
    return TensorDiff(name, rel, token_max, token_mean, ok, flags)


def _rel(a: Any, b: Any) -> float:
    import torch

    diff = float(torch.linalg.vector_norm(a.float() - b.float()))
    return 0.0 if diff == 0.0 else diff / max(float(torch.linalg.vector_norm(b.float())), 1e-30)


# In bf16/fp16 a gradient that sums many terms of both signs (A_log, dt_bias: one value per
# head, summed over every token) carries rounding noise of the order of itself: measured 0.2
# relative between two *correct* paths in bf16. So in low precision a parameter also passes when
# the fast path is no further from an fp32 oracle than ORACLE_SLACK x the reference path is.
ORACLE_SLACK = 2.0


def compare_grads(fast: dict[str, Any], ref: dict[str, Any], tol: Tolerance,
                  oracle: dict[str, Any] | None = None) -> list[GradDiff]:
    import torch

    out = []
    for name, g_ref in ref.items():
        g_fast = fast.get(name)
        if g_ref is None and g_fast is None:
            continue
        if g_ref is None or g_fast is None:
            out.append(GradDiff(name, float("inf"), False))
            continue
        rel = _rel(g_fast, g_ref)
        finite = bool(torch.isfinite(g_fast).all())
        ok = finite and rel <= tol.grad_rel
        fast_o = ref_o = None
        g_o = None if oracle is None else oracle.get(name)
        if g_o is not None:
            fast_o, ref_o = _rel(g_fast, g_o), _rel(g_ref, g_o)
            ok = ok or (finite and fast_o <= ORACLE_SLACK * ref_o + 1e-6)
        out.append(GradDiff(name, rel, ok, fast_o, ref_o))
    return out


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass
class Inputs:
    """Token ids for one verify run; packed runs keep the per-sequence split."""

    ids: Any  # [B, L]
    packed_ids: Any | None = None  # [1, total]
    segments: list[int] = field(default_factory=list)

    def packed_kwargs(self) -> dict[str, Any]:
        """The flattened-batch arguments DataCollatorWithFlattening would produce."""
        import torch

        device = self.packed_ids.device
        lengths = torch.tensor(self.segments, device=device)
        starts = torch.cumsum(lengths, 0) - lengths
        total = int(lengths.sum())
        position_ids = torch.arange(total, device=device) - torch.repeat_interleave(starts, lengths)
        seq_idx = torch.repeat_interleave(torch.arange(len(self.segments), device=device), lengths)
        cu = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.cumsum(lengths, 0)])
        cu = cu.to(torch.int32)
        return {
            "position_ids": position_ids[None],
            "seq_idx": seq_idx.to(torch.int32)[None],
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": int(lengths.max()),
            "max_length_k": int(lengths.max()),
        }


def make_inputs(vocab: int, batch: int, seq_len: int, packed: bool, seed: int, device: Any,
                min_segment: int = 4) -> Inputs:
    """Random ids; with `packed`, the B*L tokens split into max(B, 2) sequences of unequal length."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    if not packed:
        return Inputs(ids)
    total = batch * seq_len
    count = max(batch, 2)
    if total < count * min_segment:
        raise UsageError(f"--packed needs at least {count * min_segment} tokens (batch x seq-len)")
    # Cut points drawn at random, but every piece keeps >= min_segment tokens (longer than the
    # conv window, so a leak across a boundary shows up inside the next sequence).
    free = total - count * min_segment
    weights = torch.rand(count, generator=gen) + 0.25
    extra = (weights / weights.sum() * free).floor().long()
    extra[-1] += free - int(extra.sum())
    segments = [int(min_segment + e) for e in extra]
    return Inputs(ids, ids.reshape(1, total), segments)


# ---------------------------------------------------------------------------------------------
# Running one path


@dataclass
class PathRun:
    hidden: list[Any]
    logits: Any
    grads: dict[str, Any] | None


def _next_token_loss_sum(logits: Any, ids: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
    )


def _collect_grads(model: Any) -> dict[str, Any]:
    """Take the .grad tensors over (no copy: a 27B-wide model's gradients are gigabytes)."""
    grads = {n: (p.grad.detach() if p.grad is not None else None) for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _forward(model: Any, ids: Any, backward: bool, denom: int, **kwargs: Any) -> tuple[list[Any], Any]:
    import torch

    with torch.set_grad_enabled(backward):
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False, **kwargs)
        if backward:
            (_next_token_loss_sum(out.logits, ids) / denom).backward()
    return [h.detach() for h in out.hidden_states], out.logits.detach()


def run_path(model: Any, inputs: Inputs, *, packed_reference: bool, backward: bool) -> PathRun:
    """One pass over `inputs` on whatever path is active now.

    packed_reference: run each packed sequence on its own and join the outputs in time — the
    ground truth for a packed batch (transformers' torch fallback ignores seq_idx / cu_seqlens).
    """
    import torch

    model.zero_grad(set_to_none=True)
    if inputs.packed_ids is None:
        ids = inputs.ids
        hidden, logits = _forward(model, ids, backward, ids.shape[0] * (ids.shape[1] - 1))
    elif not packed_reference:
        denom = sum(s - 1 for s in inputs.segments)
        ids = inputs.packed_ids
        with torch.set_grad_enabled(backward):
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False, **inputs.packed_kwargs())
            if backward:
                loss = 0.0
                start = 0
                for length in inputs.segments:
                    piece = slice(start, start + length)
                    loss = loss + _next_token_loss_sum(out.logits[:, piece], ids[:, piece])
                    start += length
                (loss / denom).backward()
        hidden, logits = [h.detach() for h in out.hidden_states], out.logits.detach()
    else:
        denom = sum(s - 1 for s in inputs.segments)
        pieces_h: list[list[Any]] = []
        pieces_l = []
        start = 0
        for length in inputs.segments:
            seg = inputs.packed_ids[:, start:start + length]
            h, lg = _forward(model, seg, backward, denom)
            pieces_h.append(h)
            pieces_l.append(lg)
            start += length
        hidden = [torch.cat([p[i] for p in pieces_h], dim=1) for i in range(len(pieces_h[0]))]
        logits = torch.cat(pieces_l, dim=1)
    grads = _collect_grads(model) if backward else None
    return PathRun(hidden, logits, grads)


# ---------------------------------------------------------------------------------------------
# Decode


def check_decode(fast: Any, ref: Any, tol: Tolerance) -> DecodeCheck:
    """Same greedy tokens with close logits; a split exactly at a near tie is reported, not failed.

    With random weights two vocabulary entries can be within rounding of each other; then the
    paths may legitimately choose differently. That is accepted only if the logits at that step
    are within tolerance; after a split the contexts differ, so later steps are not compared.
    """
    import torch

    steps = int(ref.tokens.shape[1])
    worst = 0.0
    for s in range(steps):
        a, b = fast.logits[s], ref.logits[s]
        rel = float(torch.linalg.vector_norm(a - b)) / max(float(torch.linalg.vector_norm(b)), 1e-30)
        worst = max(worst, rel if rel == rel else float("inf"))
        same = bool((fast.tokens[:, s] == ref.tokens[:, s]).all())
        close = rel <= tol.rel
        if not close:
            return DecodeCheck(steps, s, worst, None, False,
                               f"logits at decode step {s} differ by {rel:.3g} (> {tol.rel:g})")
        if not same:
            return DecodeCheck(steps, s, worst, s, True,
                               f"tokens identical for {s} steps, then a near tie at step {s} "
                               f"(logits within {rel:.2g}); later steps not compared")
    return DecodeCheck(steps, steps, worst, None, True,
                       f"{steps} greedy tokens identical on both paths, logits within {worst:.2g}")


# ---------------------------------------------------------------------------------------------
# The whole verification


class _Tf32Off:
    """Context: real fp32 matmuls and convolutions on CUDA (both default to TF32 somewhere)."""

    def __enter__(self) -> None:
        import torch

        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def _run_side(name: str, model: Any, inputs: Inputs, *, packed_reference: bool, backward: bool,
              decode_tokens: int, say: Callable[[str], None]) -> tuple[PathRun, Any, dict[str, int]]:
    """One side of the comparison: forward (+ backward), optional greedy decode, and the kernel
    calls it made (counted at the kernels' own entry points)."""
    from fastpath.kernels.counters import CALLS
    from fastpath.proof.greedy import greedy_decode

    say(f"{name}: forward" + (" + backward" if backward else ""))
    before = Counter(CALLS)
    run = run_path(model, inputs, packed_reference=packed_reference, backward=backward)
    decode = None
    if decode_tokens:
        say(f"{name}: greedy decode")
        decode = greedy_decode(model, inputs.ids, decode_tokens)
    return run, decode, _call_delta(before, Counter(CALLS))


def _call_delta(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0) > 0}


def _explain_rows(model: Any) -> list[dict[str, Any]]:
    import fastpath

    try:
        rows = fastpath.explain(model).rows
    except Exception as exc:  # explain is a report, never a reason to fail verify
        return [{"error": f"explain failed: {exc.__class__.__name__}: {exc}"}]
    return [dict(r) if isinstance(r, dict) else dict(vars(r)) for r in rows]


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


# The compiled packages transformers would bind instead of its torch fallbacks.
COMPILED_PEERS = ("causal_conv1d", "causal_conv1d_cuda", "fla")
REFERENCES = ("torch", "transformers")


@contextlib.contextmanager
def hidden_compiled_peers() -> Any:
    """While the model is built, make Dao causal-conv1d and FLA unimportable.

    Why: transformers 5.15+ binds causal_conv1d / FLA once, when it imports a modeling module,
    and disable() restores that binding. With the peers hidden at that moment the reference is
    the torch fallback, the spec, on every machine (with FLA bound instead, the reference
    backward even raises on Hopper with Triton < 3.7.1, FLA #640). They are importable again
    afterwards, so enable() can still route the gated delta rule to FLA. A modeling module
    imported before this keeps its binding; verify reports the reference's routes either way.
    """
    hidden = [name for name in COMPILED_PEERS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


def _fp32_oracle_grads(model: Any, inputs: Inputs) -> dict[str, Any]:
    """Gradients of an fp32 copy of `model` on the active (reference) path, in the model's dtype
    layout; the copy is freed before returning."""
    import copy

    import torch

    oracle = copy.deepcopy(model).float()
    try:
        with _Tf32Off():
            grads = run_path(oracle, inputs, packed_reference=True, backward=True).grads or {}
    finally:
        del oracle
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return grads


def route_summary(rows: list[dict[str, Any]]) -> str:
    """'causal_conv1d_fn: torch fallback (...) x3; ...' — what each op resolved to, counted."""
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        if "op" in r:
            key = (str(r["op"]), str(r.get("impl")))
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return "no causal_conv1d / gated-delta-rule layers found"
    return "; ".join(f"{op}: {impl} x{n}" for (op, impl), n in counts.items())


def layer_names(layer_types: list[str], count: int, starts_with_embeddings: bool = True) -> list[tuple[str, str]]:
    """(name, type) for the output_hidden_states entries.

    Most families (transformers 5 `capture_outputs`) return the embeddings, then each decoder
    layer's output, the last one after the final norm. Mamba-style families return each layer's
    output, then the final norm's output, without the embeddings.
    """

    def kind(i: int) -> str:
        return layer_types[i] if i < len(layer_types) else "decoder"

    if starts_with_embeddings:
        names = [("embeddings", "")]
        for i in range(count - 1):
            names.append((f"layer {i}" + (" + final norm" if i == count - 2 else ""), kind(i)))
        return names
    names = [(f"layer {i}", kind(i)) for i in range(count - 1)]
    return [*names, ("final norm", "")]


def _starts_with_embeddings(model: Any, ids: Any, first_hidden: Any) -> bool:
    import torch

    with torch.no_grad():
        embedded = model.get_input_embeddings()(ids)
    return embedded.shape == first_hidden.shape and bool(torch.equal(embedded, first_hidden))


def verify_model(
    source: str,
    *,
    dtype: str = "fp32",
    seq_len: int = 64,
    batch: int = 2,
    packed: bool = False,
    backward: bool = False,
    layers: int | None = None,
    decode_tokens: int = 8,
    device: str | None = "auto",
    seed: int = 0,
    enable_kwargs: dict[str, Any] | None = None,
    reference: str = "torch",
    progress: Callable[[str], None] | None = None,
) -> VerifyResult:
    """Run `source` on the reference path and on the fast path; compare (see module doc).

    enable_kwargs go to fastpath.enable() (tests route deliberately wrong kernels this way).
    reference="torch": transformers' torch fallbacks are the reference even where Dao
    causal-conv1d / FLA are installed (see hidden_compiled_peers); "transformers": whatever
    transformers binds in this environment. fastpath is left disabled afterwards.
    """
    if seq_len < 2:
        raise UsageError("--seq-len must be at least 2")
    if batch < 1:
        raise UsageError("--batch must be at least 1")
    if decode_tokens < 0:
        raise UsageError("--decode-tokens must be >= 0")
    say = progress or (lambda _msg: None)
    import torch

    import fastpath
    from fastpath.proof.models import build_model, dtype_label

    if reference not in REFERENCES:
        raise UsageError(f"unknown reference {reference!r}; use {' or '.join(REFERENCES)}")
    say("building the model")
    if reference == "torch":
        with hidden_compiled_peers():
            built = build_model(source, layers=layers, dtype=dtype, device=device, seed=seed)
    else:
        built = build_model(source, layers=layers, dtype=dtype, device=device, seed=seed)
    tol = TOLERANCES[dtype_label(built.dtype)]
    inputs = make_inputs(built.vocab_size, batch, seq_len, packed, seed, built.device)
    model = built.model
    if backward:
        model.requires_grad_(True)
    problems: list[str] = []
    stage = "reference path"
    tf32 = _Tf32Off() if built.dtype == torch.float32 else contextlib.nullcontext()

    try:
        tf32.__enter__()
        fastpath.disable()
        reference_rows = _explain_rows(model)
        ref, ref_decode, ref_calls = _run_side("reference path", model, inputs, packed_reference=True,
                                               backward=backward, decode_tokens=decode_tokens, say=say)
        oracle_grads = None
        if backward and built.dtype != torch.float32:
            say("reference path in fp32: gradient oracle")
            oracle_grads = _fp32_oracle_grads(model, inputs)

        stage = "fast path"
        say("fast path: enable()")
        report = fastpath.enable(**(enable_kwargs or {}))
        explain_rows = _explain_rows(model)
        fast, fast_decode, fast_calls = _run_side("fast path", model, inputs, packed_reference=False,
                                                  backward=backward, decode_tokens=decode_tokens,
                                                  say=say)
    except FastpathError:
        raise
    except torch.cuda.OutOfMemoryError as exc:
        raise FastpathError(f"{stage}: out of GPU memory: {first_line(exc)}; "
                            "try a smaller --seq-len/--batch/--layers") from None
    except Exception as exc:
        # A path that raises (a kernel refusing packed training, a shape error) is a failed
        # verification, reported in one line: exit 1, not a traceback.
        raise FastpathError(f"{stage} raised {exc.__class__.__name__}: {first_line(exc)}") from None
    finally:
        fastpath.disable()
        tf32.__exit__(None, None, None)

    say("comparing")
    ids = inputs.packed_ids if inputs.packed_ids is not None else inputs.ids
    names = layer_names(built.layer_types, len(ref.hidden), _starts_with_embeddings(model, ids, ref.hidden[0]))
    if len(fast.hidden) != len(ref.hidden):
        problems.append(f"fast path returned {len(fast.hidden)} hidden states, reference {len(ref.hidden)}")
    diffs = []
    for (name, kind), f, r in zip(names, fast.hidden, ref.hidden, strict=False):
        diffs.append(compare(name, f, r, tol))
        diffs[-1].kind = kind
    logits = compare("logits", fast.logits, ref.logits, tol)
    grads = compare_grads(fast.grads, ref.grads, tol, oracle_grads) if backward else None
    decode = check_decode(fast_decode, ref_decode, tol) if decode_tokens else None

    for diff in [*diffs, logits]:
        if diff.flags:
            problems.append(f"{diff.name}: {', '.join(diff.flags)}")
    first = next((d for d in [*diffs, logits] if not d.ok), None)
    if first is not None:
        problems.append(
            f"first diverging: {first.name}{f' ({first.kind})' if first.kind else ''}: relative error {first.rel:.3g} (limit {tol.rel:g}), "
            f"worst token {first.token_rel_max:.3g} (limit {tol.token_rel:g})"
        )
    if grads is not None:
        bad = [g for g in grads if not g.ok]
        if bad:
            worst = max(bad, key=lambda g: g.rel)
            problems.append(f"{len(bad)} of {len(grads)} parameter gradients differ; first {bad[0].name} "
                            f"({bad[0].rel:.3g}), worst {worst.name} ({worst.rel:.3g}), limit {tol.grad_rel:g}")
    if decode is not None and not decode.ok:
        problems.append(f"decode: {decode.detail}")
    conv_calls = sum(n for k, n in fast_calls.items() if k.split(":")[0] in CONV_OPS)
    if conv_calls == 0:
        problems.append("the fast path executed 0 conv kernel calls: enable() did not route this model, "
                        "so nothing was verified")
    if packed:
        problems += packed_route_problems(explain_rows)
    if any(k.split(":")[0] in CONV_OPS for k in ref_calls):
        problems.append(f"the reference path ran fastpath kernels ({ref_calls}): disable() did not restore it")

    return VerifyResult(
        model=built.to_json(),
        dtype=dtype_label(built.dtype),
        batch=batch,
        seq_len=seq_len,
        packed=packed,
        segments=list(inputs.segments),
        tolerance=tol,
        layers=diffs,
        logits=logits,
        grads=grads,
        decode=decode,
        reference_calls=ref_calls,
        fast_calls=fast_calls,
        enable_report=str(report),
        explain=explain_rows,
        problems=problems,
        reference_explain=reference_rows,
    )


# ---------------------------------------------------------------------------------------------
# Rendering and CLI


def render(result: VerifyResult) -> Any:
    """A rich renderable: per-layer table, then the verdict."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    tol = result.tolerance
    table = Table(title=f"fast vs reference, {result.dtype}, limits: rel {tol.rel:g}, token {tol.token_rel:g}")
    for col in ("output", "type", "rel error", "max token rel", "mean token rel", "flags", ""):
        table.add_column(col, justify="right" if "rel" in col else "left")
    for diff in [*result.layers, result.logits]:
        mark = "[green]ok[/]" if diff.ok else "[red]MISMATCH[/]"
        table.add_row(diff.name, diff.kind, f"{diff.rel:.2e}", f"{diff.token_rel_max:.2e}",
                      f"{diff.token_rel_mean:.2e}", ", ".join(diff.flags), mark)
    lines: list[Any] = [Text(f"model: {result.model['source']} ({result.model['class']}, "
                             f"{result.model['layers']} layers, {result.dtype}, {result.model['device']})")]
    for note in result.model.get("notes", []):
        lines.append(Text(f"note: {note}", style="dim"))
    shape = f"batch {result.batch} x seq-len {result.seq_len}"
    if result.packed:
        shape += f", packed into one row as sequences of {result.segments} (reference: each on its own)"
    lines += [
        Text(f"inputs: {shape}"),
        Text(f"reference path: {route_summary(result.reference_explain)}", style="dim"),
        Text(f"fast path: {route_summary(result.explain)}", style="dim"),
        table,
    ]
    if result.grads is not None:
        bad = [g for g in result.grads if not g.ok]
        rule = f"within {tol.grad_rel:g} of the reference"
        if any(g.fast_vs_fp32 is not None for g in result.grads):
            rule += f", or no further from an fp32 run than {ORACLE_SLACK:g}x the reference is"
        text = f"gradients: {len(result.grads) - len(bad)}/{len(result.grads)} parameters pass ({rule})"
        worst = max(result.grads, key=lambda g: g.rel, default=None)
        if worst is not None:
            text += f"; largest difference {worst.name} {worst.rel:.2e}"
            if worst.fast_vs_fp32 is not None:
                text += f" (vs fp32: fast {worst.fast_vs_fp32:.2e}, reference {worst.ref_vs_fp32:.2e})"
        lines.append(Text(text, style="green" if not bad else "red"))
    if result.decode is not None:
        lines.append(Text(f"decode: {result.decode.detail}", style="green" if result.decode.ok else "red"))
    calls = ", ".join(f"{k} x{n}" for k, n in result.fast_calls.items()) or "none"
    lines.append(Text(f"fast path executed {result.conv_kernel_calls} conv kernel calls ({calls})"))
    if result.ok:
        lines.append(Text("PASS: the fast path computes the same function", style="bold green"))
    else:
        lines.append(Text("FAIL:", style="bold red"))
        lines += [Text(f"  - {p}", style="red") for p in result.problems]
    return Group(*lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="preset name, config.json path, or local model directory with safetensors")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="auto: bf16 on a GPU, fp32 on CPU")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    parser.add_argument("--batch", type=int, default=2, help="rows (default 2)")
    parser.add_argument("--packed", action="store_true",
                        help="pack the batch into one row of unequal sequences (seq_idx / cu_seqlens)")
    parser.add_argument("--backward", action="store_true", help="also compare parameter gradients of a next-token loss")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers (layer-type pattern kept)")
    parser.add_argument("--decode-tokens", type=int, default=8, help="greedy cached decode steps to compare (0: skip)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--reference", choices=REFERENCES, default="torch",
                        help="torch: transformers' torch fallbacks (Dao causal-conv1d / FLA hidden while the model "
                             "is built); transformers: whatever transformers binds here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--save", metavar="PATH", default=None, help="also write the result JSON to PATH")


def resolve_dtype(name: str, device: str | None) -> str:
    if name != "auto":
        return name
    from fastpath.proof.models import resolve_device

    return "bf16" if resolve_device(device).type == "cuda" else "fp32"


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    dtype = resolve_dtype(args.dtype, args.device)
    with err.status("verify: starting", spinner="dots") as status:
        result = verify_model(
            args.model, dtype=dtype, seq_len=args.seq_len, batch=args.batch, packed=args.packed,
            backward=args.backward, layers=args.layers, decode_tokens=args.decode_tokens,
            device=args.device, seed=args.seed, reference=args.reference,
            progress=lambda msg: status.update(f"verify: {msg}"),
        )
    if args.save:
        from pathlib import Path

        path = Path(args.save)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        Console().print(render(result))
    return 0 if result.ok else 1
