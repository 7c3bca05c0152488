"""Block-diffusion sampling with an exact key/value cache.

The completion is decoded block by block (:func:`~dlmrl.models.block_attention.block_bounds`). Block ``b`` starts
fully masked (or as the infill canvas gives it) and is denoised with the rules of
:func:`dlmrl.models.sampler.generate`: low-confidence (or random, or left-to-right) remasking with LLaDA's
per-block ``num_transfer_tokens`` schedule over ``steps_per_block`` steps, or threshold decoding (Fast-dLLM's
``threshold`` / ``factor`` rules, at least the most confident position per step); tokens are drawn by Gumbel-max in
float64 at ``temperature`` (argmax at 0) with the mask token never drawn, and the confidence is the probability of
the drawn token under the full softmax. The random draws are those of ``generate`` (same generator calls in the same
order, same per-step generators of threshold decoding), so this sampler equals ``generate`` run on the block-causal
policy :class:`~dlmrl.models.block_attention.BlockCausalPolicy` (tested).

**Exact cache** (``cache=True``). One pass over the prompt keeps its keys and values; each denoising step feeds only
the block's tokens, attending the cached prompt and finished blocks and the block itself; when the block is decoded
its clean tokens are run once more and their keys and values are appended. Because no position attends a later block,
the cached keys are exactly those a full block-causal pass would compute, so cached and uncached logits agree to
float tolerance — unlike the approximate prefix/dual caches of :mod:`dlmrl.models.block_cache` on a bidirectional
model. ``cache=False`` is the uncached reference: every step is a full pass over ``[prompt | canvas]`` under
:func:`~dlmrl.models.block_attention.block_causal_mask`.

**Logit shift** (``logit_shift=1``, Fast-dLLM v2's kept AR head: the output at ``j`` predicts token ``j + 1``). A
block's logits are the outputs one position earlier; its first token is predicted by the previous block's last
position (or the prompt's last), which the cache keeps from the pass that stored that block (the prompt's pass for
the first block), and is revealed first: at the block's first step with a schedule (its confidence set to ``+inf``,
the other ``k − 1`` of the step by confidence), alone at that step with a threshold. Fast-dLLM v2's ``generate``
decodes it the same way, greedily, from the pass that stores the previous block, before the block's denoising steps
(``modeling.py`` of the checkpoint; :mod:`dlmrl.models.fast_dllm_v2`).

**Causal clean context** (``clean_context="causal"``, Nemotron-Labs-Diffusion's ``generate(causal_context=True)``,
:mod:`dlmrl.models.nemotron_diffusion`). The prompt pass and each finished block's cache pass are token-causal (an
autoregressive model's attention over the clean context); a denoising pass attends the whole cache and its block both
ways, its logits unshifted; a block's first token is predicted by the last output of the causal pass that stored the
previous block (the prompt's for the first) and revealed first, as with the logit shift. Without a cache each step is
one composite pass with the canvas as its clean half (:func:`~dlmrl.models.block_attention.composite_mask` with
``clean_context="causal"``, :func:`~dlmrl.models.block_attention.causal_sources`): the finished blocks are clean, so
the current block sees exactly what the cache holds. The code's ``generate`` writes the first token before the block's
denoising passes; here the block's first step reveals it from the kept output (with one token per step, that step's
pass decides nothing else), so greedy decoding with one token per step is the same tokens.

**Sub-blocks** (``sub_block_size``, Fast-dLLM v2's ``small_block_size``): a block's positions are grouped in runs of
``sub_block_size`` from its start and decoded group by group, left to right. A threshold step chooses only among the
masked positions of the row's first group that still has one (every one above the threshold, at least the most
confident: ``generate``'s rule inside its current sub-block); a scheduled step reveals its ``k`` positions in the order
(group, then confidence), so at one token per step it is the most confident one of that group. ``None``: the block is
one group.

Reference: SDAR arXiv 2510.06303 (JetAstra/SDAR ``generate.py``, ``block_diffusion_generate``: prefill, denoise the
block against the cache without storing, store the finished block); BD3-LM arXiv 2503.09573 (kuleshov-group/bd3lms
``models/dit.py``, sampling with ``kv_cache``); LLaDA arXiv 2502.09992 (``generate``); Fast-dLLM arXiv 2505.22618
(threshold decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrl.models.block_attention import (
    BlockForwardFn,
    KeyValues,
    block_bounds,
    block_causal_mask,
    block_position_ids,
    causal_prompt_mask,
    causal_sources,
    check_clean_context,
    check_logit_shift,
    composite_mask,
    composite_position_ids,
    gather_positions,
    hf_block_forward,
    shifted_sources,
)
from dlmrl.models.gumbel import _gumbel, _uniform, add_gumbel_noise, drawn_tokens
from dlmrl.models.policy import position_ids_from_mask
from dlmrl.models.reveal import NOT_SAMPLED, _confidence, num_transfer_tokens, reveal_cuts, threshold_reveal
from dlmrl.models.sampler import (
    REMASKING,
    EosStop,
    SampleOutput,
    _revealed_logprobs,
    _step_generator,
    skip_step_draws,
)


@dataclass
class BlockSampleOutput(SampleOutput):
    """:class:`~dlmrl.models.sampler.SampleOutput` of :func:`block_generate`, plus the cache's passes.

    ``reveal_step`` is numbered as ``generate`` numbers it, globally over the blocks: block ``b``'s step ``s`` is
    ``b · steps_per_block + s``, or ``b · block_size + s`` with a threshold (so a row may have gaps); the block
    trajectory estimator ranks the distinct steps inside each block, so only their order within a block matters.
    ``nfe`` counts denoising passes (each over the block's tokens with a cache, the whole sequence without), as
    ``generate`` counts them.

    Attributes:
        cache_passes: passes that only build the cache: 1 for the prompt plus 1 per finished block but the last
            (its keys are never needed) and but those after the call stopped at EOS; 0 with ``cache=False``.
    """

    cache_passes: int = 0


class _ExactBlockForward:
    """The sampler's passes for one block: ``logits(x, rows) -> (n, Lb, V)`` of the current block for rows ``rows``
    (``(n,)`` increasing, ``None`` = all) of the canvas ``x (B, L)``; with a cache, :meth:`finish_block` appends the
    decoded block's keys and values."""

    def __init__(self, model, forward: BlockForwardFn, prompt_ids, prompt_mask, length: int, block_size: int,
                 cache: bool, prompt_blocks: bool = False, logit_shift: int = 0, clean_context: str = "block"):
        self.model, self.forward, self.cache = model, forward, cache
        self.prompt_blocks, self.shift = prompt_blocks, logit_shift
        # (clean_context "causal": the prompt and finished blocks stored token-causally, a block's first token from
        # the output before it, the others unshifted; reveal_first: a block's first token is revealed first)
        self.causal = check_clean_context(clean_context) == "causal"
        self.reveal_first = bool(logit_shift) or self.causal
        # (logit_shift: the output predicting the block's first token, (B, V), and whether a row has one; from the
        # pass that stored the previous block or the prompt)
        self.prev: torch.Tensor | None = None
        self.prev_real = prompt_mask[:, -1].clone() if prompt_mask.shape[1] > 0 else prompt_mask.new_zeros(
            prompt_mask.shape[0])
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        self.length, self.block_size = length, block_size
        self.n_real = prompt_mask.long().sum(-1)  # (B,): real prompt tokens (the completion's first position id)
        self.lo = self.hi = 0
        self.cache_passes = 0
        self.past: KeyValues | None = None
        self.key_real: torch.Tensor | None = None  # (B, S): which cached keys are real (prompt padding is not)
        if cache:
            self.key_real = prompt_mask.clone()
            if prompt_ids.shape[1] > 0:  # (an empty prompt leaves the cache empty)
                pmask4d = (causal_prompt_mask(prompt_mask) if self.causal
                           else _prompt_mask4d(prompt_mask, block_size, prompt_blocks))
                out, self.past = forward(model, prompt_ids, pmask4d, position_ids_from_mask(prompt_mask), None, True)
                self.prev = out[:, -1].clone() if self.reveal_first else None
                del out
                self.cache_passes = 1

    def start_block(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def _block_inputs(self, tokens: torch.Tensor, rows: torch.Tensor | None, causal: bool = False):
        """Ids, 4-D mask and positions of the block's ``tokens (n, Lb)`` against the cache, and the rows' past
        (``causal``: token-causal inside the block)."""
        key_real = self.key_real if rows is None else self.key_real[rows]  # (n, S)
        n, width = tokens.shape
        inside = key_real.new_ones(n, 1, width, width)
        if causal:
            inside = inside.tril()
        mask = torch.cat([key_real[:, None, None, :].expand(n, 1, width, key_real.shape[1]),
                          inside], dim=-1)  # (n, 1, Lb, S + Lb)
        n_real = self.n_real if rows is None else self.n_real[rows]
        pos = n_real[:, None] + torch.arange(self.lo, self.hi, device=tokens.device)  # (n, Lb)
        past = self.past if rows is None or self.past is None else [(k[rows], v[rows]) for k, v in self.past]
        return mask, pos, past

    def logits(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        canvas = x if rows is None else x[rows]
        if self.cache:
            tokens = canvas[:, self.lo : self.hi]
            mask, pos, past = self._block_inputs(tokens, rows)
            out = self.forward(self.model, tokens, mask, pos, past, False)[0]  # (n, Lb, V)
            if not self.reveal_first:
                return out
            real = self.prev_real if rows is None else self.prev_real[rows]  # (n,)
            first = out[:, 0] if self.prev is None else torch.where(
                real[:, None], (self.prev if rows is None else self.prev[rows]).to(out.dtype), out[:, 0])
            return torch.cat([first[:, None], out[:, 1:] if self.causal else out[:, :-1]], dim=1)
        pids = self.prompt_ids if rows is None else self.prompt_ids[rows]
        pmask = self.prompt_mask if rows is None else self.prompt_mask[rows]
        if self.causal:  # (the composite pass with the canvas as its clean half: the finished blocks are clean)
            ids = torch.cat([pids, canvas, canvas], dim=1)  # (n, P + 2L)
            mask = composite_mask(pmask, self.length, self.block_size, self.prompt_blocks, "causal")
            out = self.forward(self.model, ids, mask, composite_position_ids(pmask, self.length), None, False)[0]
            return gather_positions(out, causal_sources(pmask, self.length, self.block_size)[:, self.lo : self.hi])
        ids = torch.cat([pids, canvas], dim=1)  # (n, P + L)
        mask = block_causal_mask(pmask, self.length, self.block_size, self.prompt_blocks)
        out = self.forward(self.model, ids, mask, block_position_ids(pmask, self.length), None, False)[0]
        p = pids.shape[1]
        if self.shift:
            return gather_positions(out, shifted_sources(pmask, self.length, self.block_size)[:, self.lo : self.hi])
        return out[:, p + self.lo : p + self.hi]

    def finish_block(self, x: torch.Tensor) -> None:
        """Append the decoded block's keys and values (every row) to the cache; nothing without a cache."""
        if not self.cache:
            return
        tokens = x[:, self.lo : self.hi]
        mask, pos, past = self._block_inputs(tokens, None, self.causal)
        out, self.past = self.forward(self.model, tokens, mask, pos, past, True)
        if self.reveal_first:  # (the finished block's last output predicts the next block's first token)
            self.prev, self.prev_real = out[:, -1].clone(), torch.ones_like(self.prev_real)
        del out
        self.key_real = torch.cat([self.key_real, self.key_real.new_ones(tokens.shape)], dim=1)
        self.cache_passes += 1


def _prompt_mask4d(prompt_mask: torch.Tensor, block_size: int = 1, prompt_blocks: bool = False) -> torch.Tensor:
    """``(B, 1, P, P)`` bool: the prompt rows of :func:`block_causal_mask` (real tokens attend the real prompt, or
    with ``prompt_blocks`` its blocks up to their own; padding attends itself)."""
    return block_causal_mask(prompt_mask, 1, block_size, prompt_blocks)[..., :-1, :-1]


def _groups(width: int, sub_block_size: int | None, device) -> torch.Tensor | None:
    """``(width,)`` long: each block position's sub-block (``j // sub_block_size``), or ``None`` without sub-blocks."""
    return None if sub_block_size is None else torch.arange(width, device=device) // sub_block_size


def _first_group(masked: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``(n, Lb)`` bool: the masked positions of each row's first sub-block that still holds one."""
    big = torch.iinfo(torch.long).max
    current = torch.where(masked, groups, big).min(dim=1, keepdim=True).values  # (n, 1)
    return masked & (groups == current)


def _validate(prompt_ids, prompt_mask, canvas, gen_length, block_size, steps_per_block, temperature, remasking,
              threshold, threshold_factor) -> None:
    """Check :func:`block_generate`'s arguments (``ValueError`` naming the argument)."""
    if prompt_ids.dim() != 2 or prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"prompt_ids must be (B, P) with a prompt_mask of the same shape, got "
                         f"{tuple(prompt_ids.shape)} and {tuple(prompt_mask.shape)}")
    from dlmrl.models.families import left_padding

    left_padding(prompt_mask.bool())  # (raises on right or inner padding: positions and prompt blocks assume left)
    block_bounds(gen_length, block_size)  # (raises on gen_length or block_size < 1)
    if threshold is not None and threshold_factor is not None:
        raise ValueError("give threshold or threshold_factor, not both")
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if threshold_factor is not None and not (isinstance(threshold_factor, (int, float)) and threshold_factor > 0):
        raise ValueError(f"threshold_factor must be > 0, got {threshold_factor!r}")
    thresholded = threshold is not None or threshold_factor is not None
    if not thresholded and (isinstance(steps_per_block, bool) or not isinstance(steps_per_block, int)
                            or steps_per_block < 1):
        raise ValueError(f"steps_per_block must be an integer >= 1 without a threshold, got {steps_per_block!r}")
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; expected one of {REMASKING}")
    if thresholded and remasking != "low_confidence":
        raise ValueError(f"threshold decoding needs remasking 'low_confidence', got {remasking!r}")
    if not temperature >= 0:  # (NaN included: it would decode every token as id 0)
        raise ValueError(f"temperature must be a number >= 0, got {temperature}")
    if canvas is not None and tuple(canvas.shape) != (prompt_ids.shape[0], gen_length):
        raise ValueError(f"canvas shape {tuple(canvas.shape)} != (batch, gen_length) = "
                         f"({prompt_ids.shape[0]}, {gen_length})")


def _check_token_ids(policy, prompt_ids: torch.Tensor) -> None:
    """Integer ids inside the model's vocabulary, padding included (padding positions are embedded too, then masked)
    (``ValueError`` naming ``prompt_ids``; torch would fail later with a bare index error)."""
    if prompt_ids.dtype.is_floating_point or prompt_ids.dtype == torch.bool or prompt_ids.is_complex():
        raise ValueError(f"prompt_ids must be integer token ids, got dtype {prompt_ids.dtype}")
    vocab = getattr(getattr(getattr(policy, "model", None), "config", None), "vocab_size", None)
    if isinstance(vocab, int) and prompt_ids.numel() and (int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= vocab):
        raise ValueError(f"prompt_ids holds token ids outside the model's vocabulary [0, {vocab}): "
                         f"min {int(prompt_ids.min())}, max {int(prompt_ids.max())}")


@torch.no_grad()
def block_generate(
    policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    gen_length: int,
    block_size: int,
    steps_per_block: int | None = None,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    threshold: float | None = None,
    threshold_factor: float | None = None,
    canvas: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    cache: bool = True,
    forward: BlockForwardFn = hf_block_forward,
    rows: tuple[int, int] | None = None,
    prompt_blocks: bool = False,
    eos_token_id: int | None = None,
    stop_at_eos: bool = False,
    logit_shift: int = 0,
    sub_block_size: int | None = None,
    clean_context: str = "block",
) -> BlockSampleOutput:
    """Decode ``gen_length`` tokens after each prompt with a block-causal denoiser, block by block.

    Per step of block ``b`` (see the module docstring for the rules and the cache): one pass gives the block's logits;
    ``x0`` = argmax of the (Gumbel-noised) logits with the mask token at ``-inf``; the ``k`` most confident masked
    positions are revealed (``k`` from :func:`~dlmrl.models.reveal.num_transfer_tokens` of the row's masks in the
    block; ties to the leftmost), or, with a threshold, the positions :func:`~dlmrl.models.reveal.threshold_reveal`
    picks, a block then taking as many steps as its rows need (at most its length; rows whose block is decoded leave
    the pass). A step at which no row reveals anything runs no pass.

    Early stop (``stop_at_eos``; SDAR's ``block_diffusion_generate`` stops at the block holding a stop token): a row
    ends once a finished block holds ``eos_token_id``, and its later blocks are EOS that no step wrote
    (``reveal_step`` ``NOT_SAMPLED``, ``token_logprobs`` 0, ``decoded_length`` the end of its EOS block), whatever
    the call decoded there (:class:`~dlmrl.models.sampler.EosStop`). Every block up to and including that one is
    decoded exactly as without the stop: no position attends a later block. Without a threshold the passes stop
    once every row of the call has ended (no more denoising or cache passes) and the remaining steps' numbers are
    drawn without a pass (:func:`~dlmrl.models.sampler.skip_step_draws`), so ``generator`` ends where the full
    decode leaves it; with a threshold a row that has ended leaves the pass, as a row whose block is decoded does.

    Args:
        policy: a block-causal masked-diffusion policy: ``model`` (a ``transformers`` decoder for the default
            ``forward``) and ``mask_token_id``.
        prompt_ids: ``(B, P)`` long, left-padded. prompt_mask: ``(B, P)`` bool, True on real tokens.
        gen_length: completion length ``L``. block_size: tokens per block; the last block holds the remaining
            ``L mod block_size`` when it does not divide ``L`` (decoded with the same steps per block).
        steps_per_block: denoising steps per block (required without a threshold; unused with one).
        temperature: Gumbel-max temperature, 0 = greedy. remasking: ``low_confidence``, ``random`` or
            ``left_to_right`` (a threshold needs ``low_confidence``).
        threshold: Fast-dLLM's confidence threshold ``τ`` in ``(0, 1]``. threshold_factor: its factor rule ``f > 0``.
        canvas: optional ``(B, L)`` long infill canvas: only its mask tokens are decoded; the others are clean
            tokens of their block from the start.
        generator: the only source of randomness (advances as ``generate``'s does).
        cache: the exact key/value cache (default) or the uncached reference (full block-causal passes).
        forward: the family's :data:`~dlmrl.models.block_attention.BlockForwardFn`.
        rows: ``(start, stop)``: decode only rows ``[start, stop)`` (one process's share of a data-parallel batch;
            the model runs on those rows only), each with the random numbers and the generator's final state of
            decoding the whole batch, as :func:`~dlmrl.models.sampler.generate`'s ``rows``. ``None``: every row.
        prompt_blocks: the prompt cut into blocks too (:func:`~dlmrl.models.block_attention.prompt_block_ids`; the
            SDAR family), else one clean block.
        eos_token_id: the token a row ends at (``stop_at_eos``). stop_at_eos: stop rows at EOS (above).
        logit_shift: 1 for a family whose output at ``j`` predicts token ``j + 1`` (see the module docstring: shifted
            logits, a block's first token revealed first); 0 (default) for position ``i`` predicting token ``i``.
        sub_block_size: decode each block in sub-blocks of this many positions, left to right (see the module
            docstring; Fast-dLLM v2's ``small_block_size``); ``None`` (default): the whole block at once.
        clean_context: ``"block"`` (default) or ``"causal"`` (see the module docstring: the prompt and the finished
            blocks attended token-causally, a block's first token from the output before it, revealed first;
            ``prompt_blocks`` then changes nothing; needs ``logit_shift`` 0).
    Returns:
        :class:`BlockSampleOutput`: ``canvas`` ``(B, L)`` long, ``token_logprobs`` ``(B, L)`` float32 (the log-prob of
        each revealed token under ``log_softmax(logits / T)`` with the mask token excluded, ``T = 1`` when greedy; 0
        where nothing was drawn), ``reveal_step`` ``(B, L)`` long (global numbering, ``NOT_SAMPLED`` on given infill
        tokens and after an early stop), ``nfe``, ``row_nfe`` and ``decoded_length`` ``(B,)`` and ``cache_passes``
        (``rows``: ``stop - start`` rows).
    Raises:
        ValueError: on mismatched shapes, a prompt mask that is not left-padded, ``gen_length`` or ``block_size``
            below 1, a missing ``steps_per_block``, an unknown ``remasking``, a threshold outside its range, both
            threshold rules, a negative temperature, ``stop_at_eos`` without ``eos_token_id``, a ``logit_shift`` other
            than 0 or 1, a ``sub_block_size`` that is not an integer >= 1, a ``clean_context`` not in
            ``CLEAN_CONTEXTS`` (or ``"causal"`` with ``logit_shift`` 1), or a policy without ``mask_token_id``.
    Reference: SDAR arXiv 2510.06303 (``block_diffusion_generate``); LLaDA arXiv 2502.09992 (``generate``);
    Fast-dLLM arXiv 2505.22618 (``get_transfer_index``).
    """
    _validate(prompt_ids, prompt_mask, canvas, gen_length, block_size, steps_per_block, temperature, remasking,
              threshold, threshold_factor)
    if getattr(policy, "mask_token_id", None) is None:
        raise ValueError("policy must have a mask_token_id attribute")
    if stop_at_eos and eos_token_id is None:
        raise ValueError("stop_at_eos=True needs eos_token_id")
    _check_token_ids(policy, prompt_ids)
    check_logit_shift(logit_shift)
    if check_clean_context(clean_context) == "causal" and logit_shift:
        raise ValueError("clean_context 'causal' shifts only a block's first token: it needs logit_shift 0, got 1")
    if sub_block_size is not None and (isinstance(sub_block_size, bool) or not isinstance(sub_block_size, int)
                                       or sub_block_size < 1):
        raise ValueError(f"sub_block_size must be an integer >= 1 or None, got {sub_block_size!r}")
    mask_id = int(policy.mask_token_id)
    prompt_mask = prompt_mask.bool()
    total = prompt_ids.shape[0]
    start, stop = (0, total) if rows is None else rows
    if rows is not None and not 0 <= start < stop <= total:
        raise ValueError(f"rows ({start}, {stop}) must satisfy 0 <= start < stop <= batch size {total}")
    if canvas is None:
        x_all = torch.full((total, gen_length), mask_id, dtype=torch.long, device=prompt_ids.device)
    else:
        x_all = canvas.to(device=prompt_ids.device, dtype=torch.long).clone()  # (B_all, L)
    # the rows decoded here; every row's masks still decide which scheduled steps run (a view: x_all follows x)
    x, prompt_ids, prompt_mask = x_all[start:stop], prompt_ids[start:stop], prompt_mask[start:stop]
    noise_rows = None if rows is None else (start, total)
    reveal_step = torch.full(x.shape, NOT_SAMPLED, dtype=torch.long, device=x.device)  # (B, L)
    token_logprobs = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # (B, L)
    score_t = temperature if temperature > 0 else 1.0  # (greedy rows are scored at T = 1, as generate records them)
    fwd = _ExactBlockForward(policy.model, forward, prompt_ids, prompt_mask, gen_length, block_size, cache,
                             prompt_blocks, logit_shift, clean_context)
    record = (x, reveal_step, token_logprobs)
    ends = EosStop(eos_token_id if stop_at_eos else None, x.shape[0], gen_length, x.device)
    if threshold is None and threshold_factor is None:
        nfe = _decode_scheduled(fwd, record, x_all, start, mask_id, block_size, steps_per_block, temperature, score_t,
                                remasking, generator, noise_rows, ends, sub_block_size)
        row_nfe = torch.full((x.shape[0],), nfe, dtype=torch.long, device=x.device)
    else:
        nfe, row_nfe = _decode_threshold(fwd, record, mask_id, block_size, temperature, score_t, generator,
                                         threshold, threshold_factor, noise_rows, ends, sub_block_size)
    ends.fill(x, reveal_step, token_logprobs)
    return BlockSampleOutput(canvas=x, nfe=nfe, reveal_step=reveal_step, token_logprobs=token_logprobs,
                             row_nfe=row_nfe, decoded_length=ends.decoded_length, cache_passes=fwd.cache_passes)


def _decode_scheduled(fwd: _ExactBlockForward, record, x_all, start: int, mask_id: int, block_size: int, steps: int,
                      temperature: float, score_t: float, remasking: str, generator, noise_rows,
                      ends: EosStop, sub_block_size: int | None = None) -> int:
    """The block loop with LLaDA's schedule (as ``generate``'s): fills ``record`` in place; returns ``nfe``. Once
    every row has ended (``ends``) no pass runs; the remaining steps' numbers are drawn and dropped."""
    x, reveal_step, token_logprobs = record
    bounds = block_bounds(x.shape[1], block_size)
    nfe, vocab, running = 0, None, True
    draws = temperature > 0 or remasking == "random"  # (steps that draw numbers even without a pass)
    for block, (lo, hi) in enumerate(bounds):
        if not running and not draws:  # (every row has ended and nothing is left to draw)
            break
        fwd.start_block(lo, hi)
        schedule = num_transfer_tokens(x_all[:, lo:hi] == mask_id, steps)  # (B_all, steps)
        for step in range(steps):
            if not bool((schedule[:, step] > 0).any()):
                continue
            if not running:  # (the step's numbers, as the full decode draws them, without its pass)
                skip_step_draws(x.shape[0], hi - lo, vocab, temperature, remasking, generator, x.device, noise_rows)
                continue
            k = schedule[start : start + x.shape[0], step]  # (B,)
            logits = fwd.logits(x)  # (B, Lb, V)
            vocab = logits.shape[-1]
            nfe += 1
            # (the mask is never drawn; the confidence keeps the full softmax)
            x0 = drawn_tokens(logits, mask_id, temperature,
                              lambda c: add_gumbel_noise(c, temperature, generator, noise_rows))  # (B, Lb)
            if remasking == "low_confidence":
                conf = _confidence(logits, x0)
            elif remasking == "random":
                conf = _uniform(x0.shape, generator, x0.device, noise_rows)
            else:  # left_to_right
                conf = -torch.arange(hi - lo, device=x0.device, dtype=torch.float64).expand(x0.shape)
            if fwd.reveal_first:  # (a block's first token, predicted from the previous block, is revealed first)
                conf = conf.clone()
                conf[:, 0] = float("inf")
            masked = x[:, lo:hi] == mask_id  # (B, Lb)
            conf = conf.masked_fill(~masked, float("-inf"))
            order = conf.argsort(dim=1, descending=True, stable=True)
            groups = _groups(hi - lo, sub_block_size, x.device)
            if groups is not None:  # (sub-blocks left to right, by confidence inside one; unmasked positions last)
                key = torch.where(masked, groups, torch.iinfo(torch.long).max).gather(1, order)
                order = order.gather(1, key.argsort(dim=1, stable=True))
            rank = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device)
                                                    .expand_as(order))  # (B, Lb)
            reveal = (rank < k[:, None]) & masked
            x[:, lo:hi] = torch.where(reveal, x0, x[:, lo:hi])
            reveal_step[:, lo:hi] = torch.where(reveal, block * steps + step, reveal_step[:, lo:hi])
            token_logprobs[:, lo:hi] += _revealed_logprobs(logits, x0, reveal, mask_id, score_t)
        if running and ends.finish_block(x, hi):
            # (passes stop; a call whose rows all ended before any pass, on a given EOS, has no vocabulary size to
            # replay the draws with: it keeps decoding, and its rows are filled all the same)
            running = vocab is None
        if running and block + 1 < len(bounds):
            fwd.finish_block(x)
    return nfe


def _decode_threshold(fwd: _ExactBlockForward, record, mask_id: int, block_size: int, temperature: float,
                      score_t: float, generator, threshold, factor, noise_rows,
                      ends: EosStop, sub_block_size: int | None = None) -> tuple[int, torch.Tensor]:
    """The block loop of threshold decoding (as ``generate``'s: one generator draw seeds every step's noise, rows
    whose block is decoded or that have ended at EOS leave the pass); returns ``(nfe, row_nfe (B,))``."""
    x, reveal_step, token_logprobs = record
    bounds = block_bounds(x.shape[1], block_size)
    seed = None
    noise_device = generator.device if generator is not None else x.device
    if temperature > 0:
        where = generator.device if generator is not None else torch.device("cpu")
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator, device=where))
    nfe = 0
    row_nfe = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    for block, (lo, hi) in enumerate(bounds):
        fwd.start_block(lo, hi)
        for step in range(hi - lo):  # (each step reveals >= 1 token of every row still decoding)
            masked = x[:, lo:hi] == mask_id  # (B, Lb)
            active = masked.any(dim=1) & ~ends.ended  # (B,)
            if not bool(active.any()):
                break
            idx = None if bool(active.all()) else active.nonzero().squeeze(1)  # (n,)
            logits = fwd.logits(x, idx)  # (n, Lb, V)
            nfe += 1
            row_nfe += active.long()
            def noise(choice, block=block, step=step, idx=idx):
                g = _step_generator(seed, block * block_size + step, noise_device)
                u = _uniform((x.shape[0], *choice.shape[1:]), g, choice.device, noise_rows)  # (B, Lb, V): every row's
                return _gumbel(choice, temperature, u if idx is None else u[idx])

            x0 = drawn_tokens(logits, mask_id, temperature, noise)  # (n, Lb)
            rows = slice(None) if idx is None else idx
            m = masked[rows]
            groups = _groups(hi - lo, sub_block_size, x.device)
            candidates = m if groups is None else _first_group(m, groups)  # (the current sub-block's masks)
            cuts = reveal_cuts(threshold, factor, hi - lo)
            reveal = threshold_reveal(_confidence(logits, x0, cuts), candidates, threshold, factor)  # (n, Lb)
            if fwd.reveal_first:  # (a masked first token of the block is revealed alone, before the others)
                alone = torch.zeros_like(reveal)
                alone[:, 0] = True
                reveal = torch.where(m[:, :1], alone, reveal)
            x[rows, lo:hi] = torch.where(reveal, x0, x[rows, lo:hi])
            reveal_step[rows, lo:hi] = torch.where(reveal, block * block_size + step, reveal_step[rows, lo:hi])
            token_logprobs[rows, lo:hi] += _revealed_logprobs(logits, x0, reveal, mask_id, score_t)
        if ends.finish_block(x, hi):  # (every row has ended: no pass is left to run, nothing to draw)
            break
        if block + 1 < len(bounds):
            fwd.finish_block(x)
    return nfe, row_nfe


__all__ = ["BlockSampleOutput", "block_generate"]
