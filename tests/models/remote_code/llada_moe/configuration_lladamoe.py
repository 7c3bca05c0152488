"""Configuration of the LLaDA-MoE stand-in (see ../README.md): the fields of the released
``configuration_lladamoe.LLaDAConfig`` that the stand-in reads, with its ``model_type`` ``"llada"`` (dense LLaDA's too)
and no ``mask_token_id`` (the release's ``config.json`` records none)."""

from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, vocab_size=32, hidden_size=16, dense_intermediate_size=32, expert_intermediate_size=8,
                 shared_expert_intermediate_size=None, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=None, max_position_embeddings=64, initializer_range=0.02, rms_norm_eps=1e-5,
                 use_cache=False, pad_token_id=1, eos_token_id=None, tie_word_embeddings=False, rope_theta=50000.0,
                 partial_rotary_factor=1.0, rope_scaling=None, attention_dropout=0.0, num_experts_per_tok=2,
                 num_experts=4, qk_layernorm=True, moe_layer_freq=None, moe_router_enable_expert_bias=True, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dense_intermediate_size = dense_intermediate_size
        self.expert_intermediate_size = expert_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.rope_scaling = rope_scaling
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.qk_layernorm = qk_layernorm
        self.moe_layer_freq = moe_layer_freq if moe_layer_freq is not None else [1] * num_hidden_layers
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings,
                         **kwargs)
