"""Exact ELBO by enumeration, checked against an independent brute force (the continuous-time and the
exact-count forms; LLaDA arXiv 2502.09992, GDPO arXiv 2510.08554 §2)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.integrate import quad

from dlmrl.estimators import ESTIMATORS, Exact, exact_elbo, score
from tests.conftest import make_toy_policy
from tests.tolerances import TOY_ELBO_RTOL, WEIGHT_RTOL, rounding_tol

#: the float64 toy policy's ELBO values along two paths, with the plan's float32 weights (tests/tolerances.py)
ELBO_RTOL = TOY_ELBO_RTOL + WEIGHT_RTOL


def subset_scores(policy, prompt_ids, prompt_mask, completion, positions) -> dict[tuple[int, ...], float]:
    """``S(m)`` for every non-empty subset ``m`` of ``positions``, one direct policy call each.

    Written independently of ``dlmrl.estimators``: builds ``[prompt | masked canvas]`` by hand.
    Args: ``prompt_ids (P,)``, ``prompt_mask (P,)``, ``completion (L,)``, ``positions`` list of ints.
    """
    p = prompt_ids.shape[0]
    out = {}
    with torch.no_grad():
        for k in range(1, len(positions) + 1):
            for m in itertools.combinations(positions, k):
                canvas = completion.clone()
                canvas[list(m)] = policy.mask_token_id
                ids = torch.cat([prompt_ids, canvas])[None]
                attn = torch.cat([prompt_mask, torch.ones_like(canvas, dtype=torch.bool)])[None]
                logp = torch.log_softmax(policy(ids, attn)[0, p:].double(), -1)  # (L, V)
                out[m] = sum(float(logp[i, completion[i]]) for i in m)
    return out


def discrete_elbo(scores: dict, n: int) -> float:
    """``Σ_k h(k)/k`` with ``h(k)`` the mean of ``S(m)`` over ``|m| = k``."""
    total = 0.0
    for k in range(1, n + 1):
        vals = [v for m, v in scores.items() if len(m) == k]
        assert len(vals) == math.comb(n, k)
        total += sum(vals) / len(vals) / k
    return total


def continuous_elbo(scores: dict, n: int) -> float:
    """``∫_0^1 Σ_m t^{|m|} (1−t)^{n−|m|} (1/t) S(m) dt`` by adaptive quadrature."""

    def g(t):
        return sum(t ** (len(m) - 1) * (1 - t) ** (n - len(m)) * v for m, v in scores.items())

    return quad(g, 0.0, 1.0, epsabs=1e-12, epsrel=1e-12)[0]


def example(batch: int = 1, length: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, 6, (batch, 3), generator=g)  # (B, P)
    prompt_mask = torch.ones(batch, 3, dtype=torch.bool)
    completion = torch.randint(0, 7, (batch, length), generator=g)  # (B, L)
    completion_mask = torch.ones(batch, length, dtype=torch.bool)
    return prompt_ids, prompt_mask, completion, completion_mask


def test_exact_elbo_matches_both_forms_of_the_elbo():
    policy = make_toy_policy(seed=1, dtype=torch.float64)  # (batched vs one canvas at a time: float64)
    prompt_ids, prompt_mask, completion, completion_mask = example(length=4)
    est = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask)
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], [0, 1, 2, 3])
    assert len(scores) == 15
    discrete = discrete_elbo(scores, 4)
    continuous = continuous_elbo(scores, 4)
    # the integral equals the sum exactly; quad was asked for 1e-12 relative (its polynomial integrand of degree 3 is
    # integrated exactly by its 21-point rule, so only rounding remains), the 15-term float64 sums add ≤ 15·eps
    assert discrete == pytest.approx(continuous, rel=1e-12 + rounding_tol(scale=1, n=15, dtype=torch.float64))
    assert est.sequence[0].item() == pytest.approx(discrete, rel=ELBO_RTOL)
    assert est.nfe == 15
    assert est.sequence[0].item() <= 0.0
    torch.testing.assert_close(est.per_token.sum(-1), est.sequence)


def test_per_token_contributions_are_the_weighted_token_terms():
    # c^i = Σ_{m ∋ i} log p(y^i | y_m) / (|m| C(L, |m|)), written out for L = 3.
    policy = make_toy_policy(seed=2, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = example(length=3, seed=5)
    est = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask)
    p = prompt_ids.shape[1]
    expected = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for k in (1, 2, 3):
            for m in itertools.combinations(range(3), k):
                canvas = completion[0].clone()
                canvas[list(m)] = 7
                ids = torch.cat([prompt_ids[0], canvas])[None]
                logp = torch.log_softmax(policy(ids, torch.ones_like(ids, dtype=torch.bool))[0, p:], -1)
                for i in m:
                    expected[i] += float(logp[i, completion[0, i]]) / (k * math.comb(3, k))
    assert est.per_token.dtype == torch.float64
    torch.testing.assert_close(est.per_token[0], expected, rtol=ELBO_RTOL, atol=0)


def test_infill_rows_with_different_allowed_positions_and_padding():
    # Row 0: blanks at 1, 3 of a 5-cell canvas; row 1: all five cells; row 2: no blank at all.
    policy = make_toy_policy(seed=3, dtype=torch.float64)
    prompt_ids = torch.tensor([[6, 6, 2], [1, 4, 3], [5, 0, 1]])  # row 0 left-padded
    prompt_mask = torch.tensor([[False, False, True], [True, True, True], [True, True, True]])
    completion = torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 1, 2, 2, 3]])
    completion_mask = torch.tensor(
        [[False, True, False, True, False], [True, True, True, True, True], [False] * 5]
    )
    est = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask, batch_size=7)
    assert est.nfe == 2**5 - 1
    for b, positions in ((0, [1, 3]), (1, [0, 1, 2, 3, 4])):
        scores = subset_scores(policy, prompt_ids[b], prompt_mask[b], completion[b], positions)
        assert est.sequence[b].item() == pytest.approx(discrete_elbo(scores, len(positions)), rel=ELBO_RTOL)
    assert est.sequence[2].item() == 0.0
    assert (est.per_token[~completion_mask] == 0).all()
    torch.testing.assert_close(est.per_token.sum(-1), est.sequence)


def test_exact_refuses_long_canvases_with_a_clear_message():
    policy = make_toy_policy()
    prompt_ids, prompt_mask, completion, completion_mask = example(length=17)
    with pytest.raises(ValueError, match=r"L_b = 17 .*max_length = 16"):
        exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask)
    with pytest.raises(ValueError, match="max_length"):
        Exact().make_plan(completion_mask)
    # 17 cells of which 16 are allowed is fine for make_plan (not run: 65535 forwards).
    completion_mask[0, 0] = False
    assert Exact().make_plan(completion_mask).nfe == 2**16 - 1


def test_exact_plan_for_shared_positions_equals_exact_elbo():
    policy = make_toy_policy(seed=4)
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=3, length=4, seed=9)
    completion_mask[:, 2] = False
    plan = Exact().make_plan(completion_mask)
    assert plan.nfe == 7 and torch.isnan(plan.t).all()
    est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch=7)
    ref = Exact().estimate(policy, prompt_ids, prompt_mask, completion, completion_mask)
    torch.testing.assert_close(est.per_token, ref.per_token)
    completion_mask[1, 2] = True
    with pytest.raises(ValueError, match="same allowed positions"):
        Exact().make_plan(completion_mask)


def test_exact_is_registered_and_differentiable():
    assert ESTIMATORS.get("exact") is Exact
    policy = make_toy_policy(seed=5)
    prompt_ids, prompt_mask, completion, completion_mask = example(batch=2, length=3)
    est = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask)
    est.per_token.sum().backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def any_order_autoregressive(policy, prompt_ids, prompt_mask, completion) -> float:
    """``E_σ Σ_i log p(y^{σ(i)} | σ(<i) revealed, σ(≥i) masked)`` over all ``L!`` orderings σ.

    Written directly with the policy, not through ``dlmrl.estimators``; the forward pass of each
    distinct canvas is cached (2^L − 1 of them instead of L·L!).
    Args: ``prompt_ids (P,)``, ``prompt_mask (P,)``, ``completion (L,)``; every canvas cell is generated.
    """
    p, length = prompt_ids.shape[0], completion.shape[0]
    attn = torch.cat([prompt_mask, torch.ones(length, dtype=torch.bool)])[None]
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def logp(canvas: torch.Tensor) -> torch.Tensor:  # (L, V) log-probs at the canvas positions
        key = tuple(canvas.tolist())
        if key not in cache:
            logits = policy(torch.cat([prompt_ids, canvas])[None], attn)[0, p:].double()
            cache[key] = torch.log_softmax(logits, -1)
        return cache[key]

    orders = list(itertools.permutations(range(length)))
    total = 0.0
    with torch.no_grad():
        for order in orders:
            canvas = torch.full_like(completion, policy.mask_token_id)  # all masked
            for i in order:
                total += float(logp(canvas)[i, completion[i]])
                canvas[i] = completion[i]  # reveal σ(i)
    assert len(cache) == 2**length - 1  # every canvas but the fully revealed one
    return total / len(orders)


@pytest.mark.parametrize("seed", [0, 7])
def test_exact_elbo_equals_the_any_order_autoregressive_average(seed):
    # AO-ARM view of the masked-diffusion ELBO: with i masked among k remaining cells, the masked set
    # at step L−k is a uniform k-subset and σ(i) uniform in it, so step L−k contributes h(k)/k.
    policy = make_toy_policy(seed=seed + 1, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = example(length=4, seed=seed)
    prompt_mask[0, 0] = False  # a left-padding cell in the prompt, too
    est = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask)
    ao = any_order_autoregressive(policy, prompt_ids[0], prompt_mask[0], completion[0])
    assert est.sequence[0].item() == pytest.approx(ao, rel=ELBO_RTOL)  # (+ 96 float64 additions)
    # A single fixed order (left to right) is a different number: the average matters.
    left_to_right = 0.0
    with torch.no_grad():
        canvas = torch.full_like(completion[0], policy.mask_token_id)
        attn = torch.cat([prompt_mask[0], torch.ones(4, dtype=torch.bool)])[None]
        for i in range(4):
            logits = policy(torch.cat([prompt_ids[0], canvas])[None], attn)[0, 3 + i]
            left_to_right += float(torch.log_softmax(logits.double(), -1)[completion[0, i]])
            canvas[i] = completion[0, i]
    assert abs(left_to_right - ao) > 1e3 * ELBO_RTOL * abs(ao)  # (far outside the tolerance)
