"""Judging `fastpath verify`'s two runs in one call: every hidden state, the logits, the
gradients and the greedy decode, fast path against reference (the maths: models/compare.py).

Where a difference is beyond the dtype's limit, a run of the reference says whose rounding it is
(models/forward.py): an fp32 copy of the model in bf16/fp16, the reference's own rounding noise
in fp32. Each costs a copy of the model or several passes, so it runs only then, after a first
look at everything has said which are needed, one at a time, each freed before the next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastpath.models.compare import Judgement, Tolerance, final_judgement, first_look
from fastpath.models.forward import FusedLoss, oracle_runs
from fastpath.models.inputs import Inputs
from fastpath.models.sides import SideRuns

if TYPE_CHECKING:
    from fastpath.models.build import BuiltModel


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


def judge(built: BuiltModel, inputs: Inputs, sides: SideRuns, tol: Tolerance, *, fused_loss: FusedLoss | None,
          say: Callable[[str], None]) -> Judgement:
    """Fast path against reference (models/sides.run_sides) in three steps: a first look at
    the outputs, the gradients (when the runs carry them) and the decode (when they decoded)
    against `tol` (models/compare.first_look); the runs of the reference that settle a difference
    beyond it (models/forward.oracle_runs); the final judgement with them
    (models/compare.final_judgement). Runs on the model as the caller left it: the reference
    path active.

    The sides carry the fp32 copy's gradients (bf16/fp16 backward; taken before either path ran,
    while no gradients were held) and the reference's MoE top-k choices, replayed by the fp32
    copy. fused_loss: how the noise runs take a fused loss (models/forward.FusedLoss).
    """
    import torch

    ref, fast = sides.ref, sides.fast
    ids = inputs.packed_ids if inputs.packed_ids is not None else inputs.ids
    names = layer_names(built.layer_types, len(ref.hidden), _starts_with_embeddings(built.model, ids, ref.hidden[0]))
    look = first_look(names, ref, fast, tol, built.dtype != torch.float32, sides.oracle_grads)
    runs = oracle_runs(built.model, inputs, look, ref, tol, pin=sides.pins.forward, fused_loss=fused_loss, say=say)
    return final_judgement(look, ref, fast, tol, oracle_hidden=runs.hidden, oracle_logits=runs.logits,
                           noise=runs.noise, decode_logits=runs.decode_logits)
