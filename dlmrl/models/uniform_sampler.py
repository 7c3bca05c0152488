"""dlmrl's sampler for DiffusionGemma: ``DiffusionGemmaGenerationMixin.generate`` re-implemented step for step
(transformers 5.25, ``transformers/models/diffusion_gemma/generation_diffusion_gemma.py``), token-identical to it
for the same seed, recording what RL needs.

The loop (``generate``'s numbering):

1. For each canvas (at most ``ceil(max_new_tokens / canvas_length)``):

   a. the encoder pass over the tokens not yet cached (the prompt, then the last canvas) extends the KV cache
      (:func:`dlmrl.models.diffusion_gemma.encode`);
   b. the canvas starts as ``L`` uniform random tokens (``EntropyBoundSampler.initialize_canvas``), with no
      self-conditioning input;
   c. for ``n = N, N-1, ..., 1`` (``N = max_denoising_steps``; ``n`` counts the steps *remaining*):

      i.   the canvas pass (:func:`dlmrl.models.diffusion_gemma.canvas_logits`) gives logits ``ℓ`` ``(B, L, V)``;
      ii.  temperature ``τ_n = t_min + (t_max - t_min)·n/N`` (``LinearTemperatureScheduleLogitsProcessor``:
           ``t_max`` at the first step, falling linearly to ``t_min + (t_max - t_min)/N`` at the last), ``ℓ_τ = ℓ/τ_n``;
           a token ``x̃_i ~ softmax(ℓ_τ,i)`` is drawn at every position (``torch.multinomial``) and the argmax
           canvas is taken;
      iii. acceptance (``EntropyBoundSampler.accept_canvas``, the entropy-bounded sampler of arXiv 2505.24857):
           with ``H_i`` the entropy of ``softmax(ℓ_τ,i)``, sort the positions by ``H`` ascending and accept the
           longest prefix ``A`` with ``Σ_{i∈A} H_i − max_{i∈A} H_i ≤ γ`` (``entropy_bound``; the lowest-entropy
           position is always accepted); ``z_i = x̃_i`` on ``A``, and every other position is renoised with a
           fresh uniform token (``EntropyBoundSampler.renoise_canvas``);
      iv.  early stopping (``StableAndConfidentStoppingCriteria``): a row stops when its argmax canvas equals each
           of the previous ``stability_threshold`` steps' and the mean entropy of its ``softmax(ℓ_τ)`` is below
           ``confidence_threshold``; a stopped row's canvas, argmax and self-conditioning input are frozen while the
           batch goes on, and the loop ends when every row has stopped;
      v.   ``ℓ_τ`` (cast to the embeddings' dtype) is the next step's self-conditioning input.

   d. the **argmax** canvas of each row's last step is appended (not a draw);
   e. a row whose new canvas holds EOS is finished: the tokens after its first EOS become pad, and every later
      canvas of it is all pad; the loop ends when every row is finished.

**Randomness.** ``generate`` draws from torch's *global* RNG of the input's device, in this order per canvas: one
``randint`` ``(B, L)`` for the initial canvas, then per step one ``multinomial`` over ``(B·L, V)`` and one
``randint`` ``(B, L)`` for the renoising; every draw is batch-wide, for stopped and finished rows too. This sampler
makes the same calls in the same order with the same shapes, so ``torch.manual_seed(s); generate(...)`` and
``torch.manual_seed(s); sample_diffusion_gemma(...)`` give the same tokens. Passing ``seed=s`` instead draws from a
private ``torch.Generator`` on the input's device seeded with ``s`` (its stream is the global one's after
``torch.manual_seed(s)``; the global RNG is then left untouched), and ``generator=g`` draws from ``g``. Tested on CPU;
on CUDA the same holds if a fresh generator seeded with ``s`` starts where ``torch.manual_seed(s)`` leaves the
device's default one (Philox at offset 0), which this project has not run on a GPU.

**Stopped rows.** ``generate`` freezes a stopped row's canvas and self-conditioning input while the batch goes on;
rows never interact (attention, routing and draws are per row), so that freezing cannot change any row's tokens,
but the records show it (a stopped row's later steps have ``active`` False and an unchanged input canvas). Those
steps are not part of the row's trajectory.

**What is recorded** (:class:`CanvasRecord`, per canvas and per executed step, all ``(steps, B, L)`` or smaller):
the canvas fed to the decoder, the drawn tokens at every position, the accepted mask, the log-prob of each drawn
token under the temperature-scaled distribution it was drawn from (``log softmax(ℓ_τ)[x̃]``, float32), the
entropies the acceptance sorted, the step's temperature and ``n``, which rows were still denoising; then the
appended canvas with its log-probs. No logits are kept: a step's ``(B, L, V)`` float32 logits are 256 MiB per row
at DiffusionGemma's ``L = 256``, ``V = 262,144``, so storing them per step is infeasible; the log-probs of the
drawn tokens and the canvases are what a trajectory likelihood needs (the self-conditioning input of a replayed
step is recomputed from the replayed previous step, or approximated; that is the scorer's decision).

**``draw_last_step``** (dlmrl's RL sampling mode, not in ``generate``): the appended canvas is each row's last
step's *draw* ``x̃`` at every position, accepted or not, instead of its argmax, so that the output is a sample with
a log-prob (:attr:`CanvasRecord.final_logprobs`). Everything up to that choice (the random draws included) is as
in ``generate``; the next canvases then condition on the drawn canvas.

Not covered (raise or are ignored as said): ``cache_implementation`` other than the default dynamic cache (the
static caches make ``generate`` compile its loop; the draws are the same, but dlmrl does not compile), custom
``logits_processor`` / ``stopping_criteria`` lists, a passed ``cache``, ``decoder_input_ids``, images, streamers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields

import torch
from torch import nn

from dlmrl.models.diffusion_gemma import (
    canvas_attention_masks,
    canvas_logits,
    encode,
    new_cache,
    num_canvases,
    position_ids,
    unwrap_diffusion_gemma,
)

#: The settings :func:`resolve_settings` takes by name (``DiffusionGemmaGenerationConfig``'s attributes that this
#: sampler implements, and ``entropy_bound`` for ``sampler_config=EntropyBoundSamplerConfig(entropy_bound)``).
SETTING_KEYS = ("max_new_tokens", "max_length", "max_denoising_steps", "sampler_config", "entropy_bound", "t_min",
                "t_max", "stability_threshold", "confidence_threshold", "eos_token_id", "pad_token_id",
                "bos_token_id", "cache_implementation")


@dataclass(frozen=True)
class UniformSamplerSettings:
    """The resolved generation settings of one call (what ``generate`` reads from its generation config).

    Attributes:
        max_new_tokens: the token budget; ``ceil(max_new_tokens / canvas_length)`` canvases at most.
        max_length: the generation config's ``max_length`` (None unless set): ``generate`` stops every row once the
            sequence reaches it (``MaxLengthCriteria``).
        max_denoising_steps: ``N``, the steps per canvas (fewer when every row stops early).
        entropy_bound: ``γ`` of the acceptance rule.
        t_min, t_max: the temperature schedule's ends.
        stability_threshold, confidence_threshold: early stopping; None for either turns it off.
        eos_token_id, pad_token_id: as in the generation config (either may be None: no EOS stop / no padding).
        canvas_length: ``L``, from ``model.config.canvas_length``.
        vocab_size: ``V``, from the text config (the uniform draws' range).
    """

    max_new_tokens: int
    max_length: int | None
    max_denoising_steps: int
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int | None
    confidence_threshold: float | None
    eos_token_id: int | list[int] | None
    pad_token_id: int | None
    canvas_length: int
    vocab_size: int

    @property
    def early_stopping(self) -> bool:
        """Whether ``StableAndConfidentStoppingCriteria`` runs (both thresholds set)."""
        return self.stability_threshold is not None and self.confidence_threshold is not None

    def temperature(self, remaining: int) -> float:
        """``τ_n = t_min + (t_max - t_min)·n/N`` at ``n = remaining`` steps left, in float32 as ``generate``
        computes it (a 0-dim float32 tensor)."""
        return float(_temperature_tensor(self, torch.tensor(remaining, dtype=torch.int32)))


def resolve_settings(model: nn.Module, prompt_length: int, generation_config=None,
                     **overrides) -> UniformSamplerSettings:
    """The settings ``generate`` would run with, resolved as it resolves them.

    Mirrors ``DiffusionGemmaGenerationMixin._prepare_generation_config`` (priority: ``overrides`` > the given
    ``generation_config`` > ``model.generation_config`` > transformers' global defaults
    ``DiffusionGemmaGenerationConfig._get_default_generation_params()``: 256 new tokens, 48 steps, γ = 0.1,
    t 0.8 → 0.4, stability 1, confidence 0.005) and ``_prepare_generated_length`` (``max_length`` counts only
    while ``max_new_tokens`` is the default 256). As in ``generate``, an override of None *unsets* a value (so
    ``stability_threshold=None`` turns early stopping off), while None in a generation config falls back to the
    defaults.

    Args:
        prompt_length: the prompt's length ``P`` (with its left padding).
        generation_config: a ``DiffusionGemmaGenerationConfig`` or None.
        overrides: any of :data:`SETTING_KEYS`; ``entropy_bound=γ`` stands for
            ``sampler_config=EntropyBoundSamplerConfig(γ)``.
    Raises:
        ValueError: an unknown setting (named), both ``entropy_bound`` and ``sampler_config``, a
            ``stability_threshold`` that is not an int ≥ 0 or a ``confidence_threshold`` that is not a float > 0,
            a value ``DiffusionGemmaGenerationConfig.validate`` refuses (its message), a ``cache_implementation`` other
            than None / ``"dynamic"``, or no ``t_min``/``t_max``/``sampler_config`` after resolution.
    """
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    inner = unwrap_diffusion_gemma(model)
    unknown = sorted(set(overrides) - set(SETTING_KEYS))
    if unknown:
        raise ValueError(f"sample_diffusion_gemma: unknown setting(s) {unknown}; known: {list(SETTING_KEYS)}")
    overrides = dict(overrides)
    # DiffusionGemmaGenerationConfig.validate formats these two errors with an attribute the config lacks
    # (self.entropy_bound), so a bad value raises AttributeError there: check them here first, by name
    stability = overrides.get("stability_threshold")
    if stability is not None and (not isinstance(stability, int) or isinstance(stability, bool) or stability < 0):
        raise ValueError(f"stability_threshold: {stability!r} must be an integer >= 0 (or None: no early stopping)")
    confidence = overrides.get("confidence_threshold")
    if confidence is not None and (not isinstance(confidence, float) or confidence <= 0):
        raise ValueError(f"confidence_threshold: {confidence!r} must be a float > 0 (or None: no early stopping)")
    if "entropy_bound" in overrides:
        if "sampler_config" in overrides:
            raise ValueError("sample_diffusion_gemma: give entropy_bound or sampler_config, not both")
        overrides["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(overrides.pop("entropy_bound")))
    model_config = getattr(inner, "generation_config", None)
    config = copy.deepcopy(generation_config or model_config or DiffusionGemmaGenerationConfig())
    if model_config is not None:
        config.update(**model_config.to_dict(), defaults_only=True, allow_custom_entries=True)
    config.update(**DiffusionGemmaGenerationConfig._get_default_generation_params(), defaults_only=True)
    config.update(**overrides)
    config.validate()
    if config.cache_implementation not in (None, "dynamic"):
        raise ValueError(f"cache_implementation: {config.cache_implementation!r} is not supported by dlmrl's "
                         "sampler (it runs transformers' default DynamicCache, uncompiled); use None or 'dynamic'")
    for key in ("t_min", "t_max", "sampler_config", "max_denoising_steps"):
        if getattr(config, key) is None:
            raise ValueError(f"{key}: None after resolution; the sampler needs it")
    if config.max_length and config.max_new_tokens == 256:  # _prepare_generated_length
        max_new_tokens = config.max_length - prompt_length
    else:
        max_new_tokens = config.max_new_tokens
    if max_new_tokens is None or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens: {max_new_tokens} (from max_length {config.max_length} and a prompt of "
                         f"{prompt_length}) must be a positive integer")
    return UniformSamplerSettings(
        max_new_tokens=int(max_new_tokens), max_length=config.max_length,
        max_denoising_steps=int(config.max_denoising_steps),
        entropy_bound=float(config.sampler_config.entropy_bound), t_min=config.t_min, t_max=config.t_max,
        stability_threshold=config.stability_threshold, confidence_threshold=config.confidence_threshold,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
        canvas_length=int(inner.config.canvas_length), vocab_size=int(inner.config.text_config.vocab_size))


@dataclass
class CanvasRecord:
    """One canvas's denoising, as run (``S`` = the steps executed for the batch, ``≤ max_denoising_steps``; a row that
    stopped early has ``active`` False from the step after its stop on).

    Attributes:
        start: the canvas's first position in ``sequences`` (prompt length + earlier canvases).
        remaining: ``(S,)`` int64: ``n`` of each step (``N, N-1, ...``: the steps remaining, as ``generate`` counts).
        temperatures: ``(S,)`` float32: ``τ_n``, the divisor of the step's logits.
        input_canvases: ``(S, B, L)`` int64: the canvas ``z`` fed to the decoder at the step (step 0's is the
            uniform initial canvas).
        drawn: ``(S, B, L)`` int64: ``x̃``, the token drawn at every position (``torch.multinomial``).
        accepted: ``(S, B, L)`` bool: the entropy-bound acceptance (computed for every row; use with ``active``).
        logprobs: ``(S, B, L)`` float32: ``log softmax(ℓ/τ_n)[x̃]`` at every position, the log-prob of the draw under
            the distribution it was drawn from (the accepted ones are ``logprobs[accepted]``).
        entropies: ``(S, B, L)`` float32: ``H`` of ``softmax(ℓ/τ_n)`` per position, the quantity the acceptance sorts.
        active: ``(S, B)`` bool: the row was still denoising at the step (not stopped early, not a sequence finished
            at an earlier canvas): only these steps shape the row's output.
        stopped: ``(S, B)`` bool: early stopping had fired for the row by the end of the step.
        final_canvas: ``(B, L)`` int64: the appended canvas, before EOS padding (argmax of the row's last active
            step's ``ℓ/τ``, or its draw under ``draw_last_step``).
        final_logprobs: ``(B, L)`` float32: ``log softmax(ℓ/τ)[final_canvas]`` under that last step's distribution
            (for the argmax canvas: its log-prob, though it was not drawn).
        final_is_draw: whether ``final_canvas`` is a draw (``draw_last_step``).
        finished_before: ``(B,)`` bool: the row's sequence had finished at an earlier canvas (this canvas is pad).
    """

    start: int
    remaining: torch.Tensor
    temperatures: torch.Tensor
    input_canvases: torch.Tensor
    drawn: torch.Tensor
    accepted: torch.Tensor
    logprobs: torch.Tensor
    entropies: torch.Tensor
    active: torch.Tensor
    stopped: torch.Tensor
    final_canvas: torch.Tensor
    final_logprobs: torch.Tensor
    final_is_draw: bool
    finished_before: torch.Tensor

    @property
    def num_steps(self) -> int:
        return int(self.remaining.shape[0])

    def steps_per_row(self) -> torch.Tensor:
        """``(B,)`` int64: the denoising steps each row ran (0 for a row finished at an earlier canvas)."""
        return self.active.sum(dim=0)

    def accepted_logprob_sum(self) -> torch.Tensor:
        """``(B,)`` float32: ``Σ_steps Σ_{i accepted} logprobs`` over the row's active steps."""
        mask = self.accepted & self.active[:, :, None]
        return torch.where(mask, self.logprobs, torch.zeros_like(self.logprobs)).sum(dim=(0, 2))


@dataclass
class UniformSampleOutput:
    """What :func:`sample_diffusion_gemma` returns.

    Attributes:
        sequences: ``(B, P + C·L)`` int64: prompt then ``C`` whole canvases, pad after each row's first EOS (equal to
            ``generate(...).sequences`` when ``draw_last_step`` is False).
        prompt_length: ``P``.
        canvases: the ``C`` :class:`CanvasRecord`, in order.
        decoder_forward_passes: ``(B,)`` int32: canvas passes counted per row as ``generate`` counts them (the
            batched steps during which the row was neither stopped nor finished).
        tokens_per_forward: ``(B,)`` float32: non-pad new tokens / ``decoder_forward_passes`` (``generate``'s
            ``tokens_per_forward``).
        decoder_calls: batched canvas passes run; ``encoder_calls``: batched encoder passes run.
        settings: the resolved :class:`UniformSamplerSettings`.
        draw_last_step: the mode the canvases were appended in.
    """

    sequences: torch.Tensor
    prompt_length: int
    canvases: list[CanvasRecord]
    decoder_forward_passes: torch.Tensor
    tokens_per_forward: torch.Tensor
    decoder_calls: int
    encoder_calls: int
    settings: UniformSamplerSettings
    draw_last_step: bool

    @property
    def completions(self) -> torch.Tensor:
        """``(B, C·L)``: ``sequences`` without the prompt."""
        return self.sequences[:, self.prompt_length:]

    def accepted_logprob_sum(self) -> torch.Tensor:
        """``(B,)`` float32: :meth:`CanvasRecord.accepted_logprob_sum` summed over the canvases."""
        return torch.stack([c.accepted_logprob_sum() for c in self.canvases]).sum(dim=0)

    def record_bytes(self) -> int:
        """The bytes the records' tensors hold (to check that they stay small)."""
        total = 0
        for c in self.canvases:
            for f in fields(c):
                value = getattr(c, f.name)
                if isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
        return total


def _temperature_tensor(settings: UniformSamplerSettings, remaining: torch.Tensor) -> torch.Tensor:
    # LinearTemperatureScheduleLogitsProcessor.__call__ with generate's int32 tensor step: the division makes a
    # float32 0-dim tensor, so τ is rounded to float32 exactly as generate's.
    return settings.t_min + ((settings.t_max - settings.t_min) * (remaining / settings.max_denoising_steps))


class _StableAndConfident:
    """``StableAndConfidentStoppingCriteria`` (``generation_diffusion_gemma.py``), stateful per canvas."""

    def __init__(self, stability_threshold: int, confidence_threshold: float):
        self.stability_threshold = stability_threshold
        self.confidence_threshold = confidence_threshold
        self.history = None

    def __call__(self, argmax_canvas: torch.Tensor, token_entropy: torch.Tensor) -> torch.Tensor:
        if self.stability_threshold == 0:
            stable = torch.ones((token_entropy.shape[0],), device=token_entropy.device, dtype=torch.bool)
        else:
            if self.history is None:
                self.history = torch.full((self.stability_threshold, *argmax_canvas.shape), -1,
                                          dtype=argmax_canvas.dtype, device=argmax_canvas.device)
            stable = (self.history == argmax_canvas[None, :, :]).all(dim=-1).all(dim=0)
            self.history = torch.roll(self.history, shifts=-1, dims=0)
            self.history[-1] = argmax_canvas
        confident = torch.mean(token_entropy, dim=-1) < self.confidence_threshold
        return stable & confident


def entropy_bound_accept(entropy: torch.Tensor, entropy_bound: float) -> torch.Tensor:
    """The entropy-bounded acceptance (arXiv 2505.24857; ``EntropyBoundSampler.accept_canvas``): per row, sort the
    positions by entropy ascending and accept the longest prefix whose ``cumsum(H) − H`` (the prefix's sum minus
    its maximum, the sorted order's last) is ``≤ entropy_bound``.

    Args:
        entropy: ``(B, L)`` float32 per-position entropies.
    Returns:
        ``(B, L)`` bool accepted mask (at least the lowest-entropy position of every row).
    """
    sorted_entropy, order = torch.sort(entropy, dim=-1, descending=False)
    cumulative = torch.cumsum(sorted_entropy, dim=-1)
    selected = cumulative - sorted_entropy <= entropy_bound
    return torch.scatter(input=torch.zeros_like(selected), dim=-1, index=order, src=selected)


def _randint(vocab_size: int, shape: tuple[int, int], device, generator) -> torch.Tensor:
    # EntropyBoundSampler.initialize_canvas (also the renoising draw)
    return torch.randint(low=0, high=vocab_size, size=shape, device=device, generator=generator)


@torch.no_grad()
def sample_diffusion_gemma(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                           generation_config=None, *, generator: torch.Generator | None = None,
                           seed: int | None = None, draw_last_step: bool = False,
                           **settings) -> UniformSampleOutput:
    """Sample completions from a DiffusionGemma model as ``model.generate`` does, recording each step (see the
    module docstring for the loop, the random draws' order and the record).

    Under ``torch.no_grad()``; the model's train/eval mode is left as is (as ``generate`` leaves it).

    Args:
        model: a ``DiffusionGemmaForBlockDiffusion`` (or a PEFT wrapper of one).
        input_ids: ``(B, P)`` int64 prompts, left-padded.
        attention_mask: ``(B, P)`` 0/1 or bool, False on the left padding; None means all ones.
        generation_config: a ``DiffusionGemmaGenerationConfig`` (default: ``model.generation_config``).
        generator: draw from this ``torch.Generator`` (on ``input_ids``' device) instead of the global RNG.
        seed: draw from a fresh generator seeded with ``seed`` (the global RNG's stream after
            ``torch.manual_seed(seed)``, without touching the global RNG).
        draw_last_step: append each row's last step's draw instead of its argmax (dlmrl's RL sampling mode).
        settings: generation settings by name (:data:`SETTING_KEYS`), as ``generate``'s keyword arguments.
    Returns:
        :class:`UniformSampleOutput`.
    Raises:
        ValueError: both ``seed`` and ``generator``; ``input_ids`` not 2D; an ``attention_mask`` of another shape;
            a bad setting (:func:`resolve_settings`).
        TypeError: ``model`` is not a DiffusionGemma model.
    """
    inner = unwrap_diffusion_gemma(model)
    if seed is not None and generator is not None:
        raise ValueError("sample_diffusion_gemma: give seed or generator, not both")
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids: expected (batch, prompt_length), got shape {tuple(input_ids.shape)}")
    device = input_ids.device
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(int(seed))
    batch_size, cur_len = input_ids.shape
    prompt_length = cur_len
    s = resolve_settings(inner, prompt_length, generation_config, **settings)
    length, vocab = s.canvas_length, s.vocab_size

    if attention_mask is None:
        attention_mask = torch.ones((batch_size, cur_len), dtype=torch.bool, device=device)
    else:
        if tuple(attention_mask.shape) != (batch_size, cur_len):
            raise ValueError(f"attention_mask: expected shape {(batch_size, cur_len)} (2D, as input_ids), got "
                             f"{tuple(attention_mask.shape)}")
        attention_mask = attention_mask.bool()
    decoder_attention_mask = torch.nn.functional.pad(attention_mask, (0, length), value=True)
    eos_tensor = torch.tensor(s.eos_token_id, device=device) if s.eos_token_id is not None else None
    embed_dtype = inner.model.decoder.embed_tokens.weight.dtype

    cache = new_cache(inner)
    finished_sequences = torch.zeros(batch_size, dtype=torch.bool, device=device)
    decoder_forward_passes = torch.zeros(batch_size, dtype=torch.int, device=device)
    encoder_positions = position_ids(cur_len - input_ids.shape[1], input_ids.shape[1], device)
    decoder_positions = position_ids(cur_len, length, device)
    stopper = (_StableAndConfident(s.stability_threshold, s.confidence_threshold) if s.early_stopping else None)

    sequences = input_ids
    records: list[CanvasRecord] = []
    decoder_calls = encoder_calls = 0
    is_prefill = True
    for _ in range(num_canvases(s.max_new_tokens, length)):
        # 1.a the encoder pass over what is not cached yet
        new_ids = sequences if is_prefill else sequences[:, -length:]
        cache = encode(inner, new_ids, attention_mask, cache, encoder_positions).cache
        encoder_calls += 1
        is_prefill = False

        # 1.b a uniform canvas, no self-conditioning (the draw happens before the masks, as in generate)
        current = _randint(vocab, (batch_size, length), device, generator)
        masks = canvas_attention_masks(inner, current, cache, decoder_attention_mask)
        finished_denoising = torch.zeros(batch_size, dtype=torch.bool, device=device)
        if stopper is not None:
            stopper.history = None
        sc_logits = None
        argmax_canvas = current
        last_draw = torch.zeros_like(current)
        last_draw_logp = torch.zeros((batch_size, length), dtype=torch.float32, device=device)
        last_argmax_logp = torch.zeros_like(last_draw_logp)
        finished_before = finished_sequences.clone()
        rec = {k: [] for k in ("remaining", "temperatures", "input_canvases", "drawn", "accepted", "logprobs",
                               "entropies", "active", "stopped")}

        # 1.c the denoising steps, n = N .. 1
        for remaining in reversed(range(1, s.max_denoising_steps + 1)):
            active = ~(finished_denoising | finished_sequences)
            decoder_forward_passes += active
            denoising = ~finished_denoising  # rows whose state this step updates (finished sequences included)
            step = torch.tensor(remaining, device=device, dtype=torch.int32)

            # 1.c.i the canvas pass
            raw = canvas_logits(inner, current, cache, masks, decoder_positions, sc_logits)
            decoder_calls += 1
            # 1.c.ii temperature, the draw at every position, the argmax
            temperature = _temperature_tensor(s, step)
            processed = raw / temperature
            probs = torch.softmax(processed, dim=-1, dtype=torch.float32)
            drawn = torch.multinomial(probs.view(-1, vocab), num_samples=1, generator=generator)
            drawn = drawn.squeeze(-1).view(batch_size, length)
            del probs
            new_argmax = torch.argmax(processed, dim=-1)
            # 1.c.iii entropy-bound acceptance, renoising of the rest
            dist = torch.distributions.Categorical(logits=processed)
            entropy = dist.entropy()
            accepted_mask = entropy_bound_accept(entropy, s.entropy_bound)
            accepted_canvas = torch.where(accepted_mask, drawn, current)
            noise = _randint(vocab, (batch_size, length), device, generator)
            new_current = torch.where(~accepted_mask, noise, accepted_canvas)
            # log softmax(ℓ_τ) of the draws and of the argmax (Categorical's normalised logits: ℓ_τ - logsumexp ℓ_τ)
            normalized = dist.logits
            draw_logp = normalized.gather(-1, drawn.unsqueeze(-1)).squeeze(-1)
            argmax_logp = normalized.gather(-1, new_argmax.unsqueeze(-1)).squeeze(-1)
            del dist, normalized

            rec["remaining"].append(remaining)
            rec["temperatures"].append(temperature.to(torch.float32))
            rec["input_canvases"].append(current)
            rec["drawn"].append(drawn)
            rec["accepted"].append(accepted_mask)
            rec["logprobs"].append(draw_logp)
            rec["entropies"].append(entropy)
            rec["active"].append(active)

            # 1.c.iv early stopping (a stopped row keeps its canvas, argmax and self-conditioning input)
            if stopper is not None:
                stop_entropy = entropy
                if finished_denoising.any():
                    held = finished_denoising[:, None]
                    new_argmax = torch.where(held, argmax_canvas, new_argmax)
                    new_current = torch.where(held, current, new_current)
                    processed = torch.where(finished_denoising[:, None, None], sc_logits, processed)
                    stop_entropy = torch.distributions.Categorical(logits=processed).entropy()
                finished_denoising = finished_denoising | stopper(new_argmax, stop_entropy)
            rec["stopped"].append(finished_denoising.clone())

            keep = denoising[:, None]
            last_draw = torch.where(keep, drawn, last_draw)
            last_draw_logp = torch.where(keep, draw_logp, last_draw_logp)
            last_argmax_logp = torch.where(keep, argmax_logp, last_argmax_logp)
            # 1.c.v self-conditioning input of the next step
            sc_logits = processed.to(embed_dtype)
            del processed, raw
            current, argmax_canvas = new_current, new_argmax
            if torch.all(finished_denoising):
                break

        # 1.d append the argmax canvas (or, in dlmrl's RL mode, the last draw)
        final = last_draw if draw_last_step else argmax_canvas
        final_logp = last_draw_logp if draw_last_step else last_argmax_logp
        sequences = torch.cat([sequences, final], dim=-1)
        records.append(CanvasRecord(
            start=cur_len, remaining=torch.tensor(rec["remaining"], dtype=torch.long),
            temperatures=torch.stack(rec["temperatures"]), input_canvases=torch.stack(rec["input_canvases"]),
            drawn=torch.stack(rec["drawn"]), accepted=torch.stack(rec["accepted"]),
            logprobs=torch.stack(rec["logprobs"]), entropies=torch.stack(rec["entropies"]),
            active=torch.stack(rec["active"]), stopped=torch.stack(rec["stopped"]), final_canvas=final.clone(),
            final_logprobs=final_logp, final_is_draw=draw_last_step, finished_before=finished_before))

        # 1.e EOS / max_length: finished rows, pad after EOS (generate's _finalize_canvas)
        sequences, finished_sequences = _finalize_canvas(sequences, finished_sequences, s, eos_tensor)
        if torch.all(finished_sequences):
            break

        # 1.f the next canvas's masks and positions (generate's _prepare_kwargs_for_next_canvas)
        cur_len += length
        decoder_attention_mask = torch.nn.functional.pad(decoder_attention_mask, (0, length), value=True)
        attention_mask = torch.nn.functional.pad(attention_mask, (0, length), value=True)
        encoder_positions = decoder_positions
        decoder_positions = position_ids(cur_len, length, device)

    new_tokens = sequences[:, prompt_length:]
    if s.pad_token_id is not None:
        valid = (new_tokens != s.pad_token_id).sum(dim=-1)
    else:
        valid = torch.full((batch_size,), new_tokens.shape[1], device=device)
    return UniformSampleOutput(
        sequences=sequences, prompt_length=prompt_length, canvases=records,
        decoder_forward_passes=decoder_forward_passes, tokens_per_forward=valid / decoder_forward_passes,
        decoder_calls=decoder_calls, encoder_calls=encoder_calls, settings=s, draw_last_step=draw_last_step)


def _finalize_canvas(sequences: torch.Tensor, finished: torch.Tensor, s: UniformSamplerSettings,
                     eos_tensor: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``DiffusionGemmaGenerationMixin._finalize_canvas`` with ``generate``'s stopping criteria (``MaxLengthCriteria``
    when the generation config sets ``max_length``, ``EosTokenCriteria`` over the new canvas): a row is finished
    when its new canvas holds an EOS (or the length reached ``max_length``); a row finished at an earlier canvas
    gets this canvas as all pad; in every row whose new canvas holds an EOS, the tokens after the first EOS become
    pad (only when some row is finished and a pad id is set)."""
    length = s.canvas_length
    this_canvas = torch.zeros(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    if s.max_length is not None:
        this_canvas = this_canvas | (sequences.shape[1] >= s.max_length)
    if eos_tensor is not None:
        this_canvas = this_canvas | torch.isin(sequences[:, -length:], eos_tensor).any(dim=-1)
    previously = finished
    finished = previously | this_canvas
    if s.pad_token_id is not None and torch.any(finished):
        sequences[previously, -length:] = s.pad_token_id
        if eos_tensor is not None and torch.any(this_canvas):
            new_tokens = sequences[:, -length:]
            is_eos = torch.isin(new_tokens, eos_tensor)
            eos_cumsum = is_eos.cumsum(dim=-1)
            pad_mask = (eos_cumsum > 0) & ~((eos_cumsum == 1) & is_eos)
            new_tokens[pad_mask] = s.pad_token_id
    return sequences, finished
