"""Gauss–Legendre on [0, 1]: the N = 3 rule of GDPO's SDMC (arXiv 2510.08554 §4) and exactness for
degree 2N − 1."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.estimators import gauss_legendre_unit
from tests.tolerances import NODE_TOL, rounding_tol

SPEC_DIGITS = 5e-5  # the spec prints t and w to 4 decimals: half a unit of the last


def test_three_nodes_match_gdpo_sdmc_rule():
    t, w = gauss_legendre_unit(3)
    assert t.dtype == w.dtype == torch.float64
    # t = 1/2 ∓ sqrt(3/5)/2, 1/2; w = 5/18, 8/18, 5/18.
    assert t.tolist() == pytest.approx([0.5 - math.sqrt(0.6) / 2, 0.5, 0.5 + math.sqrt(0.6) / 2], abs=NODE_TOL)
    assert w.tolist() == pytest.approx([5 / 18, 8 / 18, 5 / 18], abs=NODE_TOL)
    assert t.tolist() == pytest.approx([0.1127, 0.5, 0.8873], abs=SPEC_DIGITS)
    assert w.tolist() == pytest.approx([0.2778, 0.4444, 0.2778], abs=SPEC_DIGITS)


def test_one_and_two_nodes():
    t, w = gauss_legendre_unit(1)
    assert t.tolist() == [0.5] and w.tolist() == [1.0]
    t, w = gauss_legendre_unit(2)
    assert t.tolist() == pytest.approx([0.5 - 0.5 / math.sqrt(3), 0.5 + 0.5 / math.sqrt(3)], abs=NODE_TOL)
    assert w.tolist() == pytest.approx([0.5, 0.5], abs=NODE_TOL)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16])
def test_polynomials_up_to_degree_2n_minus_1_are_integrated_exactly(n):
    t, w = gauss_legendre_unit(n)
    assert (t[1:] > t[:-1]).all() and (t > 0).all() and (t < 1).all()
    # Σ w t^d moves by ≤ d·NODE_TOL·Σ w t^(d-1) (the nodes; = NODE_TOL·d/d) + NODE_TOL·Σ t^d (the weights; ≤ n)
    # and d + 1 roundings per term, n for the sum: ≤ (n + 1)·NODE_TOL + (d + 1 + n)·eps absolute
    def tol(d):
        return (n + 1) * NODE_TOL + rounding_tol(scale=1, n=d + 1 + n, dtype=torch.float64)

    for degree in range(2 * n):
        assert float((w * t**degree).sum()) == pytest.approx(1 / (degree + 1), rel=0, abs=tol(degree))
    # and not degree 2N: the rule's remainder for t^{2N} on [0, 1] is (N!)^4 / ((2N + 1) ((2N)!)^2), exactly
    remainder = math.factorial(n) ** 4 / ((2 * n + 1) * math.factorial(2 * n) ** 2)
    assert 1 / (2 * n + 1) - float((w * t ** (2 * n)).sum()) == pytest.approx(remainder, abs=tol(2 * n))
    if n <= 4:  # (visible far above the rounding for small N)
        assert remainder > 1e3 * tol(2 * n)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_invalid_node_counts_raise(bad):
    with pytest.raises(ValueError, match="n must be"):
        gauss_legendre_unit(bad)
