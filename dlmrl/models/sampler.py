"""Diffusion sampling: semi-autoregressive block decoding with low-confidence remasking.

The canvas of ``gen_length`` mask tokens after the prompt is split into blocks of
``block_length`` decoded left to right. Each block gets ``steps // num_blocks`` denoising steps;
at every step the policy predicts all positions, a token ``x0`` is drawn for each masked position
(argmax, or Gumbel-max at ``temperature > 0``; never the mask token) and the most confident masked
positions of the current block are revealed, the confidence being the probability of ``x0`` under the
model's full softmax (mask token included), as the reference computes it. Revealed tokens are never
remasked.

With a confidence threshold (Fast-dLLM's parallel decoding) every masked position of the block whose
confidence reaches the threshold is revealed at once (at least the most confident one), so the number of
steps adapts to the model's certainty; the factor rule is Fast-dLLM's other variant.

Reference: LLaDA, Nie et al., arXiv 2502.09992, Algorithm "low-confidence remasking" and the
released ``generate.py`` (``generate``, ``get_num_transfer_tokens``, ``add_gumbel_noise``); Fast-dLLM,
Wu et al., arXiv 2505.22618, and its ``llada/generate.py`` (``get_transfer_index`` with ``threshold``,
``get_transfer_index_dynamic`` with ``factor``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrl.models.block_cache import CACHE_MODES, BlockCache
from dlmrl.models.families import cached_logits_of
from dlmrl.models.gumbel import _gumbel, _uniform, add_gumbel_noise, drawn_tokens, sampler_log_softmax
from dlmrl.models.policy import canvas_logits
from dlmrl.models.reveal import (
    NOT_SAMPLED,
    _confidence,
    left_to_right_reveal_steps,
    num_transfer_tokens,
    reveal_cuts,
    threshold_reveal,
)

REMASKING = ("low_confidence", "random", "left_to_right")

@dataclass
class SampleOutput:
    """Result of :func:`generate`.

    Attributes:
        canvas: ``(B, L)`` long, the decoded completion (prompt not included), no mask tokens left.
        nfe: forward passes the call ran, counted per sequence of the model batch (a classifier-free-guidance
            step counts 2): the steps that ran. Without a threshold every decoded row takes part in every one.
        reveal_step: ``(B, L)`` long, the trajectory: the index of the step that revealed each canvas
            position, counted over all blocks from 0, and :data:`NOT_SAMPLED` (-1) on positions the sampler
            did not write (pre-placed infill tokens). Without a threshold block ``b``'s step ``s`` is
            ``b · steps_per_block + s`` (a step skipped because no row reveals anything keeps its index);
            with one (``threshold`` / ``threshold_factor``) a block takes at most ``block_length`` steps and
            its step ``s`` is ``b · block_length + s``, so a row's indices can have gaps (the ``trajectory``
            estimator ranks a row's distinct steps; gaps change nothing). Recorded at no extra forward
            pass. ``fill_after_eos`` overwrites tokens after the first EOS but keeps their recorded step.
        token_logprobs: ``(B, L)`` float32, the log-probability of each revealed token under the distribution
            it was drawn from: ``log_softmax(logits / T)`` with the mask token's logit at ``-inf``
            (:func:`sampler_log_softmax`, at ``T = 1`` for a greedy call, as the ``trajectory`` estimator scores
            greedy rollouts), of the logits of the step that revealed it (guided ones with classifier-free
            guidance); 0 where the sampler wrote nothing. ``fill_after_eos`` leaves them those of the drawn
            tokens.
        row_nfe: ``(B,)`` long, the forward passes each row took part in (same counting as ``nfe``). Without a
            threshold every entry is ``nfe``; with one a row leaves the model batch once its block is decoded.
        decoded_length: ``(B,)`` long, the canvas positions ``[0, n)`` each row decoded: ``L``, or with
            ``stop_at_eos`` the end of the block holding the row's first EOS, after which the row holds EOS that
            no step wrote (``reveal_step`` :data:`NOT_SAMPLED`, ``token_logprobs`` 0). ``None`` from samplers that
            do not record it.
    """

    canvas: torch.Tensor
    nfe: int
    reveal_step: torch.Tensor | None = None
    token_logprobs: torch.Tensor | None = None
    row_nfe: torch.Tensor | None = None
    decoded_length: torch.Tensor | None = None


def _validate(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    canvas: torch.Tensor | None,
    gen_length: int,
    block_length: int,
    steps: int,
    remasking: str,
    eos_token_id: int | None,
    fill_after_eos: bool,
    threshold: float | None = None,
    threshold_factor: float | None = None,
    cache: str = "none",
    cfg_scale: float = 0.0,
) -> tuple[int, int]:
    """Check arguments of :func:`generate`; return ``(num_blocks, steps_per_block)``."""
    if prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids must be (B, P), got shape {tuple(prompt_ids.shape)}")
    if prompt_mask.shape != prompt_ids.shape:
        raise ValueError(
            f"prompt_mask shape {tuple(prompt_mask.shape)} != prompt_ids shape {tuple(prompt_ids.shape)}"
        )
    if gen_length < 1 or block_length < 1:
        raise ValueError(f"gen_length ({gen_length}) and block_length ({block_length}) must be >= 1")
    if gen_length % block_length != 0:
        raise ValueError(f"gen_length ({gen_length}) must be divisible by block_length ({block_length})")
    num_blocks = gen_length // block_length
    if isinstance(steps, bool) or not isinstance(steps, int):  # (a ValueError, as every other bad setting here)
        raise ValueError(f"steps must be an integer, got {steps!r}")  # noqa: TRY004
    thresholded = threshold is not None or threshold_factor is not None  # (each block runs until decoded)
    if not thresholded and steps % num_blocks != 0:  # (with a threshold the steps are unused: not checked)
        raise ValueError(
            f"steps ({steps}) must be divisible by the number of blocks "
            f"(gen_length / block_length = {gen_length} / {block_length} = {num_blocks})"
        )
    if not thresholded and steps // num_blocks < 1:
        raise ValueError(f"steps ({steps}) must give >= 1 step per block ({num_blocks} blocks)")
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; expected one of {REMASKING}")
    if canvas is not None and canvas.shape != (prompt_ids.shape[0], gen_length):
        raise ValueError(
            f"canvas shape {tuple(canvas.shape)} != (batch, gen_length) = ({prompt_ids.shape[0]}, {gen_length})"
        )
    if fill_after_eos and eos_token_id is None:
        raise ValueError("fill_after_eos=True needs eos_token_id")
    if threshold is not None and threshold_factor is not None:
        raise ValueError("give threshold or threshold_factor, not both")
    if threshold is not None and not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
                                      and 0 < threshold <= 1):
        raise ValueError(f"threshold must be in (0, 1] (a probability), got {threshold!r}")
    if threshold_factor is not None and not (isinstance(threshold_factor, (int, float))
                                             and not isinstance(threshold_factor, bool) and threshold_factor > 0):
        raise ValueError(f"threshold_factor must be > 0, got {threshold_factor!r}")
    if (threshold is not None or threshold_factor is not None) and remasking != "low_confidence":
        raise ValueError(f"threshold / threshold_factor compare the model's confidence in its token: they need "
                         f"remasking 'low_confidence', got {remasking!r}")
    if cache not in CACHE_MODES:
        raise ValueError(f"unknown cache {cache!r}; expected one of {CACHE_MODES}")
    if cache != "none" and cfg_scale > 0:
        raise ValueError("a block cache (cache 'prefix' / 'dual') is not implemented with classifier-free guidance "
                         "(cfg_scale > 0); use cache 'none'")
    return num_blocks, steps // num_blocks


def _guided_logits(
    policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    canvas: torch.Tensor,
    mask_id: int,
    cfg_scale: float,
) -> torch.Tensor:
    """Canvas logits ``(B, L, V)``, with classifier-free guidance when ``cfg_scale > 0``.

    The unconditional pass replaces the real prompt tokens by the mask token (padding untouched)
    and runs in the same batch as the conditional one; guided logits are
    ``un + (cfg_scale + 1) * (cond - un)`` (LLaDA arXiv 2502.09992, ``generate``).
    """
    if cfg_scale <= 0:
        return canvas_logits(policy, prompt_ids, prompt_mask, canvas)
    un_prompt = prompt_ids.masked_fill(prompt_mask, mask_id)  # (B, P)
    both = canvas_logits(
        policy,
        torch.cat([prompt_ids, un_prompt]),
        torch.cat([prompt_mask, prompt_mask]),
        torch.cat([canvas, canvas]),
    )  # (2B, L, V)
    cond, un = both.chunk(2, dim=0)
    return un + (cfg_scale + 1) * (cond - un)


def fill_after_first(canvas: torch.Tensor, token_id: int) -> torch.Tensor:
    """Set every position after each row's first ``token_id`` to ``token_id``: ``(B, L)`` -> ``(B, L)``."""
    seen = (canvas == token_id).long().cumsum(dim=1) > 0  # (B, L)
    return canvas.masked_fill(seen, token_id)


