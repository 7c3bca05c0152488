"""A tiny stand-in for Nemotron-Labs-Diffusion's ``configuration_nemotron_labs_diffusion.py`` (see ../README.md).

The fields dlmrl reads: ``model_type = "nemotron_labs_diffusion"``, ``mask_token_id`` (default -1, as the real class),
``dlm_paradigm`` (``bidirectional``, ``block_diff`` or ``autoregressive``; default ``bidirectional``), ``block_size``
(default 32), and ``rope_parameters`` (``rope_theta``, ``llama_4_scaling_beta``, ``original_max_position_embeddings``).
As the real class it calls ``rope_config_validation`` and mirrors ``rope_parameters`` into ``rope_scaling``.
"""

from transformers.configuration_utils import PretrainedConfig
from transformers.modeling_rope_utils import rope_config_validation


class NemotronLabsDiffusionConfig(PretrainedConfig):
    model_type = "nemotron_labs_diffusion"
    keys_to_ignore_at_inference = ("past_key_values",)

    def __init__(self, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_act="silu",
                 max_position_embeddings=512, initializer_range=0.02, rms_norm_eps=1e-5, use_cache=True,
                 pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, rope_theta=1000000.0,
                 rope_parameters=None, attention_bias=False, attention_dropout=0.0, mlp_bias=False,
                 sliding_window=None, attn_implementation="sdpa", mask_token_id=-1, dlm_paradigm="bidirectional",
                 block_size=32, dlm_loss_weight=None, ar_loss_weight=1.0, dp_varying_mask_ratio=False, **kwargs):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_parameters = rope_parameters or {"rope_type": "default", "rope_theta": rope_theta}
        self.rope_theta = self.rope_parameters.get("rope_theta", rope_theta)
        self.rope_scaling = self.rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.sliding_window = sliding_window
        rope_config_validation(self)
        self.attn_implementation = attn_implementation
        self.mask_token_id = mask_token_id
        self.dlm_paradigm = dlm_paradigm
        self.block_size = block_size
        self.dlm_loss_weight = dlm_loss_weight
        self.ar_loss_weight = ar_loss_weight
        self.dp_varying_mask_ratio = dp_varying_mask_ratio
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
