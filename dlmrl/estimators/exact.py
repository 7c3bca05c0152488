"""Exact ELBO by enumerating every non-empty mask: the ground truth for short canvases (L_b ≤ 16)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.scoring import Estimate, PlanEstimator, Policy, score
from dlmrl.estimators.validation import check_positive_int

DEFAULT_MAX_LENGTH = 16


def _check_lengths(lengths: list[int], max_length: int) -> None:
    for b, n in enumerate(lengths):
        if n > max_length:
            raise ValueError(
                f"exact enumeration needs 2^L_b - 1 forward passes; row {b} has L_b = {n} scored "
                f"positions > max_length = {max_length}. Use 'sdmc' or 'double_mc' for long canvases."
            )


def enumeration_masks(num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All non-empty subsets of ``n`` positions and their discrete-ELBO weights.

    Args:
        num_positions: ``n >= 1``.
    Returns:
        ``(subsets (2^n − 1, n) bool, weights (2^n − 1,) float64)`` with weight
        ``1 / (k · C(n, k))`` for a subset of size ``k``.

    Reference: LLaDA arXiv 2502.09992 (likelihood evaluation, discrete form).
    """
    n = num_positions
    codes = torch.arange(1, 2**n, dtype=torch.long)  # (S,)
    subsets = ((codes[:, None] >> torch.arange(n)) & 1).bool()  # (S, n)
    sizes = subsets.sum(-1).tolist()
    weights = torch.tensor([1.0 / (k * math.comb(n, k)) for k in sizes], dtype=torch.float64)  # (S,)
    return subsets, weights


def _row_plan(allowed: torch.Tensor, batch: int) -> MaskPlan:
    """Enumeration plan for ``batch`` rows sharing the allowed positions ``allowed (L,) bool``."""
    positions = allowed.nonzero()[:, 0].cpu()  # (n,)
    length = allowed.shape[0]
    subsets, w = enumeration_masks(positions.numel())  # (S, n), (S,)
    masks = torch.zeros(subsets.shape[0], length, dtype=torch.bool)  # (S, L)
    masks[:, positions] = subsets
    masks = masks[:, None, :].expand(-1, batch, -1).to(allowed.device)  # (S, B, L)
    weights = w.float()[:, None].expand(-1, batch).to(allowed.device)  # (S, B)
    t = torch.full((subsets.shape[0],), float("nan"), dtype=torch.float64)
    return MaskPlan(masks=masks, weights=weights, t=t)


def exact_elbo(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    max_length: int = DEFAULT_MAX_LENGTH,
    batch_size: int = 256,
) -> Estimate:
    """Exact ELBO ``Σ_{m ≠ ∅} S(m) / (|m| · C(L_b, |m|))`` per row, by enumeration.

    Rows may have different allowed positions (e.g. infilling blanks); each row enumerates the
    ``2^{L_b} − 1`` non-empty subsets of its own allowed positions. Rows with ``L_b = 0`` give 0.

    Args:
        policy: callable ``(input_ids (B, T), attention_mask (B, T)) -> (B, T, V)`` with ``mask_token_id``.
        prompt_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)`` bool.
        completion: ``(B, L)`` long.
        completion_mask: ``(B, L)`` bool, positions that are scored and may be masked.
        max_length: refuse rows with more than this many allowed positions (default 16).
        batch_size: masked canvases per forward call.
    Returns:
        :class:`Estimate` with ``sequence (B,)`` and ``per_token (B, L)`` float32 (nats) and
        ``nfe = max_b (2^{L_b} − 1)``.
    Raises:
        ValueError: if some ``L_b > max_length``.

    Reference: the exact ELBO of LLaDA arXiv 2502.09992 (likelihood evaluation).
    """
    check_positive_int(batch_size, "batch_size")
    allowed = completion_mask.bool()  # (B, L)
    lengths = allowed.sum(-1).tolist()
    _check_lengths(lengths, max_length)
    rows = []
    for b, n in enumerate(lengths):
        if n == 0:
            rows.append(torch.zeros(completion.shape[1], dtype=torch.float32, device=completion.device))
            continue
        plan = _row_plan(allowed[b], batch=1)
        est = score(
            policy,
            prompt_ids[b : b + 1],
            prompt_mask[b : b + 1],
            completion[b : b + 1],
            completion_mask[b : b + 1],
            plan,
            micro_batch=batch_size,
        )
        rows.append(est.per_token[0])
    per_token = torch.stack(rows)  # (B, L)
    nfe = max((2**n - 1 for n in lengths), default=0)
    return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=nfe)


@dataclass(frozen=True)
class Exact(PlanEstimator):
    """Exact enumeration of the ELBO over every mask, as an estimator: ``2^{L_b} − 1`` forward passes per sequence.

    :meth:`estimate` handles any batch (rows may differ); :meth:`make_plan` builds one shared
    enumeration plan and therefore needs every row to have the same allowed positions.

    Args:
        max_length: refuse canvases with more than this many allowed positions (default 16).
        batch_size: masked canvases per forward call in :meth:`estimate`.

    Reference: LLaDA arXiv 2502.09992 (likelihood evaluation).
    """

    max_length: int = DEFAULT_MAX_LENGTH
    batch_size: int = 256
    name = "exact"
    nfe_formula = "2^L − 1 (every mask of the L positions)"
    trainable = False  # (exponential in L: for analysis, dlmrl estimators)

    def __post_init__(self) -> None:
        check_positive_int(self.max_length, "max_length")
        check_positive_int(self.batch_size, "batch_size")

    @property
    def nfe(self) -> None:
        """Depends on the canvas: see :meth:`nfe_for`."""
        return None

    def nfe_for(self, length: int) -> int:
        return 2**length - 1

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> MaskPlan:
        """The enumeration plan for a batch whose rows share their allowed positions.

        Args:
            completion_mask: ``(B, L)`` bool, identical rows.
            generator: unused (the plan is deterministic).
            prompt_mask: unused (the prompt is never masked).
        Returns:
            :class:`MaskPlan` with ``S = 2^{L_b} − 1``, ``t`` all NaN.
        Raises:
            ValueError: if rows differ, a row has no allowed position, or ``L_b > max_length``.
        """
        allowed = completion_mask.bool()  # (B, L)
        if not (allowed == allowed[:1]).all():
            raise ValueError(
                "Exact.make_plan needs every row to have the same allowed positions; "
                "use Exact.estimate / exact_elbo for rows that differ"
            )
        n = int(allowed[0].sum())
        if n == 0:
            raise ValueError("Exact.make_plan: no position may be masked (completion_mask is all False)")
        _check_lengths([n], self.max_length)
        return _row_plan(allowed[0], batch=allowed.shape[0])

    def estimate(
        self,
        policy: Policy,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion: torch.Tensor,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        micro_batch: int | None = None,
    ) -> Estimate:
        """:func:`exact_elbo` with this estimator's limits (``generator`` is unused)."""
        return exact_elbo(
            policy,
            prompt_ids,
            prompt_mask,
            completion,
            completion_mask,
            max_length=self.max_length,
            batch_size=micro_batch or self.batch_size,
        )
