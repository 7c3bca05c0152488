"""Scoring a policy on a :class:`MaskPlan`: per-token ELBO contributions and their sum."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch

from dlmrl.estimators.configurable import ConfigurableEstimator
from dlmrl.estimators.mask_plan import MaskPlan, UpperBound
from dlmrl.models.canvas_scores import canvas_token_logprobs
from dlmrl.models.forward_agreement import forward_agreement
from dlmrl.models.sampler import sampler_log_softmax  # (one function with the sampler's; re-exported)  # noqa: F401

Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Lockstep(Protocol):
    """How micro-batched passes stay in step over processes whose every forward and backward is a collective
    (FSDP, DeepSpeed ZeRO: :class:`dlmrl.training.distributed.GradientSync`).

    ``count(local)``: the number of passes every process runs, given this one's ``local`` (a collective; every
    process calls it at the same point); a process pads its own with passes of loss weight 0. ``sync(last)``: a
    context for one backward, reducing gradients across the processes only when ``last`` (the update's last
    backward), accumulating them locally before.
    """

    def count(self, local: int) -> int: ...

    def sync(self, last: bool) -> AbstractContextManager: ...


def _agreement(lockstep: Lockstep | None) -> AbstractContextManager:
    """With a lockstep, a family that calls the model a data-dependent number of times per pass agrees the count
    with the other processes (:mod:`dlmrl.models.forward_agreement`); without one, any outer agreement stands."""
    return forward_agreement(lockstep.count) if lockstep is not None else contextlib.nullcontext()


def lockstep_sync(lockstep: Lockstep | None, last: bool) -> AbstractContextManager:
    """``lockstep.sync(last)``, or nothing without a lockstep (one process, or DDP's own synchronisation)."""
    return lockstep.sync(last) if lockstep is not None else contextlib.nullcontext()


@dataclass
class Estimate:
    """A likelihood estimate for a batch of completions.

    Attributes:
        sequence: ``(B,)`` float32 ELBO estimate per sequence, nats.
        per_token: ``(B, L)`` float32 contributions ``c^i`` (nats), zero outside the completion
            mask; ``per_token.sum(-1) == sequence``.
        nfe: denoiser forward passes per sequence.
        entropy: ``(B, L)`` float32 detached predictive entropy (nats) of each completion token, averaged
            over the samples where it was masked (0 where it never was, and outside the mask); ``None``
            unless :func:`score` was asked for it.

    Reference: per-token contributions of the ELBO (dlmrl interpretation); GDPO arXiv 2510.08554 §4.
    """

    sequence: torch.Tensor
    per_token: torch.Tensor
    nfe: int
    entropy: torch.Tensor | None = None


def check_plan(
    plan: MaskPlan,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
) -> None:
    """Raise ``ValueError`` unless ``plan`` fits ``completion (B, L)`` and masks only allowed positions."""
    if tuple(plan.masks.shape[1:]) != tuple(completion.shape):
        raise ValueError(
            f"plan masks (S, B, L) = {tuple(plan.masks.shape)} do not match completion (B, L) = "
            f"{tuple(completion.shape)}"
        )
    if tuple(completion_mask.shape) != tuple(completion.shape):
        raise ValueError(
            f"completion_mask shape {tuple(completion_mask.shape)} != completion shape "
            f"{tuple(completion.shape)}"
        )
    outside = plan.masks.to(completion_mask.device) & ~completion_mask.bool()[None]
    if outside.any():
        s, b, i = outside.nonzero()[0].tolist()
        raise ValueError(
            f"plan masks position {i} of row {b} in sample {s}, outside completion_mask "
            "(given cells and padding are context and are never masked)"
        )
    pm = plan.prompt_masks
    if pm is not None and prompt_mask is not None:
        if tuple(pm.shape[1:]) != tuple(prompt_mask.shape):
            raise ValueError(
                f"plan prompt_masks (S, B, P) = {tuple(pm.shape)} do not match prompt (B, P) = "
                f"{tuple(prompt_mask.shape)}"
            )
        if (pm.to(prompt_mask.device) & ~prompt_mask.bool()[None]).any():
            raise ValueError("plan prompt_masks mask a padding position of the prompt")


def _check_decoded(completion: torch.Tensor, completion_mask: torch.Tensor, mask_token_id: int) -> None:
    """Raise ``ValueError`` if a scored position holds the mask token: a canvas the sampler did not finish has no
    likelihood to score (``log p([MASK])`` is not the probability of a written token)."""
    left = (completion == mask_token_id) & completion_mask.bool()
    if left.any():
        b, i = left.nonzero()[0].tolist()
        raise ValueError(f"completion row {b} still holds the mask token at position {i}: only fully decoded "
                         "completions can be scored")


def _check_micro_batch(micro_batch: int | None) -> None:
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int)
                                    or micro_batch < 1):
        raise ValueError(f"micro_batch must be an integer >= 1 or None, got {micro_batch!r}")


