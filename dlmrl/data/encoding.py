"""Prompt encoding that works with any family's tokenizer: left padding by hand, BOS only when there is one.

A BERT-style masked LM has no BOS (its ``[CLS]`` is added by ``add_special_tokens``), a Dream-style tokenizer may
have no pad token, a causal LM's may have neither: the tasks and episodes encode their prompts through these
helpers instead of relying on ``tokenizer.bos_token`` or ``padding=True``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["decode_ids", "decode_to_eos", "encode_prompts", "left_pad", "pad_token_id"]


def pad_token_id(tokenizer) -> int:
    """The id written on padding: the tokenizer's pad token, else its EOS, else 0 (padding is never attended
    to: the prompt mask is False there)."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


def decode_ids(tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """``tokenizer.decode`` of the ids the tokenizer has a token for; the others are dropped.

    A model's output head can be larger than its tokenizer (Dream-v0's 152064 rows over a vocabulary of about
    151.7k tokens, LLaDA's 126464 over about 126.4k), so a sampler can write ids no token stands for. Fast
    tokenizers decode such an id as nothing; Dream's own ``DreamTokenizer`` (``tokenization_dream.py``, a Python
    tokenizer) fails on it (``TypeError`` in ``convert_tokens_to_string``: its ``_convert_id_to_token`` gives
    ``None``). Dropping them is what the fast tokenizers do.
    """
    known = [i for i in ids if tokenizer.convert_ids_to_tokens(i) is not None]
    return tokenizer.decode(known, skip_special_tokens=skip_special_tokens)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int,
             device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists → left-padded ``(N, P)`` long ids and ``(N, P)`` bool mask (True on real tokens)."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # (N, P)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)  # (N, P)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq):] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq):] = True
    return ids.to(device), mask.to(device)


def encode_prompts(tokenizer, texts: Sequence[str],
                   device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``[BOS] text`` per text (no BOS when the tokenizer has none; no other special token added), left-padded
    with :func:`pad_token_id`: ``(N, P)`` long ids and ``(N, P)`` bool mask."""
    bos = getattr(tokenizer, "bos_token", None) or ""
    rows = [tokenizer(bos + t, add_special_tokens=False)["input_ids"] for t in texts]
    return left_pad(rows, pad_token_id(tokenizer), device)


def decode_to_eos(tokenizer, canvas: torch.Tensor) -> list[str]:
    """``(B, L)`` long completion tokens -> one text per row, up to its first EOS, special tokens skipped."""
    eos = tokenizer.eos_token_id
    out = []
    for row in canvas.tolist():
        cut = row.index(eos) if eos in row else len(row)
        out.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return out
