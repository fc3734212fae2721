"""Compile every fastpath Triton kernel for GPU targets on a machine WITHOUT a GPU, exactly as
their launchers would on the device, and report per arch, kernel and config: ok or the compile
error, registers, spill bytes (ptxas -v), stack and shared memory.

Why: CPU tests run Triton's interpreter, which accepts kernels the GPU compiler refuses (a plain
float global read from a jit function passed every CPU test and failed on the H200, Triton 3.6).
Device time is scarce and there is no Blackwell to borrow, so every kernel is compiled here for
sm_90 (H100/H200), sm_100 (B200/GB200) and sm_120 (RTX 50xx / RTX PRO 6000), under the device's
Triton (3.6, from a venv) and the CI's (3.9).

How: the real launch sites run on CPU tensors with real model shapes (Falcon-Mamba-7B for the
Mamba-1 scan and update; Nemotron-H-8B and Mamba-2 2.7B for the SSD scan, its split conv and its
decode step; Qwen3-Next / Qwen3.5 for the conv, GatedDeltaNet gates, sigmoid gate, rotary and zero-centred RMSNorm), with
`JITFunction.run` replaced by a recorder: every `kernel[grid](...)` is captured with its real
arguments (dtypes, strides, alignment, constexprs, num_warps); an autotuned kernel is captured
once per config. Each launch is specialised by Triton's own binder (the same ints-equal-to-1 and
divisible-by-16 rules as on the device) and compiled with
`triton.compile(ASTSource, target=GPUTarget("cuda", arch, 32))` and Triton's bundled ptxas. The
launchers' later torch work runs on the uninitialised CPU outputs (meaningless, never checked).

A compile error is a failure; so is shared memory above the arch's per-block opt-in limit (Triton
raises OutOfResources when it loads such a kernel), except for one config of an autotuned kernel
(the autotuner skips it) as long as another config of the same launch fits. Limits (bytes):
sm_90 / sm_100 232448, sm_120 101376, from CCCL's arch_traits
(https://github.com/NVIDIA/cccl/blob/main/libcudacxx/include/cuda/__device/arch_traits.h).

Covered: causal_conv1d (tile and channel-last row kernels, forward and backward, widths 2-4,
seq_idx, initial states, the decode update, its one-token step, varlen states), ssd (every kernel
of the chunked scan forward and backward, through mamba_split_conv1d_scan_combined's training
call and mamba_chunk_scan_combined's prefill with initial states and varlen states; the Mamba-2
decode step), selective_scan (forward default + sweep configs, backward default + every SWEEP
config, flip and reverse-scan adjoints, via mamba_inner_fn's training layout and transformers'
prefill layout; the time-sequential forward of FASTPATH_SSCAN_FWD=seq at every
fwd_seq.SEQ_SWEEP config and backward of FASTPATH_SSCAN_BWD=seq at every bwd_seq.BWD_SEQ_SWEEP
config; the tile forward of FASTPATH_SSCAN_FWD=tile at TILE_COMPILE_CONFIGS, time segments
included), the Mamba-1 decode step, gdn_gates, sigmoid_gate, rotary, swiglu, zc_rmsnorm,
linear_ce (the fused LM head + cross-entropy row kernel), state_stats, embedding (the one-pass
weight gradient).
--quick keeps a representative subset per family (the CI test's): default configs, one shape
each, of an autotuned kernel only the configs with the most pipeline stages (the most shared
memory).

The SSD launchers fit their tiles and autotune configs to the target's shared memory
(fastpath/kernels/ssd/shared_memory.py): launches are recorded per arch with that arch's limit
assumed, and an autotuned kernel is compiled for the configs its pruner keeps there.

usage: python benchmarks/kernel_compile_check.py [--arch 90 100 120] [--dtype bf16 fp32]
       [--only FAMILY ...] [--seqlen 256] [--quick] [--jobs N] [--out FILE.json] [--markdown]
       python benchmarks/kernel_compile_check.py --table FILE.json   (the markdown table only)
Exit 1 if any compile fails.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

os.environ.pop("TRITON_INTERPRET", None)  # compile real kernels, not the interpreter's stand-ins
# a fresh cache: every kernel goes through ptxas, whose log gives the spill counts; one this
# process made is removed when it exits (a parent's, named in the environment, is the parent's)
if "TRITON_CACHE_DIR" not in os.environ:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastpath-compile-check-")
    atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], ignore_errors=True)
os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # and even a warm cache would skip ptxas

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction, create_function_from_signature

from fastpath.kernels.causal_conv1d import interface as conv_if
from fastpath.kernels.embedding import interface as embedding_if
from fastpath.kernels.gdn_gates import interface as gates_if
from fastpath.kernels.linear_ce import interface as lce_if
from fastpath.kernels.rotary import interface as rotary_if
from fastpath.kernels.selective_scan import bwd as bwd_mod
from fastpath.kernels.selective_scan import bwd_seq, fwd_chunked, fwd_seq, fwd_tile
from fastpath.kernels.selective_scan import inner as scan_inner
from fastpath.kernels.selective_scan import interface as scan_if
from fastpath.kernels.selective_scan import update as scan_update
from fastpath.kernels.sigmoid_gate import interface as gate_if
from fastpath.kernels.ssd import interface as ssd_if
from fastpath.kernels.ssd import shared_memory as ssd_shared
from fastpath.kernels.ssd import split_conv_scan as ssd_split
from fastpath.kernels.ssd import update as ssd_update
from fastpath.kernels.state_stats import interface as stats_if
from fastpath.kernels.swiglu import interface as swiglu_if
from fastpath.kernels.zc_rmsnorm import interface as norm_if

FAMILIES = ("causal_conv1d", "ssd", "selective_scan", "state_update", "gdn_gates", "sigmoid_gate",
            "rotary", "swiglu", "zc_rmsnorm", "linear_ce", "state_stats", "embedding")
ARCHS = (90, 100, 120)
# cudaDevAttrMaxSharedMemoryPerBlockOptin per arch (what Triton checks at load): CCCL arch_traits,
# kept where the SSD launchers read it to fit their configs
SHARED_LIMIT = ssd_shared.ARCH_LIMITS
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Falcon-Mamba-7B (tiiuae/falcon-mamba-7b config.json): hidden 4096, d_inner 8192, d_state 16,
# dt_rank 256, conv 4; B/C/dt RMSNorm (falcon_mamba_inner_fn)
FM = {"hidden": 4096, "dim": 8192, "nstate": 16, "rank": 256, "conv": 4}
# Mamba-2 mixers: Nemotron-H-8B (nvidia/Nemotron-H-8B-Base-8K: 128 heads of 64, 8 groups, N 128,
# chunk 128) and Mamba-2 2.7B (state-spaces/mamba2-2.7b: 80 heads of 64, 1 group, N 128, chunk 256)
SSD = {"nemotron-h-8b": {"heads": 128, "headdim": 64, "groups": 8, "nstate": 128, "chunk": 128},
       "mamba2-2.7b": {"heads": 80, "headdim": 64, "groups": 1, "nstate": 128, "chunk": 256}}
# GatedDeltaNet conv channels: Qwen3-Next-80B (2*16*128 + 32*128) and Qwen3.5-27B (2*16*128 + 48*128)
CONV_DIMS = (8192, 10240)


# ---------------------------------------------------------------- capture and compile
class Recorder:
    """Replaces JITFunction.run (and Autotuner.run: one launch per config) while active: each
    launch is recorded with a label and, for autotuned ones, the id of its config group."""

    def __init__(self, deepest_only: bool = False) -> None:
        self.launches: list[tuple[str, JITFunction, tuple, dict, int | None]] = []
        self.label = ""
        self._groups = 0
        self.deepest_only = deepest_only  # autotuned: only the configs with the most stages

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        original, original_tuned = JITFunction.run, Autotuner.run

        def record(fn, *args, grid, warmup, **kwargs):
            self.launches.append((self.label, fn, args, dict(kwargs), None))

        def record_tuned(tuner, *args, grid, warmup, **kwargs):
            self._groups += 1
            configs = tuner.configs
            prune = getattr(tuner, "early_config_prune", None)
            if prune:  # what the autotuner would try on the target (shared_memory.prune)
                configs = prune(configs, dict(zip(tuner.arg_names, args, strict=False)), **kwargs)
            if self.deepest_only:  # the most shared memory, the likeliest to hit a limit
                deepest = max(c.num_stages for c in configs)
                configs = [c for c in configs if c.num_stages == deepest]
            for cfg in configs:
                extra = cfg.all_kwargs()
                label = f"{self.label} [w{cfg.num_warps} s{cfg.num_stages}]".strip()
                self.launches.append((label, tuner.fn, args, {**kwargs, **extra}, self._groups))

        JITFunction.run, Autotuner.run = record, record_tuned
        try:
            yield self
        finally:
            JITFunction.run, Autotuner.run = original, original_tuned

    @contextlib.contextmanager
    def prefixed(self, prefix: str) -> Iterator[None]:
        """Launches recorded inside get `prefix` in front of their labels."""
        start = len(self.launches)
        try:
            yield
        finally:
            for i in range(start, len(self.launches)):
                label, *rest = self.launches[i]
                self.launches[i] = (f"{prefix} {label}".strip(), *rest)


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_numbers(log: str) -> dict[str, int]:
    out: dict[str, int] = {}
    if m := _PTXAS_REGS.search(log):
        out["regs"] = int(m[1])
    if m := _PTXAS_FRAME.search(log):
        out.update(stack_bytes=int(m[1]), spill_store_bytes=int(m[2]), spill_load_bytes=int(m[3]))
    return out


def ptxas_for(arch: int) -> tuple[str, str]:
    """(path, first version line) of the ptxas Triton runs for `arch` (Triton 3.6+ picks
    ptxas-blackwell for some archs)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        try:
            tool = get_ptxas(arch)
        except TypeError:  # an older Triton: one ptxas for every arch
            tool = get_ptxas()
        path = tool.path
    except Exception:
        path = knobs.nvidia.ptxas.path
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
        version = next((ln for ln in text.splitlines() if "release" in ln), text.strip())
    except Exception as exc:
        version = f"(could not run: {exc})"
    return path, version.strip()


