"""Steps 3–5 of a training step: advantages and the rows worth scoring, the old (and reference) scores, and the
optimizer steps, each on the loss the preset's :class:`~dlmrl.objectives.objective.GroupObjective` gives.

A step makes μ passes over its rollout batch (``train.num_iterations``), each in ``train.steps_per_generation``
mini-batches of whole groups (:func:`split_minibatches`), one optimizer step per mini-batch, in the order TRL's
``GRPOTrainer`` uses (the same split for every pass). Each mini-batch's loss is its own mean in the preset's
aggregation; the old-policy scores are the rollout policy's, taken once per batch before any step. Several
processes each score their share of every mini-batch's groups, weighted so that the average of the processes'
losses is the loss of the whole mini-batch (:func:`dlmrl.training.distributed.loss_share`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from dlmrl.objectives.advantage_registry import AdvantageInputs
from dlmrl.objectives.entropy import hapo_entropy_stats
from dlmrl.objectives.objective import GroupObjective
from dlmrl.objectives.pairwise import ngram_jaccard
from dlmrl.objectives.segments import sentence_segments
from dlmrl.training.distributed import Processes, group_share, loss_share, split_range
from dlmrl.training.rollout import Rollout
from dlmrl.training.scorers import RolloutMismatch

#: the objective's metrics averaged over a step's optimizer steps (and combined over processes); ``kl`` is the KL estimate,
#: ``kl_loss`` the KL term the loss used (k3 evaluated at |Δ| ≤ 20 nats: below ``kl`` once a ratio passes that)
UPDATE_METRICS = ("loss", "ratio_mean", "ratio_min", "ratio_max", "clip_frac_low", "clip_frac_high", "kl", "kl_loss",
                  "sample_nll")


def group_loss_fn(objective: GroupObjective, old: torch.Tensor | None, advantages: torch.Tensor,
                  mask: torch.Tensor, row_weight: float = 1.0, mismatch: RolloutMismatch | None = None, **inputs):
    """The loss of one optimizer step (a μ update, or one mini-batch of it) as a function of the current policy's
    per-token scores.

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
        # (the collapse monitor's series: the rollout policy's negative log-likelihood per token of its own samples)
        tokens = mask.to(logp_old.dtype)
        metrics = {**metrics, "sample_nll": (-(logp_old.detach() * tokens).sum() / tokens.sum().clamp_min(1)).item()}
        return loss * row_weight, metrics

    return loss_fn


def measures_rollout_mismatch(scorer) -> bool:
    """Whether the scorer's old-policy scores are log-probs of the distribution the sampler drew from: the
    ``trajectory`` estimator with merge 1 and the sampled order (the trainer then logs the rollout log-prob gap
    and may correct it, ``train.rollout_is_cap``). Merged canvases (merge > 1) score a token from an earlier canvas
    than the one it was drawn from, and the ELBO estimators' per-token terms are no token log-probs, so the gap is
    not defined there (not logged)."""
    from dlmrl.estimators.trajectory import Trajectory

    if getattr(scorer, "measures_rollout_gap", False):  # (a scorer that says so: the uniform kind's trajectory)
        return True
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


def split_minibatches(group_ids: torch.Tensor, count: int, generator: torch.Generator) -> list[torch.Tensor]:
    """The rows of each of ``count`` mini-batches of a rollout batch: its groups (ordered by first appearance)
    shuffled with ``generator`` and cut into ``count`` contiguous runs whose sizes differ by at most one group
    (:func:`~dlmrl.training.distributed.split_range`); each mini-batch's rows in batch order. ``count`` 1: every
    row, and nothing is drawn from ``generator``.

    Whole groups, so a group's rows (a DaGRPO anchor, a Flow-GRPO trajectory's turns) stay together and a group
    softmax (EGSW) sees its whole group. (TRL shuffles rows and splits them in equal chunks; verl's
    ``ppo_mini_batch_size`` counts prompts, i.e. groups; dLLM-RL's TraceRL steps through its rows in order, a
    group's rows next to each other.)

    Args:
        group_ids: ``(B,)`` long group id of each row.
        count: mini-batches (``train.steps_per_generation``), ``>= 1``; more than the groups leaves some empty.
    Returns:
        ``count`` ``(B_k,)`` long tensors of row indices, together every row once.
    """
    n = len(group_ids)
    if count == 1:
        return [torch.arange(n)]
    ids = group_ids.tolist()
    order: dict[int, int] = {}
    for g in ids:
        order.setdefault(g, len(order))
    rank = torch.empty(len(order), dtype=torch.long)
    rank[torch.randperm(len(order), generator=generator)] = torch.arange(len(order))  # group -> shuffled position
    position = rank[torch.tensor([order[g] for g in ids], dtype=torch.long)] if n else torch.zeros(0, dtype=torch.long)
    out = []
    for k in range(count):
        lo, hi = split_range(len(order), k, count)
        out.append(torch.nonzero((position >= lo) & (position < hi)).squeeze(-1))
    return out