def _chunks(plan: MaskPlan, micro_batch: int | None) -> list[torch.Tensor]:
    """Flat indices ``s·B + b`` of the plan's canvases that run (:meth:`MaskPlan.runs`), in chunks of at most
    ``micro_batch``."""
    flat = torch.nonzero(plan.runs().flatten().cpu()).squeeze(-1)  # (n,) in order s·B + b
    size = len(flat) if micro_batch is None else micro_batch
    return list(flat.split(max(size, 1))) if len(flat) else []


def _ghost(plan: MaskPlan) -> torch.Tensor:
    """``(1,)`` the canvas a padding pass runs (its result weighs 0): the plan's first canvas that runs, else its
    first canvas.

    Raises:
        ValueError: the plan has no canvas at all (``S·B = 0``), so this process cannot keep in step.
    """
    runs = torch.nonzero(plan.runs().flatten().cpu()).squeeze(-1)
    if len(runs):
        return runs[:1]
    if plan.masks.shape[0] * plan.masks.shape[1] == 0:
        raise ValueError("a process with no canvas to score cannot run the passes that keep the processes in step "
                         f"(plan masks {tuple(plan.masks.shape)}): give every process at least one row")
    return torch.zeros(1, dtype=torch.long)


def _passes(plan: MaskPlan, micro_batch: int | None, lockstep: Lockstep | None) -> list[tuple[torch.Tensor, bool]]:
    """``[(flat, real), ...]``: the chunks of :func:`_chunks`, then (with ``lockstep``) padding passes
    (``real`` False, :func:`_ghost`) up to the count every process runs."""
    chunks = _chunks(plan, micro_batch)
    passes = [(flat, True) for flat in chunks]
    if lockstep is not None:
        agreed = lockstep.count(len(chunks))
        passes += [(_ghost(plan), False)] * (agreed - len(chunks))
    return passes


@dataclass
class _Chunk:
    """One forward call's canvases: ``logp (n, L)`` of the target tokens at the scored positions (0 elsewhere;
    float32, float64 for a float64 model), the sample ``s_idx (n,)`` and row ``rows (n,)`` of each canvas, its
    plan weight at each position ``weights (n, L)``, its scored positions ``scored (n, L)`` bool, and (when asked) the detached predictive entropy at the scored positions."""

    logp: torch.Tensor
    s_idx: torch.Tensor
    rows: torch.Tensor
    weights: torch.Tensor
    scored: torch.Tensor
    entropy: torch.Tensor | None

    def terms(self) -> torch.Tensor:
        """``(n, L)`` weighted log-probs, the chunk's linear (ELBO) terms."""
        return self.logp * self.weights


def _score_chunk(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    plan: MaskPlan,
    flat: torch.Tensor,
    with_entropy: bool = False,
    logits_chunk: int | None = None,
) -> _Chunk:
    """One forward call on the canvases ``flat`` (indices ``s·B + b``): every masked position of a canvas is
    replaced by the mask token (and the prompt's masked positions, if the plan has ``prompt_masks``); the
    log-probs count at its scored positions, under the denoiser's softmax or, with ``plan.temperature``,
    the sampler's token distribution (:func:`sampler_log_softmax`: ``log_softmax(logits / T)``, the mask token
    excluded). ``logits_chunk``: take them from the output head in chunks of that many positions
    (:func:`~dlmrl.models.canvas_scores.canvas_token_logprobs`), not from full logits."""
    batch = completion.shape[0]
    s_idx, rows = flat // batch, flat % batch  # (n,), (n,)
    device = completion.device
    s_idx, rows = s_idx.to(device), rows.to(device)
    masks = plan.masks[s_idx, rows]  # (n, L)
    scored = masks if plan.scored is None else plan.scored[s_idx, rows]  # (n, L)
    target = completion[rows]  # (n, L)
    canvas = torch.where(masks, torch.full_like(target, policy.mask_token_id), target)
    p_ids = prompt_ids[rows]  # (n, P)
    if plan.prompt_masks is not None:
        p_ids = torch.where(plan.prompt_masks[s_idx, rows], torch.full_like(p_ids, policy.mask_token_id), p_ids)
    # (``clean``: a block-diffusion policy scores each noised block next to the clean blocks before it)
    sampler = plan.temperature is not None
    logp, ent = canvas_token_logprobs(policy, p_ids, prompt_mask[rows], canvas, target, scored, clean=target,
                                      temperature=plan.temperature, exclude_token=policy.mask_token_id if sampler
                                      else None, entropy=with_entropy, logits_chunk=logits_chunk)  # (n, L) each
    weights = plan.weights[s_idx, rows].to(logp.dtype)  # (n,) or (n, L)
    weights = weights[:, None].expand_as(logp) if weights.dim() == 1 else weights  # (n, L)
    return _Chunk(logp, s_idx, rows, weights, scored, ent)


