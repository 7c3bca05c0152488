"""Coupled (complementary-mask) estimator, DiffuCoder: plan structure by hand, unbiasedness, CRN."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from scipy.integrate import quad

from dlmrl.estimators import ESTIMATORS, Coupled, exact_elbo, score
from tests.conftest import make_toy_policy
from tests.estimators.test_exact import discrete_elbo, example, subset_scores
from tests.tolerances import TOY_ELBO_RTOL, WEIGHT_OPS_RTOL, rounding_tol

# Rows: full canvas (L_b = 5), infill blanks (L_b = 3), nothing to score, a single blank (L_b = 1).
INFILL = torch.tensor(
    [
        [True] * 5,
        [False, True, True, False, True],
        [False] * 5,
        [False, False, True, False, False],
    ]
)


def check_pairs(plan, completion_mask):
    """Each pair ``(2j, 2j+1)`` is a mask and its complement within the row's allowed positions."""
    num_pairs = plan.nfe // 2
    for j in range(num_pairs):
        m, mc = plan.masks[2 * j], plan.masks[2 * j + 1]  # (B, L)
        assert not (m & mc).any()
        assert torch.equal(m | mc, completion_mask)
        # (float64 times in [0, 1]: the plan's complement and this one each round once)
        torch.testing.assert_close(plan.t[2 * j + 1], 1.0 - plan.t[2 * j], rtol=0, atol=rounding_tol(1, 2, torch.float64))


@pytest.mark.parametrize("num_pairs", [1, 3])
def test_exact_count_plan_counts_and_weights_by_hand(num_pairs):
    est = Coupled(num_pairs=num_pairs, masking="exact_count")
    plan = est.make_plan(INFILL, torch.Generator().manual_seed(4))
    assert plan.nfe == est.nfe == 2 * num_pairs
    assert plan.masks.shape == (2 * num_pairs, 4, 5) and plan.t.shape == (2 * num_pairs, 4)
    check_pairs(plan, INFILL)
    kk = num_pairs
    for j in range(num_pairs):
        for b, n in enumerate((5, 3, 0, 1)):
            t = plan.t[2 * j, b].item()
            assert 0.2 <= t < 0.8
            w, wc = plan.weights[2 * j, b].item(), plan.weights[2 * j + 1, b].item()
            if n == 0:
                assert not plan.masks[2 * j : 2 * j + 2, b].any()
                assert w == 0.0 and wc == 0.0
                continue
            k = min(max(math.ceil(t * n), 1), n)
            assert int(plan.masks[2 * j, b].sum()) == k
            assert int(plan.masks[2 * j + 1, b].sum()) == n - k
            if k < n:
                assert w == pytest.approx(0.5 * n / k / kk, rel=WEIGHT_OPS_RTOL)
                assert wc == pytest.approx(0.5 * n / (n - k) / kk, rel=WEIGHT_OPS_RTOL)
            else:  # the complement is empty: the pair's value is S(m) alone
                assert w == pytest.approx(1.0 / kk, rel=WEIGHT_OPS_RTOL)
                assert wc == 0.0
    # L_b = 1: k = ceil(t) = 1 = L_b, so every pair masks the lone blank with weight 1/K.
    assert plan.masks[0::2, 3, 2].all() and not plan.masks[1::2, 3].any()


def test_bernoulli_plan_weights_by_hand():
    kk = 2
    plan = Coupled(num_pairs=kk, masking="bernoulli", t_min=0.1, t_max=0.6).make_plan(
        INFILL, torch.Generator().manual_seed(1)
    )
    check_pairs(plan, INFILL)
    for j in range(kk):
        for b in range(4):
            t = plan.t[2 * j, b].item()
            assert 0.1 <= t < 0.6
            m, mc = plan.masks[2 * j, b], plan.masks[2 * j + 1, b]
            w, wc = plan.weights[2 * j, b].item(), plan.weights[2 * j + 1, b].item()
            assert w == (pytest.approx(0.5 / t / kk, rel=WEIGHT_OPS_RTOL) if m.any() else 0.0)
            assert wc == (pytest.approx(0.5 / (1 - t) / kk, rel=WEIGHT_OPS_RTOL) if mc.any() else 0.0)
    assert (plan.weights[:, 2] == 0).all()
    # The lone blank of row 3 is in exactly one half of each pair.
    assert (plan.masks[0::2, 3, 2] ^ plan.masks[1::2, 3, 2]).all()


