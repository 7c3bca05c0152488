"""Group-relative advantages from scalar rewards (GRPO / Dr. GRPO / RLOO / HAPO / Flow-GRPO).

Rows are grouped consecutively (rows ``g·G .. g·G+G−1`` answer prompt ``g``) unless a function takes
explicit ``group_ids`` (the registry, :mod:`dlmrl.objectives.advantage_registry`, regroups rows by their ids
for the consecutive ones). Every estimator gives exactly 0 to a group whose finite rewards are all equal
and to non-finite rewards (NaN or ±inf: excluded from the statistics, with a warning).
"""

from __future__ import annotations

import warnings

import torch

SCALE_REWARDS = ("group", "batch", "none")


def _grouped(rewards: torch.Tensor, num_generations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards as ``(B/G, G)`` float64 and the finite-mask; validates shapes, warns on NaN or ±inf."""
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be an integer >= 1, got {num_generations!r}")
    if rewards.shape[0] % num_generations != 0:
        raise ValueError(
            f"batch size {rewards.shape[0]} is not divisible by num_generations {num_generations}"
        )
    r = rewards.double().reshape(-1, num_generations)  # (B/G, G)
    valid = torch.isfinite(r)  # (B/G, G)
    if not valid.all():
        warnings.warn(
            f"{int((~valid).sum())} non-finite (NaN or inf) reward(s): excluded from their group's statistics, "
            "advantage 0",
            stacklevel=3,
        )
    return r, valid


def _group_mean(r: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = valid.sum(-1, keepdim=True)  # (B/G, 1)
    mean = torch.where(valid, r, 0.0).sum(-1, keepdim=True) / n.clamp(min=1)  # (B/G, 1)
    return mean, n


def _all_equal(r: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B/G, 1)`` bool: the group's finite rewards are all equal (or there are fewer than two)."""
    hi = torch.where(valid, r, -torch.inf).amax(-1, keepdim=True)
    lo = torch.where(valid, r, torch.inf).amin(-1, keepdim=True)
    return (hi == lo) | (valid.sum(-1, keepdim=True) < 2)


def _group_zscore(r: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(R − mean) / (Bessel std + 1e-4)`` per row of ``(B/G, G)`` (not yet zeroed for equal groups)."""
    mean, n = _group_mean(r, valid)
    centred = r - mean
    var = torch.where(valid, centred**2, 0.0).sum(-1, keepdim=True) / (n - 1).clamp(min=1)
    return centred / (var.sqrt() + 1e-4)


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
) -> torch.Tensor:
    """``A_i = (R_i − mean_g) / (std + 1e-4)``, or without the division for ``none``.

    Rows are grouped consecutively: rows ``g·G .. g·G+G−1`` answer the same prompt.

    - ``group``: std is the Bessel-corrected std of the row's group.
    - ``batch``: std is the Bessel-corrected std over every finite reward of the batch
      (the mean is still the group's).
    - ``none``: ``A_i = R_i − mean_g`` (Dr. GRPO; GDPO and d1 use this).

    A group whose finite rewards are all equal gets exactly 0 (as does a group of one); non-finite
    rewards (NaN, ±inf) are left out of their group's statistics and get advantage 0, with a warning.

    Args:
        rewards: ``(B,)`` float rewards, ``B = num_prompts · G``.
        num_generations: G, completions per prompt.
        scale_rewards: ``group``, ``batch`` or ``none``.
    Returns:
        ``(B,)`` float32 advantages.
    Raises:
        ValueError: if ``B`` is not divisible by G or ``scale_rewards`` is unknown.

    Reference: GRPO arXiv 2402.03300 §4.1.2; Dr. GRPO arXiv 2503.20783 §3; TRL ``scale_rewards``.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(
            f"scale_rewards must be one of {', '.join(repr(s) for s in SCALE_REWARDS)}; got {scale_rewards!r}"
        )
    r, valid = _grouped(rewards, num_generations)  # (B/G, G)
    mean, _n = _group_mean(r, valid)  # (B/G, 1)
    centred = r - mean  # (B/G, G)
    if scale_rewards == "group":
        adv = _group_zscore(r, valid)
    elif scale_rewards == "batch":
        flat = r[valid]
        std = flat.std() if flat.numel() > 1 else torch.zeros((), dtype=r.dtype)
        adv = centred / (std + 1e-4)
    else:
        adv = centred
    adv = torch.where(valid & ~_all_equal(r, valid), adv, 0.0)
    return adv.reshape(-1).float()


def rloo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Leave-one-out baseline: ``A_i = R_i − mean_{j≠i} R_j`` within each group.

    Non-finite rewards are left out (advantage 0, with a warning); a group with fewer than two finite
    rewards, or with all rewards equal, gets 0.

    Args:
        rewards: ``(B,)`` float rewards, ``B = num_prompts · G``.
        num_generations: G, completions per prompt.
    Returns:
        ``(B,)`` float32 advantages.

    Reference: RLOO arXiv 2402.14740 §3 (Eq. 6).
    """
    r, valid = _grouped(rewards, num_generations)  # (B/G, G)
    n = valid.sum(-1, keepdim=True)  # (B/G, 1)
    total = torch.where(valid, r, 0.0).sum(-1, keepdim=True)
    others = (total - torch.where(valid, r, 0.0)) / (n - 1).clamp(min=1)  # (B/G, G)
    adv = torch.where(valid & ~_all_equal(r, valid), r - others, 0.0)
    return adv.reshape(-1).float()


def hapo_token_group_advantages(
    rewards: torch.Tensor, num_generations: int, mask: torch.Tensor, fallback_threshold: float = 5.0
) -> torch.Tensor:
    """HAPO's token-level group average: statistics over every valid token of the group.

    Each reward is replicated over its row's valid tokens; ``μ`` and the population ``σ`` are taken
    over all valid tokens of the group (a row of ``n_i`` tokens counts ``n_i`` times), and
    ``A_i = (R_i − μ) / (σ + 1e-6)``. If any row of the group that has tokens gets ``|A_i| >= 5``, the
    group falls back to the ordinary ``group`` advantage (:func:`group_advantages`). Rows without
    valid tokens get 0. (The authors' code also tests the padding entries of its ``(G, L)`` score
    matrix against the threshold; we test valid tokens only.)

    Args:
        rewards: ``(B,)`` float. num_generations: G. mask: ``(B, L)`` bool, valid tokens.
        fallback_threshold: 5 in HAPO.
    Returns:
        ``(B,)`` float32 advantages (constant over a row's tokens).
    Raises:
        ValueError: on bad shapes or G.

    Reference: HAPO arXiv 2509.16591 (token level group average; authors' ``compute_hapo_outcome_advantage``).
    """
    r, valid = _grouped(rewards, num_generations)  # (B/G, G)
    if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask must be (B, L) with B = {rewards.shape[0]}, got {tuple(mask.shape)}")
    n = mask.sum(-1).double().reshape(r.shape)  # (B/G, G) tokens per row
    w = torch.where(valid, n, 0.0)
    total = w.sum(-1, keepdim=True)  # (B/G, 1)
    rz = torch.where(valid, r, 0.0)
    mu = (w * rz).sum(-1, keepdim=True) / total.clamp(min=1)
    var = (w * (rz - mu) ** 2).sum(-1, keepdim=True) / total.clamp(min=1)
    adv = (r - mu) / (var.sqrt() + 1e-6)  # (B/G, G)
    has_tokens = valid & (n > 0)
    fallback = (torch.where(has_tokens, adv.abs(), 0.0) >= fallback_threshold).any(-1, keepdim=True)
    adv = torch.where(fallback, _group_zscore(r, valid), adv)
    adv = torch.where(has_tokens & ~_all_equal(r, valid), adv, 0.0)
    return adv.reshape(-1).float()


def group_stats_by_ids(values: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-group statistics of the finite values, groups given by ids (any integers, any sizes).

    Args:
        values: ``(N,)`` float (NaN, ±inf = excluded). ids: ``(N,)`` integer group ids.
    Returns:
        float64 tensors ``index`` ``(N,)`` (dense group index of each element), ``count``, ``mean``,
        ``std`` (Bessel) and bool ``flat`` (all finite values equal, or fewer than two), each ``(k,)``.
    """
    v = values.double()
    finite = torch.isfinite(v)
    v = torch.where(finite, v, 0.0)  # (excluded below; a zero keeps inf out of the sums)
    _, g = torch.unique(ids, return_inverse=True)
    k = int(g.max()) + 1 if g.numel() else 0
    zeros = torch.zeros(k, dtype=v.dtype, device=v.device)
    n = zeros.index_add(0, g, finite.double())
    mean = zeros.index_add(0, g, torch.where(finite, v, 0.0)) / n.clamp(min=1)
    dev = torch.where(finite, v - mean[g], 0.0)
    std = (zeros.index_add(0, g, dev**2) / (n - 1).clamp(min=1)).sqrt()
    hi = torch.full_like(zeros, -torch.inf).scatter_reduce(0, g, torch.where(finite, v, -torch.inf), "amax")
    lo = torch.full_like(zeros, torch.inf).scatter_reduce(0, g, torch.where(finite, v, torch.inf), "amin")
    return {"index": g, "count": n, "mean": mean, "std": std, "flat": (hi == lo) | (n < 2)}


def zscore_by_ids(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``(v − mean) / (Bessel std + 1e-4)`` within each id; equal groups, groups of one and non-finite values
    get 0.

    Args:
        values: ``(N,)`` float. ids: ``(N,)`` integer group ids (any values).
    Returns:
        ``(N,)`` float64.
    """
    v = values.double()
    finite = torch.isfinite(v)
    if not finite.all():
        warnings.warn(
            f"{int((~finite).sum())} non-finite (NaN or inf) reward(s): excluded from their group's statistics, "
            "advantage 0",
            stacklevel=3,
        )
    st = group_stats_by_ids(v, ids)
    g = st["index"]
    adv = (v - st["mean"][g]) / (st["std"][g] + 1e-4)
    return torch.where(finite & ~st["flat"][g], adv, 0.0)


def flow_grpo_advantages(
    rewards: torch.Tensor,
    trajectory_ids: torch.Tensor,
    group_ids: torch.Tensor,
    turn_weighted: bool = False,
) -> torch.Tensor:
    """Flow-GRPO: every turn of a multi-turn trajectory carries the trajectory's z-scored final reward.

    Each row is one turn (context, response) of a trajectory; ``group_ids`` names the question whose
    ``G`` trajectories form a group.

    - default (the paper's form): z-score over the group's *trajectories*, one reward each, then
      broadcast to their turns: ``A = (R_traj − mean) / (Bessel std + 1e-4)``.
    - ``turn_weighted=True`` (the authors' code): the statistics pool every turn sample, so a long
      trajectory counts once per turn.

    Args:
        rewards: ``(B,)`` the trajectory's final reward on each of its turns.
        trajectory_ids: ``(B,)`` integer trajectory id of each turn.
        group_ids: ``(B,)`` integer question id of each turn (constant within a trajectory).
        turn_weighted: pool turns instead of trajectories.
    Returns:
        ``(B,)`` float32 advantages.
    Raises:
        ValueError: on bad shapes, or a trajectory whose turns disagree on reward or question.

    Reference: Flow-GRPO / AgentFlow arXiv 2510.05592 (group-normalised final-outcome advantage).
    """
    rewards = torch.as_tensor(rewards)
    B = rewards.shape[0]
    if rewards.dim() != 1 or trajectory_ids.shape != (B,) or group_ids.shape != (B,):
        raise ValueError("rewards, trajectory_ids and group_ids must all be (B,)")
    if turn_weighted:
        return zscore_by_ids(rewards, group_ids).float()
    uniq, t = torch.unique(trajectory_ids, return_inverse=True)
    arange = torch.arange(B, device=rewards.device)
    first = torch.full((uniq.numel(),), B, dtype=torch.long, device=rewards.device).scatter_reduce(
        0, t, arange, "amin"
    )
    r = rewards.double()
    same_reward = (r == r[first][t]) | (~torch.isfinite(r) & ~torch.isfinite(r[first][t]))
    if not (same_reward.all() and (group_ids == group_ids[first][t]).all()):
        raise ValueError("every turn of a trajectory must carry the same reward and group id")
    traj_adv = zscore_by_ids(r[first], group_ids[first])  # (n_traj,) one per trajectory
    return traj_adv[t].float()


def wd1_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """wd1's weights as advantages: ``A'_i = n_g · (softmax_g(A)_i − softmax_g(−A)_i)`` with ``A = R − mean_g``.

    wd1's loss is ``−Σ_i w⁺_i ℓ_i + Σ_i w⁻_i ℓ_i`` per group, ``w⁺ = softmax(A)`` and ``w⁻ = softmax(−A)`` over
    the group's ``n_g`` completions (its code takes the softmax over a device's micro-batch, which its config
    makes exactly one group), averaged over groups. With these advantages, a ratio-free objective
    (``ratio_level="none"``) aggregated as ``sequence_sum`` (the mean over rows of ``A'_i ℓ_i``) is that loss:
    the factor ``n_g`` turns the mean over rows into the mean over groups of the group sums
    (**dlmrl interpretation** of the grouping for groups of unequal size). A group whose finite rewards are all
    equal gets exactly 0; non-finite rewards get 0 and are left out of their group's softmax, with a warning.

    Args:
        rewards: ``(B,)`` float. group_ids: ``(B,)`` integer group ids (any values, any order).
    Returns:
        ``(B,)`` float32.

    Reference: wd1, arXiv 2507.08838; code xiaohangt/wd1 ``wd1/trainers/rev_grpo_trainer.py`` (``is_weights``).
    """
    r = torch.as_tensor(rewards).double()
    if r.dim() != 1 or torch.as_tensor(group_ids).shape != r.shape:
        raise ValueError(f"rewards and group_ids must be (B,), got {tuple(r.shape)} and "
                         f"{tuple(torch.as_tensor(group_ids).shape)}")
    finite = torch.isfinite(r)
    if not finite.all():
        warnings.warn(f"{int((~finite).sum())} non-finite (NaN or inf) reward(s): excluded from their group's "
                      "weights, advantage 0", stacklevel=2)
    st = group_stats_by_ids(r, group_ids)
    g = st["index"]
    a = torch.where(finite, r - st["mean"][g], -torch.inf)  # (B,) NaN rows drop out of the softmax
    k = int(g.max()) + 1 if g.numel() else 0

    def group_softmax(x: torch.Tensor) -> torch.Tensor:
        top = torch.full((k,), -torch.inf, dtype=x.dtype).scatter_reduce(0, g, x, "amax")
        e = torch.where(finite, (x - top[g]).exp(), 0.0)
        return e / torch.zeros(k, dtype=x.dtype).index_add(0, g, e)[g].clamp(min=1e-300)

    neg = torch.where(finite, -a, -torch.inf)
    out = st["count"][g] * (group_softmax(a) - group_softmax(neg))
    return torch.where(finite & ~st["flat"][g], out, 0.0).float()
