"""ESPO's stratified mask/complement pairs: the stratification, one score per token per pair, and unbiasedness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlmrl.estimators import ESTIMATORS, StratifiedCoupled, mask_table, score
from tests.conftest import make_toy_policy
from tests.tolerances import WEIGHT_OPS_RTOL, rounding_tol


def test_counts_are_stratified_across_rows_and_each_token_is_scored_once_per_pair():
    est = StratifiedCoupled(num_pairs=2)
    cm = torch.ones(10, 9, dtype=torch.bool)
    cm[:, 0] = False  # L_b = 8: counts in {0..8}
    plan = est.make_plan(cm, 4)
    assert plan.masks.shape == (4, 10, 9) and est.nfe == 4
    first, second = plan.masks[0], plan.masks[1]
    assert not (first & second).any() and ((first | second) == cm).all()  # a mask and its complement
    counts = first.sum(-1).double()  # (10,) x_b = floor(((u0 + b/10) mod 1) · 9)
    u = (counts + 0.5) / 9  # inside each row's count bin
    # the rows' u_b are u0 + b/10 mod 1: consecutive rows step by 1/10, so the counts cover the range evenly
    spread = torch.sort(counts).values
    assert spread[-1] - spread[0] >= 7 and len(set(counts.tolist())) >= 7
    assert ((u >= 0) & (u <= 1)).all()
    # weights ½ (L+1)/x and ½ (L+1)/(L−x), divided by K = 2; an empty half weighs 0
    x = counts
    expect = torch.where(x > 0, 0.25 * 9 / x.clamp(min=1), 0.0)
    torch.testing.assert_close(plan.weights[0].double(), expect, rtol=WEIGHT_OPS_RTOL, atol=0)


def test_moments_mean_is_the_exact_elbo_and_sampling_agrees():
    policy = make_toy_policy()
    g = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask = torch.randint(0, 6, (1, 3), generator=g), torch.ones(1, 3, dtype=torch.bool)
    completion, cm = torch.randint(0, 6, (1, 5), generator=g), torch.ones(1, 5, dtype=torch.bool)
    table = mask_table(policy, prompt_ids[0], prompt_mask[0], completion[0], cm[0])
    est = ESTIMATORS.get("stratified_coupled")(num_pairs=1)
    m = est.moments(table.stats())
    # unbiased: float64 sums over the 2^5 masks and 6 counts of one sign (≤ 256 roundings, relative)
    assert m.mean == pytest.approx(table.elbo, rel=rounding_tol(scale=1, n=256, dtype=torch.float64))
    # sampled with the model on 2000 plans (a batch of one row: its count is uniform on {0..5})
    values = []
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(400):
            values.append(score(policy, prompt_ids, prompt_mask, completion, cm, est.make_plan(cm, gen)).sequence.item())
    values = np.array(values)
    se = np.sqrt(m.variance / len(values))
    assert abs(values.mean() - m.mean) < 4 * se  # (P(|z| > 4) = 6e-5 for a seed change)
    # the sample variance's standard error sqrt((m4 − s⁴)/n), from the draws' fourth central moment (3.3% here)
    d = values - values.mean()
    se_var = np.sqrt((np.mean(d**4) - np.mean(d**2) ** 2) / len(values))
    assert abs(values.var(ddof=1) - m.variance) < 4.5 * se_var  # (P(|z| > 4.5) = 7e-6)
