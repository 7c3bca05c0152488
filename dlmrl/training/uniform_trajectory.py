"""Rollouts and the trajectory likelihood of a uniform-noise diffusion policy (``model.kind: uniform``, DiffusionGemma).

**The record.** :func:`rollout_uniform` samples G completions per prompt with
:func:`~dlmrl.models.uniform_sampler.sample_diffusion_gemma` and keeps, per row, canvas ``c < C`` and step
``s < N`` (``C = ceil(budget / L)`` canvases, ``N`` = the most denoising steps; unused steps padded, weight 0) the
input canvas ``z`` of the step, the draws ``x̃``, the step's temperature and the **scored terms** (:func:`record_of`),
as per-row tensors in :attr:`~dlmrl.training.rollout.Rollout.kind_record`, so that the rows of a rollout can be
selected and concatenated like its other fields.

**The trajectory likelihood** (**dlmrl interpretation** of the entropy-bounded sampler of arXiv 2505.24857, the
idea of TraceRL, arXiv 2509.06949, of scoring the sampler's own steps). One denoising step of a canvas draws
``x̃_i ~ softmax(ℓ_i/τ)`` at every position ``i``, keeps the draw where the entropy-bound rule accepts it and puts a
fresh uniform token everywhere else. Given the step's input (canvas and self-conditioning), the acceptance is a
deterministic function of the logits, the renoising does not depend on the weights, and a rejected draw leaves no
trace in the next state; so the log-probability of the sequence of canvases is, up to a constant,

    log π(trajectory) = Σ_canvases Σ_steps Σ_{i accepted} log softmax(ℓ_i/τ)[x̃_i],

over the row's active steps (not stopped early, not finished). The final canvas is the last step's argmax, a
deterministic function of the trajectory: it adds no term. With ``sampling.draw_last_step`` it is the last step's
draw at *every* position instead, so that step scores every position (an accepted position's draw is the same
draw, counted once). The per-position score is that sum at the position, over the steps; a position after a row's
first EOS (its tokens are padding in the completion, and out of ``completion_mask``) adds its terms to the EOS
position, so that the masked positions' sum is the whole trajectory's log-probability. By default
(``estimator.self_conditioning: detached``) the gradient of a term flows through the step's logits at the recorded
input canvas, not through the self-conditioning input (the previous step's logits), which is recomputed under the
current weights and detached; the self-conditioning module's own weights and the embedding that turns the input
into soft embeddings do get gradients. This is an approximation of the gradient (dlmrl's choice, so that a canvas's
steps can be scored in batched passes and cut into passes of fewer steps); ``through`` gives the exact gradient of
the same log-prob, each step's logits differentiated also through the previous steps' (sequential; tested against
forward-mode AD in ``tests/training/test_uniform_self_conditioning.py``). How far apart the two are on the shipped
tiny model is measured by ``benchmarks/uniform_gradient_direction.py`` (their cosine on one rollout batch).

**Scoring** (:func:`trajectory_logprobs`), per canvas as the sampler ran it: the encoder pass over the prompt (then
the previous canvas) extends the key/value cache; a sequential no-grad pass over the recorded input canvases
recomputes each step's self-conditioning input from the previous step's logits (exactly the sampler's
computation); with grad, one batched pass runs all the canvas's steps at once (the cache repeated along the batch,
``S`` steps × ``B`` rows) with those inputs detached. With ``through`` the sequential pass itself runs with grad
(each step reading the previous step's logits with their graph) and its log-probs are the result: no batched
pass, and the no-grad pass is not needed. The value equals the sampler's recorded log-probs at the same
weights up to floating-point batch effects; the trainer logs the gap as ``rollout_logp_gap_mean`` /
``rollout_logp_gap_max``, as for the masked-diffusion trajectory.

**Memory.** A batched pass over ``k`` steps holds ``k`` steps' self-conditioning inputs and logits, ``k·L·V``
values each: at DiffusionGemma's ``L = 256`` and ``V = 262,144``, 48 steps at once are about 3.2·10⁹ per row (6.4 GB
in bfloat16, twice that in float32). ``estimator.micro_batch`` below the steps per canvas cuts a row's steps into
passes of that many, each back-propagated and freed before the next (``detached`` only: ``through`` chains a
canvas's steps, so it holds all ``S`` steps' graphs of a row chunk, as the unchunked batched pass does; :func:`trajectory_logprobs`'s surrogate mode;
the encoder's graph is kept for the row and back-propagated once), so one step per pass (``L·V`` per pass) is the
floor.
"""

