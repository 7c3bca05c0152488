"""The variance lab (analysis.py) on the toy policy: exact figures against sampled ones, gradients
against autograd, table lookup against the model, the ANOVA split against exact moments, the
long-canvas path, and the reporting helpers.

Statistical tolerances are multiples of standard errors measured from the same draws (z < 4.5 for
means, 5 SE for sample variances, whose SE is ``std((x − x̄)²)/√R``); everything is seeded.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dlmrl.estimators import (
    SDMC,
    Coupled,
    CoupledSDMC,
    DoubleMC,
    MaskPlan,
    MaskTable,
    SizeStats,
    analysis,
    exact_elbo,
    mask_table,
    sample_masks,
    sample_scores,
    score,
)
from dlmrl.estimators.analysis import (
    COMPARED,
    RECORD_FIELDS,
    LabBatch,
    LabConfig,
    describe,
    lab_estimators,
    lab_policies,
    label,
    model_values,
    plot_results,
    run_lab,
    stacked_plans,
    summary_table,
    table_values,
    time_mask_split,
    to_json_records,
    value,
)
from tests.conftest import make_toy_policy
from tests.estimators.test_moments import bias_tol as bias_tol_of
from tests.estimators.test_moments import var_tol
from tests.tolerances import EPS32, EPS64, TOY_ELBO_RTOL, WEIGHT_RTOL, rounding_tol


def lab_tol(run) -> float:
    """The largest float64 rounding of an exact mean or bias over the run's tables (test_moments.bias_tol)."""
    return max(bias_tol_of(t.stats()) for tables in run.tables for t in tables)


TOY_SEED = 3
Z_MEAN = 4.5  # |z| bound for a sampled mean against the exact one
Z_VAR = 5.0  # bound, in SEs, for a sample variance against the exact one
EXACT_FIELDS = (
    "bias",
    "bias_sq",
    "variance",
    "variance_t",
    "variance_mask",
    "mse",
    "grad_variance",
    "diff_variance",
    "diff_variance_independent",
    "check_max_abs_z",
    "check_variance_ratio",
)
SAMPLED_FIELDS = (
    "sampled_bias",
    "sampled_variance",
    "sampled_mse",
    "sampled_grad_variance",
    "sampled_diff_variance",
    "sampled_diff_variance_independent",
)
#: keys that only long-canvas exact-count double-MC records fill in (NaN elsewhere)
SPLIT_FIELDS = ("sampled_variance_t", "sampled_variance_mask")


def toy_batch(length: int, counts: tuple[int, ...], canvas: int, seed: int) -> LabBatch:
    """Rows with ``counts[b]`` maskable positions (random) among ``canvas`` tokens; 4-token prompts,
    row 0 left-padded by one (pad id 6; tokens 0..5; mask id 7 never appears)."""
    g = torch.Generator().manual_seed(seed)
    rows = len(counts)
    prompt_ids = torch.randint(0, 6, (rows, 4), generator=g)
    prompt_mask = torch.ones(rows, 4, dtype=torch.bool)
    prompt_ids[0, 0], prompt_mask[0, 0] = 6, False
    completion = torch.randint(0, 6, (rows, canvas), generator=g)
    completion_mask = torch.zeros(rows, canvas, dtype=torch.bool)
    for b, n in enumerate(counts):
        completion_mask[b, torch.randperm(canvas, generator=g)[:n]] = True
    return LabBatch(length, prompt_ids, prompt_mask, completion, completion_mask)


def row_args(batch: LabBatch, b: int):
    return batch.prompt_ids[b], batch.prompt_mask[b], batch.completion[b], batch.completion_mask[b]


def var_and_se(x: np.ndarray) -> tuple[float, float]:
    """Sample variance (ddof 1) of ``x (R,)`` and its standard error ``std((x − x̄)²)/√R``."""
    return float(x.var(ddof=1)), float(((x - x.mean()) ** 2).std(ddof=1) / math.sqrt(len(x)))


def unbiased(est, n: int) -> bool:
    """Estimators whose mean is exactly the ELBO on a row with ``n`` maskable positions."""
    if isinstance(est, DoubleMC):
        return True
    if isinstance(est, Coupled):
        return est.masking == "exact_count" and (est.t_min, est.t_max) == (0.0, 1.0)
    if isinstance(est, (SDMC, CoupledSDMC)) and est.masking == "bernoulli":
        return 2 * est.num_nodes - 1 >= n - 1  # Gauss–Legendre is exact on the degree n−1 polynomial
    return False


# ---------------------------------------------------------------- the lab on exact batches

