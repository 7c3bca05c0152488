"""Group advantages (SPEC §4) on hand-computed tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives import group_advantages, rloo_advantages


def approx(values):
    return pytest.approx(values, abs=1e-6)


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
