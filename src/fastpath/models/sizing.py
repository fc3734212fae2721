"""Size a verify / bench job before anything is allocated, and refuse one that cannot fit.

Why: a config.json that names only its model_type gets transformers' default sizes (a bare
`{"model_type": "qwen3_5_text"}` is a 9B-parameter model, 36 GB in fp32), and a cut of a big
preset can still need more memory than the machine has; both used to end in the OOM killer or a
42-line allocator traceback after a minute of silence. The parameter count is exact: the model's
module tree is built on the meta device (no memory). Activations follow from the shapes the
job keeps alive; benchmarks/memory_estimate.py measures the estimate against peak RSS / peak CUDA
memory.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastpath.shared.errors import UsageError, first_line

if TYPE_CHECKING:
    from fastpath.models.resolve import ResolvedModel

# Keys that set a decoder's size; when a config omits one, transformers fills in its default.
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
_SIZE_ALIASES = {"hidden_size": ("d_model", "n_embd"), "num_hidden_layers": ("n_layer", "num_layers")}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Refuse when the estimate exceeds this share of the free memory (allocator slack, fragmentation).
FIT_FRACTION = 0.9
GB = 1e9


def human_count(n: float) -> str:
    """9.0e9 -> '9 B', 2.36e4 -> '23.6 k' (parameters)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def human_bytes(n: float) -> str:
    """Bytes as GB / MB / kB with three significant digits."""
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class ScanShape:
    """One Mamba-2 mixer's chunked scan (transformers' torch_forward reads these attributes)."""

    heads: int
    head_dim: int
    state: int
    chunk: int


@dataclass
class JobSize:
    """The estimate for one job, and the memory it will be compared with."""

    parameters: int
    layer_parameters: list[int]
    weight_bytes: int
    activation_bytes: int  # activations, gradients and verify's fp32 oracle: everything but the weights
    peak_bytes: int
    dtype: str
    device: str
    free_bytes: int | None = None
    free_source: str = ""
    defaults: list[str] = field(default_factory=list)  # "hidden_size=4096" taken from transformers
    largest_tensor: int = 0  # parameters in the biggest single tensor (initialisation copies it)
    scans: list[ScanShape] = field(default_factory=list)  # the Mamba-2 mixers' chunked scans
    reference_scan_bytes: int = 0  # the largest transient of transformers' torch scan (in the peak)

    def header(self) -> list[str]:
        """The estimate as two short lines (each fits 80 columns behind a 'verify: ' prefix)."""
        peak = f"estimate: peak ~{human_bytes(self.peak_bytes)}"
        if self.free_bytes is not None:
            peak += f" (free {self.free_source} {human_bytes(self.free_bytes)})"
        return [peak, f"weights {human_bytes(self.weight_bytes)} ({human_count(self.parameters)} parameters, "
                      f"{self.dtype}); activations, gradients {human_bytes(self.activation_bytes)}"]

    def defaults_note(self) -> str | None:
        if not self.defaults:
            return None
        return ("the config does not give " + ", ".join(d.split("=")[0] for d in self.defaults)
                + "; transformers' defaults size the model: " + ", ".join(self.defaults))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Counting


def defaults_used(given: dict[str, Any], config: Any) -> list[str]:
    """Size keys the decoder config as given (ModelSource.decoder) leaves to transformers'
    defaults, with the value used."""
    out = []
    for key in SIZE_KEYS:
        if key in given or any(alias in given for alias in _SIZE_ALIASES.get(key, ())):
            continue
        value = getattr(config, key, None)
        if isinstance(value, int):
            out.append(f"{key}={value}")
    return out


def _layer_list(model: Any) -> Any:
    """The decoder's ModuleList of layers (the longest ModuleList in the model)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len, default=[])


def _scan_shapes(model: Any) -> list[ScanShape]:
    """The Mamba-2 mixers of a (meta) model: modules with the four attributes every transformers
    5.x Mamba-2 family's mixer sets (mamba2, nemotron_h, granitemoehybrid, bamba, falcon_h1, zamba2)."""
    out = []
    for module in model.modules():
        values = [getattr(module, name, None) for name in ("num_heads", "head_dim", "ssm_state_size", "chunk_size")]
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            out.append(ScanShape(*values))
    return out


