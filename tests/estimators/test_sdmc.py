"""SDMC (GDPO §4) and the shared plan/scoring machinery: expectations, convergence, common random numbers."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from dlmrl.estimators import ESTIMATORS, SDMC, MaskPlan, exact_elbo, gauss_legendre_unit, score
from tests.conftest import make_toy_policy
from tests.estimators.test_exact import discrete_elbo, example, subset_scores
from tests.tolerances import TOY_ELBO_RTOL, WEIGHT_OPS_RTOL, WEIGHT_RTOL, rounding_tol


def mean_h(scores: dict, n: int) -> dict[int, float]:
    """``h(k)``: mean of ``S(m)`` over all masks of size ``k``."""
    return {k: sum(v for m, v in scores.items() if len(m) == k) / math.comb(n, k) for k in range(1, n + 1)}


def sdmc_expectation(scores: dict, n: int, num_nodes: int, masking: str) -> float:
    """``Σ_n w_n E_m[scale · S(m)]``, the expectation over masks computed by enumeration."""
    h = mean_h(scores, n)
    t_nodes, w_nodes = gauss_legendre_unit(num_nodes)
    total = 0.0
    for t, w in zip(t_nodes.tolist(), w_nodes.tolist()):
        if masking == "exact_count":
            k = max(1, math.ceil(t * n))
            total += w * (n / k) * h[k]
        elif masking == "reference":
            k = max(1, math.floor(t * n))
            total += w * (1 / t) * h[k]
        else:  # bernoulli
            total += w * sum(t ** (len(m) - 1) * (1 - t) ** (n - len(m)) * v for m, v in scores.items())
    return total


def replicate(rows: int, length: int, seed: int):
    prompt_ids, prompt_mask, completion, completion_mask = example(length=length, seed=seed)
    return (x.expand(rows, -1).contiguous() for x in (prompt_ids, prompt_mask, completion, completion_mask))


@pytest.mark.parametrize(
    ("masking", "length"), [("exact_count", 4), ("exact_count", 5), ("bernoulli", 4), ("reference", 5)]
)
def test_sdmc_averages_to_its_enumerated_expectation(masking, length):
    # Rows are copies of one example; node times are fixed, masks are independent across rows,
    # so the rows' estimates are i.i.d. draws of the estimator.
    policy = make_toy_policy(seed=1)
    rows = 3000
    prompt_ids, prompt_mask, completion, completion_mask = replicate(rows, length, seed=2)
    sdmc = SDMC(num_nodes=3, samples_per_node=1, masking=masking)
    with torch.no_grad():
        est = sdmc.estimate(
            policy,
            prompt_ids,
            prompt_mask,
            completion,
            completion_mask,
            torch.Generator().manual_seed(0),
            micro_batch=None,
        )
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], list(range(length)))
    expected = sdmc_expectation(scores, length, 3, masking)
    x = est.sequence.double()
    se = x.std().item() / math.sqrt(rows)
    assert est.nfe == 3
    # 4 standard errors, measured from the same 3000 draws: P(|z| > 4) = 6e-5 for a seed change (this seed is fixed)
    assert abs(x.mean().item() - expected) < 4 * se, (x.mean().item(), expected, se)


def test_bernoulli_sdmc_is_exact_in_expectation_when_quadrature_is_exact():
    # E_m[(1/t) S(m)] = Σ_m t^{|m|-1} (1-t)^{L-|m|} S(m) has degree L-1 = 3 <= 2N-1 = 5 for N = 3.
    policy = make_toy_policy(seed=3)
    prompt_ids, prompt_mask, completion, _ = example(length=4, seed=3)
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], [0, 1, 2, 3])
    # float64, one sign: 3 nodes × 15 masks × ≤ 4 factors and sums, each a rounding
    tol = rounding_tol(scale=1, n=200, dtype=torch.float64)  # ≈ 4.4e-14 relative
    exact = discrete_elbo(scores, 4)
    assert sdmc_expectation(scores, 4, 3, "bernoulli") == pytest.approx(exact, rel=tol)
    assert abs(sdmc_expectation(scores, 4, 1, "bernoulli") - exact) > 1e6 * tol * abs(exact)  # (1 node: biased)


def expectation_plan(sdmc: SDMC, length: int) -> MaskPlan:
    """SDMC's exact_count expectation as a plan: every k_n-subset at node n, weight w_n (L/k_n) / C(L, k_n)."""
    t_nodes, w_nodes = gauss_legendre_unit(sdmc.num_nodes)
    masks, weights, times = [], [], []
    for t, w in zip(t_nodes.tolist(), w_nodes.tolist()):
        k = max(1, math.ceil(t * length))
        for m in itertools.combinations(range(length), k):
            mask = torch.zeros(1, length, dtype=torch.bool)
            mask[0, list(m)] = True
            masks.append(mask)
            weights.append(w * (length / k) / math.comb(length, k))
            times.append(t)
    return MaskPlan(
        torch.stack(masks),
        torch.tensor(weights, dtype=torch.float32)[:, None],
        torch.tensor(times, dtype=torch.float64),
    )


