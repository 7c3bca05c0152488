"""GTPO and GRPO-S: entropy-shaped token (or sequence) rewards with split z-scores.

Within each prompt group, the successful set ``O+ = {i : R_i >= success_threshold}`` and the failed
set ``O−`` (the other finite rewards) are shaped separately and z-scored separately (population std,
``+1e-6``). Note what the split z-score implies: within ``O+`` tokens below the set's mean get a
negative advantage. A group whose finite rewards are all equal gets exactly 0 (**dlmrl
interpretation**, as DAPO's dynamic sampling, which GTPO builds on, would drop it); NaN rewards get 0.
"""

from __future__ import annotations

import torch

from dlmrl.objectives.advantages import _all_equal, _grouped
from dlmrl.objectives.segments import check_token_tensors


def _split_zscore(x: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """z-score ``x`` over the ``pos`` cells and over the ``neg`` cells of each group separately."""
    out = torch.zeros_like(x)
    for part in (pos, neg):
        n = part.sum(dims, keepdim=True).clamp(min=1).double()
        mean = torch.where(part, x, 0.0).sum(dims, keepdim=True) / n
        std = (torch.where(part, (x - mean) ** 2, 0.0).sum(dims, keepdim=True) / n).sqrt()
        out = torch.where(part, (x - mean) / (std + 1e-6), out)
    return out


def gtpo_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    success_threshold: float = 1.0,
    alpha1: float = 1.0,
    alpha2: float = 0.1,
) -> torch.Tensor:
    """GTPO token advantages from entropy-shaped token rewards.

    For ``i ∈ O+``: ``r̃_{i,t} = α1·R_i + α2 · (H_{i,t} / Σ_{k∈O+, |y_k|>=t} H_{k,t}) · d_t``, ``d_t`` the
    number of successful responses with a valid token at ``t``. For ``j ∈ O−``:
    ``r̃_{j,t} = −α1 − α2 · ((1/H_{j,t}) / Σ_{k∈O−, |y_k|>=t} (1/H_{k,t})) · h_t`` (``1/H`` guarded by
    ``H >= 1e-6``). Where every successful entropy at ``t`` is 0 the shares are uniform (``1/d_t``).
    Advantages: z-score over the group's ``O+`` tokens and over its ``O−`` tokens separately (the
    per-group scope is a **dlmrl interpretation**).

    Args:
        rewards: ``(B,)`` float. num_generations: G. entropy: ``(B, L)`` nats (detached).
        mask: ``(B, L)`` bool. success_threshold: ``O+`` cut. alpha1, alpha2: 1 and 0.1 in the paper.
    Returns:
        ``(B, L)`` float32 advantages (0 at invalid tokens).
    Raises:
        ValueError: on bad shapes or G.

    Reference: GTPO arXiv 2508.04349 (token-level reward shaping with policy entropy; separate
    normalisation of the positive and negative sets).
    """
    check_token_tensors(mask, entropy=entropy)
    r, valid = _grouped(rewards, num_generations)  # (B/G, G)
    n_prompts, G, L = r.shape[0], num_generations, mask.shape[1]
    tok = mask.reshape(n_prompts, G, L)
    H = torch.where(tok, entropy.detach().double().reshape(n_prompts, G, L), 0.0)
    succ = (valid & (r >= success_threshold))[..., None]  # (B/G, G, 1)
    fail = (valid & (r < success_threshold))[..., None]
    pos, neg = tok & succ, tok & fail  # (B/G, G, L)

    d = pos.sum(1, keepdim=True).double()  # (B/G, 1, L)
    s_pos = torch.where(pos, H, 0.0).sum(1, keepdim=True)
    share_pos = torch.where(s_pos > 0, H / s_pos.clamp(min=1e-300), 1.0 / d.clamp(min=1))
    shaped_pos = alpha1 * torch.where(valid, r, 0.0)[..., None] + alpha2 * share_pos * d

    inv = 1.0 / H.clamp(min=1e-6)
    h = neg.sum(1, keepdim=True).double()
    s_neg = torch.where(neg, inv, 0.0).sum(1, keepdim=True)
    shaped_neg = -alpha1 - alpha2 * inv / s_neg.clamp(min=1e-300) * h

    shaped = torch.where(pos, shaped_pos, torch.where(neg, shaped_neg, 0.0))
    adv = _split_zscore(shaped, pos, neg, (1, 2))
    adv = torch.where(_all_equal(r, valid)[..., None], 0.0, adv)
    return adv.reshape(n_prompts * G, L).float()


def grpo_s_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    success_threshold: float = 1.0,
    alpha1: float = 1.0,
    alpha2: float = 0.1,
) -> torch.Tensor:
    """GRPO-S sequence advantages: GTPO's shaping with each response's mean entropy ``H̄_i``.

    ``r̃_i = α1·R_i + α2 · (H̄_i / Σ_{k∈O+} H̄_k) · |O+|`` for ``i ∈ O+`` and
    ``r̃_j = −α1 − α2 · ((1/H̄_j) / Σ_{k∈O−} 1/H̄_k) · |O−|`` for ``j ∈ O−``; z-scored over the group's
    ``O+`` and ``O−`` responses separately.

    Args:
        as :func:`gtpo_advantages`.
    Returns:
        ``(B,)`` float32 advantages.

    Reference: GRPO-S, arXiv 2508.04349 (sequence-level reward shaping with policy entropy).
    """
    check_token_tensors(mask, entropy=entropy)
    r, valid = _grouped(rewards, num_generations)  # (B/G, G)
    n_prompts, G = r.shape
    n = mask.sum(-1).double().reshape(n_prompts, G)
    H = (torch.where(mask, entropy.detach().double(), 0.0).sum(-1).reshape(n_prompts, G) / n.clamp(min=1))
    pos = valid & (r >= success_threshold)
    neg = valid & (r < success_threshold)

    d = pos.sum(-1, keepdim=True).double()
    s_pos = torch.where(pos, H, 0.0).sum(-1, keepdim=True)
    share_pos = torch.where(s_pos > 0, H / s_pos.clamp(min=1e-300), 1.0 / d.clamp(min=1))
    shaped_pos = alpha1 * torch.where(valid, r, 0.0) + alpha2 * share_pos * d

    inv = 1.0 / H.clamp(min=1e-6)
    h = neg.sum(-1, keepdim=True).double()
    s_neg = torch.where(neg, inv, 0.0).sum(-1, keepdim=True)
    shaped_neg = -alpha1 - alpha2 * inv / s_neg.clamp(min=1e-300) * h

    shaped = torch.where(pos, shaped_pos, torch.where(neg, shaped_neg, 0.0))
    adv = _split_zscore(shaped, pos, neg, (1,))
    adv = torch.where(_all_equal(r, valid), 0.0, adv)
    return adv.reshape(-1).float()
