"""Running the two paths of `fastpath verify`: the inputs (plain or packed), one pass of a model on
whatever path is active (forward, optional backward, greedy decode), the kernel calls it made,
and the reference kept honest (compiled peers hidden, TF32 off in fp32, an fp32 gradient oracle).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastpath.models.build import BuiltModel, ResolvedModel, resolve_model
from fastpath.models.compare import (
    NOISE_RUNS,
    TOLERANCES,
    check_decode,
    compare,
    compare_grads,
    judge_by_noise,
    judge_by_oracle,
)
from fastpath.models.moe_pin import PinReport, TopkPin
from fastpath.models.paths import hidden_compiled_peers
from fastpath.proof.verdict import CannotVerify, VerifyResult
from fastpath.shared.errors import FastpathError, UsageError, first_line

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

    from fastpath.routing import lm_head_route
    from fastpath.routing.liger_route import fused_loss_in_place, next_token_loss

    liger = fused_loss_in_place(model)
    if backward and not kwargs and (liger or lm_head_route.fused_loss_in_place(model)):
        # The loss a training call takes: Liger's fused linear cross-entropy (verify --liger) or
        # enable()'s fused LM head + cross-entropy, a mean over the B x (L-1) predictions (scaled
        # to the same sum / denom); the logits, which that call does not return, from a no-grad pass.
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        loss = (next_token_loss(model, ids) if liger
                else model(input_ids=ids, labels=ids, use_cache=False).loss)
        (loss * (ids.shape[0] * (ids.shape[1] - 1)) / denom).backward()
        return [h.detach() for h in out.hidden_states], out.logits.detach()
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


@dataclass
class _Pins:
    """The reference's top-k choices (models/moe_pin.py): recorded on the reference side, replayed
    on the fast side, so an MoE router's discrete choice is the same on both paths."""

    forward: TopkPin = field(default_factory=TopkPin)
    decode: TopkPin = field(default_factory=TopkPin)
    report: PinReport = field(default_factory=PinReport)


def _run_side(name: str, model: Any, inputs: Inputs, *, packed_reference: bool, backward: bool,
              decode_tokens: int, say: Callable[[str], None],
              pins: _Pins | None = None) -> tuple[PathRun, Any, dict[str, int]]:
    """One side of the comparison: forward (+ backward), optional greedy decode, and the kernel
    calls it made (counted at the kernels' own entry points). `pins`: the reference side
    (packed_reference) records its top-k choices there, the fast side replays them."""
    from fastpath.kernels.counters import CALLS
    from fastpath.proof.greedy import greedy_decode

    def pinned(pin: TopkPin, pieces: int) -> Any:
        if pins is None:
            return contextlib.nullcontext()
        if packed_reference:
            return pin.recording()
        return pin.regrouped(pieces).replaying(pins.report)

    say(f"{name}: forward" + (" + backward" if backward else ""))
    before = Counter(CALLS)
    with pinned(pins.forward if pins else TopkPin(), len(inputs.segments)):
        run = run_path(model, inputs, packed_reference=packed_reference, backward=backward)
    decode = None
    if decode_tokens:
        say(f"{name}: greedy decode")
        with pinned(pins.decode if pins else TopkPin(), 1):
            decode = greedy_decode(model, inputs.ids, decode_tokens)
    return run, decode, _call_delta(before, Counter(CALLS))


def _call_delta(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0) > 0}


def _explain_rows(model: Any) -> list[dict[str, Any]]:
    from fastpath.routing import engine as routes

    try:
        rows = routes.explain(model).rows
    except Exception as exc:  # explain is a report, never a reason to fail verify
        return [{"error": f"explain failed: {exc.__class__.__name__}: {exc}"}]
    return [dict(r) if isinstance(r, dict) else dict(vars(r)) for r in rows]


# Model types whose linear-attention layers run a gated delta rule (or KDA) through FLA; packed
# sequences need FLA's cu_seqlens there (transformers' torch fallbacks ignore it, <=5.17 silently,
# 5.21+ raise). The Mamba-2 / conv families take seq_idx in fastpath's own kernels.
_FLA_PACKED_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "olmo_hybrid",
                     "kimi_linear")