class EosStop:
    """Early stop at EOS (``stop_at_eos``) for one sampling call: which rows have ended and where.

    A row ends once a finished block holds an EOS: positions ``[0, hi)`` decoded, one of them ``eos``. Its later
    blocks are then not part of its completion (its text ends at its first EOS, and the blocks before them were
    decoded while they were still masked), so :meth:`fill` overwrites them with EOS whatever the call decoded
    there: a row's output does not depend on the rows it is sampled with. ``eos=None``: no stop (nothing ends).

    Attributes:
        ended: ``(B,)`` bool. decoded_length: ``(B,)`` long, ``L`` until the row ends, then the end of its EOS
            block.
    """

    def __init__(self, eos: int | None, rows: int, length: int, device: torch.device):
        self.eos, self.length = eos, length
        self.ended = torch.zeros(rows, dtype=torch.bool, device=device)
        self.decoded_length = torch.full((rows,), length, dtype=torch.long, device=device)

    def finish_block(self, x: torch.Tensor, hi: int) -> bool:
        """After a block ending at canvas position ``hi`` is decoded in ``x (B, L)``: mark the rows whose
        positions ``[0, hi)`` hold an EOS as ended there; return whether every row has ended."""
        if self.eos is None:
            return False
        now = (x[:, :hi] == self.eos).any(dim=1) & ~self.ended  # (B,)
        self.decoded_length[now] = hi
        self.ended |= now
        return bool(self.ended.all())

    def fill(self, x: torch.Tensor, reveal_step: torch.Tensor, token_logprobs: torch.Tensor) -> None:
        """In place: EOS, :data:`NOT_SAMPLED` and log-prob 0 at every position of a row from its
        ``decoded_length`` on."""
        if self.eos is None:
            return
        tail = torch.arange(self.length, device=x.device)[None, :] >= self.decoded_length[:, None]  # (B, L)
        x.masked_fill_(tail, self.eos)
        reveal_step.masked_fill_(tail, NOT_SAMPLED)
        token_logprobs.masked_fill_(tail, 0.0)


