"""A model source is read once per command: `resolve_model` reads MODEL's config.json and every later
step (sizing, the build, the weight count, capture's layer / tokenizer / client checks) reads the
ResolvedModel it made. Counted on a real config.json on disk, through the one function that reads
config files (fastpath.shared.model_source._read_json), wrapped so every call still reads the file.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastpath
from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.models.build import build_model, build_resolved
from fastpath.models.resolve import ResolvedModel, resolve_model
from fastpath.shared import model_source
from fastpath.shared.errors import UsageError

TINY_LFM2 = {
    "model_type": "lfm2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "conv_bias": True,
    "layer_types": ["conv", "full_attention"],
}


@pytest.fixture(autouse=True)
def _leave_fastpath_disabled():
    yield
    fastpath.disable()


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """How many times each config file was read (the real reader runs every time)."""
    counts: Counter = Counter()
    real = model_source._read_json

    def counting(path: Path, what: str):
        counts[Path(path).resolve()] += 1
        return real(path, what)

    monkeypatch.setattr(model_source, "_read_json", counting)
    return counts


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-lfm2.json"
    path.write_text(json.dumps(TINY_LFM2))
    return path


def _checkpoint_dir(tmp_path: Path) -> Path:
    """A local model directory as a user has one: config.json, safetensors, a fast tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    built = build_model(str(_config(tmp_path)), dtype="fp32", device="cpu", seed=1)
    path = tmp_path / "ckpt"
    built.model.save_pretrained(path, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(TINY_LFM2["vocab_size"])}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                  eos_token="t1", pad_token="t0")
    tok.save_pretrained(path)
    return path


def test_resolve_model_reads_once_and_what_it_made_is_never_read_again(tmp_path, reads):
    config = _config(tmp_path)
    model = resolve_model(str(config), layers=2, dtype="bf16", device="cpu")
    assert reads[config.resolve()] == 1
    assert model.family == "lfm2" and model.layers == 2 and model.min_layers == 2
    assert model.model_dir is None and model.preset is None and model.source.kind == "config"
    with pytest.raises(AttributeError):
        model.dtype = "fp32"  # frozen: passed down, never changed on the way
    moved = model.on("meta")
    assert moved.device.type == "meta" and moved.config is model.config and model.device.type == "cpu"
    # fp32 parameters are counted on the meta device: 2 bytes each in bf16; kept after the first count
    assert model.weight_bytes == build_model(str(config), dtype="bf16", device="cpu").model.num_parameters() * 2
    built = build_resolved(model, seed=0)
    assert built.resolved is model and built.source.text == str(config) and built.num_layers == 2
    assert reads[config.resolve()] == 2  # the one build_model(str) above, nothing for the rest


def test_layers_are_checked_in_one_place_for_every_entry(tmp_path, reads):
    config = str(_config(tmp_path))
    for bad in (0, -1, True):
        with pytest.raises(UsageError, match=r"^--layers must be a positive integer"):
            resolve_model(config, layers=bad, device="meta")
        with pytest.raises(UsageError, match=r"^--layers must be a positive integer"):
            build_model(config, layers=bad, device="meta")


def test_verify_reads_the_config_once(tmp_path, reads, capsys):
    from fastpath.cli import main

    config = _config(tmp_path)
    code = main(["verify", str(config), "--seq-len", "8", "--batch", "1", "--decode-tokens", "0", "--device", "cpu"])
    assert code in (0, 3, 4), capsys.readouterr().err[-2000:]  # PASS, or NOT VERIFIED / SLOW off the interpreter
    assert reads == Counter({config.resolve(): 1})


def test_verify_model_takes_the_commands_resolved_model_as_is(tmp_path, reads):
    from fastpath.proof.run_paths import verify_model

    model = resolve_model(str(_config(tmp_path)), dtype="fp32", device="cpu")
    with pytest.raises(TypeError, match="ResolvedModel's own"):
        verify_model(model, dtype="bf16")
    assert isinstance(model, ResolvedModel) and sum(reads.values()) == 1


def test_bench_preflight_reads_the_config_once(tmp_path, reads):
    from fastpath.proof.bench import preflight
    from fastpath.proof.bench_spec import BenchSettings

    config = _config(tmp_path)
    settings = BenchSettings(source=str(config), layers=None, dtype="fp32", device="cpu", seq_len=8, batch=1,
                             decode_tokens=0, repeats=1, warmup=0, seed=0, phases=("prefill",))
    size = preflight(settings, ["reference"])
    assert size is not None and reads == Counter({config.resolve(): 1})


@pytest.mark.parametrize("fmt,dtype", [("speculators", "fp32"), ("specforge", "bf16")])
def test_a_capture_reads_the_config_once(tmp_path, reads, fmt, dtype):
    from fastpath.capture.options import CaptureOptions
    from fastpath.capture.run import run_capture

    model_dir = _checkpoint_dir(tmp_path)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [(7 * r + i) % 128 for i in range(12)], "loss_mask": [1] * 12})
                            + "\n" for r in range(3)))
    reads.clear()
    result = run_capture(CaptureOptions(model=str(model_dir), data=str(data), out=str(tmp_path / "out"), format=fmt,
                                        dtype=dtype, device="cpu", layers="1", batch_tokens=32, check_every=0,
                                        progress=False, allow_slow=not triton_interpreter_on()))
    assert result.rows == 3 and result.written == 3
    # the tokenizer, the say lines, the build and the client notes all took MODEL from one read
    assert reads == Counter({(model_dir / "config.json").resolve(): 1})
