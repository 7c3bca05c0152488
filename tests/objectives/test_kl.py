"""KL terms per token and per sequence; gradients move the policy toward the reference."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.kl import kl_estimate, kl_term
from tests.objectives.util import close
from tests.tolerances import rounding_tol

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


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("delta", [88.5, 500.0, -500.0, 3.0e4])
def test_every_kl_estimator_is_finite_for_any_finite_log_ratio(kind, delta):
    """e^Δ overflows float32 past about 88 nats; ELBO terms weighted by L/k reach that. The loss and its
    gradient must stay finite (k3 is taken at Δ clamped to ±20, as verl does)."""
    new = torch.zeros(1, 2, requires_grad=True)
    ref = torch.full((1, 2), delta)
    mask = torch.ones(1, 2, dtype=torch.bool)
    kl = kl_term(new, ref, mask, kind, "token")
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(new.grad).all()
    if kind == "k3":
        bound = min(abs(delta), 20.0) * (1 if delta > 0 else -1)
        # float32 at Δ = ±20: exp within 1 ulp, the subtractions ≤ 2 more, relative to k3 ≈ e^20 (or ≈ 19)
        assert kl[0, 0].item() == pytest.approx(math.expm1(bound) - bound, rel=rounding_tol(scale=1, n=3))


def test_k3_is_unchanged_inside_the_bound():
    d = torch.tensor([-5.0, -0.1, 0.0, 0.3, 19.9], dtype=torch.float64)
    expected = torch.tensor([math.expm1(x) - x for x in d.tolist()], dtype=torch.float64)
    # float64, elementwise: exp within 1 ulp and two subtractions, each a rounding at the terms' size e^Δ + |Δ| + 1
    # (the reference's expm1 is exact to an ulp of k3 itself)
    got = kl_estimate(torch.zeros_like(d), d, "k3")
    tol = rounding_tol(scale=1, n=3, dtype=torch.float64) * (torch.exp(d) + d.abs() + 1)
    assert ((got - expected).abs() <= tol).all(), (got - expected, tol)


def test_the_logged_kl_is_the_unclamped_estimate_and_kl_loss_the_clamped_term():
    """Δ = logp_ref − logp_new = −50 nats on one token: k3 = e^−50 + 50 − 1 ≈ 49 is the estimate; the loss evaluates
    k3 at the 20-nat bound (19 + e^−20) with zero gradient beyond it. Both by hand."""
    from dlmrl.objectives import get_algorithm
    from dlmrl.objectives.gdpo import gdpo_loss

    new = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-51.0, -2.0]])  # (Δ = −50 on token 0, 0 on token 1)
    mask = torch.ones(1, 2, dtype=torch.bool)
    objective = get_algorithm("grpo").objective  # (β 0.04, token-level k3, grpo aggregation: the row's token mean)
    out = objective.compute(new, new.detach(), torch.ones(1), mask, logp_ref=ref)
    # the estimate is float64 and the loss term float32, each a few (≤ 8) roundings of values of size ≤ 50
    f64, f32 = rounding_tol(scale=1, n=8, dtype=torch.float64), rounding_tol(scale=1, n=8)
    assert out.metrics["kl"] == pytest.approx((math.exp(-50) + 49) / 2, rel=f64)
    assert out.metrics["kl_loss"] == pytest.approx((math.exp(-20) + 19) / 2, rel=f32)
    # GDPO's sequence-level k3 on ELBO sums (length-normalised over L = 2): Δ/L = −50 → the same pair of values
    elbo_new = torch.tensor([-2.0], requires_grad=True)
    _, metrics = gdpo_loss(elbo_new, elbo_new.detach(), torch.ones(1), torch.tensor([2]), 0.2, beta=0.1,
                           elbo_ref=torch.tensor([-102.0]))
    assert metrics["kl"] == pytest.approx(math.exp(-50) + 49, rel=f64)
    assert metrics["kl_loss"] == pytest.approx(math.exp(-20) + 19, rel=f32)
    # past float32's e^Δ range the estimate is still finite (float64), where float32 would give inf
    assert kl_estimate(torch.tensor([0.0]), torch.tensor([100.0]), clamp=False).item() == pytest.approx(
        math.expm1(100.0) - 100.0, rel=f64)
