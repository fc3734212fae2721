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
    from fastpath.models.build import transformers_config

    raw = {"model_type": "qwen3_5_text"}
    config = transformers_config(raw)
    size = estimate(config, raw, dtype="fp32", device="cpu", batch=2, seq_len=256, backward=False, paths=2)
    assert size.parameters > 5e9
    assert {d.split("=")[0] for d in size.defaults} == {"hidden_size", "num_hidden_layers", "intermediate_size",
                                                         "vocab_size"}
    assert "transformers' defaults size the model" in size.defaults_note()
    assert size.peak_bytes >= size.parameters * 4  # fp32 weights at least


def test_the_parameter_count_is_exact(tmp_path):
    from fastpath.models.build import build_model, transformers_config

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

    def refit(layers=None, dtype=None):
        params = 2 * 10**9 + (layers if layers is not None else 8) * 10**9
        return params * 4

    with pytest.raises(Exception, match=r"needs about 41.0 GB .* RAM has 16.0 GB free; try --layers 1$"):
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
