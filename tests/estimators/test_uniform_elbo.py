"""Uniform-noise ELBO (UDLM arXiv 2412.10193, Duo arXiv 2506.10892): the integrand by hand and as the reverse step's
KL rate, the bound against exact likelihoods, each estimator's mean against exact enumeration, a perfect denoiser."""

from __future__ import annotations

import functools
import itertools
import math

import mpmath
import pytest
import torch
import torch.nn.functional as F

from dlmrl.errors import ConfigError, OptionError
from dlmrl.estimators.uniform_elbo import (
    UniformDoubleMC,
    UniformFlatCE,
    UniformNoisePlan,
    UniformSDMC,
    uniform_draw_terms,
    uniform_nelbo_integrand,
)
from dlmrl.estimators.uniform_exact import (
    UniformExact,
    discrete_time_elbo,
    discrete_time_log_likelihood,
    expected_flat_ce,
    expected_integrand,
    graded_gauss_legendre,
    uniform_exact_elbo,
    uniform_posterior,
)
from tests.tolerances import EPS32, EPS64, NODE_TOL, rounding_tol

VOCAB = 3


def table_denoiser(vocab: int, length: int, seed: int, time_dependent: bool = False, scale: float = 1.0):
    """A float64 denoiser whose logits at position i depend on every token of z (a random table) and, optionally, on t.

    ``logits[k, b, i] = bias[i] + Σ_j table[i, j, z_j] (+ t_k · slope[i])``: smooth in t, as the exact quadrature
    assumes; rows of the batch share the table (it plays the policy, the batch's rows are different x).
    """
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(length, length, vocab, vocab, generator=g, dtype=torch.float64) * scale
    bias = torch.randn(length, vocab, generator=g, dtype=torch.float64)
    slope = torch.randn(length, vocab, generator=g, dtype=torch.float64)

    def denoise(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = bias + torch.einsum("kbjv,ijvo->kbio", F.one_hot(z, vocab).double(), table)
        if time_dependent:
            logits = logits + t.to(torch.float64)[:, None, None, None] * slope
        return logits

    return denoise


def constant_denoiser(log_probs: torch.Tensor):
    """``x_θ(z, t) = π`` for every z and t: ``log_probs (B, L, N)``."""

    def denoise(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return log_probs[None].expand(z.shape[0], -1, -1, -1)

    return denoise


def perfect_denoiser(x: torch.Tensor, vocab: int):
    """``x_θ = one-hot(x)`` exactly: logits 0 at the clean token, -inf elsewhere."""
    logits = torch.where(F.one_hot(x, vocab).bool(), 0.0, float("-inf")).double()  # (B, L, N)
    return constant_denoiser(logits)


def example():
    """Two rows, L = 3: row 0 scores positions 0 and 1 (position 2 is context), row 1 scores all three."""
    x = torch.tensor([[0, 2, 1], [1, 1, 0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return x, mask


# ----------------------------------------------------------------------------- (a) the integrand


def test_integrand_by_hand_two_tokens_three_symbols():
    # N = 3, t = 0.4 (α = 0.6), x = (0, 1), z_t = (0, 2): position 0 uncorrupted, position 1 corrupted to 2.
    x_theta = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]], dtype=torch.float64)  # (1, L=2, N=3)
    got = uniform_nelbo_integrand(x_theta.log(), torch.tensor([[0, 2]]), torch.tensor([[0, 1]]), 0.4)
    # UDLM's form, written out: coef = α'/(Nα) = -1/1.8, bracket = N/x̄_i − N/x̄θ_i − Σ_{j≠i} (x̄_j/x̄_i) log(x̄θ_i x̄_j / (x̄θ_j x̄_i)).
    # position 0: x̄ = (3·.6 + .4, .4, .4) = (2.2, .4, .4); x̄θ = 1.8·(.5, .3, .2) + .4 = (1.3, .94, .76); i = 0
    b0 = 3 / 2.2 - 3 / 1.3 - (0.4 / 2.2) * (math.log(1.3 * 0.4 / (0.94 * 2.2)) + math.log(1.3 * 0.4 / (0.76 * 2.2)))
    # position 1: x̄ = (.4, 2.2, .4); x̄θ = 1.8·(.1, .6, .3) + .4 = (.58, 1.48, .94); i = 2
    b1 = 3 / 0.4 - 3 / 0.94 - ((0.4 / 0.4) * math.log(0.94 * 0.4 / (0.58 * 0.4))
                               + (2.2 / 0.4) * math.log(0.94 * 2.2 / (1.48 * 0.4)))
    want = torch.tensor([[-b0 / 1.8, -b1 / 1.8]], dtype=torch.float64)
    assert (got > 0).all()  # a KL rate
    # float64, ~30 roundings of terms of size ≤ 10 on either side (the hand form cancels N/x̄ terms of size 7.5)
    torch.testing.assert_close(got, want, rtol=0, atol=rounding_tol(scale=10, n=60, dtype=torch.float64))


def _udlm_mp(logp: list[float], z: int, x: int, t: float, n: int) -> mpmath.mpf:
    """UDLM's integrand in 50-digit arithmetic (the reference for the extreme times), from float64 log-probabilities.

    The probabilities are normalised in 50 digits: UDLM's form uses ``Σ_j x̄_θ,j = N``, and near ``t = 1`` its
    bracket (~α²) is small enough that a float64 normalisation error (~1e-16, times ``Nα``) would show.
    """
    mpmath.mp.dps = 50
    p = [mpmath.exp(mpmath.mpf(v)) for v in logp]
    p = [v / sum(p) for v in p]
    t = mpmath.mpf(t)
    a = 1 - t
    xb = [n * a * (j == x) + 1 - a for j in range(n)]
    xt = [n * a * p[j] + 1 - a for j in range(n)]
    s = sum(xb[j] / xb[z] * mpmath.log(xt[z] * xb[j] / (xt[j] * xb[z])) for j in range(n) if j != z)
    return (-1 / (n * a)) * (n / xb[z] - n / xt[z] - s)


@pytest.mark.parametrize("t", [1e-7, 1e-3, 0.5, 1 - 1e-3, 1 - 1e-7])
def test_integrand_is_accurate_at_extreme_times_in_float64_and_float32(t):
    # Near t = 1 UDLM's form cancels (its bracket is O(α²) made of O(1) terms); ours sums non-negative KL-rate terms.
    n = 5
    g = torch.Generator().manual_seed(3)
    logp = torch.log_softmax(torch.randn(n, n, generator=g, dtype=torch.float64), -1)  # one row per z value
    z, x = torch.arange(n), torch.full((n,), 1)
    want = torch.tensor([float(_udlm_mp(logp[k].tolist(), k, 1, t, n)) for k in range(n)], dtype=torch.float64)
    # Rounding: y_j = (L_θ,j − L_θ,i) − log ρ_j (L = log1p(r·x_θ), r = Nα/(1 − α)) is a difference of terms of size
    # ≤ |L|, so its relative error is ≤ a few eps·|L|/|y|; h(y) ≈ y²/2 doubles it, and the ≤ 20 other roundings of
    # each non-negative term add eps each. Hence 64·eps·cond with cond = max_j (|L_θ,j| + |L_θ,i| + 2 log1p(r))/|y_j|,
    # computed here from the inputs (float64, outside the code under test).
    r = n * (1 - t) / t
    lt = torch.log1p(r * logp.exp())
    lx = math.log1p(r)
    cond = 1.0
    for k in range(n):
        l_true = torch.where(torch.arange(n) == 1, lx, 0.0)
        y = (lt[k] - lt[k, k]) - (l_true - l_true[k])
        size = lt[k].abs() + lt[k, k].abs() + 2 * lx
        nz = y.abs() > 0
        cond = max(cond, float((size[nz] / y[nz].abs()).max()))
    got64 = uniform_nelbo_integrand(logp, z, x, t)
    torch.testing.assert_close(got64, want, rtol=64 * EPS64 * cond, atol=0)
    got32 = uniform_nelbo_integrand(logp.float(), z, x, t)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, rtol=64 * EPS32 * cond, atol=0)


def test_integrand_is_the_kl_rate_of_the_reverse_step():
    # UDLM's continuous-time limit: KL(q(z_s | z_t, x) ‖ p_θ(z_s | z_t)) / (t − s) → ℓ(z_t, t) as s → t. The
    # error is first order in Δ = t − s, so it shrinks ~10x per decade of Δ.
    g = torch.Generator().manual_seed(5)
    logp = torch.log_softmax(torch.randn(4, VOCAB, generator=g, dtype=torch.float64), -1)
    z = torch.tensor([0, 1, 2, 0])
    x = torch.tensor([0, 0, 1, 2])
    t = 0.37
    ell = uniform_nelbo_integrand(logp, z, x, t)
    x_hot = F.one_hot(x, VOCAB).double()
    errors = []
    for delta in (1e-3, 1e-4, 1e-5):
        q = uniform_posterior(x_hot, z, 1 - (t - delta), 1 - t)
        p = uniform_posterior(logp.exp(), z, 1 - (t - delta), 1 - t)
        kl = (q * (q.log() - p.log())).sum(-1)
        errors.append((kl / delta - ell).abs())
    assert (errors[1] < errors[0] / 5).all() and (errors[2] < errors[1] / 5).all(), errors
    assert (errors[2] < 1e-4 * ell).all(), (errors[2], ell)


def test_posterior_matches_udlms_closed_form():
    g = torch.Generator().manual_seed(6)
    probs = torch.softmax(torch.randn(5, VOCAB, generator=g, dtype=torch.float64), -1)
    z = torch.tensor([0, 1, 2, 2, 1])
    a_s, a_t, n = 0.7, 0.3, VOCAB
    zt = F.one_hot(z, n).double()
    num = n * a_t * zt * probs + (a_t / a_s - a_t) * zt + (a_s - a_t) * probs + (a_s - a_t) * (1 - a_s) / (n * a_s)
    closed = num / (n * a_t * (zt * probs).sum(-1, keepdim=True) + 1 - a_t)
    torch.testing.assert_close(uniform_posterior(probs, z, a_s, a_t), closed, rtol=0,
                               atol=rounding_tol(scale=1, n=16, dtype=torch.float64))


# ----------------------------------------------------------------------------- (d) a perfect denoiser


def test_perfect_denoiser_scores_zero_everywhere():
    # x_θ = x gives x̄_θ = x̄: every KL rate is 0, so ℓ = 0 at every z_t and t, the ELBO is 0 = log p(x) = log 1.
    x, mask = example()
    denoise = perfect_denoiser(x, VOCAB)
    t = torch.tensor([1e-9, 1e-3, 0.5, 1 - 1e-9, 1.0], dtype=torch.float64)
    assert torch.equal(expected_integrand(denoise, x, mask, VOCAB, t), torch.zeros(5, *x.shape, dtype=torch.float64))
    assert torch.equal(uniform_exact_elbo(denoise, x, mask, VOCAB).estimate.per_token, torch.zeros(x.shape).double())
    for est in (UniformDoubleMC(num_samples=8), UniformDoubleMC(num_samples=8, time_exponent=1, stratified=True),
                UniformSDMC(num_nodes=3, samples_per_node=2), UniformFlatCE(num_samples=4),
                UniformFlatCE(num_samples=4, support="corrupted")):
        out = est.estimate(denoise, x, mask, VOCAB, generator=0)
        assert torch.equal(out.per_token, torch.zeros(x.shape).double()), est
    # the grid model too, up to the rounding of its normalised reverse steps: 5 products of ≤ 27×27 stochastic
    # matrices (sums of ≤ 27 products of 3 factors, each normalised)
    tol = rounding_tol(scale=1, n=5 * 27 * 8, dtype=torch.float64)
    torch.testing.assert_close(discrete_time_log_likelihood(denoise, x, mask, VOCAB, steps=5),
                               torch.zeros(2).double(), rtol=0, atol=tol)
    torch.testing.assert_close(discrete_time_elbo(denoise, x, mask, VOCAB, steps=5),
                               torch.zeros(x.shape).double(), rtol=0, atol=tol)


# ----------------------------------------------------------------------------- (b) the bound


def test_constant_denoiser_elbo_is_tight_and_equals_its_log_likelihood():
    # With x_θ = π fixed, UDLM's plug-in reverse step is the exact reversal of the chain started at x ~ π: the model's
    # marginal at t = 0 is π itself for any number of steps, log p(x) = Σ_i log π_i(x_i), and its posterior over
    # noise paths given x is the forward process given x, so the bound is tight: ELBO = log p(x), on every grid and
    # in continuous time. A closed form for ∫_0^1 E_z ℓ dt = −Σ_i log π_i(x_i), whatever π.
    x, mask = example()
    g = torch.Generator().manual_seed(7)
    log_pi = torch.log_softmax(torch.randn(2, 3, VOCAB, generator=g, dtype=torch.float64), -1)
    denoise = constant_denoiser(log_pi)
    log_p = torch.where(mask, torch.gather(log_pi, -1, x[..., None]).squeeze(-1), 0.0)  # (B, L)
    scale = log_p.abs().sum(-1).max().item()
    for steps in (1, 7, 64):
        # float64: steps products of ≤ 27×27 stochastic matrices (entries: sums of ≤ 27 products of 3 normalised
        # factors); the grid ELBO sums steps × 27 weighted KLs
        tol = rounding_tol(scale=scale, n=steps * 27 * 8, dtype=torch.float64)
        torch.testing.assert_close(discrete_time_log_likelihood(denoise, x, mask, VOCAB, steps), log_p.sum(-1),
                                   rtol=0, atol=tol)
        torch.testing.assert_close(discrete_time_elbo(denoise, x, mask, VOCAB, steps), log_p, rtol=0, atol=tol)
    exact = uniform_exact_elbo(denoise, x, mask, VOCAB)
    # the quadrature's error estimate, plus float64 rounding of 1200 nodes × 27 states of terms of size ≤ scale
    tol = exact.error_estimate + rounding_tol(scale=scale, n=1200 * 27, dtype=torch.float64)
    assert ((exact.estimate.sequence - log_p.sum(-1)).abs() <= tol).all(), (exact.estimate.sequence, log_p.sum(-1))


@pytest.mark.parametrize("time_dependent", [False, True])
def test_grid_elbo_bounds_the_grid_likelihood_and_tends_to_the_continuous_elbo(time_dependent):
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=0, time_dependent=time_dependent)
    exact = uniform_exact_elbo(denoise, x, mask, VOCAB)
    assert (exact.error_estimate < 1e-6).all()
    gaps = []
    for steps in (1, 4, 16, 64, 256):
        elbo = discrete_time_elbo(denoise, x, mask, VOCAB, steps).sum(-1)
        log_p = discrete_time_log_likelihood(denoise, x, mask, VOCAB, steps)
        assert (elbo < log_p).all(), (steps, elbo, log_p)  # ELBO_T ≤ log p_T(x): Jensen, for every T
        if steps >= 64:
            # p_T tends to the continuous-time model (here log p_T moves by ≤ 0.3 nats from T = 64 to 1024, at O(1/T)),
            # whose log-likelihood the continuous ELBO bounds: it sits > 0.5 nats below
            assert (exact.estimate.sequence < log_p - 0.5).all(), (steps, exact.estimate.sequence, log_p)
        gaps.append((elbo - exact.estimate.sequence).abs())
    # the grid sum is a first-order (Riemann-like) discretisation of the integral: the gap falls ~4x per 4x steps
    # (a little less with the log singularity at t = 0); a wrong integrand would leave a gap that does not vanish
    for a, b in itertools.pairwise(gaps[1:]):  # (from T = 4: one step is not yet in the asymptotic regime)
        assert (b < a / 2).all(), gaps
    assert (gaps[-1] < 0.01).all(), gaps