def skip_step_draws(rows: int, width: int, vocab: int, temperature: float, remasking: str,
                    generator: torch.Generator | None, device: torch.device,
                    noise_rows: tuple[int, int] | None) -> None:
    """Advance ``generator`` as one scheduled step over ``rows`` rows of a ``width``-token block would (the Gumbel
    noise ``(rows, width, vocab)`` at ``temperature > 0``, then ``random`` remasking's ``(rows, width)``
    confidences), drawing and dropping the numbers without a forward pass: a call that stopped early leaves the
    generator where the full decode leaves it, so every later draw of the step (and every micro-batch, every
    process) stays the same. Nothing is drawn for a greedy ``low_confidence`` or ``left_to_right`` step."""
    where = generator.device if generator is not None else device  # (drawn where the decode draws; not copied)
    if temperature > 0:
        _uniform((rows, width, vocab), generator, where, noise_rows)
    if remasking == "random":
        _uniform((rows, width), generator, where, noise_rows)


def _revealed_logprobs(logits: torch.Tensor, x0: torch.Tensor, reveal: torch.Tensor, mask_id: int,
                       temperature: float) -> torch.Tensor:
    """``(n, Lb)`` float32: ``log p(x0)`` under :func:`sampler_log_softmax` at ``temperature`` where ``reveal``
    (computed on those positions only, in the logits' precision as the scorer computes it), 0 elsewhere."""
    out = torch.zeros(reveal.shape, dtype=torch.float32, device=reveal.device)
    r, i = reveal.nonzero(as_tuple=True)
    if len(r):
        picked = logits[r, i]  # (k, V)
        picked = picked if picked.dtype == torch.float64 else picked.float()
        lp = sampler_log_softmax(picked, mask_id, temperature).gather(-1, x0[r, i][:, None]).squeeze(-1)
        out[r, i] = lp.float()
    return out


