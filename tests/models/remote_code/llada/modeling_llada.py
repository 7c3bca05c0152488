"""A tiny LLaDA-like masked denoiser (see ../README.md): bidirectional attention, RoPE, no shift.

Laid out and called as LLaDA's ``modeling_llada.py`` (``LLaDAModelLM.model.transformer.blocks[i]`` with
``q_proj``/``k_proj``/``v_proj``/``attn_out``/``ff_proj``/``up_proj``/``ff_out``; ``forward(input_ids,
attention_mask=None, ...)`` with no ``position_ids``), and written for ``transformers`` 4 as that file is: its
``__init__`` never calls ``post_init()``, ``tie_weights`` takes no arguments, ``forward`` reads
``self.config.use_cache``, the padding mask is turned into a bias that never reaches the attention (LLaDA's
``LLaDABlock.attention`` passes ``attn_mask=None``), and activation checkpointing is switched on with
``model.set_activation_checkpointing("whole_layer")`` instead of ``gradient_checkpointing_enable``. The blocks have
the released code's cache path (``layer_past``, ``use_cache``, keys cached before the rotary embedding, which is
applied by index through ``rotary_emb``) and ``LLaDAModel.forward`` refuses it, as the released file does.
"""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import LLaDAConfig


class RotaryEmbedding(nn.Module):
    """As LLaDA's: sin/cos tables over positions ``0 .. seq_len - 1`` (``get_rotary_embedding``), applied by index
    (``forward``: the queries take the last ``query_len`` positions of the keys'), the half-split rotation."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def get_rotary_embedding(self, seq_len, device):
        dim = self.config.d_model // self.config.n_heads
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
        freqs = torch.arange(seq_len, device=device, dtype=torch.float)[:, None] * inv_freq[None, :]
        positions = torch.cat((freqs, freqs), dim=-1)
        return positions.sin()[None, None], positions.cos()[None, None]

    def rotate_half(self, x):
        x1, x2 = x.unflatten(-1, (2, x.shape[-1] // 2)).unbind(dim=-2)
        return torch.cat((-x2, x1), dim=-1)

    def apply_rotary_pos_emb(self, pos_sin, pos_cos, t):
        return ((t * pos_cos) + (self.rotate_half(t) * pos_sin)).to(t.dtype)

    def forward(self, q, k):
        q_, k_ = (q.float(), k.float()) if self.config.rope_full_precision else (q, k)
        query_len, key_len = q_.shape[-2], k_.shape[-2]
        pos_sin, pos_cos = (t.type_as(q_) for t in self.get_rotary_embedding(key_len, q_.device))
        q_ = self.apply_rotary_pos_emb(pos_sin[:, :, key_len - query_len:], pos_cos[:, :, key_len - query_len:], q_)
        k_ = self.apply_rotary_pos_emb(pos_sin, pos_cos, k_)
        return q_.type_as(q), k_.type_as(k)


class Block(nn.Module):
    """LLaDA's ``LLaDALlamaBlock``: ``forward(x, attention_bias, layer_past, use_cache) -> (x, (k, v) | None)``, the
    cache holding keys before the rotary embedding, concatenated in front of the new ones (OLMo's layout)."""

    def __init__(self, config):
        super().__init__()
        d = config.d_model
        self.config = config
        self.attn_norm, self.ff_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.ff_proj, self.up_proj, self.ff_out = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.rotary_emb = RotaryEmbedding(config)

    def _scaled_dot_product_attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                                                is_causal=False)

    def attention(self, q, k, v, attention_bias=None, layer_past=None, use_cache=False):
        b, t, d = q.shape
        heads = self.config.n_heads
        q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        if layer_past is not None:
            k, v = torch.cat((layer_past[0], k), dim=-2), torch.cat((layer_past[1], v), dim=-2)
        present = (k, v) if use_cache else None
        q, k = self.rotary_emb(q, k)
        # LLaDA's LLaDABlock.attention: the attention bias is computed, but attn_mask=None is what is passed
        att = self._scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False)
        return self.attn_out(att.transpose(1, 2).reshape(b, t, d)), present

    def forward(self, x, attention_bias=None, layer_past=None, use_cache=False):
        h = self.attn_norm(x)
        att, cache = self.attention(self.q_proj(h), self.k_proj(h), self.v_proj(h), attention_bias,
                                    layer_past=layer_past, use_cache=use_cache)
        x = x + att
        h = self.ff_norm(x)
        return x + self.ff_out(torch.nn.functional.silu(self.ff_proj(h)) * self.up_proj(h)), cache


class LLaDAModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.activation_checkpointing_strategy = None
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.d_model),
            "emb_drop": nn.Dropout(0.0),
            "blocks": nn.ModuleList(Block(config) for _ in range(config.n_layers)),
            "ln_f": nn.LayerNorm(config.d_model),
        })
        if not config.weight_tying:  # (as LLaDA's LLaDAModel: no head of its own when tied to the embedding)
            self.transformer.update({"ff_out": nn.Linear(config.d_model, config.vocab_size, bias=False)})

    def set_activation_checkpointing(self, strategy):
        self.activation_checkpointing_strategy = strategy

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        # as the released LLaDAModel.forward: the cache path exists in the blocks, the model refuses it
        assert past_key_values is None and not use_cache, "The kvcache is not suppotred for MDM."
        x = self.transformer.emb_drop(self.transformer.wte(input_ids))
        bias = None
        if attention_mask is not None and (attention_mask == 0).any():
            bias = (1.0 - attention_mask.float())[:, None, None, :] * torch.finfo(torch.float32).min
        for block in self.transformer.blocks:
            if self.activation_checkpointing_strategy == "whole_layer":
                x, _ = checkpoint(block, x, bias, use_reentrant=False)
            else:
                x, _ = block(x, bias)
        x = self.transformer.ln_f(x)
        if self.config.weight_tying:
            return torch.nn.functional.linear(x, self.transformer.wte.weight)
        return self.transformer.ff_out(x)


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

    def get_output_embeddings(self):  # (as LLaDA's: the embedding itself when tied)
        return self.model.transformer.wte if self.config.weight_tying else self.model.transformer.ff_out

    def tie_weights(self):  # transformers 4's signature, as LLaDA's override
        if self.config.weight_tying:
            self.model.transformer.ff_out = self.model.transformer.wte

    def forward(self, input_ids=None, attention_mask=None, use_cache=None, return_dict=None):
        if use_cache is None:
            use_cache = self.config.use_cache  # as LLaDAModelLM.forward
        return CausalLMOutputWithPast(logits=self.model(input_ids, attention_mask))