# ----------------------------------------------------------------------------- (c) the estimators against enumeration


def _repeat(estimator, denoise, x, mask, reps: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([
            estimator.estimate(denoise, x, mask, VOCAB, generator=torch.Generator().manual_seed(r)).sequence
            for r in range(reps)
        ]).double()  # (R, B)


def _assert_mean(draws: torch.Tensor, expected: torch.Tensor, slack: torch.Tensor | float = 0.0) -> None:
    mean = draws.mean(0)
    se = draws.std(0) / math.sqrt(draws.shape[0])
    # 4 standard errors measured on the same draws: P(|z| > 4) = 6e-5 for a seed change (the seeds are fixed). For
    # time_exponent = 1 the variance is infinite, but the tail (~y^-2 log² y) keeps the self-normalised mean
    # asymptotically normal (domain of attraction of the normal law), so the same test applies.
    assert ((mean - expected).abs() <= 4 * se + slack).all(), (mean, expected, se)


@functools.cache
def _exact_time_dependent():
    """The exact ELBO of :func:`example` under the time-dependent table denoiser (seed 1), computed once."""
    x, mask = example()
    return uniform_exact_elbo(table_denoiser(VOCAB, 3, seed=1, time_dependent=True), x, mask, VOCAB)


@pytest.mark.parametrize(("time_exponent", "stratified"), [(1, False), (1, True), (2, False), (2, True)])
def test_double_mc_is_unbiased_for_the_exact_elbo(time_exponent, stratified):
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=1, time_dependent=True)
    exact = _exact_time_dependent()
    est = UniformDoubleMC(num_samples=8, stratified=stratified, time_exponent=time_exponent)
    _assert_mean(_repeat(est, denoise, x, mask, reps=300), exact.estimate.sequence, exact.error_estimate)


