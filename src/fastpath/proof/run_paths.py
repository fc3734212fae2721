"""`fastpath verify`'s orchestration: the model resolved, sized and built (models/), both paths
run on it (the reference with fastpath disabled, then the fast path after enable(): routing is
this floor's business), one judge call over the two runs (models/judge.py), the verdict
(proof/verdict.py). Running a pass and the fp32 oracles live in models/forward.py.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastpath.models.build import BuiltModel, ResolvedModel, resolve_model
from fastpath.models.compare import TOLERANCES
from fastpath.models.forward import Inputs, PathRun, Tf32Off, fp32_oracle_grads, make_inputs
from fastpath.models.forward import run_path as run_model_path
from fastpath.models.moe_pin import PinReport, TopkPin
from fastpath.models.paths import hidden_compiled_peers
from fastpath.proof.verdict import CannotVerify, VerifyResult
from fastpath.shared.errors import FastpathError, UsageError, first_line

# ---------------------------------------------------------------------------------------------
# Running one path


def _fused_loss(model: Any) -> Callable[[Any], Any] | None:
    """The training loss of `model` where its forward fuses the LM head with the loss and returns
    no logits: Liger's fused linear cross-entropy (verify --liger) or enable()'s fused LM head;
    None otherwise. Handed to models/forward.run_path, which cannot import routing."""
    from fastpath.routing import lm_head_route
    from fastpath.routing.liger_route import fused_loss_in_place, next_token_loss

    if fused_loss_in_place(model):
        return lambda ids: next_token_loss(model, ids)
    if lm_head_route.fused_loss_in_place(model):
        return lambda ids: model(input_ids=ids, labels=ids, use_cache=False).loss
    return None


def run_path(model: Any, inputs: Inputs, *, packed_reference: bool, backward: bool) -> PathRun:
    """One pass over `inputs` on whatever path is active now (models/forward.run_path), with
    routing's fused losses taken as a training call takes them."""
    return run_model_path(model, inputs, packed_reference=packed_reference, backward=backward,
                          fused_loss=_fused_loss)


# ---------------------------------------------------------------------------------------------
# The whole verification


@dataclass
class _Pins:
    """The reference's top-k choices (models/moe_pin.py): recorded on the reference side, replayed
    on the fast side, so an MoE router's discrete choice is the same on both paths."""

    forward: TopkPin = field(default_factory=TopkPin)
    decode: TopkPin = field(default_factory=TopkPin)
    report: PinReport = field(default_factory=PinReport)


def _run_side(name: str, model: Any, inputs: Inputs, *, packed_reference: bool, backward: bool,
              decode_tokens: int, say: Callable[[str], None],
              pins: _Pins | None = None) -> tuple[PathRun, dict[str, int]]:
    """One side of the comparison: forward (+ backward), optional greedy decode (the run's
    `decode`), and the kernel calls it made (counted at the kernels' own entry points). `pins`:
    the reference side (packed_reference) records its top-k choices there, the fast side replays them."""
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
    if decode_tokens:
        say(f"{name}: greedy decode")
        with pinned(pins.decode if pins else TopkPin(), 1):
            run.decode = greedy_decode(model, inputs.ids, decode_tokens)
    return run, _call_delta(before, Counter(CALLS))


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
    ref_calls: dict[str, int]
    fast: PathRun
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
    tf32 = Tf32Off() if built.dtype == torch.float32 else contextlib.nullcontext()

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
            oracle_grads = fp32_oracle_grads(model, inputs, _fused_loss)
        pins = _Pins()
        ref, ref_calls = _run_side("reference path", model, inputs, packed_reference=True, pins=pins, **sides)

        step("enable()")
        report = routes.enable(**run.enable_kwargs)
        explain_rows = _explain_rows(model)
        if built.device.type == "cuda" and any(str(r.get("impl", "")).startswith("fla") for r in explain_rows):
            # H200: a cold Triton cache made this step outlast a 150 s limit
            run.tell("note: FLA's kernels compile and autotune at their first call for these head sizes "
                     "(minutes with an empty Triton cache; cached for later runs)")
        fast, fast_calls = _run_side("fast path", model, inputs, packed_reference=False, pins=pins, **sides)
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
    return _Runs(reference_rows, explain_rows, str(report), ref, ref_calls, fast, fast_calls, oracle_grads, pins)


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
    from fastpath.models.judge import judge
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
    judged = judge(built, inputs, runs.ref, runs.fast, tol, oracle_grads=runs.oracle_grads, pin=runs.pins.forward,
                   fused_loss=_fused_loss, say=run.say)
    problems = judged.counts + collect_problems(judged.layers, judged.logits, judged.grads, judged.decode, tol,
                                                fast_calls=runs.fast_calls, ref_calls=runs.ref_calls,
                                                explain_rows=runs.explain_rows if packed else None)

    return VerifyResult(
        model=built.to_json(),
        dtype=dtype_label(built.dtype),
        batch=batch,
        seq_len=seq_len,
        packed=packed,
        segments=list(inputs.segments),
        tolerance=tol,
        layers=judged.layers,
        logits=judged.logits,
        grads=judged.grads,
        decode=judged.decode,
        reference_calls=runs.ref_calls,
        fast_calls=runs.fast_calls,
        enable_report=runs.report,
        explain=runs.explain_rows,
        problems=problems,
        reference_explain=runs.reference_rows,
        sizing=size.to_json() if size is not None else {},
    )
