"""Configuration of the LLaDA stand-in (see ../README.md)."""

from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, vocab_size=126464, d_model=16, n_heads=2, n_layers=1, mask_token_id=126336, **kwargs):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)
