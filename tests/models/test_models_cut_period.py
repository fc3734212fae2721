"""`--layers N` on models whose layer pattern comes from a period and an offset (Jamba, Zamba).

The H200 found both: `verify jamba-mini-1.7 --layers 4` kept no attention layer (Jamba's first
attention layer is layer 4), so transformers' decode cache raised; `verify zamba-7b --layers 4`
kept one hybrid layer, and transformers cannot tie Zamba's shared block to a second one. A cut
that loses a block type is now one line naming the --layers that keeps them all, before any work.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from fastpath.models.resolve import transformers_config
from fastpath.shared.errors import UsageError
from fastpath.shared.model_source import load_config


@pytest.mark.parametrize(("preset", "layers", "enough", "kind"),
                         [("jamba-mini-1.7", 4, 5, "attention"), ("zamba-7b", 4, 8, "hybrid")])
def test_a_cut_that_loses_a_block_type_names_the_layers_that_keep_it(preset, layers, enough, kind):
    with pytest.raises(UsageError, match=rf"too few {kind} layers.*use --layers {enough}$"):
        transformers_config(load_config(preset), layers)
    cut = transformers_config(load_config(preset), enough)
    full = transformers_config(load_config(preset))
    assert set(cut.layers_block_type) == set(full.layers_block_type)


def test_zamba_cut_keeps_two_hybrid_layers_and_builds():
    """The shared transformer block is tied across hybrid layers: the cut must build a model."""
    from transformers import AutoModelForCausalLM

    config = transformers_config(load_config("zamba-7b"), 8)
    config.hidden_size, config.intermediate_size, config.vocab_size = 64, 128, 128
    config.attention_hidden_size, config.num_attention_heads, config.num_key_value_heads = 128, 4, 4
    config.attention_head_dim, config.mamba_d_state, config.mamba_dt_rank = 32, 4, 8
    model = AutoModelForCausalLM.from_config(config)
    assert config.layers_block_type.count("hybrid") == 2
    assert sum(1 for name, _ in model.named_parameters() if ".shared_transf." in name) > 0


@pytest.mark.parametrize(("preset", "fewest"), [("jamba-mini-1.7", 5), ("zamba-7b", 8), ("qwen3.5-27b", 2)])
def test_the_memory_guard_never_suggests_a_cut_below_the_fewest_layers(preset, fewest):
    """On an 80 GB H100, `verify jamba-mini-1.7 --layers 5` was told "try --layers 3", and
    --layers 3 was then refused for losing the attention layer. The fewest layers is decided once
    (resolve_model) and the guard's suggestion starts there."""
    from fastpath.models.resolve import resolve_model
    from fastpath.models.sizing import FIT_FRACTION, check_fits, estimate, scaled_peak

    model = resolve_model(preset, layers=fewest + 1, dtype="bf16", device="cpu")
    assert model.min_layers == fewest
    size = estimate(model.config, model.source.decoder, dtype="bf16", device="cpu", batch=1, seq_len=1024,
                    backward=True, paths=2)

    def refit(layers=None, dtype=None, seq_len=1024, batch=1):
        return scaled_peak(size, model.config, layers=layers, dtype=dtype, batch=batch, seq_len=seq_len,
                           backward=True, paths=2)

    size.free_bytes, size.free_source = int(refit(layers=fewest - 1) / FIT_FRACTION) + 1, "GPU memory (test)"
    with pytest.raises(UsageError) as err:
        check_fits(size, f"verify {preset}", refit, model.min_layers, batch=1, seq_len=1024)
    for below in range(1, fewest):
        assert f"--layers {below}," not in str(err.value) and not str(err.value).endswith(f"--layers {below}")
