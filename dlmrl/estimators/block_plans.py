"""Plans of composite canvases for block-diffusion likelihoods: per-block ELBO masks and the sampler's trajectory.

Both return a :class:`~dlmrl.estimators.mask_plan.MaskPlan` that :func:`dlmrl.estimators.score` scores on a
block-diffusion policy, one composite pass per canvas (:func:`~dlmrl.estimators.block_composite.composite_logits`);
:func:`block_rollout_plan` picks the right one for a training estimator.

- :func:`per_block_plan`: any estimator's mask plan (``double_mc``, ``sdmc``, ``coupled``, ``exact``, ...) drawn
  over each block's positions on its own, the per-block factor ``log p(y^b | y^{<b})`` of the block ELBO. Canvas
  ``s`` holds sample ``s`` of every block; blocks never see each other's noise, so pairing their samples this way
  leaves each block's estimate what it would be alone and the sequence estimate is their sum.
- :func:`block_trajectory_plan`: canvas ``j`` holds, in every block, that block's canvas before its ``j``-th merged
  step, scoring the tokens revealed in that segment (the trajectory likelihood per block).

Reference: BD3-LM arXiv 2503.09573 §3 (the per-block ELBO); TraceRL arXiv 2509.06949 (Gen-Verse/dLLM-RL
``train/rl_sdar.py``: ``collapse_k_unique`` per block, ``one_round_vectorized``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from dlmrl.estimators.mask_plan import MaskPlan, UpperBound
from dlmrl.estimators.scoring import PlanEstimator, as_generator
from dlmrl.models.block_attention import block_bounds

#: ``(completion_mask (B, Lb) bool, generator) -> MaskPlan``, e.g. an estimator's bound ``make_plan``
PlanFn = Callable[[torch.Tensor, "torch.Generator | None"], MaskPlan]


def per_block_plan(make_plan: PlanFn, completion_mask: torch.Tensor, block_size: int,
                   generator: torch.Generator | int | None = None) -> MaskPlan:
    """A block ELBO plan: ``make_plan`` drawn over each block in turn (left to right, from one generator).

    Block ``b``'s plan ``(S, B, Lb)`` fills the block's positions; its weight ``(S, B)`` (the ``1/t_b``-style scale
    and the sample average) goes on each of the block's positions (per-position weights), so the composite
    estimate is ``Σ_b (block b's estimate)``. Every block's plan must have the same number of samples ``S`` (the
    estimators here do, for a fixed setting).

    **(dlmrl interpretation)** for plans that do more than mask the block: the prompt is one copy, attended by every
    block, so a plan that masks the prompt (d1's ``one_step``) has its *first* block's prompt masks used for all
    blocks (the other blocks' draws are discarded); SPG's upper-bound rows (chosen by the advantage, the same for
    every block) apply to the whole row, its ``n_b / |U_b|`` scale counted over the row.

    Args:
        make_plan: :data:`PlanFn`, e.g. ``DoubleMC(num_samples=2).make_plan``.
        completion_mask: ``(B, L)`` bool, the positions that may be noised.
        block_size: tokens per block. generator: a ``torch.Generator`` or an integer seed.
    Returns:
        :class:`~dlmrl.estimators.mask_plan.MaskPlan` ``(S, B, L)`` with ``(S, B, L)`` weights, ``t`` NaN (each
        block has its own), the plans' temperature (``None`` for the ELBO estimators).
    Raises:
        ValueError: if the blocks' plans differ in ``S``, temperature or upper-bound settings.
    Reference: BD3-LM arXiv 2503.09573 §3 (block ELBO); the per-block pairing of samples is dlmrl's.
    """
    mask = completion_mask.bool()
    generator = as_generator(generator, mask.device)
    parts = [make_plan(mask[:, lo:hi], generator) for lo, hi in block_bounds(mask.shape[1], block_size)]
    sizes = {p.masks.shape[0] for p in parts}
    temps = {p.temperature for p in parts}
    uppers = {None if p.upper is None else (tuple(p.upper.rows.tolist()), p.upper.beta, p.upper.mix) for p in parts}
    if len(sizes) != 1 or len(temps) != 1 or len(uppers) != 1:
        raise ValueError(f"the blocks' plans differ in their number of samples {sorted(sizes)}, temperature "
                         f"{sorted(map(str, temps))} or upper-bound rows")
    masks = torch.cat([p.masks for p in parts], dim=-1)  # (S, B, L)
    scored = torch.cat([p.scored_masks() for p in parts], dim=-1)
    weights = torch.cat([p.position_weights().float() for p in parts], dim=-1)  # (S, B, L)
    first = parts[0]
    upper = None if first.upper is None else UpperBound(first.upper.rows, first.upper.beta, first.upper.mix)
    return MaskPlan(masks=masks, weights=weights, t=torch.full((masks.shape[0],), float("nan"), dtype=torch.float64),
                    prompt_masks=first.prompt_masks, scored=scored, temperature=first.temperature, upper=upper)


def block_step_ranks(completion_mask: torch.Tensor, reveal_step: torch.Tensor, block_size: int) -> torch.Tensor:
    """``(B, L)`` long: the rank of each position's reveal step among the distinct steps of its row's block
    (0 = the block's first step that revealed something), -1 off ``completion_mask``.

    Only the order of the steps inside a block matters, so any numbering (global, per block, with gaps) gives the
    same ranks.

    Args:
        completion_mask: ``(B, L)`` bool. reveal_step: ``(B, L)`` long, ``>= 0`` on the completion mask.
        block_size: tokens per block.
    Raises:
        ValueError: on mismatched shapes or a completion position without a reveal step.
    """
    mask = completion_mask.bool()
    if reveal_step.shape != mask.shape:
        raise ValueError(f"reveal_step {tuple(reveal_step.shape)} must have the completion's shape {tuple(mask.shape)}")
    step = reveal_step.to(mask.device).long()
    if bool((mask & (step < 0)).any()):
        b, i = (mask & (step < 0)).nonzero()[0].tolist()
        raise ValueError(f"completion position {i} of row {b} has no reveal step (the sampler did not write it)")
    distinct = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    big = torch.iinfo(torch.long).max
    for lo, hi in block_bounds(mask.shape[1], block_size):
        s, m = step[:, lo:hi], mask[:, lo:hi]  # (B, Lb)
        vals = torch.where(m, s, big).sort(dim=1).values  # (B, Lb) ascending, off-mask last
        first = torch.ones_like(m)
        first[:, 1:] = vals[:, 1:] != vals[:, :-1]
        first &= vals != big  # (B, Lb): the first occurrence of each distinct step of the block
        # a position's rank = the number of the block's distinct steps strictly before its own
        distinct[:, lo:hi] = ((vals[:, None, :] < s[:, :, None]) & first[:, None, :]).sum(-1)
    return torch.where(mask, distinct, -1)


def block_trajectory_plan(completion_mask: torch.Tensor, reveal_step: torch.Tensor, block_size: int, merge: int = 1,
                          temperature: float | None = None) -> MaskPlan:
    """The composite plan of a block-diffusion rollout's trajectory.

    In each block the distinct reveal steps are ranked (:func:`block_step_ranks`) and cut into segments of ``merge``
    consecutive steps (TraceRL's ``shrink``, per block as TraceRL applies ``collapse_k_unique``). Canvas ``j``
    noises, in every block, the positions of segments ``>= j`` (the block's canvas before segment ``j``'s first step;
    earlier blocks are clean in the clean half, which is what the sampler saw) and scores those of segment ``j``,
    weight 1. Blocks with fewer segments are fully clean (and score nothing) in the later canvases. ``merge = 1`` is
    exact: the plan reproduces the sampler's ``token_logprobs`` (at the sampling temperature). The dependence of the
    *choice* of revealed positions on θ is ignored, as TraceRL and d2 do.

    Args:
        completion_mask: ``(B, L)`` bool, the positions the sampler wrote. reveal_step: ``(B, L)`` long, the rollout's
            record (:attr:`~dlmrl.models.block_sampler.BlockSampleOutput.reveal_step`).
        block_size: the sampler's block size. merge: steps per segment (``>= 1``).
        temperature: log-prob temperature (the sampling temperature, 1 for greedy rollouts); ``None`` = the
            denoiser's full softmax.
    Returns:
        :class:`~dlmrl.estimators.mask_plan.MaskPlan` with ``S = max ⌈U / merge⌉`` canvases over the blocks (``U`` a
        block's distinct steps), weight 1 (the ``scored`` positions say which terms count).
    Raises:
        ValueError: on ``merge < 1``, mismatched shapes or a completion position without a reveal step.
    Reference: TraceRL arXiv 2509.06949 (shrink; one pass per step index of all blocks); d2 arXiv 2509.21474.
    """
    if isinstance(merge, bool) or not isinstance(merge, int) or merge < 1:
        raise ValueError(f"merge must be an integer >= 1, got {merge!r}")
    mask = completion_mask.bool()
    segment = torch.where(mask, block_step_ranks(mask, reveal_step, block_size) // merge, -1)  # (B, L)
    num = int(segment.max()) + 1 if bool(mask.any()) else 0
    j = torch.arange(num, device=mask.device)[:, None, None]  # (S, 1, 1)
    masks = mask[None] & (segment[None] >= j)  # (S, B, L)
    scored = mask[None] & (segment[None] == j)
    weights = torch.ones(masks.shape[:2], dtype=torch.float32, device=mask.device)  # (S, B)
    return MaskPlan(masks=masks, weights=weights, t=torch.full((num,), float("nan"), dtype=torch.float64),
                    scored=scored, temperature=temperature)


def block_rollout_plan(estimator: PlanEstimator, completion_mask: torch.Tensor, block_size: int,
                       generator: torch.Generator | int | None = None, prompt_mask: torch.Tensor | None = None, *,
                       reveal_step: torch.Tensor | None = None,
                       advantages: torch.Tensor | None = None) -> MaskPlan:
    """The plan of a training ``estimator`` for a block-diffusion rollout batch.

    - ``trajectory``: :func:`block_trajectory_plan` of the rollout's ``reveal_step`` (``order: sampled``) or of the
      left-to-right order (``left_to_right``: one canvas per token of a block, ``⌈block_size / merge⌉`` passes), with
      the estimator's ``merge`` and temperature;
    - any other: :func:`per_block_plan` of the estimator's
      :meth:`~dlmrl.estimators.scoring.PlanEstimator.rollout_plan` (so SPG's upper-bound rows follow the
      advantages as they do on a full-diffusion policy; its block-wise masks are drawn over each policy block).

    Args:
        estimator: a :class:`~dlmrl.estimators.scoring.PlanEstimator`. completion_mask: ``(B, L)`` bool.
        block_size: the policy's block size. generator, prompt_mask, reveal_step, advantages: as in ``rollout_plan``.
    Raises:
        ValueError: ``order: sampled`` without ``reveal_step``, or as the plans above.
    """
    from dlmrl.estimators.trajectory import Trajectory, left_to_right_order

    if isinstance(estimator, Trajectory):
        if estimator.order == "left_to_right":
            reveal_step = left_to_right_order(completion_mask)
        elif reveal_step is None:
            raise ValueError("the trajectory estimator with order='sampled' needs the rollout's reveal steps")
        return block_trajectory_plan(completion_mask, reveal_step, block_size, estimator.merge, estimator.temperature)

    from dlmrl.estimators.spg import SPGEstimator

    def make_plan(mask: torch.Tensor, g) -> MaskPlan:
        # (SPG's block-wise masks mirror a semi-autoregressive sampler's blocks: here the policy's own block)
        est = dataclasses.replace(estimator, block_length=mask.shape[1]) if isinstance(estimator, SPGEstimator) \
            else estimator
        return est.rollout_plan(mask, g, prompt_mask, advantages=advantages)

    return per_block_plan(make_plan, completion_mask, block_size, generator)


__all__ = ["PlanFn", "block_rollout_plan", "block_step_ranks", "block_trajectory_plan", "per_block_plan"]