@pytest.mark.parametrize("time_exponent", [1, 2])
def test_sdmc_averages_to_its_quadrature_of_the_enumerated_integrand(time_exponent):
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=2)
    est = UniformSDMC(num_nodes=3, samples_per_node=2, time_exponent=time_exponent)
    t, w = est.nodes()
    expected = -(w[:, None] * expected_integrand(denoise, x, mask, VOCAB, t).sum(-1)).sum(0)
    _assert_mean(_repeat(est, denoise, x, mask, reps=300), expected)


@pytest.mark.parametrize("time_exponent", [1, 2])
def test_sdmc_quadrature_converges_to_the_exact_elbo_as_nodes_grow(time_exponent):
    # The integrand has a log(1/t) singularity at t = 0, so Gauss–Legendre converges algebraically: ~N^-2 in t,
    # ~N^-4 in s = √t (the singularity becomes s log s). Either way the bias at least halves per doubling.
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=2)
    exact = uniform_exact_elbo(denoise, x, mask, VOCAB)
    biases = []
    for n in (2, 4, 8, 16, 32):
        t, w = UniformSDMC(num_nodes=n, time_exponent=time_exponent).nodes()
        value = -(w[:, None] * expected_integrand(denoise, x, mask, VOCAB, t).sum(-1)).sum(0)
        biases.append((value - exact.estimate.sequence).abs())
    for a, b in itertools.pairwise(biases[1:]):  # (from N = 4: 2 nodes are not yet in the asymptotic regime)
        assert (b < a / 2).all(), biases
    assert (biases[-1] < 1e-2).all(), biases


