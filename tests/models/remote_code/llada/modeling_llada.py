"""A tiny LLaDA-like masked denoiser (see ../README.md): bidirectional attention, RoPE, no shift.

Laid out and called as LLaDA's ``modeling_llada.py`` (``LLaDAModelLM.model.transformer.blocks[i]`` with
``q_proj``/``k_proj``/``v_proj``/``attn_out``/``ff_proj``/``up_proj``/``ff_out``; ``forward(input_ids,
attention_mask=None, ...)`` with no ``position_ids``), and written for ``transformers`` 4 as that file is: its
``__init__`` never calls ``post_init()``, ``tie_weights`` takes no arguments, ``forward`` reads
``self.config.use_cache``, the padding mask is turned into a bias that never reaches the attention (LLaDA's
``LLaDABlock.attention`` passes ``attn_mask=None``), and activation checkpointing is switched on with
``model.set_activation_checkpointing("whole_layer")`` instead of ``gradient_checkpointing_enable``.
"""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
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
        self.attn_norm, self.ff_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.ff_proj, self.up_proj, self.ff_out = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x, attention_bias=None):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        positions = torch.arange(t, device=x.device)  # LLaDA: rotary positions 0..T-1, no position ids
        q, k = _rotate(q, positions), _rotate(k, positions)
        # LLaDA's LLaDABlock.attention: the attention bias is computed, but attn_mask=None is what is passed
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, t, d))
        h = self.ff_norm(x)
        return x + self.ff_out(torch.nn.functional.silu(self.ff_proj(h)) * self.up_proj(h))


class LLaDAModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.activation_checkpointing_strategy = None
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.d_model),
            "blocks": nn.ModuleList(Block(config.d_model, config.n_heads) for _ in range(config.n_layers)),
            "ln_f": nn.LayerNorm(config.d_model),
            "ff_out": nn.Linear(config.d_model, config.vocab_size, bias=False),
        })

    def set_activation_checkpointing(self, strategy):
        self.activation_checkpointing_strategy = strategy

    def forward(self, input_ids, attention_mask=None):
        x = self.transformer.wte(input_ids)
        bias = None
        if attention_mask is not None and (attention_mask == 0).any():
            bias = (1.0 - attention_mask.float())[:, None, None, :] * torch.finfo(torch.float32).min
        for block in self.transformer.blocks:
            if self.activation_checkpointing_strategy == "whole_layer":
                x = checkpoint(block, x, bias, use_reentrant=False)
            else:
                x = block(x, bias)
        return self.transformer.ff_out(self.transformer.ln_f(x))


class LLaDAModelLM(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)  # and no post_init(), as LLaDA's LLaDAModelLM
        self.model = LLaDAModel(config)
        for module in self.modules():
            self._init_weights(module)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.5)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.normal_(module.bias, std=0.1)

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def get_output_embeddings(self):
        return self.model.transformer.ff_out

    def tie_weights(self):  # transformers 4's signature, as LLaDA's override
        if self.config.weight_tying:
            self.model.transformer.ff_out.weight = self.model.transformer.wte.weight

    def forward(self, input_ids=None, attention_mask=None, use_cache=None, return_dict=None):
        if use_cache is None:
            use_cache = self.config.use_cache  # as LLaDAModelLM.forward
        return CausalLMOutputWithPast(logits=self.model(input_ids, attention_mask))
