"""A tiny LLaDA-MoE-like masked-diffusion mixture-of-experts decoder (see ../README.md), no logit shift.

Its interface is the released ``modeling_lladamoe.py`` (``LLaDAMoEModelLM`` with ``model`` and ``lm_head``, loaded with
``AutoModel``; ``q_proj``/``k_proj``/``v_proj``/``o_proj`` with QK-norm over each head, RoPE at positions ``0..T-1``
from ``ROPE_INIT_FUNCTIONS["default"]``, full bidirectional attention; every layer a mixture of experts routed by
softmax probabilities plus an ``expert_bias`` buffer when ``moe_router_enable_expert_bias`` (added in place to the
softmax output, so that a backward pass fails as the release's does), top-k weighted by the biased value, through one
differentiable loop over the experts in training and eval mode alike). As that file: the ``attention_mask`` argument is discarded
(the release sets it to ``None``), a cache is refused (``assert not use_cache``), ``_init_weights`` fills only
``nn.Linear`` / ``nn.Embedding`` (so the rotary ``inv_freq`` is left unfilled by ``transformers`` 5's meta-device
loading), ``_tied_weights_keys`` is a list, and activation checkpointing goes through
``self._gradient_checkpointing_func`` in training mode.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MoeCausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_lladamoe import LLaDAConfig


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LLaDAMoERMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class LLaDAMoERotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rope_init_fn = ROPE_INIT_FUNCTIONS["default"]  # (KeyError under transformers 5 without dlmrl's patch 4)
        inv_freq, self.attention_scaling = self.rope_init_fn(config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, rope_dim/2)
        emb = torch.cat([angles, angles], dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class LLaDAMoEMLP(nn.Module):
    def __init__(self, config, size):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, size, bias=False)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LLaDAMoEAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.heads, self.head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
        d = config.hidden_size
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.q_norm = LLaDAMoERMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = LLaDAMoERMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings):
        b, t, d = hidden_states.shape
        q = self.q_norm(self.q_proj(hidden_states).reshape(-1, self.head_dim)).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).reshape(-1, self.head_dim)).view(b, t, self.heads, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, self.heads, -1).transpose(1, 2)
        cos, sin = (e[:, None] for e in position_embeddings)
        r = cos.shape[-1]
        q = torch.cat([q[..., :r] * cos + _rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + _rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.config.attention_dropout if self.training else 0.0)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class LLaDAMoESparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(LLaDAMoEMLP(config, config.expert_intermediate_size)
                                     for _ in range(config.num_experts))
        if config.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(config.num_experts))
        else:
            self.expert_bias = None

    def forward(self, hidden_states):
        b, t, d = hidden_states.shape
        x = hidden_states.view(-1, d)
        weights = F.softmax(self.gate(x), dim=1, dtype=torch.float)
        if self.expert_bias is not None:
            weights += self.expert_bias  # (in place on the softmax output, as the release: backward then fails)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):  # (the same differentiable loop in training and eval mode)
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.view(b, t, d)


class LLaDAMoEDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = LLaDAMoEAttention(config)
        self.mlp = LLaDAMoESparseMoeBlock(config)
        self.input_layernorm = LLaDAMoERMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LLaDAMoERMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_embeddings)
        return (hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)),)


class LLaDAMoEPreTrainedModel(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDAMoEDecoderLayer"]  # noqa: RUF012

    def _init_weights(self, module):  # (transformers 4 style: linear and embedding weights only)
        if isinstance(module, nn.Linear | nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)


class LLaDAMoEModel(LLaDAMoEPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDAMoEDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LLaDAMoERMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LLaDAMoERotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, **kwargs):
        assert not use_cache, "The cache mechanism is not supported for LLaDA MoE by default."
        attention_mask = None  # noqa: F841 (the release discards it: full attention over every position)
        hidden_states = self.embed_tokens(input_ids)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states, position_embeddings)[0]
            else:
                hidden_states = layer(hidden_states, position_embeddings)[0]
        return self.norm(hidden_states)


class LLaDAMoEModelLM(LLaDAMoEPreTrainedModel):
    _tied_weights_keys = ["lm_head.weight"]  # noqa: RUF012 (transformers 4's list form)

    def __init__(self, config):
        super().__init__(config)
        self.model = LLaDAMoEModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, return_dict=None,
                **kwargs):
        hidden_states = self.model(input_ids, attention_mask, position_ids, use_cache)
        return MoeCausalLMOutputWithPast(logits=self.lm_head(hidden_states))
