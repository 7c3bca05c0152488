"""Scoring a rollout batch per policy kind, behind one interface the trainer reads: old (and reference) scores
once per batch (:meth:`prepare`), then one scored backward per optimizer step (:meth:`backward`: μ passes over the
batch, each in ``train.steps_per_generation`` mini-batches of rows).

- ``diffusion`` (:class:`DiffusionScorer`): an estimator's per-token ELBO contributions on
  :class:`~dlmrl.estimators.mask_plan.MaskPlan` s (one fresh plan per μ update, shared by old/new/reference),
  gradients through :func:`~dlmrl.estimators.scoring.score_and_backward`; ``block`` the same with plans drawn per
  block (:func:`~dlmrl.estimators.block_plans.block_rollout_plan`) and scored in composite passes.
- ``ar`` (:class:`ARScorer`): exact token log-probs, the same for every μ update (no plan).

Both give per-token tensors ``(B, L)`` over the completion, so one :class:`GroupObjective` serves both.
:class:`RolloutMismatch` compares the sampler's recorded log-probs with the old-policy scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.estimators import score
from dlmrl.estimators.block_plans import block_rollout_plan
from dlmrl.estimators.scoring import Lockstep, lockstep_sync, score_and_backward
from dlmrl.training.rollout import Rollout

LossFn = Callable[[torch.Tensor], "tuple[torch.Tensor, dict]"]


class RolloutMismatch:
    """The gap between the log-probs a rollout's tokens were drawn with and the exact old-policy scores of the
    same tokens, and its truncated importance-sampling correction.

    With Δ = ``logp_old − logp_rollout`` per token, on the ``valid`` tokens:

    - :meth:`gap`: ``Σ |Δ|``, the token count and ``max |Δ|`` (the trainer logs ``rollout_logp_gap_mean`` and
      ``rollout_logp_gap_max`` from them);
    - :meth:`weights`: ``min(exp(Δ), C)`` per token, 1 off ``valid``, detached: the factor on each token's policy
      loss, once per rollout batch (TRL's ``vllm_importance_sampling_correction`` in its ``token_truncate`` mode,
      cap ``C`` = ``vllm_importance_sampling_cap``; the KL term is not weighted, as there).

    ``logp_old`` is taken once, by :meth:`observe` (the first μ update's detached scores, or with several
    mini-batches the old scores taken before any step: the policy that sampled; later calls keep it). It is the sampler's own distribution only for the
    ``trajectory`` estimator with merge 1 and the sampled order (merged canvases score a token from an earlier
    canvas than it was drawn from; ELBO terms are no token log-probs), which is where the trainer uses this; with
    no cache and no classifier-free guidance the gap is 0 up to float error, threshold decoding or not.

    Args:
        rollout_logp: ``(B, L)`` float, the sampler's recorded log-probs (``Rollout.token_logprobs``).
        valid: ``(B, L)`` bool, the tokens the sampler drew (the completion mask off anchor rows).
        cap: ``C >= 1``, or ``None`` (measure only).
    Raises:
        ValueError: on mismatched shapes or ``cap < 1``.
    Reference: TRL ``GRPOTrainer`` (huggingface/trl ``trl/trainer/grpo_trainer.py``: ``importance_sampling_ratio =
    clamp(exp(old_per_token_logps − sampling_per_token_logps), max=cap)`` multiplying ``per_token_loss``); truncated
    importance sampling for rollout/training mismatch, Yao et al., "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training" (fengyao.notion.site/off-policy-rl).
    """

    def __init__(self, rollout_logp: torch.Tensor, valid: torch.Tensor, cap: float | None = None):
        if rollout_logp.shape != valid.shape:
            raise ValueError(f"rollout_logp {tuple(rollout_logp.shape)} and valid {tuple(valid.shape)} differ")
        if cap is not None and not cap >= 1:
            raise ValueError(f"cap must be >= 1 (or None), got {cap}")
        self.rollout_logp, self.valid, self.cap = rollout_logp.detach().float(), valid.bool(), cap
        self.logp_old: torch.Tensor | None = None
        self._weights: torch.Tensor | None = None

    def observe(self, logp_old: torch.Tensor) -> None:
        """Take the exact old-policy scores ``(B, L)`` (the first call only)."""
        if self.logp_old is not None:
            return
        if logp_old.shape != self.valid.shape:
            raise ValueError(f"logp_old {tuple(logp_old.shape)} must be {tuple(self.valid.shape)}")
        self.logp_old = logp_old.detach().float()
        if self.cap is not None:
            delta = torch.where(self.valid, self.logp_old - self.rollout_logp.to(self.logp_old), 0.0)
            self._weights = torch.exp(delta).clamp(max=self.cap)  # (B, L), 1 off valid

    def _delta(self) -> torch.Tensor:
        if self.logp_old is None:
            raise RuntimeError("RolloutMismatch: observe(logp_old) first")
        return (self.logp_old - self.rollout_logp.to(self.logp_old))[self.valid]

    def gap(self) -> tuple[float, int, float]:
        """``(Σ |Δ|, count, max |Δ|)`` over the valid tokens (``(0, 0, 0)`` when there are none)."""
        d = self._delta().abs().double()
        return (float(d.sum()), int(d.numel()), float(d.max()) if d.numel() else 0.0)

    def weights(self) -> torch.Tensor | None:
        """``(B, L)`` float32 detached loss weights ``min(exp(Δ), C)`` (1 off ``valid``); ``None`` without a cap."""
        if self.cap is not None and self._weights is None:
            raise RuntimeError("RolloutMismatch: observe(logp_old) first")
        return self._weights

    def weight_sum(self) -> float:
        """``Σ`` of the weights over the valid tokens (for their logged mean); 0 without a cap."""
        return float(self._weights[self.valid].double().sum()) if self._weights is not None else 0.0


@dataclass
class OldScores:
    """Per-token scores ``(B, L)`` of the rollout policy and the reference, one entry per μ update.

    ``old[j]`` ``None`` means "the current policy's own scores, detached" (the first update, ratio 1; with several
    mini-batches ``old[0]`` is scored, as later mini-batches of the first pass see a moved policy).
    ``entropy`` ``(B, L)`` detached predictive entropies (``None`` when not requested).
    """

    old: list
    ref: list
    entropy: torch.Tensor | None


class DiffusionScorer:
    """Scores on MaskPlans drawn from the training estimator; one plan per μ update.

    ``nfe`` is the forward passes per row the last batch's first plan ran (:meth:`MaskPlan.forward_passes`:
    the estimator's NFE, fewer where a trajectory has fewer steps or a canvas scores nothing).
    """

    def __init__(self, policy, ref, estimator, micro_batch: int | None, old_scores: bool = True,
                 block_size: int | None = None, logits_chunk: int | None = None, lockstep: Lockstep | None = None):
        self.policy, self.ref, self.estimator, self.micro_batch = policy, ref, estimator, micro_batch
        self.old_scores = old_scores  # (a ratio-free objective reads no old-policy scores)
        self.block_size = block_size  # (a block-diffusion policy: plans drawn per block, scored in composite passes)
        self.nfe = estimator.nfe
        # (estimator.logits_chunk: token log-probs from the output head in chunks; lockstep: processes whose every
        # forward is a collective run the same passes, dlmrl.training.distributed.GradientSync)
        self.logits_chunk, self.lockstep = logits_chunk or None, lockstep

    @property
    def _scoring(self) -> dict:
        return {"logits_chunk": self.logits_chunk, "lockstep": self.lockstep}

    def _plan(self, ro: Rollout, generator: torch.Generator, advantages: torch.Tensor | None):
        if self.block_size is None:
            return self.estimator.rollout_plan(ro.completion_mask, generator, ro.prompt_mask,
                                               reveal_step=ro.reveal_step, advantages=advantages)
        return block_rollout_plan(self.estimator, ro.completion_mask, self.block_size, generator, ro.prompt_mask,
                                  reveal_step=ro.reveal_step, advantages=advantages)

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False,
                rows: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
                minibatches: int = 1) -> OldScores:
        """Draw the plans (:meth:`~dlmrl.estimators.scoring.PlanEstimator.rollout_plan`, with the rollout's
        trajectory and ``advantages`` ``(B,)`` of its rows); score old (updates 2..μ, and the first with
        ``minibatches > 1``) and reference (every update) under no grad.

        ``rows``: ``(n,)`` long, score only these rows of ``ro`` (one process's share); the plans are drawn
        for all of ``ro`` and cut to them, so a row's masks do not depend on which process scores it.
        ``minibatches``: optimizer steps per pass (``train.steps_per_generation``).
        """
        plans = [self._plan(ro, generator, advantages) for _ in range(num_iterations)]
        if rows is not None:
            ro, plans = ro.rows(rows), [plan.rows(rows) for plan in plans]
        self.ro, self.plans = ro, plans
        passes = plans[0].forward_passes()
        self.nfe = int(passes) if passes == int(passes) else round(passes, 3)
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        ent = None
        with torch.no_grad():
            # (the first pass's old scores: needed once a later mini-batch of it sees a moved policy)
            scored = self.plans if minibatches > 1 else self.plans[1:]
            old = [None] * (num_iterations - len(scored)) + [
                score(self.policy, *args, plan, self.micro_batch, **self._scoring).per_token if self.old_scores else None
                for plan in scored]
            ref = ([score(self.ref, *args, plan, self.micro_batch, **self._scoring).per_token for plan in self.plans]
                   if self.ref is not None else [None] * num_iterations)
            if entropy:
                ent = score(self.policy, *args, self.plans[0], self.micro_batch, entropy=True, **self._scoring).entropy
        return OldScores(old, ref, ent)

    def backward(self, j: int, loss_fn: LossFn, backward, rows: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict]:
        """Score update ``j``'s plan with grad and back-propagate ``loss_fn(per_token)``; ``rows`` ``(m,)`` long:
        only these rows of the prepared ones (a mini-batch; ``per_token`` is then ``(m, L)``)."""
        ro, plan = self.ro, self.plans[j]
        if rows is not None:
            ro, plan = ro.rows(rows), plan.rows(rows)
        loss, metrics, _ = score_and_backward(self.policy, ro.prompt_ids, ro.prompt_mask, ro.completion,
                                              ro.completion_mask, plan, loss_fn, self.micro_batch,
                                              backward=backward, **self._scoring)
        return loss, metrics


def train_mode_is_deterministic(model: torch.nn.Module) -> bool:
    """Whether ``model`` computes the same function in training and evaluation mode, as far as its modules and
    configs tell: no dropout module with ``p > 0`` (``torch.nn`` dropouts, peft's LoRA dropout) and no
    ``*dropout*`` / ``*pdrop*`` config field above 0 (transformers models apply attention dropout functionally,
    e.g. Llama's ``attention_dropout``). Batch norm (running statistics) also counts as a difference.

    It reads module types and config fields only: a model that draws random numbers in training mode some other
    way is not detected.

    Args:
        model: any ``torch.nn.Module`` (a transformers model, a peft wrapper, ...).
    Returns:
        ``True`` when nothing found differs between the two modes.
    """
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    configs = {}
    for module in model.modules():
        if isinstance(module, _DropoutNd) and module.p > 0 or isinstance(module, _BatchNorm):
            return False
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            configs[id(config)] = config

    def positive_dropout(d: dict) -> bool:
        for key, value in d.items():
            if isinstance(value, dict) and positive_dropout(value):
                return True
            name = str(key).lower()
            if ("dropout" in name or "pdrop" in name) and isinstance(value, (int, float)) and value > 0:
                return True
        return False

    return not any(positive_dropout(c.to_dict()) for c in configs.values())


class ARScorer:
    """Exact token log-probs; old scores once per rollout batch (the same for every μ update).

    No pass is run whose result the step cannot read. With μ = 1 and one mini-batch the only update's ratio is 1
    by construction (its old scores are its own log-probs, detached), so :meth:`prepare` runs no pass of the
    policy for old scores; it runs one only when μ > 1 or there are several mini-batches (and the objective reads
    old scores), or when the preset needs the rollout policy's entropies. In that last case with μ = 1, one
    mini-batch and ``share_forward``, the entropies come from
    the first update's own forward pass, run by :meth:`prepare` (in training mode, with grad) and
    back-propagated by :meth:`backward`, which then runs no forward of its own; this needs a model whose
    training mode is deterministic (:func:`train_mode_is_deterministic`: otherwise the separate no-grad pass in
    evaluation mode is kept, as the entropies of the rollout policy must not carry a dropout draw).

    Args:
        policy: an ``AutoregressivePolicy`` (``token_logprobs``). ref: the KL reference policy or ``None``.
        old_scores: whether the objective reads old-policy scores (``GroupObjective.needs_old_scores``).
        share_forward: allow the shared forward above (the trainer turns it off with several processes, whose
            gradient synchronisation is tied to the forward pass).
        micro_batch: most rows per forward call (``estimator.micro_batch``; ``None`` = all): scoring with grad then
            takes the two passes of :func:`~dlmrl.estimators.scoring.score_and_backward` over row chunks (no-grad
            log-probs, ``g = ∂loss/∂logp``, then per chunk the surrogate ``Σ g · logp`` with grad), whose gradients
            sum to the whole batch's; no forward is shared then.
        logits_chunk: token log-probs from the output head in chunks of this many positions
            (``estimator.logits_chunk``, :meth:`~dlmrl.models.ar.AutoregressivePolicy.token_logprobs`).
        lockstep: processes whose every forward and backward is a collective (FSDP, DeepSpeed ZeRO) run the same
            number of row chunks, padded with chunks of loss weight 0 (:class:`~dlmrl.estimators.scoring.Lockstep`).
    """

    def __init__(self, policy, ref, old_scores: bool = True, share_forward: bool = True,
                 micro_batch: int | None = None, logits_chunk: int | None = None, lockstep: Lockstep | None = None):
        self.policy, self.ref = policy, ref
        self.old_scores, self.share_forward = old_scores, share_forward and not micro_batch
        self.micro_batch, self.logits_chunk, self.lockstep = micro_batch or None, logits_chunk or None, lockstep
        self.nfe = 1
        self._shared: torch.Tensor | None = None  # (n, L) log-probs with grad of the first update, when shared
        self._deterministic: bool | None = None  # train_mode_is_deterministic(policy.model), computed once

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False,
                rows: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
                minibatches: int = 1) -> OldScores:
        """The reference log-probs (every update) and, where the step reads them, the old log-probs (updates
        2..μ, and every update with ``minibatches > 1``, ``train.steps_per_generation``) and the rollout policy's
        entropies ``(n, L)``, under no grad except for a shared forward (see the class). ``rows``: only these rows
        of ``ro``; ``advantages`` unused (exact log-probs need no plan). With one mini-batch, update 1's old
        scores are ``None``: the current policy's own log-probs, detached."""
        ro = ro if rows is None else ro.rows(rows)
        self.ro, self._shared = ro, None
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        with torch.no_grad():
            ref = self._logprobs(self.ref, args)[0] if self.ref is not None else None
        needs_old = (num_iterations > 1 or minibatches > 1) and self.old_scores
        logp = ent = None
        if entropy and not needs_old and self._can_share(num_iterations, minibatches):
            self.policy.model.train()  # (the mode of the update; the trainer sets it right after anyway)
            with torch.enable_grad():
                self._shared, ent = self.policy.token_logprobs(*args, **self._head())
        elif needs_old or entropy:
            with torch.no_grad():
                logp, ent = self._logprobs(self.policy, args)
        old = [logp if minibatches > 1 else None] + [logp] * (num_iterations - 1)
        return OldScores(old, [ref] * num_iterations, ent if entropy else None)

    def _can_share(self, num_iterations: int, minibatches: int = 1) -> bool:
        if num_iterations != 1 or minibatches != 1 or not self.share_forward:
            return False
        if self._deterministic is None:
            self._deterministic = train_mode_is_deterministic(self.policy.model)
        return self._deterministic

    def backward(self, j: int, loss_fn: LossFn, backward, rows: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict]:
        """Score update ``j`` with grad (or take the forward :meth:`prepare` shared) and back-propagate
        ``loss_fn(logp)``; ``rows`` ``(m,)`` long: only these rows of the prepared ones (a mini-batch)."""
        ro = self.ro if rows is None else self.ro.rows(rows)
        if j == 0 and self._shared is not None and rows is None:
            logp, self._shared = self._shared, None
        else:
            return self._backward_rows(ro, loss_fn, backward)
        loss, metrics = loss_fn(logp)
        backward(loss)
        return loss.detach(), metrics

    def _head(self, entropy: bool = True) -> dict:
        """``token_logprobs``' keywords for ``estimator.logits_chunk`` (none without it: the policy's own
        ``token_logprobs(prompt_ids, prompt_mask, completion, completion_mask)`` is all a scorer needs)."""
        return {"logits_chunk": self.logits_chunk, "entropy": entropy} if self.logits_chunk else {}

    def _passes(self, n: int) -> list[tuple[torch.Tensor, bool]]:
        """``[(rows, real), ...]``: ``n`` rows in chunks of ``micro_batch``, then (with a lockstep) padding chunks
        (row 0 again, ``real`` False) up to the count every process runs."""
        chunks = list(torch.arange(n).split(self.micro_batch or max(n, 1))) if n else []
        passes = [(rows, True) for rows in chunks]
        if self.lockstep is not None:
            agreed = self.lockstep.count(len(chunks))
            if agreed > len(chunks) and not n:
                raise ValueError("a process with no row to score cannot run the passes that keep the processes in "
                                 "step: give every process at least one row")
            passes += [(torch.zeros(1, dtype=torch.long), False)] * (agreed - len(chunks))
        return passes

    def _logprobs(self, policy, args: tuple, passes: list | None = None, entropy: bool = True):
        """``policy``'s token log-probs and entropies ``(n, L)`` of the rows ``args`` = ``(prompt_ids, prompt_mask,
        completion, completion_mask)``, in the row chunks of :meth:`_passes` (padding chunks run, dropped)."""
        passes = self._passes(len(args[0])) if passes is None else passes
        if len(passes) == 1 and passes[0][1]:
            return policy.token_logprobs(*args, **self._head(entropy))
        logp = ent = None
        for rows, real in passes:
            part = policy.token_logprobs(*(a[rows] for a in args), **self._head(entropy))
            if not real:
                continue
            if logp is None:
                logp = part[0].new_zeros(args[2].shape)
                ent = part[0].new_zeros(args[2].shape) if entropy else None
            logp[rows] = part[0]
            if entropy:
                ent[rows] = part[1]
        return logp, ent

    def _backward_rows(self, ro: Rollout, loss_fn: LossFn, backward) -> tuple[torch.Tensor, dict]:
        """Back-propagate ``loss_fn(logp)`` of the rows ``ro``: one pass with grad when they fit in one chunk on
        every process, else the two-pass surrogate over row chunks (see the class)."""
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        passes = self._passes(len(ro))
        if len(passes) <= 1:
            logp, _ = self.policy.token_logprobs(*args, **self._head(False))
            loss, metrics = loss_fn(logp)
            with lockstep_sync(self.lockstep, last=True):
                backward(loss)
            return loss.detach(), metrics
        with torch.no_grad():
            values, _ = self._logprobs(self.policy, args, passes, entropy=False)
        leaf = values.detach().requires_grad_(True)
        loss, metrics = loss_fn(leaf)
        (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
        grad = torch.zeros_like(leaf) if grad is None else grad.detach()  # (n, L) ∂loss/∂logp
        for k, (rows, real) in enumerate(passes):
            logp, _ = self.policy.token_logprobs(*(a[rows] for a in args), **self._head(False))
            surrogate = (logp * grad[rows].to(logp.dtype)).sum() if real else logp.sum() * 0
            with lockstep_sync(self.lockstep, last=k == len(passes) - 1):
                backward(surrogate)
        return loss.detach(), metrics
