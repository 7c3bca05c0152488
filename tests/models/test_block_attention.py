"""Block-causal attention: the masks against their rules position by position, and the masks honoured exactly by the
tiny Llama (sdpa and eager, either ``is_causal``): block size L, block size 1, no look-ahead across blocks, padding."""

from __future__ import annotations

import pytest
import torch

from dlmrl.models.block_attention import (
    BlockCausalPolicy,
    block_bounds,
    block_causal_mask,
    block_logits,
    block_position_ids,
    composite_mask,
    model_attention_mask,
)
from dlmrl.models.policy import canvas_logits
from tests.models.block_helpers import ATOL, padded_prompts, random_tokens, tiny_block_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_block_policy(seed=0)


def rule_masks(prompt_mask: torch.Tensor, length: int, block_size: int):
    """The two masks by their definitions, one (query, key) pair at a time."""
    batch, p = prompt_mask.shape

    def beta(i):  # block of completion position i
        return 1 + i // block_size

    causal = torch.zeros(batch, p + length, p + length, dtype=torch.bool)
    comp = torch.zeros(batch, p + 2 * length, p + 2 * length, dtype=torch.bool)
    for b in range(batch):
        real = prompt_mask[b].tolist()
        for q in range(p + length):
            for k in range(p + length):
                if q < p and not real[q]:
                    causal[b, q, k] = q == k  # padding query: itself only
                elif k < p:
                    causal[b, q, k] = real[k]  # every real query sees the real prompt
                else:
                    causal[b, q, k] = q >= p and beta(k - p) <= beta(q - p)
        for q in range(p + 2 * length):
            for k in range(p + 2 * length):
                qn, kn = q - p, k - p  # offsets into the halves
                if q < p and not real[q]:
                    comp[b, q, k] = q == k
                elif k < p:
                    comp[b, q, k] = real[k]
                elif q < p:
                    comp[b, q, k] = False  # the prompt attends the prompt only
                elif qn < length and kn < length:  # noisy -> noisy
                    comp[b, q, k] = beta(qn) == beta(kn)
                elif qn < length:  # noisy -> clean
                    comp[b, q, k] = beta(kn - length) < beta(qn)
                elif kn < length:  # clean -> noisy
                    comp[b, q, k] = False
                else:  # clean -> clean
                    comp[b, q, k] = beta(kn - length) <= beta(qn - length)
    return causal[:, None], comp[:, None]


@pytest.mark.parametrize(("length", "block_size"), [(5, 1), (5, 2), (6, 3), (4, 4), (5, 7)])
def test_masks_follow_the_rules_position_by_position(length, block_size):
    prompt_mask = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])
    causal, comp = rule_masks(prompt_mask, length, block_size)
    assert torch.equal(block_causal_mask(prompt_mask, length, block_size), causal)
    assert torch.equal(composite_mask(prompt_mask, length, block_size), comp)


def test_block_bounds_leave_the_last_block_shorter():
    assert block_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert block_bounds(3, 8) == [(0, 3)]
    with pytest.raises(ValueError, match="block_size"):
        block_bounds(8, 0)


def test_block_size_L_without_a_prompt_is_the_bidirectional_policy(policy):
    # block 0 (the prompt) is empty: one block over the whole canvas is full bidirectional attention
    y = random_tokens(policy, (3, 8), seed=1)
    empty = torch.zeros(3, 0, dtype=torch.long)
    ref = canvas_logits(policy, empty, empty.bool(), y)
    out = canvas_logits(BlockCausalPolicy(policy, 8, 8), empty, empty.bool(), y)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_block_size_L_with_a_prompt_differs_from_full_diffusion_only_by_the_prompt_not_seeing_the_canvas(policy):
    ids, pm = padded_prompts(policy, [2, 5, 3], seed=2)
    y = random_tokens(policy, (3, 8), seed=3)
    out = canvas_logits(BlockCausalPolicy(policy, 8, 8), ids, pm, y)
    # reference written independently: padding keys dropped, prompt queries blind to the canvas
    t = ids.shape[1] + 8
    real = torch.cat([pm, torch.ones(3, 8, dtype=torch.bool)], 1)
    allowed = real[:, None, :].expand(3, t, t).clone()
    allowed[:, : ids.shape[1], ids.shape[1]:] = False
    allowed |= torch.eye(t, dtype=torch.bool)
    ref = block_logits(policy.model, torch.cat([ids, y], 1), allowed[:, None], block_position_ids(pm, 8))
    torch.testing.assert_close(out, ref[:, ids.shape[1]:], atol=ATOL, rtol=0)
    bidirectional = canvas_logits(policy, ids, pm, y)  # (the prompt sees the canvas there: not the same model)
    assert (out - bidirectional).abs().max() > 1e-3