from __future__ import annotations

import math

import torch

from dlmrl.models.diffusion_gemma import (
    canvas_attention_masks,
    canvas_logits,
    detached_cache,
    encode,
    new_cache,
    position_ids,
    repeated_cache,
    self_conditioning_input,
    snapshot_cache,
    unwrap_diffusion_gemma,
)
from dlmrl.training.rollout import Rollout, _prompt_rows, consecutive_groups, mean_nfe
from dlmrl.training.scorers import OldScores

__all__ = ["UniformTrajectoryScorer", "fold_after_eos", "record_of", "rollout_uniform", "sampler_settings",
           "share_seed", "trajectory_logprobs"]

#: the per-row tensors of :attr:`Rollout.kind_record` for this kind: ``(B, C, N, L)`` long input canvases and
#: draws, ``(B, C, N, L)`` bool scored terms, ``(B, C, N)`` float32 temperatures and bool active steps
RECORD_KEYS = ("inputs", "drawn", "scored", "temperatures", "active")


def sampler_settings(sampling) -> dict:
    """The ``sampling`` section's keys as :func:`~dlmrl.models.uniform_sampler.sample_diffusion_gemma` settings:
    ``steps`` is ``max_denoising_steps``; ``entropy_bound``, ``t_min``, ``t_max``, ``stability_threshold`` and
    ``confidence_threshold`` are given only when set (null: the checkpoint's generation config)."""
    out = {"max_denoising_steps": int(sampling.steps)}
    for key in ("entropy_bound", "t_min", "t_max", "stability_threshold", "confidence_threshold"):
        value = getattr(sampling, key)
        if value is not None:
            out[key] = value
    return out


def record_of(out, canvases: int) -> tuple[dict, torch.Tensor]:
    """The per-row record of a sampler output and the recorded log-probs per completion position.

    Args:
        out: :class:`~dlmrl.models.uniform_sampler.UniformSampleOutput`.
        canvases: ``C``, the canvases the budget allows (the output may hold fewer: every row had finished).
    Returns:
        ``(record, logp)``: ``record`` the :data:`RECORD_KEYS` tensors (``N = max_denoising_steps``; steps the sampler
        did not run are inactive with no scored term); ``logp`` ``(B, C·L)`` float32, at each position the sum of
        its scored terms' recorded log-probs (not yet folded at EOS, :func:`fold_after_eos`).
    """
    s = out.settings
    B, L, N, C = out.sequences.shape[0], s.canvas_length, s.max_denoising_steps, canvases
    dev = out.sequences.device
    rec = {"inputs": torch.zeros((B, C, N, L), dtype=torch.long, device=dev),
           "drawn": torch.zeros((B, C, N, L), dtype=torch.long, device=dev),
           "scored": torch.zeros((B, C, N, L), dtype=torch.bool, device=dev),
           "temperatures": torch.ones((B, C, N), dtype=torch.float32, device=dev),
           "active": torch.zeros((B, C, N), dtype=torch.bool, device=dev)}
    logp = torch.zeros((B, C * L), dtype=torch.float32, device=dev)
    for c, r in enumerate(out.canvases):
        S = r.num_steps
        active = r.active.T  # (B, S)
        scored = r.accepted.transpose(0, 1) & active[..., None]
        if r.final_is_draw:  # (the appended canvas is the last active step's draw at every position)
            has = active.any(dim=1)
            last = (active.long() * torch.arange(1, S + 1, device=dev)).argmax(dim=1)
            scored[has.nonzero().squeeze(-1), last[has]] = True
        rec["inputs"][:, c, :S] = r.input_canvases.transpose(0, 1)
        rec["drawn"][:, c, :S] = r.drawn.transpose(0, 1)
        rec["scored"][:, c, :S] = scored
        rec["temperatures"][:, c, :S] = r.temperatures.to(torch.float32)[None, :]
        rec["active"][:, c, :S] = active
        terms = torch.where(scored, r.logprobs.transpose(0, 1).float(), torch.zeros((), device=dev))
        logp[:, c * L:(c + 1) * L] = terms.sum(dim=1)
    return rec, logp