@pytest.mark.parametrize("support", ["all", "corrupted"])
def test_flat_ce_averages_to_its_enumerated_expectation(support):
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=3)
    est = UniformFlatCE(num_samples=4, support=support)
    expected = expected_flat_ce(denoise, x, mask, VOCAB, eps=est.eps, support=support).sum(-1)
    _assert_mean(_repeat(est, denoise, x, mask, reps=300), expected)


def test_flat_ce_of_a_constant_denoiser_is_its_log_likelihood():
    # log p_θ(x_i | z) = log π_i(x_i) whatever z: the 'all' support sums exactly log p(x) (a surrogate that happens
    # to be exact here, while the ELBO stays strictly below it)
    x, mask = example()
    log_pi = torch.log_softmax(torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(8),
                                           dtype=torch.float64), -1)
    log_p = torch.where(mask, torch.gather(log_pi, -1, x[..., None]).squeeze(-1), 0.0).sum(-1)
    got = UniformFlatCE(num_samples=5).estimate(constant_denoiser(log_pi), x, mask, VOCAB, generator=0).sequence
    torch.testing.assert_close(got, log_p, rtol=0, atol=rounding_tol(scale=abs(log_p).max().item(), n=20,
                                                                      dtype=torch.float64))


def test_exact_rule_agrees_with_a_much_finer_one_within_its_error_estimate():
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=4, scale=2.0, time_dependent=True)
    default = uniform_exact_elbo(denoise, x, mask, VOCAB)
    fine = uniform_exact_elbo(denoise, x, mask, VOCAB, panels=56, nodes_per_panel=16)
    assert ((default.estimate.sequence - fine.estimate.sequence).abs() <= default.error_estimate).all()
    assert (default.error_estimate < 1e-6).all()
    t, w = graded_gauss_legendre(40, 10)
    assert t.shape == (800,) and bool((t > 0).all() and (t < 1).all() and (t.diff() > 0).all())
    assert abs(w.sum().item() - 1.0) < NODE_TOL
    # the same value through the estimator interface
    est = UniformExact().estimate(denoise, x, mask, VOCAB)
    assert torch.equal(est.per_token, default.estimate.per_token)
    assert UniformExact().describe().trainable is False


