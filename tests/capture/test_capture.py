"""fastpath capture: chat rendering and loss masks, the speculators and SpecForge layouts read back
by their own rules, values equal to a direct forward, resume after an interrupted run, a broken
capture and a wrong kernel caught, clean errors; under torchrun (gloo, 2 processes) the same files
as one process with the target replicated or sharded with FSDP2, and no deadlock when one sharded
rank fails or has nothing to do.

CPU only. Under TRITON_INTERPRET=1 (scripts/test.sh) LFM2's convs run fastpath's Triton kernels in
the interpreter, so capture runs on the fast path; Qwen3.5's gated delta rule has no fast path
here (no FLA), so its captures need --allow-slow and the tests check that it is refused without.
Tiny models (hidden 32-64, 4 layers) and a BPE tokenizer trained in the test keep this ~1 minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
pytest.importorskip("datasets")  # the speculators layout (pip install 'fastpath-kit[capture]')

import torch
from tiny_configs import LFM2_4L as TINY_LFM2

import fastpath
from fastpath.capture.data import load_rows, tokenize_chat
from fastpath.capture.layers import default_aux_layers, parse_layers
from fastpath.capture.options import CaptureCheckError, CaptureOptions
from fastpath.capture.packing import batches_for_rank, make_batches
from fastpath.capture.run import run_capture
from fastpath.causal_conv1d import causal_conv1d_fn as real_causal_conv1d_fn
from fastpath.kernels.dispatch import triton_interpreter_on
from fastpath.models.build import build_model
from fastpath.shared.errors import FastpathError, UsageError

# Without the interpreter, fastpath's kernels cannot run on CPU: captures then need --allow-slow.
ALLOW_SLOW = not triton_interpreter_on()

TINY_QWEN35 = {
    "model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "vocab_size": 512,
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONVERSATIONS = [
    [("user", "What is a causal conv?"), ("assistant", "A conv over the past.")],
    [("system", "Be terse."), ("user", "A hybrid model?"), ("assistant", "Qwen3.5."),
     ("user", "Another?"), ("assistant", "LFM2.")],
    [("user", "Say hi"), ("assistant", "hi")],
    [("user", "Count to three"), ("assistant", "one two three")],
    [("user", "Why several depths?"), ("assistant", "EAGLE-3 fuses low, mid and high layers.")],
]


@pytest.fixture(autouse=True)
def _leave_fastpath_disabled():
    yield
    fastpath.disable()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [f"{role}\n{text}" for conv in CONVERSATIONS for role, text in conv] * 8
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)
    return path


def _write_chat(path: Path, form: str) -> Path:
    with path.open("w") as fh:
        for conv in CONVERSATIONS:
            if form == "messages":
                fh.write(json.dumps({"messages": [{"role": r, "content": c} for r, c in conv]}) + "\n")
            else:
                speaker = {"user": "human", "assistant": "gpt", "system": "system"}
                fh.write(json.dumps({"conversations": [{"from": speaker[r], "value": c} for r, c in conv]}) + "\n")
    return path


@pytest.fixture(scope="module")
def lfm2_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("lfm2") / "tiny-lfm2.json"
    path.write_text(json.dumps(TINY_LFM2))
    return str(path)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """A local checkpoint directory: safetensors weights + tokenizer, as a user would have."""
    from transformers import AutoTokenizer

    cfg = tmp_path_factory.mktemp("qcfg") / "c.json"
    cfg.write_text(json.dumps(TINY_QWEN35))
    built = build_model(str(cfg), dtype="fp32", device="cpu", seed=3)
    path = tmp_path_factory.mktemp("qwen35-tiny")
    built.model.save_pretrained(path, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path


def _opts(model: str, data: Path, out: Path, **kw) -> CaptureOptions:
    base = {"dtype": "fp32", "device": "cpu", "layers": "1,2,3", "batch_tokens": 64, "check_every": 0,
            "progress": False, "allow_slow": ALLOW_SLOW}
    base.update(kw)
    return CaptureOptions(model=model, data=str(data), out=str(out), **base)


def _reference_forward(model: object, ids: list[int]) -> tuple[tuple, torch.Tensor]:
    """output_hidden_states plus the last layer's output from a hook (transformers' last entry is
    after the final norm)."""
    seen = {}
    handle = model.model.layers[-1].register_forward_hook(lambda _m, _a, out: seen.setdefault("pre", out))
    try:
        with torch.no_grad():
            out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    return out.hidden_states, seen["pre"][0]


# --- units ----------------------------------------------------------------------------------------


def test_default_layers_and_the_capture_after_convention():
    assert default_aux_layers(64) == [2, 32, 61]
    assert parse_layers(None, 8) == [2, 4, 5]
    # SpecForge's default [1, L//2-1, L-4] (capture-after) names the same states
    assert parse_layers("1,31,60", 64, "after") == default_aux_layers(64)
    with pytest.raises(UsageError, match="collide"):
        default_aux_layers(4)
    with pytest.raises(UsageError, match="outside"):
        parse_layers("1,9", 8)
    with pytest.raises(UsageError, match="repeated"):
        parse_layers("2,2", 8)


def test_batches_respect_the_budget_and_do_not_depend_on_the_world_size():
    lengths = [5, 17, 3, 17, 9, 30, 2, 11]
    batches = make_batches(lengths, 34)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 34 or len(b) == 1 for b in batches)
    dealt = [batches_for_rank(batches, r, 3) for r in range(3)]
    assert sorted(n for d in dealt for n, _ in d) == list(range(len(batches)))
    assert make_batches(lengths, 34) == batches


def test_chat_forms_render_alike_and_mask_only_the_assistant(tokenizer_dir, tmp_path):
    from fastpath.capture.data import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    conv = CONVERSATIONS[1]
    ids, mask = tokenize_chat(tok, [{"role": r, "content": c} for r, c in conv])
    masked = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert masked == "Qwen3.5.<|im_end|>\nLFM2.<|im_end|>\n"
    unmasked = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "A hybrid model?" in unmasked and "Qwen3.5" not in unmasked
    a = load_rows(_write_chat(tmp_path / "m.jsonl", "messages"), tok, 4096, 512)
    b = load_rows(_write_chat(tmp_path / "s.jsonl", "sharegpt"), tok, 4096, 512)
    assert [(r.input_ids, r.loss_mask) for r in a.rows] == [(r.input_ids, r.loss_mask) for r in b.rows]
    short = load_rows(tmp_path / "m.jsonl", tok, 16, 512)
    assert short.truncated > 0 and all(len(r.input_ids) <= 16 for r in short.rows)


# --- speculators layout, LFM2 on the fast path ----------------------------------------------------


@pytest.fixture(scope="module")
def lfm2_capture(tmp_path_factory, lfm2_config, tokenizer_dir):
    root = tmp_path_factory.mktemp("lfm2cap")
    data = _write_chat(root / "sharegpt.jsonl", "sharegpt")
    result = run_capture(_opts(lfm2_config, data, root / "out", tokenizer=str(tokenizer_dir), check_every=2))
    fastpath.disable()
    return result, data


def test_speculators_layout_loads_by_its_own_rules(lfm2_capture, tokenizer_dir):
    import datasets
    from safetensors import safe_open
    from safetensors.torch import load_file

    result, _ = lfm2_capture
    out = result.out
    ds = datasets.load_from_disk(str(out))  # what speculators' ArrowDataset does
    assert len(ds) == result.rows == len(CONVERSATIONS)
    assert set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}
    for i in range(len(ds)):
        item = ds[i]
        assert isinstance(item["input_ids"], torch.Tensor)  # saved with format "torch"
        loaded = load_file(out / "hidden_states" / f"hs_{i}.safetensors")
        assert set(loaded) == {"hidden_states", "token_ids"}
        assert torch.equal(loaded["token_ids"], item["input_ids"])  # speculators' own row check
        assert loaded["hidden_states"].shape == (int(item["seq_len"]), 4, 32)
        assert loaded["hidden_states"].dtype == torch.float32
        # the split speculators' loader makes: 3 aux states, then the verifier's last state
        assert loaded["hidden_states"][:, :-1].flatten(1).shape == (int(item["seq_len"]), 96)
    with safe_open(str(out / "hidden_states" / "hs_0.safetensors"), "pt") as fh:
        meta = fh.metadata()
    if not ALLOW_SLOW:
        assert meta["fastpath_path"] == "fast"
    assert meta["fastpath_layers_capture_before"] == "1,2,3,4"
    assert "rmsnorm(x) * w" in meta["fastpath_final_norm"]
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    expected: dict[int, int] = {}
    for i in range(len(ds)):
        for t, m in zip(ds[i]["input_ids"].tolist(), ds[i]["loss_mask"].tolist(), strict=True):
            if m:
                expected[t] = expected.get(t, 0) + 1
    assert freq == expected
    summary = json.loads((out / "capture_summary.json").read_text())
    assert summary["reference_checks"]["all_ok"] and len(summary["reference_checks"]["rows"]) >= 2
    assert summary["layers"]["aux"] == [1, 2, 3] and summary["layers"]["last"] == 4


def test_speculators_values_equal_a_direct_forward(lfm2_capture, lfm2_config):
    from safetensors.torch import load_file

    result, _ = lfm2_capture
    model = build_model(lfm2_config, dtype="fp32", device="cpu", seed=0).model
    ds_rows = json.loads((result.out / "capture_summary.json").read_text())["rows"]
    for i in range(ds_rows):
        stored = load_file(result.out / "hidden_states" / f"hs_{i}.safetensors")
        hidden, pre = _reference_forward(model, stored["token_ids"].tolist())
        for slot, layer in enumerate([1, 2, 3]):
            torch.testing.assert_close(stored["hidden_states"][:, slot], hidden[layer][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(stored["hidden_states"][:, 3], pre[0] if pre.dim() == 3 else pre,
                                   rtol=1e-4, atol=1e-5)
        # and the last slot is *before* the final norm: it is not transformers' last entry
        assert not torch.allclose(stored["hidden_states"][:, 3], hidden[-1][0], atol=1e-3)


# --- SpecForge layout, Qwen3.5 checkpoint directory ------------------------------------------------


def test_qwen35_refuses_a_fallback_then_writes_specforge_rows(qwen_dir, tmp_path):
    data = _write_chat(tmp_path / "messages.jsonl", "messages")
    model = build_model(str(qwen_dir), dtype="fp32", device="cpu").model
    fastpath.enable(warn=False)
    try:
        fastpath.assert_fast(model)
        on_fast_path = True
    except FastpathError:
        on_fast_path = False
    fastpath.disable()
    if not on_fast_path:
        with pytest.raises(FastpathError, match="refusing to capture on a slow fallback"):
            run_capture(_opts(str(qwen_dir), data, tmp_path / "refused", allow_slow=False, format="specforge",
                              dtype="bf16"))
        assert not (tmp_path / "refused").exists()  # a refusal leaves DIR as it was
    result = run_capture(_opts(str(qwen_dir), data, tmp_path / "out", format="specforge", allow_slow=True,
                               batch_tokens=1024, dtype="bf16"))  # SpecForge reads bf16 only
    files = sorted((tmp_path / "out" / "rows_0-2000").glob("data_*.ckpt"))
    assert [f.name for f in files] == sorted(f"data_{i}.ckpt" for i in range(len(CONVERSATIONS)))
    for i in range(result.rows):
        rec = torch.load(tmp_path / "out" / "rows_0-2000" / f"data_{i}.ckpt", weights_only=True)
        assert set(rec) == {"input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
        seq = rec["input_ids"].shape[0]
        assert rec["input_ids"].dtype == torch.int64 and rec["loss_mask"].shape == (seq,)
        assert rec["aux_hidden_state"].shape == (1, seq, 3 * 64) and rec["hidden_state"].shape == (1, seq, 64)
        # what SpecForge's OfflineEagle3Dataset.process_data does with it
        assert rec["aux_hidden_state"].squeeze(0)[:seq][None, :].shape == (1, seq, 192)
        assert rec["aux_hidden_state"].dtype == rec["hidden_state"].dtype == torch.bfloat16
        hidden, _ = _reference_forward(model, rec["input_ids"].tolist())
        aux = torch.cat([hidden[1][0], hidden[2][0], hidden[3][0]], dim=-1)
        # the fp32 forward against the bf16 capture: bf16 rounding through 4 layers
        torch.testing.assert_close(rec["aux_hidden_state"][0].float(), aux, rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(rec["hidden_state"][0].float(), hidden[-1][0], rtol=3e-2, atol=3e-2)  # post-norm
    meta = json.loads((tmp_path / "out" / "rows_0-2000" / "fastpath_capture.json").read_text())
    assert meta["fastpath_final_norm"] == "model.norm: rmsnorm(x) * (1 + w)"
    if not on_fast_path:
        assert meta["fastpath_path"].startswith("slow (--allow-slow)")


# --- failures are caught, nothing half-written -----------------------------------------------------


def _zero_output(_module, _args, output):
    return torch.zeros_like(output[0] if isinstance(output, tuple) else output)


def test_a_capture_that_returns_zeros_is_stopped_with_the_row_id(lfm2_config, tokenizer_dir, tmp_path):
    data = _write_chat(tmp_path / "d.jsonl", "messages")
    out = tmp_path / "out"

    def break_layer_1(model):
        model.model.layers[1].register_forward_hook(_zero_output)

    with pytest.raises(CaptureCheckError, match=r"row \d+ \(data line \d+\) failed its checks: layer 2: all-zero"):
        run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), on_model=break_layer_1))
    assert not list(out.rglob("*.safetensors")) and not list(out.rglob(".*.tmp*"))
    assert not (out / "capture_summary.json").exists()


def conv_dropping_bias(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                       final_states_out=None, activation=None):
    return real_causal_conv1d_fn(x, weight, None, seq_idx=seq_idx, initial_states=initial_states,
                                 return_final_states=return_final_states, final_states_out=final_states_out,
                                 activation=activation)


@pytest.mark.skipif(ALLOW_SLOW, reason="routing a wrong kernel needs the fast path (TRITON_INTERPRET=1 on CPU)")
def test_the_reference_recheck_catches_a_wrong_kernel(lfm2_config, tokenizer_dir, tmp_path):
    data = _write_chat(tmp_path / "d.jsonl", "messages")
    with pytest.raises(CaptureCheckError, match=r"row \d+ \(data line \d+\): layer \d .*differs from the reference"):
        run_capture(_opts(lfm2_config, data, tmp_path / "out", tokenizer=str(tokenizer_dir),
                          enable_kwargs={"causal_conv1d_fn": conv_dropping_bias}))
    assert not list((tmp_path / "out").rglob("*.safetensors"))


@pytest.mark.skipif(ALLOW_SLOW, reason="routing a wrong kernel needs the fast path (TRITON_INTERPRET=1 on CPU)")
def test_a_prefix_recheck_still_catches_a_wrong_kernel_and_is_recorded(lfm2_config, tokenizer_dir, tmp_path):
    """--recheck-tokens N re-runs only a row's first N tokens (exact for a causal model)."""
    data = _write_chat(tmp_path / "d.jsonl", "messages")
    with pytest.raises(CaptureCheckError, match="differs from the reference"):
        run_capture(_opts(lfm2_config, data, tmp_path / "bad", tokenizer=str(tokenizer_dir), recheck_tokens=6,
                          enable_kwargs={"causal_conv1d_fn": conv_dropping_bias}))
    result = run_capture(_opts(lfm2_config, data, tmp_path / "ok", tokenizer=str(tokenizer_dir), recheck_tokens=6,
                               check_every=2))
    assert result.summary["reference_checks"]["recheck_tokens"] == 6
    assert result.checked and all(c["ok"] for c in result.checked)


