"""A tiny LLaDA-like masked denoiser (see ../README.md): bidirectional attention, RoPE, no shift."""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import LLaDAConfig


def _rotate(x, positions):
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32, device=x.device) / half))
    angles = positions[:, None].float() * freqs[None, :]  # (T, half)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (T, D)
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x, bias):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        positions = torch.arange(t, device=x.device)  # LLaDA: rotary positions 0..T-1, no position ids
        q, k = _rotate(q, positions), _rotate(k, positions)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=False)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(x)


class LLaDAModelLM(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config.d_model, config.n_heads) for _ in range(config.n_layers))
        self.ff_out = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.5)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.normal_(module.bias, std=0.1)

    def get_output_embeddings(self):
        return self.ff_out

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        x = self.wte(input_ids)
        bias = None
        if attention_mask is not None and (attention_mask == 0).any():
            bias = (1.0 - attention_mask.to(x.dtype))[:, None, None, :] * torch.finfo(x.dtype).min  # (the weights' dtype)
        for block in self.blocks:
            x = block(x, bias)
        return CausalLMOutputWithPast(logits=self.ff_out(x))
