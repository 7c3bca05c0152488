"""SRPO's bonus-calibrated pass@k group advantage."""

from __future__ import annotations

import math

import torch

from dlmrl.objectives.advantages import _all_equal, _group_zscore, _grouped


def passk_bonus(n: int, c: int, k: int = 4) -> tuple[float, float]:
    """The pass@k bonus for a group of ``n`` samples with ``c`` exact matches.

    ``ρ = 1 − C(n−c, k) / C(n, k)`` (the unbiased pass@k), ``σ = sqrt(ρ(1 − ρ))``;
    exact match: ``(1 − ρ) / (σ + 1e-6)``; otherwise ``(1 − ρ − C(n−c−1, k−1) / C(n−1, k−1)) / (σ + 1e-6)``.
    Both are 0 when ``σ = 0`` or ``n < k``.

    Args:
        n: group size (finite rewards). c: exact matches, ``0 <= c <= n``. k: the ``k`` of pass@k (4 in SRPO).
    Returns:
        ``(bonus for an exact match, bonus otherwise)``.

    Reference: SRPO / GREAM arXiv 2510.20815 (authors' ``passk`` estimator); the analytical pass@k advantage of
    "Pass@k Training" (Chen et al., 2025).
    """
    if not (0 <= c <= n and k >= 1):
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if n < k:
        return 0.0, 0.0
    rho = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(max(rho * (1.0 - rho), 0.0))
    if sigma == 0.0:
        return 0.0, 0.0
    exact = (1.0 - rho) / (sigma + 1e-6)
    other = (1.0 - rho - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / (sigma + 1e-6)
    return exact, other


def srpo_passk_advantages(
    rewards: torch.Tensor, num_generations: int, exact: torch.Tensor | None = None, k: int = 4
) -> torch.Tensor:
    """``group`` advantage of the graded reward plus the pass@k bonus of :func:`passk_bonus`.

    ``n`` and ``c`` count the group's finite rewards and its exact matches among them. A group whose
    graded rewards are all equal gets exactly 0 (its bonus is 0 too: then ``c = 0`` or ``c = n``).

    Args:
        rewards: ``(B,)`` graded rewards (e.g. :func:`dlmrl.objectives.shaping.srpo_graded_reward`).
        num_generations: G.
        exact: ``(B,)`` bool exact-match flags; default ``rewards >= 1``.
        k: the ``k`` of pass@k (4 in SRPO).
    Returns:
        ``(B,)`` float32 advantages.
    Raises:
        ValueError: on bad shapes or G.

    Reference: SRPO / GREAM arXiv 2510.20815 (bonus-calibrated group advantage).
    """
    r, valid = _grouped(rewards, num_generations)  # (B/G, G)
    flat = _all_equal(r, valid)  # (B/G, 1)
    base = torch.where(valid & ~flat, _group_zscore(r, valid), 0.0)
    hit = torch.nan_to_num(r, nan=-torch.inf) >= 1.0 if exact is None else exact.bool().reshape(r.shape)
    hit = hit & valid
    bonus = torch.zeros_like(base)
    for g in range(r.shape[0]):
        n, c = int(valid[g].sum()), int(hit[g].sum())
        b_exact, b_other = passk_bonus(n, c, k)
        bonus[g] = torch.where(hit[g], b_exact, b_other)
    bonus = torch.where(valid & ~flat, bonus, 0.0)
    return (base + bonus).reshape(-1).float()