def count_parameters(config: Any) -> tuple[int, list[int], int, list[ScanShape]]:
    """(total, per decoder layer, largest tensor) parameters of the causal LM `config` builds,
    and its Mamba-2 scans: exact, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except Exception as exc:  # a config with impossible sizes (negative, zero heads): bad input
            raise UsageError(f"transformers cannot build {config.model_type!r} from this config: "
                             f"{exc.__class__.__name__}: {first_line(exc)}") from None
    total = sum(p.numel() for p in model.parameters())
    layers = [sum(p.numel() for p in layer.parameters()) for layer in _layer_list(model)]
    largest = max((p.numel() for p in model.parameters()), default=0)
    return int(total), [int(n) for n in layers], int(largest), _scan_shapes(model)


def _dims(config: Any) -> dict[str, int]:
    def get(*names: str, default: int = 0) -> int:
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return default

    hidden = get("hidden_size", "d_model")
    return {
        "hidden": hidden,
        "intermediate": get("intermediate_size", "block_ff_dim", "ffn_hidden_size", default=4 * hidden),
        "vocab": get("vocab_size"),
        # the widest linear-attention / SSM projection a layer computes in torch (per token)
        "mixer": max(get("linear_num_value_heads") * get("linear_value_head_dim")
                     + 2 * get("linear_num_key_heads") * get("linear_key_head_dim"),
                     get("num_heads", "mamba_n_heads") * get("head_dim", "mamba_d_head"),
                     2 * get("expand") * hidden, hidden),
    }


def activation_bytes(config: Any, layers: int, *, dtype: str, batch: int, seq_len: int,
                     backward: bool, paths: int) -> int:
    """Bytes of activations at the job's peak (weights and gradients not included).

    paths: how many complete forward results stay alive at once (verify keeps the reference's
    hidden states and logits while the fast path runs: 2; bench: 1). Per path: every layer's
    hidden states and the logits. Transient: one layer's MLP and mixer working set, and the fp32
    logits a loss or a comparison makes. With backward: what autograd saves per layer (about 12
    hidden-sized and 4 intermediate-sized tensors per token in these families).
    """
    e = DTYPE_BYTES[dtype]
    d = _dims(config)
    tokens = batch * seq_len
    kept = paths * tokens * ((layers + 1) * d["hidden"] * e + d["vocab"] * e)
    transient = tokens * max(3 * d["intermediate"] * e, 6 * d["mixer"] * 4) + 2 * tokens * d["vocab"] * 4
    saved = 0
    if backward:
        saved = layers * tokens * (12 * d["hidden"] + 4 * d["intermediate"] + 2 * d["mixer"]) * e
        saved += tokens * d["vocab"] * 4 * 2  # fp32 logits for the loss and their gradient
    return int(kept + transient + saved)


def reference_scan_bytes(scans: list[ScanShape], *, batch: int, seq_len: int, backward: bool) -> int:
    """The largest transient of transformers' torch path for Mamba-2 (torch_forward ->
    the chunked scan, e.g. models/granitemoehybrid/modeling_granitemoehybrid.py in 5.17): in fp32
    it materialises broadcast products before summing them, (B, chunks, Q, Q, heads, state) for
    C x B, (B, chunks, Q, Q, heads, head_dim) for the diagonal block and (B, chunks, Q, heads,
    head_dim, state) for the chunk states, the sequence padded to whole chunks of Q. Autograd's
    backward of such a product holds the gradient of both operands at full size at once (x2).
    Measured on an H200: granite-4.0-h-small, 4 layers, B=2, L=1024 held 95.5 GB and asked for
    32 GiB more: 2 x 128 heads x 1024 x 256 x 128 x 4 bytes is 34.4 GB."""
    worst = 0
    for s in scans:
        padded = -(-seq_len // s.chunk) * s.chunk
        per_token = s.heads * max(s.chunk * s.state, s.chunk * s.head_dim, s.head_dim * s.state)
        worst = max(worst, batch * padded * per_token)
    return 4 * worst * (2 if backward else 1)


def peak_bytes(params: int, largest: int, activations: int, *, dtype: str, backward: bool, paths: int,
               scan: int = 0, oracle_activations: int | None = None) -> tuple[int, int]:
    """(estimated peak, bytes beyond the weights) of a job with `params` parameters: the largest
    of the phases that run one after the other.

    Construction: weights are initialised in fp32 and converted afterwards, so a bf16 job briefly
    holds 4 bytes per parameter, plus a temporary copy of one tensor while it is initialised
    (measured: the embedding, 0.5 GB for LFM2). `scan`: the torch reference path's Mamba-2 scan
    transient (reference_scan_bytes), live only while the reference path (or verify's fp32 oracle
    of it) runs. verify with backward (paths=2) keeps the reference's gradients while the fast path
    runs; in bf16/fp16 it first (before either path) runs an fp32 copy of the model with fp32
    gradients, the gradient oracle (its activations fp32, `oracle_activations`), and keeps only
    those gradients: the copy never lives beside the paths' gradients, so a bf16 job needs 10
    bytes per parameter (fp32: 12).
    """
    e = DTYPE_BYTES[dtype]
    # Backward also holds two transient copies of the largest gradient (measured on LFM2, whose
    # tied 65536 x 2048 embedding gets a dense gradient from the lookup and one from the head).
    def spike(nbytes: int) -> int:
        return 2 * largest * nbytes if backward else 0

    if backward and paths == 2:
        if dtype != "fp32":
            oracle = (params * 4 * 2 + spike(4) + scan
                      + (activations if oracle_activations is None else oracle_activations))
            paths_phase = params * (4 + 2 * e) + spike(e) + scan + activations
            beyond = max(oracle, paths_phase)
        else:
            beyond = params * e + max(scan, params * e) + spike(e) + activations
    else:
        beyond = (params * e * paths if backward else 0) + spike(e) + scan + activations
    return int(max((params + largest) * 4, params * e + beyond)), int(beyond)


def _job_peak(config: Any, params: int, largest: int, scans: list[ScanShape], layers: int, *, dtype: str,
              batch: int, seq_len: int, backward: bool, paths: int, reference: bool) -> tuple[int, int, int]:
    """(peak, beyond the weights, scan transient) of one job shape."""
    acts = activation_bytes(config, layers, dtype=dtype, batch=batch, seq_len=seq_len, backward=backward,
                            paths=paths)
    oracle_acts = None
    if backward and paths == 2 and dtype != "fp32":
        oracle_acts = activation_bytes(config, layers, dtype="fp32", batch=batch, seq_len=seq_len,
                                       backward=True, paths=1)
    scan = reference_scan_bytes(scans, batch=batch, seq_len=seq_len, backward=backward) if reference else 0
    peak, beyond = peak_bytes(params, largest, acts, dtype=dtype, backward=backward, paths=paths, scan=scan,
                              oracle_activations=oracle_acts)
    return peak, beyond, scan


def estimate(config: Any, given: dict[str, Any], *, dtype: str, device: str, batch: int, seq_len: int,
             backward: bool, paths: int, reference: bool = True) -> JobSize:
    """The job's size: parameters (meta build), weights, activations and the estimated peak.
    given: the decoder config as the source gave it (ModelSource.decoder), to say which sizes came
    from transformers' defaults. reference: the job runs transformers' reference path (verify
    always; bench with its 'reference' configuration)."""
    params, per_layer, largest, scans = count_parameters(config)
    layers = len(per_layer) or int(getattr(config, "num_hidden_layers", 1) or 1)
    peak, beyond, scan = _job_peak(config, params, largest, scans, layers, dtype=dtype, batch=batch,
                                   seq_len=seq_len, backward=backward, paths=paths, reference=reference)
    return JobSize(params, per_layer, params * DTYPE_BYTES[dtype], beyond, peak, dtype, device,
                   defaults=defaults_used(given, config), largest_tensor=largest, scans=scans,
                   reference_scan_bytes=scan)


# ---------------------------------------------------------------------------------------------
# Free memory


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def free_ram() -> tuple[int | None, str]:
    """Bytes this process can still allocate: MemAvailable, capped by a cgroup memory limit."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is None:  # cgroup v1
        limit = _read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        used = _read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if limit is not None and used is not None and limit < 1 << 60:
        room = max(limit - used, 0)
        if available is None or room < available:
            return room, "RAM (cgroup limit)"
    if available is None and os.name != "posix":
        return None, ""
    return available, "RAM"


