"""Which masked positions a denoising step reveals: LLaDA's per-step counts, the left-to-right order, and
Fast-dLLM's confidence threshold / factor rules.

Reference: LLaDA, Nie et al., arXiv 2502.09992, ``generate.py`` (``get_num_transfer_tokens``); Fast-dLLM, Wu et
al., arXiv 2505.22618, ``llada/generate.py`` (``get_transfer_index``, ``get_transfer_index_dynamic``).
"""

from __future__ import annotations

import torch

#: ``SampleOutput.reveal_step`` of a canvas position the sampler did not write (pre-placed infill tokens)
NOT_SAMPLED = -1


def num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to reveal at each step of a block: each row's mask count split evenly over the steps.

    The remainder goes to the first steps (32 masks over 5 steps -> 7, 7, 6, 6, 6). Rows may have
    different mask counts (infilling); each row's schedule sums to its own count.

    Args:
        mask_index: ``(B, Lb)`` bool, True where the block is still masked.
        steps: number of steps for the block, ``>= 1``.
    Returns:
        ``(B, steps)`` long.
    Raises:
        ValueError: if ``steps < 1`` or ``mask_index`` is not 2-D.
    Reference: LLaDA arXiv 2502.09992, ``get_num_transfer_tokens``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if mask_index.dim() != 2:
        raise ValueError(f"mask_index must be (B, Lb), got shape {tuple(mask_index.shape)}")
    count = mask_index.long().sum(dim=1, keepdim=True)  # (B, 1)
    base, remainder = count // steps, count % steps
    step = torch.arange(steps, device=mask_index.device)[None, :]  # (1, steps)
    return base + (step < remainder).long()  # (B, steps)


def left_to_right_reveal_steps(completion_mask: torch.Tensor, block_length: int, steps: int) -> torch.Tensor:
    """The trajectory the sampler takes with ``remasking="left_to_right"``, without running it.

    Each block's masked positions are revealed left to right, ``num_transfer_tokens`` of them per step (the
    first ``k_0`` at the block's first step, the next ``k_1`` at its second, ...), so the record has the
    sampler's step indices and per-step counts. Used for rows the sampler did not write (DaGRPO's anchors)
    so that a trajectory likelihood can score them with the sampler's number of steps.

    Args:
        completion_mask: ``(B, L)`` bool, the positions the sampler would write.
        block_length: block size, dividing ``L``.
        steps: total steps, a multiple of ``L / block_length``.
    Returns:
        ``(B, L)`` long reveal steps, :data:`NOT_SAMPLED` outside ``completion_mask``.
    Raises:
        ValueError: on a block length or step count that does not split the canvas evenly.
    """
    mask = completion_mask.bool()
    length = mask.shape[1]
    if block_length < 1 or length % block_length:
        raise ValueError(f"block_length {block_length} must divide the canvas length {length}")
    num_blocks = length // block_length
    if steps < num_blocks or steps % num_blocks:
        raise ValueError(f"steps ({steps}) must be a positive multiple of the number of blocks ({num_blocks})")
    per_block = steps // num_blocks
    out = torch.full(mask.shape, NOT_SAMPLED, dtype=torch.long, device=mask.device)  # (B, L)
    for block in range(num_blocks):
        lo, hi = block * block_length, (block + 1) * block_length
        m = mask[:, lo:hi]  # (B, Lb)
        ends = num_transfer_tokens(m, per_block).cumsum(-1)  # (B, steps): tokens revealed by the end of each step
        rank = m.long().cumsum(-1) - 1  # (B, Lb): 0-based rank of a masked position, left to right
        step = (rank[:, :, None] >= ends[:, None, :]).sum(-1)  # (B, Lb): the first step whose end passes it
        out[:, lo:hi] = torch.where(m, block * per_block + step, NOT_SAMPLED)
    return out


