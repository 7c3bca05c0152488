"""One-pass likelihoods of block-diffusion policies over the composite input ``[prompt | noisy ỹ | clean y]``.

A block-diffusion model factorises ``log p(y | q) = Σ_b log p(y^b | y^{<b}, q)`` (block ``b``'s denoiser sees the
clean blocks before it). Scoring block ``b`` on a noised canvas needs ``y^{<b}`` clean and block ``b`` noised, so a
naive scorer runs one pass per block. The composite input puts a noised copy of *every* block next to the clean
completion (:func:`~dlmrl.models.block_attention.composite_mask`): the noisy half's logits are every block's
prediction from its own noised canvas and the clean blocks before it, so one pass scores all ``n_blocks`` blocks.

- **Block ELBO**: a :class:`~dlmrl.estimators.mask_plan.MaskPlan` whose sample ``s`` noises every block at once,
  each block's mask drawn independently (:func:`~dlmrl.estimators.block_plans.per_block_plan`: any existing
  estimator's plan, drawn per block, with per-position weights); the sequence estimate is the sum of the per-block
  estimates, ``S`` composite passes instead of ``S · n_blocks`` block passes.
- **Block trajectory**: a plan whose canvas ``j`` holds, in every block, that block's canvas before its ``j``-th
  (merged) step (:func:`~dlmrl.estimators.block_plans.block_trajectory_plan`), so a rollout of ``S`` steps per block
  costs ``⌈S / merge⌉`` passes, not ``n_blocks · S``; at ``merge = 1`` it reproduces the sampler's ``token_logprobs``.

Both are scored by :func:`dlmrl.estimators.score` (and ``score_and_backward``) like any plan: the block-diffusion
policy (:class:`~dlmrl.models.block_policy.BlockDiffusionPolicy`) computes a canvas's logits with
:func:`composite_logits`, the scorer passing the clean completion next to the noised canvas.

NFE is counted in composite passes (each over ``P + 2L`` positions, twice the completion of a block-causal pass).

Reference: BD3-LM arXiv 2503.09573 §3.2 (vectorised training over ``[x_t | x_0]``); TraceRL arXiv 2509.06949
(Gen-Verse/dLLM-RL ``train/rl_sdar.py``: ``one_round_vectorized`` scores the same step index of every block in one
pass of ``[prompt | y | ỹ]``, with the clean half first).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmrl.models.block_attention import (
    causal_sources,
    check_block_size,
    check_clean_context,
    check_logit_shift,
    composite_mask,
    composite_position_ids,
    gather_positions,
    shifted_sources,
)

#: ``(input_ids (B, T) long, mask4d (B, 1, T, T) bool, position_ids (B, T) long) -> logits (B, T, V)``, position
#: ``i`` predicting token ``i``; e.g. ``functools.partial(dlmrl.models.block_attention.block_logits, model)``
ModelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def composite_logits(model_fn: ModelFn, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, noisy: torch.Tensor,
                     clean: torch.Tensor, block_size: int, prompt_blocks: bool = False,
                     logit_shift: int = 0, clean_context: str = "block") -> torch.Tensor:
    """The noisy half's logits of one composite pass.

    Position ``i`` of block ``b`` is predicted from the noisy tokens of block ``b`` (``noisy``), the clean blocks
    before it (``clean``) and the prompt; it never sees ``clean`` block ``b`` or later, nor another block's noise.

    Args:
        model_fn: :data:`ModelFn`.
        prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool.
        noisy: ``(B, L)`` long, the noised completion (mask tokens where noised). clean: ``(B, L)`` long.
        block_size: tokens per block.
        prompt_blocks: the prompt cut into blocks too
            (:func:`~dlmrl.models.block_attention.prompt_block_ids`; the SDAR family), else one clean block.
        logit_shift: 1 for a family whose output at ``j`` predicts token ``j + 1`` (Fast-dLLM v2): position ``i`` then
            takes the output at :func:`~dlmrl.models.block_attention.shifted_sources` (the noisy ``i − 1`` inside a
            block, the clean last position of the previous block, or the prompt's last, for a block's first token);
            0 (default) takes the noisy half as it is.
        clean_context: ``"block"`` (default) or ``"causal"``: the prompt and the clean half attend token-causally
            (:func:`~dlmrl.models.block_attention.composite_mask`) and a block's first token takes the output before
            it on that clean context, the others their noisy output
            (:func:`~dlmrl.models.block_attention.causal_sources`; Nemotron-Labs-Diffusion); needs ``logit_shift`` 0.
    Returns:
        ``(B, L, V)`` logits (float32, float64 for a float64 model).
    Raises:
        ValueError: on mismatched shapes, a block size below 1, a ``logit_shift`` other than 0 or 1, or a
            ``clean_context`` not in ``CLEAN_CONTEXTS`` (or ``"causal"`` with ``logit_shift`` 1).
    Reference: BD3-LM arXiv 2503.09573 §3.2.
    """
    if noisy.shape != clean.shape or noisy.shape[0] != prompt_ids.shape[0] or prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"noisy {tuple(noisy.shape)} and clean {tuple(clean.shape)} must be (B, L) for the prompt's "
                         f"B = {prompt_ids.shape[0]}, with prompt_mask shaped like prompt_ids {tuple(prompt_ids.shape)}")
    length, p = noisy.shape[1], prompt_ids.shape[1]
    check_block_size(length, block_size)
    check_logit_shift(logit_shift)
    causal = check_clean_context(clean_context) == "causal"
    if causal and logit_shift:
        raise ValueError("clean_context 'causal' shifts only a block's first token: it needs logit_shift 0, got 1")
    ids = torch.cat([prompt_ids, noisy, clean], dim=1)  # (B, P + 2L)
    mask4d = composite_mask(prompt_mask, length, block_size, prompt_blocks, clean_context)
    logits = model_fn(ids, mask4d, composite_position_ids(prompt_mask, length))
    if causal:  # (B, L, V): a block's first token from the clean context's output before it
        logits = gather_positions(logits, causal_sources(prompt_mask, length, block_size))
    elif logit_shift:  # (B, L, V): each position's predicting output
        logits = gather_positions(logits, shifted_sources(prompt_mask, length, block_size, composite=True))
    else:
        logits = logits[:, p : p + length]  # (B, L, V): the noisy half
    return logits if logits.dtype == torch.float64 else logits.float()


__all__ = ["ModelFn", "composite_logits"]
