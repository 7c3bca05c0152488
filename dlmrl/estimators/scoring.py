"""Scoring a policy on a :class:`MaskPlan`: per-token ELBO contributions and their sum."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.models.policy import canvas_logits

Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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

    Reference: SPEC §1 per-token contributions (dlmrl interpretation); GDPO arXiv 2510.08554 §4.
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


def _check_micro_batch(micro_batch: int | None) -> None:
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int)
                                    or micro_batch < 1):
        raise ValueError(f"micro_batch must be an integer >= 1 or None, got {micro_batch!r}")


def _chunks(plan: MaskPlan, micro_batch: int | None) -> list[torch.Tensor]:
    """Flat indices ``s·B + b`` of the plan's canvases, in chunks of at most ``micro_batch``."""
    total = plan.masks.shape[0] * plan.masks.shape[1]
    size = total if micro_batch is None else micro_batch
    return list(torch.arange(total).split(max(size, 1)))


def _score_chunk(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    plan: MaskPlan,
    flat: torch.Tensor,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward call on the canvases ``flat`` (indices ``s·B + b``).

    Returns ``(terms (n, L), rows (n,), entropy)``: the weighted log-probs of the masked tokens of
    each canvas (float32, or float64 for a float64 model), the row ``b`` each canvas belongs to, and
    (``with_entropy``) the detached predictive entropy at the masked positions, 0 elsewhere (else ``None``).
    """
    batch = completion.shape[0]
    s_idx, rows = flat // batch, flat % batch  # (n,), (n,)
    device = completion.device
    s_idx, rows = s_idx.to(device), rows.to(device)
    masks = plan.masks[s_idx, rows]  # (n, L)
    target = completion[rows]  # (n, L)
    canvas = torch.where(masks, torch.full_like(target, policy.mask_token_id), target)
    p_ids = prompt_ids[rows]  # (n, P)
    if plan.prompt_masks is not None:
        p_ids = torch.where(plan.prompt_masks[s_idx, rows], torch.full_like(p_ids, policy.mask_token_id), p_ids)
    logits = canvas_logits(policy, p_ids, prompt_mask[rows], canvas)  # (n, L, V)
    if logits.dtype != torch.float64:
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, target[..., None])[..., 0]  # (n, L)
    weights = plan.weights[s_idx, rows].to(logp.dtype)  # (n,)
    terms = torch.where(masks, logp, torch.zeros_like(logp)) * weights[:, None]  # (n, L)
    if with_entropy:
        with torch.no_grad():
            ent = torch.special.entr(torch.softmax(logits, dim=-1)).sum(-1)  # (n, L)
        return terms, rows, torch.where(masks, ent, 0.0)
    return terms, rows, None


def score(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    plan: MaskPlan,
    micro_batch: int | None = None,
    entropy: bool = False,
) -> Estimate:
    """Score ``completion`` under ``policy`` on the masks of ``plan``.

    For each sample ``s`` the masked positions of the canvas (and of the prompt, if the plan has
    ``prompt_masks``) are replaced by ``policy.mask_token_id`` and the policy is run;
    ``per_token[b, i] = Σ_s weights[s, b] · masks[s, b, i] · log p_θ(y^i | y_{m_s}, q)`` and
    ``sequence = per_token.sum(-1)``. Differentiable: call it under ``torch.no_grad()`` for the
    old and reference policies, with grad for the current one (or use :func:`score_and_backward`,
    whose memory does not grow with the number of samples).

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
            the samples that mask it), e.g. for entropy-based objectives on a diffusion policy.
    Returns:
        :class:`Estimate` with ``sequence (B,)``, ``per_token (B, L)`` (float32; float64 for a
        float64 model), ``nfe = S`` and ``entropy`` (``None`` unless asked for).
    Raises:
        ValueError: if the plan does not fit, or masks a position outside ``completion_mask``.

    Reference: GDPO arXiv 2510.08554 §2–§4; LLaDA arXiv 2502.09992 (likelihood evaluation).
    """
    _check_micro_batch(micro_batch)
    check_plan(plan, completion, completion_mask, prompt_mask)
    plan = plan.to(completion.device)
    per_token = None
    ent_sum = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device)  # (B, L)
    for flat in _chunks(plan, micro_batch):
        terms, rows, ent = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat, entropy)
        if per_token is None:
            per_token = torch.zeros(completion.shape, dtype=terms.dtype, device=completion.device)  # (B, L)
        per_token = per_token.index_add(0, rows, terms)
        if ent is not None:
            ent_sum.index_add_(0, rows, ent.float())
    if per_token is None:  # a plan with no samples (S = 0) or an empty batch
        per_token = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device)
    # entropy averaged over the samples that mask each token (the plan's masks count them)
    mean_entropy = ent_sum / plan.masks.sum(0).clamp(min=1) if entropy else None
    return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=plan.num_samples, entropy=mean_entropy)


def sample_scores(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion: torch.Tensor,
    completion_mask: torch.Tensor,
    plan: MaskPlan,
    micro_batch: int | None = None,
) -> torch.Tensor:
    """Each sample's weighted score ``weights[s, b] · S(masks[s, b])`` separately.

    Args and errors as in :func:`score`.
    Returns:
        ``(S, B)`` float32 (float64 for a float64 model), nats; its sum over ``S`` is
        :func:`score`'s ``sequence``.
    """
    _check_micro_batch(micro_batch)
    check_plan(plan, completion, completion_mask, prompt_mask)
    plan = plan.to(completion.device)
    num_samples, batch = plan.masks.shape[:2]
    out = []
    for flat in _chunks(plan, micro_batch):
        terms, _, _ = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat)
        out.append(terms.sum(-1))
    if not out:
        return torch.zeros(num_samples, batch, device=completion.device)
    return torch.cat(out).reshape(num_samples, batch)


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
) -> tuple[torch.Tensor, dict, Estimate]:
    """Accumulate ``∂ loss_fn(per_token) / ∂θ`` into the policy's ``.grad`` with bounded memory.

    The loss (e.g. a clipped ratio of ELBOs) is non-linear in the estimate, so a chunk's
    gradient cannot be taken on its own. Two passes make it exact:

    1. score every canvas without grad, in chunks, to get the values ``c (B, L)``;
    2. evaluate ``loss_fn`` on a leaf copy of ``c`` and take ``g = ∂loss/∂c (B, L)``;
    3. for each chunk, recompute its terms with grad and back-propagate the surrogate
       ``Σ g · terms``; the chunks' gradients sum to ``Σ g · ∂c/∂θ = ∂loss/∂θ``.

    Peak memory is that of one chunk (activations of ``micro_batch`` canvases), whatever the
    number of samples; compute is one extra no-grad forward per canvas. When everything fits in
    one chunk (``micro_batch`` None or ``>= S·B``) a single pass with grad is used instead. The
    two passes must see the same function: dropout must be off (it is in the shipped models).

    Args:
        policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch: as in
            :func:`score`.
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
    total = plan.num_samples * completion.shape[0]
    if micro_batch is None or micro_batch >= total:
        est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
        loss, metrics = loss_fn(est.per_token)
        backward(loss)
        per_token = est.per_token.detach()
        return loss.detach(), metrics, Estimate(per_token.sum(-1), per_token, est.nfe)
    with torch.no_grad():
        est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch)
    leaf = est.per_token.detach().requires_grad_(True)
    loss, metrics = loss_fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    grad = torch.zeros_like(leaf) if grad is None else grad.detach()  # (B, L) ∂loss/∂c
    plan = plan.to(completion.device)
    for flat in _chunks(plan, micro_batch):
        terms, rows, _ = _score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat)
        backward((terms * grad[rows].to(terms.dtype)).sum())
    return loss.detach(), metrics, Estimate(est.per_token.sum(-1), est.per_token, est.nfe)


def as_generator(generator: torch.Generator | int | None, device: torch.device | str = "cpu"):
    """``generator`` itself, or a ``torch.Generator`` on ``device`` seeded with the integer ``generator``."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(f"generator must be a torch.Generator, an integer seed or None, got {generator!r}")
    return torch.Generator(device=device).manual_seed(generator)


class PlanEstimator:
    """Base for estimators that draw a :class:`MaskPlan` and score it with :func:`score`.

    Subclasses implement ``make_plan(completion_mask (B, L) bool, generator, prompt_mask (B, P) bool)
    -> MaskPlan`` (``generator`` may be an integer seed; ``prompt_mask`` is used only by estimators
    that mask the prompt) and ``nfe`` / ``nfe_for(L)``.
    """

    name: str = ""

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
