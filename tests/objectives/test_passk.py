"""SRPO's pass@k bonus and bonus-calibrated advantage."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.passk import passk_bonus, srpo_passk_advantages
from tests.objectives.util import DECIMALS_6, close


def test_bonus_by_hand():
    # n = 8, c = 2, K = 4: C(6,4) = 15, C(8,4) = 70, C(5,3) = 10, C(7,3) = 35
    rho = 1 - 15 / 70
    sigma = math.sqrt(rho * (1 - rho))
    exact, other = passk_bonus(8, 2, 4)
    assert exact == pytest.approx((1 - rho) / (sigma + 1e-6))
    assert other == pytest.approx((1 - rho - 10 / 35) / (sigma + 1e-6))
    # (the values to 6 decimals, float64 here; the second was printed as -0.174078, one unit off its -0.1740772)
    assert exact == pytest.approx(0.522232, abs=DECIMALS_6) and other == pytest.approx(-0.174077, abs=DECIMALS_6)
    assert passk_bonus(3, 1, 4) == (0.0, 0.0)  # n < K
    assert passk_bonus(8, 0, 4) == (0.0, 0.0)  # ρ = 0, σ = 0
    assert passk_bonus(8, 8, 4) == (0.0, 0.0)  # ρ = 1, σ = 0
    assert passk_bonus(4, 1, 4) == (0.0, 0.0)  # C(3,4) = 0: ρ = 1
    with pytest.raises(ValueError):
        passk_bonus(4, 5, 4)


def test_srpo_advantage_by_hand():
    rewards = torch.tensor([1.0, 0.5, 0.0, 0.0])
    # group part: mean 0.375, deviations (0.625, 0.125, -0.375, -0.375), Bessel var 0.6875/3
    s = math.sqrt(0.6875 / 3) + 1e-4
    base = [d / s for d in (0.625, 0.125, -0.375, -0.375)]
    # bonus with K = 2, n = 4, c = 1: ρ = 1 - C(3,2)/C(4,2) = 0.5, σ = 0.5
    exact, other = 0.5 / 0.500001, (0.5 - 2 / 3) / 0.500001
    out = srpo_passk_advantages(rewards, 4, k=2)
    assert close(out, [base[0] + exact, base[1] + other, base[2] + other, base[3] + other])
    # explicit exact flags replace rewards >= 1
    flags = torch.tensor([False, True, False, False])
    out = srpo_passk_advantages(rewards, 4, exact=flags, k=2)
    assert close(out, [base[0] + other, base[1] + exact, base[2] + other, base[3] + other])


def test_equal_graded_rewards_give_exactly_zero():
    out = srpo_passk_advantages(torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]), 4, k=2)
    assert out.tolist() == [0.0] * 8
