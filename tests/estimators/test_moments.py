"""Exact estimator moments (moments.py) against hand loops, Monte Carlo over plans, and the ELBO."""

from __future__ import annotations

import math
import zlib
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy.integrate import quad

from dlmrl.estimators import SDMC, Coupled, CoupledSDMC, DoubleMC, MaskTable, SizeStats, mask_table
from tests.conftest import make_toy_policy
from tests.tolerances import NODE_TOL, rounding_tol

#: Everything here is float64. A mean, sum or product over ≤ 2^5 one-sign table values (h, q, c, an estimator's
#: mean, the ELBO) is within ≤ 64 roundings of its size: relative SUM_RTOL (≈ 1.4e-14).
SUM_RTOL = rounding_tol(scale=1, n=64, dtype=torch.float64)


def var_tol(values: np.ndarray, n: int) -> float:
    """A variance is a difference of second moments (E[X²] − E[X]², Σ p (E[X|k] − m)²) of size ≤ the largest X²,
    X = (n/k)·S(m) ≤ n·max|S|: ≤ 64 roundings of that, absolute (it may be most of a small variance)."""
    return rounding_tol(scale=float(n * np.abs(values).max()) ** 2, n=64, dtype=torch.float64)


def subsets_by_code(n: int):
    """``(code, subset tuple)`` for all ``2^n`` subsets of ``range(n)``; bit ``j`` of the code is element ``j``."""
    for code in range(2**n):
        yield code, tuple(j for j in range(n) if code >> j & 1)


def hand_stats(values: np.ndarray, n: int) -> tuple[list[float], list[float], list[float]]:
    """``h(k), q(k), c(k)`` by explicit loops over subsets (``c`` pairs a mask with its complement)."""
    h, q, c = [0.0] * (n + 1), [0.0] * (n + 1), [0.0] * (n + 1)
    for k in range(n + 1):
        members = [code for code, m in subsets_by_code(n) if len(m) == k]
        assert len(members) == math.comb(n, k)
        full = 2**n - 1
        h[k] = sum(values[code] for code in members) / len(members)
        q[k] = sum(values[code] ** 2 for code in members) / len(members)
        c[k] = sum(values[code] * values[full - code] for code in members) / len(members)
    return h, q, c


def test_size_stats_from_table_by_hand_loops():
    rng = np.random.default_rng(0)
    n = 4
    values = -rng.exponential(2.0, size=2**n)
    values[0] = 0.0
    stats = SizeStats.from_table(values)
    h, q, c = hand_stats(values, n)
    assert stats.n == n
    np.testing.assert_allclose(stats.h, h, rtol=SUM_RTOL, atol=0)
    np.testing.assert_allclose(stats.q, q, rtol=SUM_RTOL, atol=0)
    np.testing.assert_allclose(stats.c, c, rtol=SUM_RTOL, atol=0)
    assert stats.h[0] == 0.0 and stats.q[0] == 0.0 and stats.c[0] == 0.0
    # c(k) pairs m with m^c, so c(k) = c(n - k).
    np.testing.assert_allclose(stats.c, stats.c[::-1], rtol=SUM_RTOL)
    # A value written out: k = 1 masks are codes 1, 2, 4, 8 (4 terms, a division: ≤ 5 roundings).
    assert stats.h[1] == pytest.approx((values[1] + values[2] + values[4] + values[8]) / 4,
                                       rel=rounding_tol(1, n=5, dtype=torch.float64))
    assert stats.elbo == pytest.approx(sum(h[k] / k for k in range(1, n + 1)), rel=SUM_RTOL)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (np.zeros(3), "2\\^n"),
        (np.zeros(0), "2\\^n"),
        (np.zeros(6), "2\\^n"),
        (np.zeros((4, 4)), "2\\^n"),
        (np.array([1.0, -1.0]), "empty mask"),
        (np.array([-0.5, -1.0, -1.0, -2.0]), "empty mask"),
    ],
)
def test_size_stats_rejects_bad_tables(values, match):
    with pytest.raises(ValueError, match=match):
        SizeStats.from_table(values)


# ---------------------------------------------------------------- Monte Carlo over plans


