"""Ratio levels (token: GRPO arXiv 2402.03300; sequence and sequence-token: GSPO arXiv 2507.18071):
values and gradients by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.ratios import log_ratio, sequence_log_ratio
from tests.objectives.util import close

T, F = True, False
MASK = torch.tensor([[T, T, T], [T, T, F]])
OLD = torch.tensor([[-1.2, -1.5, -0.5], [-1.0, -0.2, -3.0]])
# logp_new - logp_old = [[0.2, -0.5, 0.0], [-0.5, 0.0, (padding)]]
NEW = [[-1.0, -2.0, -0.5], [-1.5, -0.2, -7.0]]
C = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # loss = Σ C · log r, to read gradients


def run(level, segment_ids=None):
    new = torch.tensor(NEW, requires_grad=True)
    old = OLD.clone().requires_grad_(True)
    lr = log_ratio(level, new, old, MASK, segment_ids)
    (C * lr).sum().backward()
    assert old.grad is None or (old.grad == 0).all()
    return lr.detach(), new.grad


def test_token_level():
    lr, grad = run("token")
    assert close(lr, [[0.2, -0.5, 0.0], [-0.5, 0.0, 0.0]])
    assert grad.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]]


def test_sequence_level_mean_inside_exponent():
    lr, grad = run("sequence")
    # row 0: (0.2 - 0.5 + 0)/3 = -0.1; row 1: (-0.5 + 0)/2 = -0.25
    assert close(lr, [[-0.1] * 3, [-0.25, -0.25, 0.0]])
    # the gradient flows through the mean: (Σ_t C_t) / |y| on every valid token
    assert close(grad, [[2.0, 2.0, 2.0], [4.5, 4.5, 0.0]])
    seq = sequence_log_ratio(torch.tensor(NEW), OLD, MASK)
    assert close(seq, [-0.1, -0.25])


def test_sequence_token_value_of_sequence_gradient_per_token():
    lr, grad = run("sequence_token")
    assert close(lr, [[-0.1] * 3, [-0.25, -0.25, 0.0]])
    assert grad.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]]


@pytest.mark.parametrize("level", ["sentence", "entropy_group"])
def test_segment_levels_use_the_segment_mean(level):
    ids = torch.tensor([[0, 0, 1], [0, 1, 1]])
    lr, grad = run(level, ids)
    # row 0: segment 0 mean (0.2 - 0.5)/2 = -0.15, segment 1: 0; row 1: segment 0: -0.5, segment 1: 0
    assert close(lr, [[-0.15, -0.15, 0.0], [-0.5, 0.0, 0.0]])
    assert grad.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]]
    # the ratio of a segment is the geometric mean of its token ratios
    assert math.exp(lr[0, 0]) == pytest.approx(math.sqrt(math.exp(0.2) * math.exp(-0.5)))


def test_padding_with_infinite_log_probs_stays_finite():
    new = torch.tensor([[-1.0, -float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.5, -float("inf")]])
    mask = torch.tensor([[T, F]])
    for level in ("token", "sequence", "sequence_token"):
        new.grad = None
        lr = log_ratio(level, new, old, mask)
        assert torch.isfinite(lr).all()
        lr.sum().backward()
        assert torch.isfinite(new.grad).all() and new.grad[0, 1] == 0


def test_errors():
    with pytest.raises(ValueError, match="segment_ids"):
        log_ratio("sentence", torch.zeros(2, 3), OLD, MASK)
    with pytest.raises(ValueError, match="ratio level"):
        log_ratio("tokens", torch.zeros(2, 3), OLD, MASK)
    with pytest.raises(ValueError, match="shape"):
        log_ratio("token", torch.zeros(2, 2), OLD, MASK)
