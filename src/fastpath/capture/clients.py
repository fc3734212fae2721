"""What a drafter-training client will train against, rebuilt with the client's own installed code
and compared with the target model's own logits (`fastpath capture --check-client`).

Why behavioural: a version table cannot say whether *this* target's captured states, read and
post-processed by *this* client, give the verifier's distribution. The check reads a few captured
rows through the client's public reader, applies the client's own verifier head, and measures
the divergence (rel-L2 of the logits, KL(target || client) in nats, top-1 agreement).

speculators (0.9.0 read): EAGLE-3 rebuilds targets as `verifier_lm_head(verifier_norm(h_L))`
(src/speculators/models/eagle3/core.py) with `verifier_norm` of the drafter's own norm class
(Llama/Qwen3 RMSNorm, x̂·w) and `model.norm.weight` loaded raw from the verifier directory
(model.py `_load_verifier_weights`); DFlash picks its class with
`models/utils.py::resolve_verifier_norm_class` (x̂·(1 + w) for qwen3_5 / qwen3_5_text only). For
targets whose final norm is zero-centred (transformers' Qwen3_5RMSNorm, Qwen3NextRMSNorm:
x̂·(1 + w)) the EAGLE-3 targets are wrong: speculators PR #1090 (fixed DFlash for qwen3_5 only),
PR #1145 (qwen3_5_moe), issue #797. Safe remedy without touching the client: a *client target*
directory (`--client-target DIR`): MODEL's files linked, plus `model.norm.weight` stored as 1 + w
in a small file its index points to, so the client's x̂·w norm computes the target's x̂·(1 + w).
SpecForge (0.2.0 read): stores the post-norm state and applies only `TargetHead` (lm_head, cast to
bf16; specforge/modeling/target/target_head.py), which finds lm_head through MODEL/*.index.json.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastpath.shared.errors import FastpathError, UsageError, first_line

CHECK_ROWS = 2  # captured rows rebuilt per check: enough to measure, cheap next to a capture
MATCH_REL = 0.05  # logits rel-L2 a matching client stays under (bf16 states: ~1e-2)
MATCH_KL = 0.01  # nats per position
ZERO_CENTRED = "rmsnorm(x) * (1 + w)"  # layers.norm_convention's label
NORM_FILE = "fastpath_verifier_norm.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SPECULATORS_SOURCES = ("https://github.com/vllm-project/speculators/pull/1090",
                       "https://github.com/vllm-project/speculators/pull/1145",
                       "https://github.com/vllm-project/speculators/issues/797")
SPECFORGE_HEAD_SOURCE = "https://github.com/sgl-project/SpecForge/blob/main/specforge/modeling/target/target_head.py"


@dataclass
class ClientResult:
    """One client path checked against the target: measured, or why it could not be."""

    client: str
    version: str
    path: str  # what the client applies, e.g. "EAGLE-3 verifier_norm + verifier_lm_head"
    verifier: str  # the directory the client read the target's weights from
    rows: list[int] = field(default_factory=list)
    rel_l2: float | None = None
    kl: float | None = None
    top1: float | None = None
    ok: bool = False
    problem: str | None = None
    remedy: str | None = None
    sources: list[str] = field(default_factory=list)

    def measured(self) -> str:
        if self.rel_l2 is None:
            return "not measured"
        return f"rel-L2 {self.rel_l2:.3g}, KL {self.kl:.3g} nat, top-1 agreement {self.top1:.0%}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def installed_version(client: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(client)
    except md.PackageNotFoundError:
        return None


# What `pip install CLIENT` would do to this Python is each format's `client_pins` (the clients'
# own metadata, Requires-Dist): installed beside the user's stack, either client replaces their
# transformers (a downgrade for 5.20+), so the hint names a side venv instead: it sees this
# Python's packages (--system-site-packages), and whatever the client pins lands in the venv only.


def divergence(client_logits: Any, target_logits: Any) -> tuple[float, float, float]:
    """(rel-L2, mean KL(target || client) in nats, top-1 agreement) over [T, V] logits, in fp32."""
    import torch

    c, t = client_logits.float(), target_logits.float().to(client_logits.device)
    rel = float(torch.linalg.vector_norm(c - t) / torch.linalg.vector_norm(t).clamp_min(1e-30))
    logp_t, logp_c = torch.log_softmax(t, -1), torch.log_softmax(c, -1)
    kl = float((logp_t.exp() * (logp_t - logp_c)).sum(-1).mean())
    top1 = float((c.argmax(-1) == t.argmax(-1)).float().mean())
    return rel, kl, top1


def _pool(results: list[tuple[Any, Any]]) -> tuple[float, float, float]:
    """divergence over several rows' [T, V] logits pairs, concatenated."""
    import torch

    return divergence(torch.cat([c for c, _ in results]), torch.cat([t.to(c.device) for c, t in results]))