CORE = {
    "double_mc[bernoulli]",
    "double_mc[exact_count]",
    "double_mc[exact_count,strat]",
    "sdmc[exact_count]",
    "sdmc[bernoulli]",
    "coupled_sdmc[exact_count]",
    "coupled[exact_count,t~U(0,1)]",
}


def core_estimators(nfe: int):
    """The lab's estimators, less the ones that only repeat a code path (keeps the default suite fast)."""
    return [e for e in lab_estimators(nfe) if label(e) in CORE]


@dataclass
class LabRun:
    policy: object
    batches: list[LabBatch]
    cfg: LabConfig
    records: list[dict]
    estimators: list  # one per record
    batch_of: list[int]  # batch index per record
    arrays: list[
        tuple
    ]  # per record: (t0 tables, v0, d tables, vd, delta tables, vdelta), as run_lab used them
    tables: list[list[MaskTable]]  # our own tables at θ (float64), per batch and row


def run_captured(estimators_for, repetitions: int) -> LabRun:
    """run_lab on two small batches, recording every table_values call (tables and (R, B) estimates)."""
    policy = make_toy_policy(seed=TOY_SEED)
    batches = [toy_batch(4, (4, 4), 6, seed=1), toy_batch(5, (5, 5), 7, seed=2)]
    # (float64: our tables below are built with another micro-batch than run_lab's, so they agree to rounding)
    cfg = LabConfig(budgets=(2, 3), repetitions=repetitions, num_directions=1, seed=0, dtype="float64")
    calls = []
    original = analysis.table_values

    def spy(tables, plan, reps):
        out = original(tables, plan, reps)
        calls.append((tables, out))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis, "table_values", spy)
        records = run_lab(policy, batches, cfg, estimators_for)
    base = lab_policies(policy, cfg)[0]
    tables = [
        [mask_table(base, *row_args(batch, b)) for b in range(batch.completion.shape[0])] for batch in batches
    ]
    estimators, batch_of = [], []
    for bi in range(len(batches)):
        for nfe in cfg.budgets:
            for est in estimators_for(nfe):
                estimators.append(est)
                batch_of.append(bi)
    per = 2 + cfg.num_directions  # v0, one per direction, the nearby policy's difference
    assert len(calls) == per * len(records)
    arrays = [(*calls[per * i], *calls[per * i + 1], *calls[per * i + per - 1]) for i in range(len(records))]
    return LabRun(policy, batches, cfg, records, estimators, batch_of, arrays, tables)


@pytest.fixture(scope="module")
def lab() -> LabRun:
    return run_captured(core_estimators, repetitions=600)


