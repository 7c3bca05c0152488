"""The ``llada2`` family (LLaDA2.0 / 2.1 block-diffusion mixture-of-experts checkpoints on their own
``modeling_llada2_moe.py``) on the offline stand-in ``tests/models/remote_code/llada2`` (see its README): detection,
loading through ``auto_map`` + ``trust_remote_code`` with compat patch 10, the family's block size and mask id, the
block passes against the model's own call, greedy decoding against LLaDA2's ``generate`` (its semantics
re-implemented below as the oracle), the expert branches in training and eval mode, and two training steps."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from dlmrl import Trainer
from dlmrl.models.block_attention import block_bounds, block_causal_mask, block_position_ids
from dlmrl.models.families import FAMILIES, detect_family
from dlmrl.models.llada2 import LLADA2_BLOCK_SIZE, LLADA2_MASK_TOKEN_ID
from dlmrl.models.loading import checkpoint_block_size, load_block_policy
from tests.models.block_helpers import ATOL
from tests.models.checkpoints import isolated_remote_code, save_llada2_like

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4
PROMPTS = ["12+3=", "1234+56=", "7="]  # left-padded by 3, 0 and 6
ALIGNED = ["1234+56=", "9+8=17+1", "3=3+0=0="]  # 8 tokens: two whole blocks of 4 (LLaDA2's generate prefills them)


def _benchmark_configs(monkeypatch):
    """``benchmarks/remote_code_checkpoints.py``, where LLaDA2.0-mini's ``config.json`` is written out."""
    spec = importlib.util.spec_from_file_location("remote_code_checkpoints",
                                                  ROOT / "benchmarks" / "remote_code_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llada2_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("llada2")
    with isolated_remote_code(root / "hf_modules"):
        yield save_llada2_like(root / "llada2")


def _load(path, block_size=BLOCK):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (transformers' deprecations)
        return load_block_policy(str(path), block_size=block_size, trust_remote_code=True)


@pytest.fixture(scope="module")
def llada2(llada2_path):
    """The stand-in as ``load_block_policy`` loads it with block size 4, float32, eval mode."""
    policy = _load(llada2_path)
    assert not policy.model.training
    return policy


def _encode(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def _tokens(policy, shape, seed):
    """Random character tokens (ids >= 4: no special token, so no mask token)."""
    return torch.randint(4, len(policy.tokenizer), shape, generator=torch.Generator().manual_seed(seed))


def _model_call(policy, ids, mask4d, positions):
    return policy.model(input_ids=ids, attention_mask=mask4d, position_ids=positions).logits.float()


# ------------------------------------------------------------------------------------ detection and loading


def test_llada2_configs_are_detected_and_others_are_not(monkeypatch):
    config = _benchmark_configs(monkeypatch).LLADA2_CONFIG  # LLaDA2.0-mini's config.json
    assert detect_family(config) == "llada2"
    by_auto_map = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    assert detect_family(by_auto_map) == "llada2"
    assert detect_family({"model_type": "llada2_moe"}) == "llada2"
    with pytest.raises(ValueError, match="cannot detect"):  # (Ling 2.0, the AR model it was converted from)
        detect_family({"model_type": "bailing_moe", "architectures": ["BailingMoeV2ForCausalLM"]})
    assert FAMILIES.get("llada2").default_block_size == LLADA2_BLOCK_SIZE == 32


def test_the_stand_in_loads_with_the_family_block_size_and_the_tokenizers_mask(llada2_path):
    config = json.loads((llada2_path / "config.json").read_text())
    assert "block_size" not in config and "mask_token_id" not in config  # (as LLaDA2's config.json)
    assert checkpoint_block_size(str(llada2_path)) == LLADA2_BLOCK_SIZE
    policy = _load(llada2_path, block_size=None)
    assert policy.family == "llada2" and policy.kind == "block" and policy.prompt_blocks
    assert policy.block_size == LLADA2_BLOCK_SIZE
    assert policy.mask_token_id == policy.tokenizer.mask_token_id == 1  # (the real tokenizer's <|mask|> is 156895)
    assert type(policy.model).__name__ == "LLaDA2MoeModelLM"
    assert type(policy.model).__module__.startswith("transformers_modules")
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_block_policy(str(llada2_path))
    assert LLADA2_MASK_TOKEN_ID == 156895


def test_the_stand_in_needs_patch_10(llada2_path, tmp_path):
    """``transformers``' own loading fails on the removed ``is_torch_fx_available``, in a fresh process."""
    code = ("import transformers as t\n"
            f"t.AutoModelForCausalLM.from_pretrained({str(llada2_path)!r}, trust_remote_code=True)\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert out.returncode != 0 and "is_torch_fx_available" in out.stderr, out.stderr[-2000:]


def test_a_config_check_of_a_block_run_takes_the_family_block_size(llada2_path):
    from dlmrl.config import Config, apply_overrides, validate

    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={llada2_path}", "model.kind=block", "model.trust_remote_code=true",
                          "task.answer_mode=text", "sampling.gen_length=64", "sampling.steps=64"])
    validate(cfg, for_training=False)
    assert cfg.model.block_size == LLADA2_BLOCK_SIZE


def test_a_config_that_leaves_attention_dropout_at_the_code_default_warns(llada2_path, tmp_path):
    """LLaDA2MoeConfig defaults attention_dropout to 0.1, which the code applies in training mode: loading warns."""
    import shutil

    path = tmp_path / "dropout"
    shutil.copytree(llada2_path, path)
    config = json.loads((path / "config.json").read_text())
    del config["attention_dropout"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="attention_dropout = 0.1"):
        policy = load_block_policy(str(path), block_size=BLOCK, trust_remote_code=True)
    assert policy.model.config.attention_dropout == 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # (the shipped config's 0.0: no warning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        _ = load_block_policy(str(llada2_path), block_size=BLOCK, trust_remote_code=True)


def test_the_config_check_refuses_a_diffusion_cache_on_a_local_llada2_checkpoint(llada2_path):
    from dlmrl.config import Config, ConfigError, apply_overrides, validate

    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={llada2_path}", "model.trust_remote_code=true", "task.answer_mode=text",
                          "sampling.gen_length=8", "sampling.block_length=8", "sampling.steps=8",
                          "sampling.cache=prefix"])
    with pytest.raises(ConfigError, match="sampling.cache.*'llada2'"):
        validate(cfg, for_training=False)