def specialise(fn: JITFunction, args: tuple, kwargs: dict, backend):
    """Triton's own binding of a launch: (signature, constexprs, attrs, options, cache key)."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # as JITFunction.run sets
        if hasattr(knobs.compilation, name):
            kwargs[name] = getattr(knobs.compilation, name)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    key = (fn.__name__, str(spec), str(options))
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    return signature, constexprs, attrs, options, key


def compile_launch(fn: JITFunction, signature, constexprs, attrs, options, target) -> dict:
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    started = time.time()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
    row: dict = {"compile_s": round(time.time() - started, 1)}
    row.update(_ptxas_numbers(log.getvalue()))
    row["shared_bytes"] = compiled.metadata.shared
    return row


def _describe(fn: JITFunction, signature: dict, constexprs: dict) -> dict:
    names = fn.arg_names
    consts = {names[path[0]]: value for path, value in constexprs.items() if len(path) == 1}
    ptrs = {k: v for k, v in signature.items() if str(v).startswith("*")}
    return {"constexprs": {k: (v if isinstance(v, (bool, int, float, str)) else str(v))
                           for k, v in consts.items()},
            "pointer_dtypes": sorted(set(map(str, ptrs.values())))}


# ---------------------------------------------------------------- the launch sites
@contextlib.contextmanager
def triton_on(*modules) -> Iterator[None]:
    """The interfaces' `use_triton` says yes for CPU tensors (the launches are only recorded)."""
    saved = [m.use_triton for m in modules]
    for m in modules:
        m.use_triton = lambda t: True
    try:
        yield
    finally:
        for m, s in zip(modules, saved, strict=True):
            m.use_triton = s


def _fwd_configs(quick: bool) -> list[tuple[int, int, int]]:
    out = [fwd_chunked.FWD_CONFIG]
    for c in (() if quick else bwd_mod.SWEEP_CONFIGS[:3]):  # bwd.py: "fwd uses the first 3"
        if tuple(c[:3]) not in out:
            out.append(tuple(c[:3]))
    return out


