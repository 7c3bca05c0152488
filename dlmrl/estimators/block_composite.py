"""One-pass likelihoods of block-diffusion policies over the composite input ``[prompt | noisy ỹ | clean y]``.

A block-diffusion model factorises ``log p(y | q) = Σ_b log p(y^b | y^{<b}, q)`` (block ``b``'s denoiser sees the
clean blocks before it). Scoring block ``b`` on a noised canvas needs ``y^{<b}`` clean and block ``b`` noised, so a
naive scorer runs one pass per block. The composite input puts a noised copy of *every* block next to the clean
completion (:func:`~dlmrl.models.block_attention.composite_mask`): the noisy half's logits are every block's
prediction from its own noised canvas and the clean blocks before it, so one pass scores all ``n_blocks`` blocks.

- **Block ELBO**: a :class:`BlockPlan` whose sample ``s`` noises every block at once, with each block's mask drawn
  independently (:func:`~dlmrl.estimators.block_plans.per_block_plan`: any existing estimator's plan, drawn per
  block); the sequence estimate is the sum of the per-block estimates, ``S`` composite passes instead of ``S · n_blocks``
  block passes.
- **Block trajectory**: a plan whose canvas ``j`` holds, in every block, that block's canvas before its ``j``-th
  (merged) step (:func:`~dlmrl.estimators.block_plans.block_trajectory_plan`), so a rollout of ``S`` steps per block
  costs ``⌈S / merge⌉`` passes, not ``n_blocks · S``; at ``merge = 1`` it reproduces the sampler's ``token_logprobs``.

NFE is counted in composite passes (each over ``P + 2L`` positions, twice the completion of a block-causal pass).

Reference: BD3-LM arXiv 2503.09573 §3.2 (vectorised training over ``[x_t | x_0]``); TraceRL arXiv 2509.06949
(Gen-Verse/dLLM-RL ``train/rl_sdar.py``: ``one_round_vectorized`` scores the same step index of every block in one
pass of ``[prompt | y | ỹ]``, with the clean half first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.estimators.scoring import Estimate, sampler_log_softmax
from dlmrl.models.block_attention import check_block_size, composite_mask, composite_position_ids

#: ``(input_ids (B, T) long, mask4d (B, 1, T, T) bool, position_ids (B, T) long) -> logits (B, T, V)``, position
#: ``i`` predicting token ``i``; e.g. ``functools.partial(dlmrl.models.block_attention.block_logits, model)``
ModelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def composite_logits(model_fn: ModelFn, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, noisy: torch.Tensor,
                     clean: torch.Tensor, block_size: int) -> torch.Tensor:
    """The noisy half's logits of one composite pass.

    Position ``i`` of block ``b`` is predicted from the noisy tokens of block ``b`` (``noisy``), the clean blocks
    before it (``clean``) and the prompt; it never sees ``clean`` block ``b`` or later, nor another block's noise.

    Args:
        model_fn: :data:`ModelFn`.
        prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool.
        noisy: ``(B, L)`` long, the noised completion (mask tokens where noised). clean: ``(B, L)`` long.
        block_size: tokens per block.
    Returns:
        ``(B, L, V)`` logits (float32, float64 for a float64 model).
    Raises:
        ValueError: on mismatched shapes or a block size below 1.
    Reference: BD3-LM arXiv 2503.09573 §3.2.
    """
    if noisy.shape != clean.shape or noisy.shape[0] != prompt_ids.shape[0] or prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"noisy {tuple(noisy.shape)} and clean {tuple(clean.shape)} must be (B, L) for the prompt's "
                         f"B = {prompt_ids.shape[0]}, with prompt_mask shaped like prompt_ids {tuple(prompt_ids.shape)}")
    length, p = noisy.shape[1], prompt_ids.shape[1]
    check_block_size(length, block_size)
    ids = torch.cat([prompt_ids, noisy, clean], dim=1)  # (B, P + 2L)
    logits = model_fn(ids, composite_mask(prompt_mask, length, block_size), composite_position_ids(prompt_mask, length))
    logits = logits[:, p : p + length]  # (B, L, V): the noisy half
    return logits if logits.dtype == torch.float64 else logits.float()


@dataclass(frozen=True)
class BlockPlan:
    """``S`` composite canvases for a batch of ``B`` completions of length ``L``; each canvas noises every block.

    The estimate is ``per_token[b, i] = Σ_s weights[s, b, i] · scored[s, b, i] · log p(y^i | canvas s)`` with the
    canvas ``s`` = ``y`` with ``masks[s]`` replaced by the mask token in the noisy half (the clean half is ``y``).

    Attributes:
        masks: ``(S, B, L)`` bool, the noised positions of each canvas.
        scored: ``(S, B, L)`` bool inside ``masks``, the positions whose log-probs count.
        weights: ``(S, B, L)`` float32 per-position multipliers (a block's own ``1/t_b``-style weight on its
            positions: blocks are drawn independently, so the weight varies along ``L``).
        temperature: ``None``: the denoiser's softmax over the whole vocabulary (the ELBO's ``p_θ``); ``T > 0``: the
            sampler's token distribution ``softmax(logits / T)`` without the mask token.
    """

    masks: torch.Tensor
    scored: torch.Tensor
    weights: torch.Tensor
    temperature: float | None = None

    def __post_init__(self) -> None:
        if self.masks.dtype != torch.bool or self.masks.dim() != 3:
            raise ValueError(f"BlockPlan.masks must be (S, B, L) bool, got {tuple(self.masks.shape)} {self.masks.dtype}")
        if self.scored.dtype != torch.bool or self.scored.shape != self.masks.shape:
            raise ValueError(f"BlockPlan.scored must be bool shaped like masks {tuple(self.masks.shape)}")
        if self.weights.shape != self.masks.shape or not self.weights.is_floating_point():
            raise ValueError(f"BlockPlan.weights must be floating point shaped like masks {tuple(self.masks.shape)}")
        if bool((self.scored & ~self.masks).any()):
            raise ValueError("BlockPlan.scored must lie inside masks (a scored position is a noised one)")
        if not bool(torch.isfinite(self.weights).all()):
            raise ValueError("BlockPlan.weights must be finite")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"BlockPlan.temperature must be > 0 (or None), got {self.temperature}")

    @property
    def nfe(self) -> int:
        """Composite passes per sequence: ``S``."""
        return int(self.masks.shape[0])

    def runs(self) -> torch.Tensor:
        """``(S, B)`` bool: the canvases that score something (the others are not run)."""
        return (self.scored & (self.weights != 0)).any(-1)


def score_composite(model_fn: ModelFn, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                    completion_mask: torch.Tensor, plan: BlockPlan, block_size: int, mask_token_id: int) -> Estimate:
    """Score ``completion`` on ``plan``, one composite pass per canvas (rows whose canvas scores nothing skipped).

    Differentiable (run it under ``torch.no_grad()`` for old and reference policies).

    Args:
        model_fn: :data:`ModelFn`. prompt_ids: ``(B, P)`` long. prompt_mask: ``(B, P)`` bool.
        completion: ``(B, L)`` long, fully decoded. completion_mask: ``(B, L)`` bool, the positions that may be scored.
        plan: the :class:`BlockPlan`. block_size: tokens per block. mask_token_id: the mask id.
    Returns:
        :class:`~dlmrl.estimators.scoring.Estimate` with ``per_token (B, L)`` (nats, 0 where never scored),
        ``sequence = per_token.sum(-1)`` and ``nfe = S`` (composite passes).
    Raises:
        ValueError: if the plan does not fit the completion, scores a position outside ``completion_mask``, or a
            scored position holds the mask token.
    Reference: BD3-LM arXiv 2503.09573 §3.2; TraceRL arXiv 2509.06949.
    """
    if tuple(plan.masks.shape[1:]) != tuple(completion.shape) or completion_mask.shape != completion.shape:
        raise ValueError(f"plan (S, B, L) = {tuple(plan.masks.shape)} and completion_mask "
                         f"{tuple(completion_mask.shape)} must fit the completion {tuple(completion.shape)}")
    device = completion.device
    masks, scored, weights = plan.masks.to(device), plan.scored.to(device), plan.weights.to(device)
    if bool((scored & ~completion_mask.bool()[None]).any()):
        raise ValueError("the plan scores a position outside completion_mask")
    if bool(((completion == mask_token_id) & completion_mask.bool()).any()):
        raise ValueError("the completion still holds the mask token: only decoded completions can be scored")
    per_token = None
    for s, run in enumerate(plan.runs().to(device).unbind(0)):
        rows = run.nonzero().squeeze(1)  # (n,)
        if len(rows) == 0:
            continue
        y = completion[rows]  # (n, L)
        noisy = torch.where(masks[s, rows], torch.full_like(y, mask_token_id), y)
        logits = composite_logits(model_fn, prompt_ids[rows], prompt_mask[rows].bool(), noisy, y, block_size)
        logp_all = (torch.log_softmax(logits, dim=-1) if plan.temperature is None
                    else sampler_log_softmax(logits, mask_token_id, plan.temperature))  # (n, L, V)
        logp = logp_all.gather(-1, y[..., None]).squeeze(-1)  # (n, L)
        terms = torch.where(scored[s, rows], logp * weights[s, rows].to(logp.dtype), torch.zeros_like(logp))
        if per_token is None:
            per_token = torch.zeros(completion.shape, dtype=terms.dtype, device=device)  # (B, L)
        per_token = per_token.index_add(0, rows, terms)
    if per_token is None:  # (nothing to score)
        per_token = torch.zeros(completion.shape, dtype=torch.float32, device=device)
    return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=plan.nfe)


__all__ = ["BlockPlan", "ModelFn", "composite_logits", "score_composite"]
