"""Block caching (``generate(cache="prefix" | "dual")``): a cached pass on the canvas its cache came from is a full
pass; the sampler with a cache equals an oracle of Fast-dLLM's caches built from forward hooks (no key/value
cache), greedy and with threshold decoding; families without a cache are refused by name."""

from __future__ import annotations

import pytest
import torch

from dlmrl.models.block_cache import BlockCache, hf_cached_logits
from dlmrl.models.families import cached_logits_of
from dlmrl.models.policy import MaskedDiffusionPolicy, canvas_logits
from dlmrl.models.sampler import generate, sampler_log_softmax
from tests.models.llada_reference import reference_greedy
from tests.models.test_sampler_parity import random_prompts, sudoku_batch
from tests.tolerances import SHIPPED_TERMS, TINY_TERMS, forward_tol, rounding_tol

#: a cached pass attends over other shapes than a full one, so the two agree to rounding: compared in float64;
#: |logit| ≤ 1 for the random Llama (checked below), TINY_TERMS accumulations (tests/tolerances.py): ≈ 1.1e-10
CACHE_TOL = forward_tol(scale=1, terms=TINY_TERMS)


@pytest.fixture(scope="module")
def shipped(shipped64):
    """This module's models run in float64 (tests/models/conftest.py): the sampler and the oracle decide each
    argmax and reveal order from passes over other shapes (row subsets, a cache's block), which round otherwise;
    in float32 a choice within a rounding (~1e-6) of a tie could flip on another machine, in float64 it cannot."""
    return shipped64


@pytest.fixture(scope="module")
def random_llama(random_llama64):
    return random_llama64


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_a_cached_pass_on_the_cached_canvas_is_a_full_pass(random_llama64, mode):
    # the cache is stale only by what changed since it was built: on the same canvas it must change nothing
    random_llama = random_llama64
    ids, attn = random_prompts(random_llama, 5, seed=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, random_llama.mask_token_id, (5, 24), generator=g)
    x[:, 10:] = random_llama.mask_token_id
    full = canvas_logits(random_llama, ids, attn, x)  # (B, L, V)
    cache = BlockCache(random_llama, hf_cached_logits, ids, attn, mode)
    cache.start_block(8, 16)
    first = cache.logits(x)
    again = cache.logits(x)
    rows = torch.tensor([1, 3, 4])
    some = cache.logits(x, rows)
    assert full.dtype == torch.float64 and full.abs().max() <= 1
    torch.testing.assert_close(first, full[:, 8:16], atol=CACHE_TOL, rtol=0)
    torch.testing.assert_close(again, full[:, 8:16], atol=CACHE_TOL, rtol=0)
    torch.testing.assert_close(some, full[rows, 8:16], atol=CACHE_TOL, rtol=0)
    assert (cache.full_passes, cache.cached_passes) == (1, 2)


def test_a_cached_pass_after_a_change_is_stale(random_llama64):
    # (so the equality above is not vacuous: the block's new tokens reach the cached positions only in a full pass)
    random_llama = random_llama64
    ids, attn = random_prompts(random_llama, 2, seed=2)
    x = torch.full((2, 16), random_llama.mask_token_id)
    cache = BlockCache(random_llama, hf_cached_logits, ids, attn, "dual")
    cache.start_block(0, 8)
    cache.logits(x)
    x[:, :4] = random_llama.mask_token_id + 2  # (a real token)
    stale = (cache.logits(x) - canvas_logits(random_llama, ids, attn, x)[:, :8]).abs().max()
    assert stale > 1e4 * CACHE_TOL  # (1.1e-2: far outside the equality's tolerance)


def test_rows_outside_the_first_pass_are_refused(random_llama):
    ids, attn = random_prompts(random_llama, 3, seed=3)
    x = torch.full((3, 8), random_llama.mask_token_id)
    cache = BlockCache(random_llama, hf_cached_logits, ids, attn, "prefix")
    cache.start_block(0, 8)
    cache.logits(x, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="rows outside"):
        cache.logits(x, torch.tensor([1]))


def assert_cache_parity(policy, ids, attn, gen_length, block_length, steps, mode, canvas=None, threshold=None):
    out = generate(policy, ids, attn, gen_length=gen_length, block_length=block_length, steps=steps, canvas=canvas,
                   cache=mode, threshold=threshold)
    ref, passes = reference_greedy(policy, ids, attn, gen_length=gen_length, block_length=block_length, steps=steps,
                                   mask_id=policy.mask_token_id, canvas=canvas, threshold=threshold, cache=mode)
    differ = (out.canvas != ref).any(-1).nonzero().flatten().tolist()
    assert not differ, f"rows {differ} differ from the oracle of the {mode} cache"
    if threshold is None:
        assert out.nfe == passes
    return out


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize(("gen_length", "block_length", "steps"), [(16, 8, 8), (16, 4, 8), (64, 16, 32)])
def test_cached_greedy_equals_the_oracle_on_the_shipped_model(shipped, mode, gen_length, block_length, steps):
    b = sudoku_batch(shipped, 8, "full", offset=16)
    out = assert_cache_parity(shipped, b.prompt_ids, b.prompt_mask, gen_length, block_length, steps, mode)
    exact = generate(shipped, b.prompt_ids, b.prompt_mask, gen_length=gen_length, block_length=block_length,
                     steps=steps)
    assert (out.canvas != exact.canvas).any()  # (the cache is an approximation here: the test is not vacuous)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_greedy_equals_the_oracle_on_an_infilling_canvas(shipped, mode):
    b = sudoku_batch(shipped, 8, "infill", offset=40)
    assert_cache_parity(shipped, b.prompt_ids, b.prompt_mask, 16, 4, 8, mode, canvas=b.canvas)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("batch", [1, 8])
