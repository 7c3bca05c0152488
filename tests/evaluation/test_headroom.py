"""The group statistics of ``dlmrl.evaluation.headroom`` against their definition: every k-subset enumerated."""

from __future__ import annotations

import itertools
import random

import pytest

from dlmrl.evaluation.headroom import expected_best_of_k, tied_group_probability


def _subsets(rewards, k):
    return list(itertools.combinations(rewards, k))


@pytest.mark.parametrize("seed", range(5))
def test_the_closed_forms_equal_the_mean_over_every_subset(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 9)
    # (a few distinct values, so ties occur, as with a Sudoku grid's cell accuracy)
    rewards = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(n)]
    for k in range(1, n + 1):
        subsets = _subsets(rewards, k)
        assert expected_best_of_k(rewards, k) == pytest.approx(sum(max(s) for s in subsets) / len(subsets), abs=1e-12)
        assert tied_group_probability(rewards, k) == pytest.approx(
            sum(len(set(s)) == 1 for s in subsets) / len(subsets), abs=1e-12)


def test_the_ends_by_hand():
    rewards = [0.2, 0.9, 0.5, 0.5]
    assert expected_best_of_k(rewards, 1) == pytest.approx(sum(rewards) / 4)
    assert expected_best_of_k(rewards, 4) == 0.9
    # k = 2: the six pairs' maxima 0.9, 0.5, 0.5, 0.9, 0.9, 0.5
    assert expected_best_of_k(rewards, 2) == pytest.approx((3 * 0.9 + 3 * 0.5) / 6)
    assert tied_group_probability(rewards, 2) == pytest.approx(1 / 6)  # (only the two 0.5s)
    assert tied_group_probability(rewards, 3) == 0.0


def test_a_group_larger_than_the_draws_is_refused():
    with pytest.raises(ValueError, match="k must be between 1 and the number of rewards 3"):
        expected_best_of_k([0.1, 0.2, 0.3], 4)
    with pytest.raises(ValueError, match="got 0"):
        tied_group_probability([0.1], 0)


def test_many_draws_do_not_overflow():
    """C(1100, 600) is far above a float's range; the weights are exact integer ratios, so the estimate is finite
    and lies between the mean and the maximum."""
    rng = random.Random(0)
    rewards = [rng.random() for _ in range(1100)]
    value = expected_best_of_k(rewards, 600)
    assert sum(rewards) / len(rewards) < value <= max(rewards)
