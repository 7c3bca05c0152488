"""One-step unmasking (d1 / diffu-GRPO): hand-built canvases, prompt masks, common random numbers."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dlmrl.estimators import ESTIMATORS, OneStep, score
from tests.conftest import make_toy_policy
from tests.tolerances import TOY_ELBO_RTOL, WEIGHT_RTOL


def batch_example():
    """Three rows: left-padded prompt + infill blanks; full canvas; a row with nothing to score."""
    prompt_ids = torch.tensor([[6, 6, 2, 5, 1], [1, 4, 3, 0, 2], [6, 3, 0, 1, 4]])  # (B, P)
    prompt_mask = torch.tensor(
        [[False, False, True, True, True], [True] * 5, [False, True, True, True, True]]
    )
    completion = torch.tensor([[3, 0, 1, 5, 2, 4], [4, 4, 0, 6, 1, 2], [1, 2, 3, 4, 5, 0]])  # (B, L)
    completion_mask = torch.tensor([[True, False, True, True, False, True], [True] * 6, [False] * 6])
    return prompt_ids, prompt_mask, completion, completion_mask


def hand_one_step(policy, prompt_ids, prompt_mask, completion, completion_mask, prompt_masked=None):
    """Token log-probs of every allowed completion token with all of them masked, one row at a time.

    ``prompt_masked (B, P)`` bool marks prompt positions replaced by the mask token. Written directly
    with the policy: ``[prompt | canvas]`` built by hand, no ``dlmrl.estimators`` code.
    Returns ``(B, L)`` float64, zero outside ``completion_mask``.
    """
    mask_id = policy.mask_token_id
    out = torch.zeros(completion.shape, dtype=torch.float64)
    with torch.no_grad():
        for b in range(completion.shape[0]):
            p_ids = prompt_ids[b].clone()
            if prompt_masked is not None:
                p_ids[prompt_masked[b]] = mask_id
            canvas = completion[b].clone()
            canvas[completion_mask[b]] = mask_id
            ids = torch.cat([p_ids, canvas])[None]
            attn = torch.cat([prompt_mask[b], torch.ones(canvas.shape[0], dtype=torch.bool)])[None]
            logp = torch.log_softmax(policy(ids, attn)[0, prompt_ids.shape[1] :].double(), -1)  # (L, V)
            for i in range(canvas.shape[0]):
                if completion_mask[b, i]:
                    out[b, i] = logp[i, completion[b, i]]
    return out


def test_without_prompt_masking_the_estimate_is_the_mean_field_token_logprob():
    policy = make_toy_policy(seed=1, dtype=torch.float64)  # (the batch vs one row at a time: float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    est_fn = OneStep(p_mask_prompt=0.0)
    plan = est_fn.make_plan(completion_mask, 0, prompt_mask)
    assert plan.prompt_masks is None
    assert plan.nfe == est_fn.nfe == 1
    assert torch.equal(plan.masks[0], completion_mask)
    torch.testing.assert_close(plan.weights, torch.tensor([[1.0, 1.0, 0.0]]))
    assert plan.t.tolist() == [1.0]
    with torch.no_grad():
        est = est_fn.estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, generator=0)
    expected = hand_one_step(policy, prompt_ids, prompt_mask, completion, completion_mask)
    torch.testing.assert_close(est.per_token, expected, rtol=TOY_ELBO_RTOL, atol=0)  # (weights 1: exact)
    torch.testing.assert_close(est.sequence, expected.sum(-1), rtol=TOY_ELBO_RTOL, atol=0)
    assert est.nfe == 1
    assert (est.per_token[~completion_mask] == 0).all()
    assert est.sequence[2].item() == 0.0
    assert (est.sequence[:2] < 0).all()
    # Deterministic: the seed plays no role when the prompt is never masked.
    with torch.no_grad():
        again = est_fn.estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, generator=99)
    assert torch.equal(again.per_token, est.per_token)


def test_prompt_masks_cover_only_real_prompt_tokens_at_rate_p():
    _, prompt_mask, _, completion_mask = batch_example()
    p, k = 0.3, 4000
    plan = OneStep(p_mask_prompt=p, num_samples=k).make_plan(completion_mask, 5, prompt_mask)
    pm = plan.prompt_masks
    assert pm is not None and pm.shape == (k, 3, 5) and pm.dtype == torch.bool
    assert not (pm & ~prompt_mask[None]).any()  # never a left-padding position
    real = prompt_mask[None].expand(k, -1, -1)
    draws = int(real.sum())
    rate = pm[real].double().mean().item()
    se = math.sqrt(p * (1 - p) / draws)
    assert abs(rate - p) < 4 * se, (rate, p, se)  # (P(|z| > 4) = 6e-5 for a seed change)
    # Each real position separately is masked at rate p too (k draws each).
    per_pos = pm.double().mean(0)[prompt_mask]
    assert (per_pos - p).abs().max().item() < 4.5 * math.sqrt(p * (1 - p) / k)  # (P(|z| > 4.5) = 7e-6 each)
    # The completion part is the same in every sample: every allowed position masked.
    assert torch.equal(plan.masks, completion_mask[None].expand(k, -1, -1))
    torch.testing.assert_close(plan.weights, torch.tensor([1.0, 1.0, 0.0]).expand(k, -1) / k)


def test_with_prompt_masking_the_estimate_masks_exactly_the_plans_prompt_positions():
    policy = make_toy_policy(seed=2, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    est_fn = OneStep(p_mask_prompt=0.5, num_samples=3)
    plan = est_fn.make_plan(completion_mask, torch.Generator().manual_seed(3), prompt_mask)
    pm = plan.prompt_masks
    assert pm.any() and not torch.equal(pm[0], pm[1])  # seed 3 gives distinct, non-empty prompt masks
    with torch.no_grad():
        est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
        via_estimate = est_fn.estimate(
            policy, prompt_ids, prompt_mask, completion, completion_mask, torch.Generator().manual_seed(3)
        )
    singles = [
        hand_one_step(policy, prompt_ids, prompt_mask, completion, completion_mask, pm[s]) for s in range(3)
    ]
    expected = sum(singles) / 3  # K > 1 averages the K one-pass values
    tol = TOY_ELBO_RTOL + WEIGHT_RTOL  # (the plan's weights 1/3 are float32)
    torch.testing.assert_close(est.per_token, expected, rtol=tol, atol=0)
    torch.testing.assert_close(via_estimate.per_token, est.per_token)
    assert est.nfe == 3
    # Masking the prompt changes the value (it is not the p = 0 value).
    unmasked = hand_one_step(policy, prompt_ids, prompt_mask, completion, completion_mask)
    assert ((expected[:2] - unmasked[:2]).abs() > 1e3 * tol * unmasked[:2].abs()).any()


def test_same_plan_gives_ratio_exactly_one_and_seeds_change_the_prompt_masks():
    policy = make_toy_policy(seed=3)
    twin = copy.deepcopy(policy)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    est_fn = OneStep(p_mask_prompt=0.4, num_samples=2)
    plan = est_fn.make_plan(completion_mask, 11, prompt_mask)
    with torch.no_grad():
        old = score(twin, prompt_ids, prompt_mask, completion, completion_mask, plan)
    new = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
    assert torch.equal(new.per_token.detach(), old.per_token)
    ratio = torch.exp(new.per_token.detach() - old.per_token)
    assert torch.equal(ratio, torch.ones_like(ratio))
    same = est_fn.make_plan(completion_mask, 11, prompt_mask)
    other = est_fn.make_plan(completion_mask, 12, prompt_mask)
    assert torch.equal(same.prompt_masks, plan.prompt_masks)
    assert not torch.equal(other.prompt_masks, plan.prompt_masks)
    new.per_token.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters())


def test_prompt_masking_needs_the_prompt_mask():
    completion_mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="prompt_mask"):
        OneStep(p_mask_prompt=0.15).make_plan(completion_mask, 0)
    with pytest.raises(ValueError, match="prompt_mask"):
        OneStep().make_plan(completion_mask, 0, None)  # the default p_mask_prompt is 0.15 (d1)
    assert OneStep(p_mask_prompt=0.0).make_plan(completion_mask, 0).prompt_masks is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"p_mask_prompt": 1.0}, "p_mask_prompt"),
        ({"p_mask_prompt": -0.1}, "p_mask_prompt"),
        ({"p_mask_prompt": float("nan")}, "p_mask_prompt"),
        ({"p_mask_prompt": True}, "p_mask_prompt"),
        ({"p_mask_prompt": "0.1"}, "p_mask_prompt"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": 1.5}, "num_samples"),
        ({"num_samples": True}, "num_samples"),
    ],
)
def test_bad_arguments_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        OneStep(**kwargs)


def test_registered_defaults_and_nfe():
    assert ESTIMATORS.get("one_step") is OneStep
    assert OneStep().p_mask_prompt == 0.15 and OneStep().num_samples == 1
    assert OneStep(num_samples=4).nfe == 4 and OneStep(num_samples=4).nfe_for(100) == 4
    with pytest.raises(TypeError, match="seed"):
        OneStep().make_plan(torch.ones(1, 2, dtype=torch.bool), 1.5, torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_make_plan_with_cuda_masks():
    _, prompt_mask, _, completion_mask = batch_example()
    plan = OneStep(p_mask_prompt=0.5, num_samples=2).make_plan(completion_mask.cuda(), 0, prompt_mask.cuda())
    assert plan.masks.device.type == "cuda" and plan.prompt_masks.device.type == "cuda"
    assert not (plan.prompt_masks.cpu() & ~prompt_mask[None]).any()