def check_lab(run: LabRun) -> None:
    """Every exact figure against its sampled counterpart, row by row, and the records' bookkeeping."""
    reps = run.cfg.repetitions
    # a record's figure against its recomputation here from the same float64 arrays: sums of ≤ 4·R one-sign
    # terms (R repetitions), relative
    rec_rtol = rounding_tol(scale=1, n=4 * reps, dtype=torch.float64)
    assert len(run.records) == len(run.estimators)
    first_t0 = {}
    for rec, est, bi, (t0, v0, dtab, vd, delta, vdelta) in zip(
        run.records, run.estimators, run.batch_of, run.arrays
    ):
        batch, mine = run.batches[bi], run.tables[bi]
        rows = batch.completion.shape[0]
        for key, val in describe(est).items():
            assert rec[key] == val, (key, rec)
        assert rec["length"] == batch.length and rec["rows"] == rows and rec["target"] == "exact"
        assert rec["repetitions"] == reps and v0.shape == vd.shape == vdelta.shape == (reps, rows)
        # the tables run_lab looked up at θ are ours (same values), one list per batch
        if bi not in first_t0:
            first_t0[bi] = t0
            for tab, ref in zip(t0, mine):
                np.testing.assert_allclose(tab.values, ref.values, rtol=TOY_ELBO_RTOL, atol=0)
        assert t0 is first_t0[bi]
        elbo = np.array([t.elbo for t in mine])

        # sampled fields: exactly what the draws give, up to the float64 rounding of the recomputation: sums of
        # ≤ 4·R one-sign terms (squared deviations, their means), relative rec_rtol; a bias is a mean minus the
        # ELBO, off by ≤ 2·R roundings of its size
        var_r = v0.var(0, ddof=1)
        bias_r = v0.mean(0) - elbo
        bias_tol = rounding_tol(float(np.abs(elbo).max()), n=2 * reps, dtype=torch.float64)
        assert rec["sampled_variance"] == pytest.approx(var_r.mean(), rel=rec_rtol)
        assert rec["sampled_bias"] == pytest.approx(bias_r.mean(), rel=0, abs=bias_tol)
        assert rec["sampled_mse"] == pytest.approx((bias_r**2 + var_r).mean(), rel=rec_rtol)
        assert rec["sampled_grad_variance"] == pytest.approx(vd.var(0, ddof=1).mean(), rel=rec_rtol)
        assert rec["sampled_diff_variance"] == pytest.approx(vdelta.var(0, ddof=1).mean(), rel=rec_rtol)
        indep = var_r + (v0 + vdelta).var(0, ddof=1)
        assert rec["sampled_diff_variance_independent"] == pytest.approx(indep.mean(), rel=rec_rtol)

        # exact figures, row by row, and the sampled ones within their standard errors
        m0 = [est.moments(t.stats()) for t in mine]
        md = [est.moments(t.stats()) for t in dtab]
        mdelta = [est.moments(t.stats()) for t in delta]
        mnear = [est.moments(SizeStats.from_table(a.values + d.values)) for a, d in zip(t0, delta)]
        var = np.array([m.variance for m in m0])
        bias = np.array([m.mean for m in m0]) - elbo
        # exact fields: the records average the same float64 moments over the rows (≤ 4·rows roundings); a bias
        # is a difference of two ELBO-sized numbers, each within moment_tol (tests/estimators/test_moments.py)
        moment_tol = max(bias_tol_of(t.stats()) for t in mine)
        assert rec["bias"] == pytest.approx(bias.mean(), rel=0, abs=moment_tol)
        assert rec["bias_sq"] == pytest.approx((bias**2).mean(), rel=0,
                                               abs=2 * np.abs(bias).max() * moment_tol + moment_tol**2)
        n = int(batch.completion_mask.sum(-1).max())
        if unbiased(est, n):
            np.testing.assert_allclose(bias, 0.0, atol=moment_tol)
        # mse = bias_sq + variance by definition (inf where the variance is)
        if math.isinf(rec["variance"]):
            assert math.isinf(rec["mse"]) and math.isnan(rec["check_max_abs_z"])
            assert math.isnan(rec["check_variance_ratio"])
        else:
            assert rec["mse"] == pytest.approx(rec["bias_sq"] + rec["variance"], rel=rounding_tol(1, 4, torch.float64))
        # variances: the same moments averaged (relative rec_rtol) — except the time/mask split, whose two parts
        # are differences of second moments each off by var_tol (test_moments.py) at the tables' size
        split_tol = 2 * max(var_tol(t.values, t.n) for t in mine)
        assert rec["variance"] == pytest.approx(var.mean(), rel=rec_rtol)
        assert rec["variance_t"] + rec["variance_mask"] == pytest.approx(rec["variance"], rel=rec_rtol, abs=split_tol)
        assert rec["grad_variance"] == pytest.approx(np.mean([m.variance for m in md]), rel=rec_rtol)
        assert rec["diff_variance"] == pytest.approx(np.mean([m.variance for m in mdelta]), rel=rec_rtol)
        exact_indep = var + np.array([m.variance for m in mnear])
        assert rec["diff_variance_independent"] == pytest.approx(exact_indep.mean(), rel=rec_rtol)
        if not math.isfinite(rec["variance"]):
            continue
        z = (v0.mean(0) - np.array([m.mean for m in m0])) / np.sqrt(var / reps)
        assert np.abs(z).max() < Z_MEAN, (label(est), z)
        assert rec["check_max_abs_z"] == pytest.approx(np.abs(z).max(), rel=rec_rtol)
        assert rec["check_max_abs_z"] < Z_MEAN
        assert rec["check_variance_ratio"] == pytest.approx((var_r / var).mean(), rel=rec_rtol)
        for b in range(rows):
            for x, exact, what in (
                (v0[:, b], m0[b].variance, "variance"),
                (vd[:, b], md[b].variance, "grad"),
                (vdelta[:, b], mdelta[b].variance, "diff"),
            ):
                s2, se = var_and_se(x)
                assert abs(s2 - exact) < Z_VAR * se, (label(est), rec["nfe"], b, what, s2, exact, se)
            x, y = v0[:, b], v0[:, b] + vdelta[:, b]
            se = ((x - x.mean()) ** 2 + (y - y.mean()) ** 2).std(ddof=1) / math.sqrt(reps)
            assert abs(indep[b] - exact_indep[b]) < Z_VAR * se, (label(est), b, "independent")


def test_run_lab_exact_and_sampled_figures_agree(lab):
    check_lab(lab)
    labels = {(r["length"], r["nfe"], label(e)) for r, e in zip(lab.records, lab.estimators)}
    assert len(labels) == len(lab.records) == 2 * (7 + 6)  # budgets 2 and 3 on two batches
    # the lab does tell biased estimators apart: exact-count SDMC integrates a step function
    assert (
        max(abs(r["bias"]) for r, e in zip(lab.records, lab.estimators) if label(e) == "sdmc[exact_count]")
        > 1e6 * lab_tol(lab)  # (far above an unbiased estimator's rounding)
    )


