"""The ``fast_dllm_v2`` family (Fast-dLLM v2 block-diffusion checkpoints on their own ``modeling.py``) on the offline
stand-in ``tests/models/remote_code/fast_dllm_v2`` (see its README): detection, loading through ``auto_map`` +
``trust_remote_code``, the block size from ``bd_size``, the mask id from the tokenizer's ``|<MASK>|``; the token shift
of the block kind (logits, composite likelihood, sampler with and without the cache) against naive per-position
references; greedy decoding against Fast-dLLM v2's ``generate`` (its semantics re-implemented below as the oracle);
the trajectory likelihood against the model's forward replayed per step; the training branches; two training steps
with LoRA and with every weight, then ``dlmrl eval``."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from dlmrl.models.block_attention import (
    block_bounds,
    block_causal_mask,
    block_position_ids,
    composite_mask,
    composite_position_ids,
    shifted_sources,
)
from dlmrl.models.families import FAMILIES, detect_family, shift_logits_right
from dlmrl.models.fast_dllm_v2 import (
    FAST_DLLM_V2_BLOCK_SIZE,
    FAST_DLLM_V2_MASK_TOKEN_ID,
    fast_dllm_v2_block_forward,
)
from dlmrl.models.loading import checkpoint_block_size, load_block_policy
from tests.models.block_helpers import ATOL
from tests.models.checkpoints import isolated_remote_code, save_fast_dllm_v2_like
from tests.models.family_runs import train_then_eval

BLOCK = 4
PROMPTS = ["12+3=", "1234+56=", "7="]  # left-padded by 3, 0 and 6
ALIGNED = ["1234+56=", "9+8=17+1", "3=3+0=0="]  # 8 tokens: two whole blocks of 4 (generate prefills them)
#: Fast_dLLM_v2_7B's config.json, the fields detection reads (the hub repository's file)
RELEASE_CONFIG = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                 "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
    "bd_size": 32, "model_type": "Fast_dLLM_Qwen", "vocab_size": 152064, "eos_token_id": 151645,
}


@pytest.fixture(scope="module")
def fast_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast_dllm_v2")
    with isolated_remote_code(root / "hf_modules"):
        yield save_fast_dllm_v2_like(root / "fast_dllm_v2")


def _load(path, block_size=BLOCK):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (transformers' deprecations)
        return load_block_policy(str(path), block_size=block_size, trust_remote_code=True)


@pytest.fixture(scope="module")
def fast(fast_path):
    """The stand-in as ``load_block_policy`` loads it (block size 4 from ``bd_size``), float32, eval mode."""
    policy = _load(fast_path, block_size=None)
    assert not policy.model.training
    return policy


def _encode(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def _tokens(policy, shape, seed):
    """Random character tokens (ids >= 4: no special token, so no mask token)."""
    return torch.randint(4, len(policy.tokenizer), shape, generator=torch.Generator().manual_seed(seed))


def _raw(policy, ids, mask4d, positions):
    """The model's raw outputs under an explicit mask (the output at j predicts token j + 1)."""
    return fast_dllm_v2_block_forward(policy.model, ids, mask4d, positions)[0]


# ------------------------------------------------------------------------------------ detection and loading


def test_fast_dllm_v2_configs_are_detected_and_qwen2_is_not():
    assert detect_family(RELEASE_CONFIG) == "fast_dllm_v2"
    assert detect_family({k: v for k, v in RELEASE_CONFIG.items() if k not in ("model_type", "architectures")}) \
        == "fast_dllm_v2"
    assert detect_family({"model_type": "Fast_dLLM_Qwen"}) == "fast_dllm_v2"
    with pytest.raises(ValueError, match="cannot detect"):  # (Qwen2.5, the AR model it was fine-tuned from)
        detect_family({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    family = FAMILIES.get("fast_dllm_v2")
    assert family.default_block_size == FAST_DLLM_V2_BLOCK_SIZE == 32 and family.logit_shift == 1
    assert family.prompt_blocks and family.default_mask_token_id == FAST_DLLM_V2_MASK_TOKEN_ID == 151665


def test_the_stand_in_loads_with_bd_size_and_the_tokenizers_mask_token(fast_path, fast):
    config = json.loads((fast_path / "config.json").read_text())
    assert config["bd_size"] == BLOCK and "block_size" not in config and "mask_token_id" not in config
    assert checkpoint_block_size(str(fast_path)) == BLOCK
    assert fast.family == "fast_dllm_v2" and fast.kind == "block" and fast.prompt_blocks and fast.logit_shift == 1
    assert fast.block_size == BLOCK
    # (the release's tokenizer lists |<MASK>| as an additional special token, not as mask_token)
    assert fast.tokenizer.mask_token_id is None and fast.mask_token_id == fast.tokenizer.convert_tokens_to_ids(
        "|<MASK>|") == 2
    assert type(fast.model).__name__ == "Fast_dLLM_QwenForCausalLM"
    assert type(fast.model).__module__.startswith("transformers_modules")
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_block_policy(str(fast_path))


def test_a_config_check_of_a_block_run_takes_bd_size(fast_path):
    from dlmrl.config import Config, apply_overrides, validate

    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={fast_path}", "model.kind=block", "model.trust_remote_code=true",
                          "task.answer_mode=text", "sampling.gen_length=8", "sampling.steps=8"])
    validate(cfg, for_training=False)
    assert cfg.model.block_size == BLOCK


