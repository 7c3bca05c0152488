"""Loss aggregation over tokens and sequences (``loss_type``: TRL's names, plus ESPO's group mean and the
sequence sum of the ratio-free presets).

Each loss type is a registered :class:`Aggregation` (:data:`LOSS_TYPES`) that reduces a per-token loss to a
scalar and says what it divides by (:meth:`Aggregation.units`), which the trainer needs to split a batch
over processes and to drop zero-advantage rows. :func:`aggregate` looks a name up and applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.objectives.parts import Part, PartRegistry, check_values
from dlmrl.objectives.segments import check_token_tensors, segment_stats


class Aggregation(Part):
    """Base of the loss types: :meth:`aggregate` reduces a ``(B, L)`` per-token loss to a scalar, padding
    never counting; if nothing is valid the result is 0, still connected to the per-token graph.

    Class attributes, besides :class:`~dlmrl.objectives.parts.Part`'s:
        token_sum: the loss sums tokens over rows (a sequence-level ratio's shared term then counts once per
            token of its row, so the objective warns).
        uses_num_tokens: the normaliser is the ``num_tokens`` argument, the valid tokens of the whole
            generation batch (``dapo``), not a count of the rows passed in; a call on a share of the batch
            then needs no rescaling by the share.
    Subclasses implement :meth:`reduce` and :meth:`units`.
    """

    token_sum: ClassVar[bool] = False
    uses_num_tokens: ClassVar[bool] = False

    def aggregate(
        self,
        per_token: torch.Tensor,
        mask: torch.Tensor,
        num_tokens: float | torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The scalar loss.

        Args:
            per_token: ``(B, L)`` float loss per token (differentiable; padding may hold anything, even NaN).
            mask: ``(B, L)`` bool, valid tokens.
            num_tokens: the ``dapo`` normaliser (> 0), a float or a 0-dim tensor.
            segment_ids: ``(B, L)`` long segment ids, for ``segment_mean``.
        Returns:
            0-dim tensor of ``per_token``'s dtype.
        Raises:
            ValueError: bad shapes, a missing ``segment_ids`` or a non-positive normaliser.
        """
        check_token_tensors(mask, per_token=per_token, segment_ids=segment_ids)
        zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
        return self.reduce(torch.where(mask, per_token, zero), mask, num_tokens=num_tokens, segment_ids=segment_ids)

    def reduce(self, masked: torch.Tensor, mask: torch.Tensor, *, num_tokens=None, segment_ids=None) -> torch.Tensor:
        """The scalar loss of ``masked``, the ``(B, L)`` per-token loss with 0 at padding."""
        raise NotImplementedError

    def units(self, mask: torch.Tensor) -> float:
        """What :meth:`aggregate` divides a batch's sum by, up to a factor that is the same for every share
        of the batch: rows with a valid token (``grpo``, ``segment_mean``, ``sequence_sum``), rows
        (``dr_grpo``), valid tokens (``bnpo``), 1 (``dapo``: the global count is passed in).

        Args:
            mask: ``(B, L)`` bool valid tokens of the batch.
        """
        raise NotImplementedError


LOSS_TYPES: PartRegistry[Aggregation] = PartRegistry("loss type", "loss_type", Aggregation)