def test_exact_handles_rows_of_different_lengths_and_an_empty_row():
    x = torch.tensor([[0, 2, 1], [1, 1, 0], [2, 0, 0]])
    mask = torch.tensor([[True, False, False], [True, True, True], [False, False, False]])
    denoise = table_denoiser(VOCAB, 3, seed=9)
    both = uniform_exact_elbo(denoise, x, mask, VOCAB).estimate
    assert both.sequence[2] == 0 and (both.per_token[~mask] == 0).all()
    # each row alone (a batch of one) gives the same per-token values: the padding states carry probability 0
    for b in range(2):
        alone = uniform_exact_elbo(denoise, x[b : b + 1], mask[b : b + 1], VOCAB).estimate
        torch.testing.assert_close(alone.per_token[0], both.per_token[b], rtol=0,
                                   atol=rounding_tol(scale=10, n=2000, dtype=torch.float64))
    with pytest.raises(ValueError, match="max_states"):
        uniform_exact_elbo(denoise, x, mask, VOCAB, max_states=26)


# ----------------------------------------------------------------------------- plans, randomness, interface


def test_noise_follows_the_forward_process_and_keeps_context_clean():
    x, mask = example()
    est = UniformSDMC(num_nodes=1, samples_per_node=20000)  # one node: t = 0.5
    plan = est.make_plan(x, mask, VOCAB, generator=0)
    assert torch.equal(plan.t, torch.full((20000,), 0.5, dtype=torch.float64))
    assert (plan.z_t[:, ~mask] == x[~mask]).all() and not plan.corrupted[:, ~mask].any()
    assert ((plan.z_t != x) <= plan.corrupted).all()  # a changed token was redrawn; a redraw may keep it
    same = (plan.z_t == x).double()[:, mask]  # (S, scored positions)
    p = 0.5 + 0.5 / VOCAB  # P(z_t = x) = α + (1 − α)/N
    se = math.sqrt(p * (1 - p) / plan.z_t.shape[0])
    assert ((same.mean(0) - p).abs() < 4 * se).all()
    redrawn_same = ((plan.z_t == x) & plan.corrupted).double()[:, mask].mean(0)
    assert ((redrawn_same - 0.5 / VOCAB).abs() < 4 * math.sqrt(0.5 / VOCAB / plan.z_t.shape[0])).all()