def _bwd_configs(quick: bool) -> list[tuple[int, int, int, bool]]:
    out = [bwd_mod.BWD_CONFIG]
    out += [c for c in (() if quick else bwd_mod.SWEEP_CONFIGS) if c not in out]
    return out


@contextlib.contextmanager
def sweep_scan(rec: Recorder, quick: bool) -> Iterator[None]:
    """The interface's calls of the Triton scan run once per config (each launch labelled)."""
    fwd, bwd = fwd_chunked.selective_scan_fwd_triton, bwd_mod.selective_scan_bwd_triton

    def fwd_all(*args, **kwargs):
        for cfg in _fwd_configs(quick):
            rec.label = f"fwd {cfg}"
            result = fwd(*args, **{**kwargs, "config": cfg})
        return result

    def bwd_all(*args, **kwargs):
        for cfg in _bwd_configs(quick):
            rec.label = f"bwd {cfg}"
            result = bwd(*args, **{**kwargs, "config": cfg})
        return result

    fwd_chunked.selective_scan_fwd_triton, bwd_mod.selective_scan_bwd_triton = fwd_all, bwd_all
    try:
        yield
    finally:
        fwd_chunked.selective_scan_fwd_triton, bwd_mod.selective_scan_bwd_triton = fwd, bwd


@contextlib.contextmanager
def sweep_env(rec: Recorder, env: str, module, launcher: str, configs: tuple,
              label: str, value: str = "seq") -> Iterator[None]:
    """`env`=`value` while active, and the interface's call of module.<launcher> runs once per
    config (each launch labelled `label config`)."""
    launch = getattr(module, launcher)

    def launch_all(*args, **kwargs):
        for cfg in configs:
            rec.label = f"{label} {cfg}"
            result = launch(*args, **{**kwargs, "config": cfg})
        return result

    saved = os.environ.get(env)
    os.environ[env] = value
    setattr(module, launcher, launch_all)
    try:
        yield
    finally:
        setattr(module, launcher, launch)
        if saved is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = saved


def sweep_seq(rec: Recorder, quick: bool):
    """FASTPATH_SSCAN_FWD=seq while active; the interface's seq forward runs once per
    fwd_seq.SEQ_SWEEP config (each launch labelled). The backward's chunk states still come
    from the chunked kernel (covered by the default pass)."""
    configs = (fwd_seq.SEQ_CONFIG,) if quick else fwd_seq.SEQ_SWEEP
    return sweep_env(rec, scan_if.FWD_ENV, fwd_seq, "selective_scan_fwd_seq_triton", configs,
                     "fwd-seq")


# the opt-in tile forward: its default (staged, automatic time segments: three kernels, states
# pass, combine, outputs pass; PRECISE exponentials), tile-poly's (the SFU's and the FMA
# polynomial's), a 16-channel staged loop, explicit segments and PRECISE 2 (exp_split)
TILE_COMPILE_CONFIGS = (fwd_tile.TILE_CONFIG, fwd_tile.TILE_POLY_CONFIG, (0, 0, 1, 0, 0, 3, 0),
                        (32, 0, 1, 0, 0, 2, 8), (*fwd_tile.TILE_CONFIG[:7], 2),
                        (*fwd_tile.TILE_CONFIG[:7], 3), (16, 0, 1, 4, 0, 0, 3, 3))


def sweep_tile(rec: Recorder, quick: bool):
    """FASTPATH_SSCAN_FWD=tile while active; the interface's tile forward runs once per config
    (quick: the default, which compiles all three of its kernels)."""
    configs = TILE_COMPILE_CONFIGS[:1] if quick else TILE_COMPILE_CONFIGS
    return sweep_env(rec, scan_if.FWD_ENV, fwd_tile, "selective_scan_fwd_tile_triton", configs,
                     "fwd-tile", value="tile")


def sweep_bwd_seq(rec: Recorder, quick: bool):
    """FASTPATH_SSCAN_BWD=seq while active; the interface's seq backward (bwd_seq.py: its three
    kernels, both compilations of the gradient kernel across the sweep) runs once per
    bwd_seq.BWD_SEQ_SWEEP config (each launch labelled)."""
    configs = (bwd_seq.BWD_SEQ_CONFIG,) if quick else bwd_seq.BWD_SEQ_SWEEP
    return sweep_env(rec, scan_if.BWD_ENV, bwd_seq, "selective_scan_bwd_seq_triton", configs,
                     "bwd-seq")


def scan_training(dtype: torch.dtype, seqlen: int) -> None:
    """falcon_mamba_inner_fn's call (transformers' training path) with Falcon-Mamba-7B's sizes:
    forward and backward through the real mamba_inner_fn, so the scan sees its real layouts."""
    dim, n, r = FM["dim"], FM["nstate"], FM["rank"]
    mk = lambda *s, dt=dtype: (torch.randn(*s, dtype=dt) * 0.02).requires_grad_()  # noqa: E731
    xz = mk(1, seqlen, 2 * dim).transpose(1, 2)  # in_proj(h).transpose(1, 2), as transformers
    A = (-torch.rand(dim, n) - 0.5).requires_grad_()  # -exp(A_log.float()): float32
    y = scan_inner.mamba_inner_fn(
        xz, mk(dim, 1, FM["conv"]), mk(dim), mk(r + 2 * n, dim), mk(dim, r), mk(FM["hidden"], dim),
        None, A, None, None, mk(dim, dt=torch.float32), mk(dim, dt=torch.float32),
        delta_softplus=True, b_rms_weight=mk(n), c_rms_weight=mk(n), dt_rms_weight=mk(dim),
    )
    y.float().sum().backward()


def scan_prefill(dtype: torch.dtype, seqlen: int) -> None:
    """transformers' MambaMixer/FalconMambaMixer cuda_kernels_forward outside training: u after
    the conv, delta = dt_proj.weight @ time_step^T, B/C `.transpose(1, 2).contiguous()`, z the
    second half of in_proj(h).transpose(1, 2), A/D/delta_bias float32, last state returned."""
    dim, n = FM["dim"], FM["nstate"]
    proj = torch.randn(1, seqlen, 2 * dim, dtype=dtype).transpose(1, 2)
    u, z = torch.randn(1, dim, seqlen, dtype=dtype), proj.chunk(2, dim=1)[1]
    delta = torch.randn(1, dim, seqlen, dtype=dtype)
    B, C = (torch.randn(1, seqlen, n, dtype=dtype).transpose(1, 2).contiguous() for _ in "BC")
    scan_if.selective_scan_fn(u, delta, -torch.rand(dim, n), B, C, torch.randn(dim), z=z,
                              delta_bias=torch.randn(dim), delta_softplus=True,
                              return_last_state=True)


