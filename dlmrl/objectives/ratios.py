"""Importance-ratio levels (TRL's ``importance_sampling_level``, plus SSPO's sentence and ESPO's entropy-group
levels), as log-ratios.

Every level returns a ``(B, L)`` log-ratio ``log r[i, t]`` whose ``exp`` is the ratio applied to token
``t`` of row ``i`` and whose gradient is the level's. For a diffusion policy the "log-probs" are the
estimator's per-token ELBO contributions (their sum is the sequence ELBO), so ``sequence`` is GDPO's
``exp((ELBO_new − ELBO_old) / L)``.
"""

from __future__ import annotations

import torch

from dlmrl.objectives.segments import check_token_tensors, segment_mean

RATIO_LEVELS = ("token", "sequence", "sequence_token", "sentence", "entropy_group", "none")
SEQUENCE_LEVELS = ("sequence", "sequence_token")
SEGMENT_LEVELS = ("sentence", "entropy_group")
#: bound (nats) on a log importance ratio before ``exp`` in the losses: ``e^20 ≈ 4.9e8`` stays finite in float32,
#: so a diverged row gives a large finite ratio, never inf (verl clamps its log-ratio at ±20 the same way)
LOG_RATIO_BOUND = 20.0


def sequence_log_ratio(logp_new: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(1/|y_i|) Σ_t (logp_new − logp_old)`` over valid tokens; 0 for a row without valid tokens.

    Args:
        logp_new, logp_old: ``(B, L)`` nats per token (``logp_old`` is detached here).
        mask: ``(B, L)`` bool.
    Returns:
        ``(B,)`` log-ratio per sequence (nats per token), differentiable in ``logp_new``.

    Reference: GSPO arXiv 2507.18071 (sequence ratio ``s_i``); GDPO arXiv 2510.08554 §4 (ELBO ratio).
    """
    check_token_tensors(mask, logp_new=logp_new, logp_old=logp_old)
    diff = torch.where(mask, logp_new - logp_old.detach(), torch.zeros((), dtype=logp_new.dtype))  # (B, L)
    return diff.sum(-1) / mask.sum(-1).clamp(min=1).to(logp_new.dtype)


def log_ratio(
    level: str,
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    mask: torch.Tensor,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token log importance ratio at the given level.

    - ``token``: ``logp_new − logp_old`` (GRPO arXiv 2402.03300).
    - ``sequence``: ``log s_i = mean_t (logp_new − logp_old)`` on every token of row ``i``; the gradient
      flows through the mean (GSPO arXiv 2507.18071).
    - ``sequence_token``: value ``log s_i``, gradient per token:
      ``logp_new − sg[logp_new] + sg[log s_i]`` (GSPO-token, GSPO arXiv 2507.18071).
    - ``sentence`` / ``entropy_group``: the GSPO-token form with the mean taken over the token's
      segment (``segment_ids``): SSPO arXiv 2511.04256 (sentences; **dlmrl interpretation**) and ESPO
      arXiv 2512.00499 Eq. 10 (entropy groups: the geometric mean of the group's token ratios).
    - ``none``: no importance ratio (log-ratio 0): ratio-free objectives (wd1 arXiv 2507.08838, SPG arXiv
      2510.09541) weight the current policy's log-likelihood directly; see
      :meth:`dlmrl.objectives.objective.GroupObjective.compute`.

    Invalid positions get log-ratio 0 (ratio 1) and no gradient; ``logp_old`` is detached.

    Args:
        level: one of :data:`RATIO_LEVELS`.
        logp_new: ``(B, L)`` nats per token (differentiable).
        logp_old: ``(B, L)`` nats per token of the rollout policy.
        mask: ``(B, L)`` bool, valid tokens.
        segment_ids: ``(B, L)`` long; required for ``sentence`` and ``entropy_group``.
    Returns:
        ``(B, L)`` log-ratio.
    Raises:
        ValueError: on an unknown level, bad shapes, or a missing ``segment_ids``.
    """
    check_token_tensors(mask, logp_new=logp_new, logp_old=logp_old, segment_ids=segment_ids)
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    old = logp_old.detach()
    if level == "token":
        return torch.where(mask, logp_new - old, zero)
    if level in SEQUENCE_LEVELS:
        seq = sequence_log_ratio(logp_new, old, mask)[:, None]  # (B, 1)
        if level == "sequence":
            return torch.where(mask, seq.expand_as(logp_new), zero)
        return torch.where(mask, logp_new - logp_new.detach() + seq.detach(), zero)
    if level == "none":
        return torch.zeros_like(logp_new).detach()
    if level in SEGMENT_LEVELS:
        if segment_ids is None:
            raise ValueError(f"ratio level {level!r} needs segment_ids (B, L)")
        seg = segment_mean(torch.where(mask, logp_new - old, zero), mask, segment_ids).detach()  # (B, L)
        return torch.where(mask, logp_new - logp_new.detach() + seg, zero)
    raise ValueError(f"ratio level must be one of {', '.join(map(repr, RATIO_LEVELS))}; got {level!r}")
