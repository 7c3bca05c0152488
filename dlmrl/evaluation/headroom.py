"""What a group of sampled completions leaves for a policy-gradient update: statistics of one prompt's rewards.

Group-relative methods (GRPO, arXiv 2402.03300, and its family) move a prompt's probability toward the completions of
its group of ``G`` that scored above the group's mean; re-weighting the samples a model already draws cannot take
its mean reward past what its best samples score. For a graded reward, the expected best of ``G`` draws plays the
role pass@k plays for a 0/1 reward (Yue et al. 2025, arXiv 2504.13837, measure RL against the base model's
pass@k); how much the rewards of one group differ says how large the group-normalised advantages can be.

Each function reads ``n`` rewards of one prompt's completions, sampled independently, and estimates a statistic of a
group of ``k <= n`` of them without bias, as the unbiased pass@k estimator does (Chen et al. 2021, arXiv 2107.03374,
§2.1): by averaging over every ``k``-subset of the ``n`` draws, in closed form.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def _check(rewards: Sequence[float], k: int) -> int:
    n = len(rewards)
    if k < 1 or k > n:
        raise ValueError(f"k must be between 1 and the number of rewards {n}, got {k}")
    return n


def expected_best_of_k(rewards: Sequence[float], k: int) -> float:
    """Unbiased estimate of ``E[max of k draws]`` from ``n >= k`` i.i.d. draws: the mean, over every ``k``-subset
    of the draws, of its largest reward. In closed form, with ``r_(1) <= ... <= r_(n)`` the sorted rewards, the
    ``i``-th smallest is the largest of ``C(i-1, k-1)`` of the ``C(n, k)`` subsets (ties broken by position, which
    leaves the value unchanged): ``Σ_i C(i-1, k-1) / C(n, k) · r_(i)``. ``k = 1`` gives the mean, ``k = n`` the
    maximum. (The graded-reward form of the pass@k estimator of Chen et al. 2021, arXiv 2107.03374, §2.1; ours.)

    Args:
        rewards: ``n`` float rewards of one prompt's completions. k: the group size, ``1 <= k <= n``.
    Raises:
        ValueError: ``k`` outside ``[1, n]``.
    """
    n = _check(rewards, k)
    total = math.comb(n, k)
    # (each weight an exact integer ratio before it meets a float: C(n, k) overflows a float for n in the thousands)
    return sum(math.comb(i - 1, k - 1) / total * r for i, r in enumerate(sorted(rewards), start=1) if i >= k)


def tied_group_probability(rewards: Sequence[float], k: int) -> float:
    """Unbiased estimate of the probability that ``k`` draws all have the same reward (a group whose
    group-normalised advantages are all zero: no gradient from that prompt): the share of the ``C(n, k)``
    ``k``-subsets of the ``n`` draws whose rewards are all equal, ``Σ_v C(c_v, k) / C(n, k)`` over the distinct
    values ``v`` drawn ``c_v`` times. Equality is exact float equality (graded rewards such as a Sudoku grid's cell
    accuracy take a few exact values).

    Raises:
        ValueError: ``k`` outside ``[1, n]``.
    """
    n = _check(rewards, k)
    return sum(math.comb(c, k) for c in Counter(rewards).values()) / math.comb(n, k)
