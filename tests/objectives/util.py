"""Test helpers: nested-list comparison and plain-Python references (independent of the code under test)."""

from __future__ import annotations

import math

import pytest

from tests.tolerances import rounding_tol


def flat(x):
    """A nested list (or tensor) flattened to a list of floats."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in flat(item)]
    return [float(x)]


#: The hand checks compare float32 results with float64 formulas. A loss, advantage, ratio or KL term here is ≤ 2 in
#: size (rewards in [0, 1], advantages ≤ 1/std ≈ 2 for these groups, ratios ≈ 1) and takes ≤ 16 roundings: each
#: elementwise step (log-ratio, exp, clip, × A, ÷ a length or a std) rounds once (exp, log: ≤ 1 ulp), and a mean or
#: std over ≤ 10 terms of that size adds ≤ 10 (their order). Larger values get the same count relative.
F32_TOL = rounding_tol(scale=2, n=16)  # ≈ 3.8e-6
F32_RTOL = rounding_tol(scale=1, n=16)  # ≈ 1.9e-6
#: a literal written to 6 decimals (a value derived by hand): half a unit of the last place
DECIMALS_6 = 5e-7


def close(actual, expected, abs=F32_TOL, rel=F32_RTOL) -> bool:
    """``actual`` (tensor or nested list) equals ``expected`` (nested list) within tolerance (by default, a float32
    computation's: see F32_TOL)."""
    a, e = flat(actual), flat(expected)
    return len(a) == len(e) and a == pytest.approx(e, abs=abs, rel=rel)


def ppo_token(r: float, a: float, lo: float, hi: float, c: float | None = None, delta: float | None = None) -> float:
    """The clipped surrogate of one token, by the textbook formula."""
    unclipped = r if delta is None else min(r, delta)
    clipped = min(max(r, 1 - lo), 1 + hi)
    s = min(unclipped * a, clipped * a)
    if c is not None and a < 0:
        s = max(s, c * a)
    return s


def k3(delta: float) -> float:
    return math.exp(delta) - delta - 1


def aggregate_rows(rows: list[list[float]], loss_type: str, num_tokens: float | None = None,
                   num_rows: int | None = None, max_len: int | None = None) -> float:
    """Aggregate per-token values given as one list of valid-token values per row."""
    nonempty = [r for r in rows if r]
    total = sum(sum(r) for r in rows)
    count = sum(len(r) for r in rows)
    if loss_type == "grpo":
        return sum(sum(r) / len(r) for r in nonempty) / max(len(nonempty), 1)
    if loss_type in ("bnpo", "dapo"):
        return total / (num_tokens if num_tokens is not None else max(count, 1))
    if loss_type == "dr_grpo":
        return total / (num_rows * max_len)
    raise ValueError(loss_type)
