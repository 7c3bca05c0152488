"""The block cache on LLaDA's released code (dlmrl.models.llada_cache): the checkpoint's own blocks, whose model
forward refuses a cache, run with explicit rotary positions; a cached pass on the canvas its cache came from is a
full pass (with left padding too), and greedy decoding with a prefix or dual cache equals the hook oracle of
Fast-dLLM's caches (tests/models/llada_reference.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

from dlmrl.models.block_cache import BlockCache
from dlmrl.models.families import cached_logits_of
from dlmrl.models.llada_cache import llada_cached_logits
from dlmrl.models.loading import load_policy
from dlmrl.models.policy import canvas_logits
from dlmrl.models.sampler import generate
from tests.models.checkpoints import isolated_remote_code, save_llada_like
from tests.models.llada_reference import reference_greedy
from tests.models.test_sampler_parity import random_prompts
from tests.tolerances import forward_tol

D, V = 16, 126464  # the stand-in's width and LLaDA's vocabulary (tests/models/checkpoints.save_llada_like)
#: two layers of q/k/v and attention over <= 64 keys and the MLP (2 d), then the head's log-sum-exp over the vocabulary
TERMS = 2 * (4 * D + 64 + 2 * D) + V


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    root = tmp_path_factory.mktemp("llada_cache")
    with isolated_remote_code(root / "hf_modules"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (two layers: with one, a position's keys and values depend on its own token alone and no cache is stale)
        yield load_policy(str(save_llada_like(root / "llada", n_layers=2)), trust_remote_code=True,
                          dtype="float64")


def test_the_family_has_a_cache_and_the_released_forward_still_refuses_one(llada):
    assert cached_logits_of("llada", "dual") is llada_cached_logits
    with pytest.raises(AssertionError, match="kvcache"):  # (the stand-in refuses it as the released file does)
        llada.model.model(torch.zeros(1, 3, dtype=torch.long), use_cache=True)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@torch.no_grad()
def test_a_cached_pass_on_the_cached_canvas_is_a_full_pass_with_left_padding(llada, mode):
    ids, attn = random_prompts(llada, 4, seed=1)
    assert not attn.all()  # (rows of several padding lengths: the uncached logits run one forward per length)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, llada.mask_token_id, (4, 16), generator=g)
    x[:, 6:] = llada.mask_token_id
    full = canvas_logits(llada, ids, attn, x)  # (B, L, V) float64: llada_logits, each row without its padding
    scale = float(full.abs().max())
    tol = forward_tol(scale=scale, terms=TERMS)
    cache = BlockCache(llada, llada_cached_logits, ids, attn, mode)
    cache.start_block(4, 8)
    first, again = cache.logits(x), cache.logits(x)
    some = cache.logits(x, torch.tensor([0, 2]))
    kept = cache.subset[1]
    assert torch.equal(cache.logits(x, torch.tensor([0, 2])), some) and cache.subset[1] is kept  # (selected once)
    torch.testing.assert_close(first, full[:, 4:8], atol=tol, rtol=0)
    torch.testing.assert_close(again, full[:, 4:8], atol=tol, rtol=0)
    torch.testing.assert_close(some, full[[0, 2], 4:8], atol=tol, rtol=0)
    assert (cache.full_passes, cache.cached_passes) == (1, 3)
    x[:, 4:6] = 7  # (a real token inside the block: the cached keys are stale only by it)
    stale = (cache.logits(x) - canvas_logits(llada, ids, attn, x)[:, 4:8]).abs().max()
    assert stale > 1e3 * tol  # (the equalities above are not vacuous)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_greedy_decoding_equals_the_oracle(llada, mode):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, 100, (3, 5), generator=g)  # (unpadded: the hook oracle replays one forward per call)
    attn = torch.ones_like(ids, dtype=torch.bool)
    out = generate(llada, ids, attn, gen_length=16, block_length=8, steps=8, cache=mode)
    ref, passes = reference_greedy(llada, ids, attn, gen_length=16, block_length=8, steps=8,
                                   mask_id=llada.mask_token_id, cache=mode)
    assert torch.equal(out.canvas, ref) and out.nfe == passes
    exact = generate(llada, ids, attn, gen_length=16, block_length=8, steps=8)
    assert (out.canvas != exact.canvas).any()  # (the cache is an approximation here: the test is not vacuous)


def test_a_configuration_the_cache_does_not_cover_is_refused(llada, monkeypatch):
    monkeypatch.setattr(llada.model.model.config, "alibi", True)
    with pytest.raises(ValueError, match="alibi True.*sampling.cache=none"):
        llada_cached_logits(llada.model, torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2),
                            torch.arange(2)[None], None)
    with pytest.raises(TypeError, match="no LLaDA block layout"):
        llada_cached_logits(torch.nn.Linear(2, 2), None, None, None, None)


def test_a_configuration_the_cache_does_not_cover_is_refused_when_the_model_loads(llada, monkeypatch):
    # (before any pass: the trainer's load-time check, not the first rollout, names the key)
    from dlmrl.config import Config, apply_overrides
    from dlmrl.errors import ConfigError
    from dlmrl.kinds.masked import MaskedDiffusionKind

    cfg = Config()
    apply_overrides(cfg, ["sampling.cache=dual", "model.family=llada"])
    MaskedDiffusionKind().check_loaded(cfg, llada)  # (the stand-in's RoPE configuration: served)
    monkeypatch.setattr(llada.model.model.config, "block_group_size", 2)
    with pytest.raises(ConfigError, match="config key 'sampling.cache'.*block_group_size 2"):
        MaskedDiffusionKind().check_loaded(cfg, llada)
