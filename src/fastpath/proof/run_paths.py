"""`fastpath verify`'s orchestration, in floor order: the model resolved (models/resolve), what
routing cannot verify refused (routing/), the job sized and the model built (models/); then both
paths run on it in one models/sides.run_sides call (the reference with fastpath disabled, then
the fast path after enable(): routing is this floor's business, running the sides belongs to models/),
one judge call over the two runs (models/judge.py), the verdict (proof/verdict.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastpath.models.build import BuiltModel
from fastpath.models.compare import TOLERANCES
from fastpath.models.forward import PathRun, Tf32Off
from fastpath.models.forward import run_path as run_model_path
from fastpath.models.inputs import Inputs, make_inputs
from fastpath.models.paths import hidden_compiled_peers
from fastpath.models.resolve import ResolvedModel, resolve_model
from fastpath.models.sides import SideRuns, run_sides
from fastpath.models.sizing import JobSize
from fastpath.proof.verdict import CannotVerify, VerifyResult
from fastpath.shared.errors import FastpathError, UsageError, first_line

# ---------------------------------------------------------------------------------------------
# Running one path


def _fused_loss(model: Any) -> Callable[[Any], Any] | None:
    """The training loss of `model` where its forward fuses the LM head with the loss and returns
    no logits: Liger's fused linear cross-entropy (verify --liger) or enable()'s fused LM head;
    None otherwise. Handed to models/ (forward.run_path, sides.run_sides), which cannot import routing."""
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

# What verify can take as the reference path (--reference).
REFERENCES = ("torch", "transformers")


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


def _quiet(_msg: str) -> None:
    """No progress lines (a caller without a Stages)."""


@dataclass
class VerifySettings:
    """What one verification runs, checked when made (check_settings): the command makes it
    before the model source is read, so a bad value costs no read."""

    seq_len: int
    batch: int
    packed: bool
    backward: bool
    decode_tokens: int
    seed: int
    reference: str
    liger: bool
    # Liger on CPU tensors under TRITON_INTERPRET=1 counts as usable (liger_route.check_usable):
    # the library's tests adapt Liger's kernels to the interpreter; the command refuses it
    liger_interpreter: bool = True
    enable_kwargs: dict[str, Any] = field(default_factory=dict)
    check_memory: bool = True
    say: Callable[[str], None] = _quiet  # a stage begins (progress)
    tell: Callable[[str], None] = _quiet  # a line that stays (note)

    def __post_init__(self) -> None:
        check_settings(self.seq_len, self.batch, self.decode_tokens, self.reference)

    @property
    def gdn(self) -> str:
        """The gated-delta-rule route enable() will take (what --packed's refusal depends on)."""
        return str(self.enable_kwargs.get("gated_delta_rule", "auto"))


@dataclass
class _Runs:
    """Both sides of one verification, as they ran, with what routing said around them."""

    reference_rows: list[dict[str, Any]]  # explain() with fastpath disabled
    explain_rows: list[dict[str, Any]]  # explain() after enable()
    report: str  # what enable() said
    sides: SideRuns


def _resolved(source: str | ResolvedModel, layers: int | None, dtype: str | None,
              device: str | None) -> ResolvedModel:
    """The command's ResolvedModel as it is, or `source` resolved with layers / dtype / device."""
    if isinstance(source, ResolvedModel):
        if layers is not None or dtype is not None or device is not None:
            raise TypeError("verify_model: layers, dtype and device are the ResolvedModel's own")
        return source
    return resolve_model(source, layers=layers, dtype=dtype or "fp32", device=device or "auto")


def _size_and_build(model: ResolvedModel, run: VerifySettings) -> tuple[BuiltModel, JobSize | None]:
    """Refuse what cannot be verified, size the job (check_memory) and build the model: every
    UsageError / CannotVerify before the first pass."""
    from fastpath.models.build import build_resolved
    from fastpath.models.sizing import size_job
    from fastpath.routing.fla_route import packed_unverifiable
    from fastpath.routing.liger_route import check_usable

    # With reference="torch" the compiled peers stay hidden until the model is built: sizing
    # builds the module tree on the meta device, which imports the modeling module (and binds).
    peers = hidden_compiled_peers() if run.reference == "torch" else contextlib.nullcontext()
    with peers:
        if run.liger:
            check_usable(model.family, model.device, interpreter_ok=run.liger_interpreter)
        if run.packed and (why := packed_unverifiable(model.config, model.device, run.backward, run.gdn)):
            raise CannotVerify(why)
        size = None
        if run.check_memory:
            run.say("sizing the job")
            size = size_job(model, what=f"verify {model.source.text}", batch=run.batch, seq_len=run.seq_len,
                            backward=run.backward, paths=2)
            for line in size.header():
                run.tell(line)
        note = size.defaults_note() if size is not None else None
        if note:
            run.tell("note: " + note)
        run.say(model.build_line(run.seed))
        built = build_resolved(model, seed=run.seed)
    if note:
        built.notes.append(note)
    return built, size


class _FastSwitch:
    """What happens between the sides (models/sides.run_sides' `to_fast`): enable(), and what
    explain() then says; routing is this floor's business, not models'."""

    def __init__(self, run: VerifySettings, step: Callable[[str], None]) -> None:
        self.run, self.step = run, step
        self.report = ""  # what enable() said
        self.rows: list[dict[str, Any]] = []  # explain() after enable()

    def __call__(self, model: Any) -> None:
        from fastpath.routing import engine as routes

        self.step("enable()")
        self.report = str(routes.enable(**self.run.enable_kwargs))
        self.rows = routes.explain_rows(model)
        if model.device.type == "cuda" and any(str(r.get("impl", "")).startswith("fla") for r in self.rows):
            # H200: a cold Triton cache made this step outlast a 150 s limit
            self.run.tell("note: FLA's kernels compile and autotune at their first call for these head sizes "
                          "(minutes with an empty Triton cache; cached for later runs)")


def _run_both_paths(built: BuiltModel, inputs: Inputs, run: VerifySettings) -> _Runs:
    """The reference path (fastpath disabled), then the fast path (enable()), on one model and one
    set of inputs; fastpath is left disabled. Routing's refusals that need FLA importable come
    first, then Liger on both paths (--liger). A path that raises is one FastpathError line."""
    import torch

    from fastpath.routing import engine as routes
    from fastpath.routing.fla_route import packed_unverifiable
    from fastpath.routing.liger_route import apply_liger

    # FLA importable again: its import and GPU checks (fla_route.packed_unverifiable)
    if run.packed and (why := packed_unverifiable(built.config, built.device, run.backward, run.gdn)):
        raise CannotVerify(why)
    if run.liger:  # on both paths: the comparison is fastpath's, under Liger's kernels (verify.py)
        built.notes.append(f"Liger Kernel on both paths: {apply_liger(built.model)}")
    model = built.model
    stage = _Stage()
    tf32 = Tf32Off() if built.dtype == torch.float32 else contextlib.nullcontext()

    def step(name: str) -> None:
        stage(name)
        run.say(name)

    fast = _FastSwitch(run, step)
    try:
        tf32.__enter__()
        routes.disable()
        reference_rows = routes.explain_rows(model)
        sides = run_sides(model, inputs, backward=run.backward, decode_tokens=run.decode_tokens,
                          oracle_grads=run.backward and built.dtype != torch.float32, say=step, to_fast=fast,
                          fused_loss=_fused_loss)
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
    return _Runs(reference_rows, fast.rows, fast.report, sides)


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
    The settings are checked before `source` is read; then verify_resolved.

    source: a ResolvedModel (layers, dtype, device left unset: they are its own), or what the user
    typed, resolved here with layers, dtype (default fp32), device (default auto).
    enable_kwargs go to enable() (tests route deliberately wrong kernels this way).
    reference="torch": transformers' torch fallbacks are the reference even where Dao
    causal-conv1d / FLA are installed (see hidden_compiled_peers); "transformers": whatever
    transformers binds in this environment. check_memory: size the job first and refuse
    (UsageError) when it will not fit (models/sizing.py). fastpath is left disabled afterwards.
    """
    run = VerifySettings(seq_len=seq_len, batch=batch, packed=packed, backward=backward, decode_tokens=decode_tokens,
                         seed=seed, reference=reference, liger=liger, enable_kwargs=dict(enable_kwargs or {}),
                         check_memory=check_memory, say=progress or _quiet, tell=note or _quiet)
    return verify_resolved(_resolved(source, layers, dtype, device), run)


def verify_resolved(model: ResolvedModel, run: VerifySettings) -> VerifyResult:
    """verify_model on the command's ResolvedModel (read once, by the command) with its checked
    settings: nothing is resolved again."""
    from fastpath.models.judge import judge
    from fastpath.proof.verdict import collect_problems

    built, size = _size_and_build(model, run)
    tol = TOLERANCES[built.dtype_name]
    inputs = make_inputs(built.vocab_size, run.batch, run.seq_len, run.packed, run.seed, built.device)
    if run.backward:
        built.model.requires_grad_(True)
    runs = _run_both_paths(built, inputs, run)

    sides = runs.sides
    pin_line = sides.pins.report.line()
    if pin_line:
        built.notes.append(pin_line)
    run.say("comparing")
    judged = judge(built, inputs, sides, tol, fused_loss=_fused_loss, say=run.say)
    problems = judged.counts + collect_problems(judged.layers, judged.logits, judged.grads, judged.decode, tol,
                                                fast_calls=sides.fast_calls, ref_calls=sides.ref_calls,
                                                explain_rows=runs.explain_rows if run.packed else None)

    return VerifyResult(
        model=built.to_json(),
        dtype=built.dtype_name,
        batch=run.batch,
        seq_len=run.seq_len,
        packed=run.packed,
        segments=list(inputs.segments),
        tolerance=tol,
        layers=judged.layers,
        logits=judged.logits,
        grads=judged.grads,
        decode=judged.decode,
        reference_calls=sides.ref_calls,
        fast_calls=sides.fast_calls,
        enable_report=runs.report,
        explain=runs.explain_rows,
        problems=problems,
        reference_explain=runs.reference_rows,
        sizing=size.to_json() if size is not None else {},
    )
