"""SDMC: Gauss–Legendre quadrature over the diffusion time, Monte Carlo over masks (GDPO)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import check_masking_mode, sample_masks
from dlmrl.estimators.moments import Moments, SizeStats, bernoulli_draw, mixture, pair_draw
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.validation import check_positive_int


@dataclass(frozen=True)
class SDMC(PlanEstimator):
    """Semi-deterministic Monte Carlo ELBO estimate with ``N·K`` forward passes per sequence.

    ``ELBO ≈ Σ_n w_n · (1/K) Σ_k scale(t_n, m_{n,k}) · S(m_{n,k})`` with Gauss–Legendre nodes
    ``t_n`` and weights ``w_n`` on [0, 1] and ``scale = 1/t_n`` (``bernoulli``, ``reference``) or
    ``L_b/k`` (``exact_count``). With ``bernoulli`` masking ``E_m[scale·S(m)]`` is a polynomial of
    degree ``L−1`` in ``t``, so the quadrature is exact in expectation once ``2N − 1 ≥ L − 1``;
    with ``exact_count`` it integrates a step function and its bias shrinks as N grows.

    Args:
        num_nodes: N quadrature nodes (>= 1; GDPO uses 2–3).
        samples_per_node: K masks per node (>= 1; GDPO uses 1).
        masking: ``exact_count`` (default), ``bernoulli`` or ``reference``.

    Reference: GDPO arXiv 2510.08554 §4 (SDMC).
    """

    num_nodes: int = 3
    samples_per_node: int = 1
    masking: str = "exact_count"
    name = "sdmc"
    nfe_formula = "N·K (num_nodes · samples_per_node)"

    def __post_init__(self) -> None:
        check_positive_int(self.num_nodes, "num_nodes")
        check_positive_int(self.samples_per_node, "samples_per_node")
        check_masking_mode(self.masking)

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: N·K."""
        return self.num_nodes * self.samples_per_node

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> MaskPlan:
        """Draw K masks at each of the N nodes.

        Args:
            completion_mask: ``(B, L)`` bool, positions that may be masked.
            generator: ``torch.Generator`` (or an integer seed) for the masks.
            prompt_mask: unused (the prompt is never masked).
        Returns:
            :class:`MaskPlan` with ``S = N·K`` samples, node-major (``t`` = each node repeated K
            times) and ``weights = w_n · scale / K``.
        """
        generator = as_generator(generator, completion_mask.device)
        t_nodes, w_nodes = gauss_legendre_unit(self.num_nodes)  # (N,), (N,)
        k = self.samples_per_node
        t = t_nodes.repeat_interleave(k)  # (S,)
        masks, scale = sample_masks(completion_mask, t, self.masking, generator)  # (S, B, L), (S, B)
        w = w_nodes.repeat_interleave(k).to(scale.device)  # (S,)
        weights = (w[:, None] * scale.double() / k).float()  # (S, B)
        return MaskPlan(masks=masks, weights=weights, t=t)

    def moments(self, stats: SizeStats) -> Moments:
        """Exact mean and variance for one row from its :class:`SizeStats` (see ``moments.py``).

        The nodes are fixed, so the whole variance is mask variance (``variance_t = 0``).
        """
        n = stats.n
        t_nodes, w_nodes = gauss_legendre_unit(self.num_nodes)
        parts = []
        for t, w in zip(t_nodes.tolist(), w_nodes.tolist()):
            if self.masking == "bernoulli":
                mu, second = bernoulli_draw(stats, t, w / t)
            else:
                k = math.ceil(t * n) if self.masking == "exact_count" else math.floor(t * n)
                k = min(max(k, 1), n)
                scale = n / k if self.masking == "exact_count" else 1.0 / t
                mu, second = pair_draw(stats, k, w * scale)
            parts.append(mixture([1.0], [mu], [second]).average_of(self.samples_per_node))
        return Moments.independent_sum(parts)
