"""Configuration of the Fast-dLLM v2 stand-in (see ../README.md): the ``Fast_dLLM_QwenConfig`` fields the stand-in
reads, the block size as ``bd_size`` (as the release's ``config.json`` records it)."""

from transformers import PretrainedConfig


class Fast_dLLM_QwenConfig(PretrainedConfig):
    model_type = "Fast_dLLM_Qwen"

    def __init__(self, vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
                 max_position_embeddings=64, initializer_range=0.02, attention_dropout=0.0, bd_size=32,
                 pad_token_id=None, use_cache=True, tie_word_embeddings=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.attention_dropout = attention_dropout
        self.bd_size = bd_size
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
