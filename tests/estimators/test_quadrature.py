"""Gauss–Legendre on [0, 1]: the N = 3 rule of GDPO's SDMC (arXiv 2510.08554 §4) and exactness for
degree 2N − 1."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.estimators import gauss_legendre_unit


def test_three_nodes_match_gdpo_sdmc_rule():
    t, w = gauss_legendre_unit(3)
    assert t.dtype == w.dtype == torch.float64
    # t = 1/2 ∓ sqrt(3/5)/2, 1/2; w = 5/18, 8/18, 5/18.
    assert t.tolist() == pytest.approx([0.5 - math.sqrt(0.6) / 2, 0.5, 0.5 + math.sqrt(0.6) / 2], abs=1e-12)
    assert w.tolist() == pytest.approx([5 / 18, 8 / 18, 5 / 18], abs=1e-12)
    assert t.tolist() == pytest.approx([0.1127, 0.5, 0.8873], abs=1e-4)
    assert w.tolist() == pytest.approx([0.2778, 0.4444, 0.2778], abs=1e-4)


def test_one_and_two_nodes():
    t, w = gauss_legendre_unit(1)
    assert t.tolist() == [0.5] and w.tolist() == [1.0]
    t, w = gauss_legendre_unit(2)
    assert t.tolist() == pytest.approx([0.5 - 0.5 / math.sqrt(3), 0.5 + 0.5 / math.sqrt(3)], abs=1e-12)
    assert w.tolist() == pytest.approx([0.5, 0.5], abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16])
def test_polynomials_up_to_degree_2n_minus_1_are_integrated_exactly(n):
    t, w = gauss_legendre_unit(n)
    assert (t[1:] > t[:-1]).all() and (t > 0).all() and (t < 1).all()
    for degree in range(2 * n):
        assert float((w * t**degree).sum()) == pytest.approx(1 / (degree + 1), rel=1e-12, abs=1e-14)
    if n <= 4:  # and not degree 2N (the error shrinks fast; visible for small N)
        assert float((w * t ** (2 * n)).sum()) != pytest.approx(1 / (2 * n + 1), rel=1e-6)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_invalid_node_counts_raise(bad):
    with pytest.raises(ValueError, match="n must be"):
        gauss_legendre_unit(bad)
