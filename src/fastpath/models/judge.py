"""Judging `fastpath verify`'s two runs in one call: every hidden state, the logits, the
gradients and the greedy decode, fast path against reference (the maths: models/compare.py).

Where a difference is beyond the dtype's limit, a run of the reference says whose rounding it is
(models/forward.py): an fp32 copy of the model in bf16/fp16, the reference's own rounding noise
in fp32. Each costs a copy of the model or several passes, so it runs only then, one at a time,
and is freed before the next comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastpath.models.compare import (
    NOISE_RUNS,
    DecodeCheck,
    GradDiff,
    TensorDiff,
    Tolerance,
    check_decode,
    compare,
    compare_grads,
    judge_by_noise,
    judge_by_oracle,
)
from fastpath.models.forward import (
    FusedLoss,
    PathRun,
    Tf32Off,
    fp32_oracle_decode_logits,
    fp32_oracle_outputs,
    rounding_noise,
)
from fastpath.models.inputs import Inputs

if TYPE_CHECKING:
    from fastpath.models.build import BuiltModel
    from fastpath.models.moe_pin import TopkPin


@dataclass
class Judgement:
    """Everything verify reports of the comparison (proof/verdict.py draws the verdict from it)."""

    layers: list[TensorDiff]
    logits: TensorDiff
    counts: list[str]  # a problem when the paths returned different numbers of hidden states
    grads: list[GradDiff] | None  # None without a backward pass
    decode: DecodeCheck | None  # None without a decode


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
    """Whether a run's first hidden state is the embeddings (most families) or the first layer's
    output (Mamba-style families), for layer_names."""
    import torch

    with torch.no_grad():
        embedded = model.get_input_embeddings()(ids)
    return embedded.shape == first_hidden.shape and bool(torch.equal(embedded, first_hidden))


def judge(built: BuiltModel, inputs: Inputs, ref: PathRun, fast: PathRun, tol: Tolerance, *,
          oracle_grads: dict[str, Any] | None, pin: TopkPin, fused_loss: FusedLoss | None,
          say: Callable[[str], None]) -> Judgement:
    """Fast path against reference: the outputs, then the gradients (when the runs carry them),
    then the decode (when they decoded), each re-judged by a run of the reference where beyond
    `tol`. Runs on the model as the caller left it: the reference path active.

    oracle_grads: the fp32 copy's gradients (bf16/fp16 backward; taken before either path ran,
    while no gradients were held). pin: the reference's MoE top-k choices, replayed by the fp32
    copy. fused_loss: how the noise runs take a fused loss (models/forward.FusedLoss).
    """
    layers, logits, counts = _judge_outputs(built, inputs, ref, fast, tol, pin, say)
    grads = None
    if ref.grads is not None:
        grads = _judge_grads(built, inputs, ref, fast, tol, oracle_grads, fused_loss, say)
    decode = _judge_decode(built, inputs, ref, fast, tol, say) if ref.decode is not None else None
    return Judgement(layers, logits, counts, grads, decode)


def _judge_outputs(built: BuiltModel, inputs: Inputs, ref: PathRun, fast: PathRun, tol: Tolerance,
                   pin: TopkPin, say: Callable[[str], None]) -> tuple[list[TensorDiff], TensorDiff, list[str]]:
    """Every layer's hidden states and the logits (an fp32 run of the reference judges the ones
    beyond the limit in bf16/fp16); a problem when the paths returned different numbers of states."""
    import torch

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
        oracle_run = fp32_oracle_outputs(built.model, inputs, pin)
        diffs = judge_by_oracle(diffs, fast.hidden, ref.hidden, oracle_run.hidden)
        logits = judge_by_oracle([logits], [fast.logits], [ref.logits], [oracle_run.logits])[0]
        del oracle_run
    return diffs, logits, counts


def _judge_grads(built: BuiltModel, inputs: Inputs, ref: PathRun, fast: PathRun, tol: Tolerance,
                 oracle_grads: dict[str, Any] | None, fused_loss: FusedLoss | None,
                 say: Callable[[str], None]) -> list[GradDiff]:
    """Every parameter gradient; in fp32, the ones beyond the limit are judged against the
    reference's own rounding noise (models/compare.judge_by_noise)."""
    import torch

    grads = compare_grads(fast.grads, ref.grads, tol, oracle_grads)
    beyond = [g.name for g in grads if not g.ok and g.rel == g.rel and g.rel != float("inf")]
    if beyond and built.dtype == torch.float32 and ref.grads is not None:
        say(f"{len(beyond)} gradients beyond {tol.grad_rel:g}: measuring the reference's own rounding noise "
            f"({NOISE_RUNS} runs with every weight moved by one rounding step)")
        with Tf32Off():
            noise = rounding_noise(built.model, inputs, ref.grads, beyond, NOISE_RUNS, fused_loss)
        grads = judge_by_noise(grads, noise)
    return grads


def _judge_decode(built: BuiltModel, inputs: Inputs, ref: PathRun, fast: PathRun, tol: Tolerance,
                  say: Callable[[str], None]) -> DecodeCheck:
    """The greedy decodes; in bf16/fp16 a mismatch is judged against fp32 logits of the
    reference's tokens."""
    import torch

    decode = check_decode(fast.decode, ref.decode, tol)
    if not decode.ok and built.dtype != torch.float32:
        # Only now (it costs an fp32 copy of the model): is the fast path further from exact
        # arithmetic than the reference, or are both drifting by bf16 rounding?
        say("decode beyond the limit: fp32 oracle of the decode steps")
        oracle_logits = fp32_oracle_decode_logits(built.model, inputs.ids, ref.decode.tokens)
        if oracle_logits is not None:
            decode = check_decode(fast.decode, ref.decode, tol, oracle_logits)
    return decode