#: floor of ``β · log p`` inside SPG's upper bound (float64's ``exp`` underflows to 0 below about -745)
_UPPER_FLOOR = -700.0


def _upper_values(chunk: _Chunk, upper: UpperBound) -> torch.Tensor:
    """``(n, L)`` float64 ``w · p^β`` of a chunk's scored positions (0 elsewhere), the EUBO's summands."""
    power = (upper.beta * chunk.logp.double()).clamp(min=_UPPER_FLOOR)
    return torch.where(chunk.scored, chunk.weights.double() * power.exp(), 0.0)


def _upper_scale(plan: MaskPlan, completion_mask: torch.Tensor) -> torch.Tensor:
    """``(B, 1)`` ``n_b / |U_b|``: the row's completion tokens over the positions masked in some sample."""
    covered = plan.scored_masks().any(0).sum(-1, keepdim=True)  # (B, 1)
    return completion_mask.sum(-1, keepdim=True) / covered.clamp(min=1)


def _combine(plan: MaskPlan, linear: torch.Tensor, upper_sum: torch.Tensor | None,
             completion_mask: torch.Tensor) -> torch.Tensor:
    """The per-token terms: ``linear`` (B, L), and on the plan's upper-bound rows ``mix · EUBO + (1 − mix) ·
    linear`` with the EUBO terms ``(n_b/|U_b|) (1/β) log upper_sum``."""
    if plan.upper is None:
        return linear
    up = plan.upper
    covered = upper_sum > 0
    eubo = torch.where(covered, upper_sum.clamp(min=1e-300).log() / up.beta, 0.0)  # (B, L) float64
    eubo = (eubo * _upper_scale(plan, completion_mask)).to(linear.dtype)
    return torch.where(up.rows[:, None], up.mix * eubo + (1.0 - up.mix) * linear, linear)


