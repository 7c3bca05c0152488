"""The variance lab: bias, variance, MSE and gradient variance of every estimator, exactly and by sampling.

For a policy, batches of (prompt, completion) pairs and a list of budgets (NFE), :func:`run_lab`
measures each estimator against the exact ELBO:

- **exact figures** (rows with at most ``exact_max_length`` maskable positions): the table of
  ``S(m)`` over all masks (:func:`mask_table`) gives each estimator's mean and variance as a
  finite sum (``estimator.moments``), with the variance split into the part due to the random
  time and the part due to the mask (law of total variance);
- **sampled figures**: ``repetitions`` independent :class:`MaskPlan` draws, evaluated by table
  lookup where a table exists and by scoring with the policy otherwise; they check the exact
  figures and cover long canvases, where the target is a high-budget reference estimate
  (stratified exact-count double MC) instead of the exact ELBO;
- **gradient variance**: the variance of the estimate's directional derivative along
  ``num_directions`` fixed random unit directions in parameter space (central differences
  ``(f(θ+εv) − f(θ−εv)) / 2ε`` on the same masks, float32 with ε = 1e-3 by default, float64 on
  request), averaged over directions; the same table trick makes it exact;
- **ELBO difference between two nearby policies on the same plan** (what GDPO's ratio sees):
  its variance with a shared plan and, for contrast, with independent plans;
- **the trajectory likelihood** (batches that carry the sampler's record): the log-likelihood of each row
  along the order its sampler took (:mod:`dlmrl.estimators.trajectory`, merge factors
  ``trajectory_merges``), its value and its gap to the exact ELBO per row; given the rollout it is
  deterministic, so its variance (and gradient and difference variance) is 0 and its MSE is the squared gap.

Units: nats per sequence (variances in nats²); gradient variance in (nats per unit parameter
norm)². Records are plain dicts (see :data:`RECORD_FIELDS`); ``inf`` becomes ``None`` in JSON.

Reference: GDPO arXiv 2510.08554 §4 (variance of double MC vs SDMC); VRPO arXiv 2505.19223
(common random numbers).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dlmrl.estimators.coupled import Coupled
from dlmrl.estimators.coupled_sdmc import CoupledSDMC
from dlmrl.estimators.double_mc import DoubleMC
from dlmrl.estimators.lab_report import (  # noqa: F401  (re-exported: the lab's reporting helpers)
    COMPARED,
    has_infinite_variance,
    plot_results,
    record_label,
    summary_table,
    to_json_records,
    value,
)
from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.mask_table import MaskTable, mask_table
from dlmrl.estimators.masking import sample_masks
from dlmrl.estimators.one_step import OneStep
from dlmrl.estimators.scoring import PlanEstimator, sample_scores, score
from dlmrl.estimators.sdmc import SDMC
from dlmrl.estimators.trajectory import trajectory_plan

RECORD_FIELDS = (
    "length", "estimator", "masking", "nodes", "samples_per_node", "num_samples", "stratified", "t_range",
    "p_mask_prompt", "nfe", "rows", "target", "infinite_variance", "bias", "bias_sq", "variance", "variance_t", "variance_mask",
    "mse", "grad_variance", "diff_variance", "diff_variance_independent", "sampled_bias", "sampled_variance",
    "sampled_mse", "sampled_variance_t", "sampled_variance_mask", "sampled_grad_variance", "sampled_diff_variance",
    "sampled_diff_variance_independent",
    "repetitions", "check_max_abs_z",
    "check_variance_ratio", "merge", "values", "gaps",
)


@dataclass
class LabBatch:
    """Rows scored together; ``length`` labels the batch (the number of maskable tokens per row).

    Attributes:
        length: label ``L`` (maskable tokens per row).
        prompt_ids: ``(B, P)`` long, left-padded; prompt_mask ``(B, P)`` bool.
        completion: ``(B, L')`` long canvases; completion_mask ``(B, L')`` bool, the maskable positions.
        reveal_step: optional ``(B, L')`` long, the sampler's record of the step that revealed each position
            (-1 where it wrote nothing), for the trajectory likelihood.
        temperature: the sampling temperature of the completions (the trajectory's log-prob temperature).
    """

    length: int
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion: torch.Tensor
    completion_mask: torch.Tensor
    reveal_step: torch.Tensor | None = None
    temperature: float = 1.0


@dataclass
class LabConfig:
    """Settings of :func:`run_lab` (defaults: the ``dlmrl estimators`` run)."""

    budgets: tuple[int, ...] = (1, 2, 3, 4, 8)
    long_budgets: tuple[int, ...] = (3, 4)
    repetitions: int = 2000
    model_repetitions: int = 32
    num_directions: int = 2
    fd_epsilon: float = 1e-3
    dtype: str = "float32"
    perturbation: float = 0.01
    exact_max_length: int = 16
    reference_nfe: int = 128
    reference_repeats: int = 8
    split_times: int = 32
    split_masks: int = 4
    micro_batch: int = 2048
    tokens_per_forward: int = 131072
    seed: int = 0
    trajectory_merges: tuple[int, ...] = (1, 2, 4)


def lab_estimators(nfe: int) -> list[PlanEstimator]:
    """The estimators compared at budget ``nfe`` (forward passes per sequence)."""
    out: list[PlanEstimator] = [
        DoubleMC(nfe, "bernoulli"),
        DoubleMC(nfe, "exact_count"),
        DoubleMC(nfe, "exact_count", stratified=True),
        SDMC(nfe, 1, "exact_count"),
        SDMC(nfe, 1, "bernoulli"),
        SDMC(nfe, 1, "reference"),
    ]
    if nfe >= 2:
        out += [CoupledSDMC(nfe, 1, "exact_count"), CoupledSDMC(nfe, 1, "bernoulli")]
    if nfe % 2 == 0:
        out += [Coupled(nfe // 2, "bernoulli"), Coupled(nfe // 2, "exact_count", 0.0, 1.0)]
    if nfe == 1:
        out.append(OneStep(0.15))
    return out


def describe(estimator: PlanEstimator) -> dict:
    """The record fields that name an estimator configuration, read from its own description
    (:meth:`~dlmrl.estimators.configurable.ConfigurableEstimator.describe`): each record column is the setting of
    that meaning by its field name (``nodes``: ``num_nodes``; ``num_samples``: ``num_samples`` or the pairs
    ``num_pairs``; ``t_range``: ``[t_min, t_max]``), ``None`` where the estimator has none."""
    d = estimator.describe()
    s = d.settings
    return {"estimator": d.name, "masking": s.get("masking"), "nodes": s.get("num_nodes"),
            "samples_per_node": s.get("samples_per_node"), "num_samples": s.get("num_samples", s.get("num_pairs")),
            "stratified": s.get("stratified"), "t_range": [s["t_min"], s["t_max"]] if "t_min" in s else None,
            "p_mask_prompt": s.get("p_mask_prompt"), "merge": s.get("merge"), "nfe": d.nfe}


def label(estimator: PlanEstimator) -> str:
    """A short name such as ``sdmc[exact_count]`` or ``double_mc[exact_count,strat]``."""
    d = describe(estimator)
    parts = [d["masking"]] if d["masking"] else []
    if d["stratified"]:
        parts.append("strat")
    if d["t_range"] is not None:
        parts.append("t~U({:g},{:g})".format(*d["t_range"]))
    if d["p_mask_prompt"] is not None:
        parts.append(f"p={d['p_mask_prompt']:g}")
    return f"{d['estimator']}[{','.join(parts)}]" if parts else d["estimator"]


# ---------------------------------------------------------------- policies around θ


def unit_direction(model: torch.nn.Module, generator: torch.Generator) -> list[torch.Tensor]:
    """A random direction over all parameters, unit norm overall (float64 Gaussian, normalised)."""
    parts = [torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in model.parameters()]
    norm = math.sqrt(sum(float((v * v).sum()) for v in parts))
    return [v / norm for v in parts]


def shifted(policy, steps: list[torch.Tensor] | None, dtype: torch.dtype = torch.float32):
    """A copy of ``policy`` in ``dtype`` whose parameters are moved by ``steps`` (one tensor per parameter)."""
    model = copy.deepcopy(policy.model).to(dtype).eval()
    if steps is not None:
        with torch.no_grad():
            for p, v in zip(model.parameters(), steps):
                p.add_(v.to(p.device, p.dtype))
    return dataclasses.replace(policy, model=model)


def lab_policies(policy, cfg: LabConfig) -> tuple[object, list[tuple[object, object]], object]:
    """``(θ, [(θ + ε·v_j, θ − ε·v_j)], θ')`` in ``cfg.dtype``: the base, the central-difference pairs
    along unit directions ``v_j`` and a nearby policy.

    ``θ'`` moves every parameter tensor ``p`` by ``perturbation · rms(p) · N(0, 1)`` noise.
    Float32 with ε = 1e-3 keeps the rounding error of a difference (~1e-6 relative / 2ε) and the
    truncation error (~ε²) far below the spread being measured; float64 allows ε ~ 1e-6.
    """
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"LabConfig.dtype must be 'float32' or 'float64', got {cfg.dtype!r}")
    dtype = getattr(torch, cfg.dtype)
    gen = torch.Generator().manual_seed(cfg.seed + 7919)
    base = shifted(policy, None, dtype)
    dirs = [unit_direction(base.model, gen) for _ in range(cfg.num_directions)]
    fd = [tuple(shifted(policy, [sign * cfg.fd_epsilon * v for v in d], dtype) for sign in (1, -1)) for d in dirs]
    noise = []
    for p in base.model.parameters():
        rms = float(p.detach().double().pow(2).mean().sqrt())
        noise.append(cfg.perturbation * rms * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return base, fd, shifted(policy, noise, dtype)


# ---------------------------------------------------------------- sampling repetitions


def stacked_plans(estimator: PlanEstimator, batch: LabBatch, reps: int, gen: torch.Generator) -> MaskPlan:
    """``reps`` independent plans concatenated along the sample axis: ``S_total = reps · S``.

    Drawn as one plan over the batch tiled ``reps`` times (every estimator draws its rows
    independently), then rearranged so that samples ``r·S .. r·S + S − 1`` are repetition ``r``.
    """
    rows = batch.completion_mask.shape[0]
    tiled = estimator.make_plan(batch.completion_mask.repeat(reps, 1), gen, batch.prompt_mask.repeat(reps, 1))
    s = tiled.num_samples

    def unstack(x: torch.Tensor) -> torch.Tensor:  # (S, reps·B, ...) -> (reps·S, B, ...)
        x = x.reshape(s, reps, rows, *x.shape[2:])
        return x.transpose(0, 1).reshape(reps * s, rows, *x.shape[3:])

    t = unstack(tiled.t) if tiled.t.dim() == 2 else tiled.t.repeat(reps)
    pm = None if tiled.prompt_masks is None else unstack(tiled.prompt_masks)
    return MaskPlan(masks=unstack(tiled.masks), weights=unstack(tiled.weights), t=t, prompt_masks=pm)


def table_values(tables: list[MaskTable], plan: MaskPlan, reps: int) -> np.ndarray:
    """``(reps, B)`` estimates by table lookup (no model call)."""
    per = plan.num_samples // reps
    out = np.zeros((reps, len(tables)))
    w = plan.weights.double().cpu().numpy()  # (S_total, B)
    for b, tab in enumerate(tables):
        vals = w[:, b] * tab.values[tab.codes(plan.masks[:, b])]  # (S_total,)
        out[:, b] = vals.reshape(reps, per).sum(1)
    return out


def model_values(policy, batch: LabBatch, plan: MaskPlan, reps: int, micro_batch: int) -> np.ndarray:
    """``(reps, B)`` estimates by scoring with the policy."""
    with torch.no_grad():
        s = sample_scores(policy, batch.prompt_ids, batch.prompt_mask, batch.completion, batch.completion_mask,
                          plan, micro_batch)  # (S_total, B)
    per = plan.num_samples // reps
    return s.double().cpu().numpy().reshape(reps, per, -1).sum(1)


# ---------------------------------------------------------------- the lab


def _mean(xs) -> float:
    xs = list(xs)
    return float(np.mean(xs)) if xs else float("nan")


def run_lab(
    policy,
    batches: Sequence[LabBatch],
    cfg: LabConfig | None = None,
    estimators_for: Callable[[int], list[PlanEstimator]] = lab_estimators,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Measure every estimator of ``estimators_for(nfe)`` for each budget on each batch.

    Args:
        policy: a :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` (copied to ``cfg.dtype`` here).
        batches: :class:`LabBatch` list (e.g. one per completion length).
        cfg: :class:`LabConfig`.
        estimators_for: budget → estimators (default :func:`lab_estimators`).
        progress: called with a line of text as work proceeds.
    Returns:
        One record per (batch, estimator): the fields of :data:`RECORD_FIELDS`, averaged over the
        batch's rows (``bias`` signed, ``bias_sq`` its square's mean, ``mse = bias_sq + variance``);
        exact fields are ``inf`` where the variance is infinite and ``nan`` where no table exists.
    """
    cfg = cfg or LabConfig()
    say = progress or (lambda _: None)
    base, fd, near = lab_policies(policy, cfg)
    records = []
    for bi, batch in enumerate(batches):
        n_max = int(batch.completion_mask.sum(-1).max())
        exact = n_max <= cfg.exact_max_length
        budgets = cfg.budgets if exact else cfg.long_budgets
        say(f"L={batch.length}: {batch.completion.shape[0]} rows, {'exact tables' if exact else 'reference'}")
        ctx = _LengthContext(batch, base, fd, near, cfg, exact, say)
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + bi)
        for nfe in budgets:
            for est in estimators_for(nfe):
                records.append(ctx.measure(est, gen))
        if batch.reveal_step is not None:
            records += [ctx.measure_trajectory(m) for m in cfg.trajectory_merges]
        say(f"L={batch.length}: done")
    return records


class _LengthContext:
    """Everything measured once per batch: tables (or the reference) at θ, θ+εv_j and θ'."""

    def __init__(self, batch: LabBatch, base, fd, near, cfg: LabConfig, exact: bool, say) -> None:
        self.batch, self.base, self.fd, self.near, self.exact = batch, base, fd, near, exact
        # canvases per forward call: at most micro_batch, and at most tokens_per_forward tokens
        span = batch.prompt_ids.shape[1] + batch.completion.shape[1]
        cfg = dataclasses.replace(cfg, micro_batch=max(1, min(cfg.micro_batch, cfg.tokens_per_forward // span)))
        self.cfg = cfg
        rows = range(batch.completion.shape[0])
        args = (batch.prompt_ids, batch.prompt_mask, batch.completion, batch.completion_mask)
        if exact:
            total = 2 + 2 * len(fd)  # tables per row: θ, θ', and θ ± εv per direction
            done = [0]

            def tables(pol, what):
                out = [mask_table(pol, *(x[b] for x in args), cfg.exact_max_length, cfg.micro_batch) for b in rows]
                done[0] += 1
                say(f"L={batch.length}: mask tables {done[0]}/{total} ({what}; {2 ** n_of(batch) - 1} masks "
                    f"x {len(rows)} rows)")
                return out

            self.t0 = tables(base, "θ")
            self.tnear = tables(near, "θ'")
            half = 0.5 / cfg.fd_epsilon
            self.d = []  # per direction: (T(θ+εv) − T(θ−εv)) / 2ε, row by row
            for plus, minus in fd:
                self.d.append([m.combine(p, half) for p, m in zip(tables(plus, "θ+εv"), tables(minus, "θ-εv"))])
            self.delta = [a.combine(b) for a, b in zip(self.t0, self.tnear)]
            self.target = np.array([t.elbo for t in self.t0])
            self.target_kind = "exact"
        else:
            ref = DoubleMC(cfg.reference_nfe, "exact_count", stratified=True)
            gen = torch.Generator().manual_seed(cfg.seed + 104729)
            plan = stacked_plans(ref, batch, cfg.reference_repeats, gen)
            vals = model_values(base, batch, plan, cfg.reference_repeats, cfg.micro_batch)  # (R, B)
            self.target = vals.mean(0)
            self.target_se = vals.std(0, ddof=1) / math.sqrt(cfg.reference_repeats)
            self.target_kind = (f"reference: double_mc[exact_count,strat] NFE {cfg.reference_nfe} x "
                                f"{cfg.reference_repeats} (mean SE {float(self.target_se.mean()):.3g})")
            say(f"L={batch.length}: {self.target_kind}")
            self.split = time_mask_split(base, batch, cfg.split_times, cfg.split_masks, cfg.micro_batch,
                                         torch.Generator().manual_seed(cfg.seed + 15485863))

    def measure_trajectory(self, merge: int) -> dict:
        """The trajectory likelihood of the batch's rows (merge factor ``merge``) against the target."""
        batch = self.batch
        plan = trajectory_plan(batch.completion_mask, lab_trajectory_order(batch), merge, batch.temperature)
        with torch.no_grad():
            values = score(self.base, batch.prompt_ids, batch.prompt_mask, batch.completion, batch.completion_mask,
                           plan, self.cfg.micro_batch).sequence.double().cpu().numpy()
        gaps = values - self.target
        nan = float("nan")
        rec = {k: nan for k in RECORD_FIELDS}
        rec.update({"length": batch.length, "estimator": "trajectory", "masking": None, "nodes": None,
                    "samples_per_node": None, "num_samples": None, "stratified": None, "t_range": None,
                    "p_mask_prompt": None, "merge": merge, "nfe": round(plan.forward_passes(), 2),
                    "rows": int(batch.completion.shape[0]), "target": self.target_kind, "infinite_variance": False,
                    "repetitions": 1, "values": values.tolist(), "gaps": gaps.tolist()})
        # given the rollout the estimate is deterministic: no variance of any kind; MSE = the squared gap
        zeros = ("variance", "variance_t", "variance_mask", "grad_variance", "diff_variance", "diff_variance_independent")
        rec.update({k: 0.0 for k in zeros}, **{f"sampled_{k}": 0.0 for k in zeros if f"sampled_{k}" in RECORD_FIELDS})
        rec.update(bias=_mean(gaps), bias_sq=_mean(gaps**2), mse=_mean(gaps**2), sampled_bias=_mean(gaps),
                   sampled_mse=_mean(gaps**2))
        return rec

    def measure(self, est: PlanEstimator, gen: torch.Generator) -> dict:
        cfg, batch = self.cfg, self.batch
        rec = {"length": batch.length, **describe(est), "rows": int(batch.completion.shape[0]),
               "target": self.target_kind, "values": None, "gaps": None}
        use_table = self.exact and hasattr(est, "moments")
        reps = cfg.repetitions if use_table else cfg.model_repetitions
        plan = stacked_plans(est, batch, reps, gen)
        if use_table:
            v0 = table_values(self.t0, plan, reps)
            vd = [table_values(d, plan, reps) for d in self.d]
            vdelta = table_values(self.delta, plan, reps)
        else:
            mb = cfg.micro_batch
            v0 = model_values(self.base, batch, plan, reps, mb)
            vd = [(model_values(p, batch, plan, reps, mb) - model_values(m, batch, plan, reps, mb))
                  * (0.5 / cfg.fd_epsilon) for p, m in self.fd]
            vdelta = model_values(self.near, batch, plan, reps, mb) - v0
        bias_r = v0.mean(0) - self.target  # (B,)
        var_r = v0.var(0, ddof=1)
        rec.update(
            repetitions=reps,
            sampled_bias=_mean(bias_r),
            sampled_variance=_mean(var_r),
            sampled_mse=_mean(bias_r**2 + var_r),
            sampled_grad_variance=_mean(_mean(v.var(0, ddof=1)) for v in vd),
            sampled_diff_variance=_mean(vdelta.var(0, ddof=1)),
            sampled_diff_variance_independent=_mean(var_r + (v0 + vdelta).var(0, ddof=1)),
        )
        nan = float("nan")
        rec.update(sampled_variance_t=nan, sampled_variance_mask=nan, infinite_variance=has_infinite_variance(rec))
        rec.update(bias=nan, bias_sq=nan, variance=nan, variance_t=nan, variance_mask=nan, mse=nan,
                   grad_variance=nan, diff_variance=nan, diff_variance_independent=nan,
                   check_max_abs_z=nan, check_variance_ratio=nan)
        if use_table:
            m0 = [est.moments(t.stats()) for t in self.t0]
            bias = np.array([m.mean for m in m0]) - self.target
            var = np.array([m.variance for m in m0])
            md = [[est.moments(t.stats()).variance for t in d] for d in self.d]
            mdelta = [est.moments(t.stats()).variance for t in self.delta]
            mnear = [est.moments(t.stats()).variance for t in self.tnear]
            rec.update(
                infinite_variance=bool(np.isinf(var).any()) or rec["infinite_variance"],
                bias=_mean(bias), bias_sq=_mean(bias**2), variance=_mean(var),
                variance_t=_mean(m.variance_t for m in m0), variance_mask=_mean(m.variance_mask for m in m0),
                mse=_mean(bias**2 + var), grad_variance=_mean(_mean(row) for row in md),
                diff_variance=_mean(mdelta), diff_variance_independent=_mean(var + np.array(mnear)),
            )
            # no CLT check where the variance is infinite, or zero up to rounding (a deterministic estimate)
            ok = np.isfinite(var) & (var > 1e-12 * (1.0 + self.target**2))
            if ok.any():
                z = (v0.mean(0)[ok] - np.array([m.mean for m in m0])[ok]) / np.sqrt(var[ok] / reps)
                rec["check_max_abs_z"] = float(np.abs(z).max())
                rec["check_variance_ratio"] = _mean(var_r[ok] / var[ok])
        if not self.exact and isinstance(est, DoubleMC) and est.masking == "exact_count" and not est.stratified:
            var_t, var_mask = self.split
            k = est.num_samples
            rec.update(sampled_variance_t=_mean(var_t) / k, sampled_variance_mask=_mean(var_mask) / k)
        return rec


def lab_trajectory_order(batch: LabBatch) -> torch.Tensor:
    """The order the lab scores a batch's trajectory in: the sampler's steps, after one extra first step for the
    maskable positions the sampler did not write (given cells the lab also masks, scored together from the
    all-masked canvas). **(dlmrl interpretation)**: that first step is the lab's convention, so the trajectory
    and the ELBO cover the same positions. ``(B, L')`` long."""
    mask = batch.completion_mask.bool()
    step = batch.reveal_step.to(mask.device)
    return torch.where(mask, torch.where(step >= 0, step + 1, 0), -1)




def time_mask_split(policy, batch: LabBatch, num_times: int, masks_per_time: int, micro_batch: int,
                    gen: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Law-of-total-variance split of one exact-count double-MC draw, by a nested (ANOVA) design.

    ``num_times`` times ``t ~ U(0, 1]`` per row, ``masks_per_time`` masks at each; the within-time
    variance estimates ``E_t Var(X|t)`` and the between-time variance of the time means, minus
    ``within / masks_per_time``, estimates ``Var_t E(X|t)`` (both unbiased).

    Returns:
        ``(variance_t (B,), variance_mask (B,))`` for a single draw (divide by K for K draws).
    """
    rows = batch.completion.shape[0]
    t = (1.0 - torch.rand((num_times, rows), generator=gen, dtype=torch.float64))  # (T, B)
    t = t.repeat_interleave(masks_per_time, dim=0)  # (T·M, B)
    masks, scale = sample_masks(batch.completion_mask, t, "exact_count", gen)
    plan = MaskPlan(masks=masks, weights=scale, t=t)
    with torch.no_grad():
        x = sample_scores(policy, batch.prompt_ids, batch.prompt_mask, batch.completion, batch.completion_mask,
                          plan, micro_batch).double().cpu().numpy()
    x = x.reshape(num_times, masks_per_time, rows)
    within = x.var(1, ddof=1).mean(0)  # (B,)
    between = x.mean(1).var(0, ddof=1) - within / masks_per_time
    return np.maximum(between, 0.0), within


def n_of(batch: LabBatch) -> int:
    return int(batch.completion_mask.sum(-1).max())
