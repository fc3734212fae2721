"""What `fastpath bench` runs: the configurations (one worker process each), the phases it
times (a registry: a new phase is one `register_phase` call), and the settings both sides share.

Light at import (no torch): the parent validates against these before starting any worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastpath.shared.errors import UsageError

SCHEMA = "fastpath.bench/1"
PROGRESS_PREFIX = "@fastpath-bench-progress "

# A phase runner: (model, input ids [B, L], settings) -> (timed fn, untimed setup before each call
# or None, tokens processed per call). Runners import torch themselves (they run in the worker).
PhaseRunner = Callable[[Any, Any, "BenchSettings"], tuple[Callable[[], Any], "Callable[[], Any] | None", int]]

# A self-timed phase: (model, input ids, settings) -> its JSON entry, with `tokens_per_call` and
# `samples_s` (seconds per call, one per repeat; the worker adds median, tokens/s, peak memory),
# or `skipped` / `error` (one line, no number). For work the worker's timer cannot wrap: a
# CUDA-graph decode warms up, captures once and replays, and its capture must stay out of the
# timing. Extra fields are kept; `note` (one line) goes under bench.md's table.
PhaseMeasure = Callable[[Any, Any, "BenchSettings"], dict[str, Any]]

NEEDS_CUDA = "needs a CUDA device"


@dataclass(frozen=True)
class Phase:
    """One timed phase: its JSON key, the label tables use, and how the worker runs it (exactly
    one of `runner`, timed by the worker, and `measure`, which times itself)."""

    name: str
    label: str
    runner: PhaseRunner | None = None
    backward: bool = False  # keeps gradients and saved activations (sizing reads this)
    default: bool = True  # part of the default --phases (on a CUDA device only, if needs_cuda)
    measure: PhaseMeasure | None = None
    needs_cuda: bool = False  # elsewhere its entry is {"skipped": NEEDS_CUDA}
    versus: str | None = None  # also compared with this phase of the reference configuration
    about: str = ""  # one line for `fastpath bench --help`

    def __post_init__(self) -> None:
        if (self.runner is None) == (self.measure is None):
            raise ValueError(f"phase {self.name!r} needs exactly one of runner and measure")


PHASE_REGISTRY: dict[str, Phase] = {}


def register_phase(phase: Phase) -> Phase:
    """Add a phase (e.g. a CUDA-graph decode) to bench; its runner is called in the worker."""
    PHASE_REGISTRY[phase.name] = phase
    return phase


def phase_label(name: str) -> str:
    phase = PHASE_REGISTRY.get(name)
    return phase.label if phase is not None else name


def default_phases(device: str = "cpu") -> tuple[str, ...]:
    """The phases bench runs without --phases on `device`: a CUDA-only phase only on CUDA."""
    cuda = device.startswith("cuda")
    return tuple(name for name, phase in PHASE_REGISTRY.items()
                 if phase.default and (cuda or not phase.needs_cuda))


@dataclass(frozen=True)
class ConfigSpec:
    """One way of running the model: which packages the worker hides, whether it enables fastpath."""

    name: str
    label: str
    enable: bool
    hide: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # top-level modules that must be importable (else skipped)
    needs_cuda: bool = False
    compile: bool = False  # torch.compile the model's forward (prefill and forward+backward only)
    default: bool = True   # part of `--configs`' default list
    liger: bool = False    # Liger Kernel's patch for the family on the built model (routing/liger_route)


CONFIGS: dict[str, ConfigSpec] = {
    # The torch fallback users get without the compiled packages (hidden even where installed).
    "reference": ConfigSpec("reference", "transformers torch fallback", enable=False,
                            hide=("causal_conv1d", "causal_conv1d_cuda", "fla")),
    "fastpath": ConfigSpec("fastpath", "fastpath.enable()", enable=True),
    # FLA's gated delta rule with transformers' torch conv: what fastpath adds on top of FLA.
    "fla": ConfigSpec("fla", "FLA, torch conv", enable=False, hide=("causal_conv1d", "causal_conv1d_cuda"),
                      requires=("fla",), needs_cuda=True),
    # The compiled peers, as transformers binds them itself when they are installed.
    "fla+dao": ConfigSpec("fla+dao", "FLA + Dao causal-conv1d CUDA", enable=False,
                          requires=("causal_conv1d", "causal_conv1d_cuda", "fla"), needs_cuda=True),
    # fastpath's kernels plus torch.compile of the rest of the model (RMSNorms, MLP activations,
    # residuals, loss): what is left after the hybrid layers is transformers' eager model-wide work.
    # Opt-in (compiling takes minutes on a large model).
    "fastpath+compile": ConfigSpec("fastpath+compile", "fastpath.enable() + torch.compile", enable=True,
                                   compile=True, default=False),
}
# Liger Kernel (`[train]` extra) on the built model, after enable() where the base enables:
# `apply_liger_kernel_to_<family>(model=...)` (RMSNorm, SwiGLU MLP, fused linear cross-entropy:
# the train phase then takes its loss from the model with labels, logits never materialised).
# A model type Liger has no patch for is skipped with the reason. Opt-in: a training-memory lever.
# CUDA only: Liger's kernels have no CPU path (and its RMSNorm / SwiGLU kernels do not run under
# the Triton 3.9 interpreter: tests/support/liger_interpreter.py says why).
for _base in ("reference", "fastpath", "fla+dao"):
    _spec = CONFIGS[_base]
    CONFIGS[f"{_base}+liger"] = ConfigSpec(
        f"{_base}+liger", f"{_spec.label} + Liger Kernel", enable=_spec.enable, hide=_spec.hide,
        requires=(*_spec.requires, "liger_kernel"), needs_cuda=True, default=False, liger=True)
DEFAULT_CONFIGS = tuple(name for name, spec in CONFIGS.items() if spec.default)
#: the phases a compiled configuration times (decode's growing cache would recompile every step)
COMPILED_PHASES = ("prefill", "train")


@dataclass
class BenchSettings:
    source: str
    layers: int | None = None
    dtype: str = "fp32"
    device: str = "cpu"
    seq_len: int = 4096
    batch: int = 1
    decode_tokens: int = 64
    repeats: int = 5
    warmup: int = 2
    seed: int = 0
    phases: tuple[str, ...] = field(default_factory=lambda: default_phases())

    def validate(self) -> None:
        if self.seq_len < 2:
            raise UsageError("--seq-len must be at least 2")
        if self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if self.warmup < 0:
            raise UsageError("--warmup must be >= 0")
        if any(p.startswith("decode") for p in self.phases) and self.decode_tokens < 1:
            raise UsageError("--decode-tokens must be at least 1")
        if not self.phases:
            raise UsageError(f"--phases is empty; phases: {', '.join(PHASE_REGISTRY)}")
        unknown = [p for p in self.phases if p not in PHASE_REGISTRY]
        if unknown:
            raise UsageError(f"unknown phase {unknown[0]!r}; phases: {', '.join(PHASE_REGISTRY)}")
        if self.layers is not None:
            from fastpath.models.resolve import check_layers

            check_layers(self.layers)




# ---------------------------------------------------------------------------------------------
# The built-in phases


def _prefill(model: Any, ids: Any, settings: BenchSettings) -> tuple[Callable[[], Any], None, int]:
    """Forward without grad over B x L tokens, logits for the last token only (as serving does)."""
    import torch

    def run() -> None:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return run, None, ids.numel()


def _train(model: Any, ids: Any, settings: BenchSettings) -> tuple[Callable[[], Any], None, int]:
    """Forward + backward of a next-token loss over B x L tokens (the mean over B x (L-1)
    predictions; through Liger's fused linear cross-entropy where a +liger configuration put it,
    or through fastpath's where enable() routed the causal-LM loss: the model shifts `labels=ids`
    itself, ignoring each row's last position, so the same B x (L-1) predictions)."""
    import torch

    from fastpath.routing import lm_head_route
    from fastpath.routing.liger_route import fused_loss_in_place, next_token_loss

    if fused_loss_in_place(model):
        def fused() -> None:
            model.zero_grad(set_to_none=True)
            next_token_loss(model, ids).backward()
        return fused, None, ids.numel()

    if lm_head_route.fused_loss_in_place(model):
        def fastpath_fused() -> None:
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return fastpath_fused, None, ids.numel()

    def run() -> None:
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, use_cache=False)
        logits = out.logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
    return run, None, ids.numel()


