"""One-pass block likelihoods: the composite pass against the per-block loop (logits, block ELBO, trajectory at any
merge), the trajectory's exactness against the sampler's log-probs, and the number of passes each costs."""

from __future__ import annotations

import functools

import pytest
import torch

from dlmrl.estimators import DoubleMC, Exact, MaskPlan, Trajectory, score
from dlmrl.estimators.block_composite import composite_logits
from dlmrl.estimators.block_plans import (
    block_rollout_plan,
    block_step_ranks,
    block_trajectory_plan,
    per_block_plan,
)
from dlmrl.estimators.scoring import sampler_log_softmax
from dlmrl.models.block_attention import (
    BlockCausalPolicy,
    block_bounds,
    block_causal_mask,
    block_logits,
    block_position_ids,
    hf_block_forward,
)
from dlmrl.models.block_policy import block_policy_from
from dlmrl.models.block_sampler import block_generate
from tests.models.block_helpers import ATOL, padded_prompts, random_tokens, tiny_block_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_block_policy(seed=2)


@pytest.fixture(scope="module")
def prompts(policy):
    return padded_prompts(policy, [2, 6, 4], seed=3)


class Counting:
    """:func:`~dlmrl.models.block_attention.hf_block_forward` as a block policy's forward, counting the sequences it
    runs, per row (``calls``: sequence passes over the batch's 3 rows, so a pass of the whole batch counts 1)."""

    def __init__(self, rows: int = 3):
        self.sequences, self.rows = 0, rows

    @property
    def calls(self) -> float:
        return self.sequences / self.rows

    def __call__(self, model, ids, mask, pos, past=None, use_cache=False):
        self.sequences += ids.shape[0]
        return hf_block_forward(model, ids, mask, pos, past, use_cache)


def on_blocks(policy, block_size, forward=hf_block_forward):
    """The block-diffusion policy over ``policy``'s weights."""
    return block_policy_from(policy, block_size, forward)


def naive_block_logits(model_fn, prompt_ids, prompt_mask, canvas_b, clean, lo, hi, block_size):
    """Block ``[lo, hi)``'s logits from a block-causal pass over ``[prompt | clean y^{<b} | canvas of block b]``."""
    seq = torch.cat([clean[:, :lo], canvas_b], dim=1)  # (B, hi)
    ids = torch.cat([prompt_ids, seq], dim=1)
    logits = model_fn(ids, block_causal_mask(prompt_mask, hi, block_size), block_position_ids(prompt_mask, hi))
    return logits[:, prompt_ids.shape[1] + lo :]


@pytest.mark.parametrize(("length", "block_size"), [(8, 1), (8, 2), (9, 4), (8, 8)])
def test_the_composite_pass_equals_the_per_block_loop(policy, prompts, length, block_size):
    clean = random_tokens(policy, (3, length), seed=4)
    noise = torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5
    noisy = clean.masked_fill(noise, policy.mask_token_id)
    fn = functools.partial(block_logits, policy.model)
    out = composite_logits(fn, *prompts, noisy, clean, block_size)  # (B, L, V)
    for lo, hi in block_bounds(length, block_size):
        ref = naive_block_logits(fn, *prompts, noisy[:, lo:hi], clean, lo, hi, block_size)
        torch.testing.assert_close(out[:, lo:hi], ref, atol=ATOL, rtol=0)
    # (and the clean half matters: the noisy half of a later block reads it)
    other = composite_logits(fn, *prompts, noisy, random_tokens(policy, (3, length), seed=6), block_size)
    if length > block_size:
        assert (other[:, block_size:] - out[:, block_size:]).abs().max() > 1e-3
    torch.testing.assert_close(other[:, :block_size], out[:, :block_size], atol=ATOL, rtol=0)


def naive_score(model_fn, prompt_ids, prompt_mask, completion, plan: MaskPlan, block_size, mask_id):
    """The plan scored one block at a time: a pass per (canvas, block) over the block's prefix."""
    per_token = torch.zeros(completion.shape)
    for s in range(plan.nfe):
        for lo, hi in block_bounds(completion.shape[1], block_size):
            canvas_b = completion[:, lo:hi].masked_fill(plan.masks[s, :, lo:hi], mask_id)
            p_ids = prompt_ids if plan.prompt_masks is None else prompt_ids.masked_fill(plan.prompt_masks[s], mask_id)
            logits = naive_block_logits(model_fn, p_ids, prompt_mask, canvas_b, completion, lo, hi, block_size)
            logp_all = (torch.log_softmax(logits, -1) if plan.temperature is None
                        else sampler_log_softmax(logits, mask_id, plan.temperature))
            logp = logp_all.gather(-1, completion[:, lo:hi, None]).squeeze(-1)
            w = plan.position_weights()[s, :, lo:hi]
            per_token[:, lo:hi] += torch.where(plan.scored_masks()[s, :, lo:hi], logp * w, 0.0)
    return per_token


