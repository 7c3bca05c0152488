"""DaGRPO: distinctiveness-masked pairwise advantages and off-policy anchors.

DaGRPO (arXiv 2512.06337) is public as an abstract only; everything here is a **(dlmrl
interpretation)** from DaGRPO's abstract (arXiv 2512.06337).
"""

from __future__ import annotations

import warnings

import torch

from dlmrl.objectives.advantages import group_stats_by_ids


def ngram_jaccard(
    token_ids: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor, n: int = 3
) -> torch.Tensor:
    """Jaccard similarity of the token ``n``-gram sets of every pair of rows in the same group.

    ``J(a, b) = |A ∩ B| / |A ∪ B|`` over the sets of ``n``-grams of the valid tokens (taken in order,
    skipping padding); two rows without any ``n``-gram have ``J = 1``. Pairs from different groups
    get 0 (they are never used).

    Args:
        token_ids: ``(B, L)`` integer ids. mask: ``(B, L)`` bool. group_ids: ``(B,)``. n: 3 (token 3-grams, dlmrl interpretation).
    Returns:
        ``(B, B)`` float32 similarities (diagonal 1).
    """
    if token_ids.shape != mask.shape or group_ids.shape != (mask.shape[0],):
        raise ValueError("token_ids and mask must be (B, L) and group_ids (B,)")
    seqs = [row[m].tolist() for row, m in zip(token_ids, mask.bool())]
    grams = [{tuple(s[i : i + n]) for i in range(len(s) - n + 1)} for s in seqs]
    B = len(seqs)
    out = torch.zeros(B, B)
    ids = group_ids.tolist()
    for i in range(B):
        for j in range(i, B):
            if ids[i] != ids[j]:
                continue
            union = grams[i] | grams[j]
            sim = len(grams[i] & grams[j]) / len(union) if union else 1.0
            out[i, j] = out[j, i] = sim
    return out


def dagrpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    scores: torch.Tensor | None = None,
    similarity: torch.Tensor | None = None,
    tau: float = 0.1,
    lam: float = 0.5,
) -> torch.Tensor:
    """Pairwise advantage over distinct pairs: ``A_i = mean_{j∈P_i}(R_i − R_j) / (std + 1e-4)``.

    ``P_i = {j ≠ i in i's group, finite R_j : d_ij >= τ}`` with distinctiveness
    ``d_ij = |s_i − s_j| + λ·(1 − J_ij)`` (``s`` a fine-grained score, default the reward; ``J`` the
    n-gram Jaccard similarity of :func:`ngram_jaccard`, default 0, i.e. all pairs distinct in text);
    ``std`` the group's Bessel std of the finite rewards. An empty ``P_i``, a group with equal
    rewards, a group of one and a NaN reward give 0. With every pair kept this is RLOO divided by the
    group std. Groups are given by ids, so an anchor row may join its group (groups of any size).

    Args:
        rewards: ``(B,)`` float. group_ids: ``(B,)`` integer prompt-group ids.
        scores: ``(B,)`` fine-grained scores (default ``rewards``).
        similarity: ``(B, B)`` Jaccard similarities (default 0).
        tau: ``τ`` (0.1). lam: ``λ`` (0.5).
    Returns:
        ``(B,)`` float32 advantages.

    Reference: DaGRPO arXiv 2512.06337 (sequence-level gradient rectification), **(dlmrl interpretation)**.
    """
    rewards = torch.as_tensor(rewards)
    B = rewards.shape[0]
    if rewards.dim() != 1 or group_ids.shape != (B,):
        raise ValueError("rewards and group_ids must be (B,)")
    r = rewards.double()
    s = r if scores is None else torch.as_tensor(scores).double()
    J = torch.zeros(B, B, dtype=torch.float64) if similarity is None else similarity.double()
    if s.shape != (B,) or J.shape != (B, B):
        raise ValueError(f"scores must be (B,) and similarity (B, B) with B = {B}")
    finite = torch.isfinite(r)
    if not finite.all():
        warnings.warn(f"{int((~finite).sum())} non-finite (NaN or inf) reward(s): excluded from their group, "
                      "advantage 0", stacklevel=2)
    r = torch.where(finite, r, 0.0)
    st = group_stats_by_ids(r, group_ids)
    g = st["index"]
    same = g[:, None] == g[None, :]
    d = (s[:, None] - s[None, :]).abs() + lam * (1.0 - J)  # (B, B)
    keep = same & ~torch.eye(B, dtype=torch.bool, device=r.device) & finite[None, :] & (d >= tau)  # (B, B)
    pair_mean = torch.where(keep, r[:, None] - r[None, :], 0.0).sum(-1) / keep.sum(-1).clamp(min=1)
    adv = pair_mean / (st["std"][g] + 1e-4)
    ok = finite & ~st["flat"][g] & keep.any(-1)
    return torch.where(ok, adv, 0.0).float()


def groups_needing_anchor(rewards: torch.Tensor, group_ids: torch.Tensor, anchor_threshold: float) -> torch.Tensor:
    """Which groups have no finite reward above ``anchor_threshold`` (so DaGRPO adds an anchor).

    Args:
        rewards: ``(B,)``. group_ids: ``(B,)``. anchor_threshold: the cut.
    Returns:
        ``(B,)`` bool, True on every row of a group that needs an anchor.

    Reference: DaGRPO arXiv 2512.06337 (off-policy data augmentation), **(dlmrl interpretation)**.
    """
    r = torch.as_tensor(rewards).double()
    r = torch.where(torch.isfinite(r), r, -torch.inf)  # (a non-finite reward counts as none)
    _, g = torch.unique(group_ids, return_inverse=True)
    k = int(g.max()) + 1 if g.numel() else 0
    best = torch.full((k,), -torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amax")
    return ~(best > anchor_threshold)[g]
