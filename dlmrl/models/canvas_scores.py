"""The chosen tokens' log-probs at a canvas's scored positions, for any diffusion policy: from the final hidden
states in chunks where the policy's family names its output head (:mod:`dlmrl.models.token_scores`), else from
the full logits (:func:`~dlmrl.models.policy.canvas_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dlmrl.models.families import FAMILIES
from dlmrl.models.policy import canvas_logits
from dlmrl.models.token_scores import (
    STAT_ENTROPY,
    STAT_LOGP,
    HeadRequest,
    tap_head,
    token_logprobs_from_logits,
    unwrap_model,
)


@dataclass(frozen=True)
class HeadSplit:
    """Where a policy's model can be cut before its output head.

    Attributes:
        model: the ``transformers`` model whose forward calls the head (:func:`~dlmrl.models.token_scores.unwrap_model`).
        head: its output head. shift: the family's ``logit_shift`` (Dream: 1).
    """

    model: nn.Module
    head: nn.Module
    shift: int = 0


def head_split(policy) -> HeadSplit | None:
    """The :class:`HeadSplit` of a diffusion policy (a ``MaskedDiffusionPolicy``, a block-diffusion one, an
    ``AdapterDisabledPolicy`` around either), from its family's ``output_head``; ``None`` for a family without one
    (``masked_lm``), an unregistered family, a policy without a ``model``, or a model the family's function declines
    (LLaDA with tied or scaled logits)."""
    family = getattr(policy, "family", None)
    model = getattr(policy, "model", None)
    if not isinstance(model, nn.Module) or family not in FAMILIES:
        return None
    fam = FAMILIES.get(family)
    head = fam.output_head(model) if fam.output_head is not None else None
    if head is None:
        return None
    return HeadSplit(unwrap_model(model), head, fam.logit_shift)


def describe_head_split(family: str | None) -> str:
    """One line for ``--dry-run``: how scoring takes token log-probs for ``family`` (``None``: detected at load)."""
    if family is None or family not in FAMILIES:
        return "from the output head in chunks where the detected family names its head, else from full logits"
    fam = FAMILIES.get(family)
    if fam.output_head is None:
        return f"from full logits: family {family!r} names no output head to score in chunks"
    return f"from family {family!r}'s output head"


def canvas_token_logprobs(
    policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    canvas: torch.Tensor,
    target: torch.Tensor,
    scored: torch.Tensor,
    clean: torch.Tensor | None = None,
    temperature: float | None = None,
    exclude_token: int | None = None,
    entropy: bool = False,
    logits_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(target_i)`` at the canvas positions ``scored`` (0 elsewhere), under the policy's denoiser.

    With ``logits_chunk`` and a family that names its head (:func:`head_split`), the model's head is tapped
    (:func:`~dlmrl.models.token_scores.tap_head`): only the scored positions' hidden states go through it,
    ``logits_chunk`` positions at a time (recomputed in the backward). Otherwise the full logits are taken
    (:func:`~dlmrl.models.policy.canvas_logits`, ``(n, L, V)`` float32). Both give the same values up to float
    rounding.

    Args:
        policy: a diffusion policy (see :func:`~dlmrl.models.policy.canvas_logits`).
        prompt_ids: ``(n, P)`` long, left-padded; prompt_mask: ``(n, P)`` bool.
        canvas: ``(n, L)`` long, the masked canvas. target: ``(n, L)`` long, the tokens scored.
        scored: ``(n, L)`` bool. clean: ``(n, L)`` long, the clean completion (the block policy's composite pass).
        temperature: the sampler's temperature ``T`` (``log_softmax(logits / T)``), ``None`` for the denoiser's own.
        exclude_token: a token at ``−inf`` (the sampler's mask exclusion).
        entropy: also return the detached entropies.
        logits_chunk: positions per head call, ``None`` or 0 = full logits.
    Returns:
        ``logp (n, L)`` and ``entropy (n, L)`` or ``None``, float32 (float64 for a float64 model), 0 off ``scored``.
    """
    split = head_split(policy) if logits_chunk else None
    length, p = canvas.shape[1], prompt_ids.shape[1]
    if clean is None and getattr(policy, "clean_context", "block") == "causal":
        clean = canvas  # (its uncached pass is the composite one with the canvas as its clean half)
    composite = clean is not None and getattr(policy, "completion_logits", None) is not None
    if split is not None and split.shift:
        # (Dream: the output at i − 1 scores token i; a row's first real position keeps its own output, which would
        # then have to score two tokens: only a row without a real prompt token puts a scored position there)
        first_scored = scored[:, 0] & ~prompt_mask.bool().any(-1)
        if bool(first_scored.any()):
            split = None
    if split is None:
        logits = canvas_logits(policy, prompt_ids, prompt_mask, canvas, clean=clean)  # (n, L, V)
        logp, ent = token_logprobs_from_logits(logits, target, temperature, exclude_token, entropy)
        logp = torch.where(scored, logp, torch.zeros_like(logp))
        return logp, (torch.where(scored, ent, torch.zeros_like(ent)) if ent is not None else None)
    total = p + 2 * length if composite else p + length  # (the policy's input: [prompt | noisy | clean] or [prompt | canvas])
    raw_target = target.new_zeros(target.shape[0], total)
    raw_scored = scored.new_zeros(scored.shape[0], total)
    raw_target[:, p:p + length], raw_scored[:, p:p + length] = target, scored
    if split.shift and composite and getattr(policy, "logit_shift", 0):
        # (a shifted block policy's composite pass: position i is scored by the output at shifted_sources, the clean
        # copy of the previous block's last position for a block's first token)
        from dlmrl.models.block_attention import shifted_sources

        src = shifted_sources(prompt_mask, length, policy.block_size, composite=True)  # (n, L), distinct per row
        raw_target = raw_target.new_zeros(raw_target.shape).scatter_(1, src, target)
        raw_scored = raw_scored.new_zeros(raw_scored.shape).scatter_(1, src, scored)
    elif composite and getattr(policy, "clean_context", "block") == "causal":
        # (a causal-context block policy's composite pass: a block's first token is scored by the output before it on
        # the clean context, the others by their own noisy output: causal_sources)
        from dlmrl.models.block_attention import causal_sources

        src = causal_sources(prompt_mask, length, policy.block_size)  # (n, L), distinct per row
        raw_target = raw_target.new_zeros(raw_target.shape).scatter_(1, src, target)
        raw_scored = raw_scored.new_zeros(raw_scored.shape).scatter_(1, src, scored)
    elif split.shift:  # (the output at t scores the token at t + shift)
        raw_target = torch.cat([raw_target[:, split.shift:], raw_target.new_zeros(len(raw_target), split.shift)], 1)
        raw_scored = torch.cat([raw_scored[:, split.shift:], raw_scored.new_zeros(len(raw_scored), split.shift)], 1)
    request = HeadRequest(raw_target, raw_scored, logits_chunk, temperature, exclude_token, entropy)
    with tap_head(split.model, split.head, request):
        stats = canvas_logits(policy, prompt_ids, prompt_mask, canvas, clean=clean)  # (n, L, 2)
    return stats[..., STAT_LOGP], (stats[..., STAT_ENTROPY].detach() if entropy else None)


__all__ = ["HeadSplit", "canvas_token_logprobs", "describe_head_split", "head_split"]
