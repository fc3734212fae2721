"""PyTorch route for FLA's ``chunk_bwd_dqkwg`` (the gated chunk backward FLA refuses on Hopper).

FLA 0.6.0 raises in ``fla/ops/common/chunk_o.py::chunk_bwd_dqkwg`` for gated inputs on Hopper
with Triton >= 3.4, < 3.7.1 because its Triton kernel ``chunk_bwd_kernel_dqkwg`` miscompiles
there (FLA issue #640). This module recomputes the same outputs with batched matmuls, one batch
entry per (chunk, value head), so it runs on tensor cores through cuBLAS and needs no Triton.

Semantics follow FLA's kernel + wrapper (read from fla-core 0.6.0, fla/ops/common/chunk_o.py;
the code here is our own):

* q, k: [B, T, H, K]; v, do, dv: [B, T, HV, V]; w: [B, T, HV, K]; HV is a multiple of H and
  value head ``i`` reads q/k head ``i // (HV // H)``.
* h, dh: [B, NT, HV, K, V] (``state_v_first``: [B, NT, HV, V, K]); ``h[c]`` is the state entering
  chunk c, ``dh[c]`` the gradient of the state leaving it. Varlen: B == 1 and NT counts the
  chunks of all sequences, in ``chunk_indices`` order.
* Gates are log2-domain chunk-local cumulative sums (``exp2``). ``g``: [B, T, HV] per token;
  ``g_gamma``: [HV] constant per head (gate of local row j is ``gamma * (j + 1)``).
* Returns ``dq, dk`` ([B, T, H, K], q/k dtype, summed over the value heads of a group),
  ``dw = -dv @ h^T`` ([B, T, HV, K], w dtype; None without w) and ``dg`` ([B, T, HV] float32,
  before FLA's reverse cumsum; None without g). FLA's kernel splits dg over NK key blocks and
  sums them afterwards; that sum equals the full-K reduction computed here.

Accumulation is float32 like the kernel's accumulators; the intra-chunk score gradient is
rounded to the input dtype before its two matmuls, as the kernel does.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

_HALF = (torch.float16, torch.bfloat16)


def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    h: torch.Tensor,
    w: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> str | None:
    """Why this implementation cannot take a call (None when it can); lets a router fall back."""
    if q.dim() != 4 or k.shape != q.shape:
        return f"q and k must both be [B, T, H, K], got {tuple(q.shape)} and {tuple(k.shape)}"
    if v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        return f"v must be [B, T, HV, V] matching q's B, T; got {tuple(v.shape)}"
    H, HV = q.shape[2], v.shape[2]
    if HV % H != 0:
        return f"num value heads HV={HV} must be a multiple of num q/k heads H={H}"
    if g is not None and g_gamma is not None:
        return "g and g_gamma together are not supported"
    if w is not None and dv is None:
        return "w given without dv (dw = -dv @ h^T needs dv)"
    if h.dim() != 5:
        return f"h must be 5-D [B, NT, HV, K, V], got {tuple(h.shape)}"
    if chunk_size <= 0:
        return f"chunk_size must be positive, got {chunk_size}"
    if chunk_indices is not None and cu_seqlens is None:
        return "chunk_indices without cu_seqlens is not supported"
    if cu_seqlens is not None and q.shape[0] != 1:
        return f"varlen (cu_seqlens) needs B == 1, got B={q.shape[0]}"
    if not all(t.is_floating_point() for t in (q, k, v, h)):
        return "q, k, v, h must be floating point"
    return None


def prepare_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[NC, 2] (sequence index, chunk index within it) for every chunk, sequence-major.

    Same layout as FLA's ``fla.ops.utils.index.prepare_chunk_indices``.
    """
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    counts = torch.div(lens + chunk_size - 1, chunk_size, rounding_mode="floor")
    seq = torch.repeat_interleave(torch.arange(len(counts), device=cu_seqlens.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    local = torch.arange(len(seq), device=cu_seqlens.device) - starts[seq]
    return torch.stack([seq, local], 1).to(cu_seqlens.dtype)


#: Which matmul path ran ("out_dtype": cuBLAS with float32 output; "widened": operands cast up).
MATMUL_PATHS: Counter[str] = Counter()


def _cublas_f32_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.is_cuda and a.dtype in _HALF and a.dtype == b.dtype


def _mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched a @ b with float32 output and float32 accumulation, like a Triton ``tl.dot``.

    16-bit CUDA operands go to cuBLAS with a float32 output (``bmm(..., out_dtype=)``,
    torch >= 2.8); elsewhere the operands are widened, which gives the same products.
    """
    if _cublas_f32_ok(a, b):
        try:
            out = torch.bmm(a, b, out_dtype=torch.float32)
            MATMUL_PATHS["out_dtype"] += 1
            return out
        except (TypeError, RuntimeError):
            pass
    MATMUL_PATHS["widened"] += 1
    return torch.bmm(a.float(), b.float())


def _addmm32(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """c + alpha * (a @ b) for a float32 ``c`` (which may be overwritten), float32 accumulation."""
    if _cublas_f32_ok(a, b):
        try:
            out = torch.baddbmm(c, a, b, torch.float32, alpha=alpha)
            MATMUL_PATHS["out_dtype"] += 1
            return out
        except (TypeError, RuntimeError):
            pass
    return c.add_(_mm32(a, b), alpha=alpha)


def _mm_as(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b rounded once to ``dtype`` (cuBLAS accumulates 16-bit GEMMs in float32)."""
    if _cublas_f32_ok(a, b) and dtype == a.dtype:
        MATMUL_PATHS["native"] += 1
        return torch.bmm(a, b)
    return _mm32(a, b).to(dtype)


def _to_head_major(x: torch.Tensor) -> torch.Tensor:
    """[NC, BT, Hx, D] -> [NC * Hx, BT, D] (one batch entry per chunk and head)."""
    nc, bt, hx, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(nc * hx, bt, d)


class _Chunker:
    """Maps [B, T, ...] token tensors to [NC, BT, ...] chunk tensors (zero padded) and back."""

    def __init__(self, B: int, T: int, BT: int, device: torch.device,
                 cu_seqlens: torch.Tensor | None, chunk_indices: torch.Tensor | None):
        self.B, self.T, self.BT = B, T, BT
        self.varlen = cu_seqlens is not None
        if not self.varlen:
            self.NT = -(-T // BT)
            self.NC = B * self.NT
            pos = torch.arange(self.NT * BT, device=device).view(self.NT, BT)
            self.valid = (pos < T).repeat(B, 1)  # [NC, BT]
            return
        if chunk_indices is None:
            chunk_indices = prepare_chunk_indices(cu_seqlens, BT)
        cu = cu_seqlens.to(device=device, dtype=torch.long)
        seq = chunk_indices[:, 0].to(device=device, dtype=torch.long)
        idx = chunk_indices[:, 1].to(device=device, dtype=torch.long)
        live = seq >= 0  # FLA's static (graph-capture) indices pad with seq == -1
        seq = seq.clamp(min=0)
        bos, eos = cu[seq], cu[seq + 1]
        rows = bos[:, None] + idx[:, None] * BT + torch.arange(BT, device=device)[None, :]
        self.valid = (rows < eos[:, None]) & live[:, None]
        self.rows = torch.where(self.valid, rows, torch.zeros_like(rows))
        self.NC = rows.shape[0]

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, *rest] -> [NC, BT, *rest], rows past a sequence end are zero."""
        rest = x.shape[2:]
        if not self.varlen:
            pad = self.NT * self.BT - self.T
            if pad:
                x = torch.cat([x, x.new_zeros(self.B, pad, *rest)], 1)
            return x.reshape(self.NC, self.BT, *rest)
        flat = x.reshape(x.shape[1], *rest)
        out = flat.index_select(0, self.rows.reshape(-1)).view(self.NC, self.BT, *rest)
        mask = self.valid.view(self.NC, self.BT, *([1] * len(rest)))
        return out * mask.to(out.dtype)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """[NC, BT, *rest] -> [B, T, *rest] (inverse of ``split`` on valid rows)."""
        rest = x.shape[2:]
        if not self.varlen:
            # contiguous: FLA hands dq/dk/dw/dg to Triton kernels that assume dense strides.
            return x.reshape(self.B, self.NT * self.BT, *rest)[:, : self.T].contiguous()
        flat = x.reshape(self.NC * self.BT, *rest)
        keep = self.valid.reshape(-1)
        out = x.new_zeros(self.T, *rest)
        out.index_copy_(0, self.rows.reshape(-1)[keep], flat[keep])
        return out.unsqueeze(0)


def chunk_bwd_dqkwg(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    h: torch.Tensor,
    dh: torch.Tensor,
    w: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Drop-in for FLA's ``fla.ops.common.chunk_o.chunk_bwd_dqkwg``; returns (dq, dk, dw, dg).

    Raises NotImplementedError (message from ``unsupported_reason``) for inputs it does not
    handle, so a router can fall back to another implementation.
    """
    reason = unsupported_reason(q, k, v, h, w=w, g=g, g_gamma=g_gamma, dv=dv,
                                cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                                chunk_size=chunk_size)
    if reason is not None:
        raise NotImplementedError(f"fastpath chunk_bwd_dqkwg: {reason}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    BT = chunk_size
    if scale is None:
        scale = K ** -0.5
    chunks = _Chunker(B, T, BT, q.device, cu_seqlens, chunk_indices)
    NC = chunks.NC
    state_shape = (V, K) if state_v_first else (K, V)
    if h.shape[0] * h.shape[1] != NC or tuple(h.shape[2:]) != (HV, *state_shape):
        raise ValueError(
            f"h has shape {tuple(h.shape)}, expected [{B}, {NC // B}, {HV}, {state_shape[0]}, "
            f"{state_shape[1]}] for {NC} chunks of {BT} tokens")
    if dh.shape != h.shape:
        raise ValueError(f"dh shape {tuple(dh.shape)} != h shape {tuple(h.shape)}")
    NB, NQ = NC * HV, NC * H
    # Operands with one batch entry per (chunk, head): q/k per q/k head [NQ, BT, K], the rest per
    # value head [NB, BT, .]. Value head i = qk_head * G + j, so an [NB, BT, X] tensor viewed as
    # [NQ, G * BT, X] lines up with q/k without repeating them G times.
    qh = _to_head_major(chunks.split(q))
    kh = _to_head_major(chunks.split(k))
    vh = _to_head_major(chunks.split(v))
    doh = _to_head_major(chunks.split(do))
    hm = h.reshape(NB, *state_shape)
    dhm = dh.reshape(NB, *state_shape)
    # h^T and dh^T as [V, K] views, in the dtypes the kernel casts them to.
    h_vk = (hm if state_v_first else hm.transpose(1, 2)).to(do.dtype)
    dh_vk = (dhm if state_v_first else dhm.transpose(1, 2)).to(v.dtype)

    dq = _mm32(doh, h_vk)                      # [NB, BT, K]  do @ h^T
    dk = _mm32(vh, dh_vk)                      # [NB, BT, K]  v @ dh^T
    ds = _mm32(doh, vh.transpose(1, 2))        # [NB, BT, BT] do @ v^T

    dw = None
    if w is not None:
        dvh = _to_head_major(chunks.split(dv)).to(v.dtype)
        dw_h = _mm_as(dvh, h_vk.to(v.dtype), w.dtype).neg_()
        dw = chunks.merge(dw_h.view(NC, HV, BT, K).transpose(1, 2))

    valid = chunks.valid.repeat_interleave(HV, 0)                    # [NB, BT]
    causal = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril_()
    mask = causal[None] & valid[:, :, None] & valid[:, None, :]     # [NB, BT, BT]
    lengths = valid.sum(1)                                           # tokens per chunk

    def intra(dq: torch.Tensor, dk: torch.Tensor, ds_c: torch.Tensor,
              alpha_k: float) -> tuple[torch.Tensor, torch.Tensor]:
        """dq += ds @ k and dk += alpha_k * ds^T @ q, per value head."""
        dq = _addmm32(dq.view(NQ, G * BT, K), ds_c.view(NQ, G * BT, BT), kh)
        ds_t = ds_c.transpose(1, 2).reshape(NQ, G * BT, BT)
        dk = _addmm32(dk.view(NQ, G * BT, K), ds_t, qh, alpha_k)
        return dq.view(NB, BT, K), dk.view(NB, BT, K)

    def rowdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """sum_k x[nb, t, k] * y[nq, t, k] -> [NB, BT] (y broadcast over the group)."""
        return (x.view(NQ, G, BT, K) * y[:, None]).sum(-1).view(NB, BT)

    dg = None
    # dq, dk, ds are fresh float32 buffers from _mm32: updated in place to spare HBM traffic.
    if g is None and g_gamma is None:
        # Kernel order: dq = (do @ h^T + ds @ k) * scale; dk = v @ dh^T + (ds^T @ q) * scale.
        ds_c = ds.masked_fill_(~mask, 0.0).to(k.dtype)
        dq, dk = intra(dq, dk, ds_c, scale)
        dq.mul_(scale)
    else:
        if g is not None:
            gh = _to_head_major(chunks.split(g.float()).unsqueeze(-1)).squeeze(-1)
            g_last = gh.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        else:
            gamma = g_gamma.float().repeat(NC)                                 # [NB]
            gh = gamma[:, None] * torch.arange(1, BT + 1, device=q.device, dtype=torch.float32)
            g_last = gamma * lengths.float()
        dq.mul_(torch.exp2(gh).mul_(scale)[..., None])
        decay = torch.exp2(g_last[:, None] - gh).masked_fill_(~valid, 0.0)
        dk.mul_(decay[..., None])
        gate = (gh[:, :, None] - gh[:, None, :]).exp2_()
        ds_c = ds.mul_(gate).masked_fill_(~mask, 0.0).mul_(scale).to(k.dtype)
        del gate, ds
        if g is not None:
            k32 = kh.float()
            # Gradient of the chunk-last gate: through the carried state (h * dh) and through
            # the decayed keys written into it (dk_inter * k), before the intra terms join dk.
            state_term = _mm32(hm.reshape(NB, 1, -1), dhm.reshape(NB, -1, 1)).view(NB)
            dg_last = state_term * torch.exp2(g_last) + rowdot(dk, k32).sum(1)
        dq, dk = intra(dq, dk, ds_c, 1.0)
        if g is not None:
            dg_h = rowdot(dq, qh.float()).sub_(rowdot(dk, k32))                # [NB, BT]
            rows = torch.arange(BT, device=q.device)
            last = rows[None, :] == (lengths - 1)[:, None]          # no host sync (one_hot syncs)
            dg_h.add_(torch.where(last, dg_last[:, None], 0.0))
            dg = chunks.merge(dg_h.view(NC, HV, BT).transpose(1, 2))

    def _back(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[NB, BT, K] float32 per value head -> [B, T, H, K], summed over each head group."""
        x = x.view(NC, H, G, BT, K)
        x = (x.sum(2) if G > 1 else x.squeeze(2)).to(dtype)               # [NC, H, BT, K]
        return chunks.merge(x.transpose(1, 2))

    return _back(dq, q.dtype), _back(dk, k.dtype), dw, dg


def floor_seconds(B: int, T: int, H: int, HV: int, K: int, V: int, chunk_size: int = 64,
                  elem_bytes: int = 2, flops_per_s: float = 989e12,
                  bytes_per_s: float = 4.274e12) -> dict[str, float]:
    """Lower bounds (FLOPs and bytes) of one gated call with w/dv, for benchmark reports.

    Matmuls per (chunk, value head): do@h^T, v@dh^T, dv@h^T (BT*V*K each), do@v^T, ds@k,
    ds^T@q (BT*BT*V or BT*BT*K). Bytes: read q, k (H heads), v, do, dv, w-sized dw write,
    h, dh, g; write dq, dk (H heads) and dg. Defaults: H200 dense bf16 peak (989 TFLOP/s) and
    the device-to-device copy bandwidth measured on the lent H200 on 2026-12-02 (4274 GB/s).
    """
    NT = math.ceil(T / chunk_size)
    BT = chunk_size
    flops = 2.0 * B * NT * HV * (3 * BT * V * K + BT * BT * V + 2 * BT * BT * K)
    tokens = B * T
    elems = (tokens * H * K * 4            # q, k read; dq, dk written
             + tokens * HV * V * 3          # v, do, dv
             + tokens * HV * K              # dw
             + 2 * B * NT * HV * K * V)     # h, dh
    nbytes = elems * elem_bytes + tokens * HV * 4 * 2   # g read, dg written (float32)
    return {"flops": flops, "bytes": float(nbytes), "flop_s": flops / flops_per_s,
            "byte_s": nbytes / bytes_per_s,
            "floor_s": max(flops / flops_per_s, nbytes / bytes_per_s)}
