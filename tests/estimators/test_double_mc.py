"""Double Monte Carlo (LLaDA, GDPO §3) and the masking modes: unbiasedness against exact enumeration."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.estimators import ESTIMATORS, DoubleMC, exact_elbo, sample_masks
from tests.conftest import make_toy_policy
from tests.tolerances import WEIGHT_OPS_RTOL


def infill_example():
    """Two rows with different scored lengths: L_b = 4 (cell 2 given) and L_b = 5; row 0 left-padded."""
    prompt_ids = torch.tensor([[6, 2, 5], [1, 4, 3]])  # (B, P)
    prompt_mask = torch.tensor([[False, True, True], [True, True, True]])
    completion = torch.tensor([[3, 0, 1, 5, 2], [4, 4, 0, 6, 1]])  # (B, L)
    completion_mask = torch.tensor([[True, True, False, True, True], [True] * 5])
    return prompt_ids, prompt_mask, completion, completion_mask


@pytest.mark.parametrize(
    ("masking", "stratified"), [("exact_count", False), ("exact_count", True), ("bernoulli", False)]
)
def test_double_mc_is_unbiased_for_the_exact_elbo(masking, stratified):
    policy = make_toy_policy(seed=2)
    prompt_ids, prompt_mask, completion, completion_mask = infill_example()
    with torch.no_grad():
        exact = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask).sequence
        estimator = DoubleMC(num_samples=16, masking=masking, stratified=stratified)
        draws = torch.stack(
            [
                estimator.estimate(
                    policy,
                    prompt_ids,
                    prompt_mask,
                    completion,
                    completion_mask,
                    torch.Generator().manual_seed(seed),
                    micro_batch=None,
                ).sequence
                for seed in range(150)
            ]
        ).double()  # (R, B)
    mean = draws.mean(0)
    se = draws.std(0) / math.sqrt(draws.shape[0])
    assert ((mean - exact.double()).abs() < 4 * se).all(), (mean, exact, se)


def test_stratified_times_fall_one_per_stratum_and_counts_follow_the_discrete_form():
    completion_mask = torch.tensor([[True] * 6, [True, False, True, False, False, True]])
    plan = DoubleMC(num_samples=8, stratified=True).make_plan(
        completion_mask, torch.Generator().manual_seed(0)
    )
    k = torch.arange(8, dtype=torch.float64)[:, None]
    assert plan.t.shape == (8, 2)  # one time per sample and row
    assert ((plan.t > k / 8) & (plan.t <= (k + 1) / 8)).all()
    assert not torch.equal(plan.t[:, 0], plan.t[:, 1])
    assert plan.nfe == 8
    for s in range(8):
        for b, n in enumerate((6, 3)):
            count = max(1, math.ceil(plan.t[s, b].item() * n))
            assert int(plan.masks[s, b].sum()) == count
            assert plan.weights[s, b].item() == pytest.approx(n / count / 8, rel=WEIGHT_OPS_RTOL)


def test_exact_count_draws_the_count_uniformly():
    # t ~ U(0, 1] and l = ceil(t L): every l in 1..L has probability 1/L.
    completion_mask = torch.ones(1, 4, dtype=torch.bool)
    plan = DoubleMC(num_samples=8000).make_plan(completion_mask, torch.Generator().manual_seed(1))
    counts = torch.bincount(plan.masks[:, 0].sum(-1), minlength=5)
    assert counts[0] == 0
    # 4.5 binomial standard errors sqrt(p(1-p)/n) = 0.0048 each: P(|z| > 4.5) = 7e-6 per count, for a seed change
    assert ((counts[1:].double() / 8000 - 0.25).abs() < 4.5 * math.sqrt(0.25 * 0.75 / 8000)).all()


def test_sample_masks_modes_by_hand():
    completion_mask = torch.tensor([[True] * 10, [False] * 10, [True, True, True] + [False] * 7])
    t = torch.tensor([0.25, 1.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    masks, scale = sample_masks(completion_mask, t, "exact_count", gen)
    # k = max(1, ceil(t L_b)): row 0 -> 3, 10; row 1 -> 0 (no positions); row 2 -> 1, 3.
    assert masks.sum(-1).tolist() == [[3, 0, 1], [10, 0, 3]]
    torch.testing.assert_close(scale, torch.tensor([[10 / 3, 0.0, 3.0], [1.0, 0.0, 1.0]]))
    masks, scale = sample_masks(completion_mask, t, "reference", gen)
    # k = max(1, floor(t L_b)): row 0 -> 2, 10; row 2 -> 1, 3; scale 1/t.
    assert masks.sum(-1).tolist() == [[2, 0, 1], [10, 0, 3]]
    torch.testing.assert_close(scale, torch.tensor([[4.0, 0.0, 4.0], [1.0, 0.0, 1.0]]))
    masks, scale = sample_masks(completion_mask, t, "bernoulli", gen)
    assert masks[1].tolist() == completion_mask.tolist()  # t = 1 masks every allowed position
    torch.testing.assert_close(scale, torch.tensor([[4.0, 0.0, 4.0], [1.0, 0.0, 1.0]]))


def test_bernoulli_rate_and_uniform_subsets():
    completion_mask = torch.tensor([[True, False, True, True, False, True]])
    gen = torch.Generator().manual_seed(3)
    t = torch.full((20000,), 0.3, dtype=torch.float64)
    masks, _ = sample_masks(completion_mask, t, "bernoulli", gen)
    rate = masks[:, 0].double().mean(0)
    assert rate[[1, 4]].tolist() == [0.0, 0.0]
    assert (rate[[0, 2, 3, 5]] - 0.3).abs().max() < 0.015
    masks, _ = sample_masks(
        completion_mask, torch.full((12000,), 0.5, dtype=torch.float64), "exact_count", gen
    )
    allowed = masks[:, 0][:, [0, 2, 3, 5]]  # k = 2 of 4: six pairs, each w.p. 1/6
    codes = (allowed.long() * torch.tensor([1, 2, 4, 8])).sum(-1)
    freq = torch.bincount(codes, minlength=16).double() / 12000
    pairs = [3, 5, 6, 9, 10, 12]
    assert freq[pairs].sum() == 1.0
    assert (freq[pairs] - 1 / 6).abs().max() < 0.02


def test_invalid_arguments():
    completion_mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="'bernoulli', 'exact_count', 'reference'"):
        sample_masks(completion_mask, torch.tensor([0.5]), "uniform")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sample_masks(completion_mask, torch.tensor([0.0]), "bernoulli")
    with pytest.raises(ValueError, match="num_samples"):
        DoubleMC(num_samples=0)
    with pytest.raises(ValueError, match="masking"):
        DoubleMC(masking="reference")
    assert ESTIMATORS.get("double_mc") is DoubleMC
    assert DoubleMC(num_samples=5).nfe == 5


def test_different_generators_give_different_masks_and_gradients_flow():
    policy = make_toy_policy(seed=3)
    prompt_ids, prompt_mask, completion, completion_mask = infill_example()
    a = DoubleMC(num_samples=4).make_plan(completion_mask, torch.Generator().manual_seed(0))
    b = DoubleMC(num_samples=4).make_plan(completion_mask, torch.Generator().manual_seed(1))
    assert not torch.equal(a.masks, b.masks)
    assert not (a.masks & ~completion_mask).any()
    est = DoubleMC(num_samples=4, masking="bernoulli").estimate(
        policy, prompt_ids, prompt_mask, completion, completion_mask, torch.Generator().manual_seed(0)
    )
    est.per_token.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters())