def test_cached_greedy_equals_the_oracle_on_a_random_llama(random_llama, mode, batch):
    ids, attn = random_prompts(random_llama, batch, seed=7 + batch)
    assert_cache_parity(random_llama, ids, attn, 64, 16, 32, mode)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_threshold_decoding_equals_the_oracle(shipped, mode):
    # rows leave the model batch as their block is decoded: the cache's rows are selected with them
    b = sudoku_batch(shipped, 8, "full", offset=64)
    out = assert_cache_parity(shipped, b.prompt_ids, b.prompt_mask, 16, 8, 8, mode, threshold=0.7)
    assert len(set(out.row_nfe.tolist())) > 1  # (rows did take different numbers of passes)


def test_cached_logprobs_are_those_of_the_logits_used(shipped64):
    # the recorded log-probs are the sampler's distribution under the cached (stale) logits, not exact scores:
    # recompute them step by step from the dual cache and compare (in float64: the replay's passes may round
    # otherwise than the sampler's)
    shipped = shipped64
    b = sudoku_batch(shipped, 4, "full", offset=3)
    out = generate(shipped, b.prompt_ids, b.prompt_mask, gen_length=16, block_length=8, steps=4, cache="dual",
                   temperature=1.0, generator=torch.Generator().manual_seed(0))
    mask_id = shipped.mask_token_id
    x = torch.full_like(out.canvas, mask_id)
    cache = BlockCache(shipped, hf_cached_logits, b.prompt_ids, b.prompt_mask, "dual")
    expected = torch.zeros(out.canvas.shape)
    for step in range(4):
        block = step // 2
        lo, hi = 8 * block, 8 * block + 8
        if step % 2 == 0:
            cache.start_block(lo, hi)
        logp = sampler_log_softmax(cache.logits(x), mask_id, 1.0)  # (B, Lb, V)
        now = out.reveal_step[:, lo:hi] == step
        picked = logp.gather(-1, out.canvas[:, lo:hi, None]).squeeze(-1)
        expected[:, lo:hi] += torch.where(now, picked, torch.zeros_like(picked))
        x[:, lo:hi] = torch.where(now, out.canvas[:, lo:hi], x[:, lo:hi])
    # the sampler stores float32 (as `expected` does): roundings of float64 values that differ by ≤ forward_tol may
    # land one float32 ulp apart; |log p| ≤ 16 (the shipped model's logits stay within ±6: ≤ 2·6 + log 19)
    assert expected.abs().max() <= 16
    tol = rounding_tol(scale=16, n=1) + forward_tol(scale=16, terms=SHIPPED_TERMS)
    torch.testing.assert_close(out.token_logprobs, expected, atol=tol, rtol=0)


@pytest.mark.parametrize("family", ["masked_lm", "dream", "toy"])
def test_families_without_a_cache_are_refused_by_name(family):
    with pytest.raises(ValueError, match=f"model family '{family}'.*set sampling.cache=none"):
        cached_logits_of(family, "dual")


def test_generate_refuses_a_cache_it_cannot_serve(toy_policy):
    ids, attn = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="model family 'toy'"):
        generate(toy_policy, ids, attn, gen_length=4, block_length=2, steps=2, cache="prefix")
    with pytest.raises(ValueError, match="unknown cache"):
        generate(toy_policy, ids, attn, gen_length=4, block_length=2, steps=2, cache="kv")
    tiny = MaskedDiffusionPolicy(toy_policy.model, None, toy_policy.mask_token_id, "tiny", toy_policy.logits_fn)
    with pytest.raises(ValueError, match="classifier-free guidance"):
        generate(tiny, ids, attn, gen_length=4, block_length=2, steps=2, cache="dual", cfg_scale=1.0)


def test_a_boolean_threshold_is_refused(toy_policy):
    ids, attn = torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool)
    for kw in ({"threshold": True}, {"threshold_factor": True}):
        with pytest.raises(ValueError, match="threshold"):
            generate(toy_policy, ids, attn, gen_length=4, block_length=2, steps=2, **kw)


def test_any_bidirectional_causal_lm_class_is_detected_as_tiny():
    from dlmrl.models.families import detect_family

    assert detect_family({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "is_causal": False}) == "tiny"
    with pytest.raises(ValueError, match="model.kind=ar"):  # (a causal one is still pointed at the AR adapter)
        detect_family({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
