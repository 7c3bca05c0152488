"""Coupled SDMC: Gauss–Legendre node pairs (t, 1−t) share one mask and its complement."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dlmrl.estimators.coupled import complementary_plan
from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import bernoulli_masks, check_masking_mode, count_masks, sample_masks
from dlmrl.estimators.moments import Moments, SizeStats, bernoulli_draw, mixture, pair_draw
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.validation import check_positive_int

COUPLED_SDMC_MODES = ("exact_count", "bernoulli")


def node_pairs(num_nodes: int) -> tuple[list[tuple[float, float, float, float]], tuple[float, float] | None]:
    """Gauss–Legendre nodes as symmetric pairs ``(t, w, t', w')`` with ``t < ½``, plus the middle node.

    Returns:
        ``(pairs, middle)`` where ``middle`` is ``(0.5, w)`` for odd N, else ``None``.
    """
    t, w = gauss_legendre_unit(num_nodes)
    t, w = t.tolist(), w.tolist()
    pairs = [(t[i], w[i], t[-1 - i], w[-1 - i]) for i in range(num_nodes // 2)]
    middle = (t[num_nodes // 2], w[num_nodes // 2]) if num_nodes % 2 else None
    return pairs, middle


def pair_count(t: float, n: int) -> int:
    """Tokens masked at the smaller node of a pair: ``round(t·n)`` clamped to ``[1, n−1]`` (``1`` if n = 1)."""
    return min(max(math.floor(t * n + 0.5), 1), max(n - 1, 1))


@dataclass(frozen=True)
class CoupledSDMC(PlanEstimator):
    """SDMC whose symmetric node pairs use complementary masks; NFE = N·K.

    Gauss–Legendre nodes on [0, 1] are symmetric: ``t_{N+1−n} = 1 − t_n`` with equal weights. For
    each pair, K masks ``m`` are drawn at the smaller node and scored together with their
    complements, so every maskable token is scored exactly once per pair (DiffuCoder's coupling at
    GDPO's quadrature nodes):

    - ``exact_count``: ``k = round(t·L_b)`` (clamped to ``[1, L_b − 1]``) uniform positions and the
      other ``L_b − k``; value ``w·(L_b/k)·S(m) + w'·(L_b/(L_b−k))·S(m^c)``. When ``L_b = 1`` the
      complement is empty and the single mask carries ``(w + w')·S(m)``.
    - ``bernoulli``: ``m ~ Bernoulli(t)``, value ``w·S(m)/t + w'·S(m^c)/(1−t)``: each half has
      the SDMC-Bernoulli expectation at its node, so the mean equals Bernoulli SDMC's.

    A middle node (odd N, ``t = ½``) gets its own masks, drawn as in :class:`SDMC`. The estimate
    is ``Σ`` over pairs and the middle node of the mean over their K draws. Biased only by
    quadrature, like SDMC; the pairing makes the two halves negatively correlated.

    Args:
        num_nodes: N (>= 1).
        samples_per_node: K draws per pair or middle node.
        masking: ``exact_count`` (default) or ``bernoulli``.

    Reference: dlmrl (GDPO arXiv 2510.08554 §4 quadrature + DiffuCoder arXiv 2506.20639 coupling).
    """

    num_nodes: int = 3
    samples_per_node: int = 1
    masking: str = "exact_count"
    name = "coupled_sdmc"
    nfe_formula = "N·K (num_nodes · samples_per_node)"

    def __post_init__(self) -> None:
        check_positive_int(self.num_nodes, "num_nodes")
        check_positive_int(self.samples_per_node, "samples_per_node")
        check_masking_mode(self.masking, COUPLED_SDMC_MODES)

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
        """Draw K masks per node pair (with complements) and K at the middle node.

        Args:
            completion_mask: ``(B, L)`` bool, positions that may be masked.
            generator: ``torch.Generator`` (or an integer seed).
            prompt_mask: unused (the prompt is never masked).
        Returns:
            :class:`MaskPlan` with ``S = N·K``: pairs first (``[m, m^c]`` per draw), then the middle node.
        """
        generator = as_generator(generator, completion_mask.device)
        allowed = completion_mask.bool()
        kk = self.samples_per_node
        lengths = allowed.sum(-1).cpu()  # (B,)
        pairs, middle = node_pairs(self.num_nodes)
        plans = []
        for t, w, _, w2 in pairs:
            ts = torch.full((kk,), t, dtype=torch.float64)
            n = lengths.double()[None, :].expand(kk, -1)  # (K, B)
            if self.masking == "bernoulli":
                masks = bernoulli_masks(allowed, ts, generator)
                scale, scale_c = torch.full_like(n, w / t), torch.full_like(n, w2 / (1.0 - t))
            else:
                counts = torch.tensor([pair_count(t, int(m)) for m in lengths.tolist()], dtype=torch.long)
                counts = counts[None, :].expand(kk, -1)  # (K, B)
                masks = count_masks(allowed, counts, generator)
                single = n <= 1
                scale = torch.where(single, torch.full_like(n, w + w2), w * n / counts)
                scale_c = torch.where(single, torch.zeros_like(n), w2 * n / (n - counts).clamp(min=1))
            plans.append(complementary_plan(allowed.cpu(), masks.cpu(), scale / kk, scale_c / kk, ts))
        if middle is not None:
            t, w = middle
            ts = torch.full((kk,), t, dtype=torch.float64)
            masks, scale = sample_masks(allowed, ts, self.masking, generator)
            plans.append(MaskPlan(masks=masks.cpu(), weights=(w * scale.double().cpu() / kk).float(), t=ts))
        plan = MaskPlan(
            masks=torch.cat([p.masks for p in plans]),
            weights=torch.cat([p.weights for p in plans]),
            t=torch.cat([p.t for p in plans]),
        )
        return plan.to(allowed.device)

    def moments(self, stats: SizeStats) -> Moments:
        """Exact mean and variance for one row from its :class:`SizeStats` (see ``moments.py``)."""
        n = stats.n
        pairs, middle = node_pairs(self.num_nodes)
        parts = []
        for t, w, _, w2 in pairs:
            if self.masking == "bernoulli":
                mu, second = bernoulli_draw(stats, t, w / t, w2 / (1.0 - t))
            elif n == 1:
                mu, second = pair_draw(stats, 1, w + w2)
            else:
                k = pair_count(t, n)
                mu, second = pair_draw(stats, k, w * n / k, w2 * n / (n - k))
            parts.append(mixture([1.0], [mu], [second]).average_of(self.samples_per_node))
        if middle is not None:
            t, w = middle
            if self.masking == "bernoulli":
                mu, second = bernoulli_draw(stats, t, w / t)
            else:
                k = min(max(math.ceil(t * n), 1), n)
                mu, second = pair_draw(stats, k, w * n / k)
            parts.append(mixture([1.0], [mu], [second]).average_of(self.samples_per_node))
        return Moments.independent_sum(parts)
