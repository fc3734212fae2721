"""The model a capture runs: MODEL resolved once (resolve_target), its rows read and checked
against its config before the weights load, the weights loaded (sharded: rank 0 alone, on the
host), and the gate on the fast path (enable() + assert_fast, or a one-line refusal).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from fastpath.capture import distributed
from fastpath.capture.data import load_rows, load_tokenizer
from fastpath.capture.layers import parse_layers
from fastpath.capture.options import CaptureOptions
from fastpath.models.resolve import ResolvedModel
from fastpath.shared.errors import FastpathError, first_line


def resolve_target(opts: CaptureOptions, device: Any) -> ResolvedModel:
    """MODEL read once, cut to --model-layers, in --dtype, on `device` (the prebuilt model's own
    when there is one): the layer ids, the tokenizer, the shard decision, the build and the client
    checks all read this value, never opts.model again."""
    if opts.prebuilt is not None:
        return opts.prebuilt.resolved
    from fastpath.models.resolve import resolve_model

    return resolve_model(opts.model, layers=opts.model_layers, dtype=opts.dtype, device=device)


def load_target(opts: CaptureOptions, device: Any, skeleton: bool = False,
                target: ResolvedModel | None = None) -> Any:
    """The target with its weights on `device`, or (skeleton) only its shapes, on meta.
    target: the run's resolve_target (resolved here when not given)."""
    from fastpath.models.build import build_resolved
    from fastpath.models.paths import hidden_compiled_peers

    target = (target if target is not None else resolve_target(opts, device)).on(device)
    # The reference path must be transformers' torch fallbacks (as in `fastpath verify`).
    with hidden_compiled_peers():
        return build_resolved(target, seed=opts.seed, skeleton=skeleton)


def shard_mode(opts: CaptureOptions, world: distributed.World, device: Any, target: ResolvedModel) -> str:
    import torch

    return distributed.choose_shard(opts.shard, world.size, device.type, lambda: target.weight_bytes,
                                    lambda: torch.cuda.get_device_properties(device).total_memory)


def read_rows(opts: CaptureOptions, target: ResolvedModel, say: Any) -> Any:
    """--layers against the target's config, then DATA's rows (tokenized with --tokenizer, else the
    model directory's): what the user typed is checked from the config alone, before the weights
    load (a large checkpoint takes minutes, on every rank)."""
    from fastpath.models.sizing import human_bytes

    parse_layers(opts.layers, int(target.config.num_hidden_layers), opts.layer_convention)
    opts.status.stage = "while reading DATA"
    tokenizer_dir = opts.tokenizer or (str(target.model_dir) if target.model_dir is not None else None)
    size = Path(opts.data).stat().st_size if Path(opts.data).is_file() else 0
    say(f"reading {opts.data} ({human_bytes(size)}" + (", tokenizing every conversation)" if tokenizer_dir else ")"))
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir else None
    loaded = load_rows(opts.data, tokenizer, opts.max_len, int(target.config.vocab_size))
    opts.status.rows = len(loaded.rows)
    return loaded


def load_model(opts: CaptureOptions, target: ResolvedModel, world: distributed.World, device: Any, shard: str,
                rows: int, say: Any) -> tuple[Any, Any, bool]:
    """(the built target, the device its weights were made on, whether this rank holds a meta
    skeleton). Sharded, only rank 0 loads the weights (on the host); the other ranks build the
    model on the meta device and receive their shards from it (distributed.shard_decoder), so the
    host holds one copy of the checkpoint however many processes run."""
    import torch

    opts.status.stage = "while building the model"
    say(f"{rows} rows; loading {opts.model}" + (" on rank 0's host, to shard with FSDP2" if shard == "fsdp" else "")
        + ("" if opts.prebuilt is not None or target.model_dir is not None
           else ": random weights initialised on the host first (minutes for a full-size preset)"))
    load_device = torch.device("cpu") if shard == "fsdp" else device
    skeleton = shard == "fsdp" and not world.is_main and opts.prebuilt is None
    built = opts.prebuilt if opts.prebuilt is not None else load_target(opts, load_device, skeleton, target)
    if opts.on_model is not None:
        opts.on_model(built.model)
    return built, load_device, skeleton


def gate_fast_path(model: Any, opts: CaptureOptions) -> tuple[str, bool]:
    """enable() + assert_fast, or a clear refusal. Returns (path label, on_fast_path)."""
    from fastpath.routing import engine as routes

    if opts.reference_path:  # with --allow-slow: check_options refused it without
        routes.disable()
        return "slow (--allow-slow --reference-path): every op on transformers' reference path", False
    routes.enable(**{"warn": False, **opts.enable_kwargs})
    try:
        routes.assert_fast(model)
    except FastpathError as exc:
        slow = [r for r in routes.explain(model).rows if not r["fast"]]
        reason = (f"{len(slow)} op(s) take a slow path (first: {slow[0]['layer']} {slow[0]['op']}: {slow[0]['impl']})"
                  if slow else first_line(exc))
        if not opts.allow_slow:
            routes.disable()
            raise FastpathError(f"refusing to capture on a slow fallback: {reason} "
                                f"(run `fastpath doctor --model {shlex.quote(str(opts.model))}`; "
                                "--allow-slow to capture anyway)") from None
        return f"slow (--allow-slow): {reason}", True
    return "fast", True
