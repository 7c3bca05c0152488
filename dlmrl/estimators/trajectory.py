"""The likelihood of the trajectory the sampler took: one canvas per (merged) step, scoring the tokens it revealed.

The ELBO estimators score a completion as if any order of unmasking could have produced it; the sampler took
one. Given its record ``τ(i)`` (the step that revealed token ``i``; :attr:`dlmrl.models.sampler.SampleOutput.
reveal_step`), the log-likelihood of the completion along that order is

    log π_θ(y | τ) = Σ_s Σ_{i : τ(i) = s} log p_θ(y^i | y with {j : τ(j) >= s} masked, q)

with one forward pass per step: the canvas the sampler saw before that step (earlier blocks decoded, the
current and later positions still masked), scoring exactly the tokens it revealed there. This is one more
:class:`~dlmrl.estimators.mask_plan.MaskPlan` (``masks``: still masked; ``scored``: revealed at the step), so
old, new and reference policies share it by construction and it scores in micro-batches like any plan.

Reference: TraceRL arXiv 2509.06949 (code Gen-Verse/dLLM-RL ``train/rl_llada.py``: ``collapse_k_unique`` and
the step-map canvases); d2 arXiv 2509.21474 (StepMerge); JustGRPO arXiv 2601.15165 (the left-to-right order).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.scoring import PlanEstimator
from dlmrl.estimators.validation import OptionError, check_positive_int
from dlmrl.models.sampler import NOT_SAMPLED

ORDERS = ("sampled", "left_to_right")


def left_to_right_order(completion_mask: torch.Tensor) -> torch.Tensor:
    """``τ(i)`` = the rank of position ``i`` among the row's completion positions (0, 1, 2, ...), an
    autoregressive order; :data:`~dlmrl.models.sampler.NOT_SAMPLED` elsewhere. ``(B, L)`` bool -> ``(B, L)`` long."""
    mask = completion_mask.bool()
    return torch.where(mask, mask.long().cumsum(-1) - 1, NOT_SAMPLED)


def trajectory_plan(completion_mask: torch.Tensor, reveal_step: torch.Tensor, merge: int = 1,
                    temperature: float | None = None) -> MaskPlan:
    """The :class:`MaskPlan` of a recorded trajectory.

    Each row's distinct reveal steps, in order, are cut into segments of ``merge`` consecutive steps (TraceRL's
    ``shrink``: ``collapse_k_unique``; d2's snapshots); segment ``j`` of a row is scored from the canvas before
    its first step: ``masks[j]`` = the completion positions revealed at or after that step, ``scored[j]`` =
    those revealed within the segment, weight 1. ``merge = 1`` is exact; ``merge = S`` scores every token from
    the first canvas (all masked), one pass. A row has ``⌈U_b / merge⌉`` canvases (``U_b`` its distinct steps);
    ``S`` is the largest, and a row's canvases past its own count score nothing (they are not run).

    Args:
        completion_mask: ``(B, L)`` bool, the scored positions; every one needs a step.
        reveal_step: ``(B, L)`` long step indices (``>= 0`` on the completion mask).
        merge: steps per segment, ``>= 1``.
        temperature: the plan's log-prob temperature (see :class:`MaskPlan`; ``None`` = the denoiser's softmax).
    Returns:
        :class:`MaskPlan` with ``masks``, ``scored`` ``(S, B, L)``, ``weights`` 1 on canvases that score
        something (else 0) and ``t`` NaN.
    Raises:
        ValueError: on mismatched shapes, ``merge < 1``, or a completion position without a reveal step.
    """
    check_positive_int(merge, "merge")
    mask = completion_mask.bool()
    if reveal_step.shape != mask.shape:
        raise ValueError(f"reveal_step {tuple(reveal_step.shape)} must have the completion's shape {tuple(mask.shape)}")
    step = reveal_step.to(mask.device).long()
    missing = mask & (step < 0)
    if missing.any():
        b, i = missing.nonzero()[0].tolist()
        raise ValueError(f"completion position {i} of row {b} has no reveal step (the sampler did not write it); "
                         "use order='left_to_right', or give such rows a trajectory "
                         "(dlmrl.models.sampler.left_to_right_reveal_steps)")
    batch = mask.shape[0]
    top = int(step[mask].max()) + 1 if mask.any() else 0
    present = torch.zeros(batch, top + 1, dtype=torch.bool, device=mask.device)  # (B, top + 1)
    present.scatter_(1, torch.where(mask, step, top), True)
    present[:, top] = False  # (the column off-mask positions were sent to)
    dense = present.long().cumsum(-1) - 1  # (B, top + 1): rank of a step among the row's distinct steps
    segment = torch.where(mask, dense.gather(1, step.clamp(min=0, max=top)) // merge, -1)  # (B, L)
    num = int(segment.max()) + 1 if mask.any() else 0  # S
    j = torch.arange(num, device=mask.device)[:, None, None]  # (S, 1, 1)
    masks = mask[None] & (segment[None] >= j)  # (S, B, L)
    scored = mask[None] & (segment[None] == j)  # (S, B, L)
    weights = scored.any(-1).float()  # (S, B)
    t = torch.full((num,), float("nan"), dtype=torch.float64)
    return MaskPlan(masks=masks, weights=weights, t=t, scored=scored, temperature=temperature)


@dataclass(frozen=True)
class Trajectory(PlanEstimator):
    """The exact log-likelihood of a completion along an unmasking order, given that order.

    ``order="sampled"``: the sampler's own record (``reveal_step`` of the rollout), so the loss pushes the
    policy that sampled, along the order it took; ``order="left_to_right"``: ``τ(i) = i`` over the completion
    positions, the chain rule of an autoregressive order (JustGRPO), valid for any completion. ``merge`` groups
    consecutive steps (TraceRL's shrink): NFE ``⌈S / merge⌉`` for ``S`` sampling steps (``⌈L / merge⌉`` for
    ``left_to_right``). Per-token contributions: ``log p`` of each token at the one canvas that scores it, so
    they sum to ``log π_θ(y | τ)``. Given the rollout the estimate is deterministic (variance 0).

    **Choices, marked as dlmrl's**: log-probs are those of the sampler's token distribution at the sampling
    ``temperature`` (``softmax(logits / T)``, the mask token left out, as :func:`~dlmrl.models.sampler.generate`
    draws; TRL's GRPO also scores at the sampling temperature; TraceRL's code scores at T = 1 over the full
    vocabulary), so a ratio of 1 means "the sampler's own probabilities"; a greedy rollout (T = 0) is scored at
    T = 1. The dependence of the low-confidence *choice of positions* on θ is ignored, as TraceRL and d2 do:
    this is the likelihood of the tokens given the order, not of the order.

    Args:
        merge: steps per scored segment (>= 1; 1 = exact).
        order: ``sampled`` (needs the rollout's ``reveal_step``) or ``left_to_right``.
        temperature: log-prob temperature ``T > 0`` (the trainer passes ``sampling.temperature``, 1 if greedy).
        steps: the sampler's steps, for :attr:`nfe` (``None``: unknown until a rollout is scored).

    Reference: TraceRL arXiv 2509.06949 (Gen-Verse/dLLM-RL ``rl_llada.py``, shrink); d2 arXiv 2509.21474
    (StepMerge); JustGRPO arXiv 2601.15165 (left-to-right likelihood).
    """

    merge: int = 1
    order: str = "sampled"
    temperature: float = 1.0
    steps: int | None = None
    name = "trajectory"
    nfe_formula = "⌈steps / merge⌉ (order sampled; ⌈L / merge⌉ left_to_right)"
    KEY_OF: ClassVar[Mapping[str, str]] = {"temperature": "sampling.temperature", "steps": "sampling.steps"}

    @classmethod
    def flat_options(cls, flat, sampling=None) -> dict:
        """``merge`` and ``order`` as they are; from the sampler its ``temperature`` (1 when greedy: a greedy
        rollout is scored at T = 1) and its most ``steps`` (``max_steps``; the figure the NFE is bounded by)."""
        out = {k: flat[k] for k in cls.reads(flat)}
        if sampling is not None:
            out.update(temperature=sampling.temperature if sampling.temperature > 0 else 1.0,
                       steps=sampling.max_steps)
        return out

    def notes(self) -> dict[str, str]:
        scores = ("the order the sampler took (its reveal-step record), one canvas per merged step"
                  if self.order == "sampled" else "the left-to-right chain rule, one canvas per merged token")
        return {"scores": scores, "variance": "0 given the rollout (no random masks)"}

    def __post_init__(self) -> None:
        check_positive_int(self.merge, "merge")
        if self.order not in ORDERS:
            raise OptionError("order", f"order must be one of {', '.join(map(repr, ORDERS))}; got {self.order!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise OptionError("temperature", f"temperature must be > 0, got {self.temperature!r}")
        if self.steps is not None:
            check_positive_int(self.steps, "steps")

    @property
    def nfe(self) -> int | None:
        """Forward passes per sequence: ``⌈steps / merge⌉`` (sampled; at most); ``None`` when it depends on the
        canvas (``left_to_right``) or the steps are unknown."""
        if self.order == "sampled" and self.steps is not None:
            return math.ceil(self.steps / self.merge)
        return None

    def nfe_for(self, length: int) -> int:
        """Forward passes for a canvas of ``length`` completion tokens (at most one step per token)."""
        count = length if self.order == "left_to_right" or self.steps is None else min(self.steps, length)
        return math.ceil(count / self.merge)

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
        reveal_step: torch.Tensor | None = None,
    ) -> MaskPlan:
        """The trajectory's plan (no randomness: ``generator`` and ``prompt_mask`` are unused).

        Args:
            completion_mask: ``(B, L)`` bool.
            reveal_step: ``(B, L)`` long, the rollout's record; required for ``order="sampled"``.
        Raises:
            ValueError: ``order="sampled"`` without ``reveal_step``, or see :func:`trajectory_plan`.
        """
        if self.order == "left_to_right":
            reveal_step = left_to_right_order(completion_mask)
        elif reveal_step is None:
            raise ValueError("the trajectory estimator with order='sampled' needs the rollout's reveal steps "
                             "(generate(...).reveal_step); use order='left_to_right' for completions without one")
        return trajectory_plan(completion_mask, reveal_step, self.merge, self.temperature)

    def rollout_plan(self, completion_mask, generator=None, prompt_mask=None, *, reveal_step=None,
                     advantages=None) -> MaskPlan:
        return self.make_plan(completion_mask, generator, prompt_mask, reveal_step)
