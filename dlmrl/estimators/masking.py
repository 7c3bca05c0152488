"""Drawing masks at given diffusion times: Bernoulli, exact-count and GDPO's reference rule."""

from __future__ import annotations

import torch

MASKING_MODES = ("bernoulli", "exact_count", "reference")


def check_masking_mode(mode: str, allowed: tuple[str, ...] = MASKING_MODES, field: str = "masking") -> None:
    """Raise ``ValueError`` naming ``field`` and the valid modes if ``mode`` is not one of ``allowed``."""
    if mode not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(repr(m) for m in allowed)}; got {mode!r}")


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
        t: ``(S,)`` float times in ``(0, 1]``.
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
    t = torch.as_tensor(t, dtype=torch.float64).reshape(-1).to(device)  # (S,)
    if not (torch.isfinite(t).all() and (t > 0).all() and (t <= 1).all()):
        raise ValueError(f"times must lie in (0, 1], got {t.tolist()}")
    num_samples = t.shape[0]
    batch, length = allowed.shape
    gen_device = generator.device if generator is not None else device
    keys = torch.rand(
        (num_samples, batch, length), generator=generator, device=gen_device, dtype=torch.float64
    ).to(device)  # (S, B, L)
    lengths = allowed.sum(-1)  # (B,)
    has_tokens = (lengths > 0)[None, :]  # (1, B)
    inv_t = (1.0 / t)[:, None].expand(num_samples, batch)  # (S, B)

    if mode == "bernoulli":
        masks = (keys < t[:, None, None]) & allowed[None]  # (S, B, L)
        scale = torch.where(has_tokens, inv_t, torch.zeros_like(inv_t))
        return masks, scale.float()

    tl = t[:, None] * lengths[None, :].double()  # (S, B)
    k = tl.ceil() if mode == "exact_count" else tl.floor()
    k = torch.minimum(k.long().clamp(min=1), lengths[None, :])  # (S, B), 0 where L_b = 0
    keys = keys.masked_fill(~allowed[None], 2.0)  # disallowed positions rank last
    rank = keys.argsort(dim=-1).argsort(dim=-1)  # (S, B, L)
    masks = (rank < k[..., None]) & allowed[None]  # (S, B, L)
    if mode == "exact_count":
        scale = lengths[None, :].double() / k.clamp(min=1).double()
    else:
        scale = inv_t
    scale = torch.where(has_tokens, scale, torch.zeros_like(scale))
    return masks, scale.float()
