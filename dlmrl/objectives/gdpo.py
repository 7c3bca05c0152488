"""The GDPO loss: a clipped, length-normalised sequence-level ratio of ELBOs."""

from __future__ import annotations

import torch

from dlmrl.objectives.clipping import clip_ratio
from dlmrl.objectives.kl import kl_estimate
from dlmrl.objectives.ratios import LOG_RATIO_BOUND


def gdpo_loss(
    elbo_new: torch.Tensor,
    elbo_old: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    epsilon: float,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    elbo_ref: torch.Tensor | None = None,
    kl_length_normalized: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate on sequence ELBOs with the length normalisation inside the exponent.

    ``r_i = exp((ELBO_new,i − ELBO_old,i) / L_i)``,
    ``surrogate_i = min(r_i·A_i, clip(r_i, 1 − ε_low, 1 + ε_high)·A_i)``,
    ``loss = −mean_i surrogate_i + β · mean_i k3_i``, the means over rows with ``L_i > 0``.
    **(dlmrl interpretation)** of the KL term: ``k3`` of the length-normalised
    ``Δ_i = (ELBO_ref,i − ELBO_new,i) / L_i``, matching the ratio's normalisation;
    ``kl_length_normalized=False`` uses the raw sequence ELBOs instead.
    ``elbo_old`` and ``elbo_ref`` are detached. Rows with ``L_i = 0`` get weight 0; if every row
    has ``L_i = 0`` the loss is 0 (still connected to ``elbo_new``'s graph).

    Args:
        elbo_new: ``(B,)`` ELBO of the current policy, nats per sequence (differentiable).
        elbo_old: ``(B,)`` ELBO of the rollout policy on the same :class:`MaskPlan`.
        advantages: ``(B,)`` advantages.
        lengths: ``(B,)`` scored canvas lengths ``L_i``.
        epsilon: ε_low (GDPO recipe: 0.5).
        epsilon_high: ε_high; ``None`` means ``epsilon``.
        beta: KL coefficient β (default 0).
        elbo_ref: ``(B,)`` ELBO of the reference policy; required when ``beta > 0``.
        kl_length_normalized: divide Δ by ``L_i`` before ``k3`` (default True).
    Returns:
        ``(loss scalar, metrics)`` with float metrics ``ratio_mean``, ``ratio_min``, ``ratio_max``,
        ``clip_frac_low`` (rows with ``r < 1−ε_low`` and ``A < 0``: clipping active),
        ``clip_frac_high`` (``r > 1+ε_high`` and ``A > 0``) and ``kl`` (0 without a KL term).

    The ``gdpo`` preset (``get_algorithm("gdpo").objective`` on the per-token contributions) computes
    the same loss, metrics and gradient; the tests check the two against each other.

    Reference: GDPO arXiv 2510.08554 §4 (sequence-level ratio of ELBOs); PPO arXiv 1707.06347 Eq. 7;
    DAPO arXiv 2503.14476 (ε_high); Schulman's k3.
    """
    eps_low = float(epsilon)
    eps_high = eps_low if epsilon_high is None else float(epsilon_high)
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"epsilon and epsilon_high must be >= 0, got {eps_low}, {eps_high}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and elbo_ref is None:
        raise ValueError("beta > 0 needs elbo_ref")
    shape = tuple(elbo_new.shape)
    named = {"elbo_old": elbo_old, "advantages": advantages, "lengths": lengths, "elbo_ref": elbo_ref}
    if len(shape) != 1 or any(v is not None and tuple(v.shape) != shape for v in named.values()):
        shapes = {k: tuple(v.shape) for k, v in named.items() if v is not None}
        raise ValueError(f"gdpo_loss expects (B,) tensors; elbo_new {shape}, {shapes}")

    valid = lengths > 0  # (B,)
    length = lengths.clamp(min=1).to(elbo_new.dtype)  # (B,)
    adv = advantages.to(elbo_new.dtype)
    log_ratio = torch.where(valid, (elbo_new - elbo_old.detach()) / length, 0.0)  # (B,)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    clipped = clip_ratio(ratio, 1.0 - eps_low, 1.0 + eps_high)  # (the whole gradient at a bound, any torch)
    surrogate = torch.minimum(ratio * adv, clipped * adv)  # (B,)
    num_valid = valid.sum().clamp(min=1)
    loss = -torch.where(valid, surrogate, 0.0).sum() / num_valid

    kl_value = kl_loss_value = 0.0
    if beta > 0:
        ref = elbo_ref.detach()
        scale = length if kl_length_normalized else torch.ones_like(length)
        kl = kl_estimate(elbo_new / scale, ref / scale, "k3")  # (B,)
        kl_mean = torch.where(valid, kl, 0.0).sum() / num_valid
        loss = loss + beta * kl_mean
        kl_loss_value = float(kl_mean.detach())
        with torch.no_grad():  # (logged unclamped: the loss's k3 stops growing at |Δ| = 20 nats)
            raw = kl_estimate(elbo_new.detach() / scale, ref / scale, "k3", clamp=False)
            kl_value = float(torch.where(valid, raw, 0.0).sum() / num_valid)

    with torch.no_grad():
        r = ratio[valid]
        a = adv[valid]
        n = max(int(valid.sum()), 1)
        metrics = {
            "ratio_mean": float(r.mean()) if r.numel() else 1.0,
            "ratio_min": float(r.min()) if r.numel() else 1.0,
            "ratio_max": float(r.max()) if r.numel() else 1.0,
            "clip_frac_low": float(((r < 1.0 - eps_low) & (a < 0)).sum()) / n,
            "clip_frac_high": float(((r > 1.0 + eps_high) & (a > 0)).sum()) / n,
            "kl": kl_value,
            "kl_loss": kl_loss_value,
        }
    return loss, metrics
