"""Block caching for the diffusion sampler: the keys and values outside the current block, computed once per block.

Semi-autoregressive decoding runs several forward passes per block, and every pass recomputes the keys and
values of the whole ``[prompt | canvas]`` although only the current block changes. Fast-dLLM (Wu et al., arXiv
2505.22618, §3.2, and NVlabs/Fast-dLLM ``llada/generate.py``: ``generate_with_prefix_cache``,
``generate_with_dual_cache``) runs the block's first pass over the whole sequence, keeps the keys and values it
computed, and feeds the block's later passes only what changes:

- ``prefix``: the cache holds the positions before the block (prompt and decoded blocks); a later pass feeds the
  block and everything after it.
- ``dual``: the cache also holds the positions after the block; a later pass feeds the block alone.

**An approximation.** The model is bidirectional: the hidden states of the cached positions depend on the block's
tokens, which change at every step, so the cached keys and values are those of the block as it was at its first
pass (stale by the tokens revealed since). The logits of a cached pass therefore differ from a full pass over the
same canvas; the sampler records the log-probs it actually used, and the trainer measures the gap to exact scores
(``rollout_logp_gap_*``) and can correct it (``train.rollout_is_cap``). On the *same* canvas as the cache was built
from, a cached pass equals a full one to float tolerance (tested), which is what makes the approximation only
staleness. Fast-dLLM reports the accuracy cost on GSM8K as small (79.3 → 78.5 at length 256 with threshold
decoding); ``benchmarks/sampler_speed.py`` measures it on Sudoku.

A family opts in with :attr:`dlmrl.models.families.Family.cached_logits`, a :data:`CachedLogitsFn`;
:func:`hf_cached_logits` serves ``transformers`` models whose ``forward`` takes a ``Cache`` and explicit
``position_ids`` with keys stored after the rotary embedding (Llama, Qwen2, Mistral-style classes with
``is_causal = False``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from dlmrl.models.policy import position_ids_from_mask

#: ``sampling.cache`` values
CACHE_MODES = ("none", "prefix", "dual")

#: per layer, ``(keys, values)`` each ``(B, H, S, D)``
KeyValues = list[tuple[torch.Tensor, torch.Tensor]]

#: ``(model, input_ids (B, T) long, attention_mask (B, S + T) bool, position_ids (B, T) long, past KeyValues | None)
#: -> (logits (B, T, V), KeyValues of the S + T positions, past first)``: a forward pass over ``input_ids``
#: whose keys also include ``past`` (in any order: attention is bidirectional, each key carries its own rotary
#: position), ``attention_mask`` covering the past positions then the new ones.
CachedLogitsFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, "KeyValues | None"],
                          "tuple[torch.Tensor, KeyValues]"]


def _cache_keyword(model: torch.nn.Module) -> str:
    """The name ``model.forward`` takes its cache under: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    base = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model  # (DDP: *args)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base  # (a peft wrapper passes kwargs on)
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_cached_logits(model, input_ids, attention_mask, position_ids, past):
    """:data:`CachedLogitsFn` for ``transformers`` decoder classes run bidirectionally (``config.is_causal =
    False``): ``past`` goes in as a ``DynamicCache``; the returned key/values are the cache's layers after the pass.

    Raises:
        TypeError: if the model returns no cache (its ``forward`` does not take one).
    """
    from transformers import DynamicCache

    kwargs = {}
    if past is not None:
        kwargs[_cache_keyword(model)] = DynamicCache(ddp_cache_data=past)
    out = model(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids,
                use_cache=True, **kwargs)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "layers"):
        raise TypeError(f"{type(model).__name__}.forward returned no key/value cache; its family cannot use "
                        "sampling.cache")
    return out.logits, [(layer.keys, layer.values) for layer in cache.layers]