@lru_cache(maxsize=1)
def toy_table() -> tuple[MaskTable, torch.Tensor]:
    """The mask table of one infill row of the toy policy: n = 5 blanks in a canvas of 7."""
    policy = make_toy_policy(seed=7)
    prompt_ids = torch.tensor([6, 3, 1, 4])
    prompt_mask = torch.tensor([False, True, True, True])
    completion = torch.tensor([2, 0, 5, 1, 3, 4, 0])
    completion_mask = torch.tensor([True, True, False, True, True, False, True])
    table = mask_table(policy, prompt_ids, prompt_mask, completion, completion_mask)
    return table, completion_mask


# Every mask-based estimator, each mode, with several N, K (a product would triple the run time).
CONFIGS = (
    [
        DoubleMC(num_samples=k, masking=m, stratified=s)
        for m, k, s in (
            ("exact_count", 1, False),
            ("exact_count", 3, False),
            ("exact_count", 3, True),
            ("bernoulli", 2, False),
            ("bernoulli", 3, True),
        )
    ]
    + [
        SDMC(num_nodes=n, samples_per_node=k, masking=m)
        for m, n, k in (
            ("exact_count", 2, 1),
            ("exact_count", 3, 2),
            ("bernoulli", 1, 1),
            ("bernoulli", 3, 2),
            ("reference", 1, 1),
            ("reference", 4, 2),
        )
    ]
    + [
        Coupled(num_pairs=k, masking=m, t_min=lo, t_max=hi)
        for m in ("exact_count", "bernoulli")
        for lo, hi, k in ((0.2, 0.8, 1), (0.2, 0.8, 2), (0.0, 1.0, 1))
    ]
    + [
        CoupledSDMC(num_nodes=n, samples_per_node=k, masking=m)
        for m, n, k in (
            ("exact_count", 2, 2),
            ("exact_count", 3, 1),
            ("exact_count", 4, 2),
            ("bernoulli", 2, 1),
            ("bernoulli", 3, 2),
            ("bernoulli", 4, 1),
        )
    ]
)


def infinite_variance(est) -> bool:
    if isinstance(est, DoubleMC):
        return est.masking == "bernoulli"
    if isinstance(est, Coupled):
        return est.masking == "bernoulli" and (est.t_min == 0.0 or est.t_max == 1.0)
    return False


def draws_by_lookup(est, table: MaskTable, completion_mask: torch.Tensor, rows: int, seed: int) -> np.ndarray:
    """``rows`` independent estimates: one plan over ``rows`` copies of the row, evaluated from the table."""
    plan = est.make_plan(completion_mask[None].expand(rows, -1), torch.Generator().manual_seed(seed))
    codes = table.codes(plan.masks)  # (S, R)
    x = (plan.weights.double().numpy() * table.values[codes]).sum(0)  # (R,)
    for r in (0, 1, rows - 1):  # the vectorised lookup is MaskTable.lookup (the same weights, one sign)
        assert table.lookup(plan, r) == pytest.approx(x[r], rel=SUM_RTOL, abs=0)
    return x


@pytest.mark.parametrize("est", CONFIGS, ids=repr)
def test_exact_moments_match_monte_carlo_over_plans(est):
    table, completion_mask = toy_table()
    mom = est.moments(table.stats())
    rows = 12000
    x = draws_by_lookup(est, table, completion_mask, rows, seed=zlib.crc32(repr(est).encode()))  # own stream
    mean, var = x.mean(), x.var(ddof=1)
    se_mean = math.sqrt(var / rows)
    # 4 (4.5 below) standard errors measured from the same draws: P(|z| > 4) = 6e-5, P(|z| > 4.5) = 7e-6 per check
    assert abs(mean - mom.mean) < 4 * se_mean, (mean, mom.mean, se_mean)
    if infinite_variance(est):
        assert math.isinf(mom.variance) and math.isinf(mom.variance_mask)
        assert math.isfinite(mom.variance_t) and math.isfinite(mom.mean)
        return
    assert math.isfinite(mom.variance)
    # SE of the sample variance from the fourth central moment: Var(s²) ≈ (μ4 − σ⁴)/R.
    mu4 = ((x - mean) ** 4).mean()
    se_var = math.sqrt(max(mu4 - var**2, 0.0) / rows)
    assert abs(var - mom.variance) < 4.5 * se_var + var_tol(table.values, table.n), (var, mom.variance, se_var)


