"""Rollout and scoring per policy kind, behind one structure the trainer reads.

- ``diffusion``: the masked-diffusion sampler; scores are an estimator's per-token ELBO contributions
  on :class:`~dlmrl.estimators.mask_plan.MaskPlan` s (one fresh plan per μ update, shared by
  old/new/reference), gradients through :func:`~dlmrl.estimators.scoring.score_and_backward`.
- ``ar``: ``AutoregressivePolicy.generate``; scores are exact token log-probs (``token_logprobs``),
  the same for every μ update (no plan).

Both return per-token tensors ``(B, L)`` over the completion, so one :class:`GroupObjective` serves both.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dlmrl.estimators import score
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.models.sampler import generate


@dataclass
class Rollout:
    """A rollout batch of ``B`` rows, each in a prompt group (sampled: ``prompts · G`` rows, groups of G consecutive
    rows).

    Attributes:
        examples: the task examples, one per row.
        prompt_ids, prompt_mask: ``(B, P)`` long / bool, left-padded.
        completion, completion_mask: ``(B, L)`` long / bool, the scored completion tokens.
        nfe: forward passes per sequence spent sampling (summed over every sampling call that made
            the batch: DAPO's extra rounds, the turns of an episode); with threshold decoding, where rows take
            different numbers of passes, the mean over the call's rows (an int when whole, else rounded to 3
            places).
        group_ids: ``(B,)`` long prompt-group id of each row, always set by whoever builds the rollout (the
            samplers: ``arange(B) // G``; DaGRPO's anchors join their group; episodes: the question's). Rows of
            one group share an id; nothing reads more than which rows share one and the order of the ids.
        trajectory_ids: ``(B,)`` long trajectory id of each row (Flow-GRPO: the turns of one episode
            share it); ``None`` = every row its own trajectory.
        anchor: ``(B,)`` bool, off-policy anchor rows (DaGRPO); ``None`` = none.
        rewards: ``(B,)`` float32 task rewards (episodes: the trajectory's final reward on each turn).
        train_rewards: ``(B,)`` float32 rewards the advantages see (task reward plus shaping).
        passes: sequence forward passes spent sampling (each sampling call's rows × its NFE, summed);
            ``None`` = ``B · nfe`` (one call that sampled every row). See :meth:`sampling_passes`.
        reveal_step: ``(B, L)`` long, the diffusion sampler's trajectory: the step that revealed each completion
            token (:attr:`dlmrl.models.sampler.SampleOutput.reveal_step`; -1 where it wrote nothing). DaGRPO's
            anchor rows, which no sampler wrote, get the left-to-right order in the sampler's schedule
            (:func:`dlmrl.models.sampler.left_to_right_reveal_steps`). ``None`` for AR rollouts.
        token_logprobs: ``(B, L)`` float32, the log-prob each completion token was drawn with
            (:attr:`dlmrl.models.sampler.SampleOutput.token_logprobs`: the sampler's distribution at the sampling
            temperature, mask token excluded; 0 where it wrote nothing and on anchor rows). ``None`` for AR
            rollouts.
        row_nfe: ``(B,)`` long forward passes each row took part in while sampling
            (:attr:`~dlmrl.models.sampler.SampleOutput.row_nfe`; 0 on anchor rows). ``None`` for AR rollouts.
        reward_parts: ``(B, F)`` float32, each reward function's value (NaN where it returned ``None``) when the
            task's reward is a sum of reward functions (:class:`~dlmrl.rewards.functions.ScoresEachReward`);
            ``None`` otherwise (and on rollouts with anchor rows).
    """

    examples: list
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion: torch.Tensor
    completion_mask: torch.Tensor
    nfe: int
    group_ids: torch.Tensor
    trajectory_ids: torch.Tensor | None = None
    anchor: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    train_rewards: torch.Tensor | None = None
    passes: int | None = None
    reveal_step: torch.Tensor | None = None
    token_logprobs: torch.Tensor | None = None
    row_nfe: torch.Tensor | None = None
    reward_parts: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.completion)

    #: the per-row tensor fields (``None`` allowed), which :meth:`rows` and :meth:`to` map
    _TENSORS = ("prompt_ids", "prompt_mask", "completion", "completion_mask", "group_ids", "trajectory_ids",
                "anchor", "rewards", "train_rewards", "reveal_step", "token_logprobs", "row_nfe", "reward_parts")

    def _map(self, fn, **changes) -> Rollout:
        """A copy with ``fn`` applied to every per-row tensor field and the ``changes`` made."""
        mapped = {n: None if getattr(self, n) is None else fn(getattr(self, n)) for n in self._TENSORS}
        return dataclasses.replace(self, **mapped, **changes)

    def rows(self, index: torch.Tensor) -> Rollout:
        """The rows ``index`` (an ``(n,)`` long tensor), every per-row field included (``passes``, a count
        over the sampled batch, is not carried over)."""
        return self._map(lambda t: t[index], examples=[self.examples[i] for i in index.tolist()], passes=None)

    def to(self, device: torch.device | str) -> Rollout:
        """The same rows with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def sampling_passes(self) -> int:
        """Sequence forward passes spent sampling: ``passes``, else ``B · nfe``."""
        return self.passes if self.passes is not None else len(self) * self.nfe

    def trajectories(self) -> torch.Tensor:
        """``(B,)`` long trajectory ids: ``trajectory_ids``, else ``arange(B)`` (one row, one trajectory)."""
        if self.trajectory_ids is not None:
            return self.trajectory_ids
        return torch.arange(len(self), device=self.completion.device)

    def anchors(self) -> torch.Tensor:
        """``(B,)`` bool anchor flags (all False when ``anchor`` is ``None``)."""
        if self.anchor is not None:
            return self.anchor
        return torch.zeros(len(self), dtype=torch.bool, device=self.completion.device)

    @staticmethod
    def cat(parts: Sequence[Rollout], pad_id: int) -> Rollout:
        """The rows of ``parts`` one after another.

        Prompts are left-padded (``pad_id``, mask False) to the longest; completions must have the same
        width. Group and trajectory ids are renumbered so rows of different parts never share one (each part's
        group ids first made 0, 1, ... in their order, so kept rows of a sampled batch number as a fresh one); NFE
        and sampling passes add up; ``anchor`` / ``rewards`` / ``train_rewards`` / ``reveal_step`` /
        ``token_logprobs`` / ``row_nfe`` / ``reward_parts`` must be set on every part or on none (``anchor``: a
        missing one means no anchors).

        Raises:
            ValueError: on no parts, different completion widths, or rewards set on some parts only.
        """
        if not parts:
            raise ValueError("Rollout.cat needs at least one part")
        if len({p.completion.shape[1] for p in parts}) > 1:
            raise ValueError(f"completion widths differ: {[p.completion.shape[1] for p in parts]}")
        width = max(p.prompt_ids.shape[1] for p in parts)

        def left_pad(t, value):
            return torch.cat([t.new_full((len(t), width - t.shape[1]), value), t], dim=1)

        def ids(get):
            out, offset = [], 0
            for p in parts:
                i = get(p)
                out.append(i + offset)
                offset += int(i.max()) + 1 if len(i) else 0
            return torch.cat(out)

        def optional(name):
            have = [getattr(p, name) is not None for p in parts]
            if any(have) and not all(have):
                raise ValueError(f"Rollout.cat: {name} is set on some parts only")
            return torch.cat([getattr(p, name) for p in parts]) if all(have) else None

        return Rollout(
            [e for p in parts for e in p.examples],
            torch.cat([left_pad(p.prompt_ids, pad_id) for p in parts]),
            torch.cat([left_pad(p.prompt_mask, False) for p in parts]),
            torch.cat([p.completion for p in parts]), torch.cat([p.completion_mask for p in parts]),
            sum(p.nfe for p in parts),
            ids(lambda p: torch.unique(p.group_ids, return_inverse=True)[1]),  # (each part's groups 0, 1, ...)
            ids(lambda p: p.trajectories()) if any(p.trajectory_ids is not None for p in parts) else None,
            torch.cat([p.anchors() for p in parts]) if any(p.anchor is not None for p in parts) else None,
            optional("rewards"), optional("train_rewards"), sum(p.sampling_passes() for p in parts),
            optional("reveal_step"), optional("token_logprobs"), optional("row_nfe"),
            reward_parts=optional("reward_parts"),
        )


def mean_nfe(row_nfe: torch.Tensor) -> int | float:
    """The mean of ``(B,)`` per-row forward passes: an int when whole (always without threshold decoding, where
    every row takes part in every pass), else rounded to 3 places; 0 for no rows."""
    if not len(row_nfe):
        return 0
    mean = float(row_nfe.double().mean())
    return int(mean) if mean == int(mean) else round(mean, 3)


def consecutive_groups(num_rows: int, num_generations: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(num_rows,)`` long group ids of rows in consecutive groups of G: ``arange(num_rows) // G``."""
    return torch.arange(num_rows, device=device) // num_generations


def _prompt_rows(num_prompts: int, G: int, prompts: tuple[int, int] | None) -> slice:
    """The completion rows of prompts ``[lo, hi)`` (all of them when ``prompts`` is None)."""
    lo, hi = (0, num_prompts) if prompts is None else prompts
    if not 0 <= lo <= hi <= num_prompts:
        raise ValueError(f"prompts ({lo}, {hi}) must lie in the batch's {num_prompts} prompts")
    return slice(lo * G, hi * G)


def rollout_diffusion(policy, task, cfg, examples: list, generator: torch.Generator,
                      prompts: tuple[int, int] | None = None) -> Rollout:
    """G completions per prompt from the masked-diffusion sampler (``sampling`` section); the completion
    mask is the task's (e.g. the blank cells in infill mode).

    ``prompts = (lo, hi)``: sample only the completions of prompts ``[lo, hi)`` (one process's share), each
    with the random numbers it has in the whole batch (the sampler's ``rows``); an empty share still runs the
    sampler on one row, which it drops, so that ``generator`` advances as on the other processes.

    The rollout carries the sampler's record: ``reveal_step``, ``token_logprobs`` and ``row_nfe``; with threshold
    decoding (``sampling.threshold`` / ``threshold_factor``) ``nfe`` is the mean of ``row_nfe`` and ``passes``
    their sum.
    """
    s = cfg.sampling
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)  # the whole batch
    keep = _prompt_rows(len(examples), cfg.train.num_generations, prompts)
    rows = None if prompts is None else (keep.start, keep.stop) if keep.stop > keep.start else (0, 1)
    out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                   block_length=s.block_length, steps=s.steps, temperature=s.temperature, remasking=s.remasking,
                   cfg_scale=s.cfg_scale, canvas=batch.canvas, generator=generator, rows=rows,
                   threshold=s.threshold, threshold_factor=s.threshold_factor, cache=s.cache)
    n = len(out.canvas) if keep.stop > keep.start else 0  # (an empty share drops the one row it ran)
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], out.canvas[:n],
                   batch.completion_mask[keep], mean_nfe(out.row_nfe[:n]) if s.adaptive else out.nfe,
                   consecutive_groups(n, cfg.train.num_generations, out.canvas.device),
                   passes=int(out.row_nfe[:n].sum()), reveal_step=out.reveal_step[:n],
                   token_logprobs=out.token_logprobs[:n], row_nfe=out.row_nfe[:n])


