"""A tiny stand-in for Nemotron-Labs-Diffusion's ``modeling_nemotron_labs_diffusion.py`` (see ../README.md), no logit
shift for the diffusion logits.

Its interface is the release's ``NemotronLabsDiffusionModel``: an ``encoder`` (``Ministral3Model`` of
``modeling_ministral.py``, built from a deep copy of the config with ``diffusion_lm`` and ``attn_class`` set) and a
``diffusion_head``; ``config.dlm_paradigm`` picks the attention: ``block_diff`` ->
``NemotronLabsDiffusionFlexAttention`` (its own ``[noisy | clean]`` mask over the whole input, ``attention_mask`` ignored; the release compiles flex
attention, this stand-in computes the same mask densely), ``bidirectional`` -> ``Ministral3Attention`` with
``diffusion_lm=True``, ``autoregressive`` -> ``Ministral3Attention`` with ``diffusion_lm=False`` (plain causal
attention), anything else a ``ValueError``. ``forward(input_ids, attention_mask=None, position_ids=None, labels=None,
past_key_values=None, **kwargs)`` passes the rest to the encoder and returns ``logits`` (no loss: dlmrl passes no
labels) and ``past_key_values``. ``generate`` is overridden with the release's block-decoding signature (so
transformers' ``GenerationMixin.generate`` is shadowed, as in the release); its body is not mimicked (the tests
re-implement it as their oracle).
"""

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.utils import ModelOutput

from .configuration_nemotron_labs_diffusion import NemotronLabsDiffusionConfig
from .modeling_ministral import (
    Ministral3Attention,
    Ministral3Model,
    Ministral3PreTrainedModel,
    apply_rotary_pos_emb,
    repeat_kv,
)


@dataclass
class NemotronLabsDiffusionOutputWithPast(ModelOutput):
    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    causal_logits: torch.FloatTensor | None = None
    past_key_values: Cache | None = None


class NemotronLabsDiffusionFlexAttention(Ministral3Attention):
    """The block-diffusion attention: over ``[noisy (n) | clean (n)]``, noisy ``i`` attends noisy keys of its block
    and clean keys of earlier blocks, clean ``i`` attends clean keys ``<= i`` (fully causal); no mask argument."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.block_size = self.config.block_size

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, cache_position=None,
                is_training=True, **kwargs):
        b, t, _ = hidden_states.shape
        shape = (b, t, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        if is_training:
            (q1, q2), (k1, k2) = q.chunk(2, dim=2), k.chunk(2, dim=2)
            q1, k1 = apply_rotary_pos_emb(q1, k1, cos, sin)
            q2, k2 = apply_rotary_pos_emb(q2, k2, cos, sin)
            q, k = torch.cat([q1, q2], dim=2), torch.cat([k1, k2], dim=2)
        else:
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        k, v = repeat_kv(k, self.num_key_value_groups), repeat_kv(v, self.num_key_value_groups)
        n = t // 2
        idx = torch.arange(t, device=q.device)
        clean = idx >= n
        blk = torch.where(clean, idx - n, idx) // self.block_size
        qc, kc, qb, kb = clean[:, None], clean[None, :], blk[:, None], blk[None, :]
        allowed = ((qb == kb) & ~kc & ~qc) | ((qb > kb) & kc & ~qc) | ((idx[:, None] >= idx[None, :]) & kc & qc)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), None


class NemotronLabsDiffusionModel(Ministral3PreTrainedModel, GenerationMixin):
    config_class = NemotronLabsDiffusionConfig

    def __init__(self, config):
        super().__init__(config)
        self.mask_token_id = config.mask_token_id
        diffusion_config = copy.deepcopy(config)
        diffusion_config.diffusion_lm = True
        if config.dlm_paradigm == "block_diff":
            diffusion_config.attn_class = NemotronLabsDiffusionFlexAttention
        elif config.dlm_paradigm in ("bidirectional", "autoregressive"):
            diffusion_config.attn_class = Ministral3Attention
            if config.dlm_paradigm == "autoregressive":
                diffusion_config.diffusion_lm = False
        else:
            raise ValueError(f"Unsupported DLM paradigm: {config.dlm_paradigm}")
        self.encoder = Ministral3Model(diffusion_config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.vocab_size = config.vocab_size
        self.post_init()

    def get_input_embeddings(self):
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value):
        self.encoder.embed_tokens = value

    def get_output_embeddings(self):
        return self.diffusion_head

    def set_output_embeddings(self, new_embeddings):
        self.diffusion_head = new_embeddings

    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None, past_key_values=None,
                **kwargs):
        if labels is not None:
            raise NotImplementedError("the stand-in has no training loss (dlmrl computes its own)")
        out = self.encoder(past_key_values=past_key_values, input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, is_training=False, **kwargs)
        return NemotronLabsDiffusionOutputWithPast(logits=self.diffusion_head(out.last_hidden_state),
                                                   past_key_values=out.past_key_values)

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens, block_length, threshold=None, causal_context=True,
                 temperature=0.0, eos_token_id=None, max_thinking_tokens=None, end_think_token_id=None):
        raise NotImplementedError("the stand-in does not mimic the release's block decoding (the tests "
                                  "re-implement it)")