# ------------------------------------------------------------------------------------ the shifted passes


@torch.no_grad()
def test_the_code_ignores_the_mask_it_is_given_but_takes_dlmrls(fast):
    """In eval mode the code attends under its own ``eval_mask`` whatever ``attention_mask`` says; dlmrl's pass
    replaces that mask for its call only."""
    ids = _tokens(fast, (1, 8), seed=0)
    own = fast.model(input_ids=ids, block_size=BLOCK).logits
    full = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    assert torch.equal(fast.model(input_ids=ids, attention_mask=full, block_size=BLOCK).logits, own)
    ours = _raw(fast, ids, full, torch.arange(8)[None])
    assert (ours - own).abs().max() > 1e-3  # (not vacuous: the full mask gives other logits)
    blocks = block_causal_mask(torch.ones(1, 4, dtype=torch.bool), 4, BLOCK, prompt_blocks=True)
    torch.testing.assert_close(_raw(fast, ids, blocks, torch.arange(8)[None]), own.float(), atol=ATOL, rtol=0)
    assert torch.equal(fast.model(input_ids=ids, block_size=BLOCK).logits, own)  # (its own mask is back)


@pytest.mark.parametrize("length", [8, 9])
@torch.no_grad()
def test_shifted_completion_logits_equal_a_per_position_reference(fast, length):
    """Position ``i``'s logits are the raw output at ``i − 1`` of the block-causal pass (the prompt's last real
    token for ``i = 0``), read one position at a time."""
    ids, pm = _encode(fast, PROMPTS)
    canvas = _tokens(fast, (3, length), seed=1)
    canvas[:, 5:] = fast.mask_token_id
    ours = fast.completion_logits(ids, pm, canvas)
    raw = _raw(fast, torch.cat([ids, canvas], 1), block_causal_mask(pm, length, BLOCK, True),
               block_position_ids(pm, length))
    p = ids.shape[1]
    for row in range(3):
        for i in range(length):
            torch.testing.assert_close(ours[row, i], raw[row, p + i - 1], atol=0, rtol=0)


@pytest.mark.parametrize("length", [8, 9])
@torch.no_grad()
def test_the_shifted_composite_pass_equals_a_per_block_loop(fast, length):
    """Block ``b``'s logits from one composite pass equal those of a pass over ``[prompt | clean blocks < b | noisy
    block b]`` read at the position before each token: a block's first token from the last clean token before it."""
    ids, pm = _encode(fast, PROMPTS)
    clean = _tokens(fast, (3, length), seed=4)
    noisy = clean.masked_fill(torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5,
                              fast.mask_token_id)
    noisy[:, 0] = fast.mask_token_id  # (block firsts noised: the clean-half source is used)
    noisy[:, BLOCK] = fast.mask_token_id
    out = fast.completion_logits(ids, pm, noisy, clean=clean)
    p = ids.shape[1]
    for lo, hi in block_bounds(length, BLOCK):
        seq = torch.cat([ids, clean[:, :lo], noisy[:, lo:hi]], 1)
        raw = _raw(fast, seq, block_causal_mask(pm, hi, BLOCK, True), block_position_ids(pm, hi))
        for i in range(lo, hi):
            torch.testing.assert_close(out[:, i], raw[:, p + i - 1], atol=ATOL, rtol=0)
    # not vacuous: the noisy copy of the previous block's last position (what the code's SFT loss reads) differs
    raw = _raw(fast, torch.cat([ids, noisy, clean], 1), composite_mask(pm, length, BLOCK, True),
               composite_position_ids(pm, length))
    assert (raw[:, p + BLOCK - 1] - out[:, BLOCK]).abs().max() > 1e-3