def completion_of(out, canvases: int, eos_id: int | None, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(completion (B, C·L) long, mask (B, C·L) bool)``: the sampled canvases padded to ``C`` canvases with
    ``pad_id``; the mask covers the tokens up to and including the first EOS (all generated tokens of a row
    without one)."""
    comp = out.completions
    B, L = comp.shape[0], out.settings.canvas_length
    width = canvases * L
    if comp.shape[1] < width:
        comp = torch.cat([comp, comp.new_full((B, width - comp.shape[1]), pad_id)], dim=1)
    generated = torch.arange(width, device=comp.device) < out.completions.shape[1]
    mask = generated[None, :].expand(B, width).clone()
    if eos_id is not None:
        is_eos = comp == eos_id
        after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # (strictly after the first EOS)
        mask &= ~after
    return comp, mask


def fold_after_eos(per_position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``per_position`` ``(B, T)`` with every unmasked position's value added to the row's last masked position
    (its EOS, or its last token) and zero elsewhere off the mask, so ``(result * mask).sum(-1)`` is the row's whole
    sum (a row with no masked position keeps its values)."""
    mask = mask.bool()
    has = mask.any(dim=1)
    last = (mask.long() * torch.arange(1, mask.shape[1] + 1, device=mask.device)).argmax(dim=1)
    outside = torch.where(mask, torch.zeros_like(per_position), per_position).sum(dim=1)
    folded = torch.where(mask | ~has[:, None], per_position, torch.zeros_like(per_position))
    add = torch.zeros_like(per_position)
    add[torch.arange(len(mask), device=mask.device), last] = torch.where(has, outside, torch.zeros_like(outside))
    return folded + add


def rollout_uniform(policy, task, cfg, examples: list, generator: torch.Generator | None, max_new_tokens: int,
                    prompts: tuple[int, int] | None = None) -> Rollout:
    """G completions per prompt from :meth:`~dlmrl.models.uniform_policy.UniformNoisePolicy.sample`
    (``sampling.steps`` denoising steps at most per canvas, the other ``sampling`` keys of
    :func:`sampler_settings`, ``sampling.draw_last_step``), a budget of ``max_new_tokens`` tokens
    (``ceil(max_new_tokens / L)`` canvases).

    The batch is sampled in one call with one seed drawn from ``generator``. The sampler's draws are batch-wide (as
    ``generate``'s), so a row's tokens depend on the batch it is sampled in: ``prompts = (lo, hi)`` (one process's
    share of a multi-process run) samples only those prompts' rows, with the seed :func:`share_seed` derives from
    the drawn one and ``lo``, so each process samples ``(hi - lo)·G`` rows, not the whole batch (the memory plan's
    rows per process); the shares' draws are then not the ones a one-process run of the whole batch makes (a
    valid sample all the same; dlmrl interpretation, the masked kinds keep the whole batch's draws per row).

    Returns:
        a :class:`Rollout` with ``completion`` / ``completion_mask`` ``(B, C·L)`` (tokens up to and including EOS),
        ``token_logprobs`` the recorded trajectory log-probs per position (folded at EOS: :func:`fold_after_eos`),
        ``row_nfe`` the canvas passes each row took part in, and ``kind_record`` (:func:`record_of`).
    """
    from dlmrl.models.ar import draw_seed

    G = cfg.train.num_generations
    _prompt_rows(len(examples), G, prompts)  # (checks the share)
    lo, hi = (0, len(examples)) if prompts is None else prompts
    seed = draw_seed(generator)  # (drawn on every process: the generators stay in step)
    if (lo, hi) != (0, len(examples)):
        seed = share_seed(seed, lo)
    share = examples[lo:hi] if hi > lo else examples[:1]  # (an empty share samples one row and keeps none)
    batch = task.encode(share, device=policy.device).repeat(G)
    keep = slice(0, (hi - lo) * G)
    L = policy.canvas_length
    canvases = math.ceil(max_new_tokens / L)
    out = policy.sample(batch.prompt_ids, batch.prompt_mask, max_new_tokens, seed=seed,
                        draw_last_step=bool(cfg.sampling.draw_last_step), **sampler_settings(cfg.sampling))
    record, logp = record_of(out, canvases)
    comp, mask = completion_of(out, canvases, policy.eos_token_id, policy.pad_token_id)
    logp = fold_after_eos(logp, mask)
    row_nfe = out.decoder_forward_passes.long()
    record = {k: v[keep] for k, v in record.items()}
    n = keep.stop - keep.start
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], comp[keep], mask[keep],
                   mean_nfe(row_nfe[keep]), consecutive_groups(n, G, comp.device), passes=int(row_nfe[keep].sum()),
                   token_logprobs=torch.where(mask[keep], logp[keep], 0.0), row_nfe=row_nfe[keep],
                   kind_record=record)


