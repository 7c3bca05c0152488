"""Rollout and scoring per policy kind, behind one structure the trainer reads.

- ``diffusion``: the masked-diffusion sampler; scores are an estimator's per-token ELBO contributions
  on :class:`~dlmrl.estimators.mask_plan.MaskPlan` s (one fresh plan per μ update, shared by
  old/new/reference), gradients through :func:`~dlmrl.estimators.scoring.score_and_backward`.
- ``ar``: ``AutoregressivePolicy.generate``; scores are exact token log-probs (``token_logprobs``),
  the same for every μ update (no plan).

Both return per-token tensors ``(B, L)`` over the completion, so one :class:`GroupObjective` serves both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.estimators import score
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.models.sampler import generate


@dataclass
class Rollout:
    """A rollout batch of ``B = prompts · G`` rows (groups of G consecutive rows).

    Attributes:
        examples: the task examples, one per row.
        prompt_ids, prompt_mask: ``(B, P)`` long / bool, left-padded.
        completion, completion_mask: ``(B, L)`` long / bool, the scored completion tokens.
        nfe: forward passes per sequence spent sampling.
    """

    examples: list
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion: torch.Tensor
    completion_mask: torch.Tensor
    nfe: int

    def rows(self, index: torch.Tensor) -> Rollout:
        """The rows ``index`` (tensors only; ``examples`` keeps every row)."""
        return Rollout(self.examples, self.prompt_ids[index], self.prompt_mask[index], self.completion[index],
                       self.completion_mask[index], self.nfe)


def rollout_diffusion(policy, task, cfg, examples: list, generator: torch.Generator) -> Rollout:
    """G completions per prompt from the masked-diffusion sampler (``sampling`` section); the completion
    mask is the task's (e.g. the blank cells in infill mode)."""
    s = cfg.sampling
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)
    out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                   block_length=s.block_length, steps=s.steps, temperature=s.temperature, remasking=s.remasking,
                   cfg_scale=s.cfg_scale, canvas=batch.canvas, generator=generator)
    return Rollout(batch.examples, batch.prompt_ids, batch.prompt_mask, out.canvas, batch.completion_mask, out.nfe)


def rollout_ar(policy, task, cfg, examples: list, generator: torch.Generator, max_new_tokens: int | None = None,
               temperature_fn=None) -> Rollout:
    """G completions per prompt, left to right: ``gen_length + 1`` tokens (the grid, then EOS) unless
    ``max_new_tokens`` says otherwise. The completion mask covers the tokens up to and including EOS;
    NFE is the longest completion."""
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)
    comp, mask = policy.generate(batch.prompt_ids, batch.prompt_mask, max_new_tokens or task.gen_length + 1,
                                 temperature=cfg.sampling.temperature, generator=generator,
                                 temperature_fn=temperature_fn)
    return Rollout(batch.examples, batch.prompt_ids, batch.prompt_mask, comp, mask, int(mask.sum(-1).max()))


LossFn = Callable[[torch.Tensor], "tuple[torch.Tensor, dict]"]


@dataclass
class OldScores:
    """Per-token scores of the rollout policy and the reference, one entry per μ update.

    ``old[j]`` ``None`` means "the current policy's own scores, detached" (the first update, ratio 1).
    ``entropy`` ``(B, L)`` detached predictive entropies (``None`` when not requested).
    """

    old: list
    ref: list
    entropy: torch.Tensor | None


class DiffusionScorer:
    """Scores on MaskPlans drawn from the training estimator; one plan per μ update."""

    def __init__(self, policy, ref, estimator, micro_batch: int | None):
        self.policy, self.ref, self.estimator, self.micro_batch = policy, ref, estimator, micro_batch
        self.nfe = estimator.nfe

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False) -> OldScores:
        """Draw the plans; score old (updates 2..μ) and reference (every update) under no grad."""
        self.ro = ro
        self.plans = [self.estimator.make_plan(ro.completion_mask, generator, ro.prompt_mask)
                      for _ in range(num_iterations)]
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        ent = None
        with torch.no_grad():
            old = [None] + [score(self.policy, *args, plan, self.micro_batch).per_token for plan in self.plans[1:]]
            ref = ([score(self.ref, *args, plan, self.micro_batch).per_token for plan in self.plans]
                   if self.ref is not None else [None] * num_iterations)
            if entropy:
                ent = score(self.policy, *args, self.plans[0], self.micro_batch, entropy=True).entropy
        return OldScores(old, ref, ent)

    def backward(self, j: int, loss_fn: LossFn, backward) -> tuple[torch.Tensor, dict]:
        """Score update ``j``'s plan with grad and back-propagate ``loss_fn(per_token)``."""
        ro = self.ro
        loss, metrics, _ = score_and_backward(self.policy, ro.prompt_ids, ro.prompt_mask, ro.completion,
                                              ro.completion_mask, self.plans[j], loss_fn, self.micro_batch,
                                              backward=backward)
        return loss, metrics


class ARScorer:
    """Exact token log-probs; old scores once per rollout batch (the same for every μ update)."""

    def __init__(self, policy, ref):
        self.policy, self.ref = policy, ref
        self.nfe = 1

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False) -> OldScores:
        self.ro = ro
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        with torch.no_grad():
            logp, ent = self.policy.token_logprobs(*args)
            ref = self.ref.token_logprobs(*args)[0] if self.ref is not None else None
        # update 1 uses the current policy's own log-probs (equal to logp_old before any step)
        return OldScores([None] + [logp] * (num_iterations - 1), [ref] * num_iterations, ent if entropy else None)

    def backward(self, j: int, loss_fn: LossFn, backward) -> tuple[torch.Tensor, dict]:
        ro = self.ro
        logp, _ = self.policy.token_logprobs(ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        loss, metrics = loss_fn(logp)
        backward(loss)
        return loss.detach(), metrics