def test_shifted_sources_by_hand():
    pm = torch.tensor([[False, True, True], [True, True, True]])
    assert shifted_sources(pm, 5, 2).tolist() == [[2, 3, 4, 5, 6]] * 2
    # composite [prompt 3 | noisy 5 | clean 5]: block firsts 2 and 4 read the clean copy of the position before
    assert shifted_sources(pm, 5, 2, composite=True).tolist() == [[2, 3, 3 + 5 + 1, 5, 3 + 5 + 3]] * 2
    no_prompt = torch.zeros(1, 0, dtype=torch.bool)  # (no prompt: position 0 keeps its own output)
    assert shifted_sources(no_prompt, 3, 2, composite=True).tolist() == [[0, 0, 3 + 1]]
    empty_row = torch.tensor([[False, False]])
    assert shifted_sources(empty_row, 2, 2).tolist() == [[2, 2]]


@pytest.mark.parametrize("threshold", [None, 0.3])
@torch.no_grad()
def test_cached_and_uncached_rollouts_are_the_same(fast, threshold):
    prompts = _encode(fast, PROMPTS)
    outs = [fast.sample_blocks(*prompts, gen_length=8, steps=8, temperature=1.0, threshold=threshold, cache=cache,
                               generator=torch.Generator().manual_seed(3)) for cache in (True, False)]
    cached, plain = outs
    assert torch.equal(cached.canvas, plain.canvas) and torch.equal(cached.reveal_step, plain.reveal_step)
    torch.testing.assert_close(cached.token_logprobs, plain.token_logprobs, atol=ATOL, rtol=0)
    assert (cached.canvas != fast.mask_token_id).all() and (cached.token_logprobs < 0).all()
    for lo, _ in block_bounds(8, BLOCK):  # (a block's first token is revealed alone at the block's first step)
        first = cached.reveal_step[:, lo]
        assert ((cached.reveal_step[:, lo:lo + BLOCK] > first[:, None]).sum(1) == BLOCK - 1).all()
    if threshold is not None:  # (not vacuous: some step revealed several tokens of a row at once)
        assert any(len(r.unique()) < len(r) for r in cached.reveal_step)


@torch.no_grad()
def test_the_sampler_records_the_shifted_log_probs(fast):
    """Greedy, one token per step: each token's recorded log-prob is the log-softmax (mask excluded) of the raw output
    one position before it, in a pass over the canvas as it was at its step."""
    ids, pm = _encode(fast, PROMPTS[:2])
    out = fast.sample_blocks(ids, pm, gen_length=8, steps=8, temperature=0.0, cache=True)
    p = ids.shape[1]
    for row in range(2):
        for i in range(8):
            step = out.reveal_step[row, i]
            canvas = out.canvas[row:row + 1].masked_fill(out.reveal_step[row:row + 1] >= step, fast.mask_token_id)
            raw = _raw(fast, torch.cat([ids[row:row + 1], canvas], 1),
                       block_causal_mask(pm[row:row + 1], 8, BLOCK, True), block_position_ids(pm[row:row + 1], 8))
            logits = raw[0, p + i - 1].double()
            logits[fast.mask_token_id] = -math.inf
            expected = torch.log_softmax(logits, -1)[out.canvas[row, i]]
            torch.testing.assert_close(out.token_logprobs[row, i].double(), expected, atol=ATOL, rtol=0)


