"""The prompt cut into blocks (``prompt_blocks=True``, SDAR/TraDo's layout): the masks against TraceRL's rule written
out position by position, and every fast path that uses them (the exact cache, the composite pass, the block
trajectory) against its naive loop, with left padding."""

from __future__ import annotations

import functools

import pytest
import torch

from dlmrl.estimators import score
from dlmrl.estimators.block_composite import composite_logits
from dlmrl.estimators.block_plans import block_trajectory_plan
from dlmrl.models.block_attention import (
    PAD_BLOCK,
    BlockCausalPolicy,
    block_bounds,
    block_causal_mask,
    block_logits,
    block_position_ids,
    composite_mask,
    prompt_block_ids,
)
from dlmrl.models.block_policy import block_policy_from
from dlmrl.models.block_sampler import block_generate
from tests.models.block_helpers import (
    ATOL,
    RecordingForward,
    padded_prompts,
    random_tokens,
    tiny_block_policy,
)


@pytest.fixture(scope="module")
def policy():
    return tiny_block_policy(seed=4)


@pytest.fixture(scope="module")
def prompts(policy):
    return padded_prompts(policy, [7, 3, 5], seed=2)  # (left padding of 0, 4 and 2; 7 and 5 span several blocks)


def tracerl_rule(prompt_mask: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """``(B, 1, P + L, P + L)`` bool from TraceRL's description (Gen-Verse/dLLM-RL ``train/rl_sdar.py``,
    ``make_basic_block_attention``, re-stated per pair): a prompt token whose block ends ``e`` real tokens before the
    prompt's end attends the real prompt tokens up to that block's end; completion block ``b`` (``[b·B, (b+1)·B)``)
    attends the whole real prompt and the completion up to its own end; padding attends itself only."""
    batch, p = prompt_mask.shape
    out = torch.zeros(batch, p + length, p + length, dtype=torch.bool)
    for row in range(batch):
        real = prompt_mask[row].tolist()
        for q in range(p + length):
            for k in range(p + length):
                if q < p and not real[q]:
                    out[row, q, k] = q == k
                elif k < p and not real[k]:
                    out[row, q, k] = False
                elif q < p:  # a real prompt token: its block ends where (p - q - 1) // B blocks still follow
                    block_end = p - ((p - 1 - q) // block_size) * block_size
                    out[row, q, k] = k < block_end
                else:
                    c = q - p
                    out[row, q, k] = k < p + min((c // block_size + 1) * block_size, length)
    return out[:, None]


@pytest.mark.parametrize(("length", "block_size"), [(5, 1), (6, 2), (6, 3), (4, 4)])
def test_the_block_causal_mask_is_tracerls_rule(length, block_size):
    prompt_mask = torch.tensor([[True] * 7, [False] * 4 + [True] * 3, [False] * 2 + [True] * 5])
    assert torch.equal(block_causal_mask(prompt_mask, length, block_size, prompt_blocks=True),
                       tracerl_rule(prompt_mask, length, block_size))
    ids = prompt_block_ids(prompt_mask, block_size, prompt_blocks=True)
    assert ids[0, -1] == 0 and ids[0, 0] == -((7 - 1) // block_size) and (ids[1, :4] == PAD_BLOCK).all()


@pytest.mark.parametrize("block_size", [2, 3])
def test_the_composite_mask_cuts_only_the_prompt_rows(block_size):
    # completion rows are those of the whole-prompt layout; prompt rows are the block-causal mask's prompt rows
    pm = torch.tensor([[True] * 6, [False, False, True, True, True, True]])
    length, p = 4, 6
    cut, whole = composite_mask(pm, length, block_size, True), composite_mask(pm, length, block_size, False)
    assert torch.equal(cut[:, :, p:], whole[:, :, p:])
    causal = block_causal_mask(pm, length, block_size, True)
    assert torch.equal(cut[:, :, :p, :p], causal[:, :, :p, :p]) and not cut[:, :, :p, p:].any()
    assert not torch.equal(cut, whole)


def test_a_later_prompt_block_changes_no_logits_of_an_earlier_one(policy, prompts):
    ids, pm = prompts
    fn = BlockCausalPolicy(policy, 4, 2, prompt_blocks=True)
    canvas = random_tokens(policy, (3, 4), seed=1)
    a = fn(torch.cat([ids, canvas], 1), torch.cat([pm, torch.ones_like(canvas, dtype=torch.bool)], 1))
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1 - 5) % (len(policy.tokenizer) - 5) + 5  # the prompt's last token (block 0)
    b = fn(torch.cat([changed, canvas], 1), torch.cat([pm, torch.ones_like(canvas, dtype=torch.bool)], 1))
    p = ids.shape[1]
    torch.testing.assert_close(a[0, : p - 2], b[0, : p - 2], atol=ATOL, rtol=0)  # row 0: 7 real tokens
    assert (a[0, p - 2 :] - b[0, p - 2 :]).abs().max() > 1e-3  # its own block and the completion see it
    whole = BlockCausalPolicy(policy, 4, 2)(torch.cat([ids, canvas], 1),
                                             torch.cat([pm, torch.ones_like(canvas, dtype=torch.bool)], 1))
    assert (whole[0, p:] - a[0, p:]).abs().max() > 1e-3  # (the layouts differ for the completion too)


@pytest.mark.parametrize(("block_size", "threshold"), [(1, None), (2, None), (4, None), (2, 0.6), (4, 0.6)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_cache_is_exact(policy, prompts, block_size, threshold, temperature):
    outs = []
    for cache in (True, False):
        rec = RecordingForward()
        out = block_generate(policy, *prompts, gen_length=8, block_size=block_size,
                             steps_per_block=max(1, block_size // 2), temperature=temperature, threshold=threshold,
                             cache=cache, forward=rec, generator=torch.Generator().manual_seed(3), prompt_blocks=True)
        outs.append(out)
    a, b = outs
    assert torch.equal(a.canvas, b.canvas) and torch.equal(a.reveal_step, b.reveal_step)
    torch.testing.assert_close(a.token_logprobs, b.token_logprobs, atol=ATOL, rtol=0)
    # and it is the block-causal policy's rollout under generate's rules, i.e. the uncached reference of this layout
    plain = block_generate(policy, *prompts, gen_length=8, block_size=block_size,
                           steps_per_block=max(1, block_size // 2), temperature=temperature, threshold=threshold,
                           generator=torch.Generator().manual_seed(3))
    if block_size > 1:
        assert not torch.allclose(plain.token_logprobs, a.token_logprobs, atol=1e-3)


@pytest.mark.parametrize(("length", "block_size"), [(8, 2), (9, 4)])
def test_the_composite_pass_equals_the_per_block_loop(policy, prompts, length, block_size):
    ids, pm = prompts
    clean = random_tokens(policy, (3, length), seed=4)
    noisy = clean.masked_fill(torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5,
                              policy.mask_token_id)
    fn = functools.partial(block_logits, policy.model)
    out = composite_logits(fn, ids, pm, noisy, clean, block_size, prompt_blocks=True)
    for lo, hi in block_bounds(length, block_size):
        seq = torch.cat([ids, clean[:, :lo], noisy[:, lo:hi]], 1)
        ref = fn(seq, block_causal_mask(pm, hi, block_size, True), block_position_ids(pm, hi))[:, ids.shape[1] + lo:]
        torch.testing.assert_close(out[:, lo:hi], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("temperature", "threshold"), [(0.0, None), (1.0, 0.3)])
def test_the_trajectory_at_merge_1_is_the_samplers_log_probs(policy, prompts, temperature, threshold):
    blocks = block_policy_from(policy, 4, prompt_blocks=True)
    out = blocks.sample_blocks(*prompts, gen_length=8, steps=4, temperature=temperature, threshold=threshold,
                               generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 8, dtype=torch.bool)
    plan = block_trajectory_plan(mask, out.reveal_step, 4, 1, temperature=temperature if temperature > 0 else 1.0)
    est = score(blocks, *prompts, out.canvas, mask, plan)
    torch.testing.assert_close(est.per_token, out.token_logprobs, atol=ATOL, rtol=0)


def test_a_prompt_padded_on_the_right_is_refused(policy, prompts):
    # prompt blocks are counted back from the prompt's end and positions over real tokens: both assume left padding
    ids, pm = prompts
    with pytest.raises(ValueError, match="left padding"):
        block_generate(policy, ids, pm.flip(-1), gen_length=8, block_size=4, steps_per_block=2, prompt_blocks=True)
