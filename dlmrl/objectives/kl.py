"""Schulman's KL estimators between the policy and a reference."""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "k2", "k3")


def kl_estimate(logp_new: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-element estimate of ``KL(π_new ‖ π_ref)`` from log-probabilities of samples of ``π_new``.

    With ``Δ = logp_ref − logp_new``: ``k1 = −Δ``, ``k2 = Δ²/2``, ``k3 = e^Δ − Δ − 1`` (≥ 0,
    unbiased, GRPO's default). Minimising any of them moves ``logp_new`` toward ``logp_ref``.

    Args:
        logp_new: any shape, nats (differentiable).
        logp_ref: same shape, nats (treated as given; detach it upstream).
        kind: ``k1``, ``k2`` or ``k3``.
    Returns:
        Tensor of the input shape.

    Reference: J. Schulman, "Approximating KL divergence" (2020); GRPO arXiv 2402.03300 Eq. 4.
    """
    delta = logp_ref - logp_new
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta**2
    if kind == "k3":
        return torch.expm1(delta) - delta
    raise ValueError(f"kind must be one of {', '.join(repr(k) for k in KL_KINDS)}; got {kind!r}")