def packed_unverifiable(config: Any, device: Any, backward: bool, gated_delta_rule: str = "auto") -> str | None:
    """Why `--packed` cannot be checked on this model here (one line), or None when it can.

    Decided from the config, the device and what is installed, before anything is built: the fast
    path would either raise (fastpath refuses cu_seqlens on the torch fallback) or mix the
    sequences. The device comes first: on a CPU, installing fla-core would not help. While the
    model is built, verify hides FLA from transformers (models/paths.hidden_compiled_peers), so
    an installed FLA is then found on the path without importing it, and its import and GPU
    checks wait for the second call, once the model is built.
    """
    import importlib.machinery
    import sys

    from fastpath.models.build import layer_types
    from fastpath.routing.fla_route import detect_fla

    model_type = str(getattr(config, "model_type", ""))
    if model_type not in _FLA_PACKED_TYPES:
        return None
    if model_type != "kimi_linear" and "linear_attention" not in layer_types(config):
        return None  # a cut that kept only attention layers
    what = f"--packed on {model_type}: packed sequences need FLA's gated delta rule (cu_seqlens)"
    hidden = "fla" in sys.modules and sys.modules["fla"] is None
    installed = importlib.machinery.PathFinder.find_spec("fla") is not None if hidden else None
    if getattr(device, "type", str(device)) != "cuda":
        if hidden:
            have = "installed" if installed else "not installed either"
        else:
            status = detect_fla(gated_delta_rule)
            have = "installed" if status.route else f"not usable either: {status.reason}"
        return f"{what}, whose kernels run on CUDA tensors only (device here: {device}; fla-core is {have})"
    if hidden:
        if installed:
            return None  # imported and checked once the model is built
        return f"{what}; fla is not installed: pip install fla-core (pure Python, Triton kernels)"
    status = detect_fla(gated_delta_rule)
    if not status.route:
        return f"{what}; {status.reason}"
    if backward and status.chunk_impl == "fla-fwd+torch-bwd":
        return f"{what} and its backward, which FLA refuses here: {status.reason}"
    return None


# What verify can take as the reference path (--reference).
REFERENCES = ("torch", "transformers")


@contextlib.contextmanager
def _fp32_copy(model: Any) -> Any:
    """An fp32 copy of `model` (same active path) with real fp32 matmuls, freed on exit (callers
    drop their name for it inside the block). The model's gradients are not copied: memory."""
    import copy

    import torch

    grads = {p: p.grad for p in model.parameters()}
    for p in grads:
        p.grad = None
    try:
        oracle = copy.deepcopy(model)
    finally:
        for p, g in grads.items():
            p.grad = g
    try:
        with _Tf32Off():
            yield oracle.float()
    finally:
        del oracle
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _fp32_oracle_grads(model: Any, inputs: Inputs) -> dict[str, Any]:
    """Gradients of an fp32 copy of `model` on the active (reference) path, in the model's dtype
    layout; the copy is freed before returning."""
    with _fp32_copy(model) as oracle:
        grads = run_path(oracle, inputs, packed_reference=True, backward=True).grads or {}
        del oracle  # the last reference: _fp32_copy's exit returns its memory
    return grads


def _fp32_oracle_outputs(model: Any, inputs: Inputs, pins: _Pins) -> PathRun:
    """Hidden states and logits of an fp32 copy on the reference path (no gradients), with the
    reference's MoE choices replayed so a near-tied router does not pick other experts."""
    with _fp32_copy(model) as oracle, pins.forward.replaying(PinReport()):
        run = run_path(oracle, inputs, packed_reference=True, backward=False)
        del oracle
    return run


def _fp32_oracle_decode_logits(model: Any, prompt: Any, tokens: Any) -> list[Any] | None:
    """Per-step fp32 logits of an fp32 copy of `model` (active = reference path) fed the prompt
    and the reference's greedy tokens in one teacher-forced forward: the same logits a cached
    decode computes, in exact-enough arithmetic. None when that cannot run."""
    import torch

    steps = int(tokens.shape[1])
    ids = torch.cat([prompt, tokens[:, :steps - 1]], dim=1)
    try:
        with _fp32_copy(model) as oracle, torch.no_grad():
            logits = oracle(input_ids=ids, use_cache=False, logits_to_keep=steps).logits.float()
            del oracle
        return [logits[:, s] for s in range(steps)]
    except Exception:  # no room for the copy, a family without logits_to_keep: keep the failure
        return None


