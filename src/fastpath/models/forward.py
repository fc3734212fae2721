"""Running a model and collecting what `fastpath verify` compares on its inputs (models/inputs.py):
one pass on whatever path is active (hidden states, logits, optional gradients; verify's two
sides around it are models/sides.py), and the runs that judge a difference (models/judge.py):
an fp32 copy of the reference, and the reference with every weight nudged by one rounding step.

Which path is active is the caller's business (routing.engine enable / disable sits above this
floor): everything here runs the model as it is now. A fused loss (Liger's, enable()'s LM head)
is recognised by a `FusedLoss` the caller passes in, for the same reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastpath.models.compare import NOISE_RUNS, FirstLook, Tolerance, relative_distance
from fastpath.models.inputs import Inputs
from fastpath.models.moe_pin import PinReport, TopkPin

# Given a model, the mean next-token loss of `ids` through its fused LM head + cross-entropy (a
# forward that returns the loss and no logits), or None when no such forward is in place.
FusedLoss = Callable[[Any], Callable[[Any], Any] | None]

# ---------------------------------------------------------------------------------------------
# Running one path


@dataclass
class PathRun:
    """What one pass computed; `decode` (a models/greedy GreedyRun) when the side also decoded."""

    hidden: list[Any]
    logits: Any
    grads: dict[str, Any] | None
    decode: Any = None


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


def _forward(model: Any, ids: Any, backward: bool, denom: int, fused_loss: FusedLoss | None,
             **kwargs: Any) -> tuple[list[Any], Any]:
    import torch

    loss_of = fused_loss(model) if backward and not kwargs and fused_loss is not None else None
    if loss_of is not None:
        # The loss a training call takes: Liger's fused linear cross-entropy (verify --liger) or
        # enable()'s fused LM head + cross-entropy, a mean over the B x (L-1) predictions (scaled
        # to the same sum / denom); the logits, which that call does not return, from a no-grad pass.
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        loss = loss_of(ids)
        (loss * (ids.shape[0] * (ids.shape[1] - 1)) / denom).backward()
        return [h.detach() for h in out.hidden_states], out.logits.detach()
    with torch.set_grad_enabled(backward):
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False, **kwargs)
        if backward:
            (_next_token_loss_sum(out.logits, ids) / denom).backward()
    return [h.detach() for h in out.hidden_states], out.logits.detach()


def run_path(model: Any, inputs: Inputs, *, packed_reference: bool, backward: bool,
             fused_loss: FusedLoss | None = None) -> PathRun:
    """One pass over `inputs` on whatever path is active now.

    packed_reference: run each packed sequence on its own and join the outputs in time — the
    ground truth for a packed batch (transformers' torch fallback ignores seq_idx / cu_seqlens).
    fused_loss: how to take the loss where the model's forward fuses it (see FusedLoss).
    """
    import torch

    model.zero_grad(set_to_none=True)
    if inputs.packed_ids is None:
        ids = inputs.ids
        hidden, logits = _forward(model, ids, backward, ids.shape[0] * (ids.shape[1] - 1), fused_loss)
    elif not packed_reference:
        denom = sum(s - 1 for s in inputs.segments)
        ids = inputs.packed_ids
        with torch.set_grad_enabled(backward):
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False, **inputs.packed_kwargs)
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
            h, lg = _forward(model, seg, backward, denom, fused_loss)
            pieces_h.append(h)
            pieces_l.append(lg)
            start += length
        hidden = [torch.cat([p[i] for p in pieces_h], dim=1) for i in range(len(pieces_h[0]))]
        logits = torch.cat(pieces_l, dim=1)
    grads = _collect_grads(model) if backward else None
    return PathRun(hidden, logits, grads)


# ---------------------------------------------------------------------------------------------
# The runs that judge a difference


class Tf32Off:
    """Context: real fp32 matmuls and convolutions on CUDA (both default to TF32 somewhere)."""

    def __enter__(self) -> None:
        import torch

        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


@contextlib.contextmanager
def _fp32_copy(model: Any) -> Iterator[Any]:
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
        with Tf32Off():
            yield oracle.float()
    finally:
        del oracle
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def fp32_oracle_grads(model: Any, inputs: Inputs, fused_loss: FusedLoss | None = None) -> dict[str, Any]:
    """Gradients of an fp32 copy of `model` on the active (reference) path, in the model's dtype
    layout; the copy is freed before returning."""
    with _fp32_copy(model) as oracle:
        grads = run_path(oracle, inputs, packed_reference=True, backward=True, fused_loss=fused_loss).grads or {}
        del oracle  # the last reference: _fp32_copy's exit returns its memory
    return grads


def fp32_oracle_outputs(model: Any, inputs: Inputs, pin: TopkPin) -> PathRun:
    """Hidden states and logits of an fp32 copy on the reference path (no gradients), with the
    reference's MoE choices (`pin`) replayed so a near-tied router does not pick other experts."""
    with _fp32_copy(model) as oracle, pin.replaying(PinReport()):
        run = run_path(oracle, inputs, packed_reference=True, backward=False)
        del oracle
    return run


def fp32_oracle_decode_logits(model: Any, prompt: Any, tokens: Any) -> list[Any] | None:
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


def rounding_noise(model: Any, inputs: Inputs, reference: dict[str, Any], names: list[str], runs: int,
                   fused_loss: FusedLoss | None = None) -> dict[str, float]:
    """How far the reference path's gradients of `names` move (relative distance from `reference`) when
    every weight moves by one rounding step (largest of `runs` runs; models/compare.py
    judge_by_noise says why). Only `names` get gradients; the weights are restored exactly. {}
    when it cannot run."""
    params = dict(model.named_parameters())
    wanted = {n: p.requires_grad for n, p in params.items()}
    noise: dict[str, float] = {}
    try:
        for n, p in params.items():
            p.requires_grad_(n in names)
        for run in range(runs):
            _nudge_weights(model, run + 1, 1)
            try:
                grads = run_path(model, inputs, packed_reference=True, backward=True,
                                 fused_loss=fused_loss).grads or {}
            finally:
                _nudge_weights(model, run + 1, -1)
            for n in names:
                if grads.get(n) is not None and reference.get(n) is not None:
                    noise[n] = max(noise.get(n, 0.0), relative_distance(grads[n], reference[n]))
    except Exception:  # no room for another pass: the failures stand as measured
        return {}
    finally:
        for n, p in params.items():
            p.requires_grad_(wanted[n])
        model.zero_grad(set_to_none=True)
    return noise


@dataclass
class OracleRuns:
    """The runs of the reference a first look asked for (models/compare.FirstLook); None / {}
    where none was asked for or it could not run."""

    hidden: list[Any] | None = None  # an fp32 copy's hidden states on the reference path
    logits: Any = None  # and its logits
    noise: dict[str, float] = field(default_factory=dict)  # rounding_noise, per gradient name
    decode_logits: list[Any] | None = None  # fp32 logits along the reference's decoded tokens


def oracle_runs(model: Any, inputs: Inputs, look: FirstLook, ref: PathRun, tol: Tolerance, *, pin: TopkPin,
                fused_loss: FusedLoss | None, say: Callable[[str], None]) -> OracleRuns:
    """Run what `look` asked for, one at a time, each freed before the next begins: in bf16/fp16
    an fp32 copy of the outputs (replaying the reference's MoE choices, `pin`) and of the decode
    steps; in fp32 the reference's own rounding noise on the gradients beyond the limit."""
    runs = OracleRuns()
    if look.outputs_oracle:
        say("hidden states beyond the limit: fp32 run of the reference path")
        oracle_run = fp32_oracle_outputs(model, inputs, pin)
        runs.hidden, runs.logits = oracle_run.hidden, oracle_run.logits
    if look.decode_oracle:
        # Only now (it costs an fp32 copy of the model): is the fast path further from exact
        # arithmetic than the reference, or are both drifting by bf16 rounding?
        say("decode beyond the limit: fp32 oracle of the decode steps")
        runs.decode_logits = fp32_oracle_decode_logits(model, inputs.ids, ref.decode.tokens)
    if look.noise_names and ref.grads is not None:
        say(f"{len(look.noise_names)} gradients beyond {tol.grad_rel:g}: measuring the reference's own rounding "
            f"noise ({NOISE_RUNS} runs with every weight moved by one rounding step)")
        with Tf32Off():
            runs.noise = rounding_noise(model, inputs, ref.grads, look.noise_names, NOISE_RUNS, fused_loss)
    return runs
