"""Configuration of the Dream stand-in (see ../README.md)."""

from transformers import PretrainedConfig


class DreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(self, vocab_size=32, hidden_size=16, num_attention_heads=2, max_position_embeddings=64,
                 mask_token_id=151666, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)
