"""A tiny Dream-like denoiser (see ../README.md): the output at position i is used for token i+1."""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from .configuration_dream import DreamConfig


class DreamModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        d = config.hidden_size
        self.heads = config.num_attention_heads
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.o_proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.5)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.normal_(module.bias, std=0.1)

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)[None].expand(b, t)
        x = self.embed_tokens(input_ids) + self.embed_positions(position_ids)
        d = x.shape[-1]
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None  # "full" -> no mask
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(x)
        return MaskedLMOutput(logits=self.lm_head(x))
