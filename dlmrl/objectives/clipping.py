"""The PPO clipped surrogate with per-token clip ranges, dual clip, TRL's ``delta`` cap and clip flags."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ClipResult:
    """Output of :func:`clipped_surrogate`; every tensor is ``(B, L)``.

    Attributes:
        surrogate: the per-token objective to maximise (differentiable).
        clipped_low: ``A < 0`` and ``r < 1 − ε_low``: the lower clip is active (zero gradient).
        clipped_high: ``A > 0`` and ``r > 1 + ε_high``: the upper clip is active (zero gradient).
        capped: the dual clip ``c`` or the ``delta`` cap is active (zero gradient): ``A < 0`` and
            ``r > min(c, δ)``, or ``A > 0``, ``r > δ`` and not already ``clipped_high``.
    """

    surrogate: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    capped: torch.Tensor


def _as_range(eps: float | torch.Tensor, name: str, like: torch.Tensor) -> torch.Tensor:
    eps_t = torch.as_tensor(eps, dtype=like.dtype, device=like.device)
    if (eps_t < 0).any():
        raise ValueError(f"{name} must be >= 0")
    if eps_t.dim() and tuple(eps_t.shape) != tuple(like.shape):
        raise ValueError(f"{name} must be a float or a (B, L) tensor like the ratio {tuple(like.shape)}")
    return eps_t


def clip_ratio(ratio: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float) -> torch.Tensor:
    """``clip(r, lo, hi)`` whose gradient is 1 inside ``[lo, hi]``, bounds included, and 0 outside: torch.clamp's
    rule up to torch 2.13, which TRL's and verl's PPO clips rely on (torch 2.14 splits the gradient at a bound).

    Args:
        ratio: any shape (differentiable). lo, hi: bounds broadcastable to it.
    Returns:
        Tensor of ``ratio``'s shape and dtype.
    """
    lo = torch.as_tensor(lo, dtype=ratio.dtype, device=ratio.device).expand_as(ratio)
    hi = torch.as_tensor(hi, dtype=ratio.dtype, device=ratio.device).expand_as(ratio)
    r = ratio.detach()
    return torch.where((r >= lo) & (r <= hi), ratio, torch.where(r < lo, lo, hi))


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float | torch.Tensor,
    eps_high: float | torch.Tensor,
    dual_clip: float | None = None,
    delta: float | None = None,
) -> ClipResult:
    """``min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)`` per token, with the optional caps.

    - ``delta`` (TRL): the unclipped term uses ``min(r, δ)``, so the surrogate is ``min(min(r, δ)·A,
      clip(r)·A)``.
    - ``dual_clip`` ``c`` (dual-clip PPO): for ``A < 0`` the surrogate is ``max(surrogate, c·A)``, which
      bounds the loss of a negative-advantage token whose ratio exploded.

    Clip ranges may be per-token tensors (entropy-adaptive rules plug in here). Flags are computed on
    the detached ratio; they say where the surrogate is constant in ``r`` (so the token gets no
    gradient), matching TRL's ``is_low_clipped`` / ``is_high_clipped``.

    Args:
        ratio: ``(B, L)`` importance ratio (differentiable), dimensionless.
        advantages: ``(B, L)`` advantages.
        eps_low, eps_high: ``>= 0``; floats or ``(B, L)`` tensors.
        dual_clip: ``c > 1`` or ``None`` (off).
        delta: ``δ > 1`` or ``None`` (off).
    Returns:
        :class:`ClipResult`.
    Raises:
        ValueError: on shape mismatch, a negative ε, ``c <= 1`` or ``δ <= 1``.

    Reference: PPO arXiv 1707.06347 Eq. 7; DAPO arXiv 2503.14476 (decoupled ε_low/ε_high); dual-clip
    PPO arXiv 1912.09729; TRL ``GRPOConfig.delta`` (two-sided clipping, INTELLECT-2 arXiv 2505.07291).
    """
    if ratio.shape != advantages.shape:
        raise ValueError(f"ratio {tuple(ratio.shape)} and advantages {tuple(advantages.shape)} must match")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip c must be > 1, got {dual_clip}")
    if delta is not None and not delta > 1:
        raise ValueError(f"delta must be > 1, got {delta}")
    lower = 1.0 - _as_range(eps_low, "eps_low", ratio)
    upper = 1.0 + _as_range(eps_high, "eps_high", ratio)
    adv = advantages.to(ratio.dtype)
    unclipped = ratio if delta is None else ratio.clamp(max=delta)
    # at a bound (r == 1 − ε_low or 1 + ε_high) the whole gradient passes, as torch.clamp gives TRL and verl up to
    # torch 2.13; torch 2.14's clamp splits it at a tie (tensor bounds: 1/2, scalar bounds: 0), as
    # minimum(maximum(r, lo), hi) does, so the rule is written out: the ratio inside [lo, hi] (inclusive), the
    # bound as a constant outside
    clipped = clip_ratio(ratio, lower.expand_as(ratio), upper.expand_as(ratio))
    surrogate = torch.minimum(unclipped * adv, clipped * adv)  # (B, L)
    if dual_clip is not None:
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, dual_clip * adv), surrogate)

    r = ratio.detach()
    clipped_low = (r < lower) & (adv < 0)
    clipped_high = (r > upper) & (adv > 0)
    cap_neg = min(c for c in (dual_clip, delta, float("inf")) if c is not None)
    cap_pos = float("inf") if delta is None else delta
    capped = ((adv < 0) & (r > cap_neg)) | ((adv > 0) & (r > cap_pos) & ~clipped_high)
    return ClipResult(surrogate, clipped_low, clipped_high, capped)
