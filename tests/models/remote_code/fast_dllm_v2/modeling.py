"""A tiny Fast-dLLM v2-like block-diffusion decoder (see ../README.md): Qwen2's layout (QKV biases, grouped-query
attention, RoPE), the AR head kept (the output at ``j`` predicts token ``j + 1``).

Written, as the release's ``modeling.py`` is, for ``transformers`` 4: RoPE from ``ROPE_INIT_FUNCTIONS["default"]``
into a non-persistent buffer, ``_tied_weights_keys`` a list, a ``DynamicCache`` extended with ``update`` when
``update_past_key_values`` is set and otherwise read as ``cache[layer]`` (not subscriptable in 5). In eval mode
``Fast_dLLM_QwenModel.forward`` ignores the ``attention_mask`` it is given and attends under ``self.eval_mask(seqlen,
block_size, cache_len)`` (blocks aligned to position 0, key block <= query block). In training mode
``Fast_dLLM_QwenForCausalLM.forward`` runs an SFT loss (``labels`` required), ``Fast_dLLM_QwenModel.forward`` builds
the mask of the doubled input ``[x_t | x_0]`` as a ``BlockMask`` (standing for flex attention's) and the attention
takes only that.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration import Fast_dLLM_QwenConfig


class BlockMask:
    """Stands for flex attention's ``BlockMask`` (all the training attention takes); holds a dense bool mask."""

    def __init__(self, dense):
        self.dense = dense


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Fast_dLLM_QwenRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Fast_dLLM_QwenRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rope_init_fn = ROPE_INIT_FUNCTIONS["default"]
        inv_freq, self.attention_scaling = self.rope_init_fn(config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, Dh/2)
        emb = torch.cat([angles, angles], dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class Fast_dLLM_QwenAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim, self.heads, self.kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None,
                update_past_key_values=False, **kwargs):
        b, t, _ = hidden_states.shape
        shape = (b, t, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = (e[:, None] for e in position_embeddings)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past_key_value is not None:
            if update_past_key_values:
                k, v = past_key_value.update(k, v, self.layer_idx)
            elif len(past_key_value) > self.layer_idx:  # (read only: transformers 4's indexing)
                k = torch.cat([past_key_value[self.layer_idx][0], k], dim=-2)
                v = torch.cat([past_key_value[self.layer_idx][1], v], dim=-2)
        if self.training:
            if not isinstance(attention_mask, BlockMask):
                raise TypeError("the training attention takes the BlockMask of the SFT input, got "
                                f"{type(attention_mask).__name__}")
            mask = attention_mask.dense
        else:
            mask = attention_mask
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
        return self.o_proj(out.reshape(b, t, -1))


class Fast_dLLM_QwenDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = Fast_dLLM_QwenAttention(config, layer_idx)
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj, self.up_proj = nn.Linear(d, m, bias=False), nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)
        self.input_layernorm = Fast_dLLM_QwenRMSNorm(d, config.rms_norm_eps)
        self.post_attention_layernorm = Fast_dLLM_QwenRMSNorm(d, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, past_key_value=None, **kwargs):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask,
                                           past_key_value=past_key_value, **kwargs)
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Fast_dLLM_QwenPreTrainedModel(PreTrainedModel):
    config_class = Fast_dLLM_QwenConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Fast_dLLM_QwenDecoderLayer"]  # noqa: RUF012

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Fast_dLLM_QwenRMSNorm):
            nn.init.ones_(module.weight)


def _sft_mask(length, block_size, device):
    """``(1, 1, 2L, 2L)`` bool: BD3-LM's mask over ``[noisy | clean]`` (blocks aligned to position 0)."""
    idx = torch.arange(2 * length, device=device)
    clean, block = idx >= length, (idx % length) // block_size
    bq, bk, cq, ck = block[:, None], block[None, :], clean[:, None], clean[None, :]
    return (((bq == bk) & (cq == ck)) | ((bq > bk) & ck & ~cq) | ((bq >= bk) & ck & cq))[None, None]


class Fast_dLLM_QwenModel(Fast_dLLM_QwenPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.bd_size = config.bd_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Fast_dLLM_QwenDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Fast_dLLM_QwenRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = Fast_dLLM_QwenRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def eval_mask(self, seqlen, block_size, cache_seq_len):
        q = torch.arange(seqlen) + cache_seq_len
        k = torch.arange(seqlen + cache_seq_len)
        return q[:, None] // block_size >= k[None, :] // block_size  # (T, S + T)

    def forward(self, input_ids=None, labels=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, update_past_key_values=False, block_size=32, **kwargs):
        h = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        if self.training:  # ([x_t | x_0]: both halves at the positions of x_0)
            half = h.shape[1] // 2
            position_ids = torch.arange(half, device=h.device).repeat(2)[None] if position_ids is None else position_ids
            attention_mask = BlockMask(_sft_mask(labels.shape[1], self.bd_size, h.device))
        else:
            if position_ids is None:
                position_ids = torch.arange(seen, seen + h.shape[1], device=h.device)[None]
            attention_mask = self.eval_mask(input_ids.shape[1], block_size, seen).to(h.device)
        position_embeddings = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=attention_mask, position_embeddings=position_embeddings,
                      past_key_value=past_key_values, update_past_key_values=update_past_key_values)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h),
                                       past_key_values=past_key_values if use_cache else None)


class Fast_dLLM_QwenForCausalLM(Fast_dLLM_QwenPreTrainedModel):
    _tied_weights_keys = ["lm_head.weight"]  # noqa: RUF012 (transformers 4's list form)

    def __init__(self, config):
        super().__init__(config)
        self.model = Fast_dLLM_QwenModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, update_past_key_values=False, block_size=32,
                mask_id=2, **kwargs):  # (the release: mask_id=151665)
        if self.training:  # (the SFT noising: every position masked with probability 1/2, the clean copy appended)
            labels = labels.clone()  # (AttributeError without labels, as the release's code)
            noisy = torch.where(torch.rand(input_ids.shape, device=input_ids.device) < 0.5,
                                mask_id, input_ids)
            input_ids = torch.cat([noisy, input_ids], dim=1)
        out = self.model(input_ids=input_ids, labels=labels, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, use_cache=use_cache,
                         update_past_key_values=update_past_key_values, block_size=block_size)
        h = out.last_hidden_state
        if self.training:
            h = h[:, : h.shape[1] // 2]
        logits = self.lm_head(h)
        loss = None
        if labels is not None:  # (the AR head: the output at j scores token j + 1)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values)
