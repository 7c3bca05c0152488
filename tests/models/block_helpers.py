"""Shared pieces of the block-diffusion tests: a tiny random Llama policy, left-padded prompts, a recording forward,
and the float tolerance."""

from __future__ import annotations

import torch

from dlmrl.models.block_attention import hf_block_forward
from dlmrl.models.families import FAMILIES
from dlmrl.models.policy import MaskedDiffusionPolicy
from dlmrl.models.tiny import build_tiny_model
from dlmrl.models.tokenizer import build_char_tokenizer

#: Tolerance for two float32 computations of the same logits that differ only in summation order (another key
#: length, batch composition or kernel). float32 rounds each operation to a relative error of eps = 2^-23 ≈ 1.2e-7;
#: the logits here are of magnitude ≲ 10 and pass through ~10 reductions of length ≤ 40 (2 layers), so the gap is
#: bounded by roughly |x| · eps · (number of roundings on the path) ≈ 10 · eps · 64; measured gaps are ≤ 4 eps.
#: A masking or position error moves logits by far more (≥ 1e-3 here; the tests that could be vacuous assert it).
ATOL = 10 * 64 * torch.finfo(torch.float32).eps  # ≈ 7.6e-5

HIDDEN = 16


def tiny_block_policy(seed: int = 0, layers: int = 2) -> MaskedDiffusionPolicy:
    """A random bidirectional Llama (hidden 16) of the ``tiny`` family over the char tokenizer, in eval mode.

    Its output head is untied and drawn with std 1, and the mask token's row is zero: an untrained tied head makes
    every masked query predict the mask token with probability ~1 (the residual stream carries its embedding), so no
    drawn token is ever confident and threshold decoding would reveal one token per step only.
    """
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=HIDDEN, num_layers=layers, num_heads=2,
                             intermediate_size=2 * HIDDEN, seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    head = torch.randn(len(tok), HIDDEN, generator=g)
    head[tok.mask_token_id] = 0.0
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    return MaskedDiffusionPolicy(model=model, tokenizer=tok, mask_token_id=tok.mask_token_id, family="tiny",
                                 logits_fn=FAMILIES.get("tiny").logits, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)


def padded_prompts(policy, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of the given lengths (never the mask token; pad id 0): ``(B, P)`` ids and mask."""
    g = torch.Generator().manual_seed(seed)
    vocab, mask_id = len(policy.tokenizer), policy.mask_token_id
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        tokens = torch.randint(5, vocab, (n,), generator=g)  # (ids >= 5: no special token, so no mask token)
        ids[row, width - n:] = tokens
        mask[row, width - n:] = True
    assert not (ids == mask_id).any()
    return ids, mask


def random_tokens(policy, shape, seed: int) -> torch.Tensor:
    """Random ordinary tokens (ids >= 5: no special token)."""
    return torch.randint(5, len(policy.tokenizer), shape, generator=torch.Generator().manual_seed(seed))


class RecordingForward:
    """A :data:`~dlmrl.models.block_attention.BlockForwardFn` that runs :func:`hf_block_forward` and keeps every
    call's ``(input_ids, position_ids, use_cache, past length, logits)``."""

    def __init__(self):
        self.calls: list[tuple[torch.Tensor, torch.Tensor, bool, int, torch.Tensor]] = []

    def __call__(self, model, input_ids, mask4d, position_ids, past=None, use_cache=False):
        assert mask4d.shape[-1] == input_ids.shape[1] + (0 if past is None else past[0][0].shape[2])
        logits, kv = hf_block_forward(model, input_ids, mask4d, position_ids, past, use_cache)
        self.calls.append((input_ids.clone(), position_ids.clone(), use_cache,
                           0 if past is None else past[0][0].shape[2], logits.clone()))
        return logits, kv

    def denoising(self):
        """The calls that are denoising steps (not cache building)."""
        return [c for c in self.calls if not c[2]]
