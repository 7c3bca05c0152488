"""The block-diffusion policy: a masked-diffusion denoiser run block-causally (``model.kind: block``).

The completion is cut into blocks of ``block_size`` tokens (:mod:`dlmrl.models.block_attention`); inside a block the
model denoises like a masked-diffusion model, across blocks attention is causal, so

- **sampling** writes blocks left to right with an exact key/value cache of the finished blocks
  (:func:`~dlmrl.models.block_sampler.block_generate`);
- **scoring** noises every block at once and scores them in one pass of the composite input
  ``[prompt | noisy | clean]`` (:func:`~dlmrl.estimators.block_composite.composite_logits`): the policy's
  :meth:`BlockDiffusionPolicy.completion_logits` is what :func:`dlmrl.estimators.score` calls for each canvas, with
  the clean completion next to it; plans come from :func:`~dlmrl.estimators.block_plans.block_rollout_plan`.

``block_size = L`` (one block) is full-attention diffusion over the completion with a prompt that does not attend
it; ``block_size = 1`` an autoregressive order in the same model.

Reference: BD3-LM arXiv 2503.09573; SDAR arXiv 2510.06303; TraceRL arXiv 2509.06949.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dlmrl.estimators.block_composite import composite_logits
from dlmrl.models.block_attention import (
    BlockForwardFn,
    block_causal_mask,
    block_position_ids,
    check_block_size,
    check_clean_context,
    check_logit_shift,
    gather_positions,
    hf_block_forward,
    shifted_sources,
)
from dlmrl.models.block_sampler import block_generate
from dlmrl.models.policy import MaskedDiffusionPolicy


@dataclass
class BlockDiffusionPolicy(MaskedDiffusionPolicy):
    """A :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` whose attention is block-causal with ``block_size``.

    Attributes (beyond the masked-diffusion policy's):
        block_size: tokens per block ``B`` (the last block of a completion may be shorter).
        forward: the family's :data:`~dlmrl.models.block_attention.BlockForwardFn` (a 4-D mask, explicit
            positions and an optional key/value cache; :func:`~dlmrl.models.block_attention.hf_block_forward` for
            ``transformers`` decoders such as the ``tiny`` family's Llama).
        prompt_blocks: the prompt is cut into blocks of ``block_size`` too, attended block-causally
            (:func:`~dlmrl.models.block_attention.prompt_block_ids`: SDAR/TraDo's layout); ``False`` = the prompt is
            one clean block (the ``tiny`` family).
        logit_shift: 1 when the model's output at ``j`` predicts token ``j + 1`` (the family's ``logit_shift``;
            Fast-dLLM v2 keeps its AR head): the logits of a completion position are taken from the position before
            (:func:`~dlmrl.models.block_attention.shifted_sources`), a block's first token from the previous block's
            last (clean) position or the prompt's last, and the sampler reveals a block's first token first
            (:func:`~dlmrl.models.block_sampler.block_generate`). 0 (default): position ``i`` predicts token ``i``.
        sub_block_size: the sampler decodes each block in sub-blocks of this many positions, left to right
            (Fast-dLLM v2's ``small_block_size``, 8 in its ``generate``; :func:`~dlmrl.models.block_sampler.block_generate`);
            ``None`` (default): the whole block at once. A run's ``sampling.sub_block_size`` sets it when the policy
            is loaded (``BlockDiffusionKind.check_loaded``).
        clean_context: ``"block"`` (default): the prompt and the finished blocks are attended block-causally, each
            bidirectional inside; ``"causal"`` (the family's ``clean_context``; Nemotron-Labs-Diffusion's
            ``generate(causal_context=True)``): attended token-causally, a block's first token predicted by the output
            before it on that context and revealed first, the others unshifted, in the sampler, the composite pass
            (:func:`~dlmrl.estimators.block_composite.composite_logits`) and the uncached pass (``clean=None``: the
            composite pass with the canvas as its clean half). Needs ``logit_shift`` 0.
        kind: ``"block"``.
    """

    block_size: int = 1
    forward: BlockForwardFn = hf_block_forward
    prompt_blocks: bool = False
    logit_shift: int = 0
    sub_block_size: int | None = None
    clean_context: str = "block"
    kind: str = field(default="block", init=False)

    def __post_init__(self) -> None:
        check_block_size(1, self.block_size)
        check_logit_shift(self.logit_shift)
        if check_clean_context(self.clean_context) == "causal" and self.logit_shift:
            raise ValueError("clean_context 'causal' shifts only a block's first token: it needs logit_shift 0")

    def model_fn(self, input_ids: torch.Tensor, mask4d: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """``(B, T, V)`` logits of one uncached pass under ``mask4d`` ``(B, 1, T, T)`` bool."""
        return self.forward(self.model, input_ids, mask4d, position_ids, None, False)[0]

    def completion_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, canvas: torch.Tensor,
                          clean: torch.Tensor | None = None) -> torch.Tensor:
        """Logits at the completion positions.

        Args:
            prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool.
            canvas: ``(B, L)`` long, the (partly masked) completion.
            clean: ``(B, L)`` long or ``None``. Given (scoring): the composite pass, block ``b`` of ``canvas`` seen
                next to the clean blocks before it, so every block is scored in one pass. ``None`` (sampling, the
                uncached reference): one block-causal pass over ``[prompt | canvas]``, each block seeing the canvas's
                own earlier blocks.
        Returns:
            ``(B, L, V)`` float32 (float64 for a float64 model); position ``i`` predicts token ``i``.
        """
        pm = prompt_mask.bool()
        if clean is not None:
            return composite_logits(self.model_fn, prompt_ids, pm, canvas, clean, self.block_size, self.prompt_blocks,
                                    self.logit_shift, self.clean_context)
        if self.clean_context == "causal":  # (one block-causal pass cannot hold a finished block causally)
            return composite_logits(self.model_fn, prompt_ids, pm, canvas, canvas, self.block_size,
                                    self.prompt_blocks, 0, "causal")
        length, p = canvas.shape[1], prompt_ids.shape[1]
        ids = torch.cat([prompt_ids, canvas], dim=1)
        mask4d = block_causal_mask(pm, length, self.block_size, self.prompt_blocks)
        logits = self.model_fn(ids, mask4d, block_position_ids(pm, length))
        if self.logit_shift:
            logits = gather_positions(logits, shifted_sources(pm, length, self.block_size))
        else:
            logits = logits[:, p:]
        return logits if logits.dtype == torch.float64 else logits.float()

    def sample_blocks(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, gen_length: int, steps: int,
                      temperature: float = 0.0, remasking: str = "low_confidence", threshold: float | None = None,
                      threshold_factor: float | None = None, canvas: torch.Tensor | None = None,
                      generator: torch.Generator | None = None, rows: tuple[int, int] | None = None,
                      cache: bool = True, eos_token_id: int | None = None, stop_at_eos: bool = False):
        """:func:`~dlmrl.models.block_sampler.block_generate` in this policy's blocks with ``steps`` total denoising
        steps split evenly over its ``⌈gen_length / block_size⌉`` blocks (with a threshold: checked, not used), the
        way :func:`~dlmrl.models.sampler.generate` splits them over its blocks; ``stop_at_eos`` stops rows at the
        block holding their first ``eos_token_id``.

        Raises:
            ValueError: if ``steps`` is not a positive multiple of the number of blocks, or as ``block_generate``.
        """
        blocks = check_block_size(gen_length, self.block_size)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        if steps < blocks or steps % blocks:
            raise ValueError(f"{steps} steps do not split evenly over {blocks} blocks of {self.block_size} tokens")
        adaptive = threshold is not None or threshold_factor is not None
        return block_generate(self, prompt_ids, prompt_mask, gen_length=gen_length, block_size=self.block_size,
                              steps_per_block=None if adaptive else steps // blocks, temperature=temperature,
                              remasking=remasking, threshold=threshold, threshold_factor=threshold_factor,
                              canvas=canvas, generator=generator, cache=cache, forward=self.forward, rows=rows,
                              prompt_blocks=self.prompt_blocks, eos_token_id=eos_token_id, stop_at_eos=stop_at_eos,
                              logit_shift=self.logit_shift, sub_block_size=self.sub_block_size,
                              clean_context=self.clean_context)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        raise TypeError("a block-diffusion policy needs to know where its prompt ends: call "
                        "completion_logits(prompt_ids, prompt_mask, canvas) or dlmrl.models.policy.canvas_logits")


def block_policy_from(policy: MaskedDiffusionPolicy, block_size: int, forward: BlockForwardFn = hf_block_forward,
                      prompt_blocks: bool = False, logit_shift: int | None = None,
                      clean_context: str | None = None) -> BlockDiffusionPolicy:
    """The block-diffusion policy over ``policy``'s model and tokenizer (the same weights, block-causal attention).

    ``logit_shift`` (:attr:`BlockDiffusionPolicy.logit_shift`): ``None`` = the ``logit_shift`` of ``policy.family``
    when it is a registered family (:data:`dlmrl.models.families.FAMILIES`; Fast-dLLM v2: 1), else 0.
    ``clean_context`` (:attr:`BlockDiffusionPolicy.clean_context`): ``None`` = the family's ``clean_context``
    (Nemotron-Labs-Diffusion: ``"causal"``), else ``"block"``."""
    from dlmrl.models.families import FAMILIES

    family = policy.family
    fam = FAMILIES.get(family) if family in FAMILIES else None
    if logit_shift is None:
        logit_shift = fam.logit_shift if fam is not None else 0
    if clean_context is None:
        clean_context = getattr(fam, "clean_context", "block") if fam is not None else "block"
    return BlockDiffusionPolicy(model=policy.model, tokenizer=policy.tokenizer, mask_token_id=policy.mask_token_id,
                                family=policy.family, logits_fn=policy.logits_fn, eos_token_id=policy.eos_token_id,
                                pad_token_id=policy.pad_token_id, block_size=block_size, forward=forward,
                                prompt_blocks=prompt_blocks, logit_shift=logit_shift, clean_context=clean_context)


__all__ = ["BlockDiffusionPolicy", "block_policy_from"]