def threshold_reveal(
    confidence: torch.Tensor,
    masked: torch.Tensor,
    threshold: float | None = None,
    factor: float | None = None,
) -> torch.Tensor:
    """The masked positions one threshold step reveals, per row: ``(n, Lb)`` bool.

    Each row's masked positions are ranked by confidence, highest first (ties: the leftmost first), and a
    prefix of that ranking is revealed, never empty when the row has a masked position:

    - ``threshold`` ``τ``: every masked position with confidence ``>= τ``, and at least the most confident
      one (Fast-dLLM's ``get_transfer_index`` with ``threshold``: it drops a ranked position only when its
      confidence is ``< τ``).
    - ``factor`` ``f``: the longest prefix whose ``n``-th member (``n = 1, 2, ...``) has confidence
      ``c_(n) >= 1 − f / (n + 1)``, i.e. ``(n + 1)(1 − c_(n)) <= f``, the first member always included
      (Fast-dLLM's ``get_transfer_index_dynamic``, the factor rule of arXiv 2505.22618 §3.3). The reference's
      loop also reveals all ``n`` masked positions when only the last one fails its bound (its
      ``top_i == len(threshs) - 1`` branch is taken both when nothing failed and when the last one did); that
      off-by-one is not reproduced here: a position that fails its bound is never revealed.

    Args:
        confidence: ``(n, Lb)`` float, the probability of each position's drawn token (any value off
            ``masked``; it is ignored there).
        masked: ``(n, Lb)`` bool, the positions still masked in the current block.
        threshold: ``τ`` in ``(0, 1]``, or ``None``.
        factor: ``f > 0``, or ``None``; exactly one of ``threshold`` and ``factor`` is given.
    Returns:
        ``(n, Lb)`` bool, True on the positions to reveal (a subset of ``masked``).
    Raises:
        ValueError: unless exactly one of ``threshold`` and ``factor`` is given, or on mismatched shapes.
    Reference: Fast-dLLM arXiv 2505.22618, NVlabs/Fast-dLLM ``llada/generate.py`` (``get_transfer_index``,
    ``get_transfer_index_dynamic``).
    """
    if (threshold is None) == (factor is None):
        raise ValueError("give exactly one of threshold and factor")
    if confidence.shape != masked.shape or masked.dim() != 2:
        raise ValueError(f"confidence {tuple(confidence.shape)} and masked {tuple(masked.shape)} must be the same "
                         "(n, Lb) shape")
    conf = confidence.to(torch.float64).masked_fill(~masked, float("-inf"))  # (n, Lb)
    order = conf.argsort(dim=1, descending=True, stable=True)  # (n, Lb): positions, most confident first
    ranked = conf.gather(1, order)  # (n, Lb) descending
    rank = torch.arange(conf.shape[1], device=conf.device)  # (Lb,): 0-based rank j, the (j + 1)-th member
    if threshold is not None:
        keep = ranked >= threshold  # (a prefix: the ranking is descending)
    else:
        bound = 1.0 - factor / (rank + 2).to(torch.float64)  # (Lb,): 1 - f / (n + 1) with n = j + 1
        passed = ranked >= bound
        passed[:, 0] = True
        keep = passed.long().cumprod(dim=1).bool()  # the longest prefix that passes
    keep[:, 0] = True  # at least the most confident one
    keep &= rank[None, :] < masked.sum(dim=1, keepdim=True)  # only masked positions (they rank first)
    return torch.zeros_like(masked).scatter(1, order, keep)


#: the part of :func:`_confidence`'s refinement margin that does not scale with the logits: 100x the largest relative
#: error measured against the float64 softmax on 8 x 4 rows of N(0, 3^2) logits over 151,936 tokens (9.6e-7)
_CONFIDENCE_MARGIN = 1e-4
#: the part that does: ``log p = logit[x0] - logsumexp`` is a difference of two float32 numbers of size up to
#: ``|logit| + |logsumexp|``, each within an ulp (logsumexp's sum adds its own relative error, in the constant
#: above), so the relative error of ``p`` is within a few ``eps32 * (|logit[x0]| + |logsumexp|)``: 8 of them
_CONFIDENCE_ULPS = 8


def reveal_cuts(threshold: float | None, factor: float | None, block_length: int) -> tuple[float, ...]:
    """The values :func:`threshold_reveal` compares confidences with: ``(τ,)``, or the factor rule's bounds
    ``1 - f / (n + 1)`` for ``n = 1 .. block_length``; ``()`` when neither is given."""
    if threshold is not None:
        return (float(threshold),)
    if factor is not None:
        return tuple(1.0 - factor / (n + 1) for n in range(1, block_length + 1))
    return ()


def _confidence(logits: torch.Tensor, x0: torch.Tensor, cuts: tuple[float, ...] = ()) -> torch.Tensor:
    """``(n, Lb)`` float64 probability of ``x0`` under the model's full softmax (mask token included, as LLaDA's
    and Fast-dLLM's ``generate`` compute it, in float64), from ``(n, Lb, V)`` logits.

    The decisions match the float64 softmax's, at a fifth of its cost (ours): the probability is computed as
    ``exp(logit[x0] - logsumexp(logits))`` in float32 (no ``(n, Lb, V)`` float64 copy or probability tensor; at a
    152k vocabulary these were most of a cached block step, ``benchmarks/peers/sdar_rollouts.py``), and a row is
    recomputed with the float64 softmax where float32 could decide otherwise: two of its confidences, or one
    confidence and one of ``cuts`` (the thresholds it will be compared with, :func:`reveal_cuts`), closer (relative)
    than the row's bound on the float32 error, ``_CONFIDENCE_MARGIN + _CONFIDENCE_ULPS * eps32 * max(|logit[x0]| +
    |logsumexp|)``. A confident model refines many rows: confidences near 1 are often within that bound of each
    other (a trained Sudoku model: about two thirds of the rows), where only float64 orders them as LLaDA does.
    """
    lf = logits.float()
    chosen = lf.gather(-1, x0[..., None]).squeeze(-1)  # (n, Lb)
    lse = torch.logsumexp(lf, dim=-1)  # (n, Lb)
    conf = (chosen - lse).exp().to(torch.float64)  # (n, Lb)
    size = (chosen.abs() + lse.abs()).amax(dim=1).to(torch.float64)  # (n,)
    margin = (_CONFIDENCE_MARGIN + _CONFIDENCE_ULPS * torch.finfo(torch.float32).eps * size)[:, None]  # (n, 1)
    ranked = conf.sort(dim=1).values
    close = (ranked[:, 1:] - ranked[:, :-1] <= margin * ranked[:, 1:]).any(dim=1)  # (n,)
    for cut in cuts:
        close |= ((conf - cut).abs() <= margin * abs(cut)).any(dim=1)
    if close.any():
        rows = close.nonzero().squeeze(1)
        exact = torch.softmax(logits[rows].to(torch.float64), dim=-1).gather(-1, x0[rows, :, None]).squeeze(-1)
        conf[rows] = exact
    return conf