def selective_scan(rec: Recorder, dtype: torch.dtype, seqlen: int, quick: bool) -> None:
    """The chunked forward/backward at their configs through both layouts, then the
    time-sequential forward (FASTPATH_SSCAN_FWD=seq) and backward (FASTPATH_SSCAN_BWD=seq, in
    mamba_inner_fn's training call) at their configs."""
    with triton_on(scan_if), sweep_scan(rec, quick):
        with rec.prefixed("train"):
            scan_training(dtype, seqlen)
        if not quick:
            with rec.prefixed("prefill"):
                scan_prefill(dtype, seqlen)
    with triton_on(scan_if), sweep_scan(rec, True), sweep_seq(rec, quick):
        sites = (("prefill", scan_prefill),) if quick else (("train", scan_training),
                                                           ("prefill", scan_prefill))
        for name, site in sites:
            with rec.prefixed(f"seq-{name}"):
                site(dtype, seqlen)
    with triton_on(scan_if), sweep_scan(rec, True), sweep_bwd_seq(rec, quick):
        with rec.prefixed("bwd-seq-train"):
            scan_training(dtype, seqlen)
    with triton_on(scan_if), sweep_tile(rec, quick), rec.prefixed("tile-prefill"):
        scan_prefill(dtype, seqlen)


