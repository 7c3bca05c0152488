"""A tiny SDAR-like block-diffusion decoder (see ../README.md): Qwen3's layout (``q_norm``/``k_norm`` on the head
dimension, grouped-query attention, RoPE at explicit ``position_ids``), no logit shift.

Written, as SDAR's ``modeling_sdar.py`` is, for ``transformers`` 4 with flash-attn installed: ``flash_attn``'s
``rms_norm_fn`` is imported at module level (every RMSNorm calls it) and ``flash_attn_func`` inside ``try``;
``LossKwargs`` comes from ``transformers.utils`` (gone in 5); ``SDARModel.__init__`` reads ``config.pad_token_id``
(which 5's ``PretrainedConfig`` no longer defaults); RoPE comes from ``ROPE_INIT_FUNCTIONS["default"]`` into a
non-persistent buffer; ``_tied_weights_keys`` is a list. In training mode ``SDARForCausalLM.forward`` runs an SFT
loss (labels required, no logits) and the attention takes only the block mask that loss builds (SDAR: a
flex-attention ``BlockMask``); in eval mode an all-True mask goes to ``flash_attn_func`` and any other boolean mask
to scaled-dot-product attention. A cache is extended (``store_kv=True``) or read (``cache[layer]``) as SDAR's is.
"""

import torch
import torch.nn.functional as F
from flash_attn.ops.triton.layer_norm import rms_norm_fn
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import LossKwargs

from .configuration_sdar import SDARConfig

try:
    from flash_attn import flash_attn_func
except ImportError:
    pass


class SDARKwargs(LossKwargs, total=False):
    store_kv: bool


class BlockMask:
    """Stands for flex attention's ``BlockMask`` (all SDAR's training attention takes); holds a dense bool mask."""

    def __init__(self, dense):
        self.dense = dense


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class SDARRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return rms_norm_fn(x, weight=self.weight, bias=None, eps=self.eps)


class SDARRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.rope_kwargs = config, {}
        self.rope_init_fn = ROPE_INIT_FUNCTIONS["default"]
        inv_freq, self.attention_scaling = self.rope_init_fn(config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, Dh/2)
        emb = torch.cat([angles, angles], dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class SDARAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim, self.heads, self.kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)
        self.q_norm = SDARRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = SDARRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None, **kwargs):
        b, t, _ = hidden_states.shape
        shape = (b, t, -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states).view(shape)).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_norm(self.k_proj(hidden_states).view(shape)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = (e[:, None] for e in position_embeddings)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past_key_value is not None and kwargs.get("store_kv"):
            k, v = past_key_value.update(k, v, self.layer_idx)
        elif past_key_value is not None and len(past_key_value) > self.layer_idx:  # read only
            past_k, past_v = past_key_value[self.layer_idx]
            k, v = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
        if self.training:
            if not isinstance(attention_mask, BlockMask):
                raise TypeError("SDAR's attention in training mode takes the BlockMask its SFT loss builds, got "
                                f"{type(attention_mask).__name__}")
            mask = attention_mask.dense
        else:
            mask = attention_mask.bool() if attention_mask is not None else None
        if not self.training and (mask is None or bool(mask.all())):  # (SDAR's code requires a mask; None = full)
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False,
                                  softmax_scale=self.scaling)
        else:
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling).transpose(1, 2)
        return self.o_proj(out.reshape(b, t, -1)), None


class SDARDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = SDARAttention(config, layer_idx)
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj, self.up_proj = nn.Linear(d, m, bias=False), nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)
        self.input_layernorm = SDARRMSNorm(d, config.rms_norm_eps)
        self.post_attention_layernorm = SDARRMSNorm(d, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, past_key_value=None, **kwargs):
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                 position_embeddings=position_embeddings, attention_mask=attention_mask,
                                 past_key_value=past_key_value, **kwargs)
        h = hidden_states + attn
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SDARPreTrainedModel(PreTrainedModel):
    config_class = SDARConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["SDARDecoderLayer"]  # noqa: RUF012

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        elif isinstance(module, SDARRMSNorm):
            nn.init.ones_(module.weight)


class SDARModel(SDARPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([SDARDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = SDARRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, store_kv=None, **kwargs):
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if position_ids is None:
            start = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(start, start + h.shape[1], device=h.device)[None].expand(h.shape[0], -1)
        position_embeddings = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=attention_mask, position_embeddings=position_embeddings,
                      past_key_value=past_key_values, store_kv=store_kv, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h),
                                       past_key_values=past_key_values if use_cache else None)


def _sft_mask(length, block_size, device):
    """``(1, 1, 2L, 2L)`` bool: BD3-LM's mask over ``[noisy | clean]`` (blocks aligned to position 0)."""
    idx = torch.arange(2 * length, device=device)
    clean, block = idx >= length, (idx % length) // block_size
    bq, bk, cq, ck = block[:, None], block[None, :], clean[:, None], clean[None, :]
    allowed = ((bq == bk) & (cq == ck)) | ((bq > bk) & ck & ~cq) | ((bq >= bk) & ck & cq)
    return allowed[None, None]


class SDARForCausalLM(SDARPreTrainedModel):
    _tied_weights_keys = ["lm_head.weight"]  # noqa: RUF012 (transformers 4's list form)

    def __init__(self, config):
        super().__init__(config)
        self.model = SDARModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, **kwargs: SDARKwargs):
        if self.training:  # the SFT loss: every labelled token masked, scored next to the clean sequence
            if labels is None:
                raise ValueError("Labels must be provided for training.")
            t = input_ids.shape[1]
            answer = labels != -100
            noisy = input_ids.masked_fill(answer, self.config.mask_token_id)
            positions = torch.arange(t, device=input_ids.device)[None].expand(input_ids.shape[0], t).repeat(1, 2)
            mask = BlockMask(_sft_mask(t, self.config.block_size, input_ids.device))
            h = self.model(torch.cat([noisy, input_ids], 1), attention_mask=mask, position_ids=positions,
                           use_cache=False).last_hidden_state[:, :t]
            loss = F.cross_entropy(self.lm_head(h[answer]).float(), labels[answer])
            return CausalLMOutputWithPast(loss=loss, logits=None)
        out = self.model(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, use_cache, **kwargs)
        logits = self.lm_head(out.last_hidden_state)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values)