def test_records_have_every_field_but_the_split_ones(lab):
    for rec in lab.records:
        missing = set(RECORD_FIELDS) - set(SPLIT_FIELDS) - set(rec)
        assert not missing, (rec["estimator"], missing)
        for key in SAMPLED_FIELDS:
            assert math.isfinite(rec[key]), (key, rec)


def test_records_have_all_record_fields(lab):
    for rec in lab.records:
        assert set(RECORD_FIELDS) <= set(rec), set(RECORD_FIELDS) - set(rec)


def test_infinite_variance_is_reported_as_inf(lab):
    bern = [r for r, e in zip(lab.records, lab.estimators) if label(e) == "double_mc[bernoulli]"]
    assert len(bern) == 4
    for r in bern:
        assert math.isinf(r["variance"]) and math.isinf(r["mse"]) and math.isinf(r["grad_variance"])
        assert math.isinf(r["diff_variance"]) and math.isinf(r["diff_variance_independent"])
        assert math.isfinite(r["bias"]) and abs(r["bias"]) <= lab_tol(lab)  # (unbiased: rounding only)
        assert math.isfinite(r["variance_t"])  # the time part is finite; the mask part is not
        assert math.isinf(r["variance_mask"])


def test_shared_plans_shrink_the_elbo_difference_variance(lab):
    for r in lab.records:
        if math.isfinite(r["diff_variance_independent"]):
            assert r["diff_variance"] < 0.02 * r["diff_variance_independent"], r
        assert r["sampled_diff_variance"] < 0.02 * r["sampled_diff_variance_independent"], r
        assert r["sampled_diff_variance"] > 0  # the two policies do differ


@pytest.mark.slow
def test_run_lab_every_estimator_1500_repetitions():
    run = run_captured(lab_estimators, repetitions=1500)
    check_lab(run)
    assert {label(e) for e in run.estimators} >= CORE | {
        "sdmc[reference]",
        "coupled_sdmc[bernoulli]",
        "coupled[bernoulli,t~U(0.2,0.8)]",
    }


# ---------------------------------------------------------------- gradients


def direction_of(base, fd, eps: float) -> list[torch.Tensor]:
    """The lab's unit direction ``v = (θ_fd − θ)/ε``, read off the two float64 policies."""
    return [
        (pf.detach() - p0.detach()) / eps for p0, pf in zip(base.model.parameters(), fd.model.parameters())
    ]


def along(grads, v) -> float:
    return float(sum((g.double() * u).sum() for g, u in zip(grads, v)))


def rounding_table(t32: MaskTable, policy32, args) -> np.ndarray:
    """``|S32(m) − S64(m)|`` per mask: a float32 policy's table against the float64 table of the same weights."""
    p64 = copy.deepcopy(policy32)
    p64.model.double()
    return np.abs(t32.values - mask_table(p64, *args).values)