def state_update(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """transformers' Mamba-1 decode step: selective_state_update(ssm_state, x[..., 0],
    dt[..., 0], A, B[:, 0], C[:, 0], D, z[..., 0], dt_bias, dt_softplus=True), state in the
    model dtype; batch 1 and a pooled cache with state_batch_indices. Then Mamba2Mixer's decode
    step (Nemotron-H-8B): x (batch, H, P), dt / A / D / dt_bias expanded over P (stride 0)."""
    dim, n = FM["dim"], FM["nstate"]
    for batch, pooled in ((1, False),) if quick else ((1, False), (4, True)):
        rec.label = f"mamba1 decode batch {batch}" + (" pooled" if pooled else "")
        state = torch.randn(8 if pooled else batch, dim, n, dtype=dtype)
        col = lambda rows=batch: torch.randn(rows, dim, 1, dtype=dtype)[..., 0]  # noqa: E731
        BC = lambda rows=batch: torch.randn(rows, 1, n, dtype=dtype)[:, 0]  # noqa: E731
        idx = torch.arange(batch, dtype=torch.int32) if pooled else None
        with triton_on(scan_update):
            scan_update.selective_state_update(state, col(), col(), -torch.rand(dim, n), BC(), BC(),
                                               torch.randn(dim), col(), torch.randn(dim),
                                               dt_softplus=True, state_batch_indices=idx)
    if quick:
        return
    cfg = SSD["nemotron-h-8b"]
    h, p, g, n = cfg["heads"], cfg["headdim"], cfg["groups"], cfg["nstate"]
    for batch in (1, 8):
        rec.label = f"mamba2 decode batch {batch}"
        state = torch.randn(batch, h, p, n, dtype=dtype)
        x = torch.randn(batch, h * p, dtype=dtype).view(batch, h, p)
        dt = torch.randn(batch, h, dtype=dtype)[:, :, None].expand(batch, h, p)
        A = (-torch.rand(h))[:, None, None].expand(h, p, n).to(torch.float32)
        D, dt_bias = (torch.randn(h)[:, None].expand(h, p) for _ in "Db")
        Bm, Cm = (torch.randn(batch, g, n, dtype=dtype) for _ in "BC")
        with triton_on(ssd_update):
            ssd_update.selective_state_update(state, x, dt, A, Bm, Cm, D, z=None,
                                              dt_bias=dt_bias, dt_softplus=True)


def causal_conv1d(rec: Recorder, dtype: torch.dtype, seqlen: int, quick: bool) -> None:
    """The conv's forward/backward as transformers' GatedDeltaNet / Mamba layers call it: x
    (batch, dim, L) contiguous (tile kernels) or a transposed (batch, L, dim) projection
    (channel-last row kernels), weight (dim, width), bias; Mamba-2's seq_idx and initial states;
    the decode update (one token; two with a circular cache) and varlen states."""
    cases = [(4, True, True, False, False)]  # width, silu, bias, seq_idx, initial states
    if not quick:
        cases += [(4, True, False, True, False), (4, True, True, False, True),
                  (3, False, True, False, False), (2, True, False, False, False)]
    dims = CONV_DIMS[:1] if quick else CONV_DIMS
    with triton_on(conv_if):
        for dim in dims:
            for layout in ("contiguous", "channel-last"):
                for width, silu, has_bias, has_seq, has_init in cases:
                    if has_init and layout == "contiguous" and quick:
                        continue
                    rec.label = (f"D={dim} {layout} W={width}" + (" silu" if silu else "")
                                 + (" bias" if has_bias else "") + (" seq_idx" if has_seq else "")
                                 + (" init" if has_init else ""))
                    if layout == "contiguous":
                        x = torch.randn(1, dim, seqlen, dtype=dtype)
                    else:
                        x = torch.randn(1, seqlen, dim, dtype=dtype).transpose(1, 2)
                    weight = torch.randn(dim, width, dtype=dtype)
                    bias = torch.randn(dim, dtype=dtype) if has_bias else None
                    seq_idx = (torch.arange(seqlen, dtype=torch.int32)[None] // (seqlen // 2)
                               if has_seq else None)
                    init = (torch.randn(1, width - 1, dim, dtype=dtype).transpose(1, 2)
                            if has_init else None)
                    out, final = conv_if.fwd_impl(x, weight, bias, seq_idx, init, has_init, silu)
                    dx = torch.empty_like(x)
                    conv_if.bwd_impl(x, weight, bias, torch.randn_like(out).transpose(1, 2)
                                     .contiguous().transpose(1, 2) if layout != "contiguous"
                                     else torch.randn_like(out), seq_idx, init,
                                     torch.randn_like(final) if has_init else None, dx, silu,
                                     has_init)
            # decode: one token (the step kernel), with a pooled cache; two tokens, circular
            for batch, tokens, circular, pooled in ((1, 1, False, False), (8, 1, False, True),
                                                    (4, 2, True, False)):
                if quick and batch != 1:
                    continue
                rec.label = f"D={dim} update batch {batch} tokens {tokens}" + (
                    " circular" if circular else "") + (" pooled" if pooled else "")
                x = torch.randn(batch, dim, tokens, dtype=dtype)
                state = torch.randn(16 if pooled else batch, dim, 3, dtype=dtype)
                seqlens = torch.full((batch,), 5, dtype=torch.int32) if circular else None
                idx = torch.arange(batch, dtype=torch.int32) if pooled else None
                conv_if.update_impl(x, state, torch.randn(dim, 4, dtype=dtype),
                                    torch.randn(dim, dtype=dtype), True, seqlens, idx)
            if not quick:
                rec.label = f"D={dim} varlen states"
                x = torch.randn(1, seqlen, dim, dtype=dtype).transpose(1, 2)[0]
                cu = torch.tensor([0, seqlen // 3, seqlen], dtype=torch.int32)
                conv_if.varlen_states(x, cu, 3)


def ssd(rec: Recorder, dtype: torch.dtype, seqlen: int, quick: bool) -> None:
    """Mamba-2: transformers' Mamba2Mixer training call (mamba_split_conv1d_scan_combined, its
    conv included, forward and backward, norm and out_proj outside) and the prefill call
    (mamba_chunk_scan_combined with dt_softplus, dt_limit, z and the final states); then initial
    states with seq_idx, and varlen states (packed sequences, cu_seqlens)."""
    models = ("nemotron-h-8b",) if quick else tuple(SSD)
    with triton_on(conv_if, ssd_if):
        for model in models:
            cfg = SSD[model]
            h, p, g, n, q = (cfg[k] for k in ("heads", "headdim", "groups", "nstate", "chunk"))
            length = max(seqlen, 2 * q)
            dim = h * p
            mk = lambda *s, dt=dtype: (torch.randn(*s, dtype=dt) * 0.1).requires_grad_()  # noqa: E731
            A = (-torch.rand(h) - 0.5).requires_grad_()
            with rec.prefixed(f"{model} train"):
                zxbcdt = mk(1, length, 2 * dim + 2 * g * n + h)
                out = ssd_split.mamba_split_conv1d_scan_combined(
                    zxbcdt, mk(dim + 2 * g * n, 4), mk(dim + 2 * g * n), mk(h, dt=torch.float32),
                    A, mk(h, dt=torch.float32), q, dt_limit=(0.0, math.inf), activation="silu",
                    headdim=p, ngroups=g,
                )
                out.float().sum().backward()
            if quick:
                continue
            x = torch.randn(1, length, h, p, dtype=dtype)
            dt = torch.randn(1, length, h, dtype=dtype)
            Bm, Cm = (torch.randn(1, length, g, n, dtype=dtype) for _ in "BC")
            with rec.prefixed(f"{model} prefill"):
                ssd_if.mamba_chunk_scan_combined(
                    x, dt, A.detach(), Bm, Cm, q, D=torch.randn(h), z=torch.randn_like(x),
                    dt_bias=torch.randn(h), dt_softplus=True, dt_limit=(0.0, 100.0),
                    return_final_states=True)
            with rec.prefixed(f"{model} init+seq_idx+varlen"):
                seq_idx = (torch.arange(length, dtype=torch.int32)[None] >= length // 3).int()
                cu = torch.tensor([0, length // 3, length], dtype=torch.int32)
                ssd_if.mamba_chunk_scan_combined(
                    x, dt, A.detach(), Bm, Cm, q, D=torch.randn(h, p), dt_bias=torch.randn(h),
                    initial_states=torch.randn(1, h, p, n), seq_idx=seq_idx, cu_seqlens=cu,
                    dt_softplus=True, return_final_states=True, return_varlen_states=True)


def gdn_gates(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """GatedDeltaNet gates: a, b (batch, L, heads) (contiguous, and views of one (.., 2*heads)
    projection), A_log/dt_bias in the model dtype; every backward (dg, dbeta) presence."""
    rows = 512
    for heads in (32,) if quick else (16, 32, 48, 64):  # Qwen3-Next / Qwen3.5 value-head counts
        ba = torch.randn(1, rows, 2 * heads, dtype=dtype)
        for how, a, b in (("views", ba[..., :heads], ba[..., heads:]),
                          ("contiguous", torch.randn(1, rows, heads, dtype=dtype),
                           torch.randn(1, rows, heads, dtype=dtype))):
            rec.label = f"heads {heads} {how}"
            a_log, dt_bias = torch.randn(heads, dtype=dtype), torch.randn(heads, dtype=dtype)
            with triton_on(gates_if):
                gates_if.fwd_impl(a, b, a_log, dt_bias)
                dg, dbeta = torch.randn(1, rows, heads), torch.randn(1, rows, heads, dtype=dtype)
                for pair in ((dg, dbeta), (dg, None), (None, dbeta)):
                    gates_if.bwd_impl(a, b, a_log, dt_bias, *pair)


def sigmoid_gate(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """Qwen3-Next-style output gate: x (batch, L, width) contiguous, the gate a strided view of
    q_proj's (.., heads, 2*head_dim) output; widths of 16 and 24 heads of 256, and 32 x 128."""
    rows = 512
    for heads, hd in ((16, 256),) if quick else ((16, 256), (24, 256), (32, 128)):
        rec.label = f"{heads} heads x {hd}"
        q = torch.randn(1, rows, heads, 2 * hd, dtype=dtype)
        gate = q[..., hd:].reshape(1, rows, heads * hd)
        x = torch.randn(1, rows, heads * hd, dtype=dtype)
        with triton_on(gate_if):
            gate_if.fwd_impl(x, gate)
            gate_if.bwd_impl(x, gate, torch.randn(1, rows, heads * hd, dtype=dtype))


def rotary(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """Qwen3.5's partial RoPE, forward and backward: q / k a transpose view of the (batch, L,
    heads, 256) norm output, cos / sin (batch, L, 64) expanded over the batch (Qwen3.5-27B: 24
    query / 4 key heads, partial_rotary_factor 0.25; Qwen3-Next: 16 / 2), and a full rotary."""
    rows = 512
    cases = ((24, 256, 64),) if quick else ((24, 256, 64), (4, 256, 64), (16, 256, 64), (16, 128, 128))
    for heads, hd, rot in cases:
        rec.label = f"{heads} heads x {hd}, R {rot}"
        x = torch.randn(2, rows, heads, hd, dtype=dtype).transpose(1, 2)
        cos, sin = (torch.randn(1, rows, rot, dtype=dtype).expand(2, -1, -1) for _ in "cs")
        with triton_on(rotary_if):
            rotary_if.fwd_impl(x, cos, sin)
            rotary_if.bwd_impl(torch.randn(2, heads, rows, hd, dtype=dtype), cos, sin)


def swiglu(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """The gated MLP's silu(gate) * up, forward and backward, over Qwen3.5-27B's intermediate
    17408 (flat kernels: the width only sets how many programs run)."""
    rec.label = "intermediate 17408"
    gate, up = torch.randn(1, 64, 17408, dtype=dtype), torch.randn(1, 64, 17408, dtype=dtype)
    with triton_on(swiglu_if):
        swiglu_if.fwd_impl(gate, up)
        swiglu_if.bwd_impl(gate, up, torch.randn(1, 64, 17408, dtype=dtype))


def embedding(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """The token embedding's one-pass weight gradient over Qwen3.5-27B's hidden 5120 (the table's
    row count only sets how many programs run: a small one here)."""
    rec.label = "hidden 5120"
    ids = torch.randint(0, 64, (1, 48))
    with triton_on(embedding_if):
        embedding_if.bwd_impl(ids, torch.randn(1, 48, 5120, dtype=dtype), 64, None, False)


def zc_rmsnorm(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """Qwen3.5 / Qwen3-Next zero-centred RMSNorm, forward and backward: the decoder norms over
    hidden 5120 (Qwen3.5-27B) and 2048 (Qwen3-Next-80B), q_norm over head_dim 256 read from a
    (.., 24, 512) q_proj view, the widest row the kernel takes; weight float32 and the model dtype;
    the decoder norms again with the residual add fused in (add_zc_rmsnorm)."""
    rows = 512
    cases = ((5120, "hidden"), (256, "q_norm")) if quick else (
        (5120, "hidden"), (2048, "hidden"), (256, "q_norm"), (norm_if.MAX_WIDTH, "widest"))
    for width, how in cases:
        if how == "q_norm":
            x = torch.randn(1, rows, 24, 2 * width, dtype=dtype)[..., :width]
        else:
            x = torch.randn(1, rows, width, dtype=dtype)
        for w_dtype in (torch.float32,) if quick else (torch.float32, dtype):
            rec.label = f"{how} {width} w {str(w_dtype).removeprefix('torch.')}"
            w = torch.randn(width, dtype=w_dtype)
            with triton_on(norm_if):
                norm_if.fwd_impl(x, w, 1e-6)
                norm_if.bwd_impl(x, w, torch.randn(x.shape, dtype=dtype), 1e-6)
                if how == "hidden":  # the post-attention norm with the residual add fused in
                    rec.label = f"add+{how} {width} w {str(w_dtype).removeprefix('torch.')}"
                    norm_if.add_fwd_impl(x, torch.randn(x.shape, dtype=dtype), w, 1e-6)
                    norm_if.add_bwd_impl(x, w, torch.randn(x.shape, dtype=dtype), torch.randn(x.shape, dtype=dtype),
                                         1e-6)


def linear_ce(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """The fused LM head + cross-entropy's row kernel over a chunk of logits: Qwen3.5's 248,320
    and Qwen3-Next's 151,936 vocabularies (the kernel's tiles depend on the vocabulary, not on the
    hidden size: hidden 16 keeps the CPU GEMMs cheap), training (gradients written into the
    chunk) and a no-grad loss."""
    vocabs = (248320,) if quick else (248320, 151936)
    for vocab in vocabs:
        weight = torch.randn(vocab, 16, dtype=dtype) * 0.1
        hidden = torch.randn(64, 16, dtype=dtype)
        labels = torch.randint(0, vocab, (64,))
        labels[:5] = -100
        for grad in (True,) if quick else (True, False):
            rec.label = f"vocab {vocab}" + (" train" if grad else " loss only")
            with triton_on(lce_if):
                lce_if.fwd_impl(hidden, weight, labels, None, -100, "mean", 0, grad, grad)


def state_stats(rec: Recorder, dtype: torch.dtype, quick: bool) -> None:
    """capture's one-pass state checks over a Qwen3.5-27B hidden state (5120 wide), contiguous and
    row-strided (the kernel specialises on neither: one binary per dtype)."""
    rec.label = "hidden 5120"
    with triton_on(stats_if):
        stats_if.state_stats(torch.randn(64, 5120, dtype=dtype))


def record(family: str, dtype_name: str, seqlen: int, quick: bool = False) -> list[tuple]:
    """Every launch of one family's sites: (label, JITFunction, args, kwargs, tune group)."""
    rec = Recorder(deepest_only=quick)
    dtype = DTYPES[dtype_name]
    with rec.active():
        if family == "causal_conv1d":
            causal_conv1d(rec, dtype, seqlen, quick)
        elif family == "ssd":
            ssd(rec, dtype, seqlen, quick)
        elif family == "selective_scan":
            selective_scan(rec, dtype, seqlen, quick)
        elif family == "state_update":
            state_update(rec, dtype, quick)
        elif family == "gdn_gates":
            gdn_gates(rec, dtype, quick)
        elif family == "sigmoid_gate":
            sigmoid_gate(rec, dtype, quick)
        elif family == "rotary":
            rotary(rec, dtype, quick)
        elif family == "swiglu":
            swiglu(rec, dtype, quick)
        elif family == "zc_rmsnorm":
            zc_rmsnorm(rec, dtype, quick)
        elif family == "linear_ce":
            linear_ce(rec, dtype, quick)
        elif family == "state_stats":
            state_stats(rec, dtype, quick)
        elif family == "embedding":
            embedding(rec, dtype, quick)
    return rec.launches


_NUMBERS = ("regs", "spill_store_bytes", "spill_load_bytes", "stack_bytes", "shared_bytes")
_DONE: dict[tuple, dict] = {}  # (arch, specialisation key) -> the row that compiled it


def _over_limit(row: dict, arch: int) -> bool:
    return row.get("shared_bytes", 0) > SHARED_LIMIT.get(arch, SHARED_LIMIT[120])


def compile_all(launches: list[tuple], family: str, dtype_name: str, arch: int,
                emit: Callable[[dict], None], kernels: set[str] | None = None) -> None:
    """Compile each distinct specialisation of `launches` for `arch` (of the named kernels, when
    given); emit a row per binary."""
    if kernels:
        launches = [launch for launch in launches if launch[1].__name__ in kernels]
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    seen: dict = {}
    groups: dict[int, list[dict]] = {}
    for label, fn, args, kwargs, group in launches:
        row = {"arch": arch, "family": family, "dtype": dtype_name, "case": label,
               "kernel": fn.__name__, "num_warps": kwargs.get("num_warps", 4),
               "num_stages": kwargs.get("num_stages", 3)}
        if group is not None:
            row["autotuned"] = True
        try:
            signature, constexprs, attrs, options, key = specialise(fn, args, kwargs, backend)
        except Exception as exc:
            row["ok"] = False
            row["error"] = f"binding: {type(exc).__name__}: {exc}"[:600]
            emit(row)
            continue
        if key in seen:  # the same binary as an earlier row
            if group is not None:
                groups.setdefault(group, []).append(seen[key])
            continue
        row.update(_describe(fn, signature, constexprs))
        earlier = _DONE.get((arch, key))
        if earlier is not None:  # compiled for another family (the SSD's conv): its numbers
            row.update({k: earlier[k] for k in (*_NUMBERS, "ok", "error") if k in earlier})
            row["same_binary_as"] = f"{earlier['family']} {earlier['dtype']} {earlier['case']}"
        else:
            try:
                row.update(compile_launch(fn, signature, constexprs, attrs, options, target))
                row["ok"] = True
            except Exception as exc:
                row["ok"] = False
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            _DONE[(arch, key)] = row
        seen[key] = row
        if row["ok"] and _over_limit(row, arch):
            limit = SHARED_LIMIT.get(arch, SHARED_LIMIT[120])
            why = (f"needs {row['shared_bytes']} bytes of shared memory, sm_{arch} allows {limit} "
                   "per block")
            if group is None:
                row["ok"] = False
                row["error"] = f"OutOfResources at load: {why}"
            else:
                row["over_shared_limit"] = why + " (the autotuner skips this config)"
        if group is not None:
            groups.setdefault(group, []).append(row)
        emit(row)
    for members in groups.values():
        if not any(r.get("ok") and not _over_limit(r, arch) for r in members):
            first = members[0]
            emit({"arch": arch, "family": family, "dtype": dtype_name, "case": first["case"],
                  "kernel": first["kernel"], "ok": False,
                  "error": "no config of this autotuned launch compiles and fits in shared memory"})


def run(families: list[str], dtypes: list[str], archs: list[int], seqlen: int, quick: bool,
        emit: Callable[[dict], None], kernels: set[str] | None = None) -> None:
    """Per arch, the launches are recorded as the launchers choose them for that arch's shared
    memory (ssd/shared_memory.assume_limit), then compiled for it."""
    for family in families:
        for dtype_name in dtypes:
            for arch in archs:
                try:
                    with ssd_shared.assume_limit(SHARED_LIMIT.get(arch, SHARED_LIMIT[120]), arch):
                        launches = record(family, dtype_name, seqlen, quick)
                except Exception as exc:  # a launcher that fails on CPU: say so, go on
                    emit({"arch": arch, "family": family, "dtype": dtype_name, "ok": False,
                          "kernel": "(launch site)", "error": f"{type(exc).__name__}: {exc}"[:600]})
                    continue
                if not launches:
                    emit({"arch": arch, "family": family, "dtype": dtype_name, "ok": False,
                          "kernel": "(launch site)",
                          "error": "no Triton launch recorded (the interface fell back?)"})
                    continue
                compile_all(launches, family, dtype_name, arch, emit, kernels)


def summarise(rows: list[dict], archs: list[int]) -> dict:
    """Per arch: binaries compiled / failed, max registers, rows with spills, max shared memory."""
    out = {}
    for arch in archs:
        mine = [r for r in rows if r.get("arch") == arch]
        ok = [r for r in mine if r.get("ok")]
        out[str(arch)] = {
            "compiled": len(ok), "failed": sum(1 for r in mine if "error" in r),
            "max_regs": max((r.get("regs", 0) for r in ok), default=0),
            "spilling": sum(1 for r in ok if r.get("spill_store_bytes", 0)),
            "max_spill_store_bytes": max((r.get("spill_store_bytes", 0) for r in ok), default=0),
            "max_shared_bytes": max((r.get("shared_bytes", 0) for r in ok), default=0),
            "over_shared_limit_autotuned": sum(1 for r in ok if "over_shared_limit" in r),
        }
    return out


def markdown_table(rows: list[dict], archs: list[int]) -> str:
    """Per family and kernel, per arch: binaries ok / recorded, max registers, binaries that spill
    (max spill-store bytes), max shared bytes; failures in bold."""
    kernels = list(dict.fromkeys((r.get("family"), r.get("kernel")) for r in rows
                                 if r.get("kernel") and r.get("arch") in archs))
    head = ["family", "kernel"] + [f"sm_{a}: ok/binaries, max regs, spilling (max bytes), max shared"
                                   for a in archs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for family, kernel in kernels:
        cells = [family, f"`{kernel}`"]
        for arch in archs:
            mine = [r for r in rows if (r.get("family"), r.get("kernel"), r.get("arch"))
                    == (family, kernel, arch)]
            binaries = [r for r in mine if "regs" in r or "error" in r]
            ok = [r for r in binaries if r.get("ok")]
            spilling = [r for r in ok if r.get("spill_store_bytes", 0)]
            failed = sum(1 for r in mine if "error" in r)
            cell = (f"{len(ok)}/{len(binaries)}, {max((r.get('regs', 0) for r in ok), default=0)}, "
                    f"{len(spilling)}"
                    + (f" ({max(r['spill_store_bytes'] for r in spilling)} B)" if spilling else "")
                    + f", {max((r.get('shared_bytes', 0) for r in ok), default=0)}")
            over = sum(1 for r in ok if "over_shared_limit" in r)
            if over:
                cell += f" ({over} over limit, skipped by autotune)"
            if failed:
                cell += f" **{failed} FAILED**"
            cells.append(cell if mine else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _in_parallel(args: argparse.Namespace, argv_rest: list[str], rows: list[dict]) -> None:
    """One child process per arch (ptxas and Triton's passes use one core each), each with its own
    fresh cache; the caches and the children's JSON live in one temporary folder, removed after.
    Their rows join `rows` even when the run is interrupted (what the children finished)."""
    pending = list(args.arch)
    started: list[tuple[subprocess.Popen, str]] = []
    running: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="fastpath-compile-check-") as work:
        try:
            while pending or running:
                while pending and len(running) < args.jobs:
                    arch = pending.pop(0)
                    out = os.path.join(work, f"sm{arch}.json")
                    env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(work, f"cache-sm{arch}")}
                    proc = subprocess.Popen([sys.executable, __file__, "--arch", str(arch),
                                             "--jobs", "1", "--out", out, *argv_rest], env=env)
                    running.append(proc)
                    started.append((proc, out))
                running.pop(0).wait()
        finally:
            for proc, out in started:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                try:
                    with open(out) as f:
                        rows += json.load(f)["rows"]
                except (OSError, ValueError) as exc:
                    rows.append({"arch": None, "family": "(child)", "kernel": "(child)",
                                 "ok": False, "error": f"no result from {out}: {exc}"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=ARCHS,
                    metavar="ARCH", help="CUDA compute capabilities (90 = H100/H200, 100 = B200, "
                    "120 = RTX 50xx; the ones the check knows)")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--only", nargs="+", default=list(FAMILIES), choices=FAMILIES,
                    metavar="FAMILY", help=f"kernel families: {', '.join(FAMILIES)}")
    ap.add_argument("--seqlen", type=int, default=256,
                    help="prefill/training length (a multiple of 16 as usual; only specialisation "
                         "depends on it)")
    ap.add_argument("--quick", action="store_true",
                    help="a representative subset per family: default configs, one shape each")
    ap.add_argument("--jobs", type=int, default=min(3, os.cpu_count() or 1),
                    help="archs compiled in parallel (one process each)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here (rewritten per row)")
    ap.add_argument("--kernel", nargs="+", default=None, metavar="NAME",
                    help="compile only these kernels (e.g. _states_kernel) of the families' launches")
    ap.add_argument("--markdown", action="store_true",
                    help="print the registers / spills / shared-memory table as markdown at the end")
    ap.add_argument("--table", metavar="FILE.json", default=None,
                    help="only print the markdown table of an earlier --out file")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.seqlen < 1:
        ap.error("--jobs and --seqlen take a positive integer")
    if args.table:
        try:
            with open(args.table) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            ap.error(f"--table {args.table}: {exc}")
        print(markdown_table(data["rows"], data["archs"]))
        return 0
    torch.manual_seed(0)
    header = {"archs": args.arch, "triton": triton.__version__, "torch": torch.__version__,
              "ptxas": {str(a): dict(zip(("path", "version"), ptxas_for(a), strict=True))
                        for a in args.arch},
              "shared_limit_bytes": {str(a): SHARED_LIMIT.get(a) for a in args.arch},
              "seqlen": args.seqlen, "quick": args.quick, "dtypes": args.dtype,
              "shapes": {"falcon_mamba": FM, "ssd": SSD, "conv_dims": CONV_DIMS}}
    rows: list[dict] = []
    started = time.time()

    def write() -> None:
        if args.out:
            with open(args.out, "w") as f:
                json.dump({**header, "summary": summarise(rows, args.arch),
                           "wall_s": round(time.time() - started, 1), "rows": rows}, f, indent=1)

    def emit(row: dict) -> None:
        rows.append(row)
        brief = {k: row[k] for k in ("arch", "family", "dtype", "case", "kernel", "num_warps",
                                     "num_stages", "ok", "regs", "spill_store_bytes",
                                     "spill_load_bytes", "stack_bytes", "shared_bytes",
                                     "compile_s") if k in row}
        print(json.dumps(brief), flush=True)
        if "error" in row:
            print("  ERROR: " + row["error"].replace("\n", "\n  "), flush=True)
        write()

    print(json.dumps({k: header[k] for k in ("archs", "triton", "torch", "ptxas")}), flush=True)
    if len(args.arch) > 1 and args.jobs > 1:
        rest = ["--dtype", *args.dtype, "--only", *args.only, "--seqlen", str(args.seqlen)]
        rest += ["--kernel", *args.kernel] if args.kernel else []
        try:
            _in_parallel(args, rest + (["--quick"] if args.quick else []), rows)
        finally:
            write()
    else:
        run(args.only, args.dtype, args.arch, args.seqlen, args.quick, emit,
            set(args.kernel) if args.kernel else None)
    summary = summarise(rows, args.arch)
    for arch, s in summary.items():
        print(f"sm_{arch}: {s['compiled']} compiled, {s['failed']} failed, max {s['max_regs']} "
              f"registers, {s['spilling']} spilling (max {s['max_spill_store_bytes']} bytes), "
              f"max shared {s['max_shared_bytes']} bytes (Triton {triton.__version__})", flush=True)
    if args.markdown:
        print(markdown_table(rows, args.arch), flush=True)
    failed = [r for r in rows if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the rows so far are in --out (rewritten per row); temp folders gone
        print("kernel_compile_check: interrupted", file=sys.stderr)
        sys.exit(130)