def free_memory(device: Any) -> tuple[int | None, str]:
    """(bytes free, what was read) on `device` (a torch.device)."""
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free), f"GPU memory ({torch.cuda.get_device_name(device)})"
    if device.type == "meta":
        return None, ""
    return free_ram()


# ---------------------------------------------------------------------------------------------
# The guard


def suggestion(size: JobSize, fits: Any, min_layers: int, batch: int | None = None,
               seq_len: int | None = None) -> str:
    """'try --layers 4 or --dtype bf16': only the knobs that would make the job fit on their own
    (a smaller --seq-len does nothing for a job whose weights fill the memory)."""
    options = []
    layers = len(size.layer_parameters)
    best = next((k for k in range(layers - 1, min_layers - 1, -1) if fits(layers=k)), None)
    if best is not None:
        options.append(f"--layers {best}")
    if size.dtype == "fp32" and fits(dtype="bf16"):
        options.append("--dtype bf16")
    if seq_len is not None:
        shorter = next((n for n in (seq_len // 2 ** i for i in range(1, 32)) if n >= 2 and fits(seq_len=n)), None)
        if shorter is not None:
            options.append(f"--seq-len {shorter}")
    if batch is not None and batch > 1 and fits(batch=1):
        options.append("--batch 1")
    if not options:
        return ("it does not fit even with the fewest layers, bf16 or a shorter sequence; use a machine with "
                "more memory")
    return "try " + (", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else options[0])


def check_fits(size: JobSize, what: str, refit: Any, min_layers: int, batch: int | None = None,
               seq_len: int | None = None) -> None:
    """UsageError (exit 2, one line) when the estimated peak exceeds FIT_FRACTION of free memory.

    refit(layers=None, dtype=None, seq_len=None, batch=None) -> peak bytes of the same job with
    fewer layers / another dtype / another shape.
    """
    if size.free_bytes is None or size.peak_bytes <= FIT_FRACTION * size.free_bytes:
        return
    budget = FIT_FRACTION * size.free_bytes

    def fits(**kw: Any) -> bool:
        return refit(**kw) <= budget

    scan = ""
    if size.reference_scan_bytes > size.peak_bytes / 4:
        scan = (f" (of which {human_bytes(size.reference_scan_bytes)} is transformers' torch Mamba-2 scan on the "
                "reference path, which grows with --batch x --seq-len)")
    raise UsageError(
        f"{what} needs about {size.peak_bytes / GB:.1f} GB ({human_count(size.parameters)} parameters, "
        f"{size.dtype}){scan} but {size.free_source} has {size.free_bytes / GB:.1f} GB free (a job plans on "
        f"{FIT_FRACTION:.0%} of it: {budget / GB:.1f} GB); "
        + suggestion(size, fits, min_layers, batch, seq_len)
        + (" (the config leaves its size to transformers' defaults: " + ", ".join(size.defaults) + ")"
           if size.defaults else "")
    )


def scaled_peak(size: JobSize, config: Any, *, layers: int | None = None, dtype: str | None = None,
                batch: int, seq_len: int, backward: bool, paths: int, reference: bool = True) -> int:
    """The estimated peak of the same job with `layers` kept (first k layers' parameters), `dtype`,
    `batch` or `seq_len`."""
    dt = dtype or size.dtype
    k = layers if layers is not None else len(size.layer_parameters)
    nonlayer = size.parameters - sum(size.layer_parameters)
    params = nonlayer + sum(size.layer_parameters[:k]) if size.layer_parameters else size.parameters
    return _job_peak(config, params, size.largest_tensor, size.scans, k, dtype=dt, batch=batch, seq_len=seq_len,
                     backward=backward, paths=paths, reference=reference)[0]


def size_job(model: ResolvedModel, *, what: str, batch: int, seq_len: int, backward: bool, paths: int,
             reference: bool = True) -> JobSize:
    """Estimate, read free memory, refuse when it will not fit (see module doc). Returns the size."""
    config, dtype, device = model.config, model.dtype, model.device
    size = estimate(config, model.source.decoder, dtype=dtype, device=str(device), batch=batch, seq_len=seq_len,
                    backward=backward, paths=paths, reference=reference)
    size.free_bytes, size.free_source = free_memory(device)

    def refit(layers: int | None = None, dtype: str | None = None, seq_len: int = seq_len,
              batch: int = batch) -> int:
        return scaled_peak(size, config, layers=layers, dtype=dtype, batch=batch, seq_len=seq_len,
                           backward=backward, paths=paths, reference=reference)

    check_fits(size, what, refit, model.min_layers, batch, seq_len)
    return size
