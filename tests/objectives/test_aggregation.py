"""Loss aggregation modes on one batch computed by hand; padding never counts."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.aggregation import aggregate
from tests.objectives.util import close

T, F = True, False
MASK = torch.tensor([[T, T, T, T], [T, T, F, F], [F, F, F, F]])


def per_token():
    # padding holds garbage (7, NaN) that must never count
    return torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, math.nan], [7.0, 0.0, 0.0, 0.0]], requires_grad=True)


def test_each_mode_by_hand():
    # valid tokens: row 0 sums 10 over 4, row 1 sums 11 over 2, row 2 has none
    assert aggregate(per_token(), MASK, "grpo").item() == pytest.approx((2.5 + 5.5) / 2)
    assert aggregate(per_token(), MASK, "bnpo").item() == pytest.approx(21 / 6)
    assert aggregate(per_token(), MASK, "dapo").item() == pytest.approx(21 / 6)
    assert aggregate(per_token(), MASK, "dapo", num_tokens=12).item() == pytest.approx(21 / 12)
    assert aggregate(per_token(), MASK, "dr_grpo").item() == pytest.approx(21 / (3 * 4))
    assert aggregate(per_token(), MASK, "dr_grpo", max_completion_length=7).item() == pytest.approx(21 / 21)
    ids = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    # row 0: segment means 1 and 3 -> 2; row 1: 5 and 6 -> 5.5; mean over rows 3.75
    assert aggregate(per_token(), MASK, "segment_mean", segment_ids=ids).item() == pytest.approx(3.75)


def test_gradients_respect_the_mask():
    x = per_token()
    aggregate(x, MASK, "grpo").backward()
    # d/dx = 1 / (rows with tokens · tokens of the row)
    assert close(x.grad, [[1 / 8] * 4, [1 / 4, 1 / 4, 0, 0], [0] * 4])
    x = per_token()
    aggregate(x, MASK, "dapo", num_tokens=12).backward()
    assert close(x.grad, [[1 / 12] * 4, [1 / 12, 1 / 12, 0, 0], [0] * 4])


def test_nothing_valid_gives_a_connected_zero():
    x = torch.ones(2, 3, requires_grad=True)
    none = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("grpo", "bnpo", "dapo", "dr_grpo"):
        loss = aggregate(x, none, mode)
        assert loss.item() == 0.0 and loss.requires_grad
    loss = aggregate(x, none, "segment_mean", segment_ids=torch.zeros(2, 3, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and x.grad.abs().sum() == 0


def test_errors():
    with pytest.raises(ValueError, match="loss_type"):
        aggregate(per_token(), MASK, "token_mean")
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate(per_token(), MASK, "dapo", num_tokens=0)
    with pytest.raises(ValueError, match="segment_ids"):
        aggregate(per_token(), MASK, "segment_mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(per_token(), MASK, "dr_grpo", max_completion_length=0)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo", "sequence_sum"])
def test_an_empty_batch_aggregates_to_zero_not_nan(loss_type):
    per_token = torch.zeros(0, 4, requires_grad=True)
    out = aggregate(per_token, torch.zeros(0, 4, dtype=torch.bool), loss_type)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(out)
