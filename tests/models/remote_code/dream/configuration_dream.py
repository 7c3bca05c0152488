"""Configuration of the Dream stand-in (see ../README.md)."""

from transformers import PretrainedConfig


class DreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(self, vocab_size=32, hidden_size=16, num_attention_heads=2, max_position_embeddings=64,
                 rope_theta=10000.0, rope_scaling=None, mask_token_id=151666, use_cache=False,
                 tie_word_embeddings=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.use_cache = use_cache  # set before PretrainedConfig.__init__, as DreamConfig does: it survives
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.mask_token_id = mask_token_id
