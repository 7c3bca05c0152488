"""A tiny stand-in for the ``modeling_ministral.py`` that Nemotron-Labs-Diffusion's checkpoint code imports (see
../README.md): a Ministral-3 decoder (Llama layout: ``q_proj``/``k_proj``/``v_proj``/``o_proj``, gated MLP, RMSNorm,
RoPE at ``position_ids``, grouped-query attention, Llama-4 query scaling by ``cache_position``) with the switches the
diffusion model drives:

- ``config.attn_class``: the attention class of every layer (``Ministral3Attention`` unless set);
- ``config.diffusion_lm`` -> ``Ministral3Attention.diffusion_lm``: True = bidirectional: the attention function gets
  ``attention_mask=None`` and ``is_causal=False`` (an explicit mask never reaches it); False = causal: the decoder's
  causal mask is passed;
- ``Ministral3Model.forward(..., is_training=False, use_causal_mask=False)``: the causal mask is built when
  ``use_causal_mask`` or when the attention is causal;
- a ``past_key_values`` cache extended with ``update`` when ``use_cache``, read (concatenated, not changed) otherwise;
- the attention kernel looked up as ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` (eager otherwise);
- activation checkpointing as transformers' Ministral-3 (which the release's file adapts) has it: decoder layers are
  ``GradientCheckpointingLayer`` s.

Written as the real file is for transformers 4.5x: ``create_causal_mask`` is called with ``input_embeds=`` and
``cache_position=`` (transformers 5 renamed the first and dropped the second: a ``TypeError``), which
``dlmrl.models.nemotron_diffusion`` patches.
"""

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(hidden_states, n_rep):
    b, h, t, d = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    return hidden_states[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def _get_llama_4_attn_scale(cache_position, beta, original_max_position_embeddings):
    if beta is None or original_max_position_embeddings is None:
        return torch.ones((), device=cache_position.device)
    scale = 1 + beta * torch.log(1 + torch.floor(cache_position.float() / original_max_position_embeddings))
    return scale[:, None]  # (T, 1): broadcast over (B, H, T, D)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    scores = query @ key.transpose(2, 3) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    elif kwargs.get("is_causal", module.is_causal):
        t, s = scores.shape[-2:]
        causal = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril(s - t)
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return (probs @ value).transpose(1, 2).contiguous(), probs


class Ministral3RMSNorm(nn.Module):
    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)


class Ministral3RotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        theta = config.rope_parameters.get("rope_theta", 1000000.0)
        dim = config.head_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = inv_freq

    def forward(self, x, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq.float().to(x.device)  # (B, T, D/2)
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Ministral3Attention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = config.attention_dropout
        self.diffusion_lm = getattr(config, "diffusion_lm", False)
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)

    @property
    def is_causal(self):  # (follows the switch the diffusion model flips: ar_generate's causal path)
        return not self.diffusion_lm

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, cache_position=None,
                use_cache=False, is_training=False, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        q = q * _get_llama_4_attn_scale(cache_position, self.config.rope_parameters.get("llama_4_scaling_beta"),
                                        self.config.rope_parameters.get("original_max_position_embeddings")).to(q.dtype)
        if past_key_values is not None:
            if use_cache:
                k, v = past_key_values.update(k, v, self.layer_idx, {"sin": sin, "cos": cos,
                                                                     "cache_position": cache_position})
            else:
                layer = past_key_values.layers[self.layer_idx]
                k, v = torch.cat([layer.keys, k], dim=-2), torch.cat([layer.values, v], dim=-2)
        interface = eager_attention_forward
        if self.config._attn_implementation != "eager":
            interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        dropout = 0.0 if not self.training else self.attention_dropout
        if self.diffusion_lm:
            out, weights = interface(self, q, k, v, attention_mask=None, dropout=dropout, scaling=self.scaling,
                                     is_causal=False)
        else:
            out, weights = interface(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling,
                                     sliding_window=self.config.sliding_window)
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


class Ministral3MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Ministral3DecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        attn_class = getattr(config, "attn_class", None) or Ministral3Attention
        self.self_attn = attn_class(config, layer_idx)
        self.mlp = Ministral3MLP(config)
        self.input_layernorm = Ministral3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = Ministral3RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
        attn, _ = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask, **kwargs)
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Ministral3PreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ("Ministral3DecoderLayer",)

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, Ministral3RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, Ministral3RotaryEmbedding):
            dim, theta = self.config.head_dim, self.config.rope_parameters.get("rope_theta", 1000000.0)
            module.inv_freq.copy_(1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)))


class Ministral3Model(Ministral3PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Ministral3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Ministral3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = Ministral3RotaryEmbedding(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, cache_position=None, is_training=False, use_causal_mask=False,
                **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if cache_position is None:
            seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            cache_position = torch.arange(seen, seen + inputs_embeds.shape[1], device=inputs_embeds.device)
        if position_ids is None:
            position_ids = cache_position.unsqueeze(0)
        causal = use_causal_mask or not getattr(self.layers[0].self_attn, "diffusion_lm", False)
        mask = attention_mask
        if causal:
            mask_function = (create_causal_mask if self.config.sliding_window is None
                             else create_sliding_window_causal_mask)
            mask = mask_function(config=self.config, input_embeds=inputs_embeds, attention_mask=attention_mask,
                                 cache_position=cache_position, past_key_values=past_key_values,
                                 position_ids=position_ids)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, position_embeddings=position_embeddings,
                                  past_key_values=past_key_values, cache_position=cache_position,
                                  use_cache=use_cache, is_training=is_training)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states),
                                       past_key_values=past_key_values if use_cache else None)