def score(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    plan: MaskPlan,
    micro_batch: int | None = None,
    entropy: bool = False,
    logits_chunk: int | None = None,
    lockstep: Lockstep | None = None,
) -> Estimate:
    """Score ``completion`` under ``policy`` on the masks of ``plan``.

    For each sample ``s`` the masked positions of the canvas (and of the prompt, if the plan has
    ``prompt_masks``) are replaced by ``policy.mask_token_id`` and the policy is run;
    ``per_token[b, i] = Σ_s weights[s, b] · scored[s, b, i] · log p_θ(y^i | y_{m_s}, q)`` (``scored`` =
    ``masks`` unless the plan restricts it; ``p_θ`` the sampler's distribution at ``plan.temperature`` when set)
    and ``sequence = per_token.sum(-1)``; rows of ``plan.upper`` get SPG's upper bound instead
    (:class:`~dlmrl.estimators.mask_plan.UpperBound`). Canvases that score nothing are not run.
    Differentiable: call it under ``torch.no_grad()`` for the old and reference policies, with grad for the
    current one (or use :func:`score_and_backward`, whose memory does not grow with the number of samples).

    Args:
        policy: callable ``(input_ids (B, T), attention_mask (B, T)) -> (B, T, V)`` logits with a
            ``mask_token_id`` attribute.
        prompt_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)`` bool.
        completion: ``(B, L)`` long, the sampled canvas tokens.
        completion_mask: ``(B, L)`` bool, positions that are scored and may be masked.
        plan: the :class:`MaskPlan` (``S`` samples).
        micro_batch: most canvases per forward call (the ``S·B`` canvases are split into chunks);
            ``None`` = all in one call. The result does not depend on it, only speed and memory do.
        entropy: also return ``Estimate.entropy`` (the predictive entropy at each token, averaged over
            the samples that score it), e.g. for entropy-based objectives on a diffusion policy.
        logits_chunk: take the log-probs from the policy's output head in chunks of this many scored positions
            (:mod:`dlmrl.models.token_scores`; a family without a head split takes full logits), never the
            ``(n, L, V)`` float32 logits of a whole forward call; ``None`` or 0 = full logits. The result does
            not depend on it beyond float rounding.
        lockstep: several processes whose every forward is a collective (:class:`Lockstep`): this one runs the
            forward calls every process runs, padding with calls whose result is dropped.
    Returns:
        :class:`Estimate` with ``sequence (B,)``, ``per_token (B, L)`` (float32; float64 for a
        float64 model), ``nfe = S`` and ``entropy`` (``None`` unless asked for).
    Raises:
        ValueError: if the plan does not fit, or masks a position outside ``completion_mask``.

    Reference: GDPO arXiv 2510.08554 §2–§4; LLaDA arXiv 2502.09992 (likelihood evaluation); TraceRL arXiv
    2509.06949 (trajectory plans); SPG arXiv 2510.09541 (upper-bound rows).
    """
    _check_micro_batch(micro_batch)
    check_plan(plan, completion, completion_mask, prompt_mask)
    _check_decoded(completion, completion_mask, policy.mask_token_id)
    plan = plan.to(completion.device)
    passes = _passes(plan, micro_batch, lockstep)
    with _agreement(lockstep):  # (a family's model calls per pass, e.g. LLaDA's, agreed too)
        linear, upper_sum, ent_sum = _accumulate(policy, prompt_ids, prompt_mask, completion, plan, passes, entropy,
                                                 logits_chunk)
    if linear is None:  # no canvas to run (S = 0, an empty batch, nothing scored)
        per_token = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device)
    else:
        per_token = _combine(plan, linear, upper_sum, completion_mask.bool())
    # entropy averaged over the samples that score each token
    mean_entropy = ent_sum / plan.scored_masks().sum(0).clamp(min=1) if entropy else None
    return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=plan.num_samples, entropy=mean_entropy)


def _accumulate(policy, prompt_ids, prompt_mask, completion, plan: MaskPlan, passes, entropy: bool,
                logits_chunk: int | None):
    """Run ``passes`` (:func:`_passes`; padding passes run and are dropped) and sum their terms per row:
    ``(linear (B, L) or None when no canvas ran, upper_sum (B, L) float64 or None without upper-bound rows,
    ent_sum (B, L) float32)``."""
    linear = upper_sum = None
    ent_sum = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device)  # (B, L)
    for flat, real in passes:
        chunk = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat, entropy, logits_chunk)
        if not real:
            continue
        terms = chunk.terms()
        if linear is None:
            linear = torch.zeros(completion.shape, dtype=terms.dtype, device=completion.device)  # (B, L)
            upper_sum = None if plan.upper is None else torch.zeros(completion.shape, dtype=torch.float64,
                                                                    device=completion.device)
        linear = linear.index_add(0, chunk.rows, terms)
        if upper_sum is not None:
            upper_sum = upper_sum.index_add(0, chunk.rows, _upper_values(chunk, plan.upper))
        if chunk.entropy is not None:
            ent_sum.index_add_(0, chunk.rows, chunk.entropy.float())
    return linear, upper_sum, ent_sum


def sample_scores(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    plan: MaskPlan,
    micro_batch: int | None = None,
    logits_chunk: int | None = None,
) -> torch.Tensor:
    """Each sample's weighted score ``weights[s, b] · S(masks[s, b])`` separately.

    Args and errors as in :func:`score` (a plan with upper-bound rows is refused: its terms do not split by
    sample).
    Returns:
        ``(S, B)`` float32 (float64 for a float64 model), nats; its sum over ``S`` is
        :func:`score`'s ``sequence``. A canvas that is not run scores 0.
    """
    _check_micro_batch(micro_batch)
    check_plan(plan, completion, completion_mask, prompt_mask)
    if plan.upper is not None:
        raise ValueError("sample_scores: a plan with upper-bound (EUBO) rows has no per-sample scores")
    plan = plan.to(completion.device)
    num_samples, batch = plan.masks.shape[:2]
    out = None
    for flat in _chunks(plan, micro_batch):
        chunk = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat, logits_chunk=logits_chunk)
        values = chunk.terms().sum(-1)
        if out is None:
            out = torch.zeros(num_samples * batch, dtype=values.dtype, device=completion.device)
        out[flat.to(out.device)] = values
    if out is None:
        return torch.zeros(num_samples, batch, device=completion.device)
    return out.reshape(num_samples, batch)