def test_resume_after_an_interrupted_run_gives_identical_files(lfm2_capture, lfm2_config, tokenizer_dir, tmp_path):
    clean, shared_data = lfm2_capture
    data = tmp_path / "data.jsonl"
    data.write_bytes(shared_data.read_bytes())
    out = tmp_path / "out"
    calls = {"n": 0}

    def interrupt_third_batch(model):
        def hook(_m, _a):
            calls["n"] += 1
            if calls["n"] == 4:  # forwards: batch 1, its re-check, batch 2, then Ctrl-C
                raise KeyboardInterrupt
        model.model.layers[0].register_forward_pre_hook(hook)

    with pytest.raises(KeyboardInterrupt):
        run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), on_model=interrupt_third_batch,
                          check_every=2))
    partial = sorted(p.name for p in (out / "hidden_states").glob("hs_*.safetensors"))
    assert 0 < len(partial) < clean.rows and not list(out.rglob(".*.tmp*"))
    with pytest.raises(UsageError, match="pass --resume"):
        run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir)))
    original = data.read_bytes()
    data.write_bytes(original.replace(b"Say hi", b"Say yo"))
    with pytest.raises(UsageError, match=r"different settings than the run in .*: data_sha256"):
        run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), resume=True))
    data.write_bytes(original)
    resumed = run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), resume=True, check_every=2))
    assert resumed.skipped_done == len(partial) and resumed.written == clean.rows - len(partial)
    _assert_same_capture(clean.out, out)


