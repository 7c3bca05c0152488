"""Block-diffusion sampling: the exact cache against the uncached reference (completions, log-probs, every step's
logits), the same rules and draws as ``generate`` on the block-causal policy, and the passes the cache costs."""

from __future__ import annotations

import pytest
import torch

from dlmrl.models.block_attention import BlockCausalPolicy, block_bounds
from dlmrl.models.block_sampler import block_generate
from dlmrl.models.sampler import NOT_SAMPLED, generate
from tests.models.block_helpers import ATOL, RecordingForward, padded_prompts, tiny_block_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_block_policy(seed=0)


@pytest.fixture(scope="module")
def prompts(policy):
    return padded_prompts(policy, [3, 7, 1], seed=1)  # (left padding of 4, 0 and 6)


def run(policy, prompts, cache, seed=0, **kw):
    rec = RecordingForward()
    out = block_generate(policy, *prompts, cache=cache, forward=rec, generator=torch.Generator().manual_seed(seed),
                         **kw)
    return out, rec


def assert_same_rollout(a, b, rec_a, rec_b, prompt_width):
    assert torch.equal(a.canvas, b.canvas)
    assert torch.equal(a.reveal_step, b.reveal_step)
    torch.testing.assert_close(a.token_logprobs, b.token_logprobs, atol=ATOL, rtol=0)
    assert a.nfe == b.nfe and torch.equal(a.row_nfe, b.row_nfe)
    cached, full = rec_a.denoising(), rec_b.denoising()
    assert len(cached) == len(full) == a.nfe
    for (_, pos, _, _, lc), (_, fpos, _, _, lf) in zip(cached, full):
        n_real = fpos[:, prompt_width]  # (n,): the position id of the first completion token
        cols = prompt_width + pos - n_real[:, None]  # (n, Lb): the block's columns in the full pass
        picked = lf.gather(1, cols[..., None].expand(-1, -1, lf.shape[-1]))
        torch.testing.assert_close(lc, picked, atol=ATOL, rtol=0)


