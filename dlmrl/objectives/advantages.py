"""Group-relative advantages from scalar rewards (GRPO / Dr. GRPO / RLOO)."""

from __future__ import annotations

import warnings

import torch

SCALE_REWARDS = ("group", "batch", "none")


def _grouped(rewards: torch.Tensor, num_generations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards as ``(B/G, G)`` float64 and the finite-mask; validates shapes, warns on NaN."""
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
    valid = ~torch.isnan(r)  # (B/G, G)
    if not valid.all():
        warnings.warn(
            f"{int((~valid).sum())} NaN reward(s): excluded from their group's statistics, advantage 0",
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


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
) -> torch.Tensor:
    """``A_i = (R_i − mean_g) / (std + 1e-4)``, or without the division for ``none``.

    Rows are grouped consecutively: rows ``g·G .. g·G+G−1`` answer the same prompt.

    - ``group``: std is the Bessel-corrected std of the row's group.
    - ``batch``: std is the Bessel-corrected std over every finite reward of the batch
      (the mean is still the group's).
    - ``none``: ``A_i = R_i − mean_g`` (Dr. GRPO; GDPO and d1 use this).

    A group whose finite rewards are all equal gets exactly 0 (as does a group of one); NaN
    rewards are left out of their group's statistics and get advantage 0, with a warning.

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
    mean, n = _group_mean(r, valid)  # (B/G, 1)
    centred = r - mean  # (B/G, G)
    if scale_rewards == "group":
        var = torch.where(valid, centred**2, 0.0).sum(-1, keepdim=True) / (n - 1).clamp(min=1)
        adv = centred / (var.sqrt() + 1e-4)
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

    NaN rewards are left out (advantage 0, with a warning); a group with fewer than two finite
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