@dataclass
class MiniBatch:
    """One optimizer step's rows (:func:`prepare_update`).

    Attributes:
        rows: ``(m_kept,)`` long, the rows of the rollout batch this step scores (all processes together); empty:
            the mini-batch carries no signal and the step only moves the schedule.
        index: ``(m,)`` long, this process's rows of it as positions in :attr:`UpdateBatch.mine` (a share without
            rows: one row with weight 0), or ``None``: all of ``mine`` (one mini-batch per pass).
        row_weight: the loss weight of this process's share (rows kept / rows of the mini-batch, times W · share
            with W processes), so the loss is the mini-batch's mean in the preset's aggregation.
        share: this process's fraction of the mini-batch's loss normaliser (1 with one process).
        num_tokens: ``dapo``'s normaliser, the valid tokens of the mini-batch's kept rows (all processes).
    """

    rows: torch.Tensor
    index: torch.Tensor | None
    row_weight: float
    share: float
    num_tokens: torch.Tensor


@dataclass
class UpdateBatch:
    """What the optimizer steps of one step train on (:func:`prepare_update`); ``n`` is the number of rows this
    process scores, ``L`` the completion length.

    Attributes:
        rows: ``(n_kept,)`` long, the rows of the rollout batch scored (all processes together).
        mine: this process's share of them (a :class:`Rollout` of ``n`` rows).
        old: the old (and reference) scores (:meth:`DiffusionScorer.prepare` / :meth:`ARScorer.prepare`), or
            ``None`` when no row carries a signal (the step then only moves the schedule).
        advantages: ``(n,)`` or ``(n, L)`` float advantages of ``mine`` (``None`` with ``old``).
        inputs: :meth:`GroupObjective.compute`'s keyword inputs for ``mine`` (``entropy``, ``group_ids``,
            ``num_tokens``, ``anchor``, ``segment_ids``).
        row_weight: the loss weight of this process's share (rows kept / rows, times W · share with W processes);
            with several mini-batches each has its own (:attr:`minibatches`) and this is the first's.
        share: this process's fraction of the loss normaliser (1 with one process); with several mini-batches
            the first's.
        own_rows: whether this process scores rows of its own (a share without rows scores one with weight 0).
        mismatch: the rollout log-prob gap and its truncated-IS weights, when measured (else ``None``).
        minibatches: the ``train.steps_per_generation`` mini-batches of each pass, in order.
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
    minibatches: list[MiniBatch] = field(default_factory=list)


def prepare_update(run, ro: Rollout, generator: torch.Generator) -> UpdateBatch:
    """Steps 3 and 4 for the rollout batch ``ro`` of a :class:`~dlmrl.training.run_setup.Run`: advantages (the
    preset's estimator over the group ids ``ro`` carries; entropy-based ones after the old scores), the rows to
    score (rows of advantage 0 are skipped when the objective says that cannot change the loss), the mini-batches
    (:func:`split_minibatches`, drawn from ``generator`` when there are several) and this process's share of
    each, and the old (and reference) scores, once per rollout batch (diffusion: on the μ MaskPlans).
    HAPO's entropy statistics for the next step's sampling temperature are stored in ``run.state``.
    """
    cfg, preset, objective, processes, needs = run.cfg, run.preset, run.objective, run.processes, run.needs
    tr, G = cfg.train, cfg.train.num_generations
    count = tr.steps_per_generation
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
    sub = ro.rows(rows)
    # each mini-batch's loss is its own mean in the preset's aggregation: the rows kept over the mini-batch's rows
    # (a loss normalised by the token count, dapo, by the mini-batch's tokens instead: num_tokens); several
    # processes: each scores its share of every mini-batch's groups (a share without rows scores one row with
    # loss weight 0, so every process runs the same steps), weighted so that the average of the processes'
    # losses is the mini-batch's loss (distributed.loss_share)
    loss_type = objective.parts.loss_type
    parts = []  # (kept rows of ro, this process's rows of ro, row weight, share, num_tokens) per mini-batch
    for part in split_minibatches(group_ids, count, generator):
        kept = part[keep[part]]
        weight = 1.0 if loss_type.uses_num_tokens else len(kept) / max(len(part), 1)
        num_tokens = ro.completion_mask[kept].sum().clamp(min=1).float()
        own, share = kept, 1.0
        if processes.count > 1 and len(kept):
            own = kept[group_share(group_ids[kept], processes.index, processes.count)]
            share = loss_share(loss_type, ro.completion_mask[own], ro.completion_mask[kept])
            weight *= processes.count * share
        parts.append((kept, own, weight, share, num_tokens))
    has_own = any(len(own) for _, own, *_ in parts)
    own_rows = has_own or not len(rows)
    local = None  # this process's rows as positions in sub, mini-batch after mini-batch (None: all of sub)
    if (processes.count > 1 or count > 1) and len(rows):
        local = torch.searchsorted(rows, torch.cat([own for _, own, *_ in parts])) if has_own \
            else torch.zeros(1, dtype=torch.long)  # (no rows of its own: one row of weight 0)
    minibatches, offset = [], 0
    for kept, own, weight, share, num_tokens in parts:
        index = None if count == 1 else torch.arange(offset, offset + len(own))
        if len(kept) and not len(own):  # (none of this mini-batch's rows is this process's: one row of weight 0)
            weight, share = 0.0, 0.0
            index = None if count == 1 else torch.zeros(1, dtype=torch.long)
        offset += len(own)
        minibatches.append(MiniBatch(kept, index, weight, share, num_tokens))
    mine = sub if local is None else sub.rows(local)
    mine_rows = rows if local is None else rows[local]  # this process's rows of ro
    extra = {"minibatches": count} if count > 1 else {}  # (a scorer of one mini-batch per pass takes no such argument)
    old = (run.scorer.prepare(sub, tr.num_iterations, generator, entropy="entropy" in needs, rows=local,
                              advantages=adv[rows] if adv is not None else None, **extra) if len(rows)
           else None)  # (no row to score: this batch carries no signal)
    entropy = old.entropy if old is not None else None  # (n, L) this process's rows
    if entropy is not None and local is not None:
        entropy = processes.gather_rows(entropy, local if own_rows else local[:0], len(sub))  # whole batch
    if preset.adaptive_temperature_tau is not None and old is not None:
        stats = hapo_entropy_stats(entropy, sub.completion_mask, objective.hapo_entropy_pivot)  # the loss's rule
        run.state.hapo_stats = dataclasses.asdict(stats)
    if adv is None and old is not None:  # (here every row is kept: sub is ro)
        adv = preset.advantages(AdvantageInputs(ro.train_rewards, G, entropy=entropy, **adv_inputs))
    inputs = {"entropy": old.entropy if old is not None else None, "group_ids": group_ids[mine_rows],
              "num_tokens": minibatches[0].num_tokens}
    if mine.anchor is not None:
        inputs["anchor"] = mine.anchor  # ratio π/sg[π], loss weight anchor_weight
    if run.delimiters is not None:
        inputs["segment_ids"] = sentence_segments(torch.isin(mine.completion, run.delimiters), mine.completion_mask)
    # the sampler's recorded log-probs against the exact old-policy scores of the same trajectory (the first
    # update's, or with several mini-batches the ones taken before any step), and the truncated-IS weights of
    # train.rollout_is_cap
    mismatch = None
    if old is not None and run.gap_measured and mine.token_logprobs is not None:
        valid = mine.completion_mask.bool().clone()  # (a copy: the &= below must not change the rollout's mask)
        if mine.reveal_step is not None:  # (a kind without a reveal order scores every completion token)
            valid &= mine.reveal_step >= 0
        if mine.anchor is not None:
            valid &= ~mine.anchor.bool()[:, None]
        mismatch = RolloutMismatch(mine.token_logprobs, valid, tr.rollout_is_cap)
        if count > 1 and old.old[0] is not None:
            mismatch.observe(old.old[0])
    first = minibatches[0]
    return UpdateBatch(rows, mine, old, adv[mine_rows] if adv is not None else None, inputs, first.row_weight,
                       first.share, own_rows, mismatch, minibatches)


@dataclass
class UpdateResult:
    """What step 5 did: one metrics dict per optimizer step (the objective's metrics, ``loss``, ``grad_norm``) and
    this process's share of that step's loss normaliser, the learning rate of the step's first optimizer step,
    and the seconds spent scoring with grad and in the optimizer."""

    logs: list[dict]
    lr: float
    seconds_scoring: float
    seconds_optimizer: float
    shares: list[float] = field(default_factory=list)


def _take(value, index: torch.Tensor | None):
    """Rows ``index`` of a per-row tensor (``None`` and 0-dim values as they are)."""
    if index is None or not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    return value.index_select(0, index.to(value.device))


def run_updates(run, batch: UpdateBatch) -> UpdateResult:
    """Step 5: μ passes (``train.num_iterations``) over ``batch``'s mini-batches (``train.steps_per_generation``),
    one optimizer step and one schedule step each (diffusion: pass ``j`` on its own MaskPlan, shared by
    old/new/ref). The first step's old scores are its own, detached (ratio 1: the policy has not moved yet); every
    later step reads the rollout policy's, so its ratio, clip and a KL toward the old policy act. A mini-batch
    without signal (no row kept), or a batch without any, only moves the schedule."""
    tr, accelerator, model = run.cfg.train, run.accelerator, run.policy.model
    optimizer, scheduler = run.optimizer, run.scheduler
    model.train()
    logs: list[dict] = []
    shares: list[float] = []
    lr_used = scheduler.get_last_lr()[0]
    old = batch.old
    minibatches = batch.minibatches or [MiniBatch(batch.rows, None, batch.row_weight, batch.share,
                                                  batch.inputs.get("num_tokens"))]
    steps = [(j, k, mb) for j in range(tr.num_iterations) for k, mb in enumerate(minibatches)]
    skipped = [old is None or not len(mb.rows) for _, _, mb in steps]
    # (no signal in the whole batch: the schedule moves all of its steps first, as one step with no update did)
    ahead = len(steps) if old is None else 0
    with warnings.catch_warnings():  # torch warns when the schedule moves without an optimizer step
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(ahead):
            scheduler.step()  # nothing to learn from this batch; keep the schedule on the step count
    seconds_scoring = seconds_optimizer = 0.0
    for (j, k, mb), skip in zip(steps, skipped):
        if skip:
            if ahead == 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    scheduler.step()  # (a mini-batch of zero-advantage rows: nothing to learn, the schedule moves)
            continue
        # score with grad and back-propagate the preset's loss (diffusion: in chunks of micro_batch
        # canvases, a two-pass surrogate with the same gradient, when they do not fit in one call)
        if mb.index is None:  # one mini-batch: every row of this process
            loss_fn = group_loss_fn(run.objective, old.old[j], batch.advantages, batch.mine.completion_mask,
                                    mb.row_weight, logp_ref=old.ref[j], **batch.inputs,
                                    **({"mismatch": batch.mismatch} if batch.mismatch is not None else {}))
            rows = {}
        else:
            idx = mb.index
            inputs = {key: _take(value, idx) for key, value in batch.inputs.items()}
            inputs["num_tokens"] = mb.num_tokens
            weights = batch.mismatch.weights() if batch.mismatch is not None else None
            if weights is not None:  # (observed once, before any step: prepare_update)
                inputs["weights"] = _take(weights, idx)
            logp_old = None if j == 0 and k == 0 else _take(old.old[j], idx)  # (the first step: nothing moved yet)
            loss_fn = group_loss_fn(run.objective, logp_old, _take(batch.advantages, idx),
                                    _take(batch.mine.completion_mask, idx), mb.row_weight,
                                    logp_ref=_take(old.ref[j], idx), **inputs)
            rows = {"rows": idx}
        t_scoring = time.time()
        with accelerator.no_sync(model) if run.own_grad_sync else nullcontext():
            loss, m = run.scorer.backward(j, loss_fn, accelerator.backward, **rows)
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
        shares.append(mb.share)
    return UpdateResult(logs, lr_used, seconds_scoring, seconds_optimizer, shares)


def update_metrics(processes: Processes, batch: UpdateBatch, result: UpdateResult) -> dict:
    """The step's :data:`UPDATE_METRICS` and ``grad_norm`` averaged over its optimizer steps (``None`` where no
    step ran), the whole batch's values with several processes (:meth:`Processes.combine_metrics`): with one
    mini-batch per pass each process's average is combined with its share; with several, each optimizer step's
    values are combined with that step's shares first (every process runs the same steps), then averaged."""
    keys = (*UPDATE_METRICS, "grad_norm")

    def mean(logs: list[dict], key: str):
        vals = [lg[key] for lg in logs if lg.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    if len(batch.minibatches) <= 1:
        out = {key: mean(result.logs, key) for key in keys}
        if result.logs:  # (several processes: the whole batch's values from the shares')
            out.update(processes.combine_metrics({k: out[k] for k in UPDATE_METRICS}, batch.share))
        return out
    combined = [{**processes.combine_metrics({k: lg.get(k) for k in UPDATE_METRICS}, share),
                 "grad_norm": lg.get("grad_norm")} for lg, share in zip(result.logs, result.shares, strict=True)]
    return {key: mean(combined, key) for key in keys}
