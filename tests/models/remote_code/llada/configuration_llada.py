"""Configuration of the LLaDA stand-in (see ../README.md).

As LLaDA's ``LLaDAConfig(use_cache=False, **kwargs)`` it hands ``use_cache`` to ``PretrainedConfig``, which
``transformers`` 5 pops, so the built config has no ``use_cache`` unless dlmrl's compatibility patch sets it.
"""

from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, vocab_size=126464, d_model=16, n_heads=2, n_layers=1, mask_token_id=126336,
                 weight_tying=False, use_cache=False, rope_theta=10000.0, rope_full_precision=True, rope=True,
                 alibi=False, block_group_size=1, input_emb_norm=False, scale_logits=False, **kwargs):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.mask_token_id = mask_token_id
        self.weight_tying = weight_tying
        self.rope_theta, self.rope_full_precision, self.rope, self.alibi = rope_theta, rope_full_precision, rope, alibi
        self.block_group_size, self.input_emb_norm, self.scale_logits = block_group_size, input_emb_norm, scale_logits
        super().__init__(use_cache=use_cache, **kwargs)