# ------------------------------------------------------------------------------------ the block passes


@pytest.mark.parametrize("threshold", [None, 0.3])
@torch.no_grad()
def test_cached_and_uncached_rollouts_are_the_same(llada2, threshold):
    prompts = _encode(llada2, PROMPTS)
    outs = [llada2.sample_blocks(*prompts, gen_length=8, steps=8, temperature=1.0, threshold=threshold, cache=cache,
                                 generator=torch.Generator().manual_seed(3)) for cache in (True, False)]
    cached, plain = outs
    assert torch.equal(cached.canvas, plain.canvas) and torch.equal(cached.reveal_step, plain.reveal_step)
    torch.testing.assert_close(cached.token_logprobs, plain.token_logprobs, atol=ATOL, rtol=0)
    assert (cached.canvas != llada2.mask_token_id).all() and (cached.token_logprobs < 0).all()
    if threshold is not None:  # (not vacuous: some step revealed several tokens of a row at once)
        assert any(len(r.unique()) < len(r) for r in cached.reveal_step)


@torch.no_grad()
def test_completion_logits_are_one_call_under_the_block_causal_mask(llada2):
    ids, pm = _encode(llada2, PROMPTS)
    length = 9  # (the last block has 1 token)
    canvas = _tokens(llada2, (3, length), seed=1)
    canvas[:, 5:] = llada2.mask_token_id
    ours = llada2.completion_logits(ids, pm, canvas)
    seq = torch.cat([ids, canvas], 1)
    mask = block_causal_mask(pm, length, BLOCK, prompt_blocks=True)
    positions = block_position_ids(pm, length)
    theirs = _model_call(llada2, seq, mask, positions)[:, ids.shape[1]:]
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    # the additive form LLaDA2's generate passes (log of the 0/1 mask) gives the same logits
    additive = _model_call(llada2, seq, mask.float().log(), positions)[:, ids.shape[1]:]
    torch.testing.assert_close(additive, theirs, atol=ATOL, rtol=0)
    # not vacuous: the prompt as one clean block gives other logits
    whole = _model_call(llada2, seq, block_causal_mask(pm, length, BLOCK), positions)
    assert (whole[:, ids.shape[1]:] - ours).abs().max() > 1e-3


