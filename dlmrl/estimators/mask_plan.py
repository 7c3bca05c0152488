"""The randomness of one likelihood estimate: which canvas positions are masked, and with what weight.

A :class:`MaskPlan` is drawn once per inner iteration and then scores the current, old and
reference policies alike (common random numbers), so the importance ratio between them reflects
the policies and not the mask noise.

Reference: VRPO arXiv 2505.19223 §3 (antithetic sampling / shared masks); GDPO arXiv 2510.08554 §4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class UpperBound:
    """Rows scored with SPG's evidence upper bound (EUBO) instead of the ELBO, and its settings.

    For a row ``b`` with ``rows[b]`` the per-token term is ``mix · e_{b,i} + (1 − mix) · c_{b,i}``, with
    ``c`` the plan's ELBO terms and ``e_{b,i} = (n_b / |U_b|) · (1/β) · log Σ_s w_{s,b} 1[i ∈ m_{s,b}]
    p_θ(y^i | y_{m_s}, q)^β`` for the positions ``U_b`` masked in at least one sample (``n_b`` = the row's
    completion tokens; the factor makes the terms sum to ``n_b`` times SPG's per-token mean).

    Attributes:
        rows: ``(B,)`` bool, the rows that get the upper bound (SPG: negative advantages).
        beta: the Rényi order ``β >= 1`` (SPG: 1.5; 1.0 for Sudoku).
        mix: ``ω`` in ``[0, 1]``: 1 = the EUBO alone, 0.5 = SPG's mixture ``ω·EUBO + (1−ω)·ELBO``.

    Reference: SPG arXiv 2510.09541 (code ``spg/spg_trainer.py``, EUBO and ``mix_weight``).
    """

    rows: torch.Tensor
    beta: float = 1.5
    mix: float = 1.0

    def __post_init__(self) -> None:
        if self.rows.dtype != torch.bool or self.rows.dim() != 1:
            raise ValueError(f"UpperBound.rows must be a (B,) bool tensor, got {tuple(self.rows.shape)} "
                             f"{self.rows.dtype}")
        if not self.beta >= 1:
            raise ValueError(f"UpperBound.beta must be >= 1, got {self.beta}")
        if not 0 <= self.mix <= 1:
            raise ValueError(f"UpperBound.mix must be in [0, 1], got {self.mix}")


@dataclass(frozen=True)
class MaskPlan:
    """S mask samples for a batch of B canvases of length L.

    The estimate built from a plan is, per row ``b``,
    ``Σ_s weights[s, b] · S(masks[s, b])`` with ``S(m) = Σ_{i∈m} log p_θ(y^i | y_m, q)`` (nats).

    Attributes:
        masks: ``(S, B, L)`` bool, True where sample ``s`` masks position ``i`` of row ``b``.
            Must lie inside the completion mask the plan is scored with (checked by the scorer).
        weights: ``(S, B)`` float32, the full multiplier of ``S(m)``: quadrature weight, the
            ``1/t`` or ``L_b/k`` scale and the ``1/K`` sample average. Or ``(S, B, L)``: one multiplier per
            position, for plans whose parts are drawn independently along the sequence (a block-diffusion
            plan draws each block's time on its own, :func:`~dlmrl.estimators.block_plans.per_block_plan`); the
            estimate is then ``Σ_s Σ_{i∈m_s} weights[s, b, i] · log p_θ(y^i | y_{m_s}, q)``.
        t: ``(S,)`` float64 diffusion times shared by the rows, or ``(S, B)`` one per row (bookkeeping
            only); NaN where a sample has no time (e.g. exact enumeration).
        prompt_masks: optional ``(S, B, P)`` bool, prompt positions replaced by the mask token in
            sample ``s`` (diffu-GRPO's ``one_step`` masks the prompt); ``None`` = prompt never masked.
        scored: optional ``(S, B, L)`` bool inside ``masks``: the masked positions whose log-probs count
            in sample ``s`` (the trajectory estimator masks every token not yet revealed but scores only
            those revealed at that step); ``None`` = every masked position.
        temperature: ``None``: log-probs are the denoiser's own softmax over the whole vocabulary (the
            ELBO's ``p_θ``). A float ``T > 0``: log-probs of the sampler's token distribution,
            ``softmax(logits / T)`` with the mask token left out (it is never sampled).
        upper: optional :class:`UpperBound`: rows scored with SPG's EUBO (or its mixture with the ELBO).

    A canvas whose scored set is empty, or whose weight is 0, is not run (it adds nothing).

    Reference: VRPO arXiv 2505.19223 (common random numbers); GDPO arXiv 2510.08554 §4.
    """

    masks: torch.Tensor
    weights: torch.Tensor
    t: torch.Tensor
    prompt_masks: torch.Tensor | None = None
    scored: torch.Tensor | None = None
    temperature: float | None = None
    upper: UpperBound | None = None

    def __post_init__(self) -> None:
        if self.masks.dtype != torch.bool or self.masks.dim() != 3:
            raise ValueError(
                f"MaskPlan.masks must be a (S, B, L) bool tensor, got {tuple(self.masks.shape)} "
                f"{self.masks.dtype}"
            )
        s, b, length = self.masks.shape
        if tuple(self.weights.shape) not in ((s, b), (s, b, length)):
            raise ValueError(
                f"MaskPlan.weights must have shape (S, B) = {(s, b)} or (S, B, L) = {(s, b, length)}, "
                f"got {tuple(self.weights.shape)}"
            )
        if not self.weights.is_floating_point():
            raise ValueError(f"MaskPlan.weights must be floating point, got {self.weights.dtype}")
        if tuple(self.t.shape) not in ((s,), (s, b)):
            raise ValueError(f"MaskPlan.t must have shape (S,) or (S, B) = {(s, b)}, got {tuple(self.t.shape)}")
        if not torch.isfinite(self.weights).all():
            raise ValueError("MaskPlan.weights must be finite")
        pm = self.prompt_masks
        if pm is not None and (pm.dtype != torch.bool or pm.dim() != 3 or tuple(pm.shape[:2]) != (s, b)):
            raise ValueError(
                f"MaskPlan.prompt_masks must be a (S, B, P) bool tensor with (S, B) = {(s, b)}, "
                f"got {tuple(pm.shape)} {pm.dtype}"
            )
        sc = self.scored
        if sc is not None:
            if sc.dtype != torch.bool or tuple(sc.shape) != tuple(self.masks.shape):
                raise ValueError(f"MaskPlan.scored must be a bool tensor shaped like masks {tuple(self.masks.shape)}, "
                                 f"got {tuple(sc.shape)} {sc.dtype}")
            if (sc & ~self.masks.to(sc.device)).any():
                raise ValueError("MaskPlan.scored must lie inside masks (a scored position is a masked one)")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"MaskPlan.temperature must be > 0 (or None), got {self.temperature}")
        if self.upper is not None and tuple(self.upper.rows.shape) != (b,):
            raise ValueError(f"MaskPlan.upper.rows must be (B,) = ({b},), got {tuple(self.upper.rows.shape)}")

    @property
    def nfe(self) -> int:
        """Denoiser forward passes per sequence (= S; a row's canvases that score nothing are not run, see
        :meth:`runs`)."""
        return int(self.masks.shape[0])

    def scored_masks(self) -> torch.Tensor:
        """``(S, B, L)`` bool, the positions whose log-probs count (``scored``, else ``masks``)."""
        return self.masks if self.scored is None else self.scored

    def runs(self) -> torch.Tensor:
        """``(S, B)`` bool, the canvases that are run: a non-empty scored set and a non-zero weight."""
        w = self.weights.to(self.masks.device)
        if w.dim() == 3:  # (per-position weights: some scored position must weigh)
            return (self.scored_masks() & (w != 0)).any(-1)
        return self.scored_masks().any(-1) & (w != 0)

    def position_weights(self) -> torch.Tensor:
        """``(S, B, L)`` the weight of each position's term (``weights`` broadcast along ``L`` when per row)."""
        w = self.weights
        return w if w.dim() == 3 else w[..., None].expand(*w.shape, self.masks.shape[-1])

    def forward_passes(self) -> float:
        """Forward passes per row actually run (the mean over rows of :meth:`runs`)."""
        b = self.masks.shape[1]
        return float(self.runs().sum()) / b if b else 0.0

    @property
    def num_samples(self) -> int:
        return int(self.masks.shape[0])

    def rows(self, index: torch.Tensor) -> MaskPlan:
        """The plan of rows ``index`` (an ``(n,)`` long tensor) of the batch: each row keeps its own masks."""
        index = torch.as_tensor(index, dtype=torch.long)

        def cut(x: torch.Tensor | None, dim: int = 1) -> torch.Tensor | None:
            return None if x is None else x.index_select(dim, index.to(x.device))

        t = self.t if self.t.dim() == 1 else cut(self.t)
        upper = None if self.upper is None else replace(self.upper, rows=cut(self.upper.rows, 0))
        return replace(self, masks=cut(self.masks), weights=cut(self.weights), t=t, prompt_masks=cut(self.prompt_masks),
                       scored=cut(self.scored), upper=upper)

    def to(self, device: torch.device | str) -> MaskPlan:
        """The same plan on ``device`` (``t`` stays where it is: it is bookkeeping only)."""

        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device)

        upper = None if self.upper is None else replace(self.upper, rows=self.upper.rows.to(device))
        return replace(self, masks=self.masks.to(device), weights=self.weights.to(device),
                       prompt_masks=move(self.prompt_masks), scored=move(self.scored), upper=upper)

    def __repr__(self) -> str:
        s, b, length = self.masks.shape
        ts = ", ".join("nan" if math.isnan(x) else f"{x:.4g}" for x in self.t.flatten().tolist()[:6])
        more = ", ..." if s > 6 else ""
        return f"MaskPlan(S={s}, B={b}, L={length}, t=[{ts}{more}])"
