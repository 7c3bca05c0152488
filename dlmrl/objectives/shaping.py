"""Reward shaping and group filtering: DAPO's soft overlong punishment and dynamic-sampling filter,
SRPO's residual-sensitive graded reward."""

from __future__ import annotations

import torch

from dlmrl.objectives.advantages import _all_equal, _grouped

SRPO_LEVEL_REWARDS = (0.0, 0.5, 0.707, 0.866, 0.95)  # by leading levels matched: 0, 1, 2, 3, >= 4


def soft_overlong_punishment(lengths: torch.Tensor, max_length: int, cache_length: int) -> torch.Tensor:
    """DAPO's length penalty, added to the task reward.

    ``0`` for ``|y| <= L_max − L_cache``; ``((L_max − L_cache) − |y|) / L_cache`` for
    ``L_max − L_cache < |y| <= L_max`` (linear from 0 down to −1); ``−1`` past ``L_max``.

    Args:
        lengths: ``(B,)`` completion lengths in tokens (up to and including EOS).
        max_length: ``L_max``. cache_length: ``L_cache``, ``1 <= L_cache <= L_max``.
    Returns:
        ``(B,)`` float32 penalties in [−1, 0].
    Raises:
        ValueError: on an invalid ``L_max`` / ``L_cache``.

    Reference: DAPO arXiv 2503.14476 §3.4 (soft overlong punishment).
    """
    if not 1 <= cache_length <= max_length:
        raise ValueError(f"need 1 <= cache_length <= max_length, got {cache_length}, {max_length}")
    y = torch.as_tensor(lengths).double()
    start = max_length - cache_length
    pen = torch.where(y <= start, 0.0, (start - y) / cache_length)
    return torch.where(y > max_length, -1.0, pen).float()


def dynamic_sampling_keep(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """DAPO's dynamic-sampling filter: keep the groups whose finite rewards are not all equal.

    The trainer keeps sampling (new prompts) until it has enough kept groups, then trains on them;
    a dropped group would carry zero advantage anyway. A group with fewer than two finite rewards is
    dropped.

    Args:
        rewards: ``(B,)`` float, ``B = num_prompts · G``. num_generations: G.
    Returns:
        ``(B/G,)`` bool, True for a group to keep.

    Reference: DAPO arXiv 2503.14476 §3.2 (dynamic sampling: keep ``0 < |{correct}| < G``,
    generalised to non-binary rewards).
    """
    r, valid = _grouped(rewards, num_generations)
    return ~_all_equal(r, valid).squeeze(-1)


def srpo_graded_reward(levels_matched: int, exact: bool, format_ok: bool = True) -> float:
    """SRPO's residual-sensitive graded reward.

    Exact match: 1.0. Otherwise by the number of leading levels matched: 0 → 0, 1 → 0.5, 2 → 0.707,
    3 → 0.866, ``>= 4`` → 0.95. 0 whenever the format gate fails.

    Args:
        levels_matched: leading levels (e.g. hierarchy codes) that match the gold answer (>= 0).
        exact: the whole answer matches.
        format_ok: the answer passed the format gate.
    Returns:
        The reward in [0, 1].

    Reference: SRPO / GREAM arXiv 2510.20815 (authors' code).
    """
    if levels_matched < 0:
        raise ValueError(f"levels_matched must be >= 0, got {levels_matched}")
    if not format_ok:
        return 0.0
    if exact:
        return 1.0
    return SRPO_LEVEL_REWARDS[min(int(levels_matched), 4)]
