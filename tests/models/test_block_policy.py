"""The block-diffusion policy kind: loading (block size from the checkpoint, families refused), the sampler dispatch,
the LoRA reference view, and the block pretraining loss against its per-block definition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlmrl.models.block_policy import BlockDiffusionPolicy, block_policy_from
from dlmrl.models.block_sampler import block_generate
from dlmrl.models.loading import checkpoint_block_size, load_block_policy, resolve_model_path
from dlmrl.models.sampler import generate
from tests.helpers import save_tiny_checkpoint
from tests.models.block_helpers import ATOL, padded_prompts, random_tokens, tiny_block_policy


def test_the_shipped_model_loads_with_its_recorded_block_size_or_a_chosen_one():
    policy = load_block_policy("tiny-sudoku-block")
    assert isinstance(policy, BlockDiffusionPolicy) and policy.block_size == 4 == checkpoint_block_size(
        "tiny-sudoku-block")
    config = json.loads((Path(resolve_model_path("tiny-sudoku-block")) / "config.json").read_text())
    assert config["block_sizes"] == [1, 2, 4, 8, 16]
    assert load_block_policy("tiny-sudoku-block", 16).block_size == 16


def test_a_checkpoint_without_a_block_size_needs_one(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "m")
    assert checkpoint_block_size(str(path)) is None
    with pytest.raises(ValueError, match="model.block_size"):
        load_block_policy(str(path))
    assert load_block_policy(str(path), 2).block_size == 2
    assert checkpoint_block_size(str(tmp_path / "missing")) is None


def test_a_family_without_a_block_forward_is_refused(tmp_path, monkeypatch):
    from dlmrl.models import families

    path = save_tiny_checkpoint(tmp_path / "m")
    import dataclasses

    original = families.FAMILIES.get
    without = dataclasses.replace(original("tiny"), block_forward=None)
    monkeypatch.setattr(families.FAMILIES, "get", lambda name: without if name == "tiny" else original(name))
    with pytest.raises(ValueError, match="no block-causal forward"):
        load_block_policy(str(path), 2)


def test_generate_dispatches_to_the_block_sampler_with_the_steps_split_over_the_blocks():
    base = tiny_block_policy(seed=7)
    policy = block_policy_from(base, 3)
    ids, mask = padded_prompts(base, [2, 4], seed=8)
    ours = generate(policy, ids, mask, gen_length=7, block_length=7, steps=6, temperature=1.0,
                    generator=torch.Generator().manual_seed(9))  # (3 blocks: 2 steps each; block_length unused)
    ref = block_generate(base, ids, mask, gen_length=7, block_size=3, steps_per_block=2, temperature=1.0,
                         generator=torch.Generator().manual_seed(9))
    assert torch.equal(ours.canvas, ref.canvas) and torch.equal(ours.reveal_step, ref.reveal_step)
    assert ours.nfe == ref.nfe <= 6  # (the 1-token last block has nothing to reveal at its second step)
    with pytest.raises(ValueError, match="split evenly over 3 blocks"):
        generate(policy, ids, mask, gen_length=7, block_length=7, steps=4)
    with pytest.raises(ValueError, match="cfg_scale must be 0"):
        generate(policy, ids, mask, gen_length=7, block_length=7, steps=6, cfg_scale=1.0)
    with pytest.raises(TypeError, match="completion_logits"):
        policy(torch.cat([ids, ids], 1))


def test_the_lora_reference_scores_the_base_through_its_composite_pass():
    from dlmrl.models.lora import AdapterDisabledPolicy, apply_lora

    base = tiny_block_policy(seed=10)
    ids, mask = padded_prompts(base, [3, 2], seed=11)
    clean = random_tokens(base, (2, 6), seed=12)
    noisy = clean.clone()
    noisy[:, ::2] = base.mask_token_id
    policy = block_policy_from(base, 2)
    with torch.no_grad():
        before = policy.completion_logits(ids, mask, noisy, clean)
    policy.model = apply_lora(policy.model, 4, 8, 0.0, "all-linear")
    for p in policy.model.parameters():  # (move the adapter away from zero so it changes the logits)
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.5)
    ref = AdapterDisabledPolicy(policy)
    with torch.no_grad():
        adapted = policy.completion_logits(ids, mask, noisy, clean)
        disabled = ref.completion_logits(ids, mask, noisy, clean)
    torch.testing.assert_close(disabled, before, atol=ATOL, rtol=0)
    assert (adapted - before).abs().max() > 1e-2


def test_the_block_sft_loss_is_the_per_block_masked_cross_entropy():
    # the composite pass's loss = Σ_b (1/t_b) Σ masked CE over each block's own pass (prefix clean), per token
    import torch.nn.functional as F

    from dlmrl.models.block_attention import block_bounds, block_causal_mask, block_position_ids
    from dlmrl.pretraining.block import block_sft_loss

    base = tiny_block_policy(seed=13)
    policy = block_policy_from(base, 3)
    ids, mask = padded_prompts(base, [2, 5], seed=14)
    answer = random_tokens(base, (2, 8), seed=15)
    loss = block_sft_loss(policy, ids, mask, answer, torch.Generator().manual_seed(16))
    g = torch.Generator().manual_seed(16)  # (the same draws, in the loss's order: times per block, then masks)
    t = torch.empty(2, 8)
    for lo, hi in block_bounds(8, 3):
        t[:, lo:hi] = (1 - 1e-3) * torch.rand(2, 1, generator=g) + 1e-3
    masked = torch.rand(2, 8, generator=g) < t
    total = torch.zeros(())
    for lo, hi in block_bounds(8, 3):
        seq = torch.cat([answer[:, :lo], answer[:, lo:hi].masked_fill(masked[:, lo:hi], base.mask_token_id)], 1)
        logits = policy.model_fn(torch.cat([ids, seq], 1), block_causal_mask(mask, hi, 3),
                                 block_position_ids(mask, hi))[:, ids.shape[1] + lo:]
        ce = F.cross_entropy(logits.transpose(1, 2), answer[:, lo:hi], reduction="none")
        total = total + (ce * masked[:, lo:hi] / t[:, lo:hi]).sum()
    assert masked.any() and not masked.all()
    torch.testing.assert_close(loss, total / 16, atol=ATOL, rtol=0)
