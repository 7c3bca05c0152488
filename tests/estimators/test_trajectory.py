"""The trajectory estimator: the sampler's record, the plan it makes, and its terms against hand computation."""

from __future__ import annotations

import pytest
import torch

from dlmrl.estimators import ESTIMATORS, Trajectory, score, score_and_backward, trajectory_plan
from dlmrl.estimators.scoring import sampler_log_softmax
from dlmrl.estimators.trajectory import left_to_right_order
from dlmrl.models.policy import canvas_logits
from dlmrl.models.sampler import NOT_SAMPLED, generate, left_to_right_reveal_steps, num_transfer_tokens
from dlmrl.objectives.objective import GroupObjective
from tests.conftest import make_toy_policy
from tests.tolerances import TOY_TERMS, forward_tol


def logp_tol(logits: torch.Tensor, temperature: float = 1.0) -> float:
    """A float64 log-softmax at ``temperature`` of logits computed along two paths (the sampler's or a hand loop's
    batches vs the scorer's): each logit within forward_tol, the picked one and the log-sum-exp: twice that / T."""
    return 2 * forward_tol(scale=float(logits.abs().max()) / temperature, terms=TOY_TERMS)


class Recorder:
    """A policy wrapper that keeps the canvas and the logits of every sampler call."""

    def __init__(self, policy):
        self.policy, self.mask_token_id = policy, policy.mask_token_id
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, input_ids, attention_mask):
        logits = self.policy(input_ids, attention_mask)
        self.calls.append((input_ids.clone(), logits.clone()))
        return logits


def batch(policy):
    """Three left-padded prompts of different lengths; an infill canvas with two pre-placed tokens in row 1."""
    prompt_ids = torch.tensor([[6, 6, 1, 2], [6, 3, 4, 5], [1, 2, 3, 4]])
    prompt_mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    M = policy.mask_token_id
    canvas = torch.full((3, 8), M)
    canvas[1, 2], canvas[1, 5] = 3, 0
    return prompt_ids, prompt_mask, canvas


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_terms_equal_the_log_probs_the_sampler_drew_with(temperature):
    policy = make_toy_policy(dtype=torch.float64)  # (the sampler's passes vs the scorer's batches: float64)
    rec = Recorder(policy)
    prompt_ids, prompt_mask, canvas = batch(policy)
    P, M = prompt_ids.shape[1], policy.mask_token_id
    out = generate(rec, prompt_ids, prompt_mask, gen_length=8, block_length=4, steps=4, temperature=temperature,
                   canvas=canvas, generator=torch.Generator().manual_seed(3))
    y, tau = out.canvas, out.reveal_step
    # during sampling: the log-prob of each token under the logits of the step that revealed it
    expected = torch.zeros(3, 8)
    for j, (ids, logits) in enumerate(rec.calls):
        before = ids[:, P:] == M  # masked in this call's canvas
        after = (rec.calls[j + 1][0][:, P:] == M) if j + 1 < len(rec.calls) else torch.zeros_like(before)
        revealed = before & ~after
        lp = sampler_log_softmax(logits[:, P:], M, temperature).gather(-1, y[..., None])[..., 0]
        expected = torch.where(revealed, lp, expected)
    completion_mask = canvas == M
    assert ((tau >= 0) == completion_mask).all() and (tau[~completion_mask] == NOT_SAMPLED).all()
    est = Trajectory(merge=1, temperature=temperature, steps=4)
    plan = est.rollout_plan(completion_mask, reveal_step=tau)
    with torch.no_grad():
        got = score(policy, prompt_ids, prompt_mask, y, completion_mask, plan)
    tol = max(logp_tol(logits, temperature) for _, logits in rec.calls)
    torch.testing.assert_close(got.per_token, expected, rtol=0, atol=tol)
    assert plan.forward_passes() == pytest.approx(4.0)  # one canvas per step: every step revealed a token here


