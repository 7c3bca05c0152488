"""Double Monte Carlo: random diffusion times, one random mask each (LLaDA's likelihood estimate)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import check_masking_mode, sample_masks
from dlmrl.estimators.moments import (
    Moments,
    SizeStats,
    count_interval_probs,
    mixture,
    pair_draw,
    time_mixture,
)
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.validation import check_positive_int

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
    nfe_formula = "K (num_samples)"
    # the config's N·K: as many times as the default SDMC has forward passes
    FLAT_KEYS = frozenset({"num_nodes", "samples_per_node", "masking", "stratified"})
    KEY_OF: ClassVar[Mapping[str, str]] = {"num_samples": "estimator.samples_per_node"}

    @classmethod
    def flat_options(cls, flat, sampling=None) -> dict:
        """``num_samples = num_nodes · samples_per_node``; ``masking`` and ``stratified`` as they are."""
        out = {k: flat[k] for k in ("masking", "stratified") if k in flat}
        if "num_nodes" in flat and "samples_per_node" in flat:
            out["num_samples"] = flat["num_nodes"] * flat["samples_per_node"]
        return out

    def __post_init__(self) -> None:
        check_positive_int(self.num_samples, "num_samples")
        check_masking_mode(self.masking, DOUBLE_MC_MODES)

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
        """Draw K times and one mask at each.

        Args:
            completion_mask: ``(B, L)`` bool, positions that may be masked.
            generator: ``torch.Generator`` (or an integer seed) for times and masks.
            prompt_mask: unused (the prompt is never masked).
        Returns:
            :class:`MaskPlan` with ``S = K`` samples, ``t (K, B)`` drawn independently for each
            row, and ``weights = scale / K``.
        """
        generator = as_generator(generator, completion_mask.device)
        k = self.num_samples
        batch = completion_mask.shape[0]
        gen_device = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand((k, batch), generator=generator, device=gen_device, dtype=torch.float64).cpu()  # (K, B)
        if self.stratified:
            t = (torch.arange(1, k + 1, dtype=torch.float64)[:, None] - u) / k  # (K, B) in ((k-1)/K, k/K]
        else:
            t = 1.0 - u  # (K, B) in (0, 1]
        masks, scale = sample_masks(completion_mask, t, self.masking, generator)  # (K, B, L), (K, B)
        return MaskPlan(masks=masks, weights=scale / k, t=t)

    def moments(self, stats: SizeStats) -> Moments:
        """Exact mean and variance for one row from its :class:`SizeStats` (see ``moments.py``).

        ``bernoulli``: the mask variance is ``inf`` (a lone masked token carries weight ``1/t`` as
        ``t → 0``); the time part and the mean are finite.
        """
        n, k = stats.n, self.num_samples
        strata = [((j - 1) / k, j / k) for j in range(1, k + 1)] if self.stratified else [(0.0, 1.0)]
        parts = []
        for lo, hi in strata:
            if self.masking == "exact_count":
                probs = count_interval_probs(n, lo, hi)
                draws = [pair_draw(stats, c, n / max(c, 1)) for c in range(n + 1)]
                parts.append(mixture(probs, [d[0] for d in draws], [d[1] for d in draws]))
            else:
                singular = lo == 0.0 and stats.q[1] > 0
                parts.append(time_mixture(stats, lo, hi, lambda t: (1.0 / t, 0.0), singular=singular))
        if self.stratified:
            return Moments.independent_mean(parts)
        return parts[0].average_of(k)