@pytest.mark.parametrize("block_size", [1, 2, 4, 8])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.6])
def test_the_cache_is_exact(policy, prompts, block_size, temperature, threshold):
    kw = {"gen_length": 8, "block_size": block_size, "steps_per_block": max(1, block_size // 2), "temperature": temperature,
              "threshold": threshold}
    a, rec_a = run(policy, prompts, True, **kw)
    b, rec_b = run(policy, prompts, False, **kw)
    assert_same_rollout(a, b, rec_a, rec_b, prompts[0].shape[1])
    assert (a.canvas != policy.mask_token_id).all() and (a.reveal_step >= 0).all()


def test_the_cache_is_exact_with_one_block_of_16(policy, prompts):
    kw = {"gen_length": 16, "block_size": 16, "steps_per_block": 8, "temperature": 1.0}
    a, rec_a = run(policy, prompts, True, **kw)
    b, rec_b = run(policy, prompts, False, **kw)
    assert_same_rollout(a, b, rec_a, rec_b, prompts[0].shape[1])


def test_threshold_decoding_takes_different_steps_per_row_and_block(policy, prompts):
    # (so the threshold cases above are not one-token-per-step decoding in disguise)
    out, _ = run(policy, prompts, True, gen_length=8, block_size=4, threshold=0.6, temperature=1.0)
    assert len(set(out.row_nfe.tolist())) > 1
    per_block = [[len(set(out.reveal_step[r, lo:hi].tolist())) for lo, hi in block_bounds(8, 4)] for r in range(3)]
    assert len({n for row in per_block for n in row}) > 1 and out.nfe < 8


def test_the_cache_is_built_once_per_finished_block(policy, prompts):
    out, rec = run(policy, prompts, True, gen_length=10, block_size=4, steps_per_block=2, temperature=1.0)
    builds = [c for c in rec.calls if c[2]]
    # the prompt, then blocks 1 and 2 (the last block's keys are never needed)
    assert [(ids.shape[1], past) for ids, _, _, past, _ in builds] == [(7, 0), (4, 7), (4, 11)]
    assert out.cache_passes == 3
    steps = rec.denoising()
    assert out.nfe == len(steps) == 6  # 2 steps x 3 blocks
    assert [ids.shape[1] for ids, *_ in steps] == [4, 4, 4, 4, 2, 2]  # each pass feeds the block only
    assert [past for *_, past, _ in steps] == [7, 7, 11, 11, 15, 15]
    _, rec_full = run(policy, prompts, False, gen_length=10, block_size=4, steps_per_block=2, temperature=1.0)
    assert len(rec_full.calls) == 6 and all(ids.shape[1] == 17 for ids, *_ in rec_full.calls)


def test_a_shorter_last_block_and_an_infill_canvas(policy, prompts):
    mask_id = policy.mask_token_id
    canvas = torch.full((3, 10), mask_id)
    canvas[0, 1], canvas[1, 8], canvas[2, 4:8] = 7, 9, 11  # (row 2's second block is given whole)
    kw = {"gen_length": 10, "block_size": 4, "steps_per_block": 3, "temperature": 1.0, "canvas": canvas}
    a, rec_a = run(policy, prompts, True, **kw)
    b, rec_b = run(policy, prompts, False, **kw)
    assert_same_rollout(a, b, rec_a, rec_b, prompts[0].shape[1])
    given = canvas != mask_id
    assert torch.equal(a.canvas[given], canvas[given]) and (a.reveal_step[given] == NOT_SAMPLED).all()
    assert (a.token_logprobs[given] == 0).all() and (a.canvas != mask_id).all()


@pytest.mark.parametrize(("temperature", "threshold", "remasking"),
                         [(0.0, None, "low_confidence"), (1.0, None, "low_confidence"), (0.7, None, "random"),
                          (1.0, 0.6, "low_confidence"), (0.0, 0.6, "low_confidence")])
def test_the_rules_and_draws_are_generates_on_the_block_causal_policy(policy, prompts, temperature, threshold,
                                                                     remasking):
    ours, _ = run(policy, prompts, True, gen_length=8, block_size=4, steps_per_block=2, temperature=temperature,
                  threshold=threshold, remasking=remasking, seed=5)
    g = torch.Generator().manual_seed(5)
    ref = generate(BlockCausalPolicy(policy, 8, 4), *prompts, gen_length=8, block_length=4, steps=4,
                   temperature=temperature, threshold=threshold, remasking=remasking, generator=g)
    assert torch.equal(ours.canvas, ref.canvas) and torch.equal(ours.reveal_step, ref.reveal_step)
    torch.testing.assert_close(ours.token_logprobs, ref.token_logprobs, atol=ATOL, rtol=0)
    assert ours.nfe == ref.nfe


def test_bad_arguments_are_refused(policy, prompts):
    with pytest.raises(ValueError, match="steps_per_block"):
        block_generate(policy, *prompts, gen_length=8, block_size=4)
    with pytest.raises(ValueError, match="not both"):
        block_generate(policy, *prompts, gen_length=8, block_size=4, threshold=0.5, threshold_factor=1.0)
    with pytest.raises(ValueError, match="temperature"):
        block_generate(policy, *prompts, gen_length=8, block_size=4, steps_per_block=2, temperature=-1.0)
    with pytest.raises(ValueError, match="block_size"):
        block_generate(policy, *prompts, gen_length=8, block_size=0, steps_per_block=2)
    with pytest.raises(ValueError, match="low_confidence"):
        block_generate(policy, *prompts, gen_length=8, block_size=4, threshold=0.5, remasking="random")


def test_the_factor_rule_is_generates_too(policy, prompts):
    ours, rec = run(policy, prompts, True, gen_length=8, block_size=4, threshold_factor=1.0, temperature=1.0, seed=6)
    full, rec_full = run(policy, prompts, False, gen_length=8, block_size=4, threshold_factor=1.0, temperature=1.0,
                         seed=6)
    assert_same_rollout(ours, full, rec, rec_full, prompts[0].shape[1])
    ref = generate(BlockCausalPolicy(policy, 8, 4), *prompts, gen_length=8, block_length=4, steps=2,
                   threshold_factor=1.0, temperature=1.0, generator=torch.Generator().manual_seed(6))
    assert torch.equal(ours.canvas, ref.canvas) and torch.equal(ours.reveal_step, ref.reveal_step)


@pytest.mark.parametrize(("temperature", "threshold", "remasking"),
                         [(1.0, None, "low_confidence"), (1.0, None, "random"), (1.0, 0.3, "low_confidence")])
def test_a_share_of_the_rows_decodes_as_in_the_whole_batch(temperature, threshold, remasking):
    # one process's rows of a data-parallel batch: the same tokens, records and generator state as the whole batch
    policy = tiny_block_policy(seed=4)
    ids, mask = padded_prompts(policy, [3, 1, 5, 2], seed=5)
    canvas = torch.full((4, 8), policy.mask_token_id)
    canvas[0, 2] = 7  # (an infill row: its masks still decide which steps run)

    def run(rows):
        g = torch.Generator().manual_seed(6)
        out = block_generate(policy, ids, mask, gen_length=8, block_size=4, steps_per_block=2, temperature=temperature,
                             threshold=threshold, remasking=remasking, canvas=canvas, generator=g, rows=rows)
        return out, g.get_state()

    whole, state = run(None)
    for rows in ((0, 2), (1, 4), (3, 4)):
        part, part_state = run(rows)
        lo, hi = rows
        assert torch.equal(part.canvas, whole.canvas[lo:hi]) and torch.equal(part.reveal_step, whole.reveal_step[lo:hi])
        torch.testing.assert_close(part.token_logprobs, whole.token_logprobs[lo:hi], atol=ATOL, rtol=0)
        assert torch.equal(part_state, state)
    with pytest.raises(ValueError, match="rows"):
        run((2, 2))


def test_float_or_out_of_vocabulary_prompt_ids_are_refused_naming_them():
    from tests.models.block_helpers import padded_prompts, tiny_block_policy

    policy = tiny_block_policy()
    ids, mask = padded_prompts(policy, [3, 5])
    kw = {"gen_length": 4, "block_size": 2, "steps_per_block": 2}
    with pytest.raises(ValueError, match="prompt_ids must be integer"):
        block_generate(policy, ids.float(), mask, **kw)
    bad = ids.clone()
    bad[1, -1] = policy.model.config.vocab_size
    with pytest.raises(ValueError, match="prompt_ids holds token ids outside the model's vocabulary"):
        block_generate(policy, bad, mask, **kw)
    bad[1, -1] = 5
    bad[0, 0] = -1  # (padding positions are embedded too)
    with pytest.raises(ValueError, match="min -1"):
        block_generate(policy, bad, mask, **kw)


def test_a_float_step_count_is_refused_as_not_an_integer():
    from dlmrl.models.block_policy import block_policy_from
    from tests.models.block_helpers import padded_prompts, tiny_block_policy

    policy = tiny_block_policy()
    ids, mask = padded_prompts(policy, [3, 5])
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 2.0"):
        generate(block_policy_from(policy, 2), ids, mask, gen_length=4, block_length=4, steps=2.0)
    with pytest.raises(ValueError, match="steps must be an integer, got 2.0"):
        generate(policy, ids, mask, gen_length=4, block_length=4, steps=2.0)