class _BlockForward:
    """The sampler's forward pass for the current block: ``forward(x, rows) -> (n, Lb, V)`` logits of rows ``rows``
    (``(n,)`` increasing indices, ``None`` = all) of the canvas ``x (B, L)``, over the whole ``[prompt | canvas]``
    (``cache="none"``, with classifier-free guidance when ``cfg_scale > 0``) or through the family's block cache
    (:class:`~dlmrl.models.block_cache.BlockCache`)."""

    def __init__(self, policy, prompt_ids, prompt_mask, mask_id: int, cfg_scale: float, cache: str):
        self.policy, self.prompt_ids, self.prompt_mask = policy, prompt_ids, prompt_mask
        self.mask_id, self.cfg_scale = mask_id, cfg_scale
        self.cache = None
        if cache != "none":
            self.cache = BlockCache(policy, cached_logits_of(getattr(policy, "family", None), cache), prompt_ids,
                                    prompt_mask, cache)
        self.lo = self.hi = 0

    def start_block(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        if self.cache is not None:
            self.cache.start_block(lo, hi)

    def __call__(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        if self.cache is not None:
            return self.cache.logits(x, rows)
        ids, mask = (self.prompt_ids, self.prompt_mask) if rows is None else (self.prompt_ids[rows],
                                                                           self.prompt_mask[rows])
        canvas = x if rows is None else x[rows]
        return _guided_logits(self.policy, ids, mask, canvas, self.mask_id, self.cfg_scale)[:, self.lo : self.hi]


#: odd 64-bit constant that spreads the per-step seeds of threshold decoding (the golden-ratio increment)
_SEED_STRIDE = 0x9E3779B97F4A7C15


def _step_generator(seed: int, index: int, device: torch.device) -> torch.Generator:
    """The generator of threshold step ``index``: seeded from the call's one draw ``seed`` and the step."""
    return torch.Generator(device=device).manual_seed((seed + (index + 1) * _SEED_STRIDE) % (1 << 64))


@torch.no_grad()
def generate(
    policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    steps: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    cfg_scale: float = 0.0,
    canvas: torch.Tensor | None = None,
    eos_token_id: int | None = None,
    fill_after_eos: bool = False,
    generator: torch.Generator | None = None,
    rows: tuple[int, int] | None = None,
    threshold: float | None = None,
    threshold_factor: float | None = None,
    cache: str = "none",
    stop_at_eos: bool = False,
) -> SampleOutput:
    """Decode a canvas after each prompt by iterative unmasking, block by block.

    Per step: one forward pass (two with CFG) over ``[prompt | canvas]``; ``x0`` = argmax of the
    (Gumbel-noised, if ``temperature > 0``) logits with the mask token's logit at ``-inf``, so the mask
    token is never drawn; confidence (``low_confidence``) = the probability of ``x0`` under the model's
    *full* softmax of the un-noised logits, mask token included, in float64, as LLaDA's reference computes it
    (renormalising without the mask token, ``p / (1 − p_mask)``, changes the reveal order), or a uniform
    number (``random``); positions that are not masked or lie outside the current block get ``-inf``; each row
    reveals its ``k`` most confident positions, ``k`` from :func:`num_transfer_tokens` of that row's masks in
    the block (ties go to the leftmost position); ``left_to_right`` reveals the leftmost masked positions
    instead (an autoregressive order, as JustGRPO's rollouts, arXiv 2601.15165). A step at which no row reveals
    anything (e.g. a block with no masks in an infilling canvas) is skipped without a forward pass.
    Every revealed position's step index is recorded (``SampleOutput.reveal_step``), the trajectory the
    ``trajectory`` likelihood estimator scores, with the log-probability the token was drawn with
    (``SampleOutput.token_logprobs``).

    Threshold decoding (``threshold`` or ``threshold_factor``; Fast-dLLM's parallel decoding): each step of a
    block reveals the masked positions :func:`threshold_reveal` picks: all whose confidence reaches
    ``threshold``, or the factor rule's prefix, and always at least the most confident one, so rows reveal
    different numbers of tokens. A block runs until every row has decoded it, at most ``block_length`` steps
    (a row's block with ``m`` masks takes 1 to ``m`` steps); ``steps`` must still split over the blocks but
    does not set the pace (as in Fast-dLLM's ``generate``, where the schedule is computed and unused when a
    threshold is given). A row whose block is decoded leaves the model batch (the forward pass runs on the
    rows still decoding; when none is left the next block starts), and ``SampleOutput.row_nfe`` counts the
    passes each row took part in. The Gumbel noise of step ``s`` of block ``b`` comes from a generator seeded
    with one draw from ``generator`` and the step, so a row's numbers do not depend on how many steps the
    other rows took (nor on ``rows``); ``generator`` advances by that one draw (none when greedy).

    Block caching (``cache``, Fast-dLLM's prefix and dual cache; :mod:`dlmrl.models.block_cache`): a block's first
    pass runs over the whole sequence and keeps the keys and values before the block (``"prefix"``) or outside it
    (``"dual"``); the block's later passes feed only the block and what follows (prefix) or the block alone (dual).
    An approximation (the cached states are those of the block at its first pass) that the recorded
    ``token_logprobs`` reflect; ``nfe`` counts cached passes like full ones. Needs a family with a cache
    (:func:`dlmrl.models.families.cached_logits_of`) and no classifier-free guidance.

    Infilling: pass ``canvas`` with some positions already filled; only positions equal to the
    policy's ``mask_token_id`` are decoded, filled positions never change.

    Early stop (``stop_at_eos``, with ``eos_token_id``): a row ends once a finished block holds an EOS; its later
    blocks are not part of its output (EOS, ``reveal_step`` :data:`NOT_SAMPLED`, ``token_logprobs`` 0,
    ``SampleOutput.decoded_length`` the end of its EOS block), whatever the call decoded there. Every block up to
    and including that one is decoded exactly as without the stop. Without a threshold the call stops its forward
    passes once every row has ended and draws the numbers of the remaining steps without a pass
    (:func:`skip_step_draws`), so ``generator`` ends where the full decode leaves it; with one a row that has ended
    leaves the model batch like a row whose block is decoded. ``nfe`` / ``row_nfe`` count the passes run. Off by
    default: LLaDA's ``generate`` decodes the whole canvas, and a bidirectional scorer sees the EOS filling where
    the full decode would have left its own tokens.

    EOS: with ``eos_token_id`` given and ``fill_after_eos=True``, after decoding every position
    after a row's first EOS is set to EOS (the padded form LLaDA-style models are trained to emit;
    this also overwrites filled positions of an infilling canvas that lie after an EOS). Without
    it the canvas is returned as decoded.

    Block-diffusion policies (:class:`~dlmrl.models.block_policy.BlockDiffusionPolicy`) decode in their own blocks
    with an exact key/value cache (:meth:`~dlmrl.models.block_policy.BlockDiffusionPolicy.sample_blocks`, the same
    rules): ``block_length`` is not used, ``steps`` are split over the policy's blocks, ``cfg_scale`` must be 0 and
    ``cache`` ``"none"``.

    Args:
        policy: callable ``(input_ids (B, T) long, attention_mask (B, T) bool) -> (B, T, V)`` with a
            ``mask_token_id`` attribute, e.g. a ``MaskedDiffusionPolicy``; or a block-diffusion policy.
        prompt_ids: ``(B, P)`` long, left-padded prompts.
        prompt_mask: ``(B, P)`` bool, True on real prompt tokens.
        gen_length: canvas length ``L``.
        block_length: block size; must divide ``gen_length``.
        steps: total denoising steps; must be a positive multiple of ``gen_length / block_length`` (with a
            threshold: unused, so any integer).
        temperature: Gumbel-max temperature; ``0`` is greedy.
        remasking: ``"low_confidence"``, ``"random"`` or ``"left_to_right"`` (a threshold needs
            ``"low_confidence"``).
        cfg_scale: classifier-free guidance scale ``s``; ``0`` disables it. Guided logits are
            ``un + (s + 1)(cond - un)``, the unconditional pass seeing the real prompt tokens masked.
        canvas: optional ``(B, L)`` long starting canvas (infilling); default all masks.
        eos_token_id: EOS id, used by ``fill_after_eos`` and ``stop_at_eos``.
        fill_after_eos: fill everything after each row's first EOS with EOS.
        generator: the only source of randomness (Gumbel noise, random confidences).
        rows: ``(start, stop)``: decode only rows ``[start, stop)`` of the batch (one process's share of a
            data-parallel batch; the model runs on those rows only). Every row's random numbers and the
            generator's state afterwards are those of decoding the whole batch, so the rows come out as in a
            whole-batch call (up to the model's floating-point batch effects); without a threshold the steps
            taken are too (a step runs when any row of the whole batch reveals a token), with one the call
            runs the steps its own rows need. ``None``: every row. Never empty: the noise needs the vocabulary
            size from the model's logits.
        threshold: confidence threshold ``τ`` in ``(0, 1]`` of threshold decoding; ``None``: off.
        threshold_factor: ``f > 0`` of the factor rule (Fast-dLLM's ``factor``); ``None``: off. Not with
            ``threshold``.
        cache: ``"none"`` (every pass over the whole sequence), ``"prefix"`` or ``"dual"`` (block caching).
        stop_at_eos: stop a row at the block holding its first EOS (see above); needs ``eos_token_id``.
    Returns:
        :class:`SampleOutput` with ``canvas`` ``(B, L)`` long (``rows``: ``(stop - start, L)``), ``nfe``,
        ``reveal_step`` and ``token_logprobs`` (same shape as ``canvas``), ``row_nfe`` and ``decoded_length``
        ``(B,)`` (``rows``: ``(stop - start,)``).
    Raises:
        ValueError: if ``gen_length % block_length != 0``, ``steps % num_blocks != 0`` or fewer than
            one step per block (without a threshold), an unknown ``remasking``, mismatched ``prompt_mask`` / ``canvas``
            shapes, negative ``temperature``, ``fill_after_eos`` or ``stop_at_eos`` without ``eos_token_id``, a
            policy without ``mask_token_id``, ``threshold`` outside ``(0, 1]``, ``threshold_factor <= 0``, both
            given, either with a ``remasking`` other than ``low_confidence``, an unknown ``cache``, a cache with
            ``cfg_scale > 0``, or a cache for a family that has none (the message names the family and why).
    Reference: LLaDA arXiv 2502.09992, Algorithm (low-confidence remasking) and ``generate``; Fast-dLLM arXiv
    2505.22618, NVlabs/Fast-dLLM ``llada/generate.py`` (``generate`` with ``threshold`` / ``factor``,
    ``generate_with_prefix_cache``, ``generate_with_dual_cache``).
    """
    if stop_at_eos and eos_token_id is None:
        raise ValueError("stop_at_eos=True needs eos_token_id")
    stop_eos = eos_token_id if stop_at_eos else None
    sample_blocks = getattr(policy, "sample_blocks", None)
    if sample_blocks is not None:
        if cfg_scale != 0 or cache != "none":
            raise ValueError("a block-diffusion policy decodes with its exact cache and no classifier-free guidance: "
                             f"cfg_scale must be 0 and cache 'none' (got {cfg_scale}, {cache!r})")
        stop = {"eos_token_id": stop_eos, "stop_at_eos": True} if stop_at_eos else {}  # (else: the call as before)
        out = sample_blocks(prompt_ids, prompt_mask, gen_length=gen_length, steps=steps, temperature=temperature,
                            remasking=remasking, threshold=threshold, threshold_factor=threshold_factor, canvas=canvas,
                            generator=generator, rows=rows, **stop)
        if fill_after_eos:
            if eos_token_id is None:
                raise ValueError("fill_after_eos needs eos_token_id")
            out.canvas = fill_after_first(out.canvas, eos_token_id)
        return out
    num_blocks, block_steps = _validate(
        prompt_ids,
        prompt_mask,
        canvas,
        gen_length,
        block_length,
        steps,
        remasking,
        eos_token_id,
        fill_after_eos,
        threshold,
        threshold_factor,
        cache,
        cfg_scale,
    )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if getattr(policy, "mask_token_id", None) is None:
        raise ValueError("policy must have a mask_token_id attribute")
    mask_id = int(policy.mask_token_id)
    prompt_mask = prompt_mask.bool()
    total = prompt_ids.shape[0]
    start, stop = (0, total) if rows is None else rows
    if rows is not None and not 0 <= start < stop <= total:
        raise ValueError(f"rows ({start}, {stop}) must satisfy 0 <= start < stop <= batch size {total}")
    if canvas is None:
        x_all = torch.full((total, gen_length), mask_id, dtype=torch.long, device=prompt_ids.device)  # (B, L)
    else:
        x_all = canvas.to(device=prompt_ids.device, dtype=torch.long).clone()  # (B, L)
    # the rows decoded here (all of them unless `rows`); the others' masks still decide which steps run
    x, prompt_ids, prompt_mask = x_all[start:stop], prompt_ids[start:stop], prompt_mask[start:stop]
    reveal_step = torch.full(x.shape, NOT_SAMPLED, dtype=torch.long, device=x.device)  # (B, L)
    token_logprobs = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # (B, L)
    noise_rows = None if rows is None else (start, total)
    score_temperature = temperature if temperature > 0 else 1.0  # (greedy rows are scored at T = 1)
    passes = 2 if cfg_scale > 0 else 1
    forward = _BlockForward(policy, prompt_ids, prompt_mask, mask_id, cfg_scale, cache)
    ends = EosStop(stop_eos, x.shape[0], gen_length, x.device)

    if threshold is None and threshold_factor is None:
        nfe, vocab, running = 0, None, True
        draws = temperature > 0 or remasking == "random"  # (steps that draw numbers even without a pass)
        for block in range(num_blocks):
            lo, hi = block * block_length, (block + 1) * block_length
            if running:
                forward.start_block(lo, hi)
            elif not draws:  # (every row has ended and nothing is left to draw)
                break
            # (a block's positions are revealed only in its own steps, so x_all's undecoded rows count right)
            schedule = num_transfer_tokens(x_all[:, lo:hi] == mask_id, block_steps)  # (B_all, steps)
            for step in range(block_steps):
                if not bool((schedule[:, step] > 0).any()):
                    continue
                if not running:  # (the step's numbers, as the full decode draws them, without its pass)
                    skip_step_draws(x.shape[0], hi - lo, vocab, temperature, remasking, generator, x.device,
                                    noise_rows)
                    continue
                k = schedule[start:stop, step]  # (B,)
                logits = forward(x)  # (B, Lb, V)
                vocab = logits.shape[-1]
                nfe += passes
                # (the mask is never drawn; the confidence keeps the full softmax)
                x0 = drawn_tokens(logits, mask_id, temperature,
                                  lambda c: add_gumbel_noise(c, temperature, generator, noise_rows))  # (B, Lb)
                if remasking == "low_confidence":
                    conf = _confidence(logits, x0)  # (B, Lb)
                elif remasking == "random":
                    conf = _uniform(x0.shape, generator, x0.device, noise_rows)
                else:  # left_to_right: the leftmost masked positions first
                    conf = -torch.arange(hi - lo, device=x0.device, dtype=torch.float64).expand(x0.shape)
                masked = x[:, lo:hi] == mask_id  # (B, Lb)
                conf = conf.masked_fill(~masked, float("-inf"))
                order = conf.argsort(dim=1, descending=True, stable=True)  # (B, Lb)
                rank = torch.empty_like(order).scatter_(
                    1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
                )  # (B, Lb): rank of each position by confidence
                reveal = (rank < k[:, None]) & masked  # (B, Lb)
                x[:, lo:hi] = torch.where(reveal, x0, x[:, lo:hi])
                reveal_step[:, lo:hi] = torch.where(reveal, block * block_steps + step, reveal_step[:, lo:hi])
                token_logprobs[:, lo:hi] += _revealed_logprobs(logits, x0, reveal, mask_id, score_temperature)
            if running and ends.finish_block(x, hi):
                # (passes stop; without the vocabulary size from a pass the draws cannot be replayed, so a call
                # whose rows all ended before any pass, e.g. on a given EOS, keeps decoding: its rows are filled)
                running = vocab is None
        row_nfe = torch.full((x.shape[0],), nfe, dtype=torch.long, device=x.device)
    else:
        nfe, row_nfe = _decode_threshold(
            forward, x, reveal_step, token_logprobs, mask_id, num_blocks, block_length,
            temperature, score_temperature, passes, generator, noise_rows, threshold, threshold_factor, ends)

    ends.fill(x, reveal_step, token_logprobs)
    if fill_after_eos:
        x = fill_after_first(x, eos_token_id)
    return SampleOutput(canvas=x, nfe=nfe, reveal_step=reveal_step, token_logprobs=token_logprobs, row_nfe=row_nfe,
                        decoded_length=ends.decoded_length)


def _decode_threshold(forward: _BlockForward, x, reveal_step, token_logprobs, mask_id: int,
                      num_blocks: int, block_length: int, temperature: float, score_temperature: float,
                      passes: int, generator: torch.Generator | None,
                      noise_rows: tuple[int, int] | None, threshold: float | None,
                      factor: float | None, ends: EosStop) -> tuple[int, torch.Tensor]:
    """The block loop of threshold decoding (see :func:`generate`): fills ``x``, ``reveal_step`` and
    ``token_logprobs`` in place; returns ``(nfe, row_nfe (B,))``. Rows that have ended (``ends``) leave the model
    batch; once all have, the loop stops (its noise comes from per-step generators: nothing to replay)."""
    seed = None
    noise_device = generator.device if generator is not None else x.device
    if temperature > 0:  # one draw: every step's generator is seeded from it
        where = generator.device if generator is not None else torch.device("cpu")
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator, device=where))
    nfe = 0
    row_nfe = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    for block in range(num_blocks):
        lo, hi = block * block_length, (block + 1) * block_length
        forward.start_block(lo, hi)
        for step in range(block_length):  # (each step reveals >= 1 token of every row still decoding)
            masked = x[:, lo:hi] == mask_id  # (B, Lb)
            active = masked.any(dim=1) & ~ends.ended  # (B,) rows whose block is not decoded yet, not ended
            if not bool(active.any()):
                break
            idx = None if bool(active.all()) else active.nonzero().squeeze(1)  # (n,) the rows still decoding

            def pick(t: torch.Tensor, idx=idx) -> torch.Tensor:
                return t if idx is None else t[idx]

            logits = forward(x, idx)  # (n, Lb, V)
            nfe += passes
            row_nfe += passes * active.long()
            def noise(choice, block=block, step=step, pick=pick):
                g = _step_generator(seed, block * block_length + step, noise_device)
                u = _uniform((x.shape[0], *choice.shape[1:]), g, choice.device, noise_rows)  # (B, Lb, V)
                return _gumbel(choice, temperature, pick(u))

            x0 = drawn_tokens(logits, mask_id, temperature, noise)  # (n, Lb)
            m = pick(masked)
            reveal = threshold_reveal(_confidence(logits, x0, reveal_cuts(threshold, factor, hi - lo)), m, threshold,
                                    factor)  # (n, Lb)
            new_x = torch.where(reveal, x0, pick(x[:, lo:hi]))
            new_step = torch.where(reveal, block * block_length + step, pick(reveal_step[:, lo:hi]))
            new_lp = pick(token_logprobs[:, lo:hi]) + _revealed_logprobs(logits, x0, reveal, mask_id,
                                                                        score_temperature)
            if idx is None:
                x[:, lo:hi], reveal_step[:, lo:hi], token_logprobs[:, lo:hi] = new_x, new_step, new_lp
            else:
                x[idx, lo:hi], reveal_step[idx, lo:hi], token_logprobs[idx, lo:hi] = new_x, new_step, new_lp
        if ends.finish_block(x, hi):
            break
    return nfe, row_nfe


__all__ = [
    "NOT_SAMPLED",
    "REMASKING",
    "EosStop",
    "SampleOutput",
    "add_gumbel_noise",
    "fill_after_first",
    "generate",
    "left_to_right_reveal_steps",
    "num_transfer_tokens",
    "sampler_log_softmax",
    "skip_step_draws",
    "threshold_reveal",
]
