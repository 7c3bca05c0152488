"""Early stop at EOS (``stop_at_eos``): the block sampler and the full-diffusion sampler decode every block up to a
row's EOS block exactly as the full decode, fill the rest with EOS that no step wrote, run fewer passes, and leave the
generator where the full decode leaves it."""

from __future__ import annotations

import pytest
import torch

from dlmrl.models.block_attention import hf_block_forward
from dlmrl.models.block_sampler import block_generate
from dlmrl.models.sampler import NOT_SAMPLED, generate
from tests.models.block_helpers import padded_prompts, tiny_block_policy

#: the absolute position (prompt tokens counted) where the test models put a confident EOS: rows with prompts of
#: 3, 1, 5 and 2 real tokens reach it at canvas positions 4, 6, 2 and 5 (blocks 1, 1, 0 and 1 of 4 tokens)
EOS_AT = 7
LENGTHS = [3, 1, 5, 2]
#: a logit boost no Gumbel draw at temperature 1 overcomes (P(g > 40) < e^-40)
BOOST = 40.0


def eos_forward(eos: int):
    """A block forward that adds :data:`BOOST` to EOS's logit at position id :data:`EOS_AT`."""

    def forward(model, input_ids, mask4d, position_ids, past=None, use_cache=False):
        logits, kv = hf_block_forward(model, input_ids, mask4d, position_ids, past, use_cache)
        logits = logits.clone()
        logits[..., eos] += BOOST * (position_ids == EOS_AT).to(logits.dtype)
        return logits, kv

    return forward


class EosPolicy:
    """A bidirectional policy (``(input_ids, attention_mask) -> logits``) whose EOS logit gets :data:`BOOST` at
    the real-token position :data:`EOS_AT`."""

    def __init__(self, policy):
        self.policy, self.mask_token_id, self.eos = policy, policy.mask_token_id, policy.eos_token_id

    def __call__(self, input_ids, attention_mask):
        logits = self.policy(input_ids, attention_mask).clone()
        position = attention_mask.long().cumsum(1) - 1  # (B, T): real tokens counted from 0
        logits[..., self.eos] += BOOST * (position == EOS_AT).to(logits.dtype)
        return logits


@pytest.fixture(scope="module")
def policy():
    # float64: with a threshold an ended row leaves the pass, so later passes run in another batch shape; float64
    # keeps every draw away from a rounding-level tie
    p = tiny_block_policy(seed=2)
    p.model.double()
    return p


@pytest.fixture(scope="module")
def prompts(policy):
    return padded_prompts(policy, LENGTHS, seed=3)