def test_same_generator_same_plan_and_shared_noise_across_denoisers():
    x, mask = example()
    est = UniformDoubleMC(num_samples=6, stratified=True)
    a = est.make_plan(x, mask, VOCAB, generator=11)
    b = est.make_plan(x, mask, VOCAB, generator=torch.Generator().manual_seed(11))
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("t", "weights", "z_t", "corrupted"))
    # two policies on one plan: the difference of their estimates is the difference of their terms draw by draw
    d1, d2 = table_denoiser(VOCAB, 3, seed=1), table_denoiser(VOCAB, 3, seed=2)
    e1 = est.score(d1, a, x, mask, VOCAB)
    e2 = est.score(d2, a, x, mask, VOCAB)
    diff = (uniform_draw_terms(d1, a, x, mask, VOCAB) - uniform_draw_terms(d2, a, x, mask, VOCAB)).sum(0)
    torch.testing.assert_close(e1.per_token - e2.per_token, diff, rtol=0,
                               atol=rounding_tol(scale=diff.abs().max().item() + 1, n=16, dtype=torch.float64))


def test_times_and_weights():
    # stratified draws fall one per stratum of s; the weights are the Jacobian of t = s^p over K
    est = UniformDoubleMC(num_samples=8, stratified=True, time_exponent=2)
    t, w = est.times(torch.Generator().manual_seed(0))
    s = t.sqrt()
    k = torch.arange(8, dtype=torch.float64)
    assert ((s > k / 8) & (s <= (k + 1) / 8)).all()
    torch.testing.assert_close(w, 2 * s / 8, rtol=rounding_tol(scale=1, n=4, dtype=torch.float64), atol=0)
    # SDMC with p = 1 has GDPO's nodes; with any p the weights integrate constants exactly
    t1, _ = UniformSDMC(num_nodes=3).nodes()
    torch.testing.assert_close(t1, torch.tensor([0.5 - math.sqrt(0.15), 0.5, 0.5 + math.sqrt(0.15)], dtype=torch.float64),
                               rtol=0, atol=NODE_TOL)
    for p in (1, 2, 3):
        _, wp = UniformSDMC(num_nodes=4, time_exponent=p).nodes()
        assert abs(wp.sum().item() - 1.0) < 8 * NODE_TOL
    plan = UniformSDMC(num_nodes=2, samples_per_node=3).make_plan(*example(), VOCAB, generator=0)
    assert plan.num_draws == 6 and torch.equal(plan.t[:3], plan.t[:1].expand(3))