def target_logits(model: Any, ids: list[int]) -> Any:
    """The target's own logits [T, V] for one row (its forward, in its dtype, on its device)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0].float().cpu()


# --- the client target directory ------------------------------------------------------------------


def _weight_map(model_dir: Path) -> dict[str, str]:
    """tensor name -> file, from MODEL's index or its single model.safetensors."""
    index = sorted(model_dir.glob("*.safetensors.index.json"))
    if index:
        return dict(json.loads(index[0].read_text())["weight_map"])
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise UsageError(f"{model_dir}: no *.safetensors.index.json and no model.safetensors to index")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as fh:
        return {name: single.name for name in fh.keys()}


def write_client_target(model_dir: Path, dest: Path, norm_weight: Any = None) -> Path:
    """DEST: MODEL as a training client should read it. Every file of MODEL is linked (nothing is
    copied), and model.safetensors.index.json is written (SpecForge's TargetHead needs one).
    norm_weight: store it as `model.norm.weight` in NORM_FILE and point the index there (the
    speculators remedy: 1 + w for a zero-centred final norm). Never load the model itself from
    DEST: with norm_weight its final norm is the client's, not the model's."""
    from safetensors.torch import save_file

    from fastpath.capture.writers import atomic_json, atomic_write

    model_dir = model_dir.resolve()
    dest = dest.expanduser()
    if dest.resolve() == model_dir:
        raise UsageError("--client-target must be a directory other than MODEL")
    if dest.exists() and any(p.name not in (NORM_FILE, INDEX_FILE, "README.txt") and not p.is_symlink()
                             for p in dest.iterdir()):
        raise UsageError(f"--client-target {dest} holds files that are not a fastpath client target")
    weight_map = _weight_map(model_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in model_dir.iterdir():
        if entry.name.endswith(".index.json"):
            continue  # replaced by ours (SpecForge refuses a folder with two)
        link = dest / entry.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(entry)
    note = "links to " + str(model_dir)
    if norm_weight is not None:
        tensors = {"model.norm.weight": norm_weight.detach().float().cpu().contiguous()}
        atomic_write(dest / NORM_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={
            "fastpath": "final norm weight as 1 + w for a client whose verifier norm computes rmsnorm(x) * w"}))
        weight_map["model.norm.weight"] = NORM_FILE
        note += "; model.norm.weight = 1 + w (for a client's x̂·w verifier norm); never load the model from here"
    atomic_json(dest / INDEX_FILE, {"metadata": {"fastpath_client_target": note}, "weight_map": weight_map})
    readme = (f"Written by `fastpath capture --client-target`: {note}.\n"
              "Point the training client at this directory (speculators: --verifier-name-or-path; "
              "SpecForge: --target-model-path).\n")
    atomic_write(dest / "README.txt", lambda tmp: tmp.write_text(readme))
    return dest


def specforge_index_note(model_dir: Path | None) -> str | None:
    """One line when SpecForge's TargetHead will not find MODEL/*.index.json (a single-file checkpoint)."""
    if model_dir is None or any(model_dir.glob("*.index.json")):
        return None
    return (f"note: SpecForge's TargetHead finds lm_head through *.index.json, which {model_dir} lacks; "
            "`--check-client specforge --client-target DIR` writes DIR (MODEL's files linked, plus an index) "
            "to pass as SpecForge's --target-model-path")


# --- speculators ----------------------------------------------------------------------------------