def share_seed(seed: int | None, first_prompt: int) -> int | None:
    """The sampling seed of a share of a rollout batch that starts at prompt ``first_prompt``: ``seed`` mixed with
    it (splitmix64's odd constant), so shares sample independent draws and a one-process run (share 0 = the whole
    batch, which keeps ``seed``) is unchanged; ``None`` stays ``None`` (unseeded)."""
    if seed is None:
        return None
    return (int(seed) + 0x9E3779B97F4A7C15 * (int(first_prompt) + 1)) % (2 ** 63)


def trajectory_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                        completion_mask: torch.Tensor, record: dict, grad: bool = False,
                        steps_per_pass: int | None = None, weights: torch.Tensor | None = None,
                        backward=None, through: bool = False) -> tuple[torch.Tensor, int]:
    """The trajectory log-probs per completion position under ``model``'s current weights (see the module
    docstring), folded at EOS (:func:`fold_after_eos`) and 0 off ``completion_mask``.

    Per canvas: the encoder pass (with grad when ``grad``) and a sequential no-grad pass over the recorded input
    canvases for the self-conditioning inputs; with ``grad``, batched passes over the canvas's steps (``S`` at once,
    or chunks of ``steps_per_pass``; the cache repeated along the batch) whose logits carry the gradient; without
    ``grad`` the sequential pass's own logits are used. With ``grad`` and ``through`` the sequential pass runs with
    grad instead and its logits carry the gradient (no batched pass).

    With ``weights`` and ``backward`` (the two-pass surrogate: ``weights`` = ``∂loss/∂logp`` from a no-grad pass),
    each batched pass is back-propagated at once, ``backward(Σ weights · logp_part)``, where ``logp_part`` is that
    pass's share of the result (folding and masking are linear, so the parts sum to the whole), and freed: only one
    pass's logits and ``steps_per_pass`` self-conditioning inputs are held at a time, not ``S``. The passes read the
    encoder's keys/values through detached leaves (:func:`~dlmrl.models.diffusion_gemma.detached_cache`); at the
    end one plain ``torch.autograd.backward`` takes their accumulated gradients through the encoder passes (so
    whatever scaling ``backward`` applies, e.g. a loss scaler's, is carried by those gradients, not applied twice).
    The gradient is the one-pass gradient of ``Σ weights · logp`` up to float rounding.

    Args:
        model: a ``DiffusionGemmaForBlockDiffusion`` (or a wrapper).
        prompt_ids, prompt_mask: ``(B, P)`` long / bool, left-padded.
        completion, completion_mask: ``(B, C·L)`` long / bool.
        record: the :data:`RECORD_KEYS` tensors of these rows (:func:`record_of`).
        grad: build the graph (the batched passes) or not; implied by ``weights``.
        steps_per_pass: most denoising steps per batched pass (``None``: all of a canvas's steps at once).
        weights: ``(B, C·L)`` float: the surrogate's weights; requires ``backward``.
        backward: called with each pass's scalar surrogate (the trainer's ``accelerator.backward``).
        through: with ``grad``, the exact gradient of the trajectory log-prob: each canvas's steps run in one
            sequential pass with grad, step ``s``'s logits read step ``s − 1``'s processed logits as its
            self-conditioning input *with* their graph, so the gradient also flows through the self-conditioning
            path (``S`` step passes' graphs held at once per canvas, as the batched pass holds ``S`` step canvases;
            no ``steps_per_pass``). The values are the same as without it.
    Returns:
        ``(logp (B, C·L) float32, passes)``: ``passes`` the canvas passes run per row (sequential and batched);
        ``logp`` detached when ``weights`` is given.
    Raises:
        ValueError: ``weights`` without ``backward``, ``steps_per_pass`` < 1, or ``steps_per_pass`` with
            ``through``.
    """
    if weights is not None and backward is None:
        raise ValueError("trajectory_logprobs: weights (the surrogate's) need a backward callable")
    if steps_per_pass is not None and steps_per_pass < 1:
        raise ValueError(f"trajectory_logprobs: steps_per_pass must be >= 1 (got {steps_per_pass})")
    if through and steps_per_pass is not None:
        raise ValueError("trajectory_logprobs: through (the gradient through self-conditioning) chains a canvas's "
                         "steps in one sequential pass; steps_per_pass does not apply")
    grad = grad or weights is not None
    inner = unwrap_diffusion_gemma(model)
    B, P = prompt_ids.shape
    inputs, drawn, scored = record["inputs"], record["drawn"], record["scored"]
    temps, active = record["temperatures"], record["active"]
    C, L = inputs.shape[1], inputs.shape[3]
    width = completion.shape[1]
    dev = prompt_ids.device
    zero = torch.zeros((), device=dev)
    cache = new_cache(inner)
    attn = prompt_mask.bool()
    per_position = []
    leaves = []  # ((encoder key/value, its detached leaf) of every canvas read through leaves)
    passes = 0

    def share(c: int, terms: torch.Tensor) -> torch.Tensor:  # (B, L) terms of canvas c -> their (B, width) share
        part = torch.cat([terms.new_zeros((B, c * L)), terms, terms.new_zeros((B, width - (c + 1) * L))], dim=1)
        return torch.where(completion_mask.bool(), fold_after_eos(part, completion_mask), zero)

    def emit(c: int, terms: torch.Tensor) -> torch.Tensor:  # (surrogate mode: back-propagate this pass's share now)
        if weights is None:
            return terms
        backward((share(c, terms) * weights.to(terms.dtype)).sum())
        return terms.detach()

    context = torch.enable_grad() if grad else torch.no_grad()
    with context:
        for c in range(C):
            steps = active[:, c].any(dim=0).nonzero()
            if not len(steps):
                break  # (no row denoised this canvas: every row had finished, so none denoises a later one)
            S = int(steps.max()) + 1
            chunk = min(steps_per_pass or S, S)
            new_ids = prompt_ids if c == 0 else completion[:, (c - 1) * L:c * L]
            start = 0 if c == 0 else P + (c - 1) * L
            if c > 0:  # (the mask covers the canvas being encoded, as the sampler pads it after each canvas)
                attn = torch.nn.functional.pad(attn, (0, L), value=True)
            cache = encode(inner, new_ids, attn, cache, position_ids(start, new_ids.shape[1], dev)).cache
            dec_mask = torch.nn.functional.pad(attn, (0, L), value=True)
            dec_pos = position_ids(P + c * L, L, dev)
            masks = canvas_attention_masks(inner, inputs[:, c, 0], cache, dec_mask)
            read = cache
            if weights is not None:
                read, pairs = detached_cache(cache)
                leaves.extend(pairs)
            sc, sc_inputs, parts = None, [], []
            if grad and through:  # (the exact gradient: each step's logits through the previous step's, sequential)
                if weights is None:  # (a view the next canvas's encoder pass does not extend: see snapshot_cache)
                    read = snapshot_cache(cache)
                for s in range(S):
                    raw = canvas_logits(inner, inputs[:, c, s], read, masks, dec_pos, sc)
                    processed = raw / temps[:, c, s, None, None]
                    parts.append(torch.where(scored[:, c, s], drawn_logprobs(processed, drawn[:, c, s]), zero))
                    sc = self_conditioning_input(inner, processed)
                    passes += 1
                per_position.append(emit(c, torch.stack(parts).sum(dim=0)))
                continue
            for s in range(S):
                with torch.no_grad():  # (the self-conditioning inputs, as the sampler computed them)
                    if grad:  # (kept for the batched pass; without grad only the current step's is held)
                        sc_inputs.append(sc)
                    raw = canvas_logits(inner, inputs[:, c, s], cache, masks, dec_pos, sc)
                    processed = raw / temps[:, c, s, None, None]
                    if not grad:
                        parts.append(drawn_logprobs(processed, drawn[:, c, s]))
                    sc = self_conditioning_input(inner, processed)
                    del raw, processed
                passes += 1
                if grad and (len(sc_inputs) == chunk or s == S - 1):
                    k = len(sc_inputs)
                    first = s + 1 - k
                    logp = _batched_steps(inner, read, inputs[:, c, first:s + 1], drawn[:, c, first:s + 1],
                                          temps[:, c, first:s + 1], sc_inputs, dec_mask, dec_pos)
                    passes += k
                    parts.append(emit(c, torch.where(scored[:, c, first:s + 1], logp, zero).sum(dim=1)))  # (B, L)
                    sc_inputs = []
            if grad:
                per_position.append(torch.stack(parts).sum(dim=0))
            else:
                terms = torch.where(scored[:, c, :S], torch.stack(parts, dim=1), zero)
                per_position.append(terms.sum(dim=1))
        if leaves:  # (the passes' gradients at the encoder's keys/values, through the encoder passes, once)
            used = [(t, leaf.grad) for t, leaf in leaves if leaf.grad is not None]
            if used:
                torch.autograd.backward([t for t, _ in used], [g for _, g in used])
        out = torch.cat(per_position, dim=1) if per_position else completion.new_zeros((B, 0), dtype=torch.float32)
        if out.shape[1] < width:
            out = torch.cat([out, out.new_zeros((B, width - out.shape[1]))], dim=1)
        out = fold_after_eos(out, completion_mask)
        return torch.where(completion_mask.bool(), out, torch.zeros((), device=dev, dtype=out.dtype)), passes


