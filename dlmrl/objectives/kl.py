"""Schulman's KL estimators between the policy and a reference."""

from __future__ import annotations

import torch

from dlmrl.objectives.segments import check_token_tensors

KL_KINDS = ("k1", "k2", "k3")

#: ``|Δ|`` above which ``k3`` is evaluated at the bound (verl's ``kl_penalty`` clamps the log-ratio to ±20 the
#: same way): ``e^Δ`` overflows float32 past about 88 nats, which ELBO terms weighted by ``L/k`` reach easily
K3_LOG_RATIO_BOUND = 20.0


def kl_estimate(logp_new: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k3", clamp: bool = True) -> torch.Tensor:
    """Per-element estimate of ``KL(π_new ‖ π_ref)`` from log-probabilities of samples of ``π_new``.

    With ``Δ = logp_ref − logp_new``: ``k1 = −Δ``, ``k2 = Δ²/2``, ``k3 = e^Δ − Δ − 1`` (≥ 0,
    unbiased, GRPO's default). Minimising ``k2`` or ``k3`` moves each ``logp_new`` toward its
    ``logp_ref``; ``k1``'s gradient is the constant +1 (zero in expectation over on-policy samples), so
    as a loss term it only lowers ``logp_new`` and does not pull toward the reference.

    Finite for any finite input: ``k3`` takes ``Δ`` clamped to ``±20`` nats (:data:`K3_LOG_RATIO_BOUND`, as
    verl's ``core_algos.kl_penalty`` does; beyond it the value stays at the bound's and the gradient is 0), so
    it never overflows; ``k1`` and ``k2`` are polynomials in ``Δ``. ``clamp=False`` gives the estimate itself
    (for logging: the loss's clamped value understates it once ``|Δ| > 20``, e.g. 19 where it is 49), ``k3``
    computed in float64 (finite up to ``Δ ≈ 709`` nats, ``inf`` beyond).

    Args:
        logp_new: any shape, nats (differentiable).
        logp_ref: same shape, nats (treated as given; detach it upstream).
        kind: ``k1``, ``k2`` or ``k3``.
        clamp: evaluate ``k3`` at ``Δ`` clamped to ``±20`` (the loss's form); ``False``: unclamped, float64.
    Returns:
        Tensor of the input shape (float64 for ``k3`` with ``clamp=False``).

    Reference: J. Schulman, "Approximating KL divergence" (2020); GRPO arXiv 2402.03300 Eq. 4.
    """
    delta = logp_ref - logp_new
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta**2
    if kind == "k3":
        delta = delta.clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND) if clamp else delta.double()
        return torch.expm1(delta) - delta
    raise ValueError(f"kind must be one of {', '.join(repr(k) for k in KL_KINDS)}; got {kind!r}")


KL_LEVELS = ("token", "sequence", "sequence_sum", "sequence_sum_by_length")


def kl_term(
    logp_new: torch.Tensor,
    logp_ref: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "k3",
    level: str = "token",
    clamp: bool = True,
) -> torch.Tensor:
    """The KL penalty per token, to be added as ``β · kl_term`` to the per-token loss.

    - ``token``: ``k(logp_new[i,t], logp_ref[i,t])`` per valid token (GRPO, TRL).
    - ``sequence``: ``k`` of the length-normalised sequence log-probs, ``Δ_i = mean_t (logp_ref −
      logp_new)``, on every valid token of row ``i``; with ``grpo`` aggregation it adds
      ``β · mean_i k(Δ_i)``. On ELBO contributions this is GDPO's KL term with its length normalisation
      (**dlmrl interpretation**, the same as :func:`dlmrl.objectives.gdpo.gdpo_loss`).
    - ``sequence_sum``: as ``sequence`` with ``Δ_i = Σ_t (logp_ref − logp_new)`` (raw sequence ELBOs).
    - ``sequence_sum_by_length``: ``k(Δ_i) / |y_i|`` with the raw ``Δ_i`` (ESPO arXiv 2512.03759: ``k2`` of the
      sequence ELBOs divided by the length, ``Σ_i ½ ΔELBO_i² / (B·L)``; its code divides by the padded length).

    Invalid positions get 0. ``logp_ref`` is detached.

    Args:
        logp_new: ``(B, L)`` nats per token (differentiable).
        logp_ref: ``(B, L)`` nats per token of the reference policy.
        mask: ``(B, L)`` bool.
        kind: ``k1``, ``k2`` or ``k3``.
        level: one of :data:`KL_LEVELS`.
        clamp: :func:`kl_estimate`'s (``False`` for the logged estimate).
    Returns:
        ``(B, L)`` KL estimate per token (nats).
    Raises:
        ValueError: on an unknown kind or level, or bad shapes.

    Reference: GRPO arXiv 2402.03300 Eq. 4; GDPO arXiv 2510.08554 (k3 on sequence ELBOs); Schulman (2020).
    """
    check_token_tensors(mask, logp_new=logp_new, logp_ref=logp_ref)
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    # zero the padding before any non-linearity, so garbage there (inf, NaN) cannot poison the gradient
    new = torch.where(mask, logp_new, zero)
    ref = torch.where(mask, logp_ref.detach(), zero)
    if level == "token":
        return torch.where(mask, kl_estimate(new, ref, kind, clamp), zero)
    if level in ("sequence", "sequence_sum", "sequence_sum_by_length"):
        new_sum = new.sum(-1)  # (B,)
        ref_sum = ref.sum(-1)
        n = mask.sum(-1).clamp(min=1).to(logp_new.dtype)
        if level == "sequence":
            new_sum, ref_sum = new_sum / n, ref_sum / n
        kl = kl_estimate(new_sum, ref_sum, kind, clamp)  # (B,)
        if level == "sequence_sum_by_length":
            kl = kl / n
        return torch.where(mask, kl[:, None].expand_as(logp_new), zero)
    raise ValueError(f"KL level must be one of {', '.join(map(repr, KL_LEVELS))}; got {level!r}")