def _speculators_rows(out: Path, rows: list[int]) -> dict[int, tuple[list[int], Any]]:
    """(token ids, verifier_last_hidden_states) per row, read by speculators' ArrowDataset."""
    from speculators.train.data import ArrowDataset

    data = ArrowDataset(max_len=1 << 30, datapath=str(out), on_missing="raise")
    read = {}
    for idx in rows:
        item = data[idx]
        read[idx] = (item["input_ids"].tolist(), item["verifier_last_hidden_states"])
    return read


def _eagle3_drafter(verifier: Path, aux_ids: list[int], eps_fallback: float) -> tuple[Any, str | None]:
    """An EAGLE-3 drafter as speculators' trainer builds one by default (1 layer, llama draft arch,
    full vocabulary), and why the default config could not be built when it could not (then a
    llama decoder config stands in, as the user's --draft-config would)."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    problem = None
    try:
        config = create_transformer_layer_config(str(verifier), num_layers=1, draft_arch="llama", hidden_act=None,
                                                 sliding_window=4096, full_attention_indices=[0])
    except (AttributeError, KeyError, ValueError) as exc:
        problem = f"speculators cannot build its default EAGLE-3 drafter config for this target ({first_line(exc)})"
        config = _llama_draft_config(verifier, eps_fallback)
    # capture-before ids -> speculators' target layer ids are the same convention
    drafter = Eagle3DraftModel.from_training_args(
        verifier_config=config, t2d=None, d2t=None, verifier_name_or_path=str(verifier),
        draft_vocab_size=int(config.vocab_size), norm_before_residual=False, ttt_steps=1,
        target_layer_ids=list(aux_ids), draft_attn_impl="eager")
    return drafter.eval(), problem


def _llama_draft_config(verifier: Path, eps: float) -> Any:
    """A one-layer llama decoder config sized from the verifier (what --draft-config supplies)."""
    from transformers import AutoConfig, LlamaConfig

    cfg = AutoConfig.from_pretrained(str(verifier))
    cfg = getattr(cfg, "text_config", cfg)
    hidden = int(cfg.hidden_size)
    heads = max(1, hidden // 64) if hidden % 64 == 0 else 1
    return LlamaConfig(vocab_size=int(cfg.vocab_size), hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=hidden // heads, rms_norm_eps=eps, max_position_embeddings=4096,
                       tie_word_embeddings=False)


def speculators_results(verifier: Path, out: Path, rows: list[int], targets: dict[int, Any], aux_ids: list[int],
                        convention: str, eps: float, target_kind: str) -> list[ClientResult]:
    """EAGLE-3's and DFlash's verifier heads, built by speculators from `verifier`, on the rows
    speculators' reader returns, against the target's logits."""
    import types

    import torch
    from loguru import logger  # speculators logs through it (per-file INFO lines)
    from speculators.models.utils import resolve_verifier_norm_class

    version = installed_version("speculators") or "?"
    logger.disable("speculators")
    try:
        read = _speculators_rows(out, rows)
        drafter, build_problem = _eagle3_drafter(verifier, aux_ids, eps)
    finally:
        logger.enable("speculators")
    # DFlash's class choice, by its own function, for this verifier
    owner = types.SimpleNamespace(speculators_config=types.SimpleNamespace(
        verifier=types.SimpleNamespace(name_or_path=str(verifier))))
    dflash_class = resolve_verifier_norm_class(owner)
    dflash_norm = dflash_class(drafter.hidden_size, eps=float(drafter.config.transformer_layer_config.rms_norm_eps))
    dflash_norm.load_state_dict({"weight": drafter.verifier_norm.weight.detach().clone()})
    heads = {
        f"EAGLE-3 verifier_norm ({type(drafter.verifier_norm).__name__}) + verifier_lm_head":
            lambda h: drafter.verifier_lm_head(drafter.verifier_norm(h)),
        f"DFlash verifier_norm ({dflash_class.__name__}, resolve_verifier_norm_class) + verifier_lm_head":
            lambda h: drafter.verifier_lm_head(dflash_norm(h)),
    }
    results = []
    for path, head in heads.items():
        pairs = []
        for idx in rows:
            ids, state = read[idx]
            if ids != targets[idx][0]:
                raise FastpathError(f"speculators' reader returns other token ids for row {idx} than the capture holds")
            with torch.no_grad():
                pairs.append((head(state.float()), targets[idx][1]))
        rel, kl, top1 = _pool(pairs)
        ok = rel <= MATCH_REL and kl <= MATCH_KL
        result = ClientResult("speculators", version, path, str(verifier), list(rows), rel, kl, top1, ok)
        if not ok:
            result.problem = (f"speculators {version} {path.split(' ')[0]} trains against logits that are not "
                              f"the target's ({result.measured()})")
            if convention == ZERO_CENTRED and target_kind == "model":
                result.problem += (": its verifier norm loads model.norm.weight raw while the target's final "
                                   "norm computes rmsnorm(x) * (1 + w)")
                result.remedy = ("capture again (or check this capture) with --client-target DIR and pass "
                                 "DIR to speculators as --verifier-name-or-path")
                result.sources = list(SPECULATORS_SOURCES)
            else:
                result.remedy = "no safe fix known to fastpath: report it to speculators"
        results.append(result)
    if build_problem is not None:
        results.append(ClientResult("speculators", version, "EAGLE-3 default drafter config", str(verifier),
                                    problem=build_problem,
                                    remedy="give speculators' trainer a --draft-config (a llama or qwen3 "
                                           "decoder config with rms_norm_eps)",
                                    sources=["speculators src/speculators/train/cli.py "
                                             "create_transformer_layer_config"]))
    return results


# --- SpecForge ------------------------------------------------------------------------------------


def _specforge_rows(out: Path, rows: list[int], row_path: Any) -> dict[int, tuple[list[int], Any]]:
    """(input_ids, target = post-norm hidden state) per row, read by SpecForge's offline dataset."""
    from specforge.data.preprocessing import build_offline_eagle3_dataset

    data = build_offline_eagle3_dataset(str(out), max_len=1 << 30)
    where = {os.path.abspath(p): i for i, p in enumerate(data.datapaths)}
    read = {}
    for idx in rows:
        item = data[where[os.path.abspath(str(row_path(idx)))]]
        read[idx] = (item["input_ids"][0].tolist(), item["target"][0])
    return read


