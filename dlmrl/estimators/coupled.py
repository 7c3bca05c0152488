"""Coupled (complementary) masks: every completion token scored exactly once per pair (DiffuCoder)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import bernoulli_masks, check_masking_mode, count_masks
from dlmrl.estimators.moments import (
    Moments,
    SizeStats,
    count_interval_probs,
    mixture,
    pair_draw,
    time_mixture,
)
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.estimators.validation import OptionError, check_positive_int, check_unit_interval

COUPLED_MODES = ("bernoulli", "exact_count")


def complementary_plan(
    completion_mask: torch.Tensor,
    masks: torch.Tensor,
    scale: torch.Tensor,
    scale_complement: torch.Tensor,
    t: torch.Tensor,
) -> MaskPlan:
    """Interleave masks and their complements into one plan: ``[m_1, m_1^c, m_2, m_2^c, ...]``.

    Args:
        completion_mask: ``(B, L)`` bool.
        masks: ``(S', B, L)`` bool, the first mask of each pair.
        scale, scale_complement: ``(S', B)`` float64 multipliers of ``S(m)`` and ``S(m^c)``.
        t: ``(S',)`` or ``(S', B)`` float64 time of the first mask (the complement gets ``1 − t``).
    Returns:
        :class:`MaskPlan` with ``S = 2·S'``. An empty mask gets weight 0.
    """
    comp = completion_mask.bool()[None] & ~masks  # (S', B, L)
    both = torch.stack([masks, comp], dim=1).flatten(0, 1)  # (2S', B, L)
    weights = torch.stack([scale, scale_complement], dim=1).flatten(0, 1)  # (2S', B)
    weights = torch.where(both.any(-1), weights, torch.zeros_like(weights))
    times = torch.stack([t, 1.0 - t], dim=1).flatten(0, 1)  # (2S',) or (2S', B)
    return MaskPlan(masks=both, weights=weights.float(), t=times)


@dataclass(frozen=True)
class Coupled(PlanEstimator):
    """K pairs of a mask and its complement at random times; NFE = 2K.

    Per pair, with ``t ~ U(t_min, t_max)``:

    - ``bernoulli`` (DiffuCoder): ``m ~ Bernoulli(t)^L``, value ``½ [S(m)/t + S(m^c)/(1−t)]``
      (``m^c`` is a ``Bernoulli(1−t)`` mask, so the pair's mean is ``½[g(t) + g(1−t)]``);
    - ``exact_count``: ``k = clamp(ceil(t·L_b), 1, L_b)`` uniform positions and the other
      ``L_b − k``, value ``½ [(L_b/k) S(m) + (L_b/(L_b−k)) S(m^c)]``; when ``k = L_b`` the
      complement is empty and the value is ``S(m)`` alone (this keeps the estimate unbiased).

    The estimate averages the K pair values. **(dlmrl interpretation)**: the pair is averaged
    (DiffuCoder weights the two halves by ``1/t`` and ``1/(1−t)``; the ½ makes the expectation
    the ELBO). With ``(t_min, t_max) = (0, 1)`` both modes are unbiased (``bernoulli`` then has
    infinite variance, like Bernoulli double MC); DiffuCoder's default ``(0.2, 0.8)`` truncates
    the time integral symmetrically, which is unbiased only where ``g`` is linear.

    Args:
        num_pairs: K (>= 1).
        masking: ``bernoulli`` (default) or ``exact_count``.
        t_min, t_max: the time interval, ``0 <= t_min < t_max <= 1`` (default 0.2, 0.8).

    Reference: DiffuCoder coupled-GRPO, Gong et al., arXiv 2506.20639 §4 (coupled sampling).
    """

    num_pairs: int = 1
    masking: str = "bernoulli"
    t_min: float = 0.2
    t_max: float = 0.8
    name = "coupled"
    nfe_formula = "2K (2 · num_pairs)"
    FLAT_KEYS = frozenset({"samples_per_node", "masking", "t_min", "t_max"})
    KEY_OF: ClassVar[Mapping[str, str]] = {"num_pairs": "estimator.samples_per_node"}

    @classmethod
    def flat_options(cls, flat, sampling=None) -> dict:
        """``num_pairs = samples_per_node``; ``masking``, ``t_min``, ``t_max`` as they are."""
        out = {k: flat[k] for k in ("masking", "t_min", "t_max") if k in flat}
        if "samples_per_node" in flat:
            out["num_pairs"] = flat["samples_per_node"]
        return out

    def __post_init__(self) -> None:
        check_positive_int(self.num_pairs, "num_pairs")
        check_masking_mode(self.masking, COUPLED_MODES)
        lo = check_unit_interval(self.t_min, "t_min")
        hi = check_unit_interval(self.t_max, "t_max")
        if not lo < hi:
            raise OptionError("t_min", f"coupled needs t_min < t_max, got {lo} and {hi}")

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: 2K."""
        return 2 * self.num_pairs

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> MaskPlan:
        """Draw K times and masks; add the complements.

        Args:
            completion_mask: ``(B, L)`` bool, positions that may be masked.
            generator: ``torch.Generator`` (or an integer seed).
            prompt_mask: unused (the prompt is never masked).
        Returns:
            :class:`MaskPlan` with ``S = 2K`` samples, pair-major ``[m_1, m_1^c, ...]``, one time per
            pair and row.
        """
        generator = as_generator(generator, completion_mask.device)
        k = self.num_pairs
        allowed = completion_mask.bool()
        gen_device = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand((k, allowed.shape[0]), generator=generator, device=gen_device, dtype=torch.float64).cpu()
        t = self.t_min + (self.t_max - self.t_min) * u  # (K, B) in [t_min, t_max), one time per row
        n = allowed.sum(-1).double().cpu()[None, :].expand(k, -1)  # (K, B)
        if self.masking == "bernoulli":
            masks = bernoulli_masks(allowed, t, generator)  # (K, B, L)
            scale = 0.5 / t.clamp(min=1e-300)  # an empty mask (t = 0) gets weight 0 below
            scale_c = 0.5 / (1.0 - t).clamp(min=1e-300)
        else:
            counts = torch.minimum((t * n).ceil().clamp(min=1), n)  # (K, B)
            masks = count_masks(allowed, counts.long(), generator)
            full = counts >= n
            scale = torch.where(full, torch.ones_like(n), 0.5 * n / counts)
            scale_c = torch.where(full, torch.zeros_like(n), 0.5 * n / (n - counts).clamp(min=1))
        plan = complementary_plan(allowed.cpu(), masks.cpu(), scale / k, scale_c / k, t)
        return plan.to(allowed.device)

    def moments(self, stats: SizeStats) -> Moments:
        """Exact mean and variance for one row from its :class:`SizeStats` (see ``moments.py``)."""
        n, lo, hi = stats.n, self.t_min, self.t_max
        if self.masking == "exact_count":
            probs = count_interval_probs(n, lo, hi)  # (n+1,) over k
            mus, ss = [], []
            for k in range(n + 1):
                a, b = (1.0, 0.0) if k == n else (0.5 * n / max(k, 1), 0.5 * n / max(n - k, 1))
                mu, s = pair_draw(stats, k, a, b)
                mus.append(mu)
                ss.append(s)
            return mixture(probs, mus, ss).average_of(self.num_pairs)
        singular = (lo == 0.0 or hi == 1.0) and stats.q[1] > 0
        weights = lambda t: (0.5 / t, 0.5 / (1.0 - t))
        return time_mixture(stats, lo, hi, weights, singular=singular).average_of(self.num_pairs)


@dataclass(frozen=True)
class StratifiedCoupled(PlanEstimator):
    """ESPO's ELBO estimate: mask counts stratified across the batch's rows, each mask with its complement.

    Per pair: one ``u_0 ~ U(0, 1)`` for the batch, row ``b`` gets ``u_b = (u_0 + b/B) mod 1`` and the count
    ``x_b = floor(u_b · (L_b + 1)) ∈ {0, ..., L_b}`` (so the rows' counts spread evenly over the range, and each
    row's count is uniform); ``x_b`` uniform positions are masked and, in a second canvas, the other
    ``L_b − x_b``. Value ``½ [(L_b+1)/x_b · S(m) + (L_b+1)/(L_b−x_b) · S(m^c)]`` (an empty half counts 0): each
    half alone is an unbiased ELBO estimate, since ``E_x[(L+1)/x · h(x)] = Σ_{x=1}^{L} h(x)/x``, and every
    token is scored once per pair. The estimate averages K pairs; NFE = 2K.

    **(dlmrl interpretation)**: ESPO stratifies over the rows of a device's micro-batch with an integer offset
    ``k ~ U{0..L}`` and a fixed padded ``L``; here the offset is continuous, the stratification runs over the
    whole batch and ``L_b`` is each row's own completion length.

    Args:
        num_pairs: K (ESPO's ``num_mc``: 2 in its task scripts).

    Reference: ESPO arXiv 2512.03759, code ML-GSAI/ESPO ``espo/espo_trainer.py`` (``forward_process``,
    ``_get_elbo`` with ``reduce_var``).
    """

    num_pairs: int = 1
    name = "stratified_coupled"
    nfe_formula = "2K (2 · num_pairs)"
    FLAT_KEYS = frozenset({"samples_per_node"})
    KEY_OF: ClassVar[Mapping[str, str]] = {"num_pairs": "estimator.samples_per_node"}

    @classmethod
    def flat_options(cls, flat, sampling=None) -> dict:
        """``num_pairs = samples_per_node``."""
        return {"num_pairs": flat["samples_per_node"]} if "samples_per_node" in flat else {}

    def __post_init__(self) -> None:
        check_positive_int(self.num_pairs, "num_pairs")

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: 2K."""
        return 2 * self.num_pairs

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> MaskPlan:
        """Draw K stratified counts per row and the masks; add the complements (``prompt_mask`` unused).

        Returns:
            :class:`MaskPlan` with ``S = 2K`` samples, pair-major ``[m_1, m_1^c, ...]``.
        """
        generator = as_generator(generator, completion_mask.device)
        k = self.num_pairs
        allowed = completion_mask.bool()
        batch = allowed.shape[0]
        gen_device = generator.device if generator is not None else torch.device("cpu")
        u0 = torch.rand((k, 1), generator=generator, device=gen_device, dtype=torch.float64).cpu()
        u = (u0 + torch.arange(batch, dtype=torch.float64)[None] / max(batch, 1)) % 1.0  # (K, B)
        n = allowed.sum(-1).double().cpu()[None, :].expand(k, -1)  # (K, B)
        counts = torch.minimum((u * (n + 1)).floor(), n)  # (K, B) in {0..L_b}
        masks = count_masks(allowed, counts.long(), generator)
        scale = torch.where(counts > 0, 0.5 * (n + 1) / counts.clamp(min=1), 0.0)
        scale_c = torch.where(counts < n, 0.5 * (n + 1) / (n - counts).clamp(min=1), 0.0)
        t = counts / (n + 1)
        plan = complementary_plan(allowed.cpu(), masks.cpu(), scale / k, scale_c / k, t)
        return plan.to(allowed.device)

    def moments(self, stats: SizeStats) -> Moments:
        """Exact mean and variance for one row (its count is uniform on ``{0..n}``; rows are stratified
        together, but each row's own moments are these)."""
        n = stats.n
        mus, ss = [], []
        for x in range(n + 1):
            a = 0.5 * (n + 1) / x if x > 0 else 0.0
            b = 0.5 * (n + 1) / (n - x) if x < n else 0.0
            mu, s = pair_draw(stats, x, a, b)
            mus.append(mu)
            ss.append(s)
        return mixture([1.0 / (n + 1)] * (n + 1), mus, ss).average_of(self.num_pairs)