def test_sdmc_converges_to_exact_elbo_as_nodes_grow():
    policy = make_toy_policy(seed=0, dtype=torch.float64)  # (the plan's batches vs one canvas at a time)
    length = 5
    prompt_ids, prompt_mask, completion, completion_mask = example(length=length, seed=0)
    exact = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask).sequence.item()
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], list(range(length)))
    errors = []
    for nodes in (2, 16, 64):
        plan = expectation_plan(SDMC(num_nodes=nodes), length)
        with torch.no_grad():
            value = score(
                policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch=None
            ).sequence.item()
        # (the plan's weights are float32, the expectation's float64: tests/tolerances.py)
        rel = TOY_ELBO_RTOL + WEIGHT_RTOL
        assert value == pytest.approx(sdmc_expectation(scores, length, nodes, "exact_count"), rel=rel)
        errors.append(abs(value - exact))
    assert errors[0] > errors[1] > errors[2]
    # exact_count's integrand f(t) = (L/k) h(k), k = ceil(tL), is a step function with jumps at t = j/L; by the
    # Chebyshev-Markov-Stieltjes inequalities a Gauss-Legendre rule integrates a unit step at s to within the larger
    # weight of the two nodes around s, so the error is ≤ Σ_j |jump_j| · that weight, plus the values' rounding
    h = mean_h(scores, length)
    f = [length / k * h[k] for k in range(1, length + 1)]
    t, w = gauss_legendre_unit(64)
    around = [max(w[i - 1].item(), w[i].item()) for i in torch.searchsorted(t, torch.arange(1, length) / length)]
    bound = sum(abs(b - a) * wj for (a, b), wj in zip(itertools.pairwise(f), around, strict=True))  # (≈ 0.3 here; the error: 0.026)
    assert errors[2] <= bound + 2 * rel * abs(exact)


def test_plan_layout_counts_and_weights():
    completion_mask = torch.tensor([[True] * 5, [False, True, True, False, True], [False] * 5])
    sdmc = SDMC(num_nodes=3, samples_per_node=2)
    plan = sdmc.make_plan(completion_mask, torch.Generator().manual_seed(1))
    t, w = gauss_legendre_unit(3)
    torch.testing.assert_close(plan.t, t.repeat_interleave(2))
    assert plan.nfe == sdmc.nfe == 6
    assert plan.masks.shape == (6, 3, 5) and plan.weights.dtype == torch.float32
    for s in range(6):
        for b, n in enumerate((5, 3, 0)):
            k = max(1, math.ceil(plan.t[s].item() * n)) if n else 0
            assert int(plan.masks[s, b].sum()) == k
            expected = w[s // 2].item() * (n / k) / 2 if n else 0.0
            assert plan.weights[s, b].item() == pytest.approx(expected, rel=WEIGHT_OPS_RTOL)
    assert not (plan.masks & ~completion_mask).any()
    assert repr(plan).startswith("MaskPlan(S=6, B=3, L=5")


def test_common_random_numbers_give_ratio_exactly_one():
    policy = make_toy_policy(seed=4)
    twin = copy.deepcopy(policy)
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=4, length=6, seed=4)
    plan = SDMC().make_plan(completion_mask, torch.Generator().manual_seed(7))
    with torch.no_grad():
        old = score(twin, prompt_ids, prompt_mask, completion, completion_mask, plan)
    new = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
    assert torch.equal(new.sequence.detach(), old.sequence)
    assert torch.equal(torch.exp(new.sequence.detach() - old.sequence), torch.ones(4))
    same = SDMC().make_plan(completion_mask, torch.Generator().manual_seed(7))
    other = SDMC().make_plan(completion_mask, torch.Generator().manual_seed(8))
    assert torch.equal(same.masks, plan.masks)
    assert not torch.equal(other.masks, plan.masks)