LossFn = Callable[[torch.Tensor], "tuple[torch.Tensor, dict]"]


def score_and_backward(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    plan: MaskPlan,
    loss_fn: LossFn,
    micro_batch: int | None = None,
    backward: Callable[[torch.Tensor], None] | None = None,
    logits_chunk: int | None = None,
    lockstep: Lockstep | None = None,
) -> tuple[torch.Tensor, dict, Estimate]:
    """Accumulate ``∂ loss_fn(per_token) / ∂θ`` into the policy's ``.grad`` with bounded memory.

    The loss (e.g. a clipped ratio of ELBOs) is non-linear in the estimate, so a chunk's
    gradient cannot be taken on its own. Two passes make it exact:

    1. score every canvas without grad, in chunks, to get the values ``c (B, L)`` (and, for SPG's upper-bound
       rows, the sums ``Σ_s w p^β`` from the same forward calls);
    2. evaluate ``loss_fn`` on a leaf copy of ``c`` and take ``g = ∂loss/∂c (B, L)``;
    3. for each chunk, recompute its log-probs ``ℓ`` with grad and back-propagate the surrogate
       ``Σ g · (∂c/∂ℓ) · ℓ`` with ``∂c/∂ℓ`` detached (the plan weight for ELBO terms; for SPG's upper-bound
       rows the weight of each sample in the log-sum-exp as well); the chunks' gradients sum to
       ``Σ g · ∂c/∂θ = ∂loss/∂θ``.

    Peak memory is that of one chunk (activations of ``micro_batch`` canvases), whatever the
    number of samples; compute is one extra no-grad forward per canvas. When everything fits in
    one chunk (``micro_batch`` None or ``>= S·B``) a single pass with grad is used instead. The
    two passes must see the same function: dropout must be off (it is in the shipped models).

    Several processes whose every forward and backward is a collective (FSDP, DeepSpeed ZeRO; ``lockstep``):
    every process takes the path and the number of chunks the largest share needs (:meth:`Lockstep.count`), its own
    chunks first, then padding chunks (its first canvas again) whose surrogate is ``0 · Σ ℓ``, so each backward
    reaches the same parameters with a zero gradient; gradients are reduced across the processes on the last
    backward only (:meth:`Lockstep.sync`). The accumulated gradient is the same as without padding.

    Args:
        policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch, logits_chunk,
            lockstep: as in :func:`score`.
        loss_fn: ``per_token (B, L) -> (loss scalar, metrics dict)``; ``per_token.sum(-1)`` is the
            sequence estimate.
        backward: called on each (surrogate) loss; default ``Tensor.backward`` (pass
            ``accelerator.backward`` under accelerate).
    Returns:
        ``(loss (detached scalar), metrics, estimate (detached))``.
    Raises:
        ValueError: as :func:`score`.

    Reference: dlmrl (gradient accumulation through a non-linear loss by a linear surrogate).
    """
    backward = backward or (lambda x: x.backward())
    _check_micro_batch(micro_batch)
    check_plan(plan, completion, completion_mask, prompt_mask)
    _check_decoded(completion, completion_mask, policy.mask_token_id)
    plan = plan.to(completion.device)
    passes = _passes(plan, micro_batch, lockstep)
    with _agreement(lockstep):  # (a family's model calls per pass, e.g. LLaDA's, agreed too)
        return _score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn,
                                   micro_batch, backward, logits_chunk, lockstep, passes)