def test_micro_batches_give_the_same_estimate():
    x, mask = example()
    denoise = table_denoiser(VOCAB, 3, seed=1)
    est = UniformSDMC(num_nodes=3, samples_per_node=2)
    plan = est.make_plan(x, mask, VOCAB, generator=4)
    whole = est.score(denoise, plan, x, mask, VOCAB)
    parts = est.score(denoise, plan, x, mask, VOCAB, micro_batch=1)
    torch.testing.assert_close(parts.per_token, whole.per_token, rtol=0,
                               atol=rounding_tol(scale=whole.per_token.abs().max().item() + 1, n=64,
                                                 dtype=torch.float64))
    assert whole.nfe == est.nfe == 6
    assert torch.equal(whole.sequence, whole.per_token.sum(-1))


def test_gradients_are_finite_at_the_ends_of_time_and_with_one_hot_predictions():
    x = torch.tensor([[0, 2]])
    mask = torch.tensor([[True, True]])
    logits = torch.tensor([[[0.0, float("-inf"), 1.0], [0.5, -0.2, 2.0]]], dtype=torch.float64, requires_grad=True)

    def denoise(z, t):
        return logits[None].expand(z.shape[0], -1, -1, -1)

    plan = UniformNoisePlan(
        t=torch.tensor([1.0, 1e-9, 0.5, 1 - 1e-12], dtype=torch.float64),
        weights=torch.full((4,), 0.25, dtype=torch.float64),
        z_t=torch.tensor([[[1, 0]], [[0, 2]], [[2, 2]], [[1, 1]]]),
        corrupted=torch.ones(4, 1, 2, dtype=torch.bool),
    )
    terms = uniform_draw_terms(denoise, plan, x, mask, VOCAB)
    assert torch.isfinite(terms).all() and (terms[0] == 0).all()  # α_1 = 0: the integrand's limit, 0
    terms.sum().backward()
    assert torch.isfinite(logits.grad[torch.isfinite(logits)]).all()
    assert logits.grad[0, 0, 1] == 0  # a -inf logit (probability 0) gets no gradient


