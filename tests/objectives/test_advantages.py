"""Group advantages (GRPO arXiv 2402.03300 §4.1.2, Dr. GRPO arXiv 2503.20783 §3, RLOO arXiv 2402.14740;
TRL's ``scale_rewards``) on hand-computed tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives import group_advantages, rloo_advantages
from tests.objectives.util import F32_RTOL, F32_TOL


def approx(values):
    return pytest.approx(values, abs=F32_TOL, rel=F32_RTOL)


def test_two_groups_of_two_all_scalings():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # means 0.5, 0.5; R - mean = ±0.5
    assert group_advantages(rewards, 2, "none").tolist() == approx([0.5, -0.5, -0.5, 0.5])
    # Bessel std of (1, 0) is sqrt(0.5) = 0.7071068; 0.5 / 0.7072068 = 0.7070068
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert group_advantages(rewards, 2, "group").tolist() == approx([a, -a, -a, a])
    # Bessel std over the whole batch (1, 0, 0, 1): sqrt(1/3) = 0.5773503
    b = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert group_advantages(rewards, 2, "batch").tolist() == approx([b, -b, -b, b])


def test_group_of_four_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    # mean 3, deviations -2, -1, 0, 3, Bessel var (4 + 1 + 0 + 9) / 3 = 14/3
    std = math.sqrt(14 / 3)
    expected = [d / (std + 1e-4) for d in (-2.0, -1.0, 0.0, 3.0)]
    out = group_advantages(rewards, 4)
    assert out.dtype == torch.float32 and out.shape == (4,)
    assert out.tolist() == approx(expected)


def test_equal_rewards_give_exactly_zero():
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 0.5])
    for scale in ("group", "batch", "none"):
        out = group_advantages(rewards, 3, scale)
        assert out[:6].tolist() == [0.0] * 6
        assert torch.isfinite(out).all()
    assert rloo_advantages(rewards, 3)[:6].tolist() == [0.0] * 6


def test_nan_rewards_are_excluded_with_a_warning():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    with pytest.warns(UserWarning, match="NaN"):
        out = group_advantages(rewards, 4, "none")
    # finite rewards 1, 0, 1: mean 2/3
    assert out.tolist() == approx([1 / 3, 0.0, -2 / 3, 1 / 3])
    with pytest.warns(UserWarning, match="NaN"):
        out = group_advantages(rewards, 4, "group")
    # Bessel std of (1, 0, 1): sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3) + 1e-4
    assert out.tolist() == approx([1 / 3 / s, 0.0, -2 / 3 / s, 1 / 3 / s])
    with pytest.warns(UserWarning, match="NaN"):
        out = group_advantages(torch.tensor([float("nan"), 3.0, 1.0, 2.0]), 2, "group")
    assert out[:2].tolist() == [0.0, 0.0]  # one finite reward left: a group of one
    assert torch.isfinite(out).all()


def test_groups_of_one_get_zero_and_shapes_are_checked():
    assert group_advantages(torch.tensor([1.0, 5.0, -2.0]), 1).tolist() == [0.0, 0.0, 0.0]
    assert rloo_advantages(torch.tensor([1.0, 5.0]), 1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="not divisible"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(torch.tensor([1.0, 0.0]), 2, "std")


def test_rloo_by_hand():
    assert rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2).tolist() == approx([1.0, -1.0, -1.0, 1.0])
    # (1, 2, 6): 1 - 4, 2 - 3.5, 6 - 1.5
    assert rloo_advantages(torch.tensor([1.0, 2.0, 6.0]), 3).tolist() == approx([-3.0, -1.5, 4.5])


def test_hapo_token_group_average_by_hand():
    from dlmrl.objectives import hapo_token_group_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0])
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    # tokens carry rewards 1 | 0 0 | 0 0 0: μ = 1/6, population σ = sqrt(5/36)
    mu, sigma = 1 / 6, math.sqrt(5 / 36)
    expected = [(1 - mu) / (sigma + 1e-6), -mu / (sigma + 1e-6), -mu / (sigma + 1e-6)]
    assert hapo_token_group_advantages(rewards, 3, mask).tolist() == approx(expected)


def test_hapo_falls_back_to_the_group_advantage():
    from dlmrl.objectives import hapo_token_group_advantages

    # 1 token with reward 1 against 30 with reward 0: μ = 1/31, σ = sqrt(30)/31, A_0 = sqrt(30) ≈ 5.48 >= 5
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0, 0] = True
    mask[1] = True
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert hapo_token_group_advantages(torch.tensor([1.0, 0.0]), 2, mask).tolist() == approx([a, -a])
    # equal rewards: exactly 0; a row without tokens gets 0
    mask = torch.tensor([[True, True], [True, False], [True, True], [False, False], [True, True], [True, True]])
    out = hapo_token_group_advantages(torch.tensor([0.3, 0.3, 0.3, 1.0, 0.0, 0.5]), 3, mask)
    # second group: the token-less row 3 gets 0 and is left out; (0, 0, 0.5, 0.5): μ = 0.25, σ = 0.25
    assert out.tolist() == approx([0.0, 0.0, 0.0, 0.0, -0.25 / 0.250001, 0.25 / 0.250001])


def test_flow_grpo_trajectory_and_turn_weighted():
    from dlmrl.objectives import flow_grpo_advantages

    # question 0: trajectory 0 (R=1, three turns), trajectory 1 (R=0, one turn);
    # question 1: two trajectories with R=0.5 (equal: advantage 0)
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5])
    traj = torch.tensor([0, 0, 0, 1, 2, 2, 3])
    question = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # trajectories (1, 0): mean 0.5, Bessel std sqrt(0.5)
    assert flow_grpo_advantages(rewards, traj, question).tolist() == approx([a, a, a, -a, 0, 0, 0])
    # turns (1, 1, 1, 0): mean 0.75, Bessel std 0.5
    expected = [0.25 / 0.5001] * 3 + [-0.75 / 0.5001, 0, 0, 0]
    assert flow_grpo_advantages(rewards, traj, question, turn_weighted=True).tolist() == approx(expected)
    with pytest.raises(ValueError, match="same reward"):
        flow_grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([0, 0]))


def test_zscore_by_ids_any_order_and_size():
    from dlmrl.objectives.advantages import zscore_by_ids

    out = zscore_by_ids(torch.tensor([1.0, 5.0, 0.0, 2.0, 5.0]), torch.tensor([3, 9, 3, 3, 9]))
    # group 3: (1, 0, 2), mean 1, Bessel std 1; group 9: equal -> 0
    assert out.tolist() == approx([0.0, 0.0, -1 / 1.0001, 1 / 1.0001, 0.0])
