"""Steps 3–5 of a training step: advantages and the rows worth scoring, the old (and reference) scores, and the μ
inner updates, each on the loss the preset's :class:`~dlmrl.objectives.objective.GroupObjective` gives.

Several processes each score their share of the groups, weighted so that the average of the processes' losses
is the loss of the whole batch (:func:`dlmrl.training.distributed.loss_share`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from dlmrl.objectives.advantage_registry import AdvantageInputs
from dlmrl.objectives.entropy import hapo_entropy_stats
from dlmrl.objectives.objective import GroupObjective
from dlmrl.objectives.pairwise import ngram_jaccard
from dlmrl.objectives.segments import sentence_segments
from dlmrl.training.distributed import Processes, group_share, loss_share
from dlmrl.training.rollout import Rollout
from dlmrl.training.scorers import RolloutMismatch

#: the objective's metrics averaged over a step's μ updates (and combined over processes); ``kl`` is the KL estimate,
#: ``kl_loss`` the KL term the loss used (k3 evaluated at |Δ| ≤ 20 nats: below ``kl`` once a ratio passes that)
UPDATE_METRICS = ("loss", "ratio_mean", "ratio_min", "ratio_max", "clip_frac_low", "clip_frac_high", "kl", "kl_loss")


def group_loss_fn(objective: GroupObjective, old: torch.Tensor | None, advantages: torch.Tensor,
                  mask: torch.Tensor, row_weight: float = 1.0, mismatch: RolloutMismatch | None = None, **inputs):
    """The loss of one μ update as a function of the current policy's per-token scores.

    Returns ``per_token (B', L) -> (row_weight · objective(per_token, old, advantages, mask, **inputs),
    metrics)``; ``old`` ``None`` (the first update, where old = current) uses ``per_token`` detached
    (ratio 1). ``inputs`` are :meth:`GroupObjective.compute`'s keyword inputs (``logp_ref``, ``entropy``,
    ``segment_ids``, ``group_ids``, ``num_tokens``). With the ``gdpo`` preset this is
    :func:`dlmrl.objectives.gdpo_loss` on ``per_token.sum(-1)``. ``mismatch``: the old-policy scores it uses are
    given to :meth:`RolloutMismatch.observe` (the first update's are kept), and with a cap its weights
    ``min(exp(logp_old − logp_rollout), C)`` multiply each token's policy loss (``weights`` of the objective).
    """
    def loss_fn(per_token: torch.Tensor):
        logp_old = per_token.detach() if old is None else old
        extra = inputs
        if mismatch is not None:
            mismatch.observe(logp_old)
            w = mismatch.weights()
            if w is not None:
                extra = {**inputs, "weights": w.to(per_token.dtype)}
        loss, metrics = objective(per_token, logp_old, advantages, mask, **extra)
        return loss * row_weight, metrics

    return loss_fn


def measures_rollout_mismatch(scorer) -> bool:
    """Whether the scorer's old-policy scores are log-probs of the distribution the sampler drew from: the
    ``trajectory`` estimator with merge 1 and the sampled order (the trainer then logs the rollout log-prob gap
    and may correct it, ``train.rollout_is_cap``). Merged canvases (merge > 1) score a token from an earlier canvas
    than the one it was drawn from, and the ELBO estimators' per-token terms are no token log-probs, so the gap is
    not defined there (not logged)."""
    from dlmrl.estimators.trajectory import Trajectory

    est = getattr(scorer, "estimator", None)
    return isinstance(est, Trajectory) and est.merge == 1 and est.order == "sampled"


def mismatch_metrics(mismatch: RolloutMismatch | None, processes: Processes, cap: float | None) -> dict:
    """The step's ``rollout_logp_gap_mean`` / ``rollout_logp_gap_max`` (mean and max ``|logp_old − logp_rollout|``
    per sampled token of the scored rows, over every process) and, with a cap, ``rollout_is_weight_mean``;
    ``None`` values when no token was scored. ``mismatch`` ``None``: this process scored no rows of its own."""
    part = ((*mismatch.gap(), mismatch.weight_sum()) if mismatch is not None and mismatch.logp_old is not None
            else (0.0, 0, 0.0, 0.0))
    parts = processes.gather(part)
    total, count = sum(p[0] for p in parts), sum(p[1] for p in parts)
    out = {"rollout_logp_gap_mean": total / count if count else None,
           "rollout_logp_gap_max": max(p[2] for p in parts if p[1]) if count else None}
    if cap is not None:
        out["rollout_is_weight_mean"] = sum(p[3] for p in parts) / count if count else None
    return out


@dataclass
class UpdateBatch:
    """What the μ updates of one step train on (:func:`prepare_update`); ``n`` is the number of rows this process
    scores, ``L`` the completion length.

    Attributes:
        rows: ``(n_kept,)`` long, the rows of the rollout batch scored (all processes together).
        mine: this process's share of them (a :class:`Rollout` of ``n`` rows).
        old: the old (and reference) scores (:meth:`DiffusionScorer.prepare` / :meth:`ARScorer.prepare`), or
            ``None`` when no row carries a signal (the step then only moves the schedule).
        advantages: ``(n,)`` or ``(n, L)`` float advantages of ``mine`` (``None`` with ``old``).
        inputs: :meth:`GroupObjective.compute`'s keyword inputs for ``mine`` (``entropy``, ``group_ids``,
            ``num_tokens``, ``anchor``, ``segment_ids``).
        row_weight: the loss weight of this process's share (rows kept / rows, times W · share with W processes).
        share: this process's fraction of the loss normaliser (1 with one process).
        own_rows: whether this process scores rows of its own (a share without rows scores one with weight 0).
        mismatch: the rollout log-prob gap and its truncated-IS weights, when measured (else ``None``).
    """

    rows: torch.Tensor
    mine: Rollout
    old: object | None
    advantages: torch.Tensor | None
    inputs: dict
    row_weight: float
    share: float
    own_rows: bool
    mismatch: RolloutMismatch | None


def prepare_update(run, ro: Rollout, generator: torch.Generator) -> UpdateBatch:
    """Steps 3 and 4 for the rollout batch ``ro`` of a :class:`~dlmrl.training.run_setup.Run`: advantages (the
    preset's estimator over the group ids ``ro`` carries; entropy-based ones after the old scores), the rows to
    score (rows of advantage 0 are skipped when the objective says that cannot change the loss), this process's
    share of them, and the old (and reference) scores, once per rollout batch (diffusion: on the μ MaskPlans).
    HAPO's entropy statistics for the next step's sampling temperature are stored in ``run.state``.
    """
    cfg, preset, objective, processes, needs = run.cfg, run.preset, run.objective, run.processes, run.needs
    tr, G = cfg.train, cfg.train.num_generations
    group_ids = ro.group_ids  # (B,) groups need not be G consecutive rows (anchors, episodes)
    adv_inputs = {"mask": ro.completion_mask, "group_ids": group_ids, "trajectory_ids": ro.trajectories()}
    if preset.advantage == "dagrpo":  # distinctiveness: token 3-gram Jaccard within each group
        adv_inputs["similarity"] = ngram_jaccard(ro.completion, ro.completion_mask, group_ids)
    if preset.advantage == "srpo_passk" and hasattr(run.task, "exact_matches"):  # SRPO's bonus counts exact matches
        # (the sampler's flags, from the texts it decoded for the rewards; a rollout without them decodes here)
        adv_inputs["exact"] = ro.exact if ro.exact is not None else torch.tensor(
            run.task.exact_matches(ro.examples, run.task.decode(ro.completion)), dtype=torch.bool)
    keep = torch.ones(len(ro), dtype=torch.bool)
    adv = None
    if "entropy" not in needs and len(ro):
        adv = preset.advantages(AdvantageInputs(ro.train_rewards, G, **adv_inputs))
        if objective.can_skip_zero_rows(adv):
            keep = adv != 0
    rows = torch.nonzero(keep).squeeze(-1)
    # (a loss normalised by the whole batch's token count, dapo, needs no rescaling by the rows kept)
    row_weight = 1.0 if objective.parts.loss_type.uses_num_tokens else len(rows) / max(len(ro), 1)
    sub = ro.rows(rows)
    num_tokens = sub.completion_mask.sum().clamp(min=1).float()  # (dapo: the whole batch's tokens)
    # several processes: each scores its share of the groups (a share without rows scores one row
    # with loss weight 0, so every process runs the same updates), weighted so that the average of
    # the processes' losses is the loss of the whole batch (distributed.loss_share)
    local, share, own_rows = None, 1.0, True
    if processes.count > 1 and len(rows):
        local = group_share(group_ids[rows], processes.index, processes.count)  # (n,) rows of sub
        share = loss_share(objective.parts.loss_type, sub.completion_mask[local], sub.completion_mask)
        row_weight *= processes.count * share
        if not len(local):
            local, row_weight, share, own_rows = torch.zeros(1, dtype=torch.long), 0.0, 0.0, False
    mine = sub if local is None else sub.rows(local)
    mine_rows = rows if local is None else rows[local]  # this process's rows of ro
    old = (run.scorer.prepare(sub, tr.num_iterations, generator, entropy="entropy" in needs, rows=local,
                              advantages=adv[rows] if adv is not None else None) if len(rows)
           else None)  # (no row to score: this batch carries no signal)
    entropy = old.entropy if old is not None else None  # (n, L) this process's rows
    if entropy is not None and local is not None:
        entropy = processes.gather_rows(entropy, local if row_weight else local[:0], len(sub))  # whole batch
    if preset.adaptive_temperature_tau is not None and old is not None:
        stats = hapo_entropy_stats(entropy, sub.completion_mask, objective.hapo_entropy_pivot)  # the loss's rule
        run.state.hapo_stats = dataclasses.asdict(stats)
    if adv is None and old is not None:  # (here every row is kept: sub is ro)
        adv = preset.advantages(AdvantageInputs(ro.train_rewards, G, entropy=entropy, **adv_inputs))
    inputs = {"entropy": old.entropy if old is not None else None, "group_ids": group_ids[mine_rows],
              "num_tokens": num_tokens}
    if mine.anchor is not None:
        inputs["anchor"] = mine.anchor  # ratio π/sg[π], loss weight anchor_weight
    if run.delimiters is not None:
        inputs["segment_ids"] = sentence_segments(torch.isin(mine.completion, run.delimiters), mine.completion_mask)
    # the sampler's recorded log-probs against the exact old-policy scores of the same trajectory (the
    # first update's), and the truncated-IS weights of train.rollout_is_cap
    mismatch = None
    if old is not None and run.gap_measured and mine.token_logprobs is not None:
        valid = mine.completion_mask.bool() & (mine.reveal_step >= 0)
        if mine.anchor is not None:
            valid &= ~mine.anchor.bool()[:, None]
        mismatch = RolloutMismatch(mine.token_logprobs, valid, tr.rollout_is_cap)
    return UpdateBatch(rows, mine, old, adv[mine_rows] if adv is not None else None, inputs, row_weight, share,
                       own_rows, mismatch)


@dataclass
class UpdateResult:
    """What step 5 did: one metrics dict per update (the objective's metrics, ``loss``, ``grad_norm``), the
    learning rate it used, and the seconds spent scoring with grad and in the optimizer."""

    logs: list[dict]
    lr: float
    seconds_scoring: float
    seconds_optimizer: float


def run_updates(run, batch: UpdateBatch) -> UpdateResult:
    """Step 5: the μ inner updates (``train.num_iterations``) on ``batch`` (diffusion: each on a fresh MaskPlan
    shared by old/new/ref); with no signal in the batch, the schedule still moves μ steps."""
    tr, accelerator, model = run.cfg.train, run.accelerator, run.policy.model
    optimizer, scheduler = run.optimizer, run.scheduler
    model.train()
    logs: list[dict] = []
    lr_used = scheduler.get_last_lr()[0]
    old = batch.old
    updates = tr.num_iterations if old is not None else 0
    with warnings.catch_warnings():  # torch warns when the schedule moves without an optimizer step
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(tr.num_iterations - updates):
            scheduler.step()  # nothing to learn from this batch; keep the schedule on the step count
    seconds_scoring = seconds_optimizer = 0.0
    for j in range(updates):
        # score with grad and back-propagate the preset's loss (diffusion: in chunks of micro_batch
        # canvases, a two-pass surrogate with the same gradient, when they do not fit in one call)
        loss_fn = group_loss_fn(run.objective, old.old[j], batch.advantages, batch.mine.completion_mask,
                                batch.row_weight, logp_ref=old.ref[j], **batch.inputs,
                                **({"mismatch": batch.mismatch} if batch.mismatch is not None else {}))
        t_scoring = time.time()
        with accelerator.no_sync(model) if run.own_grad_sync else nullcontext():
            loss, m = run.scorer.backward(j, loss_fn, accelerator.backward)
        t_optimizer = time.time()
        seconds_scoring += t_optimizer - t_scoring
        if run.own_grad_sync:
            run.processes.average_gradients(model.parameters())
        if tr.max_grad_norm > 0:
            m["grad_norm"] = float(accelerator.clip_grad_norm_(model.parameters(), tr.max_grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        seconds_optimizer += time.time() - t_optimizer
        logs.append({**m, "loss": loss.item()})
    return UpdateResult(logs, lr_used, seconds_scoring, seconds_optimizer)
