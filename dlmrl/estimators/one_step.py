"""One-step unmasking (diffu-GRPO): the whole completion masked, prompt tokens masked at random."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import bernoulli_masks
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.validation import check_positive_int, check_unit_interval


@dataclass(frozen=True)
class OneStep(PlanEstimator):
    """d1's mean-field token log-likelihood: one forward pass with every completion position masked.

    ``estimate = (1/K) Σ_k Σ_{i∈completion} log p_θ(y^i | q with prompt mask π_k, all of y masked)``,
    where each real prompt token is masked independently with probability ``p_mask_prompt`` in
    ``π_k``. The per-token contributions are the mean-field token log-probs, which is what
    diffu-GRPO's token-level ratio uses. **Biased**: it is not an ELBO and not a bound on
    ``log p(y|q)``; it is kept as a baseline (and for reproducing d1). The prompt masks are part of
    the :class:`MaskPlan`, so old, new and reference policies see the same ones (d1 reseeds per
    inner iteration).

    Args:
        p_mask_prompt: probability of masking each real prompt token (d1: 0.15; 0 = deterministic).
        num_samples: K independent prompt masks averaged (d1: 1). NFE = K.

    Reference: d1 / diffu-GRPO, Zhao et al., arXiv 2504.12216 §3 (log-probability estimation).
    """

    p_mask_prompt: float = 0.15
    num_samples: int = 1
    name = "one_step"
    nfe_formula = "K (num_samples)"
    FLAT_KEYS = frozenset({"samples_per_node", "p_mask_prompt"})
    KEY_OF: ClassVar[Mapping[str, str]] = {"num_samples": "estimator.samples_per_node"}

    @classmethod
    def flat_options(cls, flat, sampling=None) -> dict:
        """``num_samples = samples_per_node`` (K prompt masks), ``p_mask_prompt`` as it is."""
        out = {"p_mask_prompt": flat["p_mask_prompt"]} if "p_mask_prompt" in flat else {}
        if "samples_per_node" in flat:
            out["num_samples"] = flat["samples_per_node"]
        return out

    def __post_init__(self) -> None:
        check_positive_int(self.num_samples, "num_samples")
        check_unit_interval(self.p_mask_prompt, "p_mask_prompt", high_open=True)

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: K."""
        return self.num_samples

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> MaskPlan:
        """Mask every allowed completion position; draw K prompt masks.

        Args:
            completion_mask: ``(B, L)`` bool.
            generator: ``torch.Generator`` (or an integer seed) for the prompt masks.
            prompt_mask: ``(B, P)`` bool, the real prompt tokens; required when ``p_mask_prompt > 0``.
        Returns:
            :class:`MaskPlan` with ``S = K``, ``masks`` = the completion mask, ``weights = 1/K``,
            ``t = 1`` and ``prompt_masks (K, B, P)`` (``None`` when ``p_mask_prompt = 0``).
        Raises:
            ValueError: if ``p_mask_prompt > 0`` and no ``prompt_mask`` is given.
        """
        generator = as_generator(generator, completion_mask.device)
        k = self.num_samples
        allowed = completion_mask.bool()  # (B, L)
        masks = allowed[None].expand(k, -1, -1).clone()  # (K, B, L)
        has_tokens = allowed.any(-1)  # (B,)
        weights = (has_tokens.float() / k)[None].expand(k, -1).clone()  # (K, B)
        t = torch.ones(k, dtype=torch.float64)
        prompt_masks = None
        if self.p_mask_prompt > 0:
            if prompt_mask is None:
                raise ValueError("one_step with p_mask_prompt > 0 needs prompt_mask to draw prompt masks")
            p = torch.full((k,), float(self.p_mask_prompt), dtype=torch.float64)
            prompt_masks = bernoulli_masks(prompt_mask, p, generator)  # (K, B, P)
        return MaskPlan(masks=masks, weights=weights, t=t, prompt_masks=prompt_masks)
