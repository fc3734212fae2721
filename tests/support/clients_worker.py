"""Runs inside a client's venv (.venvs/speculators-*, .venvs/specforge-*; scripts/setup_clients.sh):
reads a fastpath capture through the client's own public readers, or trains a few steps of a
tiny speculators EAGLE-3 drafter on it, and saves what the client saw for the test to compare.
Imports only the client and torch (never fastpath), so what it reports is the client's view.

    python clients_worker.py speculators-read OUT DEST.pt
    python clients_worker.py specforge-read OUT DEST.pt
    python clients_worker.py speculators-train OUT VERIFIER_DIR AUX_IDS STEPS DEST.json
"""

from __future__ import annotations

import json
import sys

import torch


def speculators_read(out: str, dest: str) -> None:
    """speculators' training dataset (src/speculators/train/data.py ArrowDataset: load_from_disk +
    hs-connectors FileTransfer) and its collate function, as its trainer uses them."""
    from speculators.train.data import ArrowDataset, CollateFn

    data = ArrowDataset(max_len=4096, datapath=out, on_missing="raise")
    items = [data[i] for i in range(len(data))]
    hidden = items[0]["verifier_last_hidden_states"].shape[-1]
    batch = CollateFn(max_len=sum(len(it["input_ids"]) for it in items), hidden_size=hidden,
                      num_target_layers=items[0]["hidden_states"].shape[-1] // hidden,
                      dtype=items[0]["hidden_states"].dtype)(items)
    torch.save({"items": [{k: v for k, v in it.items()} for it in items], "approx_lengths": data.approx_lengths,
                "collated": {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}}, dest)


def specforge_read(out: str, dest: str) -> None:
    """SpecForge's offline manifest reader (every file validated: keys, tensor specs) and its
    OfflineEagle3Dataset (specforge/data/preprocessing.py), as its offline trainer reads them."""
    from specforge.data.preprocessing import build_offline_eagle3_dataset
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    refs = OfflineManifestReader(out, validate_files=True).read()
    data = build_offline_eagle3_dataset(out, max_len=4096)
    torch.save({"refs": [{"uri": r.feature_store_uri, "keys": sorted(r.feature_keys), "num_tokens": r.num_tokens,
                          "specs": {k: (list(s.shape), str(s.dtype)) for k, s in r.feature_specs.items()}}
                         for r in refs],
                "paths": list(data.datapaths), "items": [data[i] for i in range(len(data))]}, dest)


def speculators_train(out: str, verifier: str, aux_ids: str, steps: str, dest: str) -> None:
    """A one-layer EAGLE-3 drafter built the way speculators' trainer builds it by default
    (train/cli.py create_transformer_layer_config + Eagle3DraftModel.from_training_args), trained
    for a few steps on batches from its own dataset and collate function, with its own loss."""
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from speculators.train.data import ArrowDataset, CollateFn

    torch.manual_seed(0)
    config = create_transformer_layer_config(verifier, num_layers=1, draft_arch="llama", hidden_act=None,
                                             sliding_window=4096, full_attention_indices=[0])
    drafter = Eagle3DraftModel.from_training_args(
        verifier_config=config, t2d=None, d2t=None, verifier_name_or_path=verifier,
        draft_vocab_size=int(config.vocab_size), norm_before_residual=False, ttt_steps=2,
        target_layer_ids=[int(i) for i in aux_ids.split(",")], draft_attn_impl="eager")
    drafter.train()
    data = ArrowDataset(max_len=4096, datapath=out, on_missing="raise")
    items = [data[i] for i in range(len(data))]
    collate = CollateFn(max_len=max(len(it["input_ids"]) for it in items) * 2, hidden_size=config.hidden_size,
                        num_target_layers=len(aux_ids.split(",")), dtype=torch.float32)
    loss_config = resolve_loss_config("kl_div", "eager")
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for step in range(int(steps)):
        batch = collate([items[(2 * step) % len(items)], items[(2 * step + 1) % len(items)]])
        batch = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        _draft, loss, _metrics = drafter(**batch, ttt_steps=2, loss_config=loss_config)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with open(dest, "w") as fh:
        json.dump({"losses": losses, "trainable": sum(p.numel() for p in params),
                   "verifier_norm_class": type(drafter.verifier_norm).__name__}, fh)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"speculators-read": speculators_read, "specforge-read": specforge_read,
     "speculators-train": speculators_train}[command](*args)