class BlockCache:
    """The sampler's forward passes for one block, with a ``prefix`` or ``dual`` cache (:data:`CACHE_MODES`).

    :meth:`start_block` forgets the cache; the next :meth:`logits` call runs a full pass over ``[prompt | canvas]``
    of its rows and keeps the keys and values outside the block (``dual``) or before it (``prefix``); later calls
    in the block feed only the block (``dual``) or the block and what follows (``prefix``) for the rows asked for,
    which must be among those of the block's first pass (threshold decoding drops rows, never adds them).

    Args:
        policy: a :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` (its ``model``, ``logits_fn`` is not used).
        cached_logits: the family's :data:`CachedLogitsFn`.
        prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool.
        mode: ``"prefix"`` or ``"dual"``.
    Raises:
        ValueError: on a mode outside ``prefix`` / ``dual``.
    """

    def __init__(self, policy, cached_logits: CachedLogitsFn, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 mode: str):
        if mode not in ("prefix", "dual"):
            raise ValueError(f"BlockCache mode must be 'prefix' or 'dual', got {mode!r}")
        self.policy, self.fn, self.mode = policy, cached_logits, mode
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask.bool()
        self.past: KeyValues | None = None
        self.rows: torch.Tensor | None = None  # (n0,) the batch rows of the block's first pass
        self.subset: tuple[torch.Tensor, KeyValues] | None = None  # (rows, their keys/values): the last row subset
        self.keep: torch.Tensor | None = None  # the sequence positions whose keys/values the cache holds
        self.lo = self.hi = 0
        self.full_passes = 0  # passes over the whole sequence (one per block with a masked row)
        self.cached_passes = 0  # passes over the block (dual) or block + suffix (prefix)

    def start_block(self, lo: int, hi: int) -> None:
        """Forget the cache: the next pass is a full one. ``[lo, hi)``: the block's canvas positions."""
        self.past, self.rows, self.subset, self.lo, self.hi = None, None, None, lo, hi

    def logits(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The block's logits ``(n, Lb, V)`` float32 (float64 for a float64 model) for ``rows`` of ``x``.

        Args:
            x: ``(B, L)`` long, the whole batch's canvas.
            rows: ``(n,)`` long increasing batch indices, or ``None`` for every row.
        """
        rows = torch.arange(x.shape[0], device=x.device) if rows is None else rows
        P, (lo, hi) = self.prompt_ids.shape[1], (self.lo, self.hi)
        ids = torch.cat([self.prompt_ids[rows], x[rows]], dim=1)  # (n, P + L)
        mask = torch.cat([self.prompt_mask[rows], torch.ones_like(x[rows], dtype=torch.bool)], dim=1)  # (n, P + L)
        positions = position_ids_from_mask(mask)  # (n, P + L), as the uncached policy counts them
        model = self.policy.model
        if self.past is None:
            out, kv = self.fn(model, ids, mask, positions, None)
            self.full_passes += 1
            keep = torch.cat([torch.arange(P + lo), torch.arange(P + hi, ids.shape[1])] if self.mode == "dual"
                             else [torch.arange(P + lo)]).to(ids.device)  # the cached positions
            self.past = [(k[:, :, keep], v[:, :, keep]) for k, v in kv]
            self.keep, self.rows = keep, rows
            return self._float(out[:, P + lo : P + hi])
        where = torch.searchsorted(self.rows, rows)  # (n,) the rows' slots in the cache
        if not bool((self.rows[where.clamp(max=len(self.rows) - 1)] == rows).all()):
            raise ValueError("BlockCache.logits: rows outside the block's first pass")
        if len(rows) == len(self.rows):
            past = self.past
        elif self.subset is not None and torch.equal(self.subset[0], rows):
            past = self.subset[1]  # (threshold decoding asks for the same rows step after step)
        else:  # (rows that finished their block have left: select the others' keys and values once)
            past = [(k[where], v[where]) for k, v in self.past]
            self.subset = (rows, past)
        fresh = slice(P + lo, P + hi) if self.mode == "dual" else slice(P + lo, ids.shape[1])
        out, _ = self.fn(model, ids[:, fresh], torch.cat([mask[:, self.keep], mask[:, fresh]], dim=1),
                         positions[:, fresh], past)
        self.cached_passes += 1
        return self._float(out[:, : hi - lo])

    @staticmethod
    def _float(logits: torch.Tensor) -> torch.Tensor:
        return logits if logits.dtype == torch.float64 else logits.float()


__all__ = ["CACHE_MODES", "BlockCache", "CachedLogitsFn", "KeyValues", "hf_cached_logits"]
