"""KL terms per token and per sequence; gradients move the policy toward the reference."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.kl import kl_term
from tests.objectives.util import close

T, F = True, False
NEW = [[-1.0, -2.0], [-0.5, -3.0]]
REF = torch.tensor([[-1.5, -1.0], [-0.5, -9.0]])
MASK = torch.tensor([[T, T], [T, F]])


def k3(d):
    return math.exp(d) - d - 1


def test_levels_by_hand():
    new = torch.tensor(NEW)
    # Δ = ref - new: row 0 (-0.5, 1.0), row 1 (0.0, padding)
    assert close(kl_term(new, REF, MASK), [[k3(-0.5), k3(1.0)], [0.0, 0.0]])
    # sequence: Δ_0 = mean(-0.5, 1.0) = 0.25, Δ_1 = 0
    assert close(kl_term(new, REF, MASK, level="sequence"), [[k3(0.25)] * 2, [0.0, 0.0]])
    assert close(kl_term(new, REF, MASK, level="sequence_sum"), [[k3(0.5)] * 2, [0.0, 0.0]])
    assert close(kl_term(new, REF, MASK, "k2"), [[0.125, 0.5], [0.0, 0.0]])
    assert close(kl_term(new, REF, MASK, "k1"), [[0.5, -1.0], [0.0, 0.0]])


@pytest.mark.parametrize("kind", ["k2", "k3"])
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_sum"])
def test_gradient_descent_moves_toward_the_reference(kind, level):
    new = torch.tensor([[-1.0, -1.2], [-3.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5], [-2.0, -1.0]])  # row 0 above, row 1 below the reference on average
    mask = torch.ones(2, 2, dtype=torch.bool)
    kl_term(new, ref, mask, kind, level).sum().backward()
    stepped = new.detach() - 0.1 * new.grad
    if level == "token":
        assert ((stepped - ref).abs() < (new.detach() - ref).abs()).all()
    else:
        before = (new.detach() - ref).sum(-1).abs()
        after = (stepped - ref).sum(-1).abs()
        assert (after < before).all()


def test_errors():
    with pytest.raises(ValueError, match="KL level"):
        kl_term(torch.tensor(NEW), REF, MASK, level="row")
    with pytest.raises(ValueError, match="kind"):
        kl_term(torch.tensor(NEW), REF, MASK, kind="k4")
