"""SPG's estimator: block-wise masks, the ELBO for positive advantages and an upper bound (EUBO) for negative ones.

Sandwiched Policy Gradient (SPG, arXiv 2510.09541) maximises a lower bound of the likelihood of the
completions it rewards and minimises an *upper* bound of those it penalises, so that neither push can be won
by loosening the bound. Both bounds are read off the same masked canvases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.estimators.mask_plan import MaskPlan, UpperBound
from dlmrl.estimators.masking import bernoulli_masks
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.validation import OptionError, check_positive_int, check_unit_interval


def block_masks(completion_mask: torch.Tensor, num_samples: int, block_length: int,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """SPG's block-wise masks: per sample a random block of the canvas, a uniform number of its completion
    positions masked, every completion position of the later blocks masked, earlier blocks clean.

    Per row the blocks holding completion positions are put in a random order and sample ``k`` takes the
    ``(k mod C_b)``-th (distinct blocks when ``num_samples <= C_b``, as SPG's ``randperm(...)[:num_t] % C_i``);
    in it ``n ~ U{1..n_valid}`` of the ``n_valid`` completion positions are masked, uniformly chosen.

    Args:
        completion_mask: ``(B, L)`` bool. num_samples: masks per row. block_length: the block size (divides
            ``L``; the sampler's block length). generator: the source of the draws.
    Returns:
        ``(S, B, L)`` bool masks inside the completion mask (empty for a row without completion positions).
    Raises:
        ValueError: if ``block_length`` does not divide ``L``.

    Reference: SPG arXiv 2510.09541, code ``spg/spg_trainer.py`` (``block_random``).
    """
    mask = completion_mask.bool()
    batch, length = mask.shape
    if block_length < 1 or length % block_length:
        raise ValueError(f"block_length {block_length} must divide the canvas length {length}")
    device = mask.device
    gdev = generator.device if generator is not None else device
    num_blocks = length // block_length
    block_of = torch.arange(length, device=device) // block_length  # (L,)
    has = mask.reshape(batch, num_blocks, block_length).any(-1)  # (B, C)
    keys = torch.rand((batch, num_blocks), generator=generator, device=gdev, dtype=torch.float64).to(device)
    order = keys.masked_fill(~has, 2.0).argsort(-1)  # (B, C): the row's non-empty blocks first, in random order
    count = has.sum(-1).clamp(min=1)  # (B,) C_b
    pick = torch.arange(num_samples, device=device)[:, None] % count[None]  # (S, B)
    chosen = order.gather(1, pick.t()).t()  # (S, B) block of each sample
    in_block = mask[None] & (block_of[None, None] == chosen[..., None])  # (S, B, L)
    later = mask[None] & (block_of[None, None] > chosen[..., None])  # (S, B, L)
    n_valid = in_block.sum(-1)  # (S, B)
    u = torch.rand((num_samples, batch), generator=generator, device=gdev, dtype=torch.float64).to(device)
    n = torch.minimum((u * n_valid).floor().long() + 1, n_valid)  # (S, B) ~ U{1..n_valid}
    pos_keys = torch.rand((num_samples, batch, length), generator=generator, device=gdev,
                          dtype=torch.float64).to(device).masked_fill(~in_block, 2.0)
    rank = pos_keys.argsort(-1).argsort(-1)  # (S, B, L)
    return (in_block & (rank < n[..., None])) | later


@dataclass(frozen=True)
class SPGEstimator(PlanEstimator):
    """SPG's likelihood bounds on block-wise masks, ``m`` samples per row; NFE = m.

    Lower bound, per row: ``ELBO = (1/m) Σ_k (n_b / |m_k|) S(m_k)`` (the exact-count weight with the sample's
    own masked fraction ``t_k = |m_k| / n_b``; ``n_b`` the row's completion tokens). Upper bound, for the rows
    :meth:`rollout_plan` is given a negative advantage: per token ``(1/β) log (1/m) Σ_k 1[i ∈ m_k] p^β / t_k``,
    averaged over the positions masked in some sample (scaled here to sum to ``n_b`` times that mean, the scale
    of the ELBO's sum), and mixed with the ELBO as ``ω · EUBO + (1 − ω) · ELBO`` (``mix``; 1 = SPG's pure EUBO
    variant, 0.5 its mixture). Each real prompt token is masked with probability ``p_mask_prompt`` per sample.

    **(dlmrl interpretation)**: SPG's code also masks the *earlier completion blocks* with ``p_mask_prompt``
    (its ``random`` mode restricts that to the prompt, which reads as the intent); here earlier blocks stay
    clean. Tokens after EOS are ordinary completion positions here (SPG leaves them unscored). SPG computes the
    probabilities in the model's dtype; here in float64 from float32 log-probs.

    Args:
        num_samples: ``m`` masks per row (SPG: 2).
        block_length: the block size (SPG: the sampler's, 32).
        p_mask_prompt: prompt-token mask probability (SPG: 0.15).
        beta: the EUBO's Rényi order ``β >= 1`` (SPG: 1.5; 1.0 for Sudoku).
        mix: ``ω`` (SPG's ``mix_weight``; 0.5 mixture, 1 pure EUBO).

    Reference: SPG arXiv 2510.09541, code facebookresearch/SPG ``spg/spg_trainer.py`` (``block_random``, the
    EUBO and ``mix_weight``).
    """

    num_samples: int = 2
    block_length: int = 32
    p_mask_prompt: float = 0.15
    beta: float = 1.5
    mix: float = 0.5
    name = "spg"
    nfe_formula = "m (num_samples)"
    FLAT_KEYS = frozenset({"samples_per_node", "p_mask_prompt", "eubo_beta", "mix_weight", "mask_block_length"})
    KEY_OF: ClassVar[Mapping[str, str]] = {
        "num_samples": "estimator.samples_per_node", "beta": "estimator.eubo_beta", "mix": "estimator.mix_weight",
        "block_length": "estimator.mask_block_length"}

    @classmethod
    def flat_options(cls, flat, sampling=None) -> dict:
        """``num_samples = samples_per_node``, ``beta = eubo_beta``, ``mix = mix_weight``, ``p_mask_prompt``, and
        ``block_length = mask_block_length``, 0 meaning the sampler's block length (as SPG's masks tile the blocks
        the sampler fills)."""
        names = {"samples_per_node": "num_samples", "p_mask_prompt": "p_mask_prompt", "eubo_beta": "beta",
                 "mix_weight": "mix"}
        out = {names[k]: flat[k] for k in names if k in flat}
        block = flat.get("mask_block_length", 0) or (sampling.block_length if sampling is not None else 0)
        if block:
            out["block_length"] = block
        return out

    def notes(self) -> dict[str, str]:
        return {"bounds": "ELBO for A >= 0, mix_weight * EUBO + (1 - mix_weight) * ELBO for A < 0"}

    def __post_init__(self) -> None:
        check_positive_int(self.num_samples, "num_samples")
        check_positive_int(self.block_length, "block_length")
        check_unit_interval(self.p_mask_prompt, "p_mask_prompt", high_open=True)
        check_unit_interval(self.mix, "mix")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta >= 1:
            raise OptionError("beta", f"beta must be a number >= 1 (the Rényi order of SPG's upper bound), got "
                                      f"{self.beta!r}")

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: m."""
        return self.num_samples

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
        upper_rows: torch.Tensor | None = None,
    ) -> MaskPlan:
        """Draw the block-wise masks (and prompt masks); ``upper_rows (B,)`` bool get the upper bound.

        Raises:
            ValueError: if ``p_mask_prompt > 0`` and no ``prompt_mask`` is given, or see :func:`block_masks`.
        """
        generator = as_generator(generator, completion_mask.device)
        m = self.num_samples
        allowed = completion_mask.bool()
        masks = block_masks(allowed, m, self.block_length, generator)  # (S, B, L)
        n = allowed.sum(-1).double()[None]  # (1, B)
        k = masks.sum(-1).double()  # (S, B)
        weights = torch.where(k > 0, n / (m * k.clamp(min=1)), 0.0).float()  # (S, B): 1 / (m t_k)
        t = (k / n.clamp(min=1)).cpu()  # (S, B) the masked fraction (bookkeeping)
        prompt_masks = None
        if self.p_mask_prompt > 0:
            if prompt_mask is None:
                raise ValueError("spg with p_mask_prompt > 0 needs prompt_mask to draw prompt masks")
            prompt_masks = bernoulli_masks(prompt_mask, torch.full((m,), float(self.p_mask_prompt)), generator)
        upper = None
        if upper_rows is not None and bool(upper_rows.any()):
            upper = UpperBound(upper_rows.bool().to(allowed.device), float(self.beta), float(self.mix))
        return MaskPlan(masks=masks, weights=weights, t=t, prompt_masks=prompt_masks, upper=upper)

    def rollout_plan(self, completion_mask, generator=None, prompt_mask=None, *, reveal_step=None,
                     advantages=None) -> MaskPlan:
        """The plan with the upper bound on the rows whose advantage is negative (token advantages: their
        mean over the row)."""
        upper = None
        if advantages is not None:
            a = advantages if advantages.dim() == 1 else advantages.mean(-1)
            upper = a.to(completion_mask.device) < 0
        return self.make_plan(completion_mask, generator, prompt_mask, upper)