def test_block_size_1_attends_like_a_causal_model(policy):
    ids, pm = padded_prompts(policy, [4, 2], seed=4)
    y = random_tokens(policy, (2, 6), seed=5)
    bc = BlockCausalPolicy(policy, 6, 1)
    base = canvas_logits(bc, ids, pm, y)
    for i in range(6):
        z = y.clone()
        z[:, i] = (z[:, i] - 5 + 1) % (len(policy.tokenizer) - 5) + 5  # another ordinary token
        out = canvas_logits(bc, ids, pm, z)
        torch.testing.assert_close(out[:, :i], base[:, :i], atol=ATOL, rtol=0)
        assert (out[:, i:] - base[:, i:]).abs().max() > 1e-3  # (position i and later do see it)


@pytest.mark.parametrize("block_size", [2, 3])
def test_a_token_of_block_b_changes_no_logits_of_earlier_blocks(policy, block_size):
    ids, pm = padded_prompts(policy, [3, 1, 5], seed=6)
    length = 8
    bc = BlockCausalPolicy(policy, length, block_size)
    full = torch.cat([ids, random_tokens(policy, (3, length), seed=7)], 1)
    attn = torch.cat([pm, torch.ones(3, length, dtype=torch.bool)], 1)
    base = bc(full, attn)
    p = ids.shape[1]
    for lo, hi in block_bounds(length, block_size)[1:]:
        z = full.clone()
        z[:, p + hi - 1] = policy.mask_token_id  # the last token of the block
        out = bc(z, attn)
        torch.testing.assert_close(out[:, : p + lo], base[:, : p + lo], atol=ATOL, rtol=0)  # prompt, earlier blocks
        assert (out[:, p + lo : p + hi] - base[:, p + lo : p + hi]).abs().max() > 1e-3


def test_a_prompt_logits_do_not_depend_on_its_padding(policy):
    ids, pm = padded_prompts(policy, [2, 6], seed=8)
    y = random_tokens(policy, (2, 8), seed=9)
    bc = BlockCausalPolicy(policy, 8, 3)
    both = canvas_logits(bc, ids, pm, y)
    alone = canvas_logits(bc, ids[:1, -2:], pm[:1, -2:], y[:1])
    torch.testing.assert_close(both[:1], alone, atol=ATOL, rtol=0)
    assert torch.isfinite(bc(torch.cat([ids, y], 1), torch.cat([pm, torch.ones_like(y, dtype=torch.bool)], 1))).all()


def test_sdpa_eager_and_the_is_causal_flag_all_honour_the_mask(policy):
    ids, pm = padded_prompts(policy, [3, 5], seed=10)
    y = random_tokens(policy, (2, 6), seed=11)
    bc = BlockCausalPolicy(policy, 6, 2)
    config = policy.model.config
    ref = canvas_logits(bc, ids, pm, y)
    try:
        config._attn_implementation = "eager"
        eager = canvas_logits(bc, ids, pm, y)
        assert model_attention_mask(policy.model, torch.ones(1, 1, 2, 2, dtype=torch.bool)).dtype == torch.float32
        config._attn_implementation, config.is_causal = "sdpa", True  # a causal LM class: the 4-D mask still rules
        causal = canvas_logits(bc, ids, pm, y)
        config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="dense 4-D mask"):
            canvas_logits(bc, ids, pm, y)
    finally:
        config._attn_implementation, config.is_causal = "sdpa", False
    torch.testing.assert_close(eager, ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(causal, ref, atol=ATOL, rtol=0)


def test_a_completion_with_padding_is_refused(policy):
    bc = BlockCausalPolicy(policy, 4, 2)
    with pytest.raises(ValueError, match="no padding"):
        bc(torch.ones(1, 6, dtype=torch.long) * 6, torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool))
