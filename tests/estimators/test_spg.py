"""SPG's block-wise masks and its upper bound, against hand computation on the toy denoiser."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.estimators import ESTIMATORS, MaskPlan, SPGEstimator, UpperBound, score, score_and_backward
from dlmrl.estimators.spg import block_masks
from dlmrl.models.policy import canvas_logits
from tests.conftest import make_toy_policy
from tests.tolerances import TOY_TERMS, WEIGHT_OPS_RTOL, WEIGHT_RTOL, forward_tol


def test_block_masks_mask_a_uniform_part_of_one_block_and_every_later_block():
    completion_mask = torch.ones(64, 12, dtype=torch.bool)
    completion_mask[:, 0] = False  # a given position never masked
    masks = block_masks(completion_mask, 2, 4, torch.Generator().manual_seed(0))  # (2, 64, 12), 3 blocks
    assert not (masks & ~completion_mask).any()
    blocks = masks.reshape(2, 64, 3, 4)
    valid = completion_mask.reshape(64, 3, 4)
    for s in range(2):
        for b in range(64):
            hit = blocks[s, b].any(-1).tolist()
            c = hit.index(True)  # the chosen block: the first with a masked position
            n = int(blocks[s, b, c].sum())
            assert 1 <= n <= int(valid[b, c].sum())
            assert all((blocks[s, b, k] == valid[b, k]).all() for k in range(c + 1, 3))  # later: all masked
    # the two samples of a row take distinct blocks (3 blocks >= m = 2)
    first = [blocks[:, b].any(-1).int().argmax(-1).tolist() for b in range(64)]
    assert all(x != y for x, y in first)
    # the number masked in the chosen block is uniform on 1..n_valid: block 1 (4 valid) of many draws
    big = block_masks(torch.ones(4000, 4, dtype=torch.bool), 1, 4, torch.Generator().manual_seed(1))[0].sum(-1)
    counts = torch.bincount(big, minlength=5)[1:].double() / 4000
    # 4.5 binomial standard errors sqrt(p(1-p)/n) = 0.0068 each: P(|z| > 4.5) = 7e-6 per count, for a seed change
    assert ((counts - 0.25).abs() < 4.5 * math.sqrt(0.25 * 0.75 / 4000)).all(), counts


def test_elbo_weights_are_length_over_m_times_the_masked_count():
    est = SPGEstimator(num_samples=2, block_length=4, p_mask_prompt=0.0)
    cm = torch.ones(5, 8, dtype=torch.bool)
    plan = est.make_plan(cm, 0)
    k = plan.masks.sum(-1).double()
    torch.testing.assert_close(plan.weights.double(), 8 / (2 * k), rtol=WEIGHT_OPS_RTOL, atol=0)
    assert plan.upper is None and plan.prompt_masks is None


def hand_bounds(policy, prompt_ids, prompt_mask, completion, plan: MaskPlan, beta: float, mix: float):
    """Per-token ELBO and upper-bound terms of each row from the per-sample log-probs, in plain Python; and the
    largest ``|log p|`` they use."""
    M = policy.mask_token_id
    S, B, L = plan.masks.shape
    logp = torch.zeros(S, B, L, dtype=torch.float64)
    for s in range(S):
        canvas = torch.where(plan.masks[s], torch.full_like(completion, M), completion)
        p_ids = torch.where(plan.prompt_masks[s], torch.full_like(prompt_ids, M), prompt_ids)
        with torch.no_grad():
            lp = torch.log_softmax(canvas_logits(policy, p_ids, prompt_mask, canvas), -1)
        logp[s] = lp.gather(-1, completion[..., None])[..., 0].double()
    out = torch.zeros(B, L, dtype=torch.float64)
    for b in range(B):
        n = L  # every position is a completion position here
        covered = [i for i in range(L) if plan.masks[:, b, i].any()]
        for i in range(L):
            elbo = sum(float(plan.weights[s, b]) * logp[s, b, i].item() for s in range(S) if plan.masks[s, b, i])
            if not plan.upper.rows[b]:
                out[b, i] = elbo
                continue
            a = sum(float(plan.weights[s, b]) * math.exp(beta * logp[s, b, i].item())
                    for s in range(S) if plan.masks[s, b, i])
            eubo = (n / len(covered)) * math.log(a) / beta if i in covered else 0.0
            out[b, i] = mix * eubo + (1 - mix) * elbo
    return out, float(logp.abs().max())


@pytest.mark.parametrize("mix", [1.0, 0.5])
def test_upper_bound_terms_by_hand_and_its_gradient_in_chunks(mix):
    # float64: the hand loop scores one sample at a time, the estimator all at once
    policy = make_toy_policy(dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    prompt_ids = torch.randint(0, 6, (4, 3), generator=g)
    prompt_mask = torch.ones(4, 3, dtype=torch.bool)
    completion = torch.randint(0, 6, (4, 8), generator=g)
    cm = torch.ones(4, 8, dtype=torch.bool)
    est = ESTIMATORS.get("spg")(num_samples=3, block_length=4, p_mask_prompt=0.3, beta=1.5, mix=mix)
    adv = torch.tensor([0.5, -0.25, -1.0, 0.0])
    plan = est.rollout_plan(cm, 11, prompt_mask, advantages=adv)
    assert plan.upper.rows.tolist() == [False, True, True, False]
    with torch.no_grad():
        got = score(policy, prompt_ids, prompt_mask, completion, cm, plan).per_token
    expected, logp_max = hand_bounds(policy, prompt_ids, prompt_mask, completion, plan, 1.5, mix)
    # both use the plan's float32 weights; log-probs off by δ ≤ forward_tol move an ELBO term (Σ_s w ≤ 8 / 2 over a
    # row's samples) by ≤ 4δ and an upper-bound term, n/|covered| ≤ 8 times a log-mean-exp of them, by ≤ 8δ; the
    # estimator holds n/|covered| in float32 (half an ulp relative: WEIGHT_RTOL)
    tol = 8 * forward_tol(scale=logp_max, terms=TOY_TERMS)
    torch.testing.assert_close(got, expected, rtol=WEIGHT_RTOL, atol=tol)

    def loss_fn(per_token):
        return (per_token.sum(-1) * torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=per_token.dtype)).sum() ** 2 / 100, {}

    grads = []  # (float64: the chunked gradient must equal the direct one to rounding, not float32 noise)
    for micro_batch in (None, 1, 5):
        policy.model.zero_grad()
        score_and_backward(policy, prompt_ids, prompt_mask, completion, cm, plan, loss_fn, micro_batch)
        grads.append([p.grad.clone() for p in policy.model.parameters()])
    # the loss is a square of a sum of ≤ 32 terms (its gradient scale: the largest entry), each chunk's gradient
    # summed in another order: forward_tol at the gradients' scale
    tol = forward_tol(scale=max(float(g.abs().max()) for g in grads[0]), terms=TOY_TERMS + 32)
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_mix_zero_is_the_elbo():
    policy = make_toy_policy()
    g = torch.Generator().manual_seed(2)
    prompt_ids, prompt_mask = torch.randint(0, 6, (6, 3), generator=g), torch.ones(6, 3, dtype=torch.bool)
    completion, cm = torch.randint(0, 6, (6, 8), generator=g), torch.ones(6, 8, dtype=torch.bool)
    base = SPGEstimator(num_samples=2, block_length=8, p_mask_prompt=0.0).make_plan(cm, 3)
    every = torch.ones(6, dtype=torch.bool)
    with torch.no_grad():
        elbo = score(policy, prompt_ids, prompt_mask, completion, cm, base).sequence
        zero = score(policy, prompt_ids, prompt_mask, completion, cm,
                     MaskPlan(base.masks, base.weights, base.t, upper=UpperBound(every, 1.5, 0.0))).sequence
    torch.testing.assert_close(zero, elbo)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="beta"):
        SPGEstimator(beta=0.5)
    with pytest.raises(ValueError, match="mix"):
        SPGEstimator(mix=1.5)
    with pytest.raises(ValueError, match="block_length"):
        block_masks(torch.ones(1, 6, dtype=torch.bool), 1, 4)
    with pytest.raises(ValueError, match="prompt_mask"):
        SPGEstimator().make_plan(torch.ones(1, 32, dtype=torch.bool), 0)