def _score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn, micro_batch,
                        backward, logits_chunk, lockstep, passes):
    """:func:`score_and_backward` once its passes are agreed."""
    if len(passes) <= 1:  # (everything in one call, on every process: one pass with grad)
        flat = [f for f, real in passes if real]
        est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, None if flat else micro_batch,
                    logits_chunk=logits_chunk)
        loss, metrics = loss_fn(est.per_token)
        with lockstep_sync(lockstep, last=True):
            if loss.requires_grad:  # (nothing scored: no graph, nothing to learn)
                backward(loss)
            elif passes:  # (a padding pass: this process has nothing to score, the others one call)
                ghost = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, passes[0][0],
                                     logits_chunk=logits_chunk)
                backward(_chunk_zero(ghost))
        per_token = est.per_token.detach()
        return loss.detach(), metrics, Estimate(per_token.sum(-1), per_token, est.nfe)
    with torch.no_grad():
        linear, upper_sum, _ = _accumulate(policy, prompt_ids, prompt_mask, completion, plan, passes, False,
                                           logits_chunk)
        per_token = (torch.zeros(completion.shape, device=completion.device) if linear is None
                     else _combine(plan, linear, upper_sum, completion_mask.bool()))
    est = Estimate(per_token.sum(-1), per_token, plan.num_samples)
    leaf = est.per_token.detach().requires_grad_(True)
    loss, metrics = loss_fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    grad = torch.zeros_like(leaf) if grad is None else grad.detach()  # (B, L) ∂loss/∂c
    scale = None if plan.upper is None else _upper_scale(plan, completion_mask.bool())
    for k, (flat, real) in enumerate(passes):
        chunk = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat, logits_chunk=logits_chunk)
        if not real:
            surrogate = _chunk_zero(chunk)
        else:
            coef = chunk.weights  # (n, L) ∂c/∂ℓ of the ELBO terms
            if plan.upper is not None:
                up = plan.upper
                with torch.no_grad():  # ∂/∂ℓ_s of (1/β) log Σ_s w_s e^{βℓ_s} = w_s e^{βℓ_s} / Σ
                    share = _upper_values(chunk, up) / upper_sum[chunk.rows].clamp(min=1e-300)
                    eubo_coef = (share * scale[chunk.rows]).to(coef.dtype)
                    coef = torch.where(up.rows[chunk.rows][:, None], up.mix * eubo_coef + (1 - up.mix) * coef, coef)
            surrogate = (chunk.logp * coef.detach() * grad[chunk.rows].to(chunk.logp.dtype)).sum()
        with lockstep_sync(lockstep, last=k == len(passes) - 1):
            backward(surrogate)
    return loss.detach(), metrics, est


def _chunk_zero(chunk: _Chunk) -> torch.Tensor:
    """``0 · Σ ℓ`` of a padding pass: a loss whose backward reaches every parameter the pass used, with gradient
    0 (its log-probs are finite: 0 off the scored positions, a decoded token's log-prob on them)."""
    return chunk.logp.sum() * 0


def as_generator(generator: torch.Generator | int | None, device: torch.device | str = "cpu"):
    """``generator`` itself, or a ``torch.Generator`` on ``device`` seeded with the integer ``generator``."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(f"generator must be a torch.Generator, an integer seed or None, got {generator!r}")
    return torch.Generator(device=device).manual_seed(generator)


class PlanEstimator(ConfigurableEstimator):
    """Base for estimators that draw a :class:`MaskPlan` and score it with :func:`score`.

    Subclasses are frozen dataclasses whose fields are their settings (built from the config by
    :meth:`~dlmrl.estimators.configurable.ConfigurableEstimator.from_config`) and implement ``make_plan(completion_mask (B, L) bool, generator, prompt_mask (B, P) bool)
    -> MaskPlan`` (``generator`` may be an integer seed; ``prompt_mask`` is used only by estimators
    that mask the prompt) and ``nfe`` / ``nfe_for(L)``. The trainer asks for a rollout batch's plan through
    :meth:`rollout_plan`, which also offers the sampler's record and the advantages (the trajectory
    estimator reads the one, SPG's the other).
    """

    @property
    def nfe(self) -> int | None:
        """Forward passes per sequence (``None`` when it depends on the canvas)."""
        raise NotImplementedError

    def nfe_for(self, length: int) -> int:
        """Forward passes per sequence for a canvas with ``length`` maskable positions."""
        return self.nfe

    def make_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> MaskPlan:
        raise NotImplementedError

    def rollout_plan(
        self,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        prompt_mask: torch.Tensor | None = None,
        *,
        reveal_step: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
    ) -> MaskPlan:
        """The plan for a rollout batch: :meth:`make_plan` unless the estimator reads more of the rollout.

        Args:
            completion_mask, generator, prompt_mask: as in :meth:`make_plan`.
            reveal_step: ``(B, L)`` long, the sampler's record of the step that revealed each token.
            advantages: ``(B,)`` (or ``(B, L)``) float advantages of the rows.
        """
        return self.make_plan(completion_mask, generator, prompt_mask)

    def estimate(
        self,
        policy: Policy,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion: torch.Tensor,
        completion_mask: torch.Tensor,
        generator: torch.Generator | int | None = None,
        micro_batch: int | None = None,
    ) -> Estimate:
        """Draw a fresh plan (from ``generator``, or a seed) and score it (shapes as in :func:`score`)."""
        plan = self.make_plan(completion_mask, as_generator(generator, completion_mask.device), prompt_mask)
        return score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch)