def test_resume_recaptures_a_damaged_last_row(lfm2_capture, lfm2_config, tokenizer_dir, tmp_path):
    import shutil

    clean, data = lfm2_capture
    out = tmp_path / "out"
    shutil.copytree(clean.out, out)
    last = out / "hidden_states" / f"hs_{clean.rows - 1}.safetensors"
    last.write_bytes(last.read_bytes()[:100])  # e.g. a copy cut short outside fastpath
    resumed = run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), resume=True))
    assert resumed.written == 1 and resumed.skipped_done == clean.rows - 1
    _assert_same_capture(clean.out, out)


def test_settling_each_batch_before_the_next_forward_writes_the_same_files(lfm2_capture, lfm2_config,
                                                                          tokenizer_dir, tmp_path):
    """--no-overlap (each batch's checks read before the next forward is queued) and the default
    (the next forward first) capture the same bytes."""
    clean, data = lfm2_capture
    serial = run_capture(_opts(lfm2_config, data, tmp_path / "out", tokenizer=str(tokenizer_dir), check_every=2,
                               overlap=False))
    assert [c["row"] for c in serial.checked] == [c["row"] for c in clean.checked]
    _assert_same_capture(clean.out, serial.out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_overlapped_loop_writes_what_the_settled_one_does(lfm2_config, tokenizer_dir, tmp_path):
    """The device half of the overlap (pinned inputs, the checks' numbers copied back behind an
    event, the rows' copies on a side stream) against the loop that settles each batch first."""
    data = _write_chat(tmp_path / "d.jsonl", "sharegpt")
    runs = [run_capture(_opts(lfm2_config, data, tmp_path / f"out-{overlap}", tokenizer=str(tokenizer_dir),
                              device="cuda", check_every=2, overlap=overlap)) for overlap in (True, False)]
    assert all(r.written == len(CONVERSATIONS) and r.checked and all(c["ok"] for c in r.checked) for r in runs)
    _assert_same_capture(runs[0].out, runs[1].out)


@pytest.mark.parametrize(("overlap", "batch_2_call"), [(True, 2), (False, 3)])
def test_a_failed_check_keeps_the_batches_before_it_and_writes_nothing_after(overlap, batch_2_call, lfm2_capture,
                                                                            lfm2_config, tokenizer_dir, tmp_path):
    """Batch 2's states are zeroed: batch 1 is finished work and stays, byte for byte; batch 2
    and batch 3 (overlapped: launched before batch 2's checks are read) leave no file. The
    forwards: batch 1, batch 2, batch 1's first-row re-check, batch 3 (overlapped); batch 1,
    its re-check, batch 2 (not)."""
    from fastpath.capture.packing import make_batches

    clean, data = lfm2_capture
    calls = {"n": 0}

    def zero_batch_2(model):
        def count(_m, _a):
            calls["n"] += 1

        def zero(module, args, output):
            return _zero_output(module, args, output) if calls["n"] == batch_2_call else output
        model.model.layers[0].register_forward_pre_hook(count)
        model.model.layers[1].register_forward_hook(zero)

    out = tmp_path / "out"
    with pytest.raises(CaptureCheckError, match=r"row (\d+) \(data line \d+\) failed its checks: layer 2: all-zero") as err:
        run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), on_model=zero_batch_2, overlap=overlap))
    lengths = _seq_lens(clean.out)
    batches = make_batches(lengths, 64)
    assert len(batches) >= 3
    failed_row = int(err.value.args[0].split()[1])
    assert failed_row in batches[1]
    kept = sorted(p.name for p in (out / "hidden_states").glob("*.safetensors"))
    assert kept == sorted(f"hs_{i}.safetensors" for i in batches[0])
    from safetensors.torch import load_file

    for name in kept:  # the tensors; the header's metadata order varies from write to write
        x, y = load_file(out / "hidden_states" / name), load_file(clean.out / "hidden_states" / name)
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name
    assert not list(out.rglob(".*.tmp*"))


