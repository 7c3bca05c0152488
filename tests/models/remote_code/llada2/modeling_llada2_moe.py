"""A tiny LLaDA2-like block-diffusion mixture-of-experts decoder (see ../README.md), no logit shift.

Its interface is LLaDA2's ``modeling_llada2_moe.py`` (``LLaDA2MoeModelLM`` with ``model`` and ``lm_head``; fused
``query_key_value`` and ``dense`` projections, QK-norm, RoPE on the first ``partial_rotary_factor`` of each head from
``ROPE_INIT_FUNCTIONS["default"]``, grouped-query attention; a dense first layer, then experts routed by sigmoid
scores plus an ``expert_bias`` buffer and one shared expert). As that file, it is written for ``transformers`` 4:
``is_torch_fx_available`` is imported from ``transformers.utils.import_utils`` at module level (gone in 5); a 4-D
boolean mask is turned into the additive form and a float one is taken as additive; the cache is extended with
``past_key_values.update``; the experts run a differentiable loop in training mode and ``moe_infer`` under
``torch.no_grad()`` in eval mode; activation checkpointing goes through ``self._gradient_checkpointing_func``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils.import_utils import is_torch_fx_available

from .configuration_llada2_moe import LLaDA2MoeConfig

if is_torch_fx_available():
    pass  # (LLaDA2 wraps its mask helper with torch.fx.wrap here)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LLaDA2MoeRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class LLaDA2MoeRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rope_init_fn = ROPE_INIT_FUNCTIONS["default"]
        inv_freq, self.attention_scaling = self.rope_init_fn(config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, rope_dim/2)
        emb = torch.cat([angles, angles], dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim, self.heads, self.kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        d = config.hidden_size
        self.query_key_value = nn.Linear(d, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        self.dense = nn.Linear(self.heads * self.head_dim, d, bias=False)
        self.query_layernorm = LLaDA2MoeRMSNorm(self.head_dim, config.rms_norm_eps)
        self.key_layernorm = LLaDA2MoeRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None):
        b, t, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(b, t, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = (x.transpose(1, 2) for x in qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2))
        q, k = self.query_layernorm(q), self.key_layernorm(k)
        cos, sin = (e[:, None] for e in position_embeddings)
        r = cos.shape[-1]
        q = torch.cat([q[..., :r] * cos + _rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + _rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, self.layer_idx)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask,
                                             dropout_p=self.config.attention_dropout if self.training else 0.0)
        return self.dense(out.transpose(1, 2).reshape(b, t, -1))


class LLaDA2MoeMLP(nn.Module):
    def __init__(self, config, intermediate_size):
        super().__init__()
        d = config.hidden_size
        self.gate_proj = nn.Linear(d, intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LLaDA2MoeGate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k, self.scale = config.num_experts_per_tok, config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, h):
        scores = torch.sigmoid(F.linear(h.float(), self.weight.float()))  # (N, E)
        idx = (scores + self.expert_bias).topk(self.top_k, dim=-1).indices
        w = scores.gather(1, idx)
        return idx, w / (w.sum(-1, keepdim=True) + 1e-20) * self.scale


class LLaDA2MoeSparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.k = config.num_experts_per_tok
        self.experts = nn.ModuleList(LLaDA2MoeMLP(config, config.moe_intermediate_size)
                                     for _ in range(config.num_experts))
        self.gate = LLaDA2MoeGate(config)
        self.shared_experts = LLaDA2MoeMLP(config, config.moe_intermediate_size * config.num_shared_experts)

    def forward(self, x):
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        idx, w = self.gate(flat)
        if self.training:
            rep = flat.repeat_interleave(self.k, dim=0)
            y = torch.empty_like(rep)
            for i, expert in enumerate(self.experts):
                y[idx.view(-1) == i] = expert(rep[idx.view(-1) == i])
            y = (y.view(*w.shape, d) * w[..., None]).sum(1).to(x.dtype)
        else:
            y = self.moe_infer(flat, idx, w)
        return y.view(b, t, d) + self.shared_experts(x)

    @torch.no_grad()
    def moe_infer(self, flat, idx, w):
        order = idx.view(-1).argsort()
        tokens = flat[order // self.k]
        counts = torch.bincount(idx.view(-1), minlength=len(self.experts)).tolist()
        outs = torch.cat([self.experts[i](chunk) for i, chunk in enumerate(tokens.split(counts)) if len(chunk)])
        y = torch.empty_like(outs)
        y[order] = outs
        return (y.view(*w.shape, -1).to(w.dtype) * w[..., None]).sum(1).to(flat.dtype)


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attention = LLaDA2MoeAttention(config, layer_idx)
        self.mlp = (LLaDA2MoeSparseMoeBlock(config) if layer_idx >= config.first_k_dense_replace
                    else LLaDA2MoeMLP(config, config.intermediate_size))
        self.input_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None):
        h = hidden_states + self.attention(self.input_layernorm(hidden_states), attention_mask, position_embeddings,
                                           past_key_value)
        return h + self.mlp(self.post_attention_layernorm(h))


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]  # noqa: RUF012

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding, LLaDA2MoeGate)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LLaDA2MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LLaDA2MoeRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                **kwargs):
        h = self.word_embeddings(input_ids)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if position_ids is None:
            start = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(start, start + h.shape[1], device=h.device)[None]
        if attention_mask is not None and attention_mask.dtype == torch.bool:  # (4-D block masks)
            attention_mask = torch.zeros(attention_mask.shape, dtype=h.dtype, device=h.device).masked_fill(
                ~attention_mask, torch.finfo(h.dtype).min)
        position_embeddings = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                h = self._gradient_checkpointing_func(layer.__call__, h, attention_mask, position_embeddings,
                                                      past_key_values)
            else:
                h = layer(h, attention_mask, position_embeddings, past_key_values)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h),
                                       past_key_values=past_key_values if use_cache else None)


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, labels=None,
                use_cache=None, **kwargs):
        out = self.model(input_ids, attention_mask, position_ids, past_key_values, use_cache, **kwargs)
        logits = self.lm_head(out.last_hidden_state).float()
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten()) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values)
