"""GDPO loss and Schulman KL estimators, on three rows computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives import gdpo_loss, kl_estimate
from tests.objectives.util import F32_RTOL, F32_TOL
from tests.tolerances import rounding_tol

LENGTHS = torch.tensor([4, 2, 5])
ELBO_OLD = torch.tensor([-8.0, -4.0, -10.0])
ADV = torch.tensor([1.0, -0.5, 2.0])


def elbo_new():
    # log r = (new - old) / L = 0.8/4, -0.6/2, -0.5/5 = 0.2, -0.3, -0.1
    return torch.tensor([-7.2, -4.6, -10.5], requires_grad=True)


def test_three_rows_by_hand():
    new = elbo_new()
    loss, metrics = gdpo_loss(new, ELBO_OLD, ADV, LENGTHS, epsilon=0.2)
    # r = 1.2214028, 0.7408182, 0.9048374
    # row 0: A = 1,    min(1.2214028, 1.2)            = 1.2        (clipped high)
    # row 1: A = -0.5, min(-0.3704091, 0.8 * -0.5)    = -0.4       (clipped low)
    # row 2: A = 2,    min(1.8096748, 1.8096748)      = 1.8096748
    # loss = -(1.2 - 0.4 + 1.8096748) / 3 = -0.8698916
    assert loss.item() == pytest.approx(-0.8698916, abs=F32_TOL, rel=F32_RTOL)
    assert metrics["ratio_mean"] == pytest.approx(0.9556861, abs=F32_TOL, rel=F32_RTOL)
    assert metrics["ratio_min"] == pytest.approx(0.7408182, abs=F32_TOL, rel=F32_RTOL)
    assert metrics["ratio_max"] == pytest.approx(1.2214028, abs=F32_TOL, rel=F32_RTOL)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 3)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 3)
    assert metrics["kl"] == 0.0
    assert all(isinstance(v, float) for v in metrics.values())
    loss.backward()
    # clipped rows get no gradient; row 2: -(1/3) A r / L = -(1/3) * 2 * 0.9048374 / 5 = -0.1206450
    assert new.grad.tolist() == pytest.approx([0.0, 0.0, -0.1206450], abs=F32_TOL, rel=F32_RTOL)


def test_asymmetric_clip_range():
    loss, metrics = gdpo_loss(elbo_new(), ELBO_OLD, ADV, LENGTHS, epsilon=0.2, epsilon_high=0.3)
    # row 0 now inside [0.8, 1.3]: -(1.2214028 - 0.4 + 1.8096748) / 3 = -0.8770259
    assert loss.item() == pytest.approx(-0.8770259, abs=F32_TOL, rel=F32_RTOL)
    assert metrics["clip_frac_high"] == 0.0 and metrics["clip_frac_low"] == pytest.approx(1 / 3)


def test_k3_term_by_hand():
    ref = torch.tensor([-8.4, -4.0, -9.0])
    loss, metrics = gdpo_loss(elbo_new(), ELBO_OLD, ADV, LENGTHS, epsilon=0.2, beta=0.1, elbo_ref=ref)
    # Δ/L = (ref - new)/L = -1.2/4, 0.6/2, 1.5/5 = -0.3, 0.3, 0.3
    # k3(-0.3) = e^-0.3 + 0.3 - 1 = 0.0408182; k3(0.3) = e^0.3 - 0.3 - 1 = 0.0498588
    # mean = (0.0408182 + 2 * 0.0498588) / 3 = 0.0468453
    assert metrics["kl"] == pytest.approx(0.0468453, abs=F32_TOL, rel=F32_RTOL)
    assert loss.item() == pytest.approx(-0.8698916 + 0.1 * 0.0468453, abs=F32_TOL, rel=F32_RTOL)
    # without length normalisation: Δ = -1.2, 0.6, 1.5
    _, raw = gdpo_loss(
        elbo_new(), ELBO_OLD, ADV, LENGTHS, 0.2, beta=0.1, elbo_ref=ref, kl_length_normalized=False
    )
    expected = sum(math.exp(d) - d - 1 for d in (-1.2, 0.6, 1.5)) / 3
    # (k3 at |Δ| ≤ 1.5 in float32: exp ≤ 1 ulp of e^1.5 ≈ 4.5, two roundings more, a mean of 3: ≤ 8 ulps of 4.5)
    assert raw["kl"] == pytest.approx(expected, abs=rounding_tol(scale=4.5, n=8))


def test_gradient_signs():
    # A > 0 and r inside the clip range: raising the ELBO lowers the loss.
    new = torch.tensor([-8.1], requires_grad=True)
    loss, _ = gdpo_loss(new, torch.tensor([-8.0]), torch.tensor([1.0]), torch.tensor([4]), epsilon=0.2)
    loss.backward()
    assert new.grad.item() < 0
    # KL alone (A = 0): gradient descent moves elbo_new toward elbo_ref from either side.
    new = torch.tensor([-7.0, -9.0], requires_grad=True)
    ref = torch.tensor([-8.0, -8.0])
    loss, _ = gdpo_loss(new, new.detach(), torch.zeros(2), torch.tensor([4, 4]), 0.2, beta=1.0, elbo_ref=ref)
    loss.backward()
    assert new.grad[0] > 0 and new.grad[1] < 0
    stepped = new.detach() - 1.0 * new.grad
    assert ((stepped - ref).abs() < (new.detach() - ref).abs()).all()


def test_rows_without_tokens_are_excluded():
    new = torch.tensor([-7.2, -4.6, -10.5, -3.0], requires_grad=True)
    old = torch.cat([ELBO_OLD, torch.tensor([0.0])])
    loss, metrics = gdpo_loss(
        new, old, torch.cat([ADV, torch.tensor([5.0])]), torch.tensor([4, 2, 5, 0]), epsilon=0.2
    )
    assert loss.item() == pytest.approx(-0.8698916, abs=F32_TOL, rel=F32_RTOL)
    assert metrics["ratio_max"] == pytest.approx(1.2214028, abs=F32_TOL, rel=F32_RTOL)
    loss.backward()
    assert new.grad[3].item() == 0.0
    new = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, metrics = gdpo_loss(
        new,
        torch.zeros(2),
        torch.ones(2),
        torch.zeros(2, dtype=torch.long),
        0.2,
        beta=0.1,
        elbo_ref=torch.zeros(2),
    )
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert new.grad.tolist() == [0.0, 0.0]
    assert metrics["ratio_mean"] == 1.0 and metrics["kl"] == 0.0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="elbo_ref"):
        gdpo_loss(elbo_new(), ELBO_OLD, ADV, LENGTHS, 0.2, beta=0.1)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        gdpo_loss(elbo_new(), ELBO_OLD[:2], ADV, LENGTHS, 0.2)


def test_kl_estimators_by_hand():
    logp_new = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    logp_ref = torch.tensor([[-1.5, -1.0], [-0.5, -2.0]])
    delta = [[-0.5, 1.0], [0.0, 1.0]]
    k1 = kl_estimate(logp_new, logp_ref, "k1")
    assert k1.flatten().tolist() == [0.5, -1.0, 0.0, -1.0]  # (exact: differences of these floats are representable)
    k2 = kl_estimate(logp_new, logp_ref, "k2")
    assert k2.flatten().tolist() == [0.125, 0.5, 0.0, 0.5]  # (Δ²/2: exact too)
    k3 = kl_estimate(logp_new, logp_ref)
    expected = [math.exp(d) - d - 1 for row in delta for d in row]
    # e^Δ − Δ − 1 in float32: exp within 1 ulp of e^Δ ≤ e, then two roundings at that size
    assert k3.shape == (2, 2) and k3.flatten().tolist() == pytest.approx(expected, abs=rounding_tol(math.e, 3))
    assert (k3 >= 0).all() and k3[1, 0].item() == 0.0
    k3.sum().backward()
    # d k3 / d logp_new = 1 - e^Δ: pushes logp_new up where ref is higher, down where lower
    assert logp_new.grad.flatten().tolist() == pytest.approx(
        [1 - math.exp(-0.5), 1 - math.e, 0.0, 1 - math.e], abs=F32_TOL, rel=F32_RTOL
    )
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(logp_new, logp_ref, "k4")