@pytest.mark.parametrize("length", [8, 9])
@torch.no_grad()
def test_the_composite_pass_equals_the_per_block_loop(llada2, length):
    ids, pm = _encode(llada2, PROMPTS)
    clean = _tokens(llada2, (3, length), seed=4)
    noisy = clean.masked_fill(torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5,
                              llada2.mask_token_id)
    out = llada2.completion_logits(ids, pm, noisy, clean=clean)
    for lo, hi in block_bounds(length, BLOCK):
        seq = torch.cat([ids, clean[:, :lo], noisy[:, lo:hi]], 1)
        ref = _model_call(llada2, seq, block_causal_mask(pm, hi, BLOCK, True), block_position_ids(pm, hi))
        torch.testing.assert_close(out[:, lo:hi], ref[:, ids.shape[1] + lo:], atol=ATOL, rtol=0)


def llada2_generate(model, prompt: torch.Tensor, gen_length: int, block_length: int, steps: int,
                    mask_id: int) -> torch.Tensor:
    """Test oracle: LLaDA2's ``LLaDA2MoeModelLM.generate`` at ``temperature=0`` with ``threshold`` above 1 (the fixed
    schedule), re-implemented from its semantics (``modeling_llada2_moe.py``): one prompt ``(1, P)``; blocks aligned
    to position 0 under the additive mask ``log(block lower-triangular)``; the prompt's whole blocks prefilled; per
    block ``steps`` steps of one uncached pass over everything up to the block's end, the argmax and its full-softmax
    probability, the ``k`` most confident masked positions revealed (``k`` = ``block_length // steps``, one more in
    the first ``block_length % steps`` steps). Its EOS stop is left out: ``generate`` returns the prefix of this
    output up to the first EOS."""
    p = prompt.shape[1]
    blocks = -(-(p + gen_length) // block_length)
    total = blocks * block_length
    mask = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block_length, 0).repeat_interleave(
        block_length, 1)[None, None].log()
    x = torch.full((1, total), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    schedule = [block_length // steps + (1 if i < block_length % steps else 0) for i in range(steps)]
    for block in range(p // block_length, blocks):
        end = (block + 1) * block_length
        for step in range(steps):
            active = x[0, end - block_length:end] == mask_id
            if not active.any():
                break
            logits = model(x[:, :end], attention_mask=mask[..., :end, :end],
                           position_ids=torch.arange(end)[None]).logits[0, -block_length:]
            probs = torch.softmax(logits.float(), -1)
            x0 = probs.argmax(-1)
            confidence = torch.where(active, probs.gather(-1, x0[:, None])[:, 0], -math.inf)
            picked = confidence.topk(min(schedule[step], int(active.sum()))).indices
            x[0, end - block_length + picked] = x0[picked]
    return x[0, p:p + gen_length]


@pytest.mark.parametrize("steps", [4, 2])
@torch.no_grad()
def test_greedy_decoding_equals_llada2s_generate(llada2, steps):
    ids, pm = _encode(llada2, ALIGNED)
    assert pm.all()  # (whole blocks: generate's layout and dlmrl's agree)
    gen_length = 8
    ours = llada2.sample_blocks(ids, pm, gen_length=gen_length, steps=steps * gen_length // BLOCK, temperature=0.0)
    for row in range(ids.shape[0]):
        theirs = llada2_generate(llada2.model, ids[row:row + 1], gen_length, BLOCK, steps, llada2.mask_token_id)
        assert torch.equal(ours.canvas[row], theirs), (row, ours.canvas[row], theirs)
    if steps < BLOCK:  # (not vacuous: some step revealed two tokens of a row)
        assert any(len(r.unique()) < len(r) for r in ours.reveal_step)


# ------------------------------------------------------------------------------------ training mode


def _grads(policy, ids, pm, noisy, clean):
    policy.model.zero_grad(set_to_none=True)
    logits = policy.completion_logits(ids, pm, noisy, clean=clean)
    torch.log_softmax(logits, -1).gather(-1, clean[..., None]).sum().backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()
                             if p.grad is not None}


def test_training_mode_routes_gradients_through_the_experts(llada2_path):
    """Training mode runs the code's differentiable expert loop: every weight, every routed expert included, gets a
    gradient, and the logits equal eval mode's (``moe_infer``) up to the order of the experts' sums. Eval mode's
    ``moe_infer`` runs under ``torch.no_grad()``: no routed expert gets a gradient there (why the trainer scores in
    training mode)."""
    policy = _load(llada2_path)
    ids, pm = _encode(policy, PROMPTS)
    clean = _tokens(policy, (3, 8), seed=6)
    noisy = clean.masked_fill(torch.rand(3, 8, generator=torch.Generator().manual_seed(7)) < 0.5,
                              policy.mask_token_id)
    policy.model.train()
    train_logits, train_grads = _grads(policy, ids, pm, noisy, clean)
    routed = {n for n, _ in policy.model.named_parameters() if ".experts." in n}
    assert routed and set(train_grads) == {n for n, _ in policy.model.named_parameters()}
    assert any(train_grads[n].abs().max() > 0 for n in routed)
    policy.model.eval()
    eval_logits, eval_grads = _grads(policy, ids, pm, noisy, clean)
    torch.testing.assert_close(train_logits, eval_logits, atol=ATOL, rtol=0)
    assert not routed & set(eval_grads)


def test_activation_checkpointing_gives_the_same_gradients(llada2_path):
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _load(llada2_path)
    ids, pm = _encode(policy, PROMPTS[:2])
    clean = _tokens(policy, (2, 8), seed=8)
    noisy = clean.masked_fill(torch.arange(8) % 3 == 0, policy.mask_token_id)
    policy.model.train()
    _, plain = _grads(policy, ids, pm, noisy, clean)
    calls = []
    policy.model.model.layers[0].attention.register_forward_pre_hook(lambda *_: calls.append(1))
    enable_gradient_checkpointing(policy.model)
    _, checkpointed = _grads(policy, ids, pm, noisy, clean)
    assert len(calls) == 2  # (not vacuous: the layer ran again in the backward pass)
    for n, g in plain.items():
        torch.testing.assert_close(checkpointed[n], g, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ the Python API


def digit_sum(prompts, completions, **columns):
    """A reward that differs between completions: the sum of their digits, scaled."""
    return [sum(int(c) for c in text if c.isdigit()) / 50 for text in completions]


def test_two_tracerl_steps_through_the_python_api(llada2_path, tmp_path):
    data = Dataset.from_dict({"prompt": ["12+3=", "7*8=", "1+1=", "9-4="]})
    config = {"model.kind": "block", "model.block_size": BLOCK, "model.trust_remote_code": True,
              "train.max_steps": 2, "train.prompts_per_step": 2, "train.num_generations": 2,
              "sampling.gen_length": 8, "sampling.steps": 8, "train.algorithm": "tracerl",
              "estimator.name": "trajectory", "estimator.merge": 1, "train.learning_rate": 1e-2,
              "train.warmup_steps": 0, "output_dir": str(tmp_path / "run")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(str(llada2_path), reward_funcs=[digit_sum], train_dataset=data, config=config)
        assert trainer.policy.family == "llada2" and trainer.policy.block_size == BLOCK
        before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        trainer.train(progress=False)
    after = trainer.model.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(".experts." in k for k in moved), "training must reach the routed experts"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rewards/digit_sum/mean"] is not None and math.isfinite(r["loss"]) and r["grad_norm"] > 0
        # the exact old-policy scores are the log-probs the cached sampler drew the tokens with
        assert r["rollout_logp_gap_max"] <= ATOL, r