def specforge_results(target_dir: Path, out: Path, rows: list[int], targets: dict[int, Any],
                      row_path: Any) -> list[ClientResult]:
    """SpecForge's TargetHead (loaded from target_dir) on the post-norm states its dataset reads."""
    import torch
    from specforge.modeling.target.target_head import TargetHead

    version = installed_version("specforge") or "?"
    results = []
    head_dir = target_dir
    with tempfile.TemporaryDirectory(prefix="fastpath-specforge-") as tmp:
        if specforge_index_note(target_dir):
            results.append(ClientResult(
                "specforge", version, "TargetHead index", str(target_dir),
                problem=(f"SpecForge's TargetHead finds lm_head through *.index.json, which {target_dir} lacks "
                         "(FileNotFoundError at training start)"),
                remedy="--client-target DIR writes DIR with an index (MODEL's files linked); pass DIR as "
                       "SpecForge's --target-model-path",
                sources=[SPECFORGE_HEAD_SOURCE]))
            head_dir = write_client_target(target_dir, Path(tmp) / "target")
        head = TargetHead.from_pretrained(str(head_dir))
        read = _specforge_rows(out, rows, row_path)
        path = "TargetHead (lm_head in bf16) on the stored post-norm state"
        result = ClientResult("specforge", version, path, str(target_dir), list(rows))
        try:
            if any(ids != targets[idx][0] for idx, (ids, _state) in read.items()):
                raise FastpathError("SpecForge's reader returns other token ids than the capture holds")
            with torch.no_grad():
                pairs = [(head(state.to(head.fc.weight.device)).float().cpu(), targets[idx][1])
                         for idx, (_ids, state) in read.items()]
        except RuntimeError as exc:
            result.problem = f"SpecForge's TargetHead cannot read these states: {first_line(exc)}"
            result.remedy = "capture with --dtype bf16 (SpecForge casts its target head to bf16)"
            result.sources = [SPECFORGE_HEAD_SOURCE]
            return [*results, result]
    result.rel_l2, result.kl, result.top1 = _pool(pairs)
    result.ok = result.rel_l2 <= MATCH_REL and result.kl <= MATCH_KL
    if not result.ok:
        result.problem = f"SpecForge {version} trains against logits that are not the target's ({result.measured()})"
        result.remedy = "no safe fix known to fastpath: report it to SpecForge"
    return [*results, result]