def test_bad_inputs_raise_clear_errors():
    x, mask = example()
    est = UniformDoubleMC()
    with pytest.raises(ValueError, match=r"expected \(K, B, L, N\)"):
        est.estimate(table_denoiser(4, 3, seed=0), x, mask, VOCAB, generator=0)
    with pytest.raises(ValueError, match="outside"):
        est.estimate(table_denoiser(2, 3, seed=0), x, mask, 2, generator=0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        uniform_nelbo_integrand(torch.zeros(2, VOCAB), torch.tensor([0, 1]), torch.tensor([0, 1]), 0.0)
    with pytest.raises(ValueError, match="do not broadcast"):
        uniform_nelbo_integrand(torch.zeros(2, VOCAB), torch.tensor([0, 1, 2]), torch.tensor([0, 1]), 0.5)


def test_options_are_checked_and_read_from_the_config_like_the_masked_estimators():
    with pytest.raises(OptionError, match="num_samples") as err:
        UniformDoubleMC(num_samples=0)
    assert err.value.field == "num_samples"
    with pytest.raises(OptionError) as err:
        UniformSDMC(time_exponent=0)
    assert err.value.field == "time_exponent"
    with pytest.raises(OptionError) as err:
        UniformFlatCE(support="masked")
    assert err.value.field == "support"
    with pytest.raises(OptionError) as err:
        UniformFlatCE(eps=1.0)
    assert err.value.field == "eps"
    # the flat config keys: double MC and the flat CE take N·K draws, as the masked double_mc
    assert UniformDoubleMC.from_config({"num_nodes": 2, "samples_per_node": 3, "stratified": True}) == \
        UniformDoubleMC(num_samples=6, stratified=True)
    assert UniformSDMC.from_config({"num_nodes": 5, "samples_per_node": 2}) == UniformSDMC(5, 2)
    assert UniformFlatCE.from_config({"num_nodes": 1, "samples_per_node": 4}, options={"support": "corrupted"}) == \
        UniformFlatCE(num_samples=4, support="corrupted")
    with pytest.raises(ConfigError, match="estimator.samples_per_node"):
        UniformDoubleMC.from_config({"num_nodes": 1, "samples_per_node": 0})
    with pytest.raises(ConfigError, match="estimator.options.time_exponent"):
        UniformSDMC.from_config({}, options={"time_exponent": -1})
    d = UniformSDMC(num_nodes=2, samples_per_node=3, time_exponent=2).describe()
    assert (d.name, d.nfe, d.settings) == ("uniform_sdmc", 6, {"num_nodes": 2, "samples_per_node": 3,
                                                                 "time_exponent": 2})
    assert "not a bound" in UniformFlatCE().describe().notes["bound"]

