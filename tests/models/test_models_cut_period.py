"""`--layers N` on models whose layer pattern comes from a period and an offset (Jamba, Zamba).

The H200 found both: `verify jamba-mini-1.7 --layers 4` kept no attention layer (Jamba's first
attention layer is layer 4), so transformers' decode cache raised; `verify zamba-7b --layers 4`
kept one hybrid layer, and transformers cannot tie Zamba's shared block to a second one. A cut
that loses a block type is now one line naming the --layers that keeps them all, before any work.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from fastpath.models.build import transformers_config
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
