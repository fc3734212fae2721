"""Validate FLA's gated ``chunk_bwd_dqkwg`` here, per configuration, instead of refusing it blindly.

FLA refuses its gated chunk backward on Hopper with Triton [3.4, 3.7.1) (FLA issue #640:
https://github.com/fla-org/flash-linear-attention/issues/640 shows dk errors of 14.65 at BK=64
on an H20, head dim 100), but on an H200 with Triton 3.6.0 its kernel measured correct for the
head dims Qwen3.5 uses. So where `known_issues.fla_640` says "affected", the route asks this
module, per call configuration, whether FLA's compiled kernel may run:

* ``FASTPATH_FLA_DQKWG=torch``: never (fastpath's PyTorch dqkwg, the previous behaviour);
* ``FASTPATH_FLA_DQKWG=fla``: always, unchecked (the user vouches for it);
* ``auto`` (default): once per process and configuration (H, HV, K, V, chunk size, dtypes, gate,
  w, layout: everything FLA's autotuner keys on, so the self-check tunes and then checks the very
  binary and launch config the model will use), FLA's kernel and our reference run on random
  inputs: several seeds, 16 chunks with a ragged last one, two batch rows, every output compared
  globally and per chunk, plus a bitwise repeat (a race shows as non-determinism). Only a pass
  lets FLA's kernel take that configuration; a failure warns and keeps the PyTorch route.

Results are kept for `explain()` (`describe()`) and written, best effort, as a JSON fact file
(`facts_path()`) the doctor can read. `run_selfcheck` compares any callable with the
chunk_bwd_dqkwg signature against the reference, so the tests prove on CPU that a wrong or
non-deterministic kernel is rejected.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastpath.routing.route_modes import env_mode

ENV_MODE = "FASTPATH_FLA_DQKWG"
MODES = ("auto", "fla", "torch")
OUTPUTS = ("dq", "dk", "dw", "dg")
# Relative L2 error allowed per output (global; 3x that per chunk). A correct kernel lands near the
# input dtype's rounding (bf16 ~5e-3 measured on the H200); #640-class miscompiles are O(1).
TOLERANCE = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 2e-2}
PER_CHUNK_FACTOR = 3.0
SEEDS = (0, 1, 2)
N_CHUNKS = 16
BATCH = 2

_log = logging.getLogger("fastpath")
_lock = threading.Lock()


@dataclass(frozen=True)
class DqkwgConfig:
    """One chunk_bwd_dqkwg configuration: what FLA specialises and autotunes the kernel on."""

    H: int
    HV: int
    K: int
    V: int
    BT: int
    dtype: str                 # q/k/v/do dtype
    state_dtype: str           # h dtype
    use_w: bool
    state_v_first: bool
    varlen: bool
    dstate_dtype: str = ""     # dh dtype ("" = same as h)

    def label(self) -> str:
        parts = [f"K={self.K}", f"V={self.V}", f"H={self.H}", f"HV={self.HV}", f"BT={self.BT}",
                 self.dtype]
        if self.state_dtype != self.dtype:
            parts.append(f"h {self.state_dtype}")
        if self.dstate_dtype and self.dstate_dtype != self.state_dtype:
            parts.append(f"dh {self.dstate_dtype}")
        parts += [x for x, on in (("w", self.use_w), ("state_v_first", self.state_v_first),
                                  ("varlen", self.varlen)) if on]
        return " ".join(parts)


@dataclass
class SelfCheckResult:
    config: DqkwgConfig
    passed: bool
    reason: str                                    # one line: why it passed / failed
    errors: dict[str, float] = field(default_factory=dict)        # worst global rel L2
    chunk_errors: dict[str, float] = field(default_factory=dict)  # worst per-chunk rel L2
    deterministic: bool = True
    seeds: int = 0
    chunks: int = 0
    kernel_config: str | None = None               # FLA's autotuned launch config, if readable

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        worst = max(self.errors.values(), default=float("nan"))
        cfg = f", autotuned {self.kernel_config}" if self.kernel_config else ""
        return (f"{self.config.label()}: {verdict} (max rel err {worst:.1e}, {self.seeds} seeds x "
                f"{self.chunks} chunks, deterministic={self.deterministic}{cfg}) - {self.reason}")


def _dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def config_of_call(call: dict[str, Any]) -> DqkwgConfig:
    """The configuration of one bound chunk_bwd_dqkwg call (keyword view of its arguments)."""
    q, v = call["q"], call["v"]
    return DqkwgConfig(H=q.shape[2], HV=v.shape[2], K=q.shape[3], V=v.shape[3],
                       BT=int(call.get("chunk_size") or 64), dtype=_dtype_name(q),
                       state_dtype=_dtype_name(call["h"]), use_w=call.get("w") is not None,
                       state_v_first=bool(call.get("state_v_first")),
                       varlen=call.get("cu_seqlens") is not None,
                       dstate_dtype=_dtype_name(call["dh"]))


def make_inputs(config: DqkwgConfig, seed: int, device: Any, n_chunks: int = N_CHUNKS,
                batch: int = BATCH) -> dict[str, Any]:
    """Random (never zero) gated-call inputs of `config`: T = n_chunks chunks, the last one ragged,
    gates as chunk-local cumulative log2 decays (the form FLA's backward receives)."""
    import torch

    B = 1 if config.varlen else batch
    BT, H, HV, K, V = config.BT, config.H, config.HV, config.K, config.V
    T = max(1, n_chunks * BT - BT // 2)
    gen = torch.Generator().manual_seed(seed)
    dt, st = getattr(torch, config.dtype), getattr(torch, config.state_dtype)
    dst = getattr(torch, config.dstate_dtype or config.state_dtype)

    def r(*shape: int, scale: float = 1.0, dtype: Any = dt) -> Any:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    cu = None
    if config.varlen:  # two sequences, neither a multiple of BT
        cut = max(1, (T // 2) - 3)
        cu = torch.tensor([0, cut, T], dtype=torch.long, device=device)
        starts = [0, cut]
    else:
        starts = [0]
    n_total = sum(math.ceil((e - s) / BT) for s, e in zip(starts, [*starts[1:], T], strict=True))
    steps = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen) + 2.0) / math.log(2)
    g = torch.empty_like(steps)
    for s, e in zip(starts, [*starts[1:], T], strict=True):
        for c in range(s, e, BT):
            g[:, c:min(c + BT, e)] = steps[:, c:min(c + BT, e)].cumsum(1)
    NT = n_total if config.varlen else math.ceil(T / BT)
    hs = (B, NT, HV, V, K) if config.state_v_first else (B, NT, HV, K, V)
    return dict(
        q=r(B, T, H, K, scale=K ** -0.5), k=r(B, T, H, K, scale=K ** -0.5), v=r(B, T, HV, V),
        do=r(B, T, HV, V), h=r(*hs, scale=0.3, dtype=st), dh=r(*hs, scale=0.3, dtype=dst),
        w=r(B, T, HV, K, scale=K ** -0.5) if config.use_w else None,
        g=g.to(device=device, dtype=torch.float32), g_gamma=None,
        dv=r(B, T, HV, V) if config.use_w else None, scale=K ** -0.5,
        state_v_first=config.state_v_first, cu_seqlens=cu, chunk_size=BT,
    )


def _as_float32(kwargs: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {n: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
            for n, x in kwargs.items()}


def _rel(x: Any, ref: Any) -> float:
    x, ref = x.double(), ref.double()
    if not bool(x.isfinite().all()):
        return math.inf
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def _chunk_rel(x: Any, ref: Any, BT: int) -> float:
    """Worst relative L2 error over chunks of BT tokens (dim 1 is time in every output)."""
    worst = 0.0
    for s in range(0, x.shape[1], BT):
        worst = max(worst, _rel(x[:, s:s + BT], ref[:, s:s + BT]))
    return worst


def run_selfcheck(candidate: Callable[..., Any], reference: Callable[..., Any],
                  config: DqkwgConfig, device: Any = "cpu", seeds: tuple[int, ...] | None = None,
                  n_chunks: int | None = None, batch: int | None = None,
                  tolerance: float | None = None) -> SelfCheckResult:
    """Compare `candidate` (chunk_bwd_dqkwg signature) with `reference` run on float32 copies of
    the same inputs, for every seed; then call the candidate again on the first seed's inputs and
    require the same bits. Exceptions from the candidate count as a failure. Sizes default to
    the module's SEEDS / N_CHUNKS / BATCH."""
    import torch

    seeds = SEEDS if seeds is None else seeds
    n_chunks = N_CHUNKS if n_chunks is None else n_chunks
    batch = BATCH if batch is None else batch
    tol = TOLERANCE[config.dtype] if tolerance is None else tolerance
    errors = dict.fromkeys(OUTPUTS, 0.0)
    chunk_errors = dict.fromkeys(OUTPUTS, 0.0)
    result = SelfCheckResult(config, False, "", seeds=len(seeds), chunks=n_chunks)
    first: tuple | None = None
    first_inputs: dict[str, Any] | None = None
    present: list[str] = []
    try:
        for seed in seeds:
            kw = make_inputs(config, seed, device, n_chunks, batch)
            got = tuple(candidate(**kw))
            want = tuple(reference(**_as_float32(kw)))
            for name, x, y in zip(OUTPUTS, got, want, strict=True):
                if (x is None) != (y is None):
                    result.reason = f"{name} is {'missing' if x is None else 'unexpected'}"
                    return result
                if x is None:
                    continue
                if name not in present:
                    present.append(name)
                if tuple(x.shape) != tuple(y.shape):
                    result.reason = f"{name} has shape {tuple(x.shape)}, expected {tuple(y.shape)}"
                    return result
                errors[name] = max(errors[name], _rel(x, y))
                chunk_errors[name] = max(chunk_errors[name], _chunk_rel(x, y, config.BT))
            if first is None:
                first, first_inputs = got, kw
        assert first is not None and first_inputs is not None
        again = tuple(candidate(**first_inputs))
        result.deterministic = all(
            (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
            for a, b in zip(first, again, strict=True))
    except Exception as exc:  # a kernel that cannot run this configuration fails the check
        result.reason = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return result
    result.errors = {n: errors[n] for n in present}
    result.chunk_errors = {n: chunk_errors[n] for n in present}
    bad = [n for n in present if not (errors[n] <= tol and chunk_errors[n] <= tol * PER_CHUNK_FACTOR)]
    if bad:
        n = bad[0]
        result.reason = (f"{n} rel err {errors[n]:.2e} (worst chunk {chunk_errors[n]:.2e}) over "
                         f"tolerance {tol:.0e}")
    elif not result.deterministic:
        result.reason = "a repeat on the same inputs gave different bits (a race?)"
    else:
        result.passed = True
        result.reason = f"every output within {tol:.0e} of the reference, bitwise repeatable"
    return result


# --------------------------------------------------------------------------- FLA's kernel
def unguarded_fla_dqkwg(original: Callable[..., Any] | None = None) -> Callable[..., Any] | None:
    """FLA's own chunk_bwd_dqkwg with its #640 refusal switched off, or None if this FLA has no
    such function. A copy of the function whose globals say "not Hopper" for the guard only:
    FLA's module is not modified, and every other name resolves to FLA's own objects."""
    import inspect

    if original is None:
        try:
            from fla.ops.common import chunk_o
        except Exception:
            return None
        original = getattr(chunk_o, "chunk_bwd_dqkwg", None)
    fn = inspect.unwrap(original) if original is not None else None
    if not isinstance(fn, types.FunctionType) or "IS_NVIDIA_HOPPER" not in fn.__code__.co_names:
        return None
    clone = types.FunctionType(fn.__code__, {**fn.__globals__, "IS_NVIDIA_HOPPER": False},
                               fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__doc__ = "FLA's chunk_bwd_dqkwg without the #640 refusal (fastpath self-checked)."
    return clone


def fla_kernel_config() -> str | None:
    """The launch config FLA's autotuner picked last for chunk_bwd_kernel_dqkwg, if readable."""
    try:
        from fla.ops.common import chunk_o
    except Exception:
        return None
    obj: Any = getattr(chunk_o, "chunk_bwd_kernel_dqkwg", None)
    for _ in range(4):
        best = getattr(obj, "best_config", None)
        if best is not None:
            return str(best)
        obj = getattr(obj, "fn", None)
        if obj is None:
            break
    return None


# --------------------------------------------------------------------------- policy + records
RESULTS: dict[DqkwgConfig, SelfCheckResult] = {}


def route_mode() -> str:
    """FASTPATH_FLA_DQKWG, validated (bad values are a usage error, not a silent default)."""
    return env_mode(ENV_MODE, MODES)


def fla_allowed(call: dict[str, Any], fla_fn: Callable[..., Any] | None,
                reference: Callable[..., Any]) -> bool:
    """Whether FLA's (unguarded) kernel may take this call: the env var, else the self-check of
    the call's configuration (run once per process; never while a CUDA graph is being captured
    or torch.compile traces - then only an earlier verdict counts)."""
    mode = route_mode()
    if mode == "torch" or fla_fn is None:
        return False
    if mode == "fla":
        return True
    config = config_of_call(call)
    result = RESULTS.get(config)
    if result is None:
        if _capturing():
            return False
        with _lock:
            result = RESULTS.get(config)
            if result is None:
                result = check_config(config, fla_fn, reference, call["q"].device)
    return result.passed


def _capturing() -> bool:
    import torch

    if torch.compiler.is_compiling():
        return True
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_config(config: DqkwgConfig, fla_fn: Callable[..., Any], reference: Callable[..., Any],
                 device: Any, **kwargs: Any) -> SelfCheckResult:
    """Run, record and announce the self-check of one configuration."""
    result = run_selfcheck(fla_fn, reference, config, device, **kwargs)
    result.kernel_config = fla_kernel_config()
    RESULTS[config] = result
    if result.passed:
        _log.info("fastpath: FLA gated chunk_bwd_dqkwg self-check %s", result.line())
    else:
        warnings.warn(f"fastpath: FLA's gated chunk_bwd_dqkwg failed the self-check for "
                      f"{result.line()}; that configuration keeps fastpath's PyTorch route",
                      RuntimeWarning, stacklevel=3)
    _write_facts()
    return result


def describe() -> list[str]:
    """One line per configuration checked in this process (for explain() and reports)."""
    mode = os.environ.get(ENV_MODE, "auto")
    if not RESULTS:
        return [f"FLA gated dqkwg ({ENV_MODE}={mode}): no configuration self-checked yet in "
                "this process (it runs at the first backward of each)"]
    return [f"FLA gated dqkwg self-check ({ENV_MODE}={mode}): {r.line()}" for r in RESULTS.values()]


def facts_path() -> Path:
    """Where the self-check results are written for the doctor (FASTPATH_CACHE_DIR overrides)."""
    base = os.environ.get("FASTPATH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "fastpath")
    return Path(base) / "fla_dqkwg_selfcheck.json"


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {}
    try:
        import torch
        import triton

        env["torch"], env["triton"] = torch.__version__, triton.__version__
        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name()
            env["capability"] = list(torch.cuda.get_device_capability())
    except Exception:
        pass
    try:
        from importlib.metadata import version

        env["fla-core"] = version("fla-core")
    except Exception:
        pass
    return env


def _write_facts() -> None:
    """Best effort: a read-only cache directory must not break training."""
    path = facts_path()
    payload = {"environment": _environment(), "mode": os.environ.get(ENV_MODE, "auto"),
               "results": [dict(asdict(r), config_label=r.config.label())
                           for r in RESULTS.values()]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        tmp.replace(path)
    except OSError:
        pass