@pytest.mark.parametrize(("dtype", "eps"), [("float64", 1e-6), ("float32", 1e-3)])
def test_central_difference_gradient_matches_autograd(dtype, eps):
    policy = make_toy_policy(seed=TOY_SEED)
    cfg = LabConfig(num_directions=1, dtype=dtype, fd_epsilon=eps)
    base, ((plus, minus),), _ = lab_policies(policy, cfg)
    assert all(p.dtype == getattr(torch, dtype) for p in base.model.parameters())
    auto = lab_policies(policy, LabConfig(num_directions=1, dtype="float64", fd_epsilon=1e-6))
    auto_base, ((auto_plus, _),), _ = auto
    v = direction_of(auto_base, auto_plus, 1e-6)  # the unit direction, read off float64 copies
    # (θ + 1e-6·v − θ) / 1e-6 in float64: each entry off by ≤ eps64·max|θ| / 1e-6, the norm by ≤ √P times that
    theta = [p.detach() for p in auto_base.model.parameters()]
    v_tol = math.sqrt(sum(p.numel() for p in theta)) * EPS64 * max(float(p.abs().max()) for p in theta) / 1e-6
    assert math.sqrt(sum(float((u * u).sum()) for u in v)) == pytest.approx(1.0, abs=v_tol)
    # the lab's steps θ ± εv, rounded to the policies' dtype: the direction they realise (exactly, in float64)
    realised = [(pp.detach().double() - pm.detach().double()) / (2 * eps)
                for pp, pm in zip(plus.model.parameters(), minus.model.parameters())]
    batch = toy_batch(5, (5, 4), 7, seed=2)
    params = list(auto_base.model.parameters())
    est = SDMC(3, 1, "exact_count")
    plan = est.make_plan(batch.completion_mask, torch.Generator().manual_seed(5))
    for b in range(2):
        tp, tm = (mask_table(p, *row_args(batch, b)) for p in (plus, minus))
        fd_elbo = (tp.elbo - tm.elbo) / (2 * eps)
        dtab = tm.combine(tp, 0.5 / eps)  # the lab's D table
        # the same float64 sum in another order: ≤ 64 roundings of the two ELBOs' size, over 2ε
        order_tol = rounding_tol(abs(tp.elbo) + abs(tm.elbo), n=64, dtype=torch.float64) / (2 * eps)
        assert dtab.elbo == pytest.approx(fd_elbo, rel=0, abs=order_tol)
        # The FD's error: the tables' rounding δS (combined with weights ≥ 0, over 2ε), the steps' rounding (the
        # gradient along realised − v) and the truncation ε²·|f3|/6 (f3 the third derivative along v: at ε = 1e-3
        # it is ≤ 1e-7 here, measured in float64, far below the rounding terms). δS is measured: a float32 table
        # against the float64 table of the same weights; in float64 the same roundings are 2^29 times finer
        # (first-order rounding errors scale with the unit roundoff), with a factor 16 for their realisation.
        def measured(p, args):
            p32 = copy.deepcopy(p)
            p32.model.float()
            return rounding_table(mask_table(p32, *args), p32, args)

        delta = measured(plus, row_args(batch, b)) + measured(minus, row_args(batch, b))
        if dtype == "float64":
            delta = 16 * (EPS64 / EPS32) * delta
        delta[0] = 0.0  # (the empty mask scores 0 exactly)
        err = MaskTable(positions=tp.positions, values=delta, length=tp.length)
        truncation = 1e-6  # (the ε²·|f3|/6 above, with a factor 10 on its measured 1e-7)
        # (a) the exact ELBO's directional derivative, by autograd in float64
        exact = exact_elbo(
            auto_base,
            batch.prompt_ids[b : b + 1],
            batch.prompt_mask[b : b + 1],
            batch.completion[b : b + 1],
            batch.completion_mask[b : b + 1],
        )
        grads = torch.autograd.grad(exact.sequence[0], params)
        grad_exact = along(grads, v)
        step = abs(along(grads, realised) - grad_exact)
        tol = abs(err.elbo) / (2 * eps) + step + truncation
        assert fd_elbo == pytest.approx(grad_exact, rel=0, abs=tol)
        # (b) an SDMC plan's estimate: lookup in the D table vs autograd of score on the same plan
        s = score(auto_base, batch.prompt_ids, batch.prompt_mask, batch.completion, batch.completion_mask, plan)
        grads = torch.autograd.grad(s.sequence[b], params)
        grad_plan = along(grads, v)
        step = abs(along(grads, realised) - grad_plan)
        tol = abs(err.lookup(plan, b)) / (2 * eps) + step + truncation  # (the plan's weights are ≥ 0)
        assert dtab.lookup(plan, b) == pytest.approx(grad_plan, rel=0, abs=tol)
        assert abs(grad_plan) > 1e-3  # not a vacuous comparison


# ---------------------------------------------------------------- table lookup vs the model


@pytest.fixture(scope="module")
def wide_rows():
    """The float64 toy policy, a batch whose rows have 3 and 10 (≤ 16) maskable tokens, and their tables."""
    base = lab_policies(make_toy_policy(seed=TOY_SEED), LabConfig(num_directions=0, dtype="float64"))[0]
    batch = toy_batch(10, (3, 10), 12, seed=4)
    return base, batch, [mask_table(base, *row_args(batch, b)) for b in range(2)]


@pytest.mark.parametrize(
    "est",
    [
        SDMC(3, 1, "exact_count"),
        SDMC(2, 1, "bernoulli"),
        DoubleMC(3, "bernoulli"),
        DoubleMC(4, "exact_count", stratified=True),
        CoupledSDMC(3, 1, "exact_count"),
        Coupled(2, "exact_count", 0.0, 1.0),
    ],
    ids=label,
)
def test_table_values_equal_model_values(est, wide_rows):
    base, batch, tables = wide_rows
    reps = 6
    plan = stacked_plans(est, batch, reps, torch.Generator().manual_seed(6))
    assert plan.num_samples == reps * est.nfe
    by_table = table_values(tables, plan, reps)
    by_model = model_values(base, batch, plan, reps, micro_batch=16)
    assert by_table.shape == by_model.shape == (reps, 2)
    # the model's chunked float64 passes vs the tables' (one-sign combinations, the plan's weights alike)
    np.testing.assert_allclose(by_table, by_model, rtol=TOY_ELBO_RTOL, atol=0)
    assert np.abs(by_table).min() > 0.1


