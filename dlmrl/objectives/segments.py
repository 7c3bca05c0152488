"""Segments of a completion (sentences, entropy groups): ids, per-segment sums and means.

A segmentation is a ``(B, L)`` long tensor of segment ids, ``>= 0`` at valid tokens; ids need not be
contiguous in position (an ESPO entropy group is scattered over the response). Invalid (padding)
positions are ignored whatever their id.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

SENTENCE_ENDS = (".", "!", "?", "\n")
SUBSENTENCE_ENDS = (",", ";", ":")


def check_token_tensors(mask: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless ``mask`` is a ``(B, L)`` bool tensor and every given tensor has its shape."""
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a (B, L) bool tensor, got shape {tuple(mask.shape)} dtype {mask.dtype}")
    for name, t in tensors.items():
        if t is not None and tuple(t.shape) != tuple(mask.shape):
            raise ValueError(f"{name} must have the mask's shape (B, L) = {tuple(mask.shape)}, got {tuple(t.shape)}")


def segment_stats(
    values: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-(row, segment) sums and token counts over valid tokens.

    Args:
        values: ``(B, L)`` float (differentiable; invalid positions may hold anything, even inf/NaN).
        mask: ``(B, L)`` bool, valid tokens.
        segment_ids: ``(B, L)`` long, ``>= 0`` at valid tokens.
    Returns:
        ``(sums (B, S), counts (B, S), flat (B, L))``: ``S = 1 + max id``; ``flat`` is the index of each
        token's ``(row, segment)`` cell in the flattened ``(B·S,)`` tables (0 at invalid positions).
    Raises:
        ValueError: on shape mismatch or a negative id at a valid token.
    """
    check_token_tensors(mask, values=values, segment_ids=segment_ids)
    ids = torch.where(mask, segment_ids.long(), 0)  # (B, L)
    if (ids < 0).any():
        raise ValueError("segment_ids must be >= 0 at valid tokens")
    B = mask.shape[0]
    S = int(ids.max()) + 1 if ids.numel() else 1
    rows = torch.arange(B, device=mask.device)[:, None]  # (B, 1)
    flat = torch.where(mask, rows * S + ids, 0)  # (B, L)
    v = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    sums = torch.zeros(B * S, dtype=values.dtype, device=values.device).index_add(0, flat.flatten(), v.flatten())
    counts = torch.zeros(B * S, dtype=values.dtype, device=values.device).index_add(
        0, flat.flatten(), mask.flatten().to(values.dtype)
    )
    return sums.view(B, S), counts.view(B, S), flat


def segment_mean(values: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the valid tokens of each token's segment, broadcast back to the token.

    Args:
        values: ``(B, L)`` float; mask: ``(B, L)`` bool; segment_ids: ``(B, L)`` long.
    Returns:
        ``(B, L)``: ``mean_{s ∈ seg(i,t)} values[i, s]`` at valid tokens, 0 elsewhere (differentiable).
    """
    sums, counts, flat = segment_stats(values, mask, segment_ids)
    means = (sums / counts.clamp(min=1)).flatten()  # (B·S,)
    return torch.where(mask, means[flat], torch.zeros((), dtype=values.dtype, device=values.device))


def sentence_segments(is_delimiter: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence ids from delimiter flags: a delimiter closes its segment; the remainder is the last one.

    ``id[i, t]`` = number of valid delimiter tokens strictly before ``t`` in row ``i``; so
    ``"a b . c d"`` (delimiter ``.``) gives ``0 0 0 1 1``. Invalid positions get ``-1``.

    Args:
        is_delimiter: ``(B, L)`` bool, the token ends a sentence.
        mask: ``(B, L)`` bool, valid tokens.
    Returns:
        ``(B, L)`` long segment ids.

    Reference: SSPO arXiv 2511.04256 (sentence-level ratio); the segmentation rule is a
    (dlmrl interpretation of SSPO, arXiv 2511.04256).
    """
    check_token_tensors(mask, is_delimiter=is_delimiter)
    closes = (is_delimiter.bool() & mask).long()  # (B, L)
    ids = closes.cumsum(-1) - closes  # exclusive count
    return torch.where(mask, ids, -1)


def delimiter_token_ids(tokenizer, subsentence: bool = False, ends: Iterable[str] | None = None) -> torch.Tensor:
    """Ids of the vocabulary tokens whose decoded text (trailing spaces removed) ends a sentence.

    Default ends: ``.`` ``!`` ``?`` and a newline; ``subsentence=True`` adds ``,`` ``;`` ``:``. Special
    tokens are never delimiters. Use with ``torch.isin(completion_ids, ids)`` to get ``is_delimiter``.

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``, ``len``, ``all_special_ids``).
        subsentence: also split at ``,`` ``;`` ``:``.
        ends: explicit endings (overrides the defaults).
    Returns:
        ``(n,)`` long tensor of token ids.

    Reference: (dlmrl interpretation) of SSPO's sentences, arXiv 2511.04256.
    """
    endings = tuple(ends) if ends is not None else SENTENCE_ENDS + (SUBSENTENCE_ENDS if subsentence else ())
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [
        i for i in range(len(tokenizer))
        if i not in special and tokenizer.decode([i]).rstrip(" ").endswith(endings)
    ]
    return torch.tensor(ids, dtype=torch.long)
