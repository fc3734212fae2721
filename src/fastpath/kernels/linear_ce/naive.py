"""The spec of the LM head + cross-entropy, and the torch version of the chunk step.

    logits = hidden @ weight.T (+ bias)                       (N, V)
    loss_i = logsumexp(logits_i) - logits_i[label_i]          0 where label_i == ignore_index
    loss   = sum_i loss_i / #{i: label_i != ignore_index}     (reduction "mean", torch's rule:
             NaN when every label is ignored) or sum_i loss_i (reduction "sum": 0 then)
    dlogits_i = (softmax(logits_i) - onehot(label_i)) * g / count   (0 on ignored rows)
    dhidden = dlogits @ weight,  dweight = dlogits.T @ hidden,  dbias = dlogits.sum(0)

`linear_ce_ref` computes it materialised in a chosen float precision (tests call it in float64 and
take gradients through autograd). `ce_rows_ref_` is the chunk step of interface.py in torch float32
ops, what runs where the Triton kernel cannot (CPU without TRITON_INTERPRET=1, float64).
"""

from __future__ import annotations

import torch
from torch import Tensor


def linear_ce_ref(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  compute: torch.dtype = torch.float64) -> Tensor:
    """The loss in `compute`, through torch's own cross_entropy over materialised logits."""
    logits = hidden.to(compute) @ weight.to(compute).T
    if bias is not None:
        logits = logits + bias.to(compute)
    return torch.nn.functional.cross_entropy(logits, labels.long(), ignore_index=ignore_index,
                                             reduction=reduction)


def ce_rows_ref_(logits: Tensor, labels: Tensor, scale: Tensor, ignore_index: int,
                 write_grad: bool = True) -> Tensor:
    """fwd_bwd.ce_rows_ in torch: per-row float32 (float64 for float64 logits) loss (NaN for a label outside [0, V)); with
    write_grad, (softmax - onehot) * scale (0 on ignored rows) stored over `logits`."""
    n_cols = logits.shape[1]
    x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    m = x.max(dim=1).values  # the log-sum-exp kept as m and log(s), as the kernel does
    s = torch.exp(x - m[:, None]).sum(dim=1)
    labels = labels.long()
    ignored = labels == ignore_index
    bad = (labels < 0) | (labels >= n_cols)
    safe = labels.clamp(0, max(n_cols - 1, 0))
    target = x.gather(1, safe[:, None]).squeeze(1)
    nan = torch.full_like(m, float("nan"))
    loss = torch.where(ignored, torch.zeros_like(m), torch.where(bad, nan, (m - target) + torch.log(s)))
    if write_grad:
        row_scale = torch.where(ignored, torch.zeros_like(m),
                                torch.where(bad, nan, scale.to(x.dtype).expand_as(m)))
        grad = torch.exp(x - m[:, None]) / s[:, None]
        rows = torch.arange(x.shape[0], device=x.device)
        grad[rows, safe] -= (~ignored & ~bad).to(grad.dtype)
        logits.copy_(grad * row_scale[:, None])
    return loss