def test_sampler_records_the_schedule_it_follows():
    policy = make_toy_policy()
    prompt_ids, prompt_mask, canvas = batch(policy)
    out = generate(policy, prompt_ids, prompt_mask, gen_length=8, block_length=4, steps=6,
                   temperature=1.0, canvas=canvas, generator=torch.Generator().manual_seed(0))
    tau, masked = out.reveal_step, canvas == policy.mask_token_id
    for block in range(2):
        lo, hi = 4 * block, 4 * block + 4
        schedule = num_transfer_tokens(masked[:, lo:hi], 3)  # (B, 3)
        for s in range(3):
            counts = (tau[:, lo:hi] == block * 3 + s).sum(-1)
            assert counts.tolist() == schedule[:, s].tolist()
    assert (tau[~masked] == NOT_SAMPLED).all()


def test_merge_groups_distinct_steps_and_scores_from_the_canvas_before_the_group():
    mask = torch.tensor([[True, True, True, True, True, True, False]])
    tau = torch.tensor([[0, 0, 1, 3, 3, 5, -1]])  # distinct steps 0, 1, 3, 5 -> groups {0, 1}, {3, 5}
    plan = trajectory_plan(mask, tau, merge=2)
    assert plan.masks.shape == (2, 1, 7)
    assert plan.masks[0, 0].tolist() == [True] * 6 + [False]  # before step 0: everything the sampler wrote
    assert plan.scored[0, 0].tolist() == [True, True, True, False, False, False, False]
    assert plan.masks[1, 0].tolist() == [False, False, False, True, True, True, False]  # before step 3
    assert plan.scored[1, 0].tolist() == [False, False, False, True, True, True, False]
    exact = trajectory_plan(mask, tau, merge=1)
    assert exact.num_samples == 4 and exact.scored.sum().item() == 6


def test_merge_equal_to_the_steps_is_one_pass_over_the_first_canvas():
    policy = make_toy_policy(dtype=torch.float64)
    prompt_ids, prompt_mask, canvas = batch(policy)
    M = policy.mask_token_id
    out = generate(policy, prompt_ids, prompt_mask, gen_length=8, block_length=4, steps=4, temperature=1.0,
                   canvas=canvas, generator=torch.Generator().manual_seed(1))
    completion_mask = canvas == M
    plan = Trajectory(merge=4, temperature=1.0, steps=4).rollout_plan(completion_mask, reveal_step=out.reveal_step)
    assert plan.num_samples == 1 and plan.forward_passes() == 1.0
    with torch.no_grad():
        got = score(policy, prompt_ids, prompt_mask, out.canvas, completion_mask, plan).per_token
        logits = canvas_logits(policy, prompt_ids, prompt_mask, canvas)  # the first canvas: all masks
    lp = sampler_log_softmax(logits, M, 1.0).gather(-1, out.canvas[..., None])[..., 0]
    torch.testing.assert_close(got, torch.where(completion_mask, lp, 0.0), rtol=0, atol=logp_tol(logits))