def _nudge_weights(model: Any, seed: int, direction: int) -> None:
    """Move every parameter by one rounding step (nextafter), up or down at random per element
    (`direction` 1); `direction` -1 with the same seed moves each element back exactly."""
    import torch

    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            gen = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + i)
            up = torch.rand(p.shape, generator=gen, device=p.device) < 0.5
            if direction < 0:
                up = ~up
            inf = torch.tensor(float("inf"), dtype=p.dtype, device=p.device)
            p.copy_(torch.nextafter(p, torch.where(up, inf, -inf)))


def _rounding_noise(model: Any, inputs: Inputs, reference: dict[str, Any], names: list[str],
                    runs: int) -> dict[str, float]:
    """How far the reference path's gradients of `names` move when every weight moves by one
    rounding step (largest of `runs` runs; models/compare.py judge_by_noise says why). Only
    `names` get gradients; the weights are restored exactly. {} when it cannot run."""
    from fastpath.models.compare import _rel

    params = dict(model.named_parameters())
    wanted = {n: p.requires_grad for n, p in params.items()}
    noise: dict[str, float] = {}
    try:
        for n, p in params.items():
            p.requires_grad_(n in names)
        for run in range(runs):
            _nudge_weights(model, run + 1, 1)
            try:
                grads = run_path(model, inputs, packed_reference=True, backward=True).grads or {}
            finally:
                _nudge_weights(model, run + 1, -1)
            for n in names:
                if grads.get(n) is not None and reference.get(n) is not None:
                    noise[n] = max(noise.get(n, 0.0), _rel(grads[n], reference[n]))
    except Exception:  # no room for another pass: the failures stand as measured
        return {}
    finally:
        for n, p in params.items():
            p.requires_grad_(wanted[n])
        model.zero_grad(set_to_none=True)
    return noise


def _starts_with_embeddings(model: Any, ids: Any, first_hidden: Any) -> bool:
    import torch

    with torch.no_grad():
        embedded = model.get_input_embeddings()(ids)
    return embedded.shape == first_hidden.shape and bool(torch.equal(embedded, first_hidden))