def fast_dllm_v2_generate(model, prompt: torch.Tensor, gen_length: int, block_size: int, threshold: float,
                          mask_id: int, small_block_size: int | None = None) -> torch.Tensor:
    """Test oracle: Fast-dLLM v2's ``Fast_dLLM_QwenForCausalLM.generate`` (``modeling.py``) at ``temperature=0``,
    re-implemented from its semantics: one prompt ``(1, P)``, ``P`` a multiple of the block size and above it; every
    pass is the model's own forward (its own mask, blocks aligned to position 0; uncached, which its block-causal mask
    makes equal to its cache); the prompt's last output's argmax is the first block's first token, and each finished
    block's last output's argmax the next block's first; inside a block the logits are shifted (``cat([logits[:, :1],
    logits[:, :-1]])``) and the block is decoded in sub-blocks of ``small_block_size`` (default: the block), left to
    right: every step reveals the current sub-block's masked positions whose softmax probability of the argmax exceeds
    ``threshold``, and at least its most probable one. Its stop-token exit is left out (``generate`` returns the prefix
    of this output up to its first stop token). Every argmax leaves out the mask token (on this 20-token random model
    it is sometimes the argmax; ``generate``'s loop would then never end: the position stays masked)."""
    sub = small_block_size or block_size

    def argmax(t):
        return t.masked_fill(torch.arange(t.shape[-1]) == mask_id, -math.inf).argmax(-1)

    x = prompt
    logits = model(input_ids=x, block_size=block_size).logits[0]
    x = torch.cat([x, argmax(logits[-1])[None, None]], 1)
    for _ in range(gen_length // block_size):
        x = torch.cat([x, torch.full((1, block_size - x.shape[1] % block_size), mask_id)], 1)
        for start in range(0, block_size, sub):
            window = slice(x.shape[1] - block_size + start, x.shape[1] - block_size + start + sub)
            while (x[0, window] == mask_id).any():
                logits = model(input_ids=x, block_size=block_size).logits[0]
                logits = torch.cat([logits[:1], logits[:-1]])[window]
                probs = torch.softmax(logits, -1)
                x1 = argmax(probs)
                masked = x[0, window] == mask_id
                confidence = torch.where(masked, probs.gather(-1, x1[:, None])[:, 0], -math.inf)
                reveal = confidence > threshold
                reveal[confidence.argmax()] = True
                reveal &= masked
                x[0, window] = torch.where(reveal, x1, x[0, window])
        logits = model(input_ids=x, block_size=block_size).logits[0]
        x = torch.cat([x, argmax(logits[-1])[None, None]], 1)
    return x[0, prompt.shape[1]:prompt.shape[1] + gen_length]


@pytest.mark.parametrize("sub_block", [None, 2])
@pytest.mark.parametrize("threshold", [None, 0.3])
@torch.no_grad()
def test_greedy_decoding_equals_fast_dllm_v2s_generate(fast, threshold, sub_block):
    import dataclasses

    ids, pm = _encode(fast, ALIGNED)
    assert pm.all()  # (whole blocks: generate's layout and dlmrl's agree)
    policy = dataclasses.replace(fast, sub_block_size=sub_block)
    ours = policy.sample_blocks(ids, pm, gen_length=12, steps=12, temperature=0.0, threshold=threshold)
    for row in range(ids.shape[0]):
        theirs = fast_dllm_v2_generate(fast.model, ids[row:row + 1], 12, BLOCK, threshold or 1.0, fast.mask_token_id,
                                       sub_block)
        assert torch.equal(ours.canvas[row], theirs), (row, ours.canvas[row], theirs)
    if threshold is not None:  # (not vacuous: some step revealed two tokens of a row)
        assert any(len(r.unique()) < len(r) for r in ours.reveal_step)
    if sub_block is not None:  # (not vacuous: without sub-blocks some row decodes differently)
        whole = fast.sample_blocks(ids, pm, gen_length=12, steps=12, temperature=0.0, threshold=threshold)
        assert not torch.equal(whole.reveal_step, ours.reveal_step)


@pytest.mark.parametrize("threshold", [None, 0.3])
@torch.no_grad()
def test_sub_blocks_decode_left_to_right_with_and_without_the_cache(fast, threshold):
    """Sampled, left-padded: every position of a sub-block is revealed before any of the next one, the same with and
    without the cache; a step reveals positions of one sub-block only (threshold) or in (sub-block, confidence)
    order (schedule, 2 tokens per step here)."""
    import dataclasses

    policy = dataclasses.replace(fast, sub_block_size=2)
    prompts = _encode(fast, PROMPTS)
    steps = 8 if threshold is not None else 4
    outs = [policy.sample_blocks(*prompts, gen_length=8, steps=steps, temperature=1.0, threshold=threshold,
                                 cache=cache, generator=torch.Generator().manual_seed(11)) for cache in (True, False)]
    assert torch.equal(outs[0].canvas, outs[1].canvas) and torch.equal(outs[0].reveal_step, outs[1].reveal_step)
    torch.testing.assert_close(outs[0].token_logprobs, outs[1].token_logprobs, atol=ATOL, rtol=0)
    step = outs[0].reveal_step.view(3, 4, 2)  # (row, sub-block, position)
    assert (step[:, :-1].amax(-1) <= step[:, 1:].amin(-1)).all()
    if threshold is not None:
        assert (step[:, :-1].amax(-1) < step[:, 1:].amin(-1)).all()


@torch.no_grad()
def test_the_trajectory_likelihood_equals_the_forward_replayed_per_step(fast):
    from dlmrl.estimators import score
    from dlmrl.estimators.block_plans import block_trajectory_plan

    ids, pm = _encode(fast, ALIGNED[:2])
    out = fast.sample_blocks(ids, pm, gen_length=8, steps=8, temperature=0.0)
    mask = torch.ones_like(out.canvas, dtype=torch.bool)
    plan = block_trajectory_plan(mask, out.reveal_step, BLOCK, 1, temperature=1.0)
    ours = score(fast, ids, pm, out.canvas, mask, plan)
    p = ids.shape[1]
    for row in range(2):
        for lo, hi in block_bounds(8, BLOCK):
            steps = out.reveal_step[row, lo:hi]
            for s in steps.unique().tolist():
                block = out.canvas[row, lo:hi].masked_fill(steps >= s, fast.mask_token_id)
                seq = torch.cat([ids[row], out.canvas[row, :lo], block])[None]
                logits = fast.model(input_ids=seq, block_size=BLOCK).logits[0].double()  # (its own mask)
                logits = torch.cat([logits[:1], logits[:-1]])[p + lo:]
                logits[:, fast.mask_token_id] = -math.inf
                logp = torch.log_softmax(logits, -1).gather(-1, out.canvas[row, lo:hi, None])[:, 0]
                now = steps == s
                torch.testing.assert_close(ours.per_token[row, lo:hi][now].double(), logp[now], atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.per_token, out.token_logprobs, atol=ATOL, rtol=0)


def test_scores_from_the_head_in_chunks_equal_the_full_logits(fast):
    """``estimator.logits_chunk`` taps the output head: on the shifted composite pass it scores each token at its
    source position (a block's first token at the clean copy of the previous block's last position)."""
    from dlmrl.models.canvas_scores import canvas_token_logprobs

    ids, pm = _encode(fast, PROMPTS)
    clean = _tokens(fast, (3, 9), seed=6)
    noisy = clean.masked_fill(torch.arange(9) % 2 == 0, fast.mask_token_id)
    scored = noisy == fast.mask_token_id
    full, _ = canvas_token_logprobs(fast, ids, pm, noisy, clean, scored, clean=clean)
    chunked, _ = canvas_token_logprobs(fast, ids, pm, noisy, clean, scored, clean=clean, logits_chunk=3)
    torch.testing.assert_close(chunked, full, atol=ATOL, rtol=0)
    assert scored[:, BLOCK].all() and (full[:, BLOCK] < 0).all()


@torch.no_grad()
def test_the_diffusion_kind_logits_are_one_full_pass_shifted(fast):
    ids, pm = _encode(fast, PROMPTS)
    b, t = ids.shape
    keys = pm[:, None, None, :].expand(b, 1, t, t) | torch.eye(t, dtype=torch.bool)
    raw = _raw(fast, ids, keys, block_position_ids(pm, 0))
    family_logits = FAMILIES.get("fast_dllm_v2").logits(fast.model, ids, pm, block_position_ids(pm, 0))
    torch.testing.assert_close(family_logits, shift_logits_right(raw, pm), atol=0, rtol=0)


def test_the_config_check_asks_for_trust_remote_code(fast_path):
    """The family's checkpoints ship their code: a config naming the family (a hub id, nothing read) or a local
    checkpoint of it without ``model.trust_remote_code`` is refused naming the key."""
    from dlmrl.config import Config, ConfigError, apply_overrides, validate

    for model in ("model.name_or_path=Efficient-Large-Model/Fast_dLLM_v2_7B", f"model.name_or_path={fast_path}"):
        cfg = Config()
        apply_overrides(cfg, [model, "model.family=fast_dllm_v2", "model.kind=block", "model.block_size=4",
                              "task.answer_mode=text", "sampling.gen_length=8", "sampling.steps=8"])
        with pytest.raises(ConfigError, match="model.trust_remote_code"):
            validate(cfg, for_training=False)


def test_sampling_sub_block_size_reaches_the_policy_and_is_checked(fast_path, tmp_path):
    from dlmrl.config import Config, ConfigError, apply_overrides, validate
    from dlmrl.training.run_setup import load_configured_policy

    def config(*extra):
        cfg = Config()
        apply_overrides(cfg, [f"model.name_or_path={fast_path}", "model.trust_remote_code=true",
                              "task.answer_mode=text", "sampling.gen_length=8", "sampling.steps=8", *extra])
        return cfg

    cfg = config("model.kind=block", "sampling.sub_block_size=2")
    validate(cfg, for_training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy = load_configured_policy(cfg)
    assert policy.sub_block_size == 2  # (what the sampler reads: BlockDiffusionPolicy.sample_blocks)
    with pytest.raises(ConfigError, match="sampling.sub_block_size.*from 1 to model.block_size 4"):
        validate(config("model.kind=block", "sampling.sub_block_size=5"), for_training=False)
    with pytest.raises(ConfigError, match="sampling.sub_block_size.*model.kind block"):
        validate(config("model.kind=diffusion", "sampling.sub_block_size=2", "sampling.block_length=8"),
                 for_training=False)


# ------------------------------------------------------------------------------------ training mode


def test_training_mode_runs_the_eval_branch_without_labels_and_the_sft_loss_with_them(fast_path):
    policy = _load(fast_path)
    ids, pm = _encode(policy, PROMPTS)
    clean = _tokens(policy, (3, 8), seed=7)
    noisy = clean.masked_fill(torch.arange(8) % 3 == 0, policy.mask_token_id)
    with torch.no_grad():
        eval_logits = policy.completion_logits(ids, pm, noisy, clean=clean)
    policy.model.train()
    logits = policy.completion_logits(ids, pm, noisy, clean=clean)
    torch.testing.assert_close(logits, eval_logits, atol=ATOL, rtol=0)
    torch.log_softmax(logits, -1).gather(-1, clean[..., None]).sum().backward()
    grads = {n for n, p in policy.model.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
    assert grads == {n for n, _ in policy.model.named_parameters()}
    assert policy.model.training and all(m.training for m in policy.model.modules())  # (restored after the call)
    seq = _tokens(policy, (2, 8), seed=8)  # (with labels the code's own SFT branch runs: [x_t | x_0], its loss)
    out = policy.model(input_ids=seq, labels=seq)
    assert out.loss is not None and out.logits.shape[1] == 8


def test_activation_checkpointing_gives_the_same_gradients(fast_path):
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _load(fast_path)
    ids, pm = _encode(policy, PROMPTS[:2])
    clean = _tokens(policy, (2, 8), seed=9)
    noisy = clean.masked_fill(torch.arange(8) % 3 == 0, policy.mask_token_id)
    policy.model.train()

    def grads():
        policy.model.zero_grad(set_to_none=True)
        logits = policy.completion_logits(ids, pm, noisy, clean=clean)
        torch.log_softmax(logits, -1).gather(-1, clean[..., None]).sum().backward()
        return {n: p.grad.clone() for n, p in policy.model.named_parameters()}

    plain = grads()
    calls = []
    policy.model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
    enable_gradient_checkpointing(policy.model)
    checkpointed = grads()
    assert len(calls) == 2  # (not vacuous: the layer ran again in the backward pass)
    for n, g in plain.items():
        torch.testing.assert_close(checkpointed[n], g, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ training and eval runs

@pytest.mark.parametrize("lora", [True, False])
def test_two_tracerl_steps_and_dlmrl_eval(fast_path, tmp_path, monkeypatch, capsys, lora):
    """``dlmrl train`` (2 steps of ``tracerl`` on the block kind, LoRA on the attention projections or every weight;
    token log-probs from the head in chunks) then ``dlmrl eval`` of the saved model, in this process; the exact
    old-policy scores (the shifted composite pass) are the sampler's."""
    from safetensors.torch import load_file

    model = {"kind": "block", "name_or_path": str(fast_path), "trust_remote_code": True,
             "gradient_checkpointing": True}
    if lora:
        model |= {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                  "lora_target_modules": "q_proj,k_proj,v_proj"}
    rows, final = train_then_eval(
        tmp_path, monkeypatch, capsys, model, sampling={"gen_length": 8, "steps": 8, "temperature": 1.0},
        estimator={"name": "trajectory", "order": "sampled", "merge": 1, "logits_chunk": 3},
        train={"algorithm": "tracerl"}, eval_steps=8)
    assert all(r["rollout_logp_gap_max"] <= ATOL for r in rows), rows
    if lora:
        lora_b = {k: v for k, v in load_file(str(final / "adapter_model.safetensors")).items() if "lora_B" in k}
        assert len(lora_b) == 3 * 2 and any(v.abs().max() > 0 for v in lora_b.values())
    else:
        saved = load_file(str(final / "model.safetensors"))
        base = load_file(str(fast_path / "model.safetensors"))
        assert any(not torch.equal(base[k], saved[k]) for k in base)
        assert (final / "modeling.py").is_file()  # (the code is saved next to the weights)


# ------------------------------------------------------------------------------------ the recipe

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "fast_dllm_v2_tracerl_gsm8k.yaml"


@pytest.mark.parametrize(("processes", "overrides"), [("8", ["model.use_peft=false", "train.sharding=fsdp2"]),
                                                      ("1", ["model.use_peft=true", "train.sharding=none"])])
def test_the_recipe_dry_runs_offline_and_fits_80gb_by_its_own_plan(tmp_path, capsys, monkeypatch, processes,
                                                                     overrides):
    """``--dry-run --num-processes N`` of the 7B recipe: the family, its block size, mask id and shift, and a per-GPU
    plan within the 80 GB budget with a 10% margin (8 GPUs every weight with FSDP2; one GPU with LoRA)."""
    import transformers
    import yaml

    from dlmrl import cli

    def refuse(*args, **kwargs):
        raise AssertionError(f"--dry-run tried to load {args[:1]}")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    assert cli.main(["train", "--config", str(RECIPE), "--dry-run", "--output-dir", str(tmp_path / "run"),
                     "--num-processes", processes, *overrides]) == 0
    plan = yaml.safe_load(capsys.readouterr().out)
    assert plan["model"]["family"] == "fast_dllm_v2" and plan["model"]["block_size"] == FAST_DLLM_V2_BLOCK_SIZE
    assert plan["model"]["mask_token_id"].startswith("151665") and plan["model"]["logit_shift"].startswith("1:")
    assert plan["sampler"]["sub_block_size"].startswith("8:")
    assert plan["memory"]["memory_budget"].endswith("fits")
    assert float(plan["memory"]["peak"].split(" GB")[0]) <= 80 * 0.9


def test_model_kind_ar_is_refused_on_a_diffusion_family_checkpoint(fast_path):
    """A user who points ``model.kind: ar`` at a diffusion checkpoint gets a config error naming ``model.kind`` and the
    kind to set, before any code runs (a reviewer's finding: the load crashed in the code's RoPE lookup; had it
    loaded, Fast-dLLM v2's eval branch builds its own block mask, so the 'AR' model would not have been causal)."""
    from dlmrl.config import ConfigError, default_job_config, validate

    with pytest.raises(ConfigError, match=r"model.kind.*'fast_dllm_v2' diffusion checkpoint.*set model.kind block"):
        validate(default_job_config(["model.kind=ar", f"model.name_or_path={fast_path}", "model.trust_remote_code=true",
                                     "task.answer_mode=full", "train.algorithm=grpo"]), data=False)


def test_a_block_size_other_than_bd_size_warns(tmp_path):
    """``model.block_size`` other than the ``bd_size`` a checkpoint's config.json records (Fast-dLLM v2's name, the
    only one the release writes) warns, naming the key, as for SDAR's ``block_size`` (a reviewer's finding: only
    ``block_size``/``block_sizes`` were read)."""
    from types import SimpleNamespace

    from dlmrl.kinds.block import _warn_untrained_block_size

    (tmp_path / "config.json").write_text(json.dumps(RELEASE_CONFIG))  # (bd_size 32, no block_size)
    with pytest.warns(UserWarning, match=r"model.block_size.*records block_size 32"):
        _warn_untrained_block_size(SimpleNamespace(name_or_path=str(tmp_path), block_size=8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_untrained_block_size(SimpleNamespace(name_or_path=str(tmp_path), block_size=32))
