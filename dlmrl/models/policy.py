"""The masked-diffusion policy: one interface over a denoiser that predicts every masked position.

A policy maps a partially masked sequence ``[prompt | canvas]`` to logits at every position.
Prompts are left-padded; ``attention_mask`` marks real tokens, and position ids are counted over
real tokens only, so a prompt's output does not depend on how much padding its batch needs.
Family adapters (``dlmrl.models.families``) hide how each checkpoint family computes logits
(e.g. Dream's one-position shift).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

LogitsFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens: ``(B, T)`` bool → ``(B, T)`` long, padding clamped to 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class MaskedDiffusionPolicy:
    """A masked (absorbing-state) diffusion LM as a policy.

    Attributes:
        model: the underlying ``transformers`` model (a ``torch.nn.Module``).
        tokenizer: its tokenizer (a ``PreTrainedTokenizerBase``), or ``None``.
        mask_token_id: id of the absorbing mask token ``M``.
        family: name of the family adapter (``tiny``, ``masked_lm``, ...).
        logits_fn: ``(model, input_ids, attention_mask, position_ids) -> logits`` for the family.
        eos_token_id / pad_token_id: special ids (``None`` when the tokenizer has none).
    """

    model: nn.Module
    tokenizer: Any
    mask_token_id: int
    family: str
    logits_fn: LogitsFn
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for a batch.

        Args:
            input_ids: ``(B, T)`` long, left-padded prompt followed by the canvas.
            attention_mask: ``(B, T)`` bool or 0/1, True on real tokens; ``None`` means all real.
        Returns:
            ``(B, T, V)`` logits, float32 (float64 when the model runs in float64, as the variance lab's
            finite differences need); position ``i`` predicts token ``i`` (shifts already undone).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        attention_mask = attention_mask.bool()
        position_ids = position_ids_from_mask(attention_mask)
        logits = self.logits_fn(self.model, input_ids, attention_mask, position_ids)
        return logits if logits.dtype == torch.float64 else logits.float()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameters(self):
        return self.model.parameters()


def canvas_logits(
    policy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    canvas: torch.Tensor,
    clean: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits at the canvas positions of ``[prompt | canvas]``.

    A policy with its own ``completion_logits(prompt_ids, prompt_mask, canvas, clean)`` computes them itself (the
    block-diffusion policy, :class:`~dlmrl.models.block_policy.BlockDiffusionPolicy`, whose noised blocks are
    scored next to the ``clean`` completion); any other policy is called on the concatenation and ``clean`` is not
    read (a bidirectional denoiser sees the whole noised canvas).

    Args:
        policy: callable ``(input_ids (B, T) long, attention_mask (B, T) bool) -> (B, T, V)``.
        prompt_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)`` bool, True on real prompt tokens.
        canvas: ``(B, L)`` long, the (partially masked) completion.
        clean: optional ``(B, L)`` long, the completion the canvas was noised from (scoring passes it).
    Returns:
        ``(B, L, V)`` float32.
    """
    own = getattr(policy, "completion_logits", None)
    if own is not None:
        return own(prompt_ids, prompt_mask, canvas, clean)
    input_ids = torch.cat([prompt_ids, canvas], dim=1)
    attention_mask = torch.cat([prompt_mask.bool(), torch.ones_like(canvas, dtype=torch.bool)], dim=1)
    return policy(input_ids, attention_mask)[:, prompt_ids.shape[1] :]
