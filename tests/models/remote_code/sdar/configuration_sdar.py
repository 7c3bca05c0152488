"""Configuration of the SDAR stand-in (see ../README.md): like SDAR's ``SDARConfig`` it names no ``pad_token_id``
(``transformers`` 4's ``PretrainedConfig`` defaulted it to ``None``; 5 does not), and it keeps ``block_size`` and
``mask_token_id``."""

from transformers import PretrainedConfig


class SDARConfig(PretrainedConfig):
    model_type = "sdar"

    def __init__(self, vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                 max_position_embeddings=64, initializer_range=0.02, block_size=4, mask_token_id=151669,
                 attention_dropout=0.0, use_cache=True, tie_word_embeddings=False, **kwargs):
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
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.attention_dropout = attention_dropout
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