def rollout_ar(policy, task, cfg, examples: list, generator: torch.Generator, max_new_tokens: int | None = None,
               temperature_fn=None, prompts: tuple[int, int] | None = None) -> Rollout:
    """G completions per prompt, left to right: ``gen_length + 1`` tokens (the grid, then EOS) unless
    ``max_new_tokens`` says otherwise. The completion mask covers the tokens up to and including EOS;
    NFE is the longest completion.

    ``prompts = (lo, hi)``: sample only the completions of prompts ``[lo, hi)`` (one process's share), each
    with the random numbers it has in the whole batch (``noise_rows`` of ``policy.generate``); an empty share
    draws the sampling seed only, so that ``generator`` advances as on the other processes.
    """
    from dlmrl.models.ar import draw_seed

    length = max_new_tokens or task.gen_length + 1
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)  # the whole batch
    keep = _prompt_rows(len(examples), cfg.train.num_generations, prompts)
    if keep.stop == keep.start:
        draw_seed(generator)
        empty = batch.prompt_ids.new_zeros((0, length))
        return Rollout([], batch.prompt_ids[keep], batch.prompt_mask[keep], empty, empty.bool(), 0,
                       consecutive_groups(0, cfg.train.num_generations, empty.device))
    extra = {} if prompts is None else {"noise_rows": (keep.start, len(batch.examples))}
    comp, mask = policy.generate(batch.prompt_ids[keep], batch.prompt_mask[keep], length,
                                 temperature=cfg.sampling.temperature, generator=generator,
                                 temperature_fn=temperature_fn, **extra)
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], comp, mask,
                   int(mask.sum(-1).max()), consecutive_groups(len(comp), cfg.train.num_generations, comp.device))


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

    ``logp_old`` is taken once, by :meth:`observe` (the first μ update's detached scores, i.e. the policy that
    sampled before any step; later calls keep it). It is the sampler's own distribution only for the
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
    """Per-token scores of the rollout policy and the reference, one entry per μ update.

    ``old[j]`` ``None`` means "the current policy's own scores, detached" (the first update, ratio 1).
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

    def __init__(self, policy, ref, estimator, micro_batch: int | None, old_scores: bool = True):
        self.policy, self.ref, self.estimator, self.micro_batch = policy, ref, estimator, micro_batch
        self.old_scores = old_scores  # (a ratio-free objective reads no old-policy scores)
        self.nfe = estimator.nfe

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False,
                rows: torch.Tensor | None = None, advantages: torch.Tensor | None = None) -> OldScores:
        """Draw the plans (:meth:`~dlmrl.estimators.scoring.PlanEstimator.rollout_plan`, with the rollout's
        trajectory and ``advantages`` ``(B,)`` of its rows); score old (updates 2..μ) and reference (every
        update) under no grad.

        ``rows``: ``(n,)`` long, score only these rows of ``ro`` (one process's share); the plans are drawn
        for all of ``ro`` and cut to them, so a row's masks do not depend on which process scores it.
        """
        plans = [self.estimator.rollout_plan(ro.completion_mask, generator, ro.prompt_mask,
                                             reveal_step=ro.reveal_step, advantages=advantages)
                 for _ in range(num_iterations)]
        if rows is not None:
            ro, plans = ro.rows(rows), [plan.rows(rows) for plan in plans]
        self.ro, self.plans = ro, plans
        passes = plans[0].forward_passes()
        self.nfe = int(passes) if passes == int(passes) else round(passes, 3)
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        ent = None
        with torch.no_grad():
            old = [None] + [score(self.policy, *args, plan, self.micro_batch).per_token if self.old_scores else None
                            for plan in self.plans[1:]]
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

    No pass is run whose result the step cannot read. With μ = 1 the only update's ratio is 1 by construction
    (its old scores are its own log-probs, detached), so :meth:`prepare` runs no pass of the policy for old
    scores; it runs one only when μ > 1 (and the objective reads old scores) or when the preset needs the
    rollout policy's entropies. In that last case with μ = 1 and ``share_forward``, the entropies come from
    the first update's own forward pass, run by :meth:`prepare` (in training mode, with grad) and
    back-propagated by :meth:`backward`, which then runs no forward of its own; this needs a model whose
    training mode is deterministic (:func:`train_mode_is_deterministic`: otherwise the separate no-grad pass in
    evaluation mode is kept, as the entropies of the rollout policy must not carry a dropout draw).

    Args:
        policy: an ``AutoregressivePolicy`` (``token_logprobs``). ref: the KL reference policy or ``None``.
        old_scores: whether the objective reads old-policy scores (``GroupObjective.needs_old_scores``).
        share_forward: allow the shared forward above (the trainer turns it off with several processes, whose
            gradient synchronisation is tied to the forward pass).
    """

    def __init__(self, policy, ref, old_scores: bool = True, share_forward: bool = True):
        self.policy, self.ref = policy, ref
        self.old_scores, self.share_forward = old_scores, share_forward
        self.nfe = 1
        self._shared: torch.Tensor | None = None  # (n, L) log-probs with grad of the first update, when shared
        self._deterministic: bool | None = None  # train_mode_is_deterministic(policy.model), computed once

    def prepare(self, ro: Rollout, num_iterations: int, generator: torch.Generator, entropy: bool = False,
                rows: torch.Tensor | None = None, advantages: torch.Tensor | None = None) -> OldScores:
        """The reference log-probs (every update) and, where the step reads them, the old log-probs (updates
        2..μ) and the rollout policy's entropies ``(n, L)``, under no grad except for a shared forward (see the
        class). ``rows``: only these rows of ``ro``; ``advantages`` unused (exact log-probs need no plan).
        Update 1's old scores are ``None``: the current policy's own log-probs, detached."""
        ro = ro if rows is None else ro.rows(rows)
        self.ro, self._shared = ro, None
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        with torch.no_grad():
            ref = self.ref.token_logprobs(*args)[0] if self.ref is not None else None
        needs_old = num_iterations > 1 and self.old_scores
        logp = ent = None
        if entropy and not needs_old and self._can_share(num_iterations):
            self.policy.model.train()  # (the mode of the update; the trainer sets it right after anyway)
            with torch.enable_grad():
                self._shared, ent = self.policy.token_logprobs(*args)
        elif needs_old or entropy:
            with torch.no_grad():
                logp, ent = self.policy.token_logprobs(*args)
        old = [None] + [logp] * (num_iterations - 1)
        return OldScores(old, [ref] * num_iterations, ent if entropy else None)

    def _can_share(self, num_iterations: int) -> bool:
        if num_iterations != 1 or not self.share_forward:
            return False
        if self._deterministic is None:
            self._deterministic = train_mode_is_deterministic(self.policy.model)
        return self._deterministic

    def backward(self, j: int, loss_fn: LossFn, backward) -> tuple[torch.Tensor, dict]:
        """Score update ``j`` with grad (or take the forward :meth:`prepare` shared) and back-propagate
        ``loss_fn(logp)``."""
        ro = self.ro
        if j == 0 and self._shared is not None:
            logp, self._shared = self._shared, None
        else:
            logp, _ = self.policy.token_logprobs(ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        loss, metrics = loss_fn(logp)
        backward(loss)
        return loss.detach(), metrics


# -- DAPO dynamic sampling ---------------------------------------------------------------------

#: seed stride of DAPO's extra rounds: round r of a step draws ``task.train_batch(n, seed + r·stride, step)``
ROUND_SEED_STRIDE = 1_000_003


def example_key(example) -> str:
    """A key that tells examples apart (their ``repr``; dataclass examples print every field)."""
    return repr(example)


def fresh_prompts(task, n: int, seed: int, step: int, round_index: int, seen: set[str]) -> list:
    """Up to ``n`` training examples for extra round ``round_index`` (>= 1) of ``step``, none drawn before.

    The batch is ``task.train_batch(n, seed + round_index · ROUND_SEED_STRIDE, step)`` (a stream no main
    batch of the run uses, so the draw is a deterministic function of (seed, step, round)); examples whose
    key is in ``seen`` are left out, and the kept ones are added to ``seen`` (so a round may bring fewer
    than ``n``, possibly none).
    """
    out = []
    for e in task.train_batch(n, seed + round_index * ROUND_SEED_STRIDE, step):
        key = example_key(e)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


@dataclass
class SamplingStats:
    """What sampling one step's batch cost and found.

    Attributes:
        rounds: rollout rounds (1 + DAPO's extra rounds).
        completions: sequences sampled over every round (episodes: every turn's response).
        groups_dropped: groups left out because their rewards were all equal (DAPO).
        nfe: forward passes per sequence spent sampling, summed over the rounds (each round's mean over its rows
            with threshold decoding, so possibly fractional).
        passes: sequence forward passes spent sampling (rows × NFE of every sampling call, summed; what
            the sampling cost in forward passes over one sequence, unlike ``completions · nfe``).
        rewards: ``(N,)`` float32 task rewards of every sampled completion of every round (episodes:
            one final reward per trajectory), for logging.
        reward_parts: ``(N, F)`` float32 each reward function's values on those completions (NaN: ``None``),
            when the rollouts carry them (:attr:`Rollout.reward_parts`), for logging; else ``None``.
    """

    rounds: int
    completions: int
    groups_dropped: int
    nfe: int | float
    passes: int
    rewards: torch.Tensor
    reward_parts: torch.Tensor | None = None


def fill_informative_groups(first: Rollout, sample_more: Callable[[int], Rollout | None], num_groups: int,
                            num_generations: int, max_extra_rounds: int, pad_id: int) -> tuple[Rollout, SamplingStats]:
    """DAPO's dynamic sampling: keep only groups whose rewards differ, sampling new prompts until there are
    ``num_groups`` of them or ``max_extra_rounds`` extra rounds are spent.

    Each round's groups are kept in order while fewer than ``num_groups`` are kept (informative groups past
    that are surplus and left out, as verl's DAPO recipe truncates); a short batch after the last round is
    returned as it is (the caller logs it). The filter reads ``train_rewards`` (what the advantages see:
    a group of equal rewards has zero advantage; :func:`dlmrl.objectives.shaping.dynamic_sampling_keep`).

    Args:
        first: round 0, ``prompts · G`` rows in consecutive groups of G with ``rewards`` and
            ``train_rewards`` set.
        sample_more: ``round -> Rollout`` like ``first`` for new prompts (rounds 1, 2, ...), or ``None``
            when no new prompt could be drawn (the round still counts).
        num_groups: informative groups wanted (``prompts_per_step``). num_generations: G.
        max_extra_rounds: most extra rounds (0 = drop only).
        pad_id: prompt padding id when rounds' prompts differ in length.
    Returns:
        The kept rows (at most ``num_groups · G``, consecutive groups of G, ``nfe`` summed over the
        rounds) and the :class:`SamplingStats`.

    Reference: DAPO arXiv 2503.14476 §3.2 (dynamic sampling; verl's ``max_num_gen_batches`` bound).
    """
    from dlmrl.objectives.shaping import dynamic_sampling_keep

    G = num_generations
    parts, rewards, reward_parts = [], [], []
    kept = dropped = completions = nfe = passes = 0
    ro, rounds = first, 1
    while True:
        if ro is not None and len(ro):
            completions, nfe, passes = completions + len(ro), nfe + ro.nfe, passes + ro.sampling_passes()
            rewards.append(ro.rewards)
            reward_parts.append(ro.reward_parts)
            keep = dynamic_sampling_keep(ro.train_rewards, G)  # (prompts,)
            dropped += int((~keep).sum())
            take = torch.nonzero(keep).squeeze(-1)[: num_groups - kept]
            if len(take):
                parts.append(ro.rows((take[:, None] * G + torch.arange(G)).flatten()))
                kept += len(take)
        if kept >= num_groups or rounds > max_extra_rounds:
            break
        ro, rounds = sample_more(rounds), rounds + 1
    out = Rollout.cat(parts, pad_id) if parts else first.rows(torch.zeros(0, dtype=torch.long))
    out.nfe, out.passes = nfe, passes
    stats = SamplingStats(rounds, completions, dropped, nfe, passes, torch.cat(rewards) if rewards else torch.zeros(0),
                          torch.cat(reward_parts) if reward_parts and all(p is not None for p in reward_parts)
                          else None)
    return out, stats


# -- DaGRPO off-policy anchors -----------------------------------------------------------------


def first_rows(ids: list) -> list[int]:
    """The index of the first row of each id, in order of first appearance (``[5, 5, 2, 5, 2] -> [0, 2]``)."""
    first: dict = {}
    for i, x in enumerate(ids):
        first.setdefault(x, i)
    return list(first.values())


def add_anchors(ro: Rollout, task, anchor_threshold: float, kind: str, eos_token_id: int | None, pad_id: int,
                shape: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                reveal_steps: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[Rollout, int]:
    """DaGRPO's off-policy anchors: each group with no task reward above ``anchor_threshold`` gets the
    example's reference solution as one extra row (``anchor`` True, same group id, same prompt).

    The anchor completion is the reference text tokenized as the policy writes it: ``ar``: its tokens then
    EOS, padded with ``pad_id`` to the rollout's width (mask up to and including EOS); ``diffusion``: the
    solution laid on the canvas from its first position (a shorter text followed by EOS, as the sampler
    fills a canvas after the answer), taken at the row's completion positions and the rollout's canvas kept
    elsewhere (Sudoku infill: the 16 cells, givens unchanged), mask = the row's completion mask. Its reward is the task's reward of that
    completion (``shape(rewards, lengths)`` gives its ``train_rewards``). Groups whose example has no
    reference (``task.reference_solution`` ``None``) get none; a reference longer than the completion
    (AR: with EOS) is left out with a warning.

    Args:
        ro: the rollout with ``rewards`` and ``train_rewards``. anchor_threshold: the cut (DaGRPO: 0).
        kind: ``"ar"`` | ``"diffusion"``.
        eos_token_id: appended to AR anchors, fills a diffusion canvas after a short reference (``None``:
            nothing appended; ``pad_id`` fills). pad_id: AR padding.
        shape: ``(rewards (n,), lengths (n,)) -> (n,)`` training rewards of the ``n`` anchors.
        reveal_steps: ``completion_mask (n, L) -> (n, L)`` the anchors' trajectory when ``ro`` carries one
            (the trainer: :func:`dlmrl.models.sampler.left_to_right_reveal_steps` with the sampler's schedule).
    Returns:
        The rollout with the anchor rows appended (``group_ids``, ``trajectory_ids`` and ``anchor`` set)
        and the number of anchors added.
    Warns:
        UserWarning: references too long for the completion (left out).

    Reference: DaGRPO arXiv 2512.06337 (off-policy data augmentation), **(dlmrl interpretation)**.
    """
    from dlmrl.objectives.pairwise import groups_needing_anchor

    groups = ro.group_ids
    need = groups_needing_anchor(ro.rewards, groups, anchor_threshold)  # (B,)
    needed = need.tolist()  # (the same on every row of a group)
    firsts = [i for i in first_rows(groups.tolist()) if needed[i]]
    L = ro.completion.shape[1]
    rows, comps, masks, too_long = [], [], [], 0
    fill = eos_token_id if eos_token_id is not None else pad_id
    for i in firsts:
        text = task.reference_solution(ro.examples[i])
        if text is None:
            continue
        ids = task.tokenizer(text, add_special_tokens=False)["input_ids"]
        if kind == "ar":
            ids = ids + ([eos_token_id] if eos_token_id is not None else [])
            if len(ids) > L:
                too_long += 1
                continue
            comp = torch.full((L,), pad_id, dtype=ro.completion.dtype)
            comp[: len(ids)] = torch.tensor(ids)
            mask = torch.arange(L) < len(ids)
        else:
            if len(ids) > L:
                too_long += 1
                continue
            mask = ro.completion_mask[i].cpu()
            canvas = torch.tensor(ids + [fill] * (L - len(ids)), dtype=ro.completion.dtype)  # (L,)
            comp = torch.where(mask, canvas, ro.completion[i].cpu())
        rows.append(i)
        comps.append(comp)
        masks.append(mask)
    if too_long:
        warnings.warn(f"DaGRPO anchors: {too_long} reference solution(s) longer than the {L}-token completion "
                      "left out", UserWarning, stacklevel=2)
    if not rows:
        return ro, 0
    dev = ro.completion.device
    index = torch.tensor(rows, device=dev)
    comp, mask = torch.stack(comps).to(dev), torch.stack(masks).to(dev)  # (n, L)
    examples = [ro.examples[i] for i in rows]
    rewards = torch.tensor(task.rewards(examples, task.decode(comp)), dtype=torch.float32)
    train = shape(rewards, mask.sum(-1).cpu()).float()
    trajs = ro.trajectories()
    n = len(rows)
    steps = None
    if ro.reveal_step is not None:
        if reveal_steps is None:
            raise ValueError("add_anchors: the rollout carries reveal steps; pass reveal_steps for the anchors")
        steps = torch.cat([ro.reveal_step, reveal_steps(mask).to(ro.reveal_step)])
    # (no sampler drew the anchors: no recorded log-probs, no sampling passes)
    logps = None if ro.token_logprobs is None else torch.cat([ro.token_logprobs, ro.token_logprobs.new_zeros(n, L)])
    row_nfe = None if ro.row_nfe is None else torch.cat([ro.row_nfe, ro.row_nfe.new_zeros(n)])
    out = Rollout(
        ro.examples + examples, torch.cat([ro.prompt_ids, ro.prompt_ids[index]]),
        torch.cat([ro.prompt_mask, ro.prompt_mask[index]]), torch.cat([ro.completion, comp]),
        torch.cat([ro.completion_mask, mask]), ro.nfe, torch.cat([groups, groups[index]]),
        torch.cat([trajs, int(trajs.max()) + 1 + torch.arange(n, device=trajs.device)]),
        torch.cat([ro.anchors(), torch.ones(n, dtype=torch.bool, device=dev)]),
        torch.cat([ro.rewards, rewards.to(ro.rewards)]), torch.cat([ro.train_rewards, train.to(ro.train_rewards)]),
        ro.sampling_passes(), steps, logps, row_nfe)
    return out, n