def _mean_over_rows(per_row: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_row`` ``(B,)`` over the rows where ``rows`` ``(B,)`` bool holds (0 if none does)."""
    zero = torch.zeros((), dtype=per_row.dtype, device=per_row.device)
    return torch.where(rows, per_row, zero).sum() / rows.sum().clamp(min=1).to(per_row.dtype)


def _rows_with_tokens(mask: torch.Tensor) -> float:
    return float((mask.sum(-1) > 0).sum())


@LOSS_TYPES.register("grpo")
@dataclass(frozen=True)
class SequenceMean(Aggregation):
    """Mean over sequences of each sequence's token mean. Rows without valid tokens are left out of the mean
    (TRL divides by every row; the two agree when every row has a token).

    Reference: GRPO arXiv 2402.03300 Eq. 3; TRL ``GRPOConfig.loss_type="grpo"``.
    """

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        n = mask.sum(-1)  # (B,)
        return _mean_over_rows(masked.sum(-1) / n.clamp(min=1).to(masked.dtype), n > 0)

    def units(self, mask):
        return _rows_with_tokens(mask)


@LOSS_TYPES.register("bnpo")
@dataclass(frozen=True)
class BatchTokenMean(Aggregation):
    """Token mean over this call's batch.

    Reference: TRL ``GRPOConfig.loss_type="bnpo"``.
    """

    token_sum = True
    zero_rows_skippable = False  # (the normaliser counts the tokens of every row, A = 0 or not)

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        return masked.sum() / mask.sum().clamp(min=1).to(masked.dtype)

    def units(self, mask):
        return float(mask.sum())


@LOSS_TYPES.register("dapo")
@dataclass(frozen=True)
class GlobalTokenMean(Aggregation):
    """Token sum / ``num_tokens``, the number of valid tokens of the whole generation batch (across
    processes and accumulation steps; TRL's ``num_items_in_batch``). Under DDP gradient averaging over W
    processes (the world size) pass ``total / W``. Default: this call's valid-token count.

    Reference: DAPO arXiv 2503.14476 §3.3 (token-level policy gradient loss); TRL ``GRPOConfig.loss_type="dapo"``.
    """

    token_sum = True
    uses_num_tokens = True
    zero_rows_skippable = False  # (the normaliser counts the tokens of every row, A = 0 or not)

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        if num_tokens is None:
            return masked.sum() / mask.sum().clamp(min=1).to(masked.dtype)
        if not float(num_tokens) > 0:
            raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
        return masked.sum() / num_tokens

    def units(self, mask):
        return 1.0


@LOSS_TYPES.register("dr_grpo")
@dataclass(frozen=True)
class ConstantLengthSum(Aggregation):
    """Token sum / (B · ``max_completion_length``), a constant per row (``None``: the batch's width ``L``).

    Reference: Dr. GRPO arXiv 2503.20783 §3; TRL ``GRPOConfig.loss_type="dr_grpo"``.
    """

    token_sum = True

    max_completion_length: int | None = None

    def __post_init__(self) -> None:
        check_values(self, [("max_completion_length", self.max_completion_length is None
                             or self.max_completion_length >= 1, "must be >= 1 (or None)")])

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        length = mask.shape[1] if self.max_completion_length is None else self.max_completion_length
        return masked.sum() / max(mask.shape[0] * length, 1)  # (an empty batch: 0, not 0/0)

    def units(self, mask):
        return float(mask.shape[0])  # (times the constant length, the same for every share)


@LOSS_TYPES.register("segment_mean")
@dataclass(frozen=True)
class SegmentMean(Aggregation):
    """Mean over sequences of the mean over the sequence's segments of the segment token mean; needs
    ``segment_ids`` (the objective passes ESPO's entropy groups when it derives them).

    Reference: ESPO arXiv 2512.00499 Eq. 5.
    """

    required_inputs = frozenset({"segment_ids"})

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        if segment_ids is None:
            raise ValueError("loss_type 'segment_mean' needs segment_ids (B, L)")
        zero = torch.zeros((), dtype=masked.dtype, device=masked.device)
        sums, counts, _ = segment_stats(masked, mask, segment_ids)  # (B, S)
        present = counts > 0
        seg_means = torch.where(present, sums / counts.clamp(min=1), zero)  # (B, S)
        k = present.sum(-1)  # (B,) segments per row
        return _mean_over_rows(seg_means.sum(-1) / k.clamp(min=1).to(masked.dtype), k > 0)

    def units(self, mask):
        return _rows_with_tokens(mask)


@LOSS_TYPES.register("sequence_sum")
@dataclass(frozen=True)
class SequenceSum(Aggregation):
    """Mean over sequences of each sequence's token *sum* (the scale of a sequence log-likelihood); rows
    without valid tokens are left out.

    Reference: wd1 arXiv 2507.08838 (the weighted log-likelihood of a sequence).
    """

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        return _mean_over_rows(masked.sum(-1), mask.sum(-1) > 0)

    def units(self, mask):
        return _rows_with_tokens(mask)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    num_tokens: float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with the loss type registered as ``loss_type``
    (:data:`LOSS_TYPES`: ``grpo``, ``bnpo``, ``dapo``, ``dr_grpo``, ``segment_mean``, ``sequence_sum``; see
    each class for its formula); padding never counts.

    Args:
        per_token: ``(B, L)`` float loss per token (differentiable).
        mask: ``(B, L)`` bool, valid tokens.
        loss_type: a registered name.
        num_tokens: ``dapo`` normaliser (> 0).
        max_completion_length: ``dr_grpo`` constant (>= 1).
        segment_ids: ``(B, L)`` long, for ``segment_mean``.
    Returns:
        Scalar tensor.
    Raises:
        ValueError: unknown ``loss_type``, bad shapes, a missing ``segment_ids`` or a non-positive
            normaliser.

    Reference: GRPO arXiv 2402.03300 Eq. 3 (``grpo``); DAPO arXiv 2503.14476 §3.3 (token-level loss);
    Dr. GRPO arXiv 2503.20783 §3; ESPO arXiv 2512.00499 Eq. 5; TRL ``GRPOConfig.loss_type``.
    """
    part = LOSS_TYPES.build(loss_type, {"max_completion_length": max_completion_length})
    return part.aggregate(per_token, mask, num_tokens=num_tokens, segment_ids=segment_ids)
