"""The sampler's randomness and temperature: Gumbel-max draws in float64 and the tempered log-softmax.

Reference: LLaDA, Nie et al., arXiv 2502.09992, the released ``generate.py`` (``add_gumbel_noise``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

#: most float64 numbers drawn at once when a row slice's noise skips the other rows (bounds memory)
_SKIP_CHUNK = 1 << 24


def _uniform(shape, generator: torch.Generator | None, device: torch.device,
             rows: tuple[int, int] | None = None) -> torch.Tensor:
    """float64 U(0,1) drawn on the generator's own device (a CPU generator can drive a GPU model).

    ``rows = (start, total)``: ``shape[0]`` rows out of ``total``; the draw is that of a ``(total, *shape[1:])``
    tensor, of which rows ``[start, start + shape[0])`` are returned, so a row gets the same numbers whichever
    slice of the batch a call holds (data-parallel sampling) and the generator advances by the whole batch.
    A CPU generator draws the other rows in chunks and drops them (the CPU stream is sequential, so chunks give
    the same numbers as one draw); another generator draws the whole tensor.
    """
    where = generator.device if generator is not None else device
    if rows is None or (rows[0] == 0 and rows[1] == shape[0]):
        return torch.rand(shape, generator=generator, device=where, dtype=torch.float64).to(device)
    start, total = rows
    n, rest = shape[0], tuple(shape[1:])
    if not 0 <= start <= start + n <= total:
        raise ValueError(f"rows {start}..{start + n} do not lie in a batch of {total}")
    if where.type != "cpu" or generator is None:
        full = torch.rand((total, *rest), generator=generator, device=where, dtype=torch.float64)
        return full[start : start + n].to(device)
    per_row = max(1, math.prod(rest))
    step = max(1, _SKIP_CHUNK // per_row)

    def skip(count: int) -> None:
        for i in range(0, count, step):
            torch.rand((min(step, count - i), *rest), generator=generator, dtype=torch.float64)

    skip(start)
    out = torch.rand((n, *rest), generator=generator, dtype=torch.float64)
    skip(total - start - n)
    return out.to(device)


def _gumbel(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """``logits (float64) + temperature · g`` with ``g = -log(-log u)`` from the uniforms ``u`` (same shape)."""
    u = u.clamp_min(torch.finfo(torch.float64).tiny)  # u = 0 would give log(0)
    gumbel = -torch.log(-torch.log(u))  # (..., V)
    return logits.to(torch.float64) + temperature * gumbel


def drawn_tokens(logits: torch.Tensor, mask_token_id: int, temperature: float,
                 noise: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """The sampler's draw ``x0 (..., )`` long: the argmax of the logits with the mask token at ``-inf`` (never
    drawn), after ``noise`` (a function of those masked logits returning noised ones, e.g. Gumbel noise at the step's
    temperature) when ``temperature > 0``.

    Greedy (``temperature == 0``) it takes the argmax of ``logits (..., V)`` itself and redoes only the positions
    whose argmax is the mask token: no ``(..., V)`` copy, the same tokens (``argmax`` returns the first maximal
    index, so a position whose first maximum is another token keeps it, and the masked copy would give it too).
    """
    if temperature > 0:
        choice = logits.clone()
        choice[..., mask_token_id] = float("-inf")
        return noise(choice).argmax(dim=-1)
    x0 = logits.argmax(dim=-1)
    hit = x0 == mask_token_id
    if bool(hit.any()):
        redo = logits[hit]  # (k, V): a copy of those positions only
        redo[:, mask_token_id] = float("-inf")
        x0[hit] = redo.argmax(dim=-1)
    return x0


def add_gumbel_noise(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None,
    rows: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Perturb logits so that their argmax is a sample from ``softmax(logits / temperature)``.

    Computed in float64 as ``logits + temperature * g`` with ``g ~ Gumbel(0, 1)``, the logarithm
    of LLaDA's ``exp(logits) / (-log u)^temperature``: the same argmax, without overflow for large
    logits. ``-inf`` logits stay ``-inf``.

    Args:
        logits: ``(..., V)`` float.
        temperature: ``>= 0``; ``0`` returns ``logits`` unchanged (greedy).
        generator: source of the uniform noise.
        rows: ``(start, total)``: ``logits`` are rows ``[start, start + B)`` of a batch of ``total``; the noise
            is that row's noise in the whole batch (see :func:`generate`'s ``rows``).
    Returns:
        ``(..., V)`` float64 noised logits (or ``logits`` itself when ``temperature == 0``).
    Raises:
        ValueError: if ``temperature < 0``.
    Reference: LLaDA arXiv 2502.09992, ``add_gumbel_noise`` (float64 noise, as the authors note
    low precision degrades Gumbel-max sampling).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits
    return _gumbel(logits, temperature, _uniform(logits.shape, generator, logits.device, rows))


def sampler_log_softmax(logits: torch.Tensor, mask_token_id: int, temperature: float) -> torch.Tensor:
    """Log-probs of the diffusion sampler's token distribution: ``log_softmax(logits / T)`` with the mask
    token's logit at ``-inf`` (the sampler never draws it; :func:`generate`).

    Args:
        logits: ``(..., V)`` float. mask_token_id: the mask id. temperature: ``T > 0``.
    Returns:
        ``(..., V)`` log-probs (``logits``' dtype), ``-inf`` at the mask token.
    """
    scaled = (logits / temperature).clone()
    scaled[..., mask_token_id] = float("-inf")
    return torch.log_softmax(scaled, dim=-1)
