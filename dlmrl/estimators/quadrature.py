"""Quadrature rules on the unit interval, for integrating the ELBO integrand g(t) over t ∈ [0, 1]."""

from __future__ import annotations

import torch
from scipy.special import roots_legendre


def gauss_legendre_unit(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss–Legendre nodes and weights mapped from [-1, 1] to [0, 1].

    ``t_n = (x_n + 1) / 2`` and ``w_n = ω_n / 2``, sorted by ascending ``t``; the rule integrates
    polynomials of degree ``2n − 1`` exactly and ``Σ_n w_n = 1``. For ``n = 3``:
    ``t = 0.1127, 0.5, 0.8873``, ``w = 0.2778, 0.4444, 0.2778``.

    Args:
        n: number of nodes N, at least 1.
    Returns:
        ``(t (N,) float64, w (N,) float64)`` tensors.
    Raises:
        ValueError: if ``n < 1``.

    Reference: GDPO arXiv 2510.08554 §4 (SDMC); ``scipy.special.roots_legendre``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"gauss_legendre_unit: n must be an integer >= 1, got {n!r}")
    x, omega = roots_legendre(n)
    t = torch.as_tensor((x + 1.0) / 2.0, dtype=torch.float64)
    w = torch.as_tensor(omega / 2.0, dtype=torch.float64)
    order = torch.argsort(t)
    return t[order], w[order]
