"""Loss aggregation over tokens and sequences (TRL's ``loss_type`` names, plus ESPO's group mean)."""

from __future__ import annotations

import torch

from dlmrl.objectives.segments import check_token_tensors, segment_stats

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo", "segment_mean", "sequence_sum")
TOKEN_SUM_LOSS_TYPES = ("bnpo", "dapo", "dr_grpo")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    num_tokens: float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar; padding never counts.

    - ``grpo``: mean over sequences of each sequence's token mean. Rows without valid tokens are left
      out of the mean (TRL divides by every row; the two agree when every row has a token).
    - ``bnpo``: token mean over this call's batch.
    - ``dapo``: token sum / ``num_tokens``, the number of valid tokens of the whole generation batch
      (across processes and accumulation steps; TRL's ``num_items_in_batch``). Under DDP gradient
      averaging over W processes (the world size) pass ``total / W``. Default: this call's valid-token count.
    - ``dr_grpo``: token sum / (B · ``max_completion_length``); default ``L``.
    - ``segment_mean``: mean over sequences of the mean over the sequence's segments of the segment
      token mean (ESPO arXiv 2512.00499 Eq. 5); needs ``segment_ids``.
    - ``sequence_sum``: mean over sequences of each sequence's token *sum* (the scale of a sequence
      log-likelihood, as wd1 arXiv 2507.08838 weights it); rows without valid tokens are left out.

    If nothing is valid the result is 0, still connected to ``per_token``'s graph.

    Args:
        per_token: ``(B, L)`` float loss per token (differentiable).
        mask: ``(B, L)`` bool, valid tokens.
        loss_type: one of :data:`LOSS_TYPES`.
        num_tokens: ``dapo`` normaliser (> 0).
        max_completion_length: ``dr_grpo`` constant (>= 1).
        segment_ids: ``(B, L)`` long, for ``segment_mean``.
    Returns:
        Scalar tensor.
    Raises:
        ValueError: unknown ``loss_type``, bad shapes, a missing ``segment_ids`` or a non-positive
            normaliser.

    Reference: GRPO arXiv 2402.03300 Eq. 3 (``grpo``); DAPO arXiv 2503.14476 §3.3 (token-level loss);
    Dr. GRPO arXiv 2503.20783 §3; TRL ``GRPOConfig.loss_type``.
    """
    check_token_tensors(mask, per_token=per_token, segment_ids=segment_ids)
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    masked = torch.where(mask, per_token, zero)  # (B, L)
    if loss_type == "grpo":
        n = mask.sum(-1)  # (B,)
        rows = n > 0
        seq = masked.sum(-1) / n.clamp(min=1).to(per_token.dtype)  # (B,)
        return torch.where(rows, seq, zero).sum() / rows.sum().clamp(min=1).to(per_token.dtype)
    if loss_type == "sequence_sum":
        rows = mask.sum(-1) > 0  # (B,)
        return torch.where(rows, masked.sum(-1), zero).sum() / rows.sum().clamp(min=1).to(per_token.dtype)
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1).to(per_token.dtype)
    if loss_type == "dapo":
        if num_tokens is None:
            return masked.sum() / mask.sum().clamp(min=1).to(per_token.dtype)
        if not float(num_tokens) > 0:
            raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
        return masked.sum() / num_tokens
    if loss_type == "dr_grpo":
        length = mask.shape[1] if max_completion_length is None else max_completion_length
        if length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {length}")
        return masked.sum() / max(mask.shape[0] * length, 1)  # (an empty batch: 0, not 0/0)
    if loss_type == "segment_mean":
        if segment_ids is None:
            raise ValueError("loss_type 'segment_mean' needs segment_ids (B, L)")
        sums, counts, _ = segment_stats(per_token, mask, segment_ids)  # (B, S)
        present = counts > 0
        seg_means = torch.where(present, sums / counts.clamp(min=1), zero)  # (B, S)
        k = present.sum(-1)  # (B,) segments per row
        rows = k > 0
        seq = seg_means.sum(-1) / k.clamp(min=1).to(per_token.dtype)
        return torch.where(rows, seq, zero).sum() / rows.sum().clamp(min=1).to(per_token.dtype)
    raise ValueError(f"loss_type must be one of {', '.join(map(repr, LOSS_TYPES))}; got {loss_type!r}")