def assert_stopped_as_full(stopped, full, eos: int, block: int, length: int):
    """Every row's blocks up to its EOS block as in ``full``; the rest EOS, not sampled, log-prob 0."""
    first = [row.tolist().index(eos) for row in full.canvas]  # (the full decode's first EOS of each row)
    assert all(f < length for f in first)
    ends = torch.tensor([(f // block + 1) * block for f in first])
    assert stopped.decoded_length.tolist() == ends.clamp(max=length).tolist()
    assert full.decoded_length.tolist() == [length] * len(first)
    tail = torch.arange(length)[None, :] >= ends[:, None]  # (B, L)
    assert torch.equal(stopped.canvas[~tail], full.canvas[~tail])
    assert torch.equal(stopped.reveal_step[~tail], full.reveal_step[~tail])
    assert torch.equal(stopped.token_logprobs[~tail], full.token_logprobs[~tail])
    assert (stopped.canvas[tail] == eos).all() and (stopped.reveal_step[tail] == NOT_SAMPLED).all()
    assert (stopped.token_logprobs[tail] == 0).all()
    assert tail.any()  # (not vacuous: the full decode wrote tokens there)
    assert not (full.canvas[tail] == eos).all()


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize(("temperature", "remasking", "threshold"), [
    (0.0, "low_confidence", None), (1.0, "low_confidence", None), (1.0, "random", None), (0.0, "low_confidence", 0.5),
    (1.0, "low_confidence", 0.5)])
def test_the_block_sampler_stops_at_the_block_holding_the_last_eos(policy, prompts, cache, temperature, remasking,
                                                                  threshold):
    eos = policy.eos_token_id
    kw = {"gen_length": 16, "block_size": 4, "steps_per_block": 2, "temperature": temperature,
          "remasking": remasking, "threshold": threshold, "cache": cache, "forward": eos_forward(eos)}

    def run(stop):
        g = torch.Generator().manual_seed(5)
        out = block_generate(policy, *prompts, generator=g, eos_token_id=eos, stop_at_eos=stop, **kw)
        return out, torch.rand(3, generator=g)

    (full, after_full), (stopped, after) = run(False), run(True)
    assert_stopped_as_full(stopped, full, eos, 4, 16)
    assert torch.equal(after, after_full)  # (the generator ends where the full decode leaves it)
    # every row has ended after block 1 of 4: the passes of blocks 2 and 3 are not run
    assert stopped.nfe < full.nfe and (stopped.row_nfe < full.row_nfe).all()
    if threshold is None:
        assert stopped.nfe == full.nfe // 2 and stopped.row_nfe.tolist() == [stopped.nfe] * 4
        if cache:  # (the prompt and block 0; block 1's keys are never needed)
            assert (stopped.cache_passes, full.cache_passes) == (2, 4)
    else:  # (row 2 ended after block 0 and leaves the pass; the others after block 1)
        full_rows = [block_generate(policy, prompts[0][r:r + 1], prompts[1][r:r + 1], eos_token_id=eos,
                                    stop_at_eos=True, generator=torch.Generator().manual_seed(5), **kw).row_nfe
                     for r in range(4)]
        if temperature == 0:  # (greedy: a row alone takes the steps it takes in the batch)
            assert stopped.row_nfe.tolist() == torch.cat(full_rows).tolist()


def test_the_block_sampler_stops_rows_in_a_share_as_in_the_whole_batch(policy, prompts):
    eos = policy.eos_token_id
    kw = {"gen_length": 16, "block_size": 4, "steps_per_block": 2, "temperature": 1.0, "forward": eos_forward(eos),
          "eos_token_id": eos, "stop_at_eos": True}

    def run(rows):
        g = torch.Generator().manual_seed(8)
        return block_generate(policy, *prompts, generator=g, rows=rows, **kw), g.get_state()

    whole, state = run(None)
    for lo, hi in ((0, 2), (2, 3), (3, 4)):
        part, part_state = run((lo, hi))
        for name in ("canvas", "reveal_step", "token_logprobs", "decoded_length"):
            assert torch.equal(getattr(part, name), getattr(whole, name)[lo:hi]), name
        assert torch.equal(part_state, state)
    # row 2 alone ends after block 0: one block's passes instead of two
    assert run((2, 3))[0].nfe == whole.nfe // 2


def test_no_eos_decodes_everything_and_a_missing_eos_id_is_refused(policy, prompts):
    kw = {"gen_length": 8, "block_size": 4, "steps_per_block": 2}
    plain = block_generate(policy, *prompts, **kw)
    never = block_generate(policy, *prompts, eos_token_id=policy.mask_token_id + 1000, stop_at_eos=True, **kw)
    assert torch.equal(plain.canvas, never.canvas) and plain.nfe == never.nfe
    assert never.decoded_length.tolist() == [8] * 4
    with pytest.raises(ValueError, match="stop_at_eos=True needs eos_token_id"):
        block_generate(policy, *prompts, stop_at_eos=True, **kw)
    with pytest.raises(ValueError, match="stop_at_eos=True needs eos_token_id"):
        generate(policy, *prompts, gen_length=8, block_length=4, steps=4, stop_at_eos=True)


@pytest.mark.parametrize(("temperature", "threshold"), [(0.0, None), (1.0, None), (0.0, 0.5)])
def test_the_full_diffusion_sampler_stops_as_an_option(policy, prompts, temperature, threshold):
    # semi-autoregressive blocks of 4: a row's blocks up to its EOS block were decoded while the later ones were
    # masks, so they are the full decode's; the rest is EOS and fewer passes run
    eos_policy = EosPolicy(policy)
    kw = {"gen_length": 16, "block_length": 4, "steps": 8, "temperature": temperature, "threshold": threshold,
          "eos_token_id": policy.eos_token_id}

    def run(stop):
        g = torch.Generator().manual_seed(11)
        return generate(eos_policy, *prompts, generator=g, stop_at_eos=stop, **kw), torch.rand(3, generator=g)

    (full, after_full), (stopped, after) = run(False), run(True)
    assert_stopped_as_full(stopped, full, policy.eos_token_id, 4, 16)
    assert torch.equal(after, after_full)
    assert stopped.nfe < full.nfe and (stopped.row_nfe < full.row_nfe).all()
    if threshold is None:
        assert stopped.nfe == full.nfe // 2
    # the default decodes the whole canvas, as LLaDA's generate does
    g = torch.Generator().manual_seed(11)
    default = generate(eos_policy, *prompts, generator=g, **kw)
    assert torch.equal(default.canvas, full.canvas) and default.nfe == full.nfe


def test_a_block_policy_stops_through_generate(policy, prompts):
    from dlmrl.models.block_policy import block_policy_from

    blocks = block_policy_from(policy, 4, forward=eos_forward(policy.eos_token_id))
    kw = {"gen_length": 16, "block_length": 4, "steps": 8, "eos_token_id": policy.eos_token_id}
    full = generate(blocks, *prompts, **kw)
    stopped = generate(blocks, *prompts, stop_at_eos=True, **kw)
    assert_stopped_as_full(stopped, full, policy.eos_token_id, 4, 16)
    assert stopped.nfe == full.nfe // 2