def test_exact_moments_equal_a_direct_enumeration_for_one_sdmc_case():
    # SDMC exact_count, N = 2, K = 1, n = 5: nodes give k = ceil(5 t) = 2 and 4; two independent draws.
    table, _ = toy_table()
    t, w = [0.5 - math.sqrt(3) / 6, 0.5 + math.sqrt(3) / 6], [0.5, 0.5]
    mean = var = 0.0
    for tn, wn in zip(t, w):
        k = math.ceil(tn * 5)
        vals = np.array([wn * 5 / k * table.values[c] for c, m in subsets_by_code(5) if len(m) == k])
        mean += vals.mean()
        var += vals.var()
    mom = SDMC(num_nodes=2, masking="exact_count").moments(table.stats())
    assert mom.mean == pytest.approx(mean, rel=SUM_RTOL + NODE_TOL)  # (the node weights 1/2: within NODE_TOL)
    assert mom.variance == pytest.approx(var, rel=2 * NODE_TOL, abs=var_tol(table.values, 5))
    assert mom.variance_t == 0.0


# ---------------------------------------------------------------- exact bias

UNBIASED = (
    [
        DoubleMC(num_samples=k, masking=m, stratified=s)
        for m in ("exact_count", "bernoulli")
        for k, s in ((1, False), (3, False), (2, True), (3, True))
    ]
    + [
        Coupled(num_pairs=k, masking=m, t_min=0.0, t_max=1.0)
        for m in ("exact_count", "bernoulli")
        for k in (1, 2)
    ]
    + [SDMC(num_nodes=n, samples_per_node=k, masking="bernoulli") for n in (3, 4) for k in (1, 2)]
    + [CoupledSDMC(num_nodes=n, samples_per_node=k, masking="bernoulli") for n in (3, 4) for k in (1, 2)]
)


@pytest.mark.parametrize("est", UNBIASED, ids=repr)
def test_unbiased_estimators_have_zero_exact_bias(est):
    # n = 5: Bernoulli quadrature is exact once 2N − 1 >= n − 1 = 4, i.e. N >= 3.
    table, _ = toy_table()
    stats = table.stats()
    assert table.elbo == stats.elbo
    assert abs(est.moments(stats).bias(stats.elbo)) <= bias_tol(stats)


def bias_tol(stats) -> float:
    """An unbiased estimator's float64 mean against the ELBO: SUM_RTOL, plus, for Gauss-Legendre ones, nodes within
    NODE_TOL moving Σ w g(t) by ≤ max|g'|·NODE_TOL, where g (degree ≤ n − 1 = 4, |g| ≤ n·max|h|) has
    max|g'| ≤ 2(n − 1)²·max|g| on [0, 1] (Markov's inequality), and weights within NODE_TOL each (≤ 4 nodes)."""
    g_max = stats.n * float(np.abs(stats.h).max())
    return SUM_RTOL * abs(stats.elbo) + (2 * (stats.n - 1) ** 2 + 4) * g_max * NODE_TOL


@pytest.mark.parametrize(
    "est",
    [SDMC(num_nodes=n, masking="reference") for n in (1, 2, 3, 4)]
    + [
        SDMC(num_nodes=1, masking="bernoulli"),
        CoupledSDMC(num_nodes=1, masking="bernoulli"),
        Coupled(masking="exact_count"),
        Coupled(masking="bernoulli"),
    ],
    ids=repr,
)
def test_biased_estimators_have_nonzero_exact_bias(est):
    table, _ = toy_table()
    stats = table.stats()
    assert abs(est.moments(stats).bias(stats.elbo)) > 1e6 * bias_tol(stats)  # (far outside the rounding)


# ---------------------------------------------------------------- the time / mask split


def size_table(n: int) -> np.ndarray:
    """``S(m) = −|m|² − 0.1·Σ_{i∈m} i``: strongly size-dependent, so ``g(t)`` is far from flat."""
    values = np.zeros(2**n)
    for code, m in subsets_by_code(n):
        values[code] = -(len(m) ** 2) - 0.1 * sum(m)
    return values


