"""Double Monte Carlo: random diffusion times, one random mask each (LLaDA's likelihood estimate)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import check_masking_mode, sample_masks
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.sdmc import check_positive_int

DOUBLE_MC_MODES = ("exact_count", "bernoulli")


@dataclass(frozen=True)
class DoubleMC(PlanEstimator):
    """Unbiased ELBO estimate from K random times with one mask each; K forward passes per sequence.

    ``ELBO ≈ (1/K) Σ_k scale_k · S(m_k)`` with ``t_k ~ U(0, 1]`` i.i.d. (or stratified,
    ``t_k = (k − u_k)/K``, ``u_k ~ U[0, 1)``, one time per stratum). ``exact_count`` masks
    ``l = ceil(t·L_b)`` tokens with weight ``L_b/l``; as ``t`` is uniform, ``l ~ U{1..L_b}``: the
    discrete form. ``bernoulli`` masks each token w.p. ``t`` with weight ``1/t``; it is unbiased but
    its variance is infinite (near ``t → 0`` a single masked token carries weight ``1/t``), so prefer
    ``exact_count``. GDPO's ``reference`` rule is not offered here: forcing one token with weight
    ``1/t`` has an infinite expectation under ``t ~ U(0, 1)``.

    Args:
        num_samples: K (>= 1); default 3, the NFE of the default SDMC.
        masking: ``exact_count`` (default) or ``bernoulli``.
        stratified: draw one time per stratum ``((k−1)/K, k/K]``.

    Reference: LLaDA arXiv 2502.09992 (likelihood evaluation, Alg. 3); GDPO arXiv 2510.08554 §3.
    """

    num_samples: int = 3
    masking: str = "exact_count"
    stratified: bool = False
    name = "double_mc"

    def __post_init__(self) -> None:
        check_positive_int(self.num_samples, "num_samples")
        check_masking_mode(self.masking, DOUBLE_MC_MODES)

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: K."""
        return self.num_samples

    def nfe_for(self, length: int) -> int:
        return self.nfe

    def make_plan(self, completion_mask: torch.Tensor, generator: torch.Generator | int | None = None) -> MaskPlan:
        """Draw K times and one mask at each.

        Args:
            completion_mask: ``(B, L)`` bool, positions that may be masked.
            generator: ``torch.Generator`` (or an integer seed) for times and masks.
        Returns:
            :class:`MaskPlan` with ``S = K`` samples (times shared across rows) and
            ``weights = scale / K``.
        """
        generator = as_generator(generator, completion_mask.device)
        k = self.num_samples
        gen_device = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand(k, generator=generator, device=gen_device, dtype=torch.float64).cpu()  # (K,)
        if self.stratified:
            t = (torch.arange(1, k + 1, dtype=torch.float64) - u) / k  # (K,) in ((k-1)/K, k/K]
        else:
            t = 1.0 - u  # (K,) in (0, 1]
        masks, scale = sample_masks(completion_mask, t, self.masking, generator)  # (K, B, L), (K, B)
        return MaskPlan(masks=masks, weights=scale / k, t=t)
