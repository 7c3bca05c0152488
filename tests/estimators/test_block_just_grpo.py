"""BlockJustGRPO (block_just_grpo): the block trajectory estimator with the left-to-right order and merge k is
JustGRPO's exact left-to-right log-probs at k = 1, checked against a loop with one forward pass per token, and
NeMo RL's reveal levels at k > 1 (level l reveals the first l·k tokens of every block and scores the next k),
checked against a loop with one pass per level and block; ⌈B / k⌉ composite passes in all."""

from __future__ import annotations

import functools

import pytest
import torch

from dlmrl.config import default_job_config
from dlmrl.estimators import Trajectory, score
from dlmrl.estimators.block_plans import block_rollout_plan
from dlmrl.estimators.scoring import sampler_log_softmax
from dlmrl.models.block_attention import block_bounds, block_logits
from tests.estimators.test_block_composite import Counting, naive_block_logits, on_blocks
from tests.models.block_helpers import ATOL, padded_prompts, random_tokens, tiny_block_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_block_policy(seed=5)


@pytest.fixture(scope="module")
def prompts(policy):
    return padded_prompts(policy, [3, 5, 2], seed=7)


def per_level_loop(policy, prompts, completion, block_size, k):
    """Each block's tokens scored level by level: level l masks the block's offsets >= l·k (later blocks do not
    matter: block-causal attention), runs the block over the prompt and the clean blocks before it, and scores
    offsets [l·k, (l+1)·k). At k = 1, one pass per token: JustGRPO's left-to-right chain rule."""
    fn = functools.partial(block_logits, policy.model)
    out = torch.zeros(completion.shape)
    passes = 0
    for lo, hi in block_bounds(completion.shape[1], block_size):
        offsets = torch.arange(hi - lo)
        for level in range(-(-(hi - lo) // k)):
            canvas_b = completion[:, lo:hi].masked_fill(offsets >= level * k, policy.mask_token_id)
            logits = naive_block_logits(fn, *prompts, canvas_b, completion, lo, hi, block_size)
            logp = sampler_log_softmax(logits, policy.mask_token_id, 1.0).gather(
                -1, completion[:, lo:hi, None]).squeeze(-1)
            scored = (offsets >= level * k) & (offsets < (level + 1) * k)
            out[:, lo:hi] += torch.where(scored, logp, 0.0)
            passes += 1
    return out, passes


@pytest.mark.parametrize(("length", "block_size", "k"), [(8, 4, 1), (10, 4, 1), (8, 4, 2), (10, 4, 3), (9, 3, 2)])
def test_the_left_to_right_block_trajectory_is_the_per_level_loop(policy, prompts, length, block_size, k):
    completion = random_tokens(policy, (3, length), seed=11)
    mask = torch.ones(3, length, dtype=torch.bool)
    plan = block_rollout_plan(Trajectory(order="left_to_right", merge=k), mask, block_size)
    fn = Counting()
    est = score(on_blocks(policy, block_size, fn), *prompts, completion, mask, plan)
    ref, loop_passes = per_level_loop(policy, prompts, completion, block_size, k)
    torch.testing.assert_close(est.per_token, ref, atol=ATOL, rtol=0)
    assert fn.calls == plan.nfe == -(-block_size // k)  # (⌈B / k⌉ composite passes, whatever the length)
    assert loop_passes > plan.nfe  # (the loop: one pass per level and block)


def test_k_above_one_is_an_approximation_of_the_exact_chain_rule(policy, prompts):
    completion = random_tokens(policy, (3, 8), seed=12)
    exact, _ = per_level_loop(policy, prompts, completion, 4, 1)
    merged, _ = per_level_loop(policy, prompts, completion, 4, 2)
    same = torch.arange(8) % 2 == 0  # (a level's first token sees the same prefix either way)
    torch.testing.assert_close(merged[:, same], exact[:, same], atol=ATOL, rtol=0)
    assert (merged[:, ~same] - exact[:, ~same]).abs().max() > 1e-3


def test_the_preset_is_block_only_and_k_is_estimator_merge():
    cfg = default_job_config(["model.kind=block", "model.name_or_path=tiny-sudoku-block", "model.block_size=4",
                              "task.answer_mode=full", "train.algorithm=block_just_grpo", "sampling.steps=16"])
    from dlmrl.config import ConfigError
    from dlmrl.config.resolve import estimator_settings

    name, section = estimator_settings(cfg)
    assert (name, section.order, section.merge) == ("trajectory", "left_to_right", 1)
    cfg.estimator.merge = 3  # (a config file's estimator.merge with estimator.name null: the user's k stands)
    assert estimator_settings(cfg)[1].merge == 3 and estimator_settings(cfg)[1].order == "left_to_right"
    with pytest.raises(ConfigError, match="'block_just_grpo' runs on block policies only, but model.kind is"):
        default_job_config(["train.algorithm=block_just_grpo"])



@pytest.mark.parametrize(("steps_per_block", "k", "exact"), [(2, 2, True), (4, 1, True), (4, 2, False)])
def test_rollouts_revealing_k_tokens_per_step_are_scored_exactly_at_k(policy, prompts, steps_per_block, k, exact):
    """The sampler's recorded log-probs (left to right, temperature 1) against the level scores: rollouts that reveal
    k tokens per step (blocks of 4 in 4 / k steps) are scored exactly at k, the same ⌈B/k⌉ passes; at k = 2 rollouts
    revealing one token per step are not (a level's second token is scored without its first)."""
    from dlmrl.models.block_sampler import block_generate

    out = block_generate(policy, *prompts, gen_length=8, block_size=4, steps_per_block=steps_per_block,
                         temperature=1.0, remasking="left_to_right", generator=torch.Generator().manual_seed(3))
    mask = torch.ones(out.canvas.shape, dtype=torch.bool)
    plan = block_rollout_plan(Trajectory(order="left_to_right", merge=k), mask, 4)
    est = score(on_blocks(policy, 4, Counting()), *prompts, out.canvas, mask, plan)
    gap = (est.per_token - out.token_logprobs).abs().max().item()
    assert (gap <= ATOL) is exact, gap
    if not exact:
        assert gap > 1e-3
