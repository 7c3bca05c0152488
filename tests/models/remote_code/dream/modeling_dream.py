"""A tiny Dream-like denoiser (see ../README.md): the output at position i is used for token i+1.

Written for ``transformers`` 4 as Dream's ``modeling_dream.py`` is: the rotary embedding looks up
``ROPE_INIT_FUNCTIONS["default"]`` (gone in ``transformers`` 5) and keeps its frequencies in a non-persistent
``inv_freq`` buffer that ``_init_weights`` (``nn.Linear`` and ``nn.Embedding`` only) never refills,
``_tied_weights_keys`` is a list, and ``from_pretrained`` reloads the generation config as a
``DreamGenerationConfig`` (whose ``validate`` takes 4.x arguments). RoPE at ``position_ids``; ``attention_mask`` is ``"full"``, ``None`` or a ``(B, 1, T, T)`` bool mask.
"""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_dream import DreamConfig
from .generation_utils import DreamGenerationConfig


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DreamRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.rope_kwargs = config, {}
        self.rope_type = (config.rope_scaling or {}).get("rope_type", "default")
        self.rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]  # as DreamRotaryEmbedding.__init__
        inv_freq, self.attention_scaling = self.rope_init_fn(self.config, None, **self.rope_kwargs)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq  # (B, T, Dh/2)
        return (torch.cat([f(angles)] * 2, dim=-1)[:, None] * self.attention_scaling
                for f in (torch.cos, torch.sin))  # (B, 1, T, Dh) each


class DreamModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _tied_weights_keys = ["lm_head.weight"]  # noqa: RUF012 (transformers 4's list form)

    def __init__(self, config):
        super().__init__(config)
        d = config.hidden_size
        self.heads = config.num_attention_heads
        self.rotary_emb = DreamRotaryEmbedding(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model.generation_config = DreamGenerationConfig.from_pretrained(pretrained_model_name_or_path)
        return model

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.5)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.normal_(module.bias, std=0.1)

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)[None].expand(b, t)
        cos, sin = self.rotary_emb(position_ids)
        x = self.embed_tokens(input_ids)
        d = x.shape[-1]
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None  # "full" -> no mask
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(x)
        return MaskedLMOutput(logits=self.lm_head(x))