def test_sdmc_and_coupled_sdmc_have_no_time_variance():
    table, _ = toy_table()
    stats = table.stats()
    for est in (
        SDMC(num_nodes=3),
        SDMC(num_nodes=2, samples_per_node=3, masking="bernoulli"),
        SDMC(num_nodes=4, masking="reference"),
        CoupledSDMC(num_nodes=3),
        CoupledSDMC(num_nodes=4, samples_per_node=2, masking="bernoulli"),
    ):
        mom = est.moments(stats)
        assert mom.variance_t == 0.0
        assert mom.variance_mask > 0 and mom.variance == mom.variance_mask


def hand_double_mc_split(values: np.ndarray, n: int, strata: list[tuple[float, float]]):
    """Mean, time and mask variance of exact-count double MC, one draw per stratum, averaged.

    Given ``t``, ``k = max(1, ceil(t·n))`` and ``X = (n/k)·S(m)`` with ``m`` a uniform ``k``-subset:
    ``E[X|k] = (n/k)h(k)``, ``Var[X|k] = (n/k)²(q(k) − h(k)²)``. ``P(k | t ∈ (a, b])`` is the overlap of
    ``(a, b]`` with ``((k−1)/n, k/n]``, over ``b − a``.
    """
    h, q, _ = hand_stats(values, n)
    cond_mean = {k: n / k * h[k] for k in range(1, n + 1)}
    cond_var = {k: (n / k) ** 2 * (q[k] - h[k] ** 2) for k in range(1, n + 1)}
    mean = var_t = var_mask = 0.0
    for a, b in strata:
        p = {k: max(0.0, min(b, k / n) - max(a, (k - 1) / n)) / (b - a) for k in range(1, n + 1)}
        assert sum(p.values()) == pytest.approx(1.0)
        m = sum(p[k] * cond_mean[k] for k in p)
        mean += m
        var_t += sum(p[k] * (cond_mean[k] - m) ** 2 for k in p)
        var_mask += sum(p[k] * cond_var[k] for k in p)
    s = len(strata)
    return mean / s, var_t / s**2, var_mask / s**2


@pytest.mark.parametrize("values_kind", ["size", "toy"])
def test_double_mc_exact_count_split_by_hand(values_kind):
    if values_kind == "size":
        n, values = 4, size_table(4)
    else:
        table, _ = toy_table()
        n, values = table.n, table.values
    stats = SizeStats.from_table(values)
    for k in (1, 2, 3, 5):
        # i.i.d.: k uniform on 1..n, then the average of K draws divides both parts by K.
        mean, vt, vm = hand_double_mc_split(values, n, [(0.0, 1.0)])
        mom = DoubleMC(num_samples=k).moments(stats)
        vtol = var_tol(values, n)
        assert mom.mean == pytest.approx(mean, rel=SUM_RTOL)
        assert mom.variance_t == pytest.approx(vt / k, rel=0, abs=vtol)
        assert mom.variance_mask == pytest.approx(vm / k, rel=0, abs=vtol)
        # Stratified: one draw per stratum ((j−1)/K, j/K].
        strata = [((j - 1) / k, j / k) for j in range(1, k + 1)]
        mean, vt, vm = hand_double_mc_split(values, n, strata)
        mom = DoubleMC(num_samples=k, stratified=True).moments(stats)
        assert mom.mean == pytest.approx(mean, rel=SUM_RTOL)
        assert mom.variance_t == pytest.approx(vt, rel=0, abs=vtol)
        assert mom.variance_mask == pytest.approx(vm, rel=0, abs=vtol)
        assert mom.mean == pytest.approx(stats.elbo, rel=SUM_RTOL)