def test_times_differ_between_rows_and_bernoulli_rate_is_t():
    plan = Coupled(num_pairs=1, masking="bernoulli").make_plan(torch.ones(20000, 4, dtype=torch.bool), 0)
    t = plan.t[0]  # (B,)
    assert t.unique().numel() == 20000
    # U(0.2, 0.8): mean 0.5, sd 0.6/sqrt(12)
    assert abs(t.mean().item() - 0.5) < 4 * 0.6 / math.sqrt(12 * 20000)
    # Given t, each position is masked w.p. t: the residual (mask - t) has mean 0.
    resid = plan.masks[0].double() - t[:, None]
    se = resid.std().item() / math.sqrt(resid.numel())
    assert abs(resid.mean().item()) < 4 * se


def test_coupled_exact_count_with_full_interval_is_unbiased():
    policy = make_toy_policy(seed=1)
    rows, length = 2000, 4
    prompt_ids, prompt_mask, completion, completion_mask = (
        x.expand(rows, -1).contiguous() for x in example(length=length, seed=2)
    )
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], list(range(length)))
    exact = discrete_elbo(scores, length)
    est_fn = Coupled(num_pairs=1, masking="exact_count", t_min=0.0, t_max=1.0)
    with torch.no_grad():
        est = est_fn.estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, 0)
    x = est.sequence.double()
    se = x.std().item() / math.sqrt(rows)
    assert abs(x.mean().item() - exact) < 4 * se, (x.mean().item(), exact, se)
    assert se < 0.05 * abs(exact)  # the check has power


def pair_expectation(scores: dict, n: int, masking: str, lo: float, hi: float) -> float:
    """``E[value of one pair]`` by enumeration over masks and (numerically) over ``t ~ U(lo, hi)``."""

    def comp(m):
        return tuple(i for i in range(n) if i not in m)

    def given_t(t):
        if masking == "bernoulli":
            return sum(
                t ** len(m)
                * (1 - t) ** (n - len(m))
                * (0.5 / t * v + 0.5 / (1 - t) * scores.get(comp(m), 0.0))
                for m, v in list(scores.items()) + [((), 0.0)]
            )
        k = min(max(math.ceil(t * n), 1), n)
        same = [m for m in scores if len(m) == k]
        if k == n:
            return sum(scores[m] for m in same) / len(same)
        return sum(0.5 * n / k * scores[m] + 0.5 * n / (n - k) * scores[comp(m)] for m in same) / len(same)

    points = [j / n for j in range(1, n)]
    return quad(given_t, lo, hi, points=points, epsabs=1e-12, epsrel=1e-12, limit=200)[0] / (hi - lo)


@pytest.mark.parametrize("masking", ["bernoulli", "exact_count"])
def test_enumerated_expectation_is_the_elbo_on_the_full_interval_and_biased_on_the_default(masking):
    policy = make_toy_policy(seed=3)
    prompt_ids, prompt_mask, completion, _ = example(length=4, seed=3)
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], [0, 1, 2, 3])
    exact = discrete_elbo(scores, 4)
    # quad was asked for 1e-12 relative; its 21-point rule is exact on each piece between the breakpoints given
    # (polynomials of degree ≤ 3, or constants), so what remains is float64 rounding of ≤ 240 one-sign terms
    tol = 1e-12 + rounding_tol(scale=1, n=240, dtype=torch.float64)
    assert pair_expectation(scores, 4, masking, 0.0, 1.0) == pytest.approx(exact, rel=tol)
    # DiffuCoder's default (0.2, 0.8) truncates the integral: unbiased only where g is linear.
    assert abs(pair_expectation(scores, 4, masking, 0.2, 0.8) - exact) > 1e6 * tol * abs(exact)