@pytest.mark.parametrize("overlap", [True, False])
def test_a_batchs_host_copies_are_queued_after_the_next_forward(overlap, lfm2_capture, lfm2_config, tokenizer_dir,
                                                                tmp_path, monkeypatch):
    """Overlapped, batch k's rows are copied to the host only once batch k+1's forward is queued
    (on a GPU the forward's own read-back would otherwise wait behind them on the copy engine);
    settled one by one, before it. The files are the same either way."""
    from fastpath.capture.packing import make_batches
    from fastpath.capture.staging import RowWrites

    clean, data = lfm2_capture
    events: list[tuple[str, int]] = []
    copy = RowWrites.copy

    def recorded_copy(self, idx, *args, **kwargs):
        events.append(("copy", idx))
        return copy(self, idx, *args, **kwargs)

    monkeypatch.setattr(RowWrites, "copy", recorded_copy)

    def count_forwards(model):
        model.model.layers[0].register_forward_pre_hook(lambda _m, _a: events.append(("forward", 0)))

    out = tmp_path / "out"
    run_capture(_opts(lfm2_config, data, out, tokenizer=str(tokenizer_dir), on_model=count_forwards, overlap=overlap))
    batches = make_batches(_seq_lens(clean.out), 64)
    assert len(batches) >= 3
    forwards_before = {}
    for n, (kind, idx) in enumerate(events):
        if kind == "copy":
            forwards_before[idx] = sum(1 for k, _ in events[:n] if k == "forward")
    for k, batch in enumerate(batches):
        seen = {forwards_before[idx] for idx in batch}
        # forwards before batch k's copies: its own and those before it, the first row's re-check
        # (settled before its copies are queued) and, overlapped, batch k+1's
        expected = k + 2 if not overlap else min(k + 3, len(batches) + 1)
        assert seen == {expected}, (k, seen, events, batches)
    _assert_same_capture(out, clean.out)


