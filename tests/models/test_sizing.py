"""verify / bench size the job before allocating: the estimate, transformers' defaults called
out, and a refusal in one line that happens before the model exists (peak RSS stays small)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fastpath.models.sizing import JobSize, check_fits, estimate

# ~270 B parameters (1 TB in fp32) from a config file of a few lines: no machine has that free.
HUGE = {
    "model_type": "qwen3_5_text", "hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 64,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 1000,
}


def test_a_config_that_leaves_its_size_to_transformers_says_so():
    # A bare model_type is transformers' default Qwen3.5 text model: ~9B parameters.
    from fastpath.models.resolve import transformers_config

    raw = {"model_type": "qwen3_5_text"}
    config = transformers_config(raw)
    size = estimate(config, raw, dtype="fp32", device="cpu", batch=2, seq_len=256, backward=False, paths=2)
    assert size.parameters > 5e9
    assert {d.split("=")[0] for d in size.defaults} == {"hidden_size", "num_hidden_layers", "intermediate_size",
                                                         "vocab_size"}
    assert "transformers' defaults size the model" in size.defaults_note()
    assert size.peak_bytes >= size.parameters * 4  # fp32 weights at least


def test_the_parameter_count_is_exact(tmp_path):
    from fastpath.models.build import build_model
    from fastpath.models.resolve import transformers_config

    raw = {"model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
           "layer_types": ["conv", "full_attention", "conv"]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    size = estimate(transformers_config(raw), raw, dtype="bf16", device="cpu", batch=1, seq_len=8,
                    backward=True, paths=2)
    built = build_model(str(path), device="cpu")
    assert size.parameters == sum(p.numel() for p in built.model.parameters())
    assert len(size.layer_parameters) == 3 and size.weight_bytes == 2 * size.parameters
    assert not size.defaults


def test_refusal_suggests_what_would_fit():
    size = JobSize(parameters=10 * 10**9, layer_parameters=[10**9] * 8, weight_bytes=40 * 10**9,
                   activation_bytes=10**9, peak_bytes=41 * 10**9, dtype="fp32", device="cpu",
                   free_bytes=16 * 10**9, free_source="RAM")

    def refit(layers=None, dtype=None, seq_len=None, batch=None):
        params = 2 * 10**9 + (layers if layers is not None else 8) * 10**9
        return params * 4

    with pytest.raises(Exception, match=r"needs about 41.0 GB .* RAM has 16.0 GB free \(a job plans on 90% of it: 14.4 GB\); "
                       r"try --layers 1$"):
        check_fits(size, "verify x", refit, min_layers=1)


@pytest.mark.parametrize("command", ["verify", "bench"])
def test_a_job_that_cannot_fit_is_refused_before_allocating(tmp_path, command):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(HUGE))
    code = (
        "import resource, sys\n"
        "from fastpath.cli import main\n"
        f"rc = main([{command!r}, {str(path)!r}, '--device', 'cpu', '--out', {str(tmp_path / 'out')!r}]"
        f" if {command!r} == 'bench' else [{command!r}, {str(path)!r}, '--device', 'cpu'])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"fastpath {command}: error: {command} {path} needs about" in errors[0]
    assert "GB free" in errors[0]
    peak_kib = int(proc.stdout.strip().splitlines()[-1])
    assert peak_kib < 3 * 2**20, f"peak RSS {peak_kib / 2**20:.1f} GiB: the model was allocated"
    assert not (tmp_path / "out").exists()  # bench wrote nothing: no worker ever started


# --- estimates that name their inputs --------------------------------------------------------------------------

MAMBA2 = {  # small enough for a CPU, with the scan shapes of the real families (chunk 256, state 128)
    "model_type": "mamba2", "hidden_size": 256, "num_heads": 8, "head_dim": 64, "state_size": 128,
    "n_groups": 1, "chunk_size": 256, "expand": 2, "num_hidden_layers": 2, "vocab_size": 1000,
}


def _sized(raw, **job):
    from fastpath.models.resolve import transformers_config

    config = transformers_config(raw)
    settings = {"dtype": "fp32", "device": "cpu", "batch": 1, "seq_len": 256, "backward": False, "paths": 2, **job}
    return config, estimate(config, raw, **settings), settings


def _refusal(raw, free_fraction, **job):
    """The one-line refusal of a job given `free_fraction` of its estimated peak as free memory."""
    from fastpath.models.sizing import scaled_peak
    from fastpath.shared.errors import UsageError

    config, size, s = _sized(raw, **job)
    size.free_bytes, size.free_source = int(size.peak_bytes * free_fraction), "RAM"

    def refit(layers=None, dtype=None, seq_len=s["seq_len"], batch=s["batch"]):
        return scaled_peak(size, config, layers=layers, dtype=dtype, batch=batch, seq_len=seq_len,
                           backward=s["backward"], paths=s["paths"])

    with pytest.raises(UsageError) as info:
        check_fits(size, "verify m", refit, min_layers=1, batch=s["batch"], seq_len=s["seq_len"])
    return str(info.value)


def test_bf16_never_estimates_more_than_fp32():
    # The estimate had the fp32 gradient oracle (copy + its gradients) alive together with both
    # paths' gradients: bf16 came out above fp32 (46.6 vs 40.1 GB). The oracle is freed before
    # the fast path runs; only its gradients stay.
    raw = dict(HUGE, num_hidden_layers=2, hidden_size=2048, intermediate_size=8192, vocab_size=32000,
               num_attention_heads=16, head_dim=128)
    for backward in (False, True):
        fp32 = _sized(raw, dtype="fp32", backward=backward)[1].peak_bytes
        bf16 = _sized(raw, dtype="bf16", backward=backward)[1].peak_bytes
        assert bf16 <= fp32, (backward, bf16, fp32)


def test_a_weights_bound_refusal_names_layers_or_dtype_not_the_shape():
    raw = dict(HUGE, num_hidden_layers=8, hidden_size=2048, intermediate_size=8192, vocab_size=32000,
               num_attention_heads=16, head_dim=128)
    message = _refusal(raw, 0.6, dtype="fp32", batch=1, seq_len=64)
    assert "--seq-len" not in message and "--batch" not in message, message
    assert "--layers" in message  # bf16 would not help here: the weights are initialised in fp32


def test_the_mamba2_reference_scan_is_in_the_estimate_and_the_refusal_names_the_shape():
    # transformers' torch path materialises C x B as (batch, chunks, 256, 256, heads, 128) in fp32
    # before summing: 1 x 256 x 8 x 256 x 128 x 4 bytes = 268 MB per row of 256 tokens; backward
    # holds both operands' gradients at that size.
    _config, fwd, _ = _sized(MAMBA2, batch=2, seq_len=512)
    assert fwd.reference_scan_bytes == 2 * 512 * 8 * 256 * 128 * 4
    assert fwd.peak_bytes > fwd.reference_scan_bytes > 10 * fwd.weight_bytes
    _config, bwd, _ = _sized(MAMBA2, batch=2, seq_len=512, backward=True)
    assert bwd.reference_scan_bytes == 2 * fwd.reference_scan_bytes
    _config, bench_fast, _ = _sized(MAMBA2, batch=2, seq_len=512, paths=1, reference=False)
    assert bench_fast.reference_scan_bytes == 0  # a bench without the reference configuration
    message = _refusal(MAMBA2, 0.7, batch=2, seq_len=512, backward=True)
    assert "transformers' torch Mamba-2 scan on the reference path" in message
    assert "--seq-len 256" in message or "--batch 1" in message
    assert "--layers" not in message and "--dtype" not in message  # neither would help


@pytest.mark.xfail(strict=False, reason="open: passes alone, but in the full suite the fresh process's RSS "
                   "growth read 699 MB against 284 MB estimated (BENCHMARKS.md, Session 7); cause not found yet")
def test_the_mamba2_reference_path_estimate_is_within_1_3x_of_its_measured_peak(tmp_path):
    """Measured, not assumed: the reference path's forward in a fresh process, peak RSS growth."""
    code = (
        "import json, resource, sys\n"
        "from fastpath.models.build import build_model, resolve_model\n"
        "from fastpath.models.sizing import estimate\n"
        "from fastpath.proof.run_paths import make_inputs, run_path\n"
        f"plan = resolve_model({str(tmp_path / 'm.json')!r}, layers=None, dtype='fp32', device='cpu')\n"
        "size = estimate(plan.config, plan.source.decoder, dtype='fp32', device='cpu', batch=1, seq_len=256,"
        " backward=False, paths=1)\n"
        # the modeling code imported before the baseline: the estimate counts tensors, not modules
        "import transformers.models.mamba2.modeling_mamba2, torch; torch.zeros(1).sum()\n"
        "base = int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) * 1024\n"
        f"built = build_model({str(tmp_path / 'm.json')!r}, device='cpu')\n"
        "run_path(built.model, make_inputs(built.vocab_size, 1, 256, False, 0, built.device),"
        " packed_reference=True, backward=False)\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base\n"
        "print(json.dumps([size.peak_bytes, peak]))\n"
    )
    (tmp_path / "m.json").write_text(json.dumps(MAMBA2))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "TRITON_INTERPRET": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    estimated, measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured > 2e8  # the scan's 268 MB transient really happened
    assert 1 / 1.3 <= estimated / measured <= 1.3, (estimated, measured)
