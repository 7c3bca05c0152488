"""The uniform-noise ELBO estimators (:mod:`dlmrl.estimators.uniform_elbo`: UDLM's continuous-time NELBO, arXiv
2412.10193) as a second likelihood of ``model.kind: uniform`` (``estimator.name`` ``uniform_double_mc``,
``uniform_sdmc`` or ``uniform_flat_ce``; the default is the sampled trajectory, :mod:`dlmrl.training.uniform_trajectory`).

**The denoiser** (:func:`canvas_denoiser`, dlmrl interpretation). DiffusionGemma writes canvas after canvas, each
conditioned on the clean prompt and finished canvases; its log-likelihood is the sum over canvases of a uniform
diffusion's, so one noise level ``t`` applied to every completion position at once, each canvas denoised against
the *clean* earlier canvases (the encoder's key/value cache of the prompt and the clean completion), gives per
position the integrand of its canvas's ELBO; their sum over positions is an unbiased estimate of the sum of the
canvases' bounds. The decoder gets no time input (DiffusionGemma has none) and a **zero self-conditioning input**,
as at the first step of the sampler, so that ``denoise`` is a deterministic function of ``z_t`` (the bound needs
that). This bounds UDLM's reverse process with this denoiser, not the entropy-bounded sampler's output
distribution, so the rollout log-prob gap is not defined for it (not logged).

**The scorer** (:class:`UniformELBOScorer`) follows :class:`~dlmrl.training.scorers.DiffusionScorer`: one noise
plan per μ update (:meth:`~dlmrl.estimators.uniform_elbo._UniformEstimator.make_plan`, drawn over the completion
mask, the positions up to and including EOS), shared by the old, reference and current scores (common random
numbers); per-token ``(B, L)`` estimates into the preset's objective.
"""

from __future__ import annotations

import torch

from dlmrl.models.diffusion_gemma import (
    canvas_attention_masks,
    canvas_logits,
    encode,
    new_cache,
    position_ids,
    repeated_cache,
    unwrap_diffusion_gemma,
)
from dlmrl.training.rollout import Rollout
from dlmrl.training.scorers import OldScores

__all__ = ["UniformELBOScorer", "canvas_denoiser"]