def _seq_lens(out: Path) -> list[int]:
    import datasets

    return [int(n) for n in datasets.load_from_disk(str(out))["seq_len"]]


def _assert_same_capture(a: Path, b: Path) -> None:
    from safetensors.torch import load_file

    names = sorted(p.name for p in (a / "hidden_states").glob("*.safetensors"))
    assert names == sorted(p.name for p in (b / "hidden_states").glob("*.safetensors")) and names
    for name in names:
        x, y = load_file(a / "hidden_states" / name), load_file(b / "hidden_states" / name)
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name
    assert (a / "data-00000-of-00001.arrow").read_bytes() == (b / "data-00000-of-00001.arrow").read_bytes()
    assert torch.load(a / "token_freq.pt") == torch.load(b / "token_freq.pt")


def _torchrun(config: str, data: Path, out: Path, tokenizer_dir: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "fastpath", "capture", config, str(data), "--out", str(out), "--dtype", "fp32",
           "--device", "cpu", "--layers", "1,2,3", "--batch-tokens", "64", "--check-every", "2",
           "--tokenizer", str(tokenizer_dir), "--quiet", *(["--allow-slow"] if ALLOW_SLOW else []), *extra]
    # torchrun gives each rank one thread unless told; CPU reductions differ with the thread count
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "capture_summary.json").read_text())


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
def test_torchrun_two_processes_write_the_same_files_as_one(lfm2_capture, lfm2_config, tokenizer_dir, tmp_path):
    clean, data = lfm2_capture
    out = tmp_path / "out"
    summary = _torchrun(lfm2_config, data, out, tokenizer_dir)
    assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["shard"] == "replicate"  # auto on CPU
    assert all(r["rows_written"] > 0 for r in summary["ranks"])
    _assert_same_capture(clean.out, out)


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
def test_fsdp_sharded_target_writes_the_same_files_as_one_process(lfm2_capture, lfm2_config, tokenizer_dir,
                                                                  tmp_path):
    """FSDP2 over 2 gloo processes: the hooks see full activations (files identical to one
    unsharded process), ranks with different row and re-check counts keep their collectives in
    step, and a resume where one rank has nothing left to do does not deadlock."""
    import datasets

    clean, data = lfm2_capture
    out = tmp_path / "out"
    summary = _torchrun(lfm2_config, data, out, tokenizer_dir, "--shard", "fsdp")
    assert summary["shard"] == "fsdp" and all(r["shard"] == "fsdp" for r in summary["ranks"])
    rows_per_rank = [r["rows_written"] for r in summary["ranks"]]
    assert all(n > 0 for n in rows_per_rank)
    # one copy of the weights: rank 1 built the model on meta and got its shards from rank 0
    assert [r["weights"] for r in summary["ranks"]] == ["loaded on this rank", "received from rank 0 (built on meta)"]
    checked = summary["reference_checks"]["rows"]
    assert summary["reference_checks"]["all_ok"] and len(checked) >= 2
    _assert_same_capture(clean.out, out)

    lengths = [int(n) for n in datasets.load_from_disk(str(out))["seq_len"]]
    batches = make_batches(lengths, 64)
    rank0_row = batches_for_rank(batches, 0, 2)[0][1][0]
    (out / "hidden_states" / f"hs_{rank0_row}.safetensors").unlink()
    (out / "hidden_states" / f".hs_{rank0_row}.safetensors.tmp12345").write_bytes(b"cut short")  # a killed write
    resumed = _torchrun(lfm2_config, data, out, tokenizer_dir, "--shard", "fsdp", "--resume")
    assert [r["rows_written"] for r in resumed["ranks"]] == [1, 0]
    assert resumed["ranks"][1]["padding_forwards"] >= 2  # rank 0's batch and its re-check
    assert not list(out.rglob(".*.tmp*"))
    _assert_same_capture(clean.out, out)


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
def test_fsdp_checkpoint_directory_is_read_once_and_matches_one_process(qwen_dir, tokenizer_dir, tmp_path):
    """A real checkpoint directory under FSDP2: rank 0 reads it, rank 1 builds on meta and gets
    its shards and buffers (rotary inverse frequencies) by broadcast; rows equal one process."""
    data = _write_chat(tmp_path / "conversations.jsonl", "conversations")
    single = run_capture(_opts(str(qwen_dir), data, tmp_path / "one", format="specforge", allow_slow=True, dtype="bf16"))
    summary = _torchrun(str(qwen_dir), data, tmp_path / "two", tokenizer_dir, "--shard", "fsdp",
                        "--format", "specforge", "--dtype", "bf16", *([] if ALLOW_SLOW else ["--allow-slow"]))
    assert [r["weights"] for r in summary["ranks"]] == ["loaded on this rank", "received from rank 0 (built on meta)"]
    names = sorted(f.name for f in (tmp_path / "one" / "rows_0-2000").glob("data_*.ckpt"))
    assert len(names) == single.rows == len(CONVERSATIONS)
    for name in names:
        a, b = (torch.load(tmp_path / d / "rows_0-2000" / name, weights_only=True) for d in ("one", "two"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


_FAILING_RANK_SCRIPT = """
import json, os, sys
import torch
from fastpath.shared.errors import FastpathError
from fastpath.capture.options import CaptureOptions
from fastpath.capture.run import run_capture

config, data, out, tokenizer, allow_slow = sys.argv[1:6]
rank = int(os.environ["RANK"])

def break_rank_1(model):
    if rank == 1:  # a capture that returns zeros, on one rank only
        model.model.layers[1].register_forward_hook(lambda _m, _a, output: torch.zeros_like(output))

opts = CaptureOptions(model=config, data=data, out=out, dtype="fp32", device="cpu", layers="1,2,3",
                      batch_tokens=64, check_every=1, tokenizer=tokenizer, progress=False,
                      allow_slow=allow_slow == "1", shard="fsdp", on_model=break_rank_1)
try:
    run_capture(opts)
    result = "finished"
except FastpathError as exc:
    result = str(exc)
with open(os.path.join(os.path.dirname(out), f"rank{rank}.txt"), "w") as fh:
    fh.write(result)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
def test_fsdp_a_failed_check_on_one_rank_stops_both_without_a_deadlock(lfm2_capture, lfm2_config, tokenizer_dir,
                                                                       tmp_path):
    _, data = lfm2_capture
    script = tmp_path / "fail.py"
    script.write_text(_FAILING_RANK_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           lfm2_config, str(data), str(tmp_path / "out"), str(tokenizer_dir), "1" if ALLOW_SLOW else "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = ((tmp_path / f"rank{r}.txt").read_text() for r in (0, 1))
    assert rank1.startswith("row ") and "failed its checks: layer 2: all-zero" in rank1, rank1
    assert "stopped because another rank failed" in rank0, rank0
    assert not list((tmp_path / "out").rglob(".*.tmp*"))


# --- clean errors -----------------------------------------------------------------------------------


def test_bad_input_is_a_one_line_error(lfm2_config, tmp_path, capsys):
    from fastpath.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, 3]}\nnot json\n')
    good = tmp_path / "good.jsonl"
    good.write_text('{"input_ids": [1, 2, 3]}\n')
    outside = tmp_path / "rows.jsonl"
    outside.write_text('{"input_ids": [1, 2, 999]}\n')
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    cases = [
        ([str(bad), "--out", str(tmp_path / "o1")], "bad.jsonl:2: not JSON"),
        ([str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o2")], "does not exist"),
        ([str(good), "--out", str(good)], "is not a directory"),
        ([str(good), "--out", str(used)], "is not empty; pass --resume"),
        ([str(good), "--out", str(used), "--resume"], "holds no fastpath capture to resume"),
        ([str(outside), "--out", str(tmp_path / "o4")], "outside the model's vocabulary"),
        ([str(good), "--out", str(tmp_path / "o5"), "--layers", "1,7"], "outside this 4-layer model"),
        ([str(good), "--out", str(tmp_path / "o6"), "--model-layers", "0"], "--model-layers must be a positive"),
        ([str(good), "--out", str(tmp_path / "o7"), "--reference-path"], "needs --allow-slow"),
        ([str(good), "--out", str(tmp_path / "o8"), "--dtype", "int8"], "unknown dtype 'int8'"),
        ([str(good), "--out", str(good / "sub" / "dir")], "good.jsonl is not a directory"),
    ]
    # found only once the config / DATA are read: after the progress line saying that they are
    read_first = ("bad.jsonl:2: not JSON", "outside the model's vocabulary", "outside this 4-layer model")
    for args, text in cases:
        code = main(["capture", lfm2_config, *args, "--device", "cpu",
                     *([] if "--layers" in args else ["--layers", "1,2,3"])])
        lines = capsys.readouterr().err.splitlines()
        # one error line, last, before the weights load (progress is on: no "loading" line came first);
        # an option alone is refused before anything else is said
        assert code == 2 and text in lines[-1] and lines[-1].startswith("fastpath capture: error: "), (args, lines)
        assert not any("loading" in line or "error" in line for line in lines[:-1]), (args, lines)
        assert len(lines) == 1 or (text in read_first and lines[0].startswith("fastpath capture: starting:")), lines
    assert (used / "notes.txt").read_text() == "mine" and len(list(used.iterdir())) == 1
    # and through the real entry point: argparse's own errors, no traceback
    proc = subprocess.run([sys.executable, "-m", "fastpath", "capture", lfm2_config, str(good), "--out",
                           str(tmp_path / "o3"), "--format", "parquet"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr
