"""Drawing masks at given diffusion times: Bernoulli, exact-count and GDPO's reference rule."""

from __future__ import annotations

import torch

from dlmrl.estimators.validation import OptionError

MASKING_MODES = ("bernoulli", "exact_count", "reference")


def check_masking_mode(mode: str, allowed: tuple[str, ...] = MASKING_MODES, field: str = "masking") -> None:
    """Raise :class:`OptionError` naming ``field`` and the valid modes if ``mode`` is not one of ``allowed``."""
    if mode not in allowed:
        raise OptionError(field, f"{field} must be one of {', '.join(repr(m) for m in allowed)}; got {mode!r}")


def sample_masks(
    completion_mask: torch.Tensor,
    t: torch.Tensor,
    mode: str,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One mask per time and row, and the scale that turns ``S(m)`` into an integrand value.

    Modes (``L_b = completion_mask[b].sum()``, the positions that may be masked):

    - ``bernoulli``: each allowed position is masked independently with probability ``t``;
      scale ``1/t``. An empty mask contributes 0 (its score sums over no tokens).
    - ``exact_count``: ``k = max(1, ceil(t·L_b))`` positions chosen uniformly among the allowed
      ones; scale ``L_b/k``. ``(L_b/k) · h(k)`` is the step-function integrand of the discrete ELBO
      ``Σ_k h(k)/k``, so ``∫_0^1 E[scale·S(m)] dt`` is exactly the ELBO.
    - ``reference``: ``k = max(1, floor(t·L_b))`` uniform positions, scale ``1/t``, as GDPO's
      released code does (for reproducing its numbers; biased).

    Rows with ``L_b = 0`` get an empty mask and scale 0. Uniform ``k``-subsets come from random
    keys drawn with ``generator``: the ``k`` allowed positions with the smallest keys are masked.

    Args:
        completion_mask: ``(B, L)`` bool, True where a position may be masked (and is scored).
        t: ``(S,)`` float times in ``(0, 1]`` shared by all rows, or ``(S, B)`` one per row.
        mode: one of ``bernoulli``, ``exact_count``, ``reference``.
        generator: ``torch.Generator`` for the draws (its device is used for drawing).
    Returns:
        ``(masks (S, B, L) bool, scale (S, B) float32)`` on ``completion_mask``'s device.
    Raises:
        ValueError: on an unknown mode, or times outside ``(0, 1]``.

    Reference: GDPO arXiv 2510.08554 §3–§4; LLaDA arXiv 2502.09992 (likelihood evaluation, Alg. 3).
    """
    check_masking_mode(mode)
    allowed = completion_mask.bool()  # (B, L)
    if allowed.dim() != 2:
        raise ValueError(f"completion_mask must be (B, L), got shape {tuple(allowed.shape)}")
    device = allowed.device
    batch, length = allowed.shape
    t = torch.as_tensor(t, dtype=torch.float64).to(device)
    t = t.reshape(-1, 1).expand(-1, batch) if t.dim() <= 1 else t  # (S, B)
    if t.dim() != 2 or t.shape[1] != batch:
        raise ValueError(f"times must be (S,) or (S, B) with B = {batch}, got shape {tuple(t.shape)}")
    if not (torch.isfinite(t).all() and (t > 0).all() and (t <= 1).all()):
        raise ValueError(f"times must lie in (0, 1], got {t.flatten().tolist()[:8]}")
    num_samples = t.shape[0]
    gen_device = generator.device if generator is not None else device
    keys = torch.rand(
        (num_samples, batch, length), generator=generator, device=gen_device, dtype=torch.float64
    ).to(device)  # (S, B, L)
    lengths = allowed.sum(-1)  # (B,)
    has_tokens = (lengths > 0)[None, :]  # (1, B)
    inv_t = 1.0 / t  # (S, B)

    if mode == "bernoulli":
        masks = (keys < t[..., None]) & allowed[None]  # (S, B, L)
        scale = torch.where(has_tokens, inv_t, torch.zeros_like(inv_t))
        return masks, scale.float()

    tl = t * lengths[None, :].double()  # (S, B)
    k = tl.ceil() if mode == "exact_count" else tl.floor()
    k = torch.minimum(k.long().clamp(min=1), lengths[None, :])  # (S, B), 0 where L_b = 0
    masks = _smallest_keys(keys, allowed, k)
    if mode == "exact_count":
        scale = lengths[None, :].double() / k.clamp(min=1).double()
    else:
        scale = inv_t
    scale = torch.where(has_tokens, scale, torch.zeros_like(scale))
    return masks, scale.float()


def _smallest_keys(keys: torch.Tensor, allowed: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mask the ``k[s, b]`` allowed positions with the smallest ``keys (S, B, L)``: uniform k-subsets."""
    keys = keys.masked_fill(~allowed[None], 2.0)  # disallowed positions rank last
    rank = keys.argsort(dim=-1).argsort(dim=-1)  # (S, B, L)
    return (rank < k[..., None]) & allowed[None]  # (S, B, L)


def _keys(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64).to(device)


def count_masks(
    completion_mask: torch.Tensor, counts: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Uniformly random subsets of given sizes.

    Args:
        completion_mask: ``(B, L)`` bool, positions that may be masked.
        counts: ``(S, B)`` long, subset size per sample and row (clamped to ``[0, L_b]``).
        generator: ``torch.Generator`` for the draws.
    Returns:
        ``(S, B, L)`` bool masks with ``min(counts[s, b], L_b)`` allowed positions each.
    """
    allowed = completion_mask.bool()
    counts = counts.to(allowed.device).long().clamp(min=0)
    keys = _keys((counts.shape[0], *allowed.shape), generator, allowed.device)
    return _smallest_keys(keys, allowed, counts)


def bernoulli_masks(
    completion_mask: torch.Tensor, t: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Each allowed position masked independently with probability ``t[s]``.

    Args:
        completion_mask: ``(B, L)`` bool.
        t: ``(S,)`` or ``(S, B)`` float probabilities in ``[0, 1]``.
        generator: ``torch.Generator`` for the draws.
    Returns:
        ``(S, B, L)`` bool masks.
    """
    allowed = completion_mask.bool()
    t = torch.as_tensor(t, dtype=torch.float64).to(allowed.device)
    t = t.reshape(-1, 1).expand(-1, allowed.shape[0]) if t.dim() <= 1 else t  # (S, B)
    keys = _keys((t.shape[0], *allowed.shape), generator, allowed.device)
    return (keys < t[..., None]) & allowed[None]