def test_hand_split_values_written_out():
    # n = 2, S = [0, -1, -2, -5] (codes 0..3): h(1) = -1.5, h(2) = -5; k ∈ {1, 2} equally likely.
    # E[X|1] = 2·(-1.5) = -3, E[X|2] = -5: mean -4, Var_t = 1; Var[X|1] = 4·(2.5 − 2.25) = 1, Var[X|2] = 0.
    values = np.array([0.0, -1.0, -2.0, -5.0])
    stats = SizeStats.from_table(values)
    mom = DoubleMC(num_samples=1).moments(stats)
    assert (mom.mean, mom.variance_t, mom.variance_mask) == pytest.approx((-4.0, 1.0, 0.5), abs=var_tol(values, 2))
    # Stratified K = 2: each stratum has a single k, so no time variance is left.
    mom = DoubleMC(num_samples=2, stratified=True).moments(stats)
    assert (mom.mean, mom.variance_t, mom.variance_mask) == pytest.approx((-4.0, 0.0, 0.25), abs=var_tol(values, 2))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_stratification_removes_time_variance_when_g_is_not_flat(k):
    n = 4
    stats = SizeStats.from_table(size_table(n))
    iid = DoubleMC(num_samples=k).moments(stats)
    strat = DoubleMC(num_samples=k, stratified=True).moments(stats)
    assert iid.variance_t > 1.0  # (n/k)h(k) = −4k − 0.6 ranges over [−16.6, −4.6]
    assert strat.variance_t < 0.5 * iid.variance_t
    assert strat.variance < iid.variance
    assert strat.mean == pytest.approx(iid.mean, rel=SUM_RTOL)
    if k == n:  # one count per stratum: the time variance is gone entirely
        assert strat.variance_t == pytest.approx(0.0, abs=var_tol(size_table(n), n))
    # For this table most of i.i.d. double MC's variance comes from the time (GDPO §4).
    assert iid.variance_t > iid.variance_mask


def bernoulli_g(h: list[float], n: int, t: float) -> float:
    """``g(t) = E[S(m)/t]`` for ``m ~ Bernoulli(t)^n``: ``Σ_k C(n,k) t^{k−1} (1−t)^{n−k} h(k)``."""
    return sum(math.comb(n, k) * t ** (k - 1) * (1 - t) ** (n - k) * h[k] for k in range(1, n + 1))


def test_time_variance_of_bernoulli_estimators_by_quadrature():
    # The mask variance is infinite for these, but the time part Var_t E[X|t] is finite and checkable.
    table, _ = toy_table()
    stats = table.stats()
    n = table.n
    h, _, _ = hand_stats(table.values, n)

    def var_over(f, lo, hi):
        m = quad(f, lo, hi, epsabs=1e-13, epsrel=1e-13)[0] / (hi - lo)
        return quad(lambda t: (f(t) - m) ** 2, lo, hi, epsabs=1e-13, epsrel=1e-13)[0] / (hi - lo)

    # quad's 21-point rule integrates these polynomials (degree ≤ 8) exactly, so it is within its requested 1e-13
    # relative; an error δm in m moves the variance only at second order (∫(f − m) = 0). The moments' own sums
    # round at the size of the second moments (var_tol), their Gauss-Legendre-free time variance carries no node
    # error
    quad_rel, vtol = 1e-13, var_tol(table.values, n)

    def g(t):
        return bernoulli_g(h, n, t)

    def pair(t):
        return 0.5 * g(t) + 0.5 * g(1 - t)

    for k in (1, 3):
        mom = DoubleMC(num_samples=k, masking="bernoulli").moments(stats)
        assert mom.variance_t == pytest.approx(var_over(g, 0.0, 1.0) / k, rel=quad_rel, abs=vtol)
        strat = DoubleMC(num_samples=k, masking="bernoulli", stratified=True).moments(stats)
        expected = sum(var_over(g, (j - 1) / k, j / k) for j in range(1, k + 1)) / k**2
        assert strat.variance_t == pytest.approx(expected, rel=quad_rel, abs=vtol)
        assert math.isinf(strat.variance_mask)
    mom = Coupled(num_pairs=2, masking="bernoulli", t_min=0.0, t_max=1.0).moments(stats)
    assert mom.variance_t == pytest.approx(var_over(pair, 0.0, 1.0) / 2, rel=quad_rel, abs=vtol)
    mom = Coupled(num_pairs=1, masking="bernoulli").moments(stats)  # (0.2, 0.8): finite throughout
    assert mom.variance_t == pytest.approx(var_over(pair, 0.2, 0.8), rel=quad_rel, abs=vtol)
    assert math.isfinite(mom.variance_mask)