def test_left_to_right_is_the_chain_rule_on_a_four_token_toy():
    policy = make_toy_policy(dtype=torch.float64)
    M = policy.mask_token_id
    prompt_ids, prompt_mask = torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.bool)
    y = torch.tensor([[3, 0, 5, 2]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    expected, tol = [], 0.0
    with torch.no_grad():
        for t in range(4):  # canvas: y_<t visible, y_t and later masked
            canvas = torch.cat([y[:, :t], torch.full((1, 4 - t), M)], dim=1)
            logits = canvas_logits(policy, prompt_ids, prompt_mask, canvas)
            expected.append(sampler_log_softmax(logits, M, 1.0)[0, t, y[0, t]].item())
            tol = max(tol, logp_tol(logits))
        est = ESTIMATORS.get("trajectory")(order="left_to_right")
        got = score(policy, prompt_ids, prompt_mask, y, mask, est.make_plan(mask)).per_token
    torch.testing.assert_close(got[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=tol)
    assert est.nfe is None and est.nfe_for(4) == 4 and Trajectory(order="left_to_right", merge=3).nfe_for(4) == 2


def test_left_to_right_order_and_the_anchor_schedule():
    mask = torch.tensor([[False, True, True, False, True, True, True, True]])
    assert left_to_right_order(mask).tolist() == [[-1, 0, 1, -1, 2, 3, 4, 5]]
    # two blocks of 4, 2 steps each: block 0 has 2 masks (1, 1 per step), block 1 has 4 (2, 2)
    assert left_to_right_reveal_steps(mask, 4, 4).tolist() == [[-1, 0, 1, -1, 2, 2, 3, 3]]
    # one block, 4 steps: 6 masks split 2, 2, 1, 1
    assert left_to_right_reveal_steps(mask, 8, 4).tolist() == [[-1, 0, 0, -1, 1, 1, 2, 3]]


def test_left_to_right_remasking_samples_that_order():
    policy = make_toy_policy()
    prompt_ids, prompt_mask, canvas = batch(policy)
    out = generate(policy, prompt_ids, prompt_mask, gen_length=8, block_length=8, steps=8, temperature=1.0,
                   canvas=canvas, remasking="left_to_right", generator=torch.Generator().manual_seed(0))
    masked = canvas == policy.mask_token_id
    torch.testing.assert_close(out.reveal_step, left_to_right_reveal_steps(masked, 8, 8))
    assert out.nfe == 8  # (row 2 has 8 masks: one per step)


def test_identical_weights_give_ratio_exactly_one():
    policy = make_toy_policy()
    prompt_ids, prompt_mask, canvas = batch(policy)
    out = generate(policy, prompt_ids, prompt_mask, gen_length=8, block_length=4, steps=4, temperature=1.0,
                   canvas=canvas, generator=torch.Generator().manual_seed(2))
    mask = canvas == policy.mask_token_id
    plan = Trajectory(steps=4).rollout_plan(mask, reveal_step=out.reveal_step)
    with torch.no_grad():
        old = score(policy, prompt_ids, prompt_mask, out.canvas, mask, plan).per_token
    new = score(policy, prompt_ids, prompt_mask, out.canvas, mask, plan).per_token
    for level in ("token", "sequence"):
        o = GroupObjective(level).compute(new, old, torch.tensor([1.0, -1.0, 0.5]), mask)
        assert (o.ratio[mask] == 1.0).all()


def test_chunked_backward_matches_the_direct_gradient():
    policy = make_toy_policy(dtype=torch.float64)  # (chunks sum the gradient in another order: float64)
    prompt_ids, prompt_mask, canvas = batch(policy)
    out = generate(policy, prompt_ids, prompt_mask, gen_length=8, block_length=4, steps=4, temperature=0.8,
                   canvas=canvas, generator=torch.Generator().manual_seed(4))
    mask = canvas == policy.mask_token_id
    plan = Trajectory(temperature=0.8, steps=4).rollout_plan(mask, reveal_step=out.reveal_step)
    adv = torch.tensor([1.0, -0.5, 0.25])

    def loss_fn(per_token):
        return GroupObjective("sequence").compute(per_token, per_token.detach() - 0.01, adv, mask).loss, {}

    grads = []
    for micro_batch in (None, 2):
        policy.model.zero_grad()
        score_and_backward(policy, prompt_ids, prompt_mask, out.canvas, mask, plan, loss_fn, micro_batch)
        grads.append([p.grad.clone() for p in policy.model.parameters()])
    tol = forward_tol(scale=max(float(g.abs().max()) for g in grads[0]), terms=TOY_TERMS)  # (at the gradients' size)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_errors_name_the_missing_record():
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs the rollout's reveal steps"):
        Trajectory().make_plan(mask)
    with pytest.raises(ValueError, match="position 2 of row 0 has no reveal step"):
        trajectory_plan(mask, torch.tensor([[0, 1, -1]]))
    with pytest.raises(ValueError, match="merge"):
        Trajectory(merge=0)
    with pytest.raises(ValueError, match="order"):
        Trajectory(order="right_to_left")