@pytest.mark.parametrize(("length", "block_size"), [(8, 2), (10, 4)])
def test_the_block_elbo_in_one_pass_per_sample_equals_the_per_block_loop(policy, prompts, length, block_size):
    completion = random_tokens(policy, (3, length), seed=7)
    mask = torch.ones(3, length, dtype=torch.bool)
    mask[1, -1] = False  # (a position that is never scored)
    plan = per_block_plan(DoubleMC(num_samples=3, masking="bernoulli").make_plan, mask, block_size, 11)
    assert plan.nfe == 3 and not (plan.masks & ~mask).any()
    # blocks are drawn independently: their weights (1/t_b over the 3 samples) differ along a canvas
    assert len(set(plan.weights[0, 0].tolist())) > 1
    fast, slow = Counting(), Counting()
    est = score(on_blocks(policy, block_size, fast), *prompts, completion, mask, plan)
    ref = naive_score(on_blocks(policy, block_size, slow).model_fn, *prompts, completion, plan, block_size,
                      policy.mask_token_id)
    torch.testing.assert_close(est.per_token, ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(est.sequence, ref.sum(-1), atol=4 * ATOL, rtol=0)
    blocks = len(block_bounds(length, block_size))
    # one composite pass per canvas that scores something (a Bernoulli draw may mask nothing), vs one per block
    assert fast.calls == plan.forward_passes() <= est.nfe == 3 and slow.calls == 3 * blocks
    assert (est.per_token[1, -1] == 0) and (est.per_token != 0).any()


def test_one_block_is_the_existing_estimator_on_the_block_causal_policy(policy, prompts):
    # with block_size = L the per-block plan is the estimator's own plan and the composite pass its canvas pass
    completion = random_tokens(policy, (3, 6), seed=8)
    mask = torch.ones(3, 6, dtype=torch.bool)
    est_cls = Exact()
    plan = per_block_plan(est_cls.make_plan, mask, 6, 0)
    ours = score(on_blocks(policy, 6), *prompts, completion, mask, plan)
    ref = score(BlockCausalPolicy(policy, 6, 6), *prompts, completion, mask, est_cls.make_plan(mask, 0))
    torch.testing.assert_close(ours.per_token, ref.per_token, atol=ATOL, rtol=0)


def rollout(policy, prompts, length, block_size, temperature, threshold, seed=0):
    return block_generate(policy, *prompts, gen_length=length, block_size=block_size, steps_per_block=3,
                          temperature=temperature, threshold=threshold, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("temperature", "threshold"), [(0.0, None), (1.0, None), (1.0, 0.3), (0.0, 0.3)])
@pytest.mark.parametrize(("length", "block_size"), [(8, 4), (10, 4), (6, 1)])
def test_the_trajectory_at_merge_1_is_the_samplers_log_probs(policy, prompts, temperature, threshold, length,
                                                             block_size):
    out = rollout(policy, prompts, length, block_size, temperature, threshold)
    mask = torch.ones(3, length, dtype=torch.bool)
    t = temperature if temperature > 0 else 1.0  # (a greedy rollout is recorded and scored at T = 1)
    plan = block_trajectory_plan(mask, out.reveal_step, block_size, 1, temperature=t)
    fn = Counting()
    est = score(on_blocks(policy, block_size, fn), *prompts, out.canvas, mask, plan)
    torch.testing.assert_close(est.per_token, out.token_logprobs, atol=ATOL, rtol=0)
    ranks = block_step_ranks(mask, out.reveal_step, block_size)
    steps_per_block = max(min(3, hi - lo) for lo, hi in block_bounds(length, block_size))
    # passes per row: the canvases that score something (with a threshold, rows take different step counts)
    assert fn.calls == plan.forward_passes() <= plan.nfe == int(ranks.max()) + 1
    assert plan.nfe <= (block_size if threshold else steps_per_block)
    # the same log-probs from the existing trajectory estimator on the block-causal policy, one pass per step
    tr = Trajectory(merge=1, temperature=t)
    ref = score(BlockCausalPolicy(policy, length, block_size), *prompts, out.canvas, mask,
                tr.make_plan(mask, reveal_step=out.reveal_step))
    torch.testing.assert_close(ref.per_token, est.per_token, atol=ATOL, rtol=0)
    assert ref.nfe > est.nfe or length <= block_size


def test_threshold_blocks_with_different_step_counts_are_padded(policy, prompts):
    out = rollout(policy, prompts, 8, 4, 1.0, 0.3)
    mask = torch.ones(3, 8, dtype=torch.bool)
    ranks = block_step_ranks(mask, out.reveal_step, 4)
    counts = {int(ranks[r, lo:hi].max()) + 1 for r in range(3) for lo, hi in block_bounds(8, 4)}
    assert len(counts) > 1  # (blocks took different numbers of steps)
    plan = block_trajectory_plan(mask, out.reveal_step, 4, 1, temperature=1.0)
    for s in range(plan.nfe):  # a block past its own steps is clean in the later canvases and scores nothing
        done = ranks.view(3, 2, 4).amax(-1) < s  # (B, n_blocks)
        assert not plan.masks[s].view(3, 2, 4)[done].any()


@pytest.mark.parametrize("merge", [2, 3])
def test_a_merged_trajectory_equals_its_per_block_loop(policy, prompts, merge):
    out = rollout(policy, prompts, 10, 4, 1.0, None)
    mask = torch.ones(3, 10, dtype=torch.bool)
    plan = block_trajectory_plan(mask, out.reveal_step, 4, merge, temperature=1.0)
    assert plan.nfe == -(-3 // merge)  # ⌈S / m⌉ with S = 3 steps per block
    fn = functools.partial(block_logits, policy.model)
    est = score(on_blocks(policy, 4), *prompts, out.canvas, mask, plan)
    ranks = block_step_ranks(mask, out.reveal_step, 4)
    ref = torch.zeros(3, 10)
    for lo, hi in block_bounds(10, 4):  # per block, per segment: the canvas before the segment's first step
        seg = ranks[:, lo:hi] // merge
        for j in range(int(seg.max()) + 1):
            canvas_b = out.canvas[:, lo:hi].masked_fill(seg >= j, policy.mask_token_id)
            logits = naive_block_logits(fn, *prompts, canvas_b, out.canvas, lo, hi, 4)
            lp = sampler_log_softmax(logits, policy.mask_token_id, 1.0).gather(-1, out.canvas[:, lo:hi, None])[..., 0]
            ref[:, lo:hi] += torch.where(seg == j, lp, 0.0)
    torch.testing.assert_close(est.per_token, ref, atol=ATOL, rtol=0)
    assert (est.per_token - out.token_logprobs).abs().max() > 1e-3  # (merging scores from earlier canvases)


def test_step_ranks_are_per_block_and_ignore_the_numbering():
    mask = torch.ones(1, 6, dtype=torch.bool)
    steps = torch.tensor([[5, 2, 2, 40, 7, 7]])  # blocks of 3: {5, 2, 2} and {40, 7, 7}
    assert block_step_ranks(mask, steps, 3).tolist() == [[1, 0, 0, 1, 0, 0]]
    plan = block_trajectory_plan(mask, steps, 3)
    assert plan.masks.int().tolist() == [[[1, 1, 1, 1, 1, 1]], [[1, 0, 0, 1, 0, 0]]]
    assert plan.scored.int().tolist() == [[[0, 1, 1, 0, 1, 1]], [[1, 0, 0, 1, 0, 0]]]


def test_gradients_reach_the_model(policy, prompts):
    completion = random_tokens(policy, (3, 6), seed=9)
    mask = torch.ones(3, 6, dtype=torch.bool)
    plan = per_block_plan(DoubleMC(num_samples=1).make_plan, mask, 3, 1)
    policy.model.zero_grad()
    est = score(on_blocks(policy, 3), *prompts, completion, mask, plan)
    est.sequence.sum().backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    policy.model.zero_grad()


def test_bad_plans_and_completions_are_refused(policy, prompts):
    mask = torch.ones(3, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\(S, B, L\)"):
        MaskPlan(masks=torch.zeros(1, 3, 4, dtype=torch.bool), weights=torch.ones(1, 3, 5), t=torch.zeros(1))
    with pytest.raises(ValueError, match="merge"):
        block_trajectory_plan(mask, torch.zeros(3, 4, dtype=torch.long), 2, 0)
    with pytest.raises(ValueError, match="no reveal step"):
        block_trajectory_plan(mask, torch.full((3, 4), -1), 2)
    plan = block_trajectory_plan(mask, torch.zeros(3, 4, dtype=torch.long), 2)
    undecoded = torch.full((3, 4), policy.mask_token_id)
    with pytest.raises(ValueError, match="mask token"):
        score(on_blocks(policy, 2), *prompts, undecoded, mask, plan)


def test_per_block_plans_must_agree_in_size():
    mask = torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match="number of samples"):  # (exact enumeration: 2^4 - 1 vs 2^2 - 1 canvases)
        per_block_plan(Exact().make_plan, mask, 4)


def test_d1s_prompt_masks_are_shared_by_the_blocks(policy, prompts):
    # one_step masks every block fully and the prompt with p = 0.5: the first block's prompt draw serves all blocks
    from dlmrl.estimators import OneStep

    completion = random_tokens(policy, (3, 8), seed=12)
    mask = torch.ones(3, 8, dtype=torch.bool)
    plan = block_rollout_plan(OneStep(p_mask_prompt=0.5), mask, 4, 13, prompts[1])
    assert plan.prompt_masks is not None and plan.prompt_masks.any() and plan.masks.all()
    est = score(on_blocks(policy, 4), *prompts, completion, mask, plan)
    ref = naive_score(on_blocks(policy, 4).model_fn, *prompts, completion, plan, 4, policy.mask_token_id)
    torch.testing.assert_close(est.per_token, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["spg", "one_step", "sdmc", "coupled", "double_mc"])
def test_with_one_block_every_estimator_is_its_own_plan_on_the_block_causal_policy(policy, prompts, name):
    # block_size = L: the block plan is the estimator's plan from the same generator, and the composite pass is the
    # block-causal pass of the canvas; SPG's upper-bound rows (negative advantages) and d1's prompt masks included
    from dlmrl.estimators import ESTIMATORS

    est_obj = ESTIMATORS.get(name)(**({"block_length": 6} if name == "spg" else {}))
    completion = random_tokens(policy, (3, 6), seed=14)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 0] = False
    adv = torch.tensor([1.0, -1.0, -0.5])
    ours_plan = block_rollout_plan(est_obj, mask, 6, 15, prompts[1], advantages=adv)
    ref_plan = est_obj.rollout_plan(mask, 15, prompts[1], advantages=adv)
    assert (ours_plan.upper is None) == (ref_plan.upper is None) == (name != "spg")
    ours = score(on_blocks(policy, 6), *prompts, completion, mask, ours_plan)
    ref = score(BlockCausalPolicy(policy, 6, 6), *prompts, completion, mask, ref_plan)
    torch.testing.assert_close(ours.per_token, ref.per_token, atol=ATOL, rtol=0)


def test_micro_batched_backward_gives_the_full_batch_gradient(policy, prompts):
    from dlmrl.estimators.scoring import score_and_backward

    completion = random_tokens(policy, (3, 8), seed=16)
    mask = torch.ones(3, 8, dtype=torch.bool)
    plan = per_block_plan(DoubleMC(num_samples=2).make_plan, mask, 4, 17)
    bp = on_blocks(policy, 4)

    def loss_fn(per_token):  # (non-linear in the estimate, as the objectives are)
        return (per_token.sum(-1) / 8).exp().sum(), {}

    grads = []
    for micro_batch in (None, 2):
        policy.model.zero_grad()
        score_and_backward(bp, *prompts, completion, mask, plan, loss_fn, micro_batch)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    policy.model.zero_grad()
    scale = float(grads[0].abs().max())
    torch.testing.assert_close(grads[1], grads[0], atol=ATOL * scale, rtol=0)


@pytest.mark.parametrize("merge", [1, 3])
def test_the_left_to_right_trajectory_costs_a_block_not_a_sequence(policy, prompts, merge):
    completion = random_tokens(policy, (3, 8), seed=18)
    mask = torch.ones(3, 8, dtype=torch.bool)
    plan = block_rollout_plan(Trajectory(order="left_to_right", merge=merge), mask, 4)
    assert plan.nfe == -(-4 // merge)
    est = score(on_blocks(policy, 4), *prompts, completion, mask, plan)
    # = the chain rule inside each block given the clean blocks before it (merge 1), by the per-block loop
    if merge == 1:
        ref = naive_score(on_blocks(policy, 4).model_fn, *prompts, completion, plan, 4, policy.mask_token_id)
        torch.testing.assert_close(est.per_token, ref, atol=ATOL, rtol=0)
