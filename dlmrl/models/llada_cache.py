"""A prefix and a dual block cache for LLaDA's released checkpoint code (``modeling_llada.py``), run on its own blocks.

LLaDA's released ``LLaDAModel.forward`` refuses a key/value cache (``assert (past_key_values is None and not
use_cache), "The kvcache is not suppotred for MDM."``), although its blocks keep OLMo's cache path:
``LLaDALlamaBlock.forward(x, attention_bias, layer_past, use_cache)`` puts the cached keys in front of the new ones
(cached before the rotary embedding) and rotates the concatenation by index, the queries taking its last positions.
That layout fits a prefix cache but not Fast-dLLM's dual cache, whose block sits between cached positions
(Fast-dLLM ships a modified copy of the file, with ``replace_position``, for it: NVlabs/Fast-dLLM
``llada/model/modeling_llada.py``).

:func:`llada_cached_logits` (a :data:`dlmrl.models.block_cache.CachedLogitsFn`, so
:class:`~dlmrl.models.block_cache.BlockCache` runs both modes on it) calls the checkpoint's own blocks, with two
substitutions for the length of the call (ours):

- **rotary**: each block's ``rotary_emb`` is replaced by :class:`_ExplicitRotary`, which rotates the queries and
  the new keys at their explicit positions with the code's own ``get_rotary_embedding`` tables and
  ``apply_rotary_pos_emb`` (in float32 under ``rope_full_precision``, as the code's ``RotaryEmbedding.forward``),
  and leaves the cached keys, which it stored already rotated, as they are;
- **padding**: with left padding, the block's ``_scaled_dot_product_attention`` receives a key padding mask. The
  released code passes ``attn_mask=None``, so a padded row attends its padding; dlmrl's uncached
  :func:`~dlmrl.models.llada.llada_logits` runs each row without its padding, and the mask gives those logits in
  one batched pass (RoPE scores depend on relative positions only). Unpadded calls keep the code's own attention
  call (its flash-attention path included).

The embedding and the head are ``LLaDAModel.forward``'s: ``wte`` (times ``sqrt(d_model)`` under
``input_emb_norm``), ``emb_drop``, the blocks, ``ln_f``, then ``ff_out`` or, under ``weight_tying``, ``wte``'s
matrix, scaled by ``1 / sqrt(d_model)`` under ``scale_logits``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from dlmrl.models.token_scores import unwrap_model


class _ExplicitRotary(nn.Module):
    """A block's ``rotary_emb`` for one call: ``forward(q, k)`` with ``q (n, H, T, D)`` and ``k (n, Hkv, K, D)`` (the
    cached keys, already rotated, then the ``T`` new ones) rotates ``q`` and the new keys at ``positions (n, T)``;
    :attr:`keys` keeps the rotated ``k`` (what the cache stores)."""

    def __init__(self, rotary: nn.Module, positions: torch.Tensor, full_precision: bool):
        super().__init__()
        self.tables = rotary.get_rotary_embedding  # (the code's own: sin/cos of positions 0 .. seq_len - 1)
        self.apply = rotary.apply_rotary_pos_emb
        self.positions, self.full_precision = positions, full_precision
        self.keys: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_, k_ = (q.float(), k.float()) if self.full_precision else (q, k)
        new = q_.shape[-2]
        pos_sin, pos_cos = self.tables(int(self.positions.max()) + 1, q_.device)  # (1, 1, S, D)
        sin = pos_sin[0, 0][self.positions].unsqueeze(1).type_as(q_)  # (n, 1, T, D)
        cos = pos_cos[0, 0][self.positions].unsqueeze(1).type_as(q_)
        q_ = self.apply(sin, cos, q_)
        k_ = torch.cat([k_[:, :, : k_.shape[-2] - new], self.apply(sin, cos, k_[:, :, k_.shape[-2] - new :])], dim=-2)
        self.keys = k_.type_as(k)
        return q_.type_as(q), self.keys


@contextlib.contextmanager
def _substituted(block: nn.Module, rotary: _ExplicitRotary, key_mask: torch.Tensor | None):
    """``block`` with ``rotary`` as its ``rotary_emb`` and, when ``key_mask`` ``(n, 1, 1, K)`` bool is given, its
    ``_scaled_dot_product_attention`` called with that mask; restored on exit."""
    original = block._modules["rotary_emb"]
    block._modules["rotary_emb"] = rotary
    if key_mask is not None:
        sdpa = block._scaled_dot_product_attention

        def masked(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
            return sdpa(q, k, v, attn_mask=key_mask, dropout_p=dropout_p, is_causal=is_causal)

        block._scaled_dot_product_attention = masked  # (an instance attribute: shadows the method)
    try:
        yield
    finally:
        block._modules["rotary_emb"] = original
        block.__dict__.pop("_scaled_dot_product_attention", None)


def _llada_model(model: nn.Module) -> nn.Module:
    """The ``LLaDAModel`` inside ``model`` (``LLaDAModelLM.model``; DDP and peft wrappers unwrapped).

    Raises:
        TypeError: ``model`` has no LLaDA layout (``model.transformer.blocks``), or a block without the released
            code's cache path (``rotary_emb``, ``_scaled_dot_product_attention``).
        ValueError: a configuration the cache does not cover (ALiBi, no RoPE, block groups).
    """
    inner = getattr(unwrap_model(model), "model", None)
    blocks = getattr(getattr(inner, "transformer", None), "blocks", None)
    if blocks is None or not all(hasattr(b, "rotary_emb") and hasattr(b, "_scaled_dot_product_attention")
                                 for b in blocks):
        raise TypeError(f"{type(model).__name__} has no LLaDA block layout (model.transformer.blocks with rotary_emb "
                        "and _scaled_dot_product_attention): dlmrl's LLaDA cache runs modeling_llada.py's blocks")
    cfg = inner.config
    if getattr(cfg, "alibi", False) or not getattr(cfg, "rope", True) or getattr(cfg, "block_group_size", 1) != 1:
        raise ValueError("dlmrl's LLaDA cache covers RoPE checkpoints without ALiBi or block groups (config alibi "
                         f"{getattr(cfg, 'alibi', None)}, rope {getattr(cfg, 'rope', None)}, block_group_size "
                         f"{getattr(cfg, 'block_group_size', None)}); set sampling.cache=none")
    return inner


def llada_cached_logits(model, input_ids, attention_mask, position_ids, past):
    """:data:`~dlmrl.models.block_cache.CachedLogitsFn` for LLaDA's released code (module docstring).

    Args:
        model: an ``LLaDAModelLM`` (or a peft/DDP wrapper of one).
        input_ids: ``(n, T)`` long, the tokens fed (the whole sequence on a block's first pass, else the block, or
            the block and what follows it). attention_mask: ``(n, K)`` bool/long over the cached positions then the
            fed ones (``K = K_past + T``), 0 on left padding. position_ids: ``(n, T)`` long, the fed tokens'
            positions. past: ``None`` or, per block, ``(keys, values)`` ``(n, Hkv, K_past, D)`` (keys rotated).
    Returns:
        ``(logits (n, T, V), [(keys, values) (n, Hkv, K, D)] per block)``.
    Raises:
        TypeError, ValueError: see :func:`_llada_model`.
    """
    inner = _llada_model(model)
    cfg, t = inner.config, inner.transformer
    x = t.wte(input_ids)  # (n, T, d)
    if getattr(cfg, "input_emb_norm", False):
        x = x * (cfg.d_model ** 0.5)
    x = t.emb_drop(x)
    keys = attention_mask.bool()
    key_mask = None if bool(keys.all()) else keys[:, None, None, :]  # (n, 1, 1, K)
    full_precision = getattr(cfg, "rope_full_precision", True)
    kv = []
    for i, block in enumerate(t.blocks):
        rotary = _ExplicitRotary(block.rotary_emb, position_ids, full_precision)
        with _substituted(block, rotary, key_mask):
            x, cache = block(x, attention_bias=None, layer_past=None if past is None else past[i], use_cache=True)
        kv.append((rotary.keys, cache[1]))
    x = t.ln_f(x)
    logits = F.linear(x, t.wte.weight) if getattr(cfg, "weight_tying", False) else t.ff_out(x)
    if getattr(cfg, "scale_logits", False):
        logits = logits * (1 / math.sqrt(cfg.d_model))
    return logits, kv


def check_llada_cache(model: nn.Module) -> None:
    """Raise unless :func:`llada_cached_logits` can serve ``model`` (run when the model loads, before any pass).

    Raises:
        TypeError, ValueError: see :func:`_llada_model`.
    """
    _llada_model(model)


llada_cached_logits.check = check_llada_cache  # (read by dlmrl.kinds.families.check_cache_family)

__all__ = ["check_llada_cache", "llada_cached_logits"]