def canvas_denoiser(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                    completion_mask: torch.Tensor, canvas_length: int):
    """``denoise(z_t (K, B, T), t (K,)) -> logits (K, B, T, V)`` float32 for the estimators of
    :mod:`dlmrl.estimators.uniform_elbo`: canvas ``c`` of ``z_t`` (positions ``[c·L, (c+1)·L)``) through the decoder
    with the encoder's cache of the prompt and the clean canvases before ``c`` (built once per call, with grad when
    grad is enabled), zero self-conditioning; canvases without a masked position are not run (their logits are 0:
    nothing there is scored).

    Args:
        prompt_ids, prompt_mask: ``(B, P)`` left-padded. completion, completion_mask: ``(B, T)``, ``T = C·L``.
        canvas_length: ``L``.
    """
    inner = unwrap_diffusion_gemma(model)
    B, P = prompt_ids.shape
    L = int(canvas_length)
    T = completion.shape[1]
    canvases = -(-T // L)
    used = [bool(completion_mask[:, c * L:(c + 1) * L].any()) for c in range(canvases)]
    V = int(inner.config.text_config.vocab_size)

    def denoise(z_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        K = z_t.shape[0]
        dev = z_t.device
        cache = new_cache(inner)
        attn = prompt_mask.bool()
        out = []
        for c in range(canvases):
            if not any(used[c:]):
                break
            new_ids = prompt_ids if c == 0 else completion[:, (c - 1) * L:c * L]
            start = 0 if c == 0 else P + (c - 1) * L
            if c > 0:
                attn = torch.nn.functional.pad(attn, (0, L), value=True)
            cache = encode(inner, new_ids, attn, cache, position_ids(start, new_ids.shape[1], dev)).cache
            if not used[c]:
                out.append(torch.zeros((K, B, L, V), device=dev))
                continue
            canvas = z_t[:, :, c * L:(c + 1) * L].transpose(0, 1).reshape(B * K, L)  # (rows b·K + k)
            dec_mask = torch.nn.functional.pad(attn, (0, L), value=True).repeat_interleave(K, dim=0)
            draws_cache = repeated_cache(cache, K)  # (a copy: gradient checkpointing's recompute reads it again)
            masks = canvas_attention_masks(inner, canvas, draws_cache, dec_mask)
            logits = canvas_logits(inner, canvas, draws_cache, masks, position_ids(P + c * L, L, dev))
            del draws_cache
            out.append(logits.float().reshape(B, K, L, V).transpose(0, 1))
        logits = torch.cat(out, dim=2) if out else torch.zeros((K, B, 0, V), device=z_t.device)
        if logits.shape[2] < T:
            logits = torch.cat([logits, logits.new_zeros((K, B, T - logits.shape[2], V))], dim=2)
        return logits

    return denoise


class UniformELBOScorer:
    """A uniform ELBO estimator as the trainer's scorer (the interface of
    :class:`~dlmrl.training.scorers.DiffusionScorer`): one noise plan per μ update, drawn over the completion mask
    from the step's generator, shared by old, reference and current scores.

    Args:
        policy: a :class:`~dlmrl.models.uniform_policy.UniformNoisePolicy`. ref: the KL reference or ``None``.
        estimator: a :class:`~dlmrl.estimators.uniform_elbo.UniformDoubleMC`, ``UniformSDMC`` or ``UniformFlatCE``.
        old_scores: whether the objective reads old-policy scores.
        micro_batch: draws per denoiser call (``estimator.micro_batch``; ``None`` = all).
    Attributes:
        nfe: the plan's draws (canvas passes per completion canvas).
    """

    measures_rollout_gap = False

    def __init__(self, policy, ref, estimator, old_scores: bool = True, micro_batch: int | None = None):
        self.policy, self.ref, self.estimator, self.old_scores = policy, ref, estimator, old_scores
        self.micro_batch = micro_batch or None
        self.lockstep = None
        self.nfe = estimator.nfe

    def _score(self, policy, ro: Rollout, plan) -> torch.Tensor:
        from dlmrl.training.uniform_trajectory import adapter_off

        denoise = canvas_denoiser(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask,
                                  policy.canvas_length)
        with adapter_off(policy):  # (a LoRA run's reference: the base)
            est = self.estimator.score(denoise, plan, ro.completion, ro.completion_mask, policy.vocab_size,
                                       self.micro_batch)
        return est.per_token.float()

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False,
                rows: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
                minibatches: int = 1) -> OldScores:
        """Draw the μ plans over the whole batch (then cut to ``rows``, so a row's noise does not depend on which
        process scores it), and score old (updates 2..μ; every update with ``minibatches > 1``) and reference
        (every update) under no grad."""
        if entropy:
            raise ValueError("the uniform kind's likelihoods give no per-token entropies")
        V = self.policy.vocab_size
        plans = [self.estimator.make_plan(ro.completion, ro.completion_mask.bool(), V, generator)
                 for _ in range(num_iterations)]
        if rows is not None:
            ro = ro.rows(rows)
            plans = [type(p)(t=p.t, weights=p.weights, z_t=p.z_t[:, rows], corrupted=p.corrupted[:, rows])
                     for p in plans]
        self.ro, self.plans = ro, plans
        with torch.no_grad():
            scored = plans if minibatches > 1 else plans[1:]
            old = [None] * (num_iterations - len(scored)) + [
                self._score(self.policy, ro, p) if self.old_scores else None for p in scored]
            ref = ([self._score(self.ref, ro, p) for p in plans] if self.ref is not None
                   else [None] * num_iterations)
        return OldScores(old, ref, None)

    def backward(self, j: int, loss_fn, backward, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Score update ``j``'s plan with grad and back-propagate ``loss_fn(per_token)``; ``rows``: a mini-batch of
        the prepared rows."""
        ro, plan = self.ro, self.plans[j]
        if rows is not None:
            ro = ro.rows(rows)
            plan = type(plan)(t=plan.t, weights=plan.weights, z_t=plan.z_t[:, rows], corrupted=plan.corrupted[:, rows])
        loss, metrics = loss_fn(self._score(self.policy, ro, plan))
        backward(loss)
        return loss.detach(), metrics
