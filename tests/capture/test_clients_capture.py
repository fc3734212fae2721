"""fastpath capture meets its drafter-training clients: speculators and SpecForge, each
in its own venv (scripts/setup_clients.sh: .venvs/speculators-*, .venvs/specforge-*), read
fastpath's captures of tiny random targets (Qwen3.5 and Nemotron-H, a Mamba-2 hybrid) through
their own public readers (tests/support/clients_worker.py runs in the client's python); rows, token ids,
layers and values are checked against a direct forward of the target here; a tiny speculators
EAGLE-3 drafter trains a few steps on a capture; and `--check-client` measures what each client
trains against, finds speculators' zero-centred-norm mismatch on Qwen3.5 and proves the
`--client-target` directory fixes it with the client's own code.

CPU only. Captures run on transformers' reference path (--allow-slow --reference-path): the fast
path is not what is tested here (tests/capture/test_capture.py covers it), and it keeps the group short.
Without the client venvs every client test skips, naming the setup script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("datasets")

import torch
from repo_paths import ROOT, SUPPORT

from fastpath.capture.clients import divergence, write_client_target
from fastpath.capture.options import CaptureOptions
from fastpath.capture.run import run_capture
from fastpath.models.build import build_model
from fastpath.shared.errors import UsageError

WORKER = SUPPORT / "clients_worker.py"
AUX = [1, 2, 3]  # capture-before ids of the 4-layer targets


def _venvs(client: str) -> list:
    found = sorted(ROOT.glob(f".venvs/{client}-*/bin/python"))
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"no .venvs/{client}-* (bash scripts/setup_clients.sh installs it)"))]
    return [pytest.param(p, id=p.parents[1].name) for p in found]


SPECULATORS = _venvs("speculators")
SPECFORGE = _venvs("specforge")

TINY = {
    "qwen3_5": {
        "model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "vocab_size": 512,
    },
    # time_step_limit finite: transformers 5.17 writes (0, inf) as {"__float__": "Infinity"} and
    # then refuses to read its own config.json back
    "nemotron_h": {
        "model_type": "nemotron_h", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
        "hybrid_override_pattern": "M*M-", "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8,
        "n_groups": 2, "chunk_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "time_step_limit": [0.0, 1000.0],
    },
}
ROWS = [list(range(3 + 7 * i, 3 + 7 * i + n)) for i, n in enumerate((29, 37, 18, 41))]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    with path.open("w") as fh:
        for ids in ROWS:
            fh.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 4 + [1] * (len(ids) - 4)}) + "\n")
    return path


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["a tiny target"] * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """Local checkpoint directories (one model.safetensors, no index), as a user would have."""
    dirs = {}
    for name, config in TINY.items():
        cfg = tmp_path_factory.mktemp(f"{name}-cfg") / "config.json"
        cfg.write_text(json.dumps(config))
        built = build_model(str(cfg), dtype="fp32", device="cpu", seed=3)
        dirs[name] = tmp_path_factory.mktemp(name)
        built.model.save_pretrained(dirs[name], safe_serialization=True)
        _tokenizer(dirs[name])
    return dirs


_CAPTURES: dict[tuple, Path] = {}


def _capture(targets: dict[str, Path], data: Path, tmp_path_factory, name: str, fmt: str) -> Path:
    key = (name, fmt)
    if key not in _CAPTURES:
        out = tmp_path_factory.mktemp(f"{name}-{fmt}") / "hs"
        run_capture(CaptureOptions(model=str(targets[name]), data=str(data), out=str(out), format=fmt,
                                   dtype="bf16" if fmt == "specforge" else "fp32", device="cpu",
                                   layers=",".join(map(str, AUX)), batch_tokens=128, check_every=0,
                                   allow_slow=True, reference_path=True, progress=False))
        _CAPTURES[key] = out
    return _CAPTURES[key]


def _direct(model_dir: Path, ids: list[int], dtype: str = "fp32") -> dict[str, torch.Tensor]:
    """The target's own forward: transformers' output_hidden_states (index i = input of layer i,
    the last entry after the final norm), the last layer's output from a hook, and the logits."""
    model = build_model(str(model_dir), dtype=dtype, device="cpu").model
    seen = {}
    handle = model.model.layers[-1].register_forward_hook(lambda _m, _a, out: seen.setdefault("pre", out))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    pre = seen["pre"][0] if isinstance(seen["pre"], tuple) else seen["pre"]
    return {"aux": torch.cat([out.hidden_states[i][0] for i in AUX], dim=-1).float(), "pre": pre[0].float(),
            "post": out.hidden_states[-1][0].float(), "logits": out.logits[0].float()}