def _build_description(model: ResolvedModel, seed: int) -> str:
    """What the (possibly minute-long) model build is doing, said before it starts."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None)
    what = f"building the model: {config.model_type}" + (f", {layers} layers" if layers else "")
    if model.model_dir is not None:
        return f"{what}, loading the checkpoint in {model.model_dir} as {model.dtype} onto {model.device}"
    return (f"{what}, random weights (seed {seed}) initialised in fp32 on {model.device}"
            + (f", then cast to {model.dtype}" if model.dtype != "fp32" else ""))


class _Stage:
    """Which part of the work is running, so an exception is blamed on the right party: our own
    setup (building, inputs, enable()) is never reported as "the reference path raised"."""

    def __init__(self) -> None:
        self.name = "verify setup"

    def __call__(self, name: str) -> None:
        self.name = name


def check_settings(seq_len: int, batch: int, decode_tokens: int, reference: str) -> None:
    """UsageError for a run verify cannot make, before the model source is read."""
    if seq_len < 2:
        raise UsageError("--seq-len must be at least 2")
    if batch < 1:
        raise UsageError("--batch must be at least 1")
    if decode_tokens < 0:
        raise UsageError("--decode-tokens must be >= 0")
    if reference not in REFERENCES:
        raise UsageError(f"unknown reference {reference!r}; use {' or '.join(REFERENCES)}")


@dataclass
class _Settings:
    """What one verification runs (verify_model's arguments, checked)."""

    seq_len: int
    batch: int
    packed: bool
    backward: bool
    decode_tokens: int
    seed: int
    enable_kwargs: dict[str, Any]
    reference: str
    check_memory: bool
    liger: bool
    say: Callable[[str], None]
    tell: Callable[[str], None]

    def __post_init__(self) -> None:
        check_settings(self.seq_len, self.batch, self.decode_tokens, self.reference)

    def refuse_packed(self, model: ResolvedModel) -> None:
        """CannotVerify when --packed cannot be checked on this model here (packed_unverifiable)."""
        if not self.packed:
            return
        why = packed_unverifiable(model.config, model.device, self.backward,
                                  str(self.enable_kwargs.get("gated_delta_rule", "auto")))
        if why is not None:
            raise CannotVerify(why)


@dataclass
class _Runs:
    """Both sides of one verification, as they ran."""

    reference_rows: list[dict[str, Any]]  # explain() with fastpath disabled
    explain_rows: list[dict[str, Any]]  # explain() after enable()
    report: str  # what enable() said
    ref: PathRun
    ref_decode: Any
    ref_calls: dict[str, int]
    fast: PathRun
    fast_decode: Any
    fast_calls: dict[str, int]
    oracle_grads: dict[str, Any] | None  # fp32 gradients of the reference path (bf16/fp16 --backward)
    pins: _Pins


def _resolved(source: str | ResolvedModel, layers: int | None, dtype: str | None,
              device: str | None) -> ResolvedModel:
    """The command's ResolvedModel as it is, or `source` resolved with layers / dtype / device."""
    if isinstance(source, ResolvedModel):
        if layers is not None or dtype is not None or device is not None:
            raise TypeError("verify_model: layers, dtype and device are the ResolvedModel's own")
        return source
    return resolve_model(source, layers=layers, dtype=dtype or "fp32", device=device or "auto")


def _size_and_build(source: str | ResolvedModel, layers: int | None, dtype: str | None, device: str | None,
                    run: _Settings) -> tuple[BuiltModel, Any]:
    """Resolve (unless the command did), refuse what cannot be verified, size the job
    (check_memory) and build the model: every UsageError / CannotVerify before the first pass."""
    from fastpath.models.build import build_resolved

    # With reference="torch" the compiled peers stay hidden until the model is built: sizing
    # builds the module tree on the meta device, which imports the modeling module (and binds).
    peers = hidden_compiled_peers() if run.reference == "torch" else contextlib.nullcontext()
    with peers:
        model = _resolved(source, layers, dtype, device)  # bad input: before any output
        if run.liger:
            from fastpath.routing.liger_route import check_usable

            check_usable(model.family, model.device)
        run.refuse_packed(model)
        size = None
        if run.check_memory:
            from fastpath.models.sizing import size_job

            run.say("sizing the job")
            size = size_job(model.config, model.source.config, what=f"verify {model.source.text}",
                            dtype=model.dtype, device=model.device, batch=run.batch, seq_len=run.seq_len,
                            backward=run.backward, paths=2, min_layers=model.min_layers)
            for line in size.header():
                run.tell(line)
            if size.defaults_note():
                run.tell("note: " + size.defaults_note())
        run.say(_build_description(model, run.seed))
        built = build_resolved(model, seed=run.seed)
    run.refuse_packed(model)  # FLA importable again: its import and GPU checks, before either path runs
    if size is not None and size.defaults_note():
        built.notes.append(size.defaults_note())
    return built, size


def _run_both_paths(built: BuiltModel, inputs: Inputs, run: _Settings) -> _Runs:
    """The reference path (fastpath disabled), then the fast path (enable()), on one model and one
    set of inputs; fastpath is left disabled. A path that raises is one FastpathError line."""
    import torch

    from fastpath.routing import engine as routes

    model = built.model
    stage = _Stage()
    tf32 = _Tf32Off() if built.dtype == torch.float32 else contextlib.nullcontext()

    def step(name: str) -> None:
        stage(name)
        run.say(name)

    sides = {"backward": run.backward, "decode_tokens": run.decode_tokens, "say": step}
    try:
        tf32.__enter__()
        routes.disable()
        reference_rows = _explain_rows(model)
        oracle_grads = None
        if run.backward and built.dtype != torch.float32:
            # First, while no gradients are held: the fp32 copy and its gradients are never alive
            # together with both paths' gradients (models/sizing.py peak_bytes).
            step("reference path in fp32: gradient oracle")
            oracle_grads = _fp32_oracle_grads(model, inputs)
        pins = _Pins()
        ref, ref_decode, ref_calls = _run_side("reference path", model, inputs, packed_reference=True, pins=pins,
                                               **sides)

        step("enable()")
        report = routes.enable(**run.enable_kwargs)
        explain_rows = _explain_rows(model)
        if built.device.type == "cuda" and any(str(r.get("impl", "")).startswith("fla") for r in explain_rows):
            # H200: a cold Triton cache made this step outlast a 150 s limit
            run.tell("note: FLA's kernels compile and autotune at their first call for these head sizes "
                     "(minutes with an empty Triton cache; cached for later runs)")
        fast, fast_decode, fast_calls = _run_side("fast path", model, inputs, packed_reference=False, pins=pins,
                                                  **sides)
    except FastpathError:
        raise
    except torch.cuda.OutOfMemoryError as exc:
        raise FastpathError(f"{stage.name}: out of GPU memory: {first_line(exc)}; "
                            "try a smaller --seq-len/--batch/--layers") from None
    except Exception as exc:
        # A path that raises (a kernel refusing packed training, a shape error) is a failed
        # verification, reported in one line: exit 1, not a traceback.
        raise FastpathError(f"{stage.name} raised {exc.__class__.__name__}: {first_line(exc)}") from None
    finally:
        routes.disable()
        tf32.__exit__(None, None, None)
    return _Runs(reference_rows, explain_rows, str(report), ref, ref_decode, ref_calls, fast, fast_decode,
                 fast_calls, oracle_grads, pins)


def _compare_outputs(built: BuiltModel, inputs: Inputs, runs: _Runs, tol: Any,
                     say: Callable[[str], None]) -> tuple[list[Any], Any, list[str]]:
    """Every layer's hidden states and the logits, fast vs reference (an fp32 run of the reference
    judges the ones beyond the limit in bf16/fp16); the per-layer diffs, the logits' diff, and a
    problem when the paths returned different numbers of hidden states."""
    import torch

    from fastpath.proof.verdict import layer_names

    ref, fast = runs.ref, runs.fast
    ids = inputs.packed_ids if inputs.packed_ids is not None else inputs.ids
    names = layer_names(built.layer_types, len(ref.hidden), _starts_with_embeddings(built.model, ids, ref.hidden[0]))
    counts = [] if len(fast.hidden) == len(ref.hidden) else [
        f"fast path returned {len(fast.hidden)} hidden states, reference {len(ref.hidden)}"]
    diffs = []
    for (name, kind), f, r in zip(names, fast.hidden, ref.hidden, strict=False):
        diffs.append(compare(name, f, r, tol))
        diffs[-1].kind = kind
    logits = compare("logits", fast.logits, ref.logits, tol)
    if built.dtype != torch.float32 and not all(d.ok for d in [*diffs, logits]):
        # Only now (it costs an fp32 copy): whose rounding is it (models/compare.judge_by_oracle)?
        say("hidden states beyond the limit: fp32 run of the reference path")
        oracle_run = _fp32_oracle_outputs(built.model, inputs, runs.pins)
        diffs = judge_by_oracle(diffs, fast.hidden, ref.hidden, oracle_run.hidden)
        logits = judge_by_oracle([logits], [fast.logits], [ref.logits], [oracle_run.logits])[0]
        del oracle_run
    return diffs, logits, counts


def _compare_gradients(built: BuiltModel, inputs: Inputs, runs: _Runs, tol: Any,
                       say: Callable[[str], None]) -> list[Any]:
    """Every parameter gradient, fast vs reference; in fp32, the ones beyond the limit are judged
    against the reference's own rounding noise (models/compare.judge_by_noise)."""
    import torch

    ref = runs.ref
    grads = compare_grads(runs.fast.grads, ref.grads, tol, runs.oracle_grads)
    beyond = [g.name for g in grads if not g.ok and g.rel == g.rel and g.rel != float("inf")]
    if beyond and built.dtype == torch.float32 and ref.grads is not None:
        say(f"{len(beyond)} gradients beyond {tol.grad_rel:g}: measuring the reference's own rounding noise "
            f"({NOISE_RUNS} runs with every weight moved by one rounding step)")
        with _Tf32Off():
            noise = _rounding_noise(built.model, inputs, ref.grads, beyond, NOISE_RUNS)
        grads = judge_by_noise(grads, noise)
    return grads


def _compare_decode(built: BuiltModel, inputs: Inputs, runs: _Runs, tol: Any, say: Callable[[str], None]) -> Any:
    """The greedy decodes, fast vs reference; in bf16/fp16 a mismatch is judged against fp32
    logits of the reference's tokens."""
    import torch

    decode = check_decode(runs.fast_decode, runs.ref_decode, tol)
    if not decode.ok and built.dtype != torch.float32:
        # Only now (it costs an fp32 copy of the model): is the fast path further from exact
        # arithmetic than the reference, or are both drifting by bf16 rounding?
        say("decode beyond the limit: fp32 oracle of the decode steps")
        oracle_logits = _fp32_oracle_decode_logits(built.model, inputs.ids, runs.ref_decode.tokens)
        if oracle_logits is not None:
            decode = check_decode(runs.fast_decode, runs.ref_decode, tol, oracle_logits)
    return decode


def verify_model(
    source: str | ResolvedModel,
    *,
    dtype: str | None = None,
    seq_len: int = 64,
    batch: int = 2,
    packed: bool = False,
    backward: bool = False,
    layers: int | None = None,
    decode_tokens: int = 8,
    device: str | None = None,
    seed: int = 0,
    enable_kwargs: dict[str, Any] | None = None,
    reference: str = "torch",
    progress: Callable[[str], None] | None = None,
    note: Callable[[str], None] | None = None,
    check_memory: bool = True,
    liger: bool = False,
) -> VerifyResult:
    """Run `source` on the reference path and on the fast path; compare (see verify's module doc).

    source: the command's ResolvedModel (layers, dtype, device left unset: they are its own), or
    what the user typed, resolved here with layers, dtype (default fp32), device (default auto).
    enable_kwargs go to enable() (tests route deliberately wrong kernels this way).
    reference="torch": transformers' torch fallbacks are the reference even where Dao
    causal-conv1d / FLA are installed (see hidden_compiled_peers); "transformers": whatever
    transformers binds in this environment. check_memory: size the job first and refuse
    (UsageError) when it will not fit (models/sizing.py). fastpath is left disabled afterwards.
    """
    run = _Settings(seq_len, batch, packed, backward, decode_tokens, seed, dict(enable_kwargs or {}), reference,
                    check_memory, liger, progress or (lambda _msg: None), note or (lambda _msg: None))
    from fastpath.models.dtypes import dtype_label
    from fastpath.proof.verdict import collect_problems

    built, size = _size_and_build(source, layers, dtype, device, run)
    tol = TOLERANCES[dtype_label(built.dtype)]
    inputs = make_inputs(built.vocab_size, batch, seq_len, packed, seed, built.device)
    if liger:  # on both paths: the comparison is fastpath's, under Liger's kernels (verify.py)
        from fastpath.routing.liger_route import apply_liger

        built.notes.append(f"Liger Kernel on both paths: {apply_liger(built.model)}")
    if backward:
        built.model.requires_grad_(True)
    runs = _run_both_paths(built, inputs, run)

    pin_line = runs.pins.report.line()
    if pin_line:
        built.notes.append(pin_line)
    run.say("comparing")
    diffs, logits, counts = _compare_outputs(built, inputs, runs, tol, run.say)
    grads = _compare_gradients(built, inputs, runs, tol, run.say) if backward else None
    decode = _compare_decode(built, inputs, runs, tol, run.say) if decode_tokens else None
    problems = counts + collect_problems(diffs, logits, grads, decode, tol, fast_calls=runs.fast_calls,
                                         ref_calls=runs.ref_calls, explain_rows=runs.explain_rows if packed else None)

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
        reference_calls=runs.ref_calls,
        fast_calls=runs.fast_calls,
        enable_report=runs.report,
        explain=runs.explain_rows,
        problems=problems,
        reference_explain=runs.reference_rows,
        sizing=size.to_json() if size is not None else {},
    )
