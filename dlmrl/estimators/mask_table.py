"""The score ``S(m)`` of every mask of a row: the table behind exact ELBOs and exact estimator moments."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dlmrl.estimators.exact import DEFAULT_MAX_LENGTH, _check_lengths, enumeration_masks
from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.moments import SizeStats
from dlmrl.estimators.scoring import Policy, sample_scores


@dataclass
class MaskTable:
    """``S(m)`` for all ``2^n`` masks of one row's ``n`` maskable positions.

    Attributes:
        positions: ``(n,)`` long canvas positions; bit ``j`` of a mask's code is ``positions[j]``.
        values: ``(2^n,)`` float64 ``S(m)`` (nats) indexed by code; ``values[0] = 0`` (empty mask).
        length: canvas length ``L`` of the row.
    """

    positions: torch.Tensor
    values: np.ndarray
    length: int

    @property
    def n(self) -> int:
        return int(self.positions.numel())

    def stats(self) -> SizeStats:
        return SizeStats.from_table(self.values)

    @property
    def elbo(self) -> float:
        """The exact ELBO ``Σ_{m≠∅} S(m) / (|m|·C(n, |m|))``."""
        return self.stats().elbo

    def codes(self, masks: torch.Tensor) -> np.ndarray:
        """Codes of masks ``(..., L)`` bool over this row's positions (masks must stay inside them)."""
        bits = masks[..., self.positions.to(masks.device)].long().cpu()  # (..., n)
        return (bits << torch.arange(self.n)).sum(-1).numpy()

    def lookup(self, plan: MaskPlan, row: int) -> float:
        """The estimate a plan gives for this row, ``Σ_s weights[s, row] · S(masks[s, row])``, without
        running the model (the plan must not mask the prompt)."""
        if plan.prompt_masks is not None:
            raise ValueError("a mask table covers completion masks only; this plan also masks the prompt")
        if plan.weights.dim() != 2:
            raise ValueError("a mask table looks up whole-mask scores; this plan weighs each position on its own")
        codes = self.codes(plan.masks[:, row])  # (S,)
        return float(plan.weights[:, row].double().cpu().numpy() @ self.values[codes])

    def combine(self, other: MaskTable, scale: float = 1.0) -> MaskTable:
        """``(other − self) · scale`` as a table (e.g. an ELBO difference or a finite difference)."""
        return MaskTable(self.positions, (other.values - self.values) * scale, self.length)


def mask_table(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    max_length: int = DEFAULT_MAX_LENGTH,
    micro_batch: int | None = 1024,
) -> MaskTable:
    """Evaluate ``S(m)`` on all ``2^n − 1`` non-empty masks of one row.

    Args:
        policy: callable ``(input_ids (1, T), attention_mask (1, T)) -> (1, T, V)`` with ``mask_token_id``.
        prompt_ids: ``(P,)`` or ``(1, P)`` long; prompt_mask the same shape, bool.
        completion: ``(L,)`` or ``(1, L)`` long; completion_mask the same shape, bool (the ``n`` maskable positions).
        max_length: refuse ``n > max_length`` (default 16: 65535 forward passes).
        micro_batch: canvases per forward call.
    Returns:
        :class:`MaskTable` (values in float64; as exact as the policy's dtype).
    Raises:
        ValueError: if ``n > max_length``.

    Reference: the exact ELBO of LLaDA arXiv 2502.09992 (likelihood evaluation).
    """
    p_ids, p_mask, comp, c_mask = (x.reshape(1, -1) for x in (prompt_ids, prompt_mask, completion, completion_mask))
    allowed = c_mask[0].bool()
    positions = allowed.nonzero()[:, 0].cpu()
    n = positions.numel()
    _check_lengths([n], max_length)
    values = np.zeros(2**n)
    if n:
        subsets, _ = enumeration_masks(n)  # (2^n − 1, n), codes 1..2^n − 1
        masks = torch.zeros(subsets.shape[0], 1, comp.shape[1], dtype=torch.bool)
        masks[:, 0, positions] = subsets
        ones = torch.ones(subsets.shape[0], 1)
        plan = MaskPlan(masks=masks, weights=ones, t=torch.full((subsets.shape[0],), float("nan"), dtype=torch.float64))
        with torch.no_grad():
            scores = sample_scores(policy, p_ids, p_mask, comp, c_mask, plan.to(comp.device), micro_batch)
        values[1:] = scores[:, 0].double().cpu().numpy()
    return MaskTable(positions=positions, values=values, length=comp.shape[1])
