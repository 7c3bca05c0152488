"""Scoring a policy on a :class:`MaskPlan`: per-token ELBO contributions and their sum."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.models.policy import canvas_logits

Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Estimate:
    """A likelihood estimate for a batch of completions.

    Attributes:
        sequence: ``(B,)`` float32 ELBO estimate per sequence, nats.
        per_token: ``(B, L)`` float32 contributions ``c^i`` (nats), zero outside the completion
            mask; ``per_token.sum(-1) == sequence``.
        nfe: denoiser forward passes per sequence.

    Reference: SPEC §1 per-token contributions (dlmrl interpretation); GDPO arXiv 2510.08554 §4.
    """

    sequence: torch.Tensor
    per_token: torch.Tensor
    nfe: int


def check_plan(plan: MaskPlan, completion: torch.Tensor, completion_mask: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``plan`` fits ``completion (B, L)`` and masks only allowed positions."""
    if tuple(plan.masks.shape[1:]) != tuple(completion.shape):
        raise ValueError(
            f"plan masks (S, B, L) = {tuple(plan.masks.shape)} do not match completion (B, L) = "
            f"{tuple(completion.shape)}"
        )
    if tuple(completion_mask.shape) != tuple(completion.shape):
        raise ValueError(
            f"completion_mask shape {tuple(completion_mask.shape)} != completion shape "
            f"{tuple(completion.shape)}"
        )
    outside = plan.masks.to(completion_mask.device) & ~completion_mask.bool()[None]
    if outside.any():
        s, b, i = outside.nonzero()[0].tolist()
        raise ValueError(
            f"plan masks position {i} of row {b} in sample {s}, outside completion_mask "
            "(given cells and padding are context and are never masked)"
        )


def score(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    plan: MaskPlan,
    samples_per_forward: int = 1,
) -> Estimate:
    """Score ``completion`` under ``policy`` on the masks of ``plan``.

    For each sample ``s`` the masked positions of the canvas are replaced by
    ``policy.mask_token_id`` and the policy is run once;
    ``per_token[b, i] = Σ_s weights[s, b] · masks[s, b, i] · log p_θ(y^i | y_{m_s}, q)`` and
    ``sequence = per_token.sum(-1)``. Differentiable: call it under ``torch.no_grad()`` for the
    old and reference policies, with grad for the current one.

    Args:
        policy: callable ``(input_ids (B, T), attention_mask (B, T)) -> (B, T, V)`` logits with a
            ``mask_token_id`` attribute.
        prompt_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)`` bool.
        completion: ``(B, L)`` long, the sampled canvas tokens.
        completion_mask: ``(B, L)`` bool, positions that are scored and may be masked.
        plan: the :class:`MaskPlan` (``S`` samples).
        samples_per_forward: how many samples to stack into one forward call (``S·B`` rows at
            most); the result does not depend on it, only speed and memory do.
    Returns:
        :class:`Estimate` with ``sequence (B,)``, ``per_token (B, L)`` float32 and ``nfe = S``.
    Raises:
        ValueError: if the plan does not fit, or masks a position outside ``completion_mask``.

    Reference: GDPO arXiv 2510.08554 §2–§4; LLaDA arXiv 2502.09992 (likelihood evaluation).
    """
    if samples_per_forward < 1:
        raise ValueError(f"samples_per_forward must be >= 1, got {samples_per_forward}")
    check_plan(plan, completion, completion_mask)
    device = completion.device
    plan = plan.to(device)
    num_samples = plan.num_samples
    batch, length = completion.shape
    mask_id = policy.mask_token_id
    per_token = torch.zeros(batch, length, dtype=torch.float32, device=device)  # (B, L)
    for start in range(0, num_samples, samples_per_forward):
        masks = plan.masks[start : start + samples_per_forward]  # (s, B, L)
        weights = plan.weights[start : start + samples_per_forward].float()  # (s, B)
        n = masks.shape[0]
        canvas = torch.where(masks, torch.full_like(completion, mask_id)[None], completion[None])
        logits = canvas_logits(
            policy,
            prompt_ids.repeat(n, 1),
            prompt_mask.repeat(n, 1),
            canvas.reshape(n * batch, length),
        )  # (s·B, L, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        logp = logp.gather(-1, completion.repeat(n, 1)[..., None])[..., 0].reshape(n, batch, length)
        terms = torch.where(masks, logp, torch.zeros_like(logp)) * weights[..., None]  # (s, B, L)
        per_token = per_token + terms.sum(0)
    return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=num_samples)


class PlanEstimator:
    """Base for estimators that draw a :class:`MaskPlan` and score it with :func:`score`.

    Subclasses implement ``make_plan(completion_mask (B, L) bool, generator) -> MaskPlan``.
    """

    name: str = ""

    def make_plan(self, completion_mask: torch.Tensor, generator: torch.Generator | None = None) -> MaskPlan:
        raise NotImplementedError

    def estimate(
        self,
        policy: Policy,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion: torch.Tensor,
        completion_mask: torch.Tensor,
        generator: torch.Generator | None = None,
        samples_per_forward: int = 1,
    ) -> Estimate:
        """Draw a fresh plan and score it (shapes as in :func:`score`)."""
        plan = self.make_plan(completion_mask, generator)
        return score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, samples_per_forward)
