"""GTPO token advantages and GRPO-S sequence advantages, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.token_rewards import grpo_s_advantages, gtpo_advantages
from tests.objectives.util import F32_RTOL, F32_TOL, close

T, F = True, False


def zscore(xs):
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    return [(x - m) / (s + 1e-6) for x in xs]


def test_gtpo_two_successes_one_failure():
    rewards = torch.tensor([1.0, 1.0, 0.0])
    entropy = torch.tensor([[3.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    adv = gtpo_advantages(rewards, 3, entropy, torch.ones(3, 2, dtype=torch.bool))
    # O+ at t=0: 1 + 0.1·(3/4)·2 = 1.15 and 1 + 0.1·(1/4)·2 = 1.05; at t=1 the reverse
    pos = zscore([1.15, 1.05, 1.05, 1.15])
    # O-: one failed response, share 1, h_t = 1: -1 - 0.1 = -1.1 on both tokens -> z-score 0
    assert close(adv, [[pos[0], pos[1]], [pos[2], pos[3]], [0.0, 0.0]])
    assert adv[0, 0].item() == pytest.approx(0.05 / (0.05 + 1e-6), abs=F32_TOL, rel=F32_RTOL)


def test_gtpo_lengths_and_inverse_entropy():
    rewards = torch.tensor([1.0, 0.0, 0.0])
    entropy = torch.tensor([[1.0, 1.0], [4.0, 1.0], [1.0, 123.0]])
    mask = torch.tensor([[T, T], [T, T], [T, F]])
    adv = gtpo_advantages(rewards, 3, entropy, mask)
    # O+ alone: 1.1 on both tokens -> 0. O-, t=0: inv 0.25 and 1, sum 1.25, h_0 = 2:
    #   -1 - 0.1·(0.25/1.25)·2 = -1.04 and -1 - 0.1·(1/1.25)·2 = -1.16; t=1: row 1 alone: -1.1
    neg = zscore([-1.04, -1.1, -1.16])
    assert close(adv, [[0.0, 0.0], [neg[0], neg[1]], [neg[2], 0.0]])
    assert neg[0] == pytest.approx(0.06 / (math.sqrt(0.0024) + 1e-6))


def test_gtpo_equal_rewards_nan_and_zero_entropy():
    entropy = torch.tensor([[3.0, 1.0], [1.0, 3.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    adv = gtpo_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2, entropy, mask)
    assert adv[:2].tolist() == [[0.0, 0.0], [0.0, 0.0]]  # equal rewards: exactly 0
    # second group: zero successful entropy -> uniform shares; one token set each -> finite
    assert torch.isfinite(adv).all()
    with pytest.warns(UserWarning, match="NaN"):
        adv = gtpo_advantages(torch.tensor([1.0, float("nan"), 0.0, 1.0]), 2, entropy, mask)
    assert adv[0].tolist() == [0.0, 0.0] and adv[1].tolist() == [0.0, 0.0]


def test_grpo_s_by_hand():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    entropy = torch.tensor([[3.0, 3.0], [1.0, 1.0], [2.0, 2.0], [0.5, 9.0]])
    mask = torch.tensor([[T, T], [T, T], [T, T], [T, F]])
    adv = grpo_s_advantages(rewards, 4, entropy, mask)
    # mean entropies 3, 1, 2, 0.5. O+: 1 + 0.1·(3/4)·2 = 1.15, 1 + 0.1·(1/4)·2 = 1.05
    # O-: inverses 0.5, 2 (sum 2.5): -1 - 0.1·(0.5/2.5)·2 = -1.04, -1 - 0.1·(2/2.5)·2 = -1.16
    expected = zscore([1.15, 1.05]) + zscore([-1.04, -1.16])
    assert close(adv, expected)
    assert grpo_s_advantages(torch.tensor([0.0, 0.0]), 2, entropy[:2], mask[:2]).tolist() == [0.0, 0.0]
