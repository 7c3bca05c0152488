"""The randomness of one likelihood estimate: which canvas positions are masked, and with what weight.

A :class:`MaskPlan` is drawn once per inner iteration and then scores the current, old and
reference policies alike (common random numbers), so the importance ratio between them reflects
the policies and not the mask noise.

Reference: VRPO arXiv 2505.19223 §3 (antithetic sampling / shared masks); GDPO arXiv 2510.08554 §4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MaskPlan:
    """S mask samples for a batch of B canvases of length L.

    The estimate built from a plan is, per row ``b``,
    ``Σ_s weights[s, b] · S(masks[s, b])`` with ``S(m) = Σ_{i∈m} log p_θ(y^i | y_m, q)`` (nats).

    Attributes:
        masks: ``(S, B, L)`` bool, True where sample ``s`` masks position ``i`` of row ``b``.
            Must lie inside the completion mask the plan is scored with (checked by the scorer).
        weights: ``(S, B)`` float32, the full multiplier of ``S(m)``: quadrature weight, the
            ``1/t`` or ``L_b/k`` scale and the ``1/K`` sample average.
        t: ``(S,)`` float64 diffusion times shared by the rows, or ``(S, B)`` one per row (bookkeeping
            only); NaN where a sample has no time (e.g. exact enumeration).
        prompt_masks: optional ``(S, B, P)`` bool, prompt positions replaced by the mask token in
            sample ``s`` (diffu-GRPO's ``one_step`` masks the prompt); ``None`` = prompt never masked.

    Reference: VRPO arXiv 2505.19223 (common random numbers); GDPO arXiv 2510.08554 §4.
    """

    masks: torch.Tensor
    weights: torch.Tensor
    t: torch.Tensor
    prompt_masks: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.masks.dtype != torch.bool or self.masks.dim() != 3:
            raise ValueError(
                f"MaskPlan.masks must be a (S, B, L) bool tensor, got {tuple(self.masks.shape)} "
                f"{self.masks.dtype}"
            )
        s, b, _ = self.masks.shape
        if tuple(self.weights.shape) != (s, b):
            raise ValueError(
                f"MaskPlan.weights must have shape (S, B) = {(s, b)}, got {tuple(self.weights.shape)}"
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

    @property
    def nfe(self) -> int:
        """Denoiser forward passes per sequence (= S)."""
        return int(self.masks.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.masks.shape[0])

    def rows(self, index: torch.Tensor) -> MaskPlan:
        """The plan of rows ``index`` (a ``(K,)`` long tensor) of the batch: each row keeps its own masks."""
        index = torch.as_tensor(index, dtype=torch.long)
        pm = None if self.prompt_masks is None else self.prompt_masks[:, index.to(self.prompt_masks.device)]
        t = self.t if self.t.dim() == 1 else self.t[:, index.to(self.t.device)]
        return MaskPlan(masks=self.masks[:, index.to(self.masks.device)],
                        weights=self.weights[:, index.to(self.weights.device)], t=t, prompt_masks=pm)

    def to(self, device: torch.device | str) -> MaskPlan:
        """The same plan on ``device`` (``t`` stays where it is: it is bookkeeping only)."""
        pm = None if self.prompt_masks is None else self.prompt_masks.to(device)
        return MaskPlan(masks=self.masks.to(device), weights=self.weights.to(device), t=self.t, prompt_masks=pm)

    def __repr__(self) -> str:
        s, b, length = self.masks.shape
        ts = ", ".join("nan" if math.isnan(x) else f"{x:.4g}" for x in self.t.flatten().tolist()[:6])
        more = ", ..." if s > 6 else ""
        return f"MaskPlan(S={s}, B={b}, L={length}, t=[{ts}{more}])"