def test_default_interval_averages_to_its_enumerated_expectation():
    policy = make_toy_policy(seed=3)
    rows = 2500
    prompt_ids, prompt_mask, completion, completion_mask = (
        x.expand(rows, -1).contiguous() for x in example(length=4, seed=3)
    )
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], [0, 1, 2, 3])
    with torch.no_grad():
        est = Coupled().estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, 1)
    x = est.sequence.double()
    se = x.std().item() / math.sqrt(rows)
    expected = pair_expectation(scores, 4, "bernoulli", 0.2, 0.8)
    # 4 standard errors, measured from the same 2500 draws: P(|z| > 4) = 6e-5 for a seed change
    assert abs(x.mean().item() - expected) < 4 * se, (x.mean().item(), expected, se)


def test_infill_rows_score_every_blank_once_per_pair():
    policy = make_toy_policy(seed=5, dtype=torch.float64)  # (two plans' batches: float64)
    prompt_ids = torch.tensor([[6, 6, 2], [1, 4, 3], [5, 0, 1], [2, 2, 2]])
    prompt_mask = torch.tensor([[False, False, True], [True] * 3, [True] * 3, [True] * 3])
    completion = torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 1, 2, 2, 3], [5, 4, 3, 2, 1]])
    plan = Coupled(num_pairs=2, masking="exact_count").make_plan(INFILL, 3)
    assert not (plan.masks & ~INFILL[None]).any()
    with torch.no_grad():
        est = score(policy, prompt_ids, prompt_mask, completion, INFILL, plan)
        ref = exact_elbo(policy, prompt_ids, prompt_mask, completion, INFILL)
    assert est.nfe == 4
    assert est.sequence[2].item() == 0.0 and (est.per_token[~INFILL] == 0).all()
    # A single blank: both modes give exactly log p(y | blank masked), the exact ELBO.
    assert est.sequence[3].item() == pytest.approx(ref.sequence[3].item(), rel=TOY_ELBO_RTOL + WEIGHT_OPS_RTOL)
    # Every allowed token is scored in each pair, so each per-token term is non-zero.
    assert (est.per_token[INFILL] < 0).all()


def test_common_random_numbers():
    policy = make_toy_policy(seed=6)
    twin = copy.deepcopy(policy)
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=3, length=6, seed=6)
    for masking in ("bernoulli", "exact_count"):
        est_fn = Coupled(num_pairs=2, masking=masking)
        plan = est_fn.make_plan(completion_mask, torch.Generator().manual_seed(7))
        with torch.no_grad():
            old = score(twin, prompt_ids, prompt_mask, completion, completion_mask, plan)
        new = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
        assert torch.equal(new.sequence.detach(), old.sequence)
        assert torch.equal(torch.exp(new.sequence.detach() - old.sequence), torch.ones(3))
        same = est_fn.make_plan(completion_mask, torch.Generator().manual_seed(7))
        other = est_fn.make_plan(completion_mask, torch.Generator().manual_seed(8))
        assert torch.equal(same.masks, plan.masks) and torch.equal(same.weights, plan.weights)
        assert not torch.equal(other.masks, plan.masks)
        new.sequence.sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters())


def test_arguments_are_validated_and_registered():
    assert ESTIMATORS.get("coupled") is Coupled
    assert Coupled().nfe == 2 and Coupled(num_pairs=3).nfe == 6 and Coupled(num_pairs=3).nfe_for(9) == 6
    assert (Coupled().masking, Coupled().t_min, Coupled().t_max) == ("bernoulli", 0.2, 0.8)
    with pytest.raises(ValueError, match="num_pairs"):
        Coupled(num_pairs=0)
    with pytest.raises(ValueError, match="masking"):
        Coupled(masking="reference")
    with pytest.raises(ValueError, match="t_min < t_max"):
        Coupled(t_min=0.5, t_max=0.5)
    with pytest.raises(ValueError, match="t_min < t_max"):
        Coupled(t_min=0.8, t_max=0.2)
    with pytest.raises(ValueError, match="t_min"):
        Coupled(t_min=-0.1)
    with pytest.raises(ValueError, match="t_max"):
        Coupled(t_max=1.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("masking", ["bernoulli", "exact_count"])
def test_make_plan_with_a_cuda_completion_mask(masking):
    plan = Coupled(num_pairs=2, masking=masking).make_plan(INFILL.cuda(), 0)
    assert plan.masks.device.type == "cuda" and plan.weights.device.type == "cuda"
    check_pairs(plan.to("cpu"), INFILL)
