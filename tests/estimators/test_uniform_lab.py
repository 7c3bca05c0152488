"""The uniform-noise variance lab (dlmrl/estimators/uniform_lab.py): each estimator's exact mean and variance against
independent computations (state-by-state loops, scipy's adaptive quadrature, the model itself), the flat CE's bias as
its exact expectation minus the ELBO, and the sampled figures against the exact ones."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.integrate import quad

from dlmrl.estimators.uniform_elbo import UniformDoubleMC, UniformFlatCE, UniformSDMC, uniform_nelbo_integrand
from dlmrl.estimators.uniform_exact import expected_flat_ce, uniform_exact_elbo
from dlmrl.estimators.uniform_lab import (
    UniformLabBatch,
    UniformLabConfig,
    double_mc_moments,
    flat_ce_moments,
    run_uniform_lab,
    sdmc_moments,
    state_table,
    table_denoiser,
    uniform_label,
    uniform_summary_table,
)
from tests.estimators.test_uniform_elbo import table_denoiser as random_table_denoiser
from tests.tolerances import EPS64, rounding_tol

VOCAB = 3


def setting():
    """One row, 3 positions, the last one clean context: 9 noise states over a vocabulary of 3."""
    x = torch.tensor([[2, 0, 1]])
    mask = torch.tensor([[True, True, False]])
    return x, mask, random_table_denoiser(VOCAB, 3, seed=3)


_LOGP: dict = {}


def by_state(denoise, x, mask, t: float):
    """``[(q_t(z | x), Σ_i ℓ_i(z, t), log x_θ,i(x_i | z) per position, z's digits)]`` over every state, one canvas at
    a time (the denoiser ignores t: its log-probs are computed once per canvas)."""
    pos = mask[0].nonzero()[:, 0].tolist()
    out = []
    for digits in itertools.product(range(VOCAB), repeat=len(pos)):
        z = x.clone()
        z[0, pos] = torch.tensor(digits)
        q = 1.0
        for i, d in zip(pos, digits):
            q *= (1 - t) * (d == int(x[0, i])) + t / VOCAB
        key = (id(denoise), digits)
        if key not in _LOGP:
            _LOGP[key] = torch.log_softmax(denoise(z[None], torch.tensor([t], dtype=torch.float64)).double(), -1)[0]
        logp = _LOGP[key]
        ell = float(uniform_nelbo_integrand(logp, z, x, t)[0, pos].sum())
        logp_x = [float(logp[0, i, int(x[0, i])]) for i in pos]
        out.append((q, ell, logp_x, digits))
    return out


def moments_at(denoise, x, mask, t: float) -> tuple[float, float]:
    rows = by_state(denoise, x, mask, t)
    return sum(q * ell for q, ell, _, _ in rows), sum(q * ell * ell for q, ell, _, _ in rows)


def test_table_denoiser_returns_the_denoisers_log_probs_for_any_canvas():
    x, mask, denoise = setting()
    table = state_table(denoise, x, mask, VOCAB)
    z = torch.tensor([[[1, 2, 1]], [[0, 0, 1]]])
    want = torch.log_softmax(denoise(z, torch.ones(2, dtype=torch.float64)), -1)
    assert torch.equal(table_denoiser(table)(z, torch.ones(2, dtype=torch.float64)), want)
    assert table.forward_passes == VOCAB**2


@pytest.mark.parametrize("stratified", [False, True])
def test_double_mc_moments_match_adaptive_quadrature_of_state_by_state_sums(stratified):
    x, mask, denoise = setting()
    table = state_table(denoise, x, mask, VOCAB)
    k, p = 2, 2
    est = UniformDoubleMC(k, stratified=stratified, time_exponent=p)
    m = double_mc_moments(table, est)
    fine = double_mc_moments(table, est, panels=40, nodes=10)
    edges = [0.0, 0.5, 1.0] if stratified else [0.0, 1.0]
    first, second, err = [], [], 0.0
    for a, b in itertools.pairwise(edges):
        f1, e1 = quad(lambda s: p * s ** (p - 1) * moments_at(denoise, x, mask, s**p)[0], a, b, limit=200)
        f2, e2 = quad(lambda s: (p * s ** (p - 1)) ** 2 * moments_at(denoise, x, mask, s**p)[1], a, b, limit=200)
        first.append(f1)
        second.append(f2)
        err += e1 + e2
    mean = -sum(first)
    var = sum(s2 / k - s1**2 for s1, s2 in zip(first, second)) if stratified else (second[0] - first[0] ** 2) / k
    # quad's own error estimates, the graded rule's (its distance to a much finer rule), float64 rounding of the sums
    tol_mean = err + abs(fine.mean[0] - m.mean[0]) + rounding_tol(abs(mean), 1000, torch.float64)
    tol_var = err * (1 + 2 * abs(mean)) + abs(fine.variance[0] - m.variance[0]) + rounding_tol(var, 1000, torch.float64)
    assert abs(m.mean[0] - mean) <= tol_mean
    assert abs(m.variance[0] - var) <= tol_var
    # split at other budgets' strata (as the lab integrates), the same integrals
    split = double_mc_moments(table, est, breaks=[Fraction(1, 8), Fraction(1, 3), Fraction(3, 4)])
    assert abs(split.mean[0] - m.mean[0]) <= tol_mean and abs(split.variance[0] - m.variance[0]) <= tol_var
    # the mean is the ELBO: unbiased
    exact = uniform_exact_elbo(denoise, x, mask, VOCAB)
    assert abs(m.mean[0] - float(exact.estimate.sequence[0])) <= tol_mean + float(exact.error_estimate[0])


def test_double_mc_with_uniform_time_has_infinite_variance():
    x, mask, denoise = setting()
    table = state_table(denoise, x, mask, VOCAB)
    assert math.isinf(double_mc_moments(table, UniformDoubleMC(3, time_exponent=1)).variance[0])


@pytest.mark.parametrize("p,k", [(1, 1), (2, 3)])
def test_sdmc_moments_are_the_weighted_state_variances_at_its_nodes(p, k):
    x, mask, denoise = setting()
    est = UniformSDMC(3, k, time_exponent=p)
    m = sdmc_moments(state_table(denoise, x, mask, VOCAB), est)
    t, w = est.nodes()
    mean = var = 0.0
    for tn, wn in zip(t.tolist(), w.tolist()):
        g, m2 = moments_at(denoise, x, mask, tn)
        mean -= wn * g
        var += wn * wn * (m2 - g * g) / k
    assert m.mean[0] == pytest.approx(mean, rel=0, abs=rounding_tol(abs(mean), 100, torch.float64))
    assert m.variance[0] == pytest.approx(var, rel=0, abs=rounding_tol(var + mean**2, 100, torch.float64))


@pytest.mark.parametrize("support", ["all", "corrupted"])
def test_flat_ce_moments_match_corruption_patterns_enumerated_and_adaptive_quadrature(support):
    x, mask, denoise = setting()
    eps, k = 1e-3, 2
    m = flat_ce_moments(state_table(denoise, x, mask, VOCAB), UniformFlatCE(k, eps=eps, support=support))
    pos = mask[0].nonzero()[:, 0].tolist()

    def moments(t):
        e1 = e2 = 0.0
        for _, _, logp_x, digits in by_state(denoise, x, mask, t):
            for flags in itertools.product((0, 1), repeat=len(pos)):  # which positions were redrawn
                prob = 1.0
                for i, d, c in zip(pos, digits, flags):
                    prob *= t / VOCAB if c else (1 - t) * (d == int(x[0, i]))
                y = sum(a for a, c in zip(logp_x, flags) if c or support == "all")
                e1, e2 = e1 + prob * y, e2 + prob * y * y
        return e1, e2

    f1, err1 = quad(lambda t: moments(t)[0], eps, 1)
    f2, err2 = quad(lambda t: moments(t)[1], eps, 1)
    mean, second = f1 / (1 - eps), f2 / (1 - eps)
    var = (second - mean**2) / k
    tol = (err1 + err2) * (1 + 2 * abs(mean)) + rounding_tol(second, 1000, torch.float64)
    assert abs(m.mean[0] - mean) <= tol and abs(m.variance[0] - var) <= tol
    # and the module's own expectation (uniform_exact.expected_flat_ce) agrees
    assert float(expected_flat_ce(denoise, x, mask, VOCAB, eps, support).sum()) == pytest.approx(
        m.mean[0], rel=0, abs=tol)


def test_lab_on_a_tiny_diffusion_gemma_against_independent_computations():
    from dlmrl.training.uniform_elbo_scorer import canvas_denoiser
    from dlmrl.training.uniform_estimator_lab import tiny_lab_model, uniform_lab_batches

    model = tiny_lab_model(seed=0)
    (batch,) = uniform_lab_batches(model, lengths=(2,), rows=2, seed=0)
    x, mask, n = batch.x, batch.completion_mask, batch.vocab_size
    table = state_table(batch.denoise, x, mask, n)
    # the lookup against the model's own pass over every state (same batch shape: bit-identical), states shuffled
    direct = canvas_denoiser(model, batch.prompt_ids, batch.prompt_mask, x, mask, 4)
    with torch.no_grad():
        want = torch.log_softmax(direct(table.z, torch.ones(table.z.shape[0], dtype=torch.float64)).double(), -1)
    perm = torch.randperm(table.z.shape[0], generator=torch.Generator().manual_seed(0))
    assert torch.equal(table_denoiser(table)(table.z[perm], None), want[perm])

    cfg = UniformLabConfig(budgets=(2,), repetitions=300, seed=0)
    records = run_uniform_lab([batch], cfg)
    by = {uniform_label(r): r for r in records}
    assert set(by) == {"uniform_double_mc[p=1]", "uniform_double_mc[p=2]", "uniform_double_mc[p=2,strat]",
                       "uniform_sdmc[p=1]", "uniform_sdmc[p=2]", "uniform_flat_ce[all]", "uniform_flat_ce[corrupted]"}
    lookup = table_denoiser(table)
    exact = uniform_exact_elbo(lookup, x, mask, n, cfg.panels, cfg.nodes_per_panel)
    target = exact.estimate.sequence.double()
    err = float(exact.error_estimate.max())
    assert by["uniform_double_mc[p=2]"]["target_error"] == pytest.approx(err, rel=1e-6)
    # double MC is unbiased: its mean (a quadrature over s) and the target (one over t) are two rules for the same
    # integral, each within the target's error estimate (the s-integrand, 2s·g(s²), is the smoother one)
    for name in ("uniform_double_mc[p=1]", "uniform_double_mc[p=2]", "uniform_double_mc[p=2,strat]"):
        assert abs(by[name]["bias"]) <= 2 * err + rounding_tol(float(target.abs().max()), 1000, torch.float64), name
    # the flat CE is a surrogate: its bias is its exact expectation (uniform_exact.expected_flat_ce) minus the ELBO
    for support in ("all", "corrupted"):
        flat = expected_flat_ce(lookup, x, mask, n, cfg.eps, support).sum(-1)
        flat_bias = float((flat - target).mean())
        scale = float(flat.abs().max() + target.abs().max())
        assert by[f"uniform_flat_ce[{support}]"]["bias"] == pytest.approx(
            flat_bias, rel=0, abs=rounding_tol(scale, 1000, torch.float64))
        assert abs(flat_bias) > 1e3 * err  # (and it is not 0)
    assert by["uniform_double_mc[p=1]"]["infinite_variance"] and math.isinf(by["uniform_double_mc[p=1]"]["mse"])
    for name, r in by.items():
        assert math.isinf(r["mse"]) or r["mse"] == pytest.approx(r["bias_sq"] + r["variance"], rel=4 * EPS64)
        assert r["nfe"] == 2
        if not r["infinite_variance"]:
            # the sampled means within 5 standard errors of the exact ones (seeded; 6 estimators × 2 rows)
            assert r["check_max_abs_z"] < 5, name
    table_md = uniform_summary_table(records)
    assert "| 2 | 2 | uniform_double_mc[p=1] | " in table_md and "| inf | inf |" in table_md


def test_lab_refuses_rows_with_too_many_states():
    x, mask, denoise = setting()
    batch = UniformLabBatch(2, denoise, x, mask, VOCAB)
    with pytest.raises(ValueError, match="max_states"):
        run_uniform_lab([batch], UniformLabConfig(budgets=(1,), repetitions=2, max_states=8))


def test_sampled_values_average_to_the_exact_means():
    """The vectorised sampler (all plans scored in one pass) against the exact moments, 2000 draws per estimator."""
    x, mask, denoise = setting()
    batch = UniformLabBatch(2, denoise, x, mask, VOCAB)
    records = run_uniform_lab([batch], UniformLabConfig(budgets=(3,), repetitions=2000))
    for r in records:
        if not r["infinite_variance"]:
            assert r["check_max_abs_z"] < 5, uniform_label(r)
            assert np.isfinite(r["check_variance_ratio"])
