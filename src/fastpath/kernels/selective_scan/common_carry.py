"""The carry walk shared by the scans' combine kernels: a first-order recurrence over pieces of time.

Both the tile forward's time segments (fwd_tile.py) and the time-walking backward's chunks
(bwd_seq.py) end with the same step: given each piece's decay product P_c and local result X_c
(its end state from a zero start, or its local adjoint carry), form the value entering every piece,
H_{next} = P_c H_c + X_c, walked in a given order (forward in time for states, backward for
adjoints), and write it over X in place.

Why blocks of K pieces. Walked one piece at a time, each step's two loads wait on DRAM before the
next can issue: Nsight Compute on an H100 at (1, 4096) (128 chunks) showed the backward's combine
at 0.01 instructions a cycle, 242 cycles of load stall per instruction, 0.84 ms for ~0.4 GB of
traffic. Here a program loads K pieces' (P, X) as one (K, BLOCK) tile (all K loads in flight at
once), composes them with tl.associative_scan along the pieces (fwd_chunked.first_order), applies
the carry to every row and stores the K entering values: the serial chain is n / K tile loads long.
Only forward scans are used (the order is set by which piece a row reads), never reverse=True (see
bwd.py on its miscompiles).

Rows are shifted by one piece: row 0 is the identity (P = 1, X = 0) and row k reads the piece
before the one it writes, so the inclusive scan's row k is exactly the composition of the pieces
ahead of piece `first + k * step`. The last piece a block reads is loaded once more as a row before
the block's stores overwrite it, for the carry into the next block.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fastpath.kernels.selective_scan.fwd_chunked import first_order


@triton.jit
def carry_walk(PBUF, XBUF, base, e, m, carry, first, step, n_read, n_write, n_elems,
               K: tl.constexpr):
    """Walk pieces first, first + step, ... (step +1 or -1; n_write of them, the first n_read of
    which hold (P, X) to read: a piece read past n_read counts as the identity). Piece c's
    (P, X) live at base + c * n_elems + e (int64 base, e the program's BLOCK element offsets,
    m their mask); X[c] is overwritten with the value entering piece c, starting from carry.
    Returns the value leaving the last piece read."""
    rows = tl.arange(0, K)
    top = rows[:, None] == K - 1
    for i in range(0, tl.cdiv(n_write, K)):
        c0 = first + i * K * step
        src = c0 + (rows - 1) * step
        ok = (rows >= 1) & (src >= 0) & (src < n_read)
        mk = ok[:, None] & m[None, :]
        off = base + src.to(tl.int64)[:, None] * n_elems + e[None, :]
        P = tl.load(PBUF + off, mask=mk, other=1.0)
        X = tl.load(XBUF + off, mask=mk, other=0.0)
        last = tl.zeros_like(e) + (c0 + (K - 1) * step)  # a tensor: masks must be tensors
        ml = m & (last >= 0) & (last < n_read)
        off_last = base + last.to(tl.int64) * n_elems + e
        P_last = tl.load(PBUF + off_last, mask=ml, other=1.0)
        X_last = tl.load(XBUF + off_last, mask=ml, other=0.0)
        Pc, Xc = tl.associative_scan((P, X), axis=0, combine_fn=first_order)
        enter = Pc * carry[None, :] + Xc
        dst = c0 + rows * step
        md = ((dst >= 0) & (dst < n_write))[:, None] & m[None, :]
        tl.store(XBUF + base + dst.to(tl.int64)[:, None] * n_elems + e[None, :], enter, mask=md)
        carry = P_last * tl.sum(tl.where(top, enter, 0.0), axis=0) + X_last
    return carry