# ---------------------------------------------------------------- the time / mask split


def anova(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(between, within)`` of ``x (T, M, B)``: the estimators time_mask_split documents (unclipped)."""
    within = x.var(1, ddof=1).mean(0)
    return x.mean(1).var(0, ddof=1) - within / x.shape[1], within


def test_time_mask_split_matches_exact_moments():
    base = lab_policies(make_toy_policy(seed=TOY_SEED), LabConfig(num_directions=0, dtype="float64"))[0]
    batch = toy_batch(5, (5, 4), 7, seed=2)
    times, per_time = 1500, 2
    var_t, var_mask = time_mask_split(base, batch, times, per_time, 4096, torch.Generator().manual_seed(8))
    assert var_t.shape == var_mask.shape == (2,) and (var_t >= 0).all()
    # standard errors by batch means over 30 groups of an independent draw of the same design
    gen = torch.Generator().manual_seed(9)
    t = (1.0 - torch.rand((times, 2), generator=gen, dtype=torch.float64)).repeat_interleave(per_time, 0)
    masks, scale = sample_masks(batch.completion_mask, t, "exact_count", gen)
    with torch.no_grad():
        x = (
            sample_scores(
                base,
                batch.prompt_ids,
                batch.prompt_mask,
                batch.completion,
                batch.completion_mask,
                MaskPlan(masks=masks, weights=scale, t=t),
                4096,
            )
            .numpy()
            .reshape(times, per_time, 2)
        )
    groups = [anova(g) for g in np.split(x, 30)]
    se_t = np.std([g[0] for g in groups], axis=0, ddof=1) / math.sqrt(30)
    se_mask = np.std([g[1] for g in groups], axis=0, ddof=1) / math.sqrt(30)
    own_t, own_mask = anova(x)
    for b in range(2):
        m = DoubleMC(1, "exact_count").moments(mask_table(base, *row_args(batch, b)).stats())
        assert m.variance_mask > 1.0  # a split worth checking
        assert abs(var_mask[b] - m.variance_mask) < Z_MEAN * se_mask[b], (b, var_mask[b], m, se_mask[b])
        assert abs(var_t[b] - m.variance_t) < Z_MEAN * se_t[b], (b, var_t[b], m, se_t[b])
        # the independent draw agrees too (checks the SEs are of the right size)
        assert abs(own_mask[b] - m.variance_mask) < Z_MEAN * se_mask[b]
        assert abs(own_t[b] - m.variance_t) < Z_MEAN * se_t[b]


# ---------------------------------------------------------------- long canvases (no table)


@dataclass
class LongRun:
    base: object
    batch: LabBatch
    cfg: LabConfig
    records: list[dict]
    reference: np.ndarray  # (R, B) the reference repeats run_lab scored


@pytest.fixture(scope="module")
def long_run() -> LongRun:
    policy = make_toy_policy(seed=TOY_SEED)
    batch = toy_batch(5, (5, 5), 7, seed=2)
    cfg = LabConfig(
        long_budgets=(2, 3),
        exact_max_length=3,
        model_repetitions=8,
        num_directions=1,
        reference_nfe=32,
        reference_repeats=8,
        split_times=64,
        split_masks=2,
        seed=0,
    )
    calls = []
    original = analysis.model_values

    def spy(pol, b, plan, reps, micro_batch):
        out = original(pol, b, plan, reps, micro_batch)
        calls.append((plan.num_samples, reps, out))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis, "model_values", spy)
        records = run_lab(policy, [batch], cfg)
    s, reps, reference = calls[0]  # the reference is scored first
    assert (s, reps) == (cfg.reference_nfe * cfg.reference_repeats, cfg.reference_repeats)
    return LongRun(lab_policies(policy, cfg)[0], batch, cfg, records, reference)


def test_long_canvas_records(long_run):
    records, cfg = long_run.records, long_run.cfg
    assert {r["nfe"] for r in records} == {2, 3}
    assert len(records) == len(lab_estimators(2)) + len(lab_estimators(3))
    se_text = (
        f"mean SE {float((long_run.reference.std(0, ddof=1) / math.sqrt(cfg.reference_repeats)).mean()):.3g}"
    )
    iid_dmc = {}
    for r in records:
        assert r["target"].startswith("reference") and se_text in r["target"], r["target"]
        assert set(RECORD_FIELDS) - set(SPLIT_FIELDS) <= set(r)
        assert r["repetitions"] == cfg.model_repetitions
        for key in SAMPLED_FIELDS:
            assert math.isfinite(r[key]), (key, r)
        for key in EXACT_FIELDS:
            assert math.isnan(r[key]), (key, r)
        if r["estimator"] == "double_mc" and r["masking"] == "exact_count" and not r["stratified"]:
            assert r["sampled_variance_t"] >= 0 and r["sampled_variance_mask"] > 0
            iid_dmc[r["nfe"]] = r
        else:
            for key in SPLIT_FIELDS:
                assert math.isnan(r.get(key, math.nan)), (key, r)
        assert r["sampled_diff_variance"] < 0.05 * r["sampled_diff_variance_independent"]
    # one split per batch, divided by K
    assert set(iid_dmc) == {2, 3}
    for key in SPLIT_FIELDS:
        assert iid_dmc[2][key] == pytest.approx(1.5 * iid_dmc[3][key], rel=rounding_tol(1, 4, torch.float64))


def test_long_canvas_reference_is_close_to_the_exact_elbo(long_run):
    base, batch, cfg = long_run.base, long_run.batch, long_run.cfg
    target = long_run.reference.mean(0)
    ref_est = DoubleMC(cfg.reference_nfe, "exact_count", stratified=True)
    dmc = DoubleMC(3, "exact_count")
    rec = next(r for r in long_run.records if label_of(r) == "double_mc[exact_count]" and r["nfe"] == 3)
    bias_var = 0.0
    for b in range(2):
        stats = mask_table(base, *row_args(batch, b)).stats()  # n = 5: enumerable, for the test
        ref_se = math.sqrt(ref_est.moments(stats).variance / cfg.reference_repeats)
        assert abs(target[b] - stats.elbo) < 4 * ref_se, (b, target[b], stats.elbo, ref_se)
        assert ref_se < 0.1 * abs(stats.elbo)
        bias_var += dmc.moments(stats).variance / cfg.model_repetitions + ref_se**2
    # unbiased double MC against the reference: its sampled bias is within its SE of 0
    assert abs(rec["sampled_bias"]) < Z_MEAN * math.sqrt(bias_var) / 2


def label_of(rec: dict) -> str:
    return analysis.record_label(rec)


# ---------------------------------------------------------------- reporting


def parse_table(text: str) -> list[list[str]]:
    lines = text.splitlines()
    assert lines[1].startswith("|---")
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]


def test_summary_table_rows_and_ratios(lab):
    text = summary_table(lab.records, budgets=(2, 3))
    header = [c.strip() for c in text.splitlines()[0].strip().strip("|").split("|")]
    rows = parse_table(text)
    assert [(int(r[0]), int(r[1])) for r in rows] == [(4, 2), (4, 3), (5, 2), (5, 3)]
    by = {(r["length"], r["nfe"], label_of(r)): r for r in lab.records}
    for row in rows:
        cells = dict(zip(header, row))
        length, nfe = int(row[0]), int(row[1])
        dmc = by[(length, nfe, "double_mc[exact_count]")]
        for c in COMPARED:
            r = by.get((length, nfe, c))
            assert cells[f"MSE {c}"] == ("—" if r is None else f"{value(r, 'mse'):.3g}")
        for key, name in (("mse", "MSE"), ("grad_variance", "grad var")):
            for c, short in (("sdmc[exact_count]", "sdmc"), ("coupled_sdmc[exact_count]", "c-sdmc")):
                want = value(by[(length, nfe, c)], key) / value(dmc, key)
                assert cells[f"{name} {short}/dmc"] == f"{want:.2f}"
                assert math.isfinite(want) and want > 0
        share = dmc["variance_t"] / (dmc["variance_t"] + dmc["variance_mask"])
        assert cells["dmc var from t"] == f"{share:.0%}"
    # only the budgets present: NFE 4 has no row
    assert len(parse_table(summary_table(lab.records, budgets=(3, 4)))) == 2


def test_summary_table_does_not_hide_an_infinite_mse(lab):
    header = [
        c.strip() for c in summary_table(lab.records, (2,)).splitlines()[0].strip().strip("|").split("|")
    ]
    for row in parse_table(summary_table(lab.records, (2,))):
        cell = dict(zip(header, row))["MSE double_mc[bernoulli]"]
        assert cell == "inf" or cell.startswith("~"), cell


def test_summary_table_marks_sampled_figures(long_run):
    rows = parse_table(summary_table(long_run.records, budgets=(2, 3)))
    assert [(int(r[0]), int(r[1])) for r in rows] == [(5, 2), (5, 3)]
    for row in rows:
        # Bernoulli double MC has infinite variance at every length: "inf", not a sampled figure
        assert row[2] == "inf", row
        assert all(c.startswith("~") for c in row[3:7]), row


def test_summary_table_of_json_records(long_run):
    summary_table(to_json_records(long_run.records), budgets=(2, 3))


def test_to_json_records_is_strict_json(lab, long_run):
    records = lab.records + long_run.records
    out = to_json_records(records)
    assert len(out) == len(records)
    n_none = 0
    for rec, clean in zip(records, out):
        assert set(clean) == set(rec)
        for key, val in rec.items():
            if isinstance(val, float) and not math.isfinite(val):
                assert clean[key] is None
                n_none += 1
            else:
                assert clean[key] == val
    assert n_none > 0 and any(math.isinf(r["variance"]) for r in records)  # inf and nan both occurred
    text = json.dumps(out, allow_nan=False)
    assert json.loads(text) == out
    assert math.isinf(next(r["variance"] for r in records if r["masking"] == "bernoulli"))  # input untouched


def test_plot_results_writes_three_pngs(lab, long_run, tmp_path):
    paths = plot_results(lab.records + long_run.records, tmp_path)
    names = ["mse_vs_nfe.png", "grad_variance_vs_nfe.png", "variance_split.png"]
    assert [p.rsplit("/", 1)[-1] for p in paths] == names
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_infinite_variance_is_flagged_and_survives_json(lab):
    bern = [r for r in lab.records if r["estimator"] == "double_mc" and r["masking"] == "bernoulli"]
    others = [r for r in lab.records if r["estimator"] == "sdmc"]
    assert bern and others
    assert all(r["infinite_variance"] and math.isinf(r["variance"]) for r in bern)
    assert not any(r["infinite_variance"] for r in others)
    for rec, clean in zip(lab.records, to_json_records(lab.records)):
        assert clean["infinite_variance"] == rec["infinite_variance"]
        # the JSON form stores inf as null; value() still reads it as inf, and finite figures as they were
        assert value(clean, "mse") == value(rec, "mse") or math.isinf(value(rec, "mse")) and math.isinf(
            value(clean, "mse")
        )


def test_the_labs_trajectory_record_is_the_trajectory_score_against_the_exact_elbo():
    """The lab's trajectory value equals the trajectory estimator's score of the row along the lab's order (the
    sampled steps after one first step for the maskable cells the sampler did not write), and its gap is that
    minus the exact ELBO from enumeration."""
    from dlmrl.estimators import exact_elbo, score, trajectory_plan
    from dlmrl.estimators.analysis import LabBatch, LabConfig, lab_trajectory_order, run_lab
    from dlmrl.models.sampler import generate
    from tests.conftest import make_toy_policy

    policy = make_toy_policy()
    g = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask = torch.randint(0, 6, (2, 3), generator=g), torch.ones(2, 3, dtype=torch.bool)
    canvas = torch.full((2, 6), policy.mask_token_id)
    canvas[:, 0] = 2  # a given cell, maskable in the lab but not written by the sampler
    out = generate(policy, prompt_ids, prompt_mask, gen_length=6, block_length=6, steps=3, temperature=1.0,
                   canvas=canvas, generator=g)
    maskable = torch.ones(2, 6, dtype=torch.bool)
    batch = LabBatch(6, prompt_ids, prompt_mask, out.canvas, maskable, reveal_step=out.reveal_step)
    order = lab_trajectory_order(batch)
    assert order[:, 0].tolist() == [0, 0] and (order[:, 1:] == out.reveal_step[:, 1:] + 1).all()
    # float64 (the lab's copy and ours): the lab scores in its own batches, so the values agree to rounding
    cfg = LabConfig(budgets=(2,), repetitions=10, model_repetitions=2, num_directions=1, trajectory_merges=(1,),
                    dtype="float64")
    rec = next(r for r in run_lab(policy, [batch], cfg) if r["estimator"] == "trajectory")
    policy64 = make_toy_policy(dtype=torch.float64)  # (the same seed: the same weights)
    with torch.no_grad():
        plan = trajectory_plan(maskable, order, 1, 1.0)
        value = score(policy64, prompt_ids, prompt_mask, out.canvas, maskable, plan).sequence
        exact = exact_elbo(policy64, prompt_ids, prompt_mask, out.canvas, maskable).sequence
    # one-sign log-prob sums (trajectory weights 1; the exact ELBO's float32 weights: WEIGHT_RTOL)
    tol = (TOY_ELBO_RTOL + WEIGHT_RTOL) * float(value.abs().max() + exact.abs().max())
    assert rec["values"] == pytest.approx(value.tolist(), rel=0, abs=tol)
    assert rec["gaps"] == pytest.approx((value - exact).tolist(), rel=0, abs=tol)
    assert rec["nfe"] == 4.0 and rec["variance"] == 0.0  # 1 extra first step + 3 sampling steps
