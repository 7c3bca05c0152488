"""Shared fixtures: a tiny deterministic denoiser whose predictions depend on the whole context."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dlmrl.models.policy import MaskedDiffusionPolicy, position_ids_from_mask


class ToyDenoiser(nn.Module):
    """Embedding + one bidirectional attention layer + a linear head (a few hundred parameters).

    Vocabulary: ids ``0..V-1``; the mask token is ``V-1``. Padding keys are ignored through the
    attention mask, so the output does not depend on left padding.
    """

    def __init__(self, vocab_size: int = 8, dim: int = 16, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(64, dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab_size)
        for p in self.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.7)

    def forward(self, input_ids, attention_mask, position_ids):
        h = self.emb(input_ids) + self.pos(position_ids)  # (B, T, D)
        scores = self.q(h) @ self.k(h).transpose(1, 2) / h.shape[-1] ** 0.5  # (B, T, T)
        scores = scores.masked_fill(~attention_mask[:, None, :], float("-inf"))
        h = h + torch.softmax(scores, -1) @ self.v(h)
        return self.head(torch.tanh(h))


def toy_logits_fn(model, input_ids, attention_mask, position_ids):
    return model(input_ids, attention_mask, position_ids)


def make_toy_policy(vocab_size: int = 8, seed: int = 0, dtype: torch.dtype = torch.float32) -> MaskedDiffusionPolicy:
    """The toy policy; ``dtype=torch.float64`` for checks where equality to rounding is the claim."""
    model = ToyDenoiser(vocab_size=vocab_size, seed=seed).to(dtype)
    return MaskedDiffusionPolicy(
        model=model,
        tokenizer=None,
        mask_token_id=vocab_size - 1,
        family="toy",
        logits_fn=toy_logits_fn,
        eos_token_id=vocab_size - 2,
        pad_token_id=vocab_size - 2,
    )


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if any model is loaded (errors that must come first)."""
    import dlmrl.models.ar
    import dlmrl.models.loading
    import dlmrl.training.run_setup

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    for owner, name in ((dlmrl.training.run_setup, "load_configured_policy"), (dlmrl.models.loading, "load_policy"),
                        (dlmrl.models.ar, "load_ar_policy")):
        monkeypatch.setattr(owner, name, refuse)


@pytest.fixture
def toy_policy() -> MaskedDiffusionPolicy:
    """A seeded toy policy: vocabulary 8, mask id 7, EOS/pad id 6."""
    torch.manual_seed(0)
    return make_toy_policy()


__all__ = ["ToyDenoiser", "make_toy_policy", "position_ids_from_mask"]