@pytest.mark.parametrize("masking", ["exact_count", "bernoulli", "reference"])
def test_masks_stay_inside_infill_blanks(masking):
    completion_mask = torch.tensor(
        [[False, True, False, True, True, False], [True] * 6, [False, False, False, False, False, True]]
    )
    plan = SDMC(num_nodes=4, samples_per_node=50, masking=masking).make_plan(
        completion_mask, torch.Generator().manual_seed(2)
    )
    assert not (plan.masks & ~completion_mask[None]).any()
    assert plan.masks[:, 0].any(0).tolist() == completion_mask[0].tolist()  # every blank gets masked


def test_scoring_rejects_masks_outside_the_completion_mask_and_bad_plans():
    policy = make_toy_policy()
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=2, length=4)
    completion_mask[1, 2] = False
    masks = torch.zeros(1, 2, 4, dtype=torch.bool)
    masks[0, 1, 2] = True
    plan = MaskPlan(masks, torch.ones(1, 2), torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="position 2 of row 1"):
        score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
    with pytest.raises(ValueError, match="do not match"):
        score(policy, prompt_ids, prompt_mask, completion[:, :3], completion_mask[:, :3], plan)
    with pytest.raises(ValueError, match="weights"):
        MaskPlan(masks, torch.ones(2, 2), torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="bool"):
        MaskPlan(masks.float(), torch.ones(1, 2), torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\(S,\)"):
        MaskPlan(masks, torch.ones(1, 2), torch.tensor([0.5, 0.2], dtype=torch.float64))


def test_stacked_forwards_equal_one_sample_at_a_time_and_rows_do_not_interact():
    policy = make_toy_policy(seed=5, dtype=torch.float64)  # (other batch shapes and padding: float64)
    prompt_ids = torch.tensor([[6, 6, 1], [2, 3, 4]])  # row 0 left-padded
    prompt_mask = torch.tensor([[False, False, True], [True, True, True]])
    completion = torch.tensor([[0, 1, 2, 3, 4], [5, 4, 3, 2, 1]])
    completion_mask = torch.tensor([[True, True, False, True, True], [True] * 5])
    plan = SDMC(num_nodes=3, samples_per_node=3).make_plan(completion_mask, torch.Generator().manual_seed(3))
    with torch.no_grad():
        one = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch=1)
        all_ = score(
            policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch=7
        )
        row0 = MaskPlan(plan.masks[:, :1], plan.weights[:, :1], plan.t)
        alone = score(
            policy, prompt_ids[:1, 2:], prompt_mask[:1, 2:], completion[:1], completion_mask[:1], row0
        )
    torch.testing.assert_close(one.per_token, all_.per_token, rtol=TOY_ELBO_RTOL, atol=0)
    torch.testing.assert_close(alone.per_token[0], one.per_token[0], rtol=TOY_ELBO_RTOL, atol=0)
    torch.testing.assert_close(one.per_token.sum(-1), one.sequence)
    assert (one.per_token[~completion_mask] == 0).all()


def test_gradient_flows_through_the_estimate():
    policy = make_toy_policy(seed=6)
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=3, length=5, seed=6)
    est = SDMC(num_nodes=2, samples_per_node=2).estimate(
        policy, prompt_ids, prompt_mask, completion, completion_mask, torch.Generator().manual_seed(0)
    )
    est.per_token.sum().backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


def test_arguments_are_validated_and_registered():
    assert ESTIMATORS.get("sdmc") is SDMC
    assert SDMC().nfe == 3 and SDMC(num_nodes=2, samples_per_node=4).nfe == 8
    with pytest.raises(ValueError, match="num_nodes"):
        SDMC(num_nodes=0)
    with pytest.raises(ValueError, match="samples_per_node"):
        SDMC(samples_per_node=0)
    with pytest.raises(ValueError, match="masking.*exact_count"):
        SDMC(masking="bernouli")
    with pytest.raises(KeyError, match="sdmc"):
        ESTIMATORS.get("smdc")