def _run(python: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return proc


# --- the clients read the captures ----------------------------------------------------------------


@pytest.mark.parametrize("python", SPECULATORS)
@pytest.mark.parametrize("name", list(TINY))
def test_speculators_reads_the_capture_through_its_own_dataset(python, name, targets, data, tmp_path,
                                                               tmp_path_factory):
    out = _capture(targets, data, tmp_path_factory, name, "speculators")
    dest = tmp_path / "read.pt"
    assert _run(python, str(WORKER), "speculators-read", str(out), str(dest)).returncode == 0
    read = torch.load(dest, weights_only=False)
    assert read["approx_lengths"] == [len(ids) for ids in ROWS]
    assert len(read["items"]) == len(ROWS)
    for ids, item in zip(ROWS, read["items"], strict=True):
        direct = _direct(targets[name], ids)
        assert item["input_ids"].tolist() == ids
        assert item["loss_mask"].tolist() == [0] * 4 + [1] * (len(ids) - 4)
        assert item["hidden_states"].shape == (len(ids), len(AUX) * 64)
        torch.testing.assert_close(item["hidden_states"].float(), direct["aux"], rtol=1e-4, atol=1e-5)
        # the verifier's last state, before the final norm: the target's norm + lm_head give its logits
        torch.testing.assert_close(item["verifier_last_hidden_states"].float(), direct["pre"], rtol=1e-4, atol=1e-5)
    collated = read["collated"]  # speculators' CollateFn packs the rows into one [1, sum T, ...] batch
    assert collated["input_ids"].shape == (1, sum(map(len, ROWS)))
    assert collated["input_ids"][0].tolist() == [t for ids in ROWS for t in ids]
    assert collated["document_ids"][0].tolist() == [d for d, ids in enumerate(ROWS) for _ in ids]


@pytest.mark.parametrize("python", SPECFORGE)
@pytest.mark.parametrize("name", list(TINY))
def test_specforge_reads_the_capture_through_its_own_readers(python, name, targets, data, tmp_path,
                                                             tmp_path_factory):
    out = _capture(targets, data, tmp_path_factory, name, "specforge")
    dest = tmp_path / "read.pt"
    assert _run(python, str(WORKER), "specforge-read", str(out), str(dest)).returncode == 0
    read = torch.load(dest, weights_only=False)
    # the manifest reader validated every file (keys and tensor specs) and lists one ref per row
    assert len(read["refs"]) == len(ROWS)
    for ref in read["refs"]:
        assert ref["keys"] == ["aux_hidden_state", "hidden_state", "input_ids", "loss_mask"]
        assert ref["specs"]["hidden_state"][1].endswith("bfloat16") and ref["specs"]["aux_hidden_state"][1].endswith("bfloat16")
    # OfflineEagle3Dataset: files in its (sorted) order; data_{row}.ckpt names the row
    for path, item in zip(read["paths"], read["items"], strict=True):
        row = int(Path(path).stem.split("_")[1])
        ids = ROWS[row]
        direct = _direct(targets[name], ids)
        assert item["input_ids"][0].tolist() == ids
        assert item["loss_mask"][0].tolist() == [0] * 4 + [1] * (len(ids) - 5) + [0]  # SpecForge drops the last
        assert item["hidden_state"].shape == (1, len(ids), len(AUX) * 64)
        # bf16 capture against the fp32 forward: bf16 rounding through 4 layers
        torch.testing.assert_close(item["hidden_state"][0].float(), direct["aux"], rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(item["target"][0].float(), direct["post"], rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("python", SPECULATORS)
def test_a_tiny_speculators_eagle3_drafter_trains_on_the_capture(python, targets, data, tmp_path, tmp_path_factory):
    """Built and trained by speculators' own code on its own batches; the verifier is the client
    target directory, so its targets are the target's logits (see the --check-client tests)."""
    out = _capture(targets, data, tmp_path_factory, "qwen3_5", "speculators")
    model = build_model(str(targets["qwen3_5"]), dtype="fp32", device="cpu").model
    verifier = write_client_target(targets["qwen3_5"], tmp_path / "verifier", 1.0 + model.model.norm.weight.detach())
    dest = tmp_path / "train.json"
    _run(python, str(WORKER), "speculators-train", str(out), str(verifier), ",".join(map(str, AUX)), "6", str(dest))
    result = json.loads(dest.read_text())
    losses = result["losses"]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0], losses
    assert result["verifier_norm_class"] == "LlamaRMSNorm" and result["trainable"] > 0


# --- --check-client: what the client trains against, measured ------------------------------------


def _check(python: Path, model_dir: Path, out: Path, client: str, *extra: str) -> tuple[int, str, dict]:
    proc = _run(python, "-m", "fastpath", "capture", str(model_dir), "--out", str(out), "--check-client", client,
                "--device", "cpu", *extra)
    summary = json.loads((out / "capture_summary.json").read_text())
    return proc.returncode, proc.stderr, summary["client_checks"][client]


def _by_path(results: list[dict]) -> dict[str, dict]:
    return {r["path"].split(" (")[0]: r for r in results}


@pytest.mark.parametrize("python", SPECULATORS)
def test_check_client_speculators_finds_the_zero_centred_norm_and_the_client_target_fixes_it(
        python, targets, data, tmp_path, tmp_path_factory):
    out = _capture(targets, data, tmp_path_factory, "qwen3_5", "speculators")
    code, err, record = _check(python, targets["qwen3_5"], out, "speculators")
    assert code == 1  # the client would train against other logits
    model = _by_path(record["model"])
    eagle3, dflash = model["EAGLE-3 verifier_norm"], model["DFlash verifier_norm"]
    assert not eagle3["ok"] and eagle3["rel_l2"] > 0.5 and eagle3["top1"] < 0.5
    assert "1 + w" in eagle3["problem"] and "speculators/pull/1090" in " ".join(eagle3["sources"])
    assert dflash["ok"] and dflash["rel_l2"] < 1e-4  # resolve_verifier_norm_class knows qwen3_5_text
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "--client-target" in warnings[0] and "rel-L2" in warnings[0], err[-2000:]

    fix = tmp_path / "speculators-verifier"
    code, err, record = _check(python, targets["qwen3_5"], out, "speculators", "--client-target", str(fix))
    assert code == 0 and record["ok_with_client_target"]
    fixed = _by_path(record["with_client_target"])
    assert fixed["EAGLE-3 verifier_norm"]["ok"] and fixed["EAGLE-3 verifier_norm"]["rel_l2"] < 1e-4
    assert not fixed["DFlash verifier_norm"]["ok"]  # DFlash already applies 1 + w: it keeps MODEL
    assert "keep MODEL" in err
    # DIR links MODEL's files and adds only the norm file and the index
    assert sorted(p.name for p in fix.iterdir() if not p.is_symlink()) == [
        "README.txt", "fastpath_verifier_norm.safetensors", "model.safetensors.index.json"]


@pytest.mark.parametrize("python", SPECULATORS)
def test_check_client_speculators_on_a_mamba2_hybrid(python, targets, data, tmp_path_factory):
    """Nemotron-H: x̂·w final norm (read through speculators' backbone.norm_f alias) matches; its
    default drafter config cannot be built (no hidden_act), which is said with the remedy."""
    out = _capture(targets, data, tmp_path_factory, "nemotron_h", "speculators")
    code, err, record = _check(python, targets["nemotron_h"], out, "speculators")
    model = _by_path(record["model"])
    assert model["EAGLE-3 verifier_norm"]["ok"] and model["EAGLE-3 verifier_norm"]["rel_l2"] < 1e-4
    assert model["DFlash verifier_norm"]["ok"]
    config = model["EAGLE-3 default drafter config"]
    assert "hidden_act" in config["problem"] and "--draft-config" in config["remedy"]
    assert code == 1 and "WARNING" in err


@pytest.mark.parametrize("python", SPECFORGE)
def test_check_client_specforge_matches_and_names_the_missing_index(python, targets, data, tmp_path,
                                                                    tmp_path_factory):
    out = _capture(targets, data, tmp_path_factory, "qwen3_5", "specforge")
    code, err, record = _check(python, targets["qwen3_5"], out, "specforge")
    model = _by_path(record["model"])
    assert "index.json" in model["TargetHead index"]["problem"]  # a single-file checkpoint
    head = model["TargetHead"]
    # bf16 lm_head on bf16 post-norm states against the fp32 model's logits
    assert head["ok"] and head["rel_l2"] < 0.05 and head["top1"] > 0.9, head
    assert code == 1 and "WARNING" in err and "--client-target" in err
    fix = tmp_path / "specforge-target"
    code, _err, record = _check(python, targets["qwen3_5"], out, "specforge", "--client-target", str(fix))
    assert code == 0 and (fix / "model.safetensors.index.json").is_file()
    assert not _by_path(record["with_client_target"]).get("TargetHead index")
    assert _by_path(record["with_client_target"])["TargetHead"]["ok"]


# --- the check runs by itself: a user who does not know the norm bug will not ask for it ----------


def _capture_cli(python: Path, model_dir: Path, data: Path, out: Path) -> subprocess.CompletedProcess:
    return _run(python, "-m", "fastpath", "capture", str(model_dir), str(data), "--out", str(out), "--format",
                "speculators", "--dtype", "fp32", "--device", "cpu", "--layers", ",".join(map(str, AUX)),
                "--batch-tokens", "128", "--check-every", "0", "--allow-slow", "--reference-path")


@pytest.mark.parametrize("python", SPECULATORS)
def test_a_speculators_capture_checks_the_client_without_being_asked(python, targets, data, tmp_path):
    out = tmp_path / "hs"
    proc = _capture_cli(python, targets["qwen3_5"], data, out)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the capture stands; the mismatch is a warning
    assert "checking what speculators trains against" in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "1 + w" in warnings[0] and "--client-target" in warnings[0], proc.stderr[-3000:]
    record = json.loads((out / "capture_summary.json").read_text())["client_checks"]["speculators"]
    assert not _by_path(record["model"])["EAGLE-3 verifier_norm"]["ok"]


def test_without_speculators_a_capture_says_once_that_the_check_exists(targets, data, tmp_path):
    if _installed("speculators"):
        pytest.skip("speculators is importable in this Python (the check runs instead)")
    proc = _capture_cli(Path(sys.executable), targets["qwen3_5"], data, tmp_path / "hs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if "--check-client speculators" in line]
    assert len(notes) == 1, proc.stderr[-3000:]
    assert "speculators is not installed in this Python" in notes[0] and "--system-site-packages" in notes[0]
    assert "client_checks" not in json.loads((tmp_path / "hs" / "capture_summary.json").read_text())


@pytest.mark.parametrize("client", ["speculators", "specforge"])
def test_the_install_hint_names_a_side_venv_and_never_touches_this_transformers(client, targets):
    from fastpath.capture.client_check import require_client

    if _installed(client):
        pytest.skip(f"{client} is importable in this Python")
    with pytest.raises(UsageError) as err:
        require_client(client, targets["qwen3_5"])
    text = str(err.value)
    assert "\n" not in text  # one line
    assert "Do not pip install it into this Python" in text and "-m venv --system-site-packages" in text
    assert f"--check-client {client}" in text and "transformers" in text
    # the pip command it gives runs in the side venv only
    assert f"~/.venvs/{client}/bin/pip install" in text and f"(pip install {client})" not in text


# --- refusals before any work, and the divergence measure ------------------------------------------


def test_client_options_are_refused_in_one_line_before_the_load(targets, data, tmp_path):
    def opts(**kw):
        base = {"model": str(targets["qwen3_5"]), "data": str(data), "out": str(tmp_path / "out"), "device": "cpu",
                "allow_slow": True, "progress": False}
        return CaptureOptions(**{**base, **kw})

    with pytest.raises(UsageError, match="--format specforge needs --dtype bf16"):
        run_capture(opts(format="specforge", dtype="fp32"))
    with pytest.raises(UsageError, match="--client-target goes with --check-client"):
        run_capture(opts(client_target=str(tmp_path / "t")))
    assert not (tmp_path / "out").exists()


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_check_client_needs_the_client_in_this_python_and_a_model_directory(targets, data, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(TINY["qwen3_5"]))
    if not _installed("speculators"):  # the system python of the suite: clients live in their venvs
        with pytest.raises(UsageError, match="speculators is not installed in this Python"):
            run_capture(CaptureOptions(model=str(targets["qwen3_5"]), data=str(data), out=str(tmp_path / "o"),
                                       check_client="speculators", device="cpu", progress=False))
    proc = subprocess.run([sys.executable, "-m", "fastpath", "capture", str(cfg), "--out", str(tmp_path / "o2")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "DATA is required" in proc.stderr


def test_divergence_is_zero_for_equal_logits_and_large_for_a_zeroed_norm():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 50, generator=gen) * 3
    rel, kl, top1 = divergence(logits, logits)
    assert rel == 0 and abs(kl) < 1e-6 and top1 == 1.0
    rel, kl, top1 = divergence(torch.zeros_like(logits), logits)
    assert rel == pytest.approx(1.0) and kl > 0.5 and top1 < 0.5