def _decode(model: Any, ids: Any, settings: BenchSettings) -> tuple[Callable[[], Any], Callable[[], Any], int]:
    """N single-token cached steps after an (untimed) prefill of the L-token prompt."""
    import torch

    from fastpath.models.greedy import prefill, step

    holder: dict[str, Any] = {}

    def setup() -> None:
        holder.clear()
        with torch.no_grad():
            holder["state"] = prefill(model, ids)

    def run() -> None:
        with torch.no_grad():
            state = holder["state"]
            for _ in range(settings.decode_tokens):
                state = step(model, state)
            holder["state"] = state
    return run, setup, ids.shape[0] * settings.decode_tokens


def _decode_graph(model: Any, ids: Any, settings: BenchSettings) -> dict[str, Any]:
    """The decode phase's N steps per timed call, on transformers' StaticCache, each step replayed
    from one CUDA graph (proof/decode_graphs.py): capture untimed, tokens checked against eager."""
    from fastpath.proof.decode_graphs import bench_phase

    return bench_phase(model, ids, settings.decode_tokens, warmup=settings.warmup,
                       repeats=settings.repeats)


register_phase(Phase("prefill", "prefill", _prefill))
register_phase(Phase("train", "forward+backward", _train, backward=True))
register_phase(Phase("decode", "decode", _decode))
register_phase(Phase(
    "decode-graph", "decode (CUDA graph)", measure=_decode_graph, needs_cuda=True, versus="decode",
    about="the decode steps replayed from one CUDA graph on transformers' StaticCache (capture timed "
          "apart, tokens checked against eager); where it cannot run (no CUDA, a transformers whose "
          "StaticCache cannot hold the model's layers) its cell says why instead of a number"))