def drawn_logprobs(processed: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
    """``log softmax(ℓ/τ)[x̃]``: ``(N, L, V)`` temperature-scaled logits and ``(N, L)`` long draws -> ``(N, L)``."""
    return torch.log_softmax(processed, dim=-1).gather(-1, drawn[..., None]).squeeze(-1)


def _batched_steps(inner, cache, inputs: torch.Tensor, drawn: torch.Tensor, temps: torch.Tensor, sc_inputs: list,
                   dec_mask: torch.Tensor, dec_pos: torch.Tensor) -> torch.Tensor:
    """One canvas pass with grad over ``k`` consecutive steps of a canvas at once: rows ``b·k + s``, the cache
    repeated along the batch (a copy), the detached self-conditioning inputs (``None``: a canvas's first step,
    which has none: zeros, switched off by the mask). Consumes ``sc_inputs`` (emptied once stacked, so the forward
    holds one copy of them, ``k·L·V`` values, not two; the caller's next step's input is alive too: ``k + 1``). Returns ``(B, k, L)`` float32 log-probs of the draws."""
    B, k, L = inputs.shape
    flat = inputs.reshape(B * k, L)
    sc, sc_mask = None, None
    given = next((x for x in sc_inputs if x is not None), None)  # (not a list: it would hold every input twice)
    if given is not None:
        V, dtype = given.shape[-1], given.dtype
        del given
        sc_mask = torch.tensor([x is not None for x in sc_inputs], device=inputs.device).repeat(B)
        sc = torch.stack([torch.zeros((B, L, V), dtype=dtype, device=inputs.device) if x is None else x
                          for x in sc_inputs], dim=1).reshape(B * k, L, V).detach()
    sc_inputs.clear()
    steps_cache = repeated_cache(cache, k)  # (a copy: gradient checkpointing's recompute reads it again)
    masks = canvas_attention_masks(inner, flat, steps_cache, dec_mask.repeat_interleave(k, dim=0))
    raw = canvas_logits(inner, flat, steps_cache, masks, dec_pos, sc, sc_mask)
    del steps_cache
    return drawn_logprobs(raw / temps.reshape(B * k)[:, None, None], drawn.reshape(B * k, L)).reshape(B, k, L)


def adapter_off(policy):
    """The context a policy is scored in: a LoRA run's KL reference
    (:class:`~dlmrl.models.lora.AdapterDisabledPolicy`, whose ``model`` is the policy's own) runs with the adapter
    disabled, i.e. the frozen base; any other policy as it is."""
    import contextlib

    disabled = getattr(type(policy), "adapter_disabled", None)
    return policy.adapter_disabled() if disabled is not None else contextlib.nullcontext()


class UniformTrajectoryScorer:
    """The trajectory likelihood as the trainer's scorer (the interface of
    :class:`~dlmrl.training.scorers.ARScorer`): old scores once per rollout batch (the same for every μ update: the
    likelihood is exact, no plan is drawn), the reference's every update, one scored backward per optimizer step.

    Args:
        policy: a :class:`~dlmrl.models.uniform_policy.UniformNoisePolicy`. ref: the KL reference or ``None``.
        old_scores: whether the objective reads old-policy scores.
        micro_batch: most denoising-step canvases (one row's input canvas at one step) per forward with grad
            (``estimator.micro_batch``; ``None`` = all rows' steps at once), as the masked kinds count canvases: at
            least a row's ``N`` recorded steps per canvas give chunks of ``micro_batch // N`` rows, fewer give one
            row at a time with its steps in passes of ``micro_batch``. Chunked scoring with grad takes the
            two-pass surrogate (no-grad values, ``g = ∂loss/∂logp``, then each pass back-propagates its share of
            ``Σ g · logp``), whose gradients sum to the whole batch's; peak memory is one pass's.
        through: the gradient also through the self-conditioning inputs (``estimator.self_conditioning:
            through``; :func:`trajectory_logprobs`); ``micro_batch`` then counts whole rows' steps (below ``N`` it
            raises).
    Attributes:
        nfe: canvas passes per row of the last batch's scoring with grad (sequential and batched).
        measures_rollout_gap: True: the scores are log-probs of the distribution the sampler drew from
            (:func:`dlmrl.training.update.measures_rollout_mismatch`).
    """

    measures_rollout_gap = True

    def __init__(self, policy, ref, old_scores: bool = True, micro_batch: int | None = None, through: bool = False):
        self.policy, self.ref, self.old_scores, self.through = policy, ref, old_scores, through
        self.micro_batch = micro_batch or None
        self.lockstep = None  # (set by the trainer with FSDP/DeepSpeed; one process is what this scorer supports)
        self.nfe = 0

    def _score(self, policy, ro: Rollout, grad: bool, **surrogate) -> torch.Tensor:
        with adapter_off(policy):
            logp, passes = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion,
                                               ro.completion_mask, ro.kind_record, grad=grad, through=self.through,
                                               **surrogate)
        if grad:
            self.nfe = passes
        return logp

    def _split(self, ro: Rollout) -> tuple[int, int | None]:
        """``(rows per chunk, steps per pass)`` for ``micro_batch`` step canvases per forward."""
        steps = ro.kind_record["inputs"].shape[2] if len(ro) else 1
        if self.micro_batch is None:
            return max(len(ro), 1), None
        if self.micro_batch >= steps:
            return self.micro_batch // steps, None
        return 1, self.micro_batch

    def _chunks(self, ro: Rollout) -> list[torch.Tensor]:
        n = len(ro)
        return list(torch.arange(n).split(self._split(ro)[0])) if n else []

    def _values(self, policy, ro: Rollout) -> torch.Tensor:
        with torch.no_grad():
            parts = [self._score(policy, ro.rows(rows), grad=False) for rows in self._chunks(ro)]
        return torch.cat(parts) if parts else ro.completion.new_zeros(ro.completion.shape, dtype=torch.float32)

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False,
                rows: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
                minibatches: int = 1) -> OldScores:
        """Reference scores (every update) and, where the step reads them, old scores (updates 2..μ, every update
        with ``minibatches > 1``), under no grad. ``entropy`` is refused (the kind refuses presets that read
        entropies); ``generator`` and ``advantages`` unused (no plan)."""
        if entropy:
            raise ValueError("the uniform kind's trajectory likelihood gives no per-token entropies")
        ro = ro if rows is None else ro.rows(rows)
        self.ro = ro
        ref = self._values(self.ref, ro) if self.ref is not None else None
        needs_old = (num_iterations > 1 or minibatches > 1) and self.old_scores
        logp = self._values(self.policy, ro) if needs_old else None
        old = [logp if minibatches > 1 else None] + [logp] * (num_iterations - 1)
        return OldScores(old, [ref] * num_iterations, None)

    def backward(self, j: int, loss_fn, backward, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Score the rows with grad and back-propagate ``loss_fn(logp)``; ``rows`` ``(m,)``: only these rows of the
        prepared ones (a mini-batch)."""
        ro = self.ro if rows is None else self.ro.rows(rows)
        chunks = self._chunks(ro)
        steps_per_pass = self._split(ro)[1]
        if len(chunks) <= 1 and steps_per_pass is None:
            loss, metrics = loss_fn(self._score(self.policy, ro, grad=True))
            backward(loss)
            return loss.detach(), metrics
        values = self._values(self.policy, ro)
        leaf = values.detach().requires_grad_(True)
        loss, metrics = loss_fn(leaf)
        (g,) = torch.autograd.grad(loss, leaf, allow_unused=True)
        g = torch.zeros_like(leaf) if g is None else g.detach()
        for part in chunks:
            self._score(self.policy, ro.rows(part), grad=True, steps_per_pass=steps_per_pass, weights=g[part],
                        backward=backward)
        return loss.detach(), metrics
