"""Configuration of the LLaDA2 stand-in (see ../README.md): LLaDA2's ``LLaDA2MoeConfig`` fields that the stand-in
reads (no ``block_size`` and no ``mask_token_id``: LLaDA2's ``config.json`` records neither), with its defaults
where dlmrl depends on them (``attention_dropout`` 0.1)."""

from transformers import PretrainedConfig


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"

    def __init__(self, vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=600000.0, rope_scaling=None,
                 partial_rotary_factor=0.5, max_position_embeddings=64, initializer_range=0.02, num_experts=4,
                 num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=8, first_k_dense_replace=1,
                 routed_scaling_factor=2.5, use_qk_norm=True, attention_dropout=0.1, pad_token_id=None,
                 use_cache=True, tie_word_embeddings=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.partial_rotary_factor = partial_rotary_factor
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_shared_experts = num_shared_experts
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.routed_scaling_factor = routed_scaling_factor
        self.use_qk_norm = use_qk_norm
        self.attention_dropout = attention_dropout
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
