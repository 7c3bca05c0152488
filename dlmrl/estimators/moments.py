"""Exact mean and variance of the mask-based estimators, from the scores of every mask of a row.

Every estimator in this package is a weighted sum of ``S(m) = Σ_{i∈m} log p_θ(y^i | y_m, q)`` over
random masks ``m``. For a row with ``n`` maskable positions, its mean and variance are finite sums
over the ``2^n`` values of ``S`` (``exact`` already evaluates them all), through three statistics
per mask size ``k``:

    h(k) = mean_{|m|=k} S(m),   q(k) = mean_{|m|=k} S(m)²,   c(k) = mean_{|m|=k} S(m)·S(m^c)

(uniform ``k``-subsets given ``k``; a Bernoulli(t) mask is a uniform subset of a Binomial(n, t)
size). Variances are split by the law of total variance into the part due to the random time
``t`` (``Var_t E[X|t]``) and the part due to the mask given ``t`` (``E_t Var[X|t]``), the split
GDPO §4 uses to motivate SDMC.

Reference: LLaDA arXiv 2502.09992 (the discrete ELBO); GDPO arXiv 2510.08554 §4 (variance decomposition).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import comb, roots_legendre


def popcount(codes: np.ndarray, num_bits: int) -> np.ndarray:
    """Number of set bits of each code (``codes`` int64, ``num_bits`` <= 62)."""
    sizes = np.zeros_like(codes)
    for j in range(num_bits):
        sizes += (codes >> j) & 1
    return sizes


@dataclass(frozen=True)
class SizeStats:
    """``h(k)``, ``q(k)``, ``c(k)`` for ``k = 0..n`` (float64 arrays of shape ``(n+1,)``; 0 at ``k=0``)."""

    n: int
    h: np.ndarray
    q: np.ndarray
    c: np.ndarray

    @classmethod
    def from_table(cls, values: np.ndarray) -> SizeStats:
        """Statistics of a table ``values (2^n,)`` float64 of ``S(m)`` indexed by the mask's bit code.

        Bit ``j`` of the code is the ``j``-th maskable position; ``values[0]`` (empty mask) must be 0.

        Raises:
            ValueError: if the length is not a power of two or ``values[0] != 0``.
        """
        values = np.asarray(values, dtype=np.float64)
        n = round(math.log2(values.shape[0])) if values.size else -1
        if n < 0 or values.shape != (2**n,):
            raise ValueError(f"a mask table has 2^n entries, got shape {values.shape}")
        if values[0] != 0:
            raise ValueError(f"the empty mask scores 0, got values[0] = {values[0]}")
        codes = np.arange(2**n, dtype=np.int64)
        sizes = popcount(codes, n)
        cross = values * values[(2**n - 1) ^ codes]
        counts = np.bincount(sizes, minlength=n + 1).astype(np.float64)
        h = np.bincount(sizes, weights=values, minlength=n + 1) / counts
        q = np.bincount(sizes, weights=values**2, minlength=n + 1) / counts
        c = np.bincount(sizes, weights=cross, minlength=n + 1) / counts
        return cls(n=n, h=h, q=q, c=c)

    @property
    def elbo(self) -> float:
        """``Σ_{k≥1} h(k)/k``: the exact ELBO (LLaDA's discrete form)."""
        return float(sum(self.h[k] / k for k in range(1, self.n + 1)))


@dataclass(frozen=True)
class Moments:
    """Mean and variance of an estimator for one row (nats), variance split into time and mask parts.

    ``variance_t = Var_t(E[X|t])``, ``variance_mask = E_t(Var[X|t])``; either may be ``inf``.
    """

    mean: float
    variance_t: float
    variance_mask: float

    @property
    def variance(self) -> float:
        return self.variance_t + self.variance_mask

    def bias(self, elbo: float) -> float:
        return self.mean - elbo

    def mse(self, elbo: float) -> float:
        return self.bias(elbo) ** 2 + self.variance

    def average_of(self, k: int) -> Moments:
        """The average of ``k`` i.i.d. draws."""
        return Moments(self.mean, self.variance_t / k, self.variance_mask / k)

    @staticmethod
    def independent_sum(parts: Sequence[Moments]) -> Moments:
        """The sum of independent parts (e.g. quadrature nodes)."""
        return Moments(
            float(sum(p.mean for p in parts)),
            float(sum(p.variance_t for p in parts)),
            float(sum(p.variance_mask for p in parts)),
        )

    @staticmethod
    def independent_mean(parts: Sequence[Moments]) -> Moments:
        """The mean of independent parts (e.g. strata)."""
        k = len(parts)
        s = Moments.independent_sum(parts)
        return Moments(s.mean / k, s.variance_t / k**2, s.variance_mask / k**2)


def pair_draw(stats: SizeStats, k: int, a: float, b: float = 0.0) -> tuple[float, float]:
    """``(E X, E X²)`` for ``X = a·S(m) + b·S(m^c)`` with ``m`` a uniform ``k``-subset."""
    n = stats.n
    mu = a * stats.h[k] + b * stats.h[n - k]
    second = a * a * stats.q[k] + 2 * a * b * stats.c[k] + b * b * stats.q[n - k]
    return float(mu), float(second)


def bernoulli_draw(stats: SizeStats, t: float, a: float, b: float = 0.0) -> tuple[float, float]:
    """``(E X, E X²)`` for ``X = a·S(m) + b·S(m^c)`` with ``m ~ Bernoulli(t)^n``."""
    n = stats.n
    k = np.arange(n + 1)
    p = comb(n, k) * t**k * (1.0 - t) ** (n - k)  # (n+1,) Pr(|m| = k)
    mu = p @ (a * stats.h + b * stats.h[::-1])
    second = p @ (a * a * stats.q + 2 * a * b * stats.c + b * b * stats.q[::-1])
    return float(mu), float(second)


def mixture(probs: Sequence[float], mus: Sequence[float], seconds: Sequence[float]) -> Moments:
    """Moments of a draw whose time takes condition ``i`` w.p. ``probs[i]``, with ``E[X|i] = mus[i]``
    and ``E[X²|i] = seconds[i]`` (law of total variance)."""
    p, mu, s = (np.asarray(x, dtype=np.float64) for x in (probs, mus, seconds))
    keep = p > 0
    p, mu, s = p[keep], mu[keep], s[keep]
    mean = float(p @ mu)
    var_t = max(float(p @ mu**2) - mean**2, 0.0)
    var_mask = max(float(p @ (s - mu**2)), 0.0)
    return Moments(mean, var_t, var_mask)


def count_interval_probs(n: int, lo: float, hi: float) -> np.ndarray:
    """``Pr(k)``, ``k = 0..n``, for ``k = clamp(ceil(t·n), 1, n)`` with ``t ~ U(lo, hi]``."""
    probs = np.zeros(n + 1)
    for k in range(1, n + 1):
        left = 0.0 if k == 1 else (k - 1) / n  # t in (0, 1/n] gives k = 1 (as does t = 0)
        probs[k] = max(0.0, min(hi, k / n) - max(lo, left))
    return probs / (hi - lo)


def time_mixture(
    stats: SizeStats,
    lo: float,
    hi: float,
    weights: Callable[[float], tuple[float, float]],
    singular: bool = False,
    num_nodes: int = 64,
) -> Moments:
    """Moments of ``X = a(t)·S(m) + b(t)·S(m^c)``, ``m ~ Bernoulli(t)^n``, ``t ~ U(lo, hi)``.

    The integrals over ``t`` use Gauss–Legendre with ``num_nodes`` nodes on ``[lo, hi]``: exact for
    the polynomial means, and accurate for the second moments when ``a``, ``b`` are smooth on the
    interval. ``singular=True`` marks an interval where ``E[X²|t]`` is not integrable (e.g. a
    ``1/t`` weight down to ``t = 0``): the mask variance is then ``inf``.
    """
    x, w = roots_legendre(max(num_nodes, stats.n + 2))
    ts = lo + (hi - lo) * (x + 1) / 2
    probs = w / 2
    draws = [bernoulli_draw(stats, t, *weights(t)) for t in ts]
    m = mixture(probs, [d[0] for d in draws], [d[1] for d in draws])
    return Moments(m.mean, m.variance_t, math.inf) if singular else m
