"""LM head + cross-entropy for training without materialising the logits, one GEMM each.

    loss = linear_cross_entropy(hidden (N, H), weight (V, H), labels (N,), ignore_index=-100,
                                reduction="mean" | "sum", bias=None, chunk_rows=None)

What it does: rows of `hidden` go through in chunks. Per chunk, one cuBLAS GEMM writes the chunk's
logits in the input dtype; one Triton kernel (fwd_bwd.py) turns them, in place, into per-row
losses and d loss / d logits (the gradient is known in the forward: loss is a scalar); then the two
backward GEMMs run at once on that chunk: dhidden[rows] = dlogits @ W (complete: each row is in one
chunk) and dW += dlogits.T @ hidden[rows] (float32 accumulator when there is more than one chunk
and W is not float32; cast to W's dtype at the end). backward() only scales the stored dhidden /
dW / dbias by the incoming gradient (skipped when it is exactly 1). So each GEMM runs once, as in
the materialised computation, and nothing of size (N, V) outlives the call: at most one chunk of
logits (rows such that the chunk in float32 would be <= CHUNK_BYTES, 1 GiB: 1024 rows at
V=248,320, so cuBLAS sees large GEMMs) and, with several chunks and a 16-bit W, the float32 dW
accumulator (V x H x 4 bytes while the call runs). Where all rows' logits in their own dtype cost
no more than a chunk plus that accumulator, the default is one chunk (chunk_rows_for): at
Qwen3.5-27B's head and 4,096 tokens, 2.0 GB of bf16 logits instead of 0.5 + 5.1 GB, dW in one GEMM.
Liger Kernel's fused linear cross-entropy fuses the same way, but sizes chunks by V/H (~128 rows
at Qwen3.5-27B's shape), and its many small GEMMs run below cuBLAS's peak there
(https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/fused_linear_cross_entropy.py).

Numbers: the logits are rounded to the input dtype by the GEMM and the loss is computed from them
in float32, as transformers' ForCausalLMLoss (`logits.float()` then cross_entropy) does; dlogits is
rounded once to the input dtype before the backward GEMMs, as autograd does through that upcast.
The loss is float32 (float64 for float64 inputs). reduction="mean" divides by the number of labels != ignore_index over the
whole batch (torch's rule): every label ignored gives NaN (torch's cross_entropy gives NaN too) with
zero gradients; "sum" gives 0. A label outside [0, V) (other than ignore_index) raises on CPU
tensors and makes the loss NaN on a GPU (torch device-asserts; no host sync is spent to check).

Where it runs: Triton for the chunk step on CUDA (and on CPU under TRITON_INTERPRET=1), else the
float32 torch step in naive.py (CPU users get the same numbers, slower). Dtypes float32 / float16 /
bfloat16 (hidden, weight and bias in one dtype, as F.linear wants); float64 runs the torch step.
Ops (namespace "fastpath"): linear_ce_fwd(hidden, weight, labels, bias, ignore_index, reduction,
chunk_rows, need_dx, need_dw) -> (loss, dx, dw, dbias), with a fake implementation and registered
autograd so torch.compile keeps it in one graph; eager callers skip the dispatcher, as
zc_rmsnorm/interface.py does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fastpath.kernels.counters import CALLS
from fastpath.kernels.dispatch import dtypes_fit, use_triton
from fastpath.kernels.linear_ce import naive

FAMILY = "linear_ce"
REDUCTIONS = ("mean", "sum")
#: a chunk's logits, counted in float32, stay within this many bytes (the tunable: chunk_rows=)
CHUNK_BYTES = 1 << 30
_ROW_ALIGN = 64  # chunk rows a multiple of this when there are more: whole GEMM tiles


def chunk_rows_for(n_rows: int, n_cols: int, chunk_bytes: int = CHUNK_BYTES, *, width: int = 0,
                   itemsize: int = 4, accumulate: bool = False) -> int:
    """Rows per chunk: the most whose float32 logits fit `chunk_bytes` (a multiple of 64 when
    that is more than 64), then evened out so the last chunk is not a sliver.

    accumulate (dW wanted in a 16-bit dtype): more than one chunk needs a float32 (V, width)
    accumulator, so when all rows' logits in their own dtype take no more than a chunk plus that
    accumulator, one chunk is both leaner and faster (dW in one GEMM, as the materialised path
    rounds it). Qwen3.5-27B's head at 4,096 tokens: 2.0 GB of bf16 logits vs 0.5 GB + 5.1 GB."""
    cap = max(1, chunk_bytes // max(4 * n_cols, 1))
    if cap > _ROW_ALIGN:
        cap -= cap % _ROW_ALIGN
    if accumulate and n_rows * n_cols * itemsize <= cap * n_cols * itemsize + n_cols * width * 4:
        return max(1, n_rows)
    n_chunks = max(1, math.ceil(n_rows / cap))
    return max(1, math.ceil(n_rows / n_chunks))


def _check(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None, reduction: str) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: hidden {tuple(hidden.shape)} must be (N, H) and weight "
                         f"{tuple(weight.shape)} (V, H)")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: labels {tuple(labels.shape)} must be ({hidden.shape[0]},)")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"linear_cross_entropy: labels must be integers, got {labels.dtype}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear_cross_entropy: bias {tuple(bias.shape)} must be ({weight.shape[0]},)")
    dtypes = {hidden.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) != 1 or not hidden.dtype.is_floating_point:
        raise ValueError(f"linear_cross_entropy: hidden, weight and bias must share one floating dtype, "
                         f"got {sorted(map(str, dtypes))}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if weight.shape[0] == 0:
        raise ValueError("linear_cross_entropy: weight has no rows (V = 0)")


def _check_labels_on_host(labels: Tensor, n_cols: int, ignore_index: int) -> None:
    """CPU labels are checked (free); a GPU check would cost a host sync (the loss says NaN)."""
    if labels.device.type != "cpu" or not labels.numel():
        return
    bad = ((labels < 0) | (labels >= n_cols)) & (labels != ignore_index)
    if bool(bad.any()):
        value = int(labels[bad][0])
        raise ValueError(f"linear_cross_entropy: label {value} is outside [0, {n_cols}) and is not "
                         f"ignore_index ({ignore_index})")


_OUT_DTYPE: dict[torch.dtype, bool] = {}  # whether torch's mm/addmm take out_dtype for these inputs


def _dw_into(acc: Tensor, dlogits: Tensor, x: Tensor, first: bool) -> None:
    """acc (+)= dlogits.T @ x: cuBLAS with a float32 output from 16-bit inputs where torch has
    it (mm/addmm out_dtype), else a 16-bit product added in float32."""
    if acc.dtype == dlogits.dtype:
        if first:
            torch.mm(dlogits.t(), x, out=acc)
        else:
            acc.addmm_(dlogits.t(), x)
        return
    if acc.is_cuda and _OUT_DTYPE.get(dlogits.dtype, True):
        try:
            if first:
                torch.mm(dlogits.t(), x, out_dtype=acc.dtype, out=acc)
            else:
                torch.addmm(acc, dlogits.t(), x, out_dtype=acc.dtype, out=acc)
            _OUT_DTYPE[dlogits.dtype] = True
            return
        except (RuntimeError, TypeError):
            _OUT_DTYPE[dlogits.dtype] = False  # this torch has no such GEMM: not asked again
    part = torch.mm(dlogits.t(), x)
    if first:
        acc.copy_(part)
    else:
        acc.add_(part)


def fwd_impl(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None, ignore_index: int,
             reduction: str, chunk_rows: int, need_dx: bool, need_dw: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss float32 scalar, dhidden (N, H) or empty, dweight (V, H) in weight's dtype or empty,
    dbias (V,) or empty) for an incoming gradient of 1. chunk_rows <= 0: chunk_rows_for()."""
    _check(hidden, weight, labels, bias, reduction)
    n_rows, width = hidden.shape
    n_cols = weight.shape[0]
    _check_labels_on_host(labels, n_cols, ignore_index)
    device, dtype = hidden.device, hidden.dtype
    need_db = need_dw and bias is not None
    write_grad = need_dx or need_dw
    sixteen_bit = dtype not in (torch.float32, torch.float64)
    rows = chunk_rows if chunk_rows > 0 else chunk_rows_for(
        n_rows, n_cols, width=width, itemsize=hidden.element_size(), accumulate=need_dw and sixteen_bit)
    n_chunks = max(1, math.ceil(n_rows / rows))

    counted = labels != ignore_index
    count = counted.sum()
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # loss / scale / dbias
    if reduction == "mean":
        scale = (1.0 / count.clamp_min(1).to(torch.float64)).to(wide).reshape(1)
    else:
        scale = torch.ones(1, device=device, dtype=wide)

    triton_ok = bool(n_rows) and use_triton(hidden) and dtypes_fit("fwd", FAMILY, hidden, weight, bias)
    if triton_ok:
        from fastpath.kernels.linear_ce.fwd_bwd import ce_rows_ as step
    else:
        step = naive.ce_rows_ref_
    CALLS[f"linear_ce_fwd:{'triton' if triton_ok else 'reference'}"] += 1

    dx = torch.empty((n_rows, width), device=device, dtype=dtype) if need_dx else hidden.new_empty(0)
    acc_dtype = torch.float32 if (n_chunks > 1 and sixteen_bit) else dtype
    dw_acc = torch.empty((n_cols, width), device=device, dtype=acc_dtype) if need_dw else None
    if need_dw and n_rows == 0:
        dw_acc.zero_()
    db_acc = torch.zeros(n_cols, device=device, dtype=wide) if need_db else None
    loss_sum = torch.zeros((), device=device, dtype=wide)
    buf = torch.empty((min(rows, n_rows), n_cols), device=device, dtype=dtype)
    w_t = weight.t()
    for i, start in enumerate(range(0, n_rows, rows)):
        x = hidden[start:start + rows]
        logits = buf[:x.shape[0]]
        if bias is None:
            torch.mm(x, w_t, out=logits)
        else:
            torch.addmm(bias, x, w_t, out=logits)
        loss_rows = step(logits, labels[start:start + rows], scale, ignore_index, write_grad=write_grad)
        loss_sum += loss_rows.sum()
        if need_dx:
            torch.mm(logits, weight, out=dx[start:start + rows])
        if dw_acc is not None:
            _dw_into(dw_acc, logits, x, first=i == 0)
        if db_acc is not None:
            db_acc += logits.sum(0, dtype=wide)
    del buf
    loss = loss_sum / count.to(wide) if reduction == "mean" else loss_sum
    dw = hidden.new_empty(0) if dw_acc is None else dw_acc.to(weight.dtype)
    db = hidden.new_empty(0) if db_acc is None else db_acc.to(bias.dtype)  # type: ignore[union-attr]
    return loss, dx, dw, db


def _is_one(g: Tensor) -> bool:
    """Whether the incoming gradient is exactly 1 (a host read; not while a CUDA graph records)."""
    if g.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return bool(g == 1)


def _scaled(t: Tensor, g: Tensor, one: bool) -> Tensor:
    return t if one else (t * g).to(t.dtype)


class _LinearCEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, bias, ignore_index, reduction, chunk_rows):  # type: ignore[override]
        need_dx = ctx.needs_input_grad[0]
        need_dw = ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[3])
        loss, dx, dw, db = fwd_impl(hidden, weight, labels, bias, ignore_index, reduction, chunk_rows,
                                    need_dx, need_dw)
        # held as attributes and dropped in backward: the gradients' only owner is then autograd,
        # which moves a sole-owner dW into weight.grad instead of copying it (2.5 GB at 27B)
        ctx.grads = (dx, dw, db)
        ctx.flags = (need_dx, ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
        return loss

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError("linear_cross_entropy: backward ran twice through one graph "
                               "(retain_graph=True); its gradients are computed once, in the forward")
        dx, dw, db = ctx.grads
        ctx.grads = None
        want_dx, want_dw, want_db = ctx.flags
        one = _is_one(grad)
        return (_scaled(dx, grad, one) if want_dx else None, _scaled(dw, grad, one) if want_dw else None,
                None, _scaled(db, grad, one) if want_db else None, None, None, None)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int = -100,
                         reduction: str = "mean", bias: Tensor | None = None,
                         chunk_rows: int | None = None) -> Tensor:
    """cross_entropy(hidden @ weight.T + bias, labels) as a float32 scalar, without the (N, V)
    logits; gradients for hidden / weight / bias are computed in this call where they are wanted.
    chunk_rows: rows of logits per chunk (default: chunk_rows_for, ~1 GiB of float32)."""
    rows = int(chunk_rows or 0)
    if chunk_rows is not None and rows <= 0:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be positive, got {chunk_rows}")
    ignore_index = int(ignore_index)
    if torch.compiler.is_compiling():
        return linear_ce_fwd(hidden, weight, labels, bias, ignore_index, reduction, rows,
                             hidden.requires_grad, weight.requires_grad or (bias is not None and bias.requires_grad))[0]
    wants = [t is not None and t.requires_grad for t in (hidden, weight, bias)]
    if torch.is_grad_enabled() and any(wants):
        return _LinearCEFunction.apply(hidden, weight, labels, bias, ignore_index, reduction, rows)
    return fwd_impl(hidden, weight, labels, bias, ignore_index, reduction, rows, False, False)[0]


linear_ce_fwd = torch.library.custom_op("fastpath::linear_ce_fwd", fwd_impl, mutates_args=())


@linear_ce_fwd.register_fake
def _fwd_fake(hidden, weight, labels, bias, ignore_index, reduction, chunk_rows, need_dx, need_dw):
    loss = hidden.new_empty((), dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32)
    dx = hidden.new_empty(hidden.shape) if need_dx else hidden.new_empty(0)
    dw = weight.new_empty(weight.shape) if need_dw else weight.new_empty(0)
    db = bias.new_empty(bias.shape) if (need_dw and bias is not None) else hidden.new_empty(0)
    return loss, dx, dw, db


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*output[1:])
    ctx.has_bias = inputs[3] is not None


def _backward(ctx, grad, *_unused):
    dx, dw, db = ctx.saved_tensors
    want = ctx.needs_input_grad
    return ((dx * grad).to(dx.dtype) if want[0] and dx.numel() else None,
            (dw * grad).to(dw.dtype) if want[1] and dw.numel() else None,
            None,
            (db * grad).to(db.dtype) if ctx.has_bias and want[3] and db.numel() else None,
            None, None, None, None, None)


linear_ce_fwd.register_autograd(_backward, setup_context=_setup_context)
