"""Coupled SDMC: Gauss–Legendre node pairs sharing a mask and its complement; structure and expectations."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from dlmrl.estimators import ESTIMATORS, CoupledSDMC, score
from tests.conftest import make_toy_policy
from tests.estimators.test_exact import discrete_elbo, example, subset_scores
from tests.tolerances import NODE_TOL, TOY_ELBO_RTOL, WEIGHT_OPS_RTOL, rounding_tol

# Rows: full canvas (L_b = 5), infill blanks (L_b = 3), nothing to score, a single blank (L_b = 1).
INFILL = torch.tensor(
    [
        [True] * 5,
        [False, True, True, False, True],
        [False] * 5,
        [False, False, True, False, False],
    ]
)
LENGTHS = (5, 3, 0, 1)


def gl_nodes(n: int) -> tuple[list[float], list[float]]:
    """Gauss–Legendre nodes/weights on [0, 1] from closed forms (N = 1..3) or numpy (N >= 4)."""
    if n == 1:
        return [0.5], [1.0]
    if n == 2:
        d = math.sqrt(3) / 6
        return [0.5 - d, 0.5 + d], [0.5, 0.5]
    if n == 3:
        d = math.sqrt(15) / 10
        return [0.5 - d, 0.5, 0.5 + d], [5 / 18, 8 / 18, 5 / 18]
    x, w = np.polynomial.legendre.leggauss(n)
    return ((x + 1) / 2).tolist(), (w / 2).tolist()


def test_gauss_legendre_three_nodes_match_the_spec():
    t, w = gl_nodes(3)
    assert t == pytest.approx([0.1127, 0.5, 0.8873], abs=5e-5)  # (the spec's 4 decimals: half a unit of the last)
    assert w == pytest.approx([0.2778, 0.4444, 0.2778], abs=5e-5)


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


@pytest.mark.parametrize(("num_nodes", "kk"), [(1, 2), (2, 1), (3, 2), (4, 1)])
def test_exact_count_plan_layout_counts_and_weights_by_hand(num_nodes, kk):
    est = CoupledSDMC(num_nodes=num_nodes, samples_per_node=kk, masking="exact_count")
    plan = est.make_plan(INFILL, torch.Generator().manual_seed(num_nodes))
    assert plan.nfe == est.nfe == num_nodes * kk
    assert plan.masks.shape == (num_nodes * kk, 4, 5)
    t, w = gl_nodes(num_nodes)
    s = 0
    for p in range(num_nodes // 2):  # pairs (t_p, 1 - t_p), pair-major [m, m^c] per draw
        tp, wp, wq = t[p], w[p], w[-1 - p]
        assert t[-1 - p] == pytest.approx(1 - tp, abs=2 * NODE_TOL)
        for _ in range(kk):
            m, mc = plan.masks[s], plan.masks[s + 1]
            assert plan.t[s].item() == pytest.approx(tp, abs=2 * NODE_TOL)  # (scipy's nodes vs numpy's)
            assert plan.t[s + 1].item() == pytest.approx(1 - tp, abs=2 * NODE_TOL)
            assert not (m & mc).any()
            assert torch.equal(m | mc, INFILL)  # each pair scores every blank exactly once
            for b, n in enumerate(LENGTHS):
                wm, wc = plan.weights[s, b].item(), plan.weights[s + 1, b].item()
                if n == 0:
                    assert (wm, wc) == (0.0, 0.0)
                elif n == 1:  # the complement is empty: the lone blank carries both weights
                    assert int(m[b].sum()) == 1 and not mc[b].any()
                    assert wm == pytest.approx((wp + wq) / kk, rel=WEIGHT_OPS_RTOL) and wc == 0.0
                else:
                    k = min(max(round_half_up(tp * n), 1), n - 1)
                    assert int(m[b].sum()) == k and int(mc[b].sum()) == n - k
                    assert wm == pytest.approx(wp * n / k / kk, rel=WEIGHT_OPS_RTOL)
                    assert wc == pytest.approx(wq * n / (n - k) / kk, rel=WEIGHT_OPS_RTOL)
            s += 2
    if num_nodes % 2:  # the middle node t = 1/2 is plain exact-count SDMC
        wm = w[num_nodes // 2]
        for _ in range(kk):
            assert plan.t[s].item() == 0.5
            for b, n in enumerate(LENGTHS):
                k = min(max(math.ceil(0.5 * n), 1), n)
                assert int(plan.masks[s, b].sum()) == k
                expected = wm * n / k / kk if n else 0.0
                assert plan.weights[s, b].item() == pytest.approx(expected, rel=WEIGHT_OPS_RTOL)
            s += 1
    assert s == plan.nfe
    assert not (plan.masks & ~INFILL[None]).any()


def test_three_node_counts_written_out():
    # N = 3: t = 0.1127 -> round(0.56) = 1 of 5 and round(0.34) = 0 -> clamped 1 of 3; middle ceil(L/2).
    plan = CoupledSDMC(num_nodes=3).make_plan(INFILL, 0)
    assert plan.masks.sum(-1).tolist() == [[1, 1, 0, 1], [4, 2, 0, 0], [3, 2, 0, 1]]
    w1, w2 = 5 / 18, 8 / 18
    expected = [[w1 * 5, w1 * 3, 0, 2 * w1], [w1 * 5 / 4, w1 * 3 / 2, 0, 0], [w2 * 5 / 3, w2 * 3 / 2, 0, w2]]
    torch.testing.assert_close(plan.weights, torch.tensor(expected, dtype=torch.float32), rtol=WEIGHT_OPS_RTOL, atol=0)


def test_bernoulli_plan_weights_by_hand():
    kk = 3
    plan = CoupledSDMC(num_nodes=3, samples_per_node=kk, masking="bernoulli").make_plan(INFILL, 5)
    t, w = gl_nodes(3)
    for j in range(kk):
        m, mc = plan.masks[2 * j], plan.masks[2 * j + 1]
        assert not (m & mc).any() and torch.equal(m | mc, INFILL)
        for b in range(4):
            wm, wc = plan.weights[2 * j, b].item(), plan.weights[2 * j + 1, b].item()
            assert wm == (pytest.approx(w[0] / t[0] / kk, rel=WEIGHT_OPS_RTOL) if m[b].any() else 0.0)
            assert wc == (pytest.approx(w[2] / (1 - t[0]) / kk, rel=WEIGHT_OPS_RTOL) if mc[b].any() else 0.0)
    for s in range(2 * kk, 3 * kk):
        # Middle node as Bernoulli SDMC: weight w/t on every row with blanks (an empty mask scores 0).
        for b, n in enumerate(LENGTHS):
            assert plan.weights[s, b].item() == (pytest.approx(w[1] / 0.5 / kk, rel=WEIGHT_OPS_RTOL) if n else 0.0)
    # The lone blank of row 3 sits in exactly one half of every pair.
    assert (plan.masks[0 : 2 * kk : 2, 3, 2] ^ plan.masks[1 : 2 * kk : 2, 3, 2]).all()


def enumerated_expectation(scores: dict, n: int, num_nodes: int, masking: str) -> float:
    """Exact expectation of CoupledSDMC by enumerating every mask of ``range(n)``."""
    t, w = gl_nodes(num_nodes)
    full = dict(scores)
    full[()] = 0.0

    def comp(m):
        return tuple(i for i in range(n) if i not in m)

    total = 0.0
    for p in range(num_nodes // 2):
        tp, wp, wq = t[p], w[p], w[-1 - p]
        if masking == "bernoulli":
            total += sum(
                tp ** len(m) * (1 - tp) ** (n - len(m)) * (wp / tp * v + wq / (1 - tp) * full[comp(m)])
                for m, v in full.items()
            )
        else:
            k = min(max(round_half_up(tp * n), 1), n - 1)
            same = [m for m in scores if len(m) == k]
            total += sum(wp * n / k * scores[m] + wq * n / (n - k) * scores[comp(m)] for m in same) / len(
                same
            )
    if num_nodes % 2:
        wm = w[num_nodes // 2]
        if masking == "bernoulli":
            total += wm * sum(0.5**n / 0.5 * v for v in full.values())
        else:
            k = max(1, math.ceil(0.5 * n))
            same = [m for m in scores if len(m) == k]
            total += wm * n / k * sum(scores[m] for m in same) / len(same)
    return total


def test_bernoulli_is_exact_in_expectation_once_quadrature_is_exact():
    # Each half has mean w g(t) with g a polynomial of degree L - 1 = 3: exact once 2N - 1 >= 3.
    policy = make_toy_policy(seed=3)
    prompt_ids, prompt_mask, completion, _ = example(length=4, seed=3)
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], [0, 1, 2, 3])
    exact = discrete_elbo(scores, 4)
    # float64, one sign: ≤ 4 nodes × 15 masks × ≤ 4 factors and sums, each a rounding, and the nodes' NODE_TOL
    # (moving a weight·t^k term by ≤ 5·NODE_TOL of its size)
    tol = rounding_tol(scale=1, n=240, dtype=torch.float64) + 5 * NODE_TOL  # ≈ 1.2e-13 relative
    for nodes in (2, 3, 4):
        assert enumerated_expectation(scores, 4, nodes, "bernoulli") == pytest.approx(exact, rel=tol)
    assert abs(enumerated_expectation(scores, 4, 1, "bernoulli") - exact) > 1e6 * tol * abs(exact)  # (1 node)
    # exact_count integrates a step function: biased by quadrature (far above the rounding), but close: it is an
    # average (weights Σ w = 1) of f_k = (L/k) h(k) over the counts k = 1..L-1 its nodes use (7% off here)
    biased = enumerated_expectation(scores, 4, 3, "exact_count")
    assert abs(biased - exact) > 1e6 * tol * abs(exact)
    f = [4 / k * sum(v for m, v in scores.items() if len(m) == k) / math.comb(4, k) for k in range(1, 4)]
    assert min(f) * (1 + tol) <= biased <= max(f) * (1 - tol)  # (values < 0)


@pytest.mark.parametrize(("masking", "num_nodes", "kk"), [("bernoulli", 2, 1), ("exact_count", 3, 1)])
def test_sample_mean_matches_the_enumerated_expectation(masking, num_nodes, kk):
    # Node times are fixed and masks independent across rows: rows are i.i.d. draws.
    policy = make_toy_policy(seed=1)
    rows, length = 2000, 4
    prompt_ids, prompt_mask, completion, completion_mask = (
        x.expand(rows, -1).contiguous() for x in example(length=length, seed=2)
    )
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], list(range(length)))
    expected = enumerated_expectation(scores, length, num_nodes, masking)
    est_fn = CoupledSDMC(num_nodes=num_nodes, samples_per_node=kk, masking=masking)
    with torch.no_grad():
        est = est_fn.estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, 0)
    x = est.sequence.double()
    se = x.std().item() / math.sqrt(rows)
    assert est.nfe == num_nodes * kk
    # 4 standard errors, measured from the same 2000 draws: P(|z| > 4) = 6e-5 per check for a seed change
    assert abs(x.mean().item() - expected) < 4 * se, (x.mean().item(), expected, se)
    if masking == "bernoulli":
        assert abs(x.mean().item() - discrete_elbo(scores, length)) < 4 * se


def test_infill_rows_and_a_row_with_nothing_to_score():
    policy = make_toy_policy(seed=5)
    prompt_ids = torch.tensor([[6, 6, 2], [1, 4, 3], [5, 0, 1], [2, 2, 2]])
    prompt_mask = torch.tensor([[False, False, True], [True] * 3, [True] * 3, [True] * 3])
    completion = torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 1, 2, 2, 3], [5, 4, 3, 2, 1]])
    for masking in ("exact_count", "bernoulli"):
        with torch.no_grad():
            est = CoupledSDMC(num_nodes=4, samples_per_node=2, masking=masking).estimate(
                policy, prompt_ids, prompt_mask, completion, INFILL, 2
            )
        assert est.nfe == 8
        assert est.sequence[2].item() == 0.0 and (est.per_token[~INFILL] == 0).all()
        torch.testing.assert_close(est.per_token.sum(-1), est.sequence)
        # Pairs alone already score every blank, so every blank has a non-zero contribution.
        assert (est.per_token[INFILL] < 0).all()


def test_single_blank_exact_count_is_the_exact_elbo():
    # L_b = 1, exact_count: every node masks the lone blank with total weight Σ w = 1.
    policy = make_toy_policy(seed=2, dtype=torch.float64)  # (batched vs one canvas: float64)
    prompt_ids, prompt_mask, completion, _ = example(length=5, seed=1)
    completion_mask = INFILL[3:4]
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], [2])
    for nodes in (1, 2, 3, 4):
        with torch.no_grad():
            est = CoupledSDMC(num_nodes=nodes, samples_per_node=2).estimate(
                policy, prompt_ids, prompt_mask, completion, completion_mask, 0
            )
        # (the float32 weights sum to 1 within a few ulps each: WEIGHT_OPS_RTOL)
        assert est.sequence.item() == pytest.approx(scores[(2,)], rel=TOY_ELBO_RTOL + WEIGHT_OPS_RTOL)


def test_common_random_numbers():
    policy = make_toy_policy(seed=6)
    twin = copy.deepcopy(policy)
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=3, length=6, seed=6)
    for masking in ("bernoulli", "exact_count"):
        est_fn = CoupledSDMC(num_nodes=3, samples_per_node=2, masking=masking)
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
    assert ESTIMATORS.get("coupled_sdmc") is CoupledSDMC
    assert CoupledSDMC().nfe == 3 and CoupledSDMC(num_nodes=4, samples_per_node=3).nfe == 12
    assert CoupledSDMC().masking == "exact_count"
    with pytest.raises(ValueError, match="num_nodes"):
        CoupledSDMC(num_nodes=0)
    with pytest.raises(ValueError, match="samples_per_node"):
        CoupledSDMC(samples_per_node=0)
    with pytest.raises(ValueError, match="masking"):
        CoupledSDMC(masking="reference")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("masking", ["bernoulli", "exact_count"])
def test_make_plan_with_a_cuda_completion_mask(masking):
    plan = CoupledSDMC(num_nodes=3, samples_per_node=2, masking=masking).make_plan(INFILL.cuda(), 0)
    assert plan.masks.device.type == "cuda" and plan.weights.device.type == "cuda"
    cpu = plan.to("cpu")
    assert not (cpu.masks & ~INFILL[None]).any()
    for j in range(2):
        assert torch.equal(cpu.masks[2 * j] | cpu.masks[2 * j + 1], INFILL)
