"""The ``sdar`` family (SDAR / TraDo block-diffusion checkpoints on their own ``modeling_sdar.py``) on the offline
stand-in ``tests/models/remote_code/sdar`` (see its README): dlmrl's torch flash-attn functions against their
formulas, the stand-in's registration, detection, loading through ``auto_map`` + ``trust_remote_code``, the block
passes against the model's own call, the training-mode patches, and two training steps through the Python API."""

from __future__ import annotations

import importlib
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
from dlmrl.models.families import detect_family
from dlmrl.models.loading import load_block_policy
from dlmrl.models.sdar import flash_attn_func, install_flash_attn_fallback, rms_norm_fn
from tests.models.block_helpers import ATOL
from tests.models.checkpoints import isolated_remote_code, save_sdar_like
from tests.tolerances import rounding_tol

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4  # the stand-in's config.json block_size
# ATOL (tests/models/block_helpers.py) is derived for float32 logits of a model this size: width 16, 2 layers,
# reductions of ≤ 40 terms, logits ≲ 10 (the stand-in's reach ≈ 8)
PROMPTS = ["12+3=", "1234+56=", "7="]  # left-padded by 3, 0 and 6 (8 = two whole prompt blocks; 5 and 2 are not)


def _benchmark_configs(monkeypatch):
    """``benchmarks/remote_code_checkpoints.py``, where the published ``config.json`` files are written out."""
    spec = importlib.util.spec_from_file_location("remote_code_checkpoints",
                                                  ROOT / "benchmarks" / "remote_code_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sdar_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("sdar")
    with isolated_remote_code(root / "hf_modules"):
        yield save_sdar_like(root / "sdar")


def _load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (flash_attn stand-in, transformers' deprecations)
        return load_block_policy(str(path), trust_remote_code=True)


@pytest.fixture(scope="module")
def sdar(sdar_path):
    """The stand-in as ``load_block_policy`` loads it, float32, eval mode."""
    policy = _load(sdar_path)
    assert not policy.model.training
    return policy


@pytest.fixture(scope="module")
def prompts(sdar):
    enc = sdar.tokenizer(PROMPTS, add_special_tokens=False, padding=True, return_tensors="pt")
    assert not enc["attention_mask"].all()  # (left padding)
    return enc["input_ids"], enc["attention_mask"].bool()


def _tokens(policy, shape, seed):
    """Random character tokens (ids >= 4: no special token, so no mask token)."""
    return torch.randint(4, len(policy.tokenizer), shape, generator=torch.Generator().manual_seed(seed))


def _model_call(policy, ids, mask4d, positions):
    """One call of the checkpoint's own ``SDARForCausalLM.forward`` under a 4-D bool mask (SDAR's ``generate.py``)."""
    return policy.model(input_ids=ids, attention_mask=mask4d, position_ids=positions).logits.float()


# ------------------------------------------------------------------------------------ the flash-attn stand-in


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_flash_attn_func_is_softmax_attention_written_out(causal, scale):
    g = torch.Generator().manual_seed(0)
    b, lq, lk, heads, kv_heads, d = 2, 2, 5, 4, 2, 8
    q = torch.randn(b, lq, heads, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, lk, kv_heads, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, lk, kv_heads, d, generator=g, dtype=torch.float64)
    out = flash_attn_func(q, k, v, causal=causal, softmax_scale=scale)
    assert out.shape == (b, lq, heads, d)
    s = scale if scale is not None else 1 / math.sqrt(d)
    expected = torch.empty_like(out)
    for row in range(b):
        for h in range(heads):
            kh = h // (heads // kv_heads)  # (flash-attn's grouping: query heads [0, 1] read key/value head 0)
            for i in range(lq):
                keys = [j for j in range(lk) if not causal or j <= i + lk - lq]  # (bottom-right aligned)
                scores = torch.stack([s * (q[row, i, h] * k[row, j, kh]).sum() for j in keys])
                w = torch.softmax(scores, 0)
                expected[row, i, h] = sum(w[n] * v[row, j, kh] for n, j in enumerate(keys))
    # float64: a dot product of d terms, a softmax over lk, a weighted sum of lk values of size ≤ max|v|
    tol = rounding_tol(scale=float(v.abs().max()) * (1 + s * float(q.abs().max() * k.abs().max()) * d),
                       n=d + 2 * lk + 4, dtype=torch.float64)
    torch.testing.assert_close(out, expected, atol=tol, rtol=0)
    if causal:  # (not vacuous: the first query sees 4 of the 5 keys)
        assert (out[:, 0] - flash_attn_func(q, k, v, softmax_scale=scale)[:, 0]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="dropout"):
        flash_attn_func(q, k, v, dropout_p=0.1)


def _rms_formula(x, w, b, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_fn_is_its_formula(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64)
    w = torch.randn(16, generator=g, dtype=torch.float64)
    bias = torch.randn(16, generator=g, dtype=torch.float64)
    eps = 0.25  # (large: an eps dropped or misplaced moves the output by ≳ 1e-2)
    for b in (None, bias):
        out = rms_norm_fn(x.to(dtype), weight=w.to(dtype), bias=None if b is None else b.to(dtype), eps=eps)
        assert out.dtype == dtype
        expected = _rms_formula(x, w, 0.0 if b is None else b, eps)  # float64
        # the stand-in computes in float32, or float64 for a float64 input: the input's rounding, a mean of 16
        # squares, rsqrt, two products and a sum, each within an ulp of |out| in the input's dtype
        tol = rounding_tol(scale=float(expected.abs().max()), n=16 + 6, dtype=dtype)
        torch.testing.assert_close(out.double(), expected, atol=tol, rtol=0)
        assert (out.double() - _rms_formula(x, w, 0.0 if b is None else b, 1e-6)).abs().max() > 1e-3


def test_rms_norm_fn_returns_bfloat16_for_bfloat16():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 32, generator=g).bfloat16()
    w = torch.randn(32, generator=g).bfloat16()
    out = rms_norm_fn(x, weight=w, bias=None, eps=1e-6)
    assert out.dtype == torch.bfloat16
    expected = _rms_formula(x.float(), w.float(), 0.0, 1e-6)  # reduced in float32, as flash-attn's kernel does
    # one rounding to bfloat16 at the end (half a bfloat16 ulp, eps 2^-7) dominates the float32 work
    tol = rounding_tol(scale=float(expected.abs().max()), n=1, dtype=torch.bfloat16)
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=0)


FLASH_MODULES = ("flash_attn", "flash_attn.ops", "flash_attn.ops.triton", "flash_attn.ops.triton.layer_norm")


def test_install_flash_attn_fallback_registers_the_modules_once(monkeypatch):
    present = [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]
    for name in dict.fromkeys([*present, *FLASH_MODULES]):
        monkeypatch.setitem(sys.modules, name, None)  # (recorded: the undo restores the module or removes the name)
        monkeypatch.delitem(sys.modules, name)
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here: dlmrl uses it as it is")
    with pytest.warns(UserWarning, match="flash_attn is not installed") as record:
        assert install_flash_attn_fallback() is True
    assert len(record) == 1
    assert importlib.import_module("flash_attn.ops.triton.layer_norm").rms_norm_fn is rms_norm_fn
    assert importlib.import_module("flash_attn").flash_attn_func is flash_attn_func
    # the import statements of SDAR's modeling_sdar.py
    from flash_attn import flash_attn_func as imported_attention
    from flash_attn.ops.triton.layer_norm import rms_norm_fn as imported_norm

    assert imported_norm is rms_norm_fn and imported_attention is flash_attn_func
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert install_flash_attn_fallback() is True  # (a no-op, no second warning)
    assert importlib.import_module("flash_attn").flash_attn_func is flash_attn_func


# ------------------------------------------------------------------------------------ detection and loading


def test_sdar_configs_are_detected_and_a_causal_qwen3_is_not(monkeypatch):
    sdar_config = _benchmark_configs(monkeypatch).SDAR_CONFIG  # SDAR-4B-Chat's config.json
    assert detect_family(sdar_config) == "sdar"
    by_auto_map = {k: v for k, v in sdar_config.items() if k not in ("model_type", "architectures")}
    assert detect_family(by_auto_map) == "sdar"
    assert detect_family({"model_type": "sdar"}) == "sdar"
    qwen3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "is_causal": False,
             "head_dim": 128, "num_key_value_heads": 8}
    assert detect_family(qwen3) == "tiny"


def test_the_stand_in_loads_as_the_sdar_family(sdar_path, sdar):
    assert sdar.family == "sdar" and sdar.kind == "block" and sdar.prompt_blocks
    assert sdar.block_size == json.loads((sdar_path / "config.json").read_text())["block_size"] == BLOCK
    assert sdar.mask_token_id == sdar.tokenizer.mask_token_id == sdar.model.config.mask_token_id == 2
    assert type(sdar.model).__name__ == "SDARForCausalLM"
    assert type(sdar.model).__module__.startswith("transformers_modules")  # (the checkpoint's own code)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_block_policy(str(sdar_path))


def test_the_stand_in_needs_dlmrls_patches(sdar_path, tmp_path):
    """``transformers``' own loading fails (flash_attn missing, or ``LossKwargs`` gone, or ``pad_token_id`` unset),
    in a fresh process; and with the imports in place, the config without patch 8 cannot build the model."""
    code = ("import torch, transformers as t\n"
            f"m = t.AutoModelForCausalLM.from_pretrained({str(sdar_path)!r}, trust_remote_code=True)\n"
            "m(torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 1, 3, 3, dtype=torch.bool))\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert out.returncode != 0
    assert any(s in out.stderr for s in ("flash_attn", "LossKwargs", "pad_token_id")), out.stderr[-2000:]

    from dlmrl.models.compat import _dynamic_class, checkpoint_model_class

    config = _dynamic_class("configuration_sdar.SDARConfig", str(sdar_path)).from_pretrained(str(sdar_path))
    with pytest.raises(AttributeError, match="pad_token_id"):
        checkpoint_model_class(config, str(sdar_path), "AutoModelForCausalLM")(config)


# ------------------------------------------------------------------------------------ the block passes


@pytest.mark.parametrize("threshold", [None, 0.3])
@torch.no_grad()
def test_cached_and_uncached_rollouts_are_the_same(sdar, prompts, threshold):
    outs = [sdar.sample_blocks(*prompts, gen_length=8, steps=8, temperature=1.0, threshold=threshold, cache=cache,
                               generator=torch.Generator().manual_seed(3)) for cache in (True, False)]
    cached, plain = outs
    assert torch.equal(cached.canvas, plain.canvas) and torch.equal(cached.reveal_step, plain.reveal_step)
    torch.testing.assert_close(cached.token_logprobs, plain.token_logprobs, atol=ATOL, rtol=0)
    assert (cached.canvas != sdar.mask_token_id).all() and (cached.token_logprobs < 0).all()
    if threshold is not None:  # (not vacuous: some step revealed several tokens of a row at once)
        assert any(len(r.unique()) < len(r) for r in cached.reveal_step)


@torch.no_grad()
def test_completion_logits_are_one_call_under_the_block_causal_mask(sdar, prompts):
    ids, pm = prompts
    length = 9  # (the last block has 1 token)
    canvas = _tokens(sdar, (3, length), seed=1)
    canvas[:, 5:] = sdar.mask_token_id
    ours = sdar.completion_logits(ids, pm, canvas)
    seq = torch.cat([ids, canvas], 1)
    mask = block_causal_mask(pm, length, BLOCK, prompt_blocks=True)
    theirs = _model_call(sdar, seq, mask, block_position_ids(pm, length))[:, ids.shape[1]:]
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    # not vacuous: the prompt as one clean block (the tiny family's layout) gives other logits
    whole = _model_call(sdar, seq, block_causal_mask(pm, length, BLOCK), block_position_ids(pm, length))
    assert (whole[:, ids.shape[1]:] - ours).abs().max() > 1e-3


@pytest.mark.parametrize("length", [8, 9])
@torch.no_grad()
def test_the_composite_pass_equals_the_per_block_loop(sdar, prompts, length):
    ids, pm = prompts
    clean = _tokens(sdar, (3, length), seed=4)
    noisy = clean.masked_fill(torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5,
                              sdar.mask_token_id)
    out = sdar.completion_logits(ids, pm, noisy, clean=clean)
    for lo, hi in block_bounds(length, BLOCK):
        seq = torch.cat([ids, clean[:, :lo], noisy[:, lo:hi]], 1)
        ref = _model_call(sdar, seq, block_causal_mask(pm, hi, BLOCK, True), block_position_ids(pm, hi))
        torch.testing.assert_close(out[:, lo:hi], ref[:, ids.shape[1] + lo:], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------ training mode


def _grads(policy, ids, pm, noisy, clean, target):
    policy.model.zero_grad(set_to_none=True)
    logits = policy.completion_logits(ids, pm, noisy, clean=clean)
    logp = torch.log_softmax(logits, -1).gather(-1, target[..., None]).sum()
    logp.backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()
                             if p.grad is not None}


def test_training_mode_runs_the_inference_branch_with_the_same_gradients(sdar_path):
    policy = _load(sdar_path)
    model = policy.model
    enc = policy.tokenizer(PROMPTS, add_special_tokens=False, padding=True, return_tensors="pt")
    ids, pm = enc["input_ids"], enc["attention_mask"].bool()
    clean = _tokens(policy, (3, 8), seed=6)
    noisy = clean.masked_fill(torch.rand(3, 8, generator=torch.Generator().manual_seed(7)) < 0.5,
                              policy.mask_token_id)
    model.train()
    train_logits, train_grads = _grads(policy, ids, pm, noisy, clean, clean)
    assert all(m.training for m in model.modules())  # (the patch restored the flags)
    model.eval()
    eval_logits, eval_grads = _grads(policy, ids, pm, noisy, clean, clean)
    # every weight gets a gradient (the padding rows of the embedding apart, none here: no pad_token_id)
    assert set(train_grads) == {n for n, _ in model.named_parameters()}
    assert all(g.abs().max() > 0 for n, g in train_grads.items() if "embed" not in n)
    # the same computation in both modes (no dropout in either branch): equal, not merely close
    assert torch.equal(train_logits, eval_logits)
    assert all(torch.equal(train_grads[n], eval_grads[n]) for n in train_grads)

    # with labels, training mode still runs the checkpoint's own SFT branch (no logits)
    model.train()
    seq = torch.cat([ids[:1], clean[:1]], 1)
    labels = torch.cat([torch.full_like(ids[:1], -100), clean[:1]], 1)
    out = model(input_ids=seq, labels=labels)
    assert out.logits is None and torch.isfinite(out.loss)
    # and without dlmrl's patches training mode refuses to run without labels, and a dense mask
    mask = block_causal_mask(pm[:1], 8, BLOCK, True)
    with pytest.raises(ValueError, match="Labels must be provided"):
        type(model).forward.__wrapped__(model, input_ids=seq, attention_mask=mask)
    attention = model.model.layers[0].self_attn
    with pytest.raises(TypeError, match="BlockMask"):
        type(attention).forward.__wrapped__(attention, torch.zeros(1, seq.shape[1], 16),
                                            model.model.rotary_emb(torch.zeros(1), block_position_ids(pm[:1], 8)),
                                            mask)


def test_activation_checkpointing_gives_the_same_gradients(sdar_path):
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _load(sdar_path)
    enc = policy.tokenizer(PROMPTS[:2], add_special_tokens=False, padding=True, return_tensors="pt")
    ids, pm = enc["input_ids"], enc["attention_mask"].bool()
    clean = _tokens(policy, (2, 8), seed=8)
    noisy = clean.masked_fill(torch.arange(8) % 3 == 0, policy.mask_token_id)
    policy.model.train()
    _, plain = _grads(policy, ids, pm, noisy, clean, clean)
    calls = []
    policy.model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
    enable_gradient_checkpointing(policy.model)
    _, checkpointed = _grads(policy, ids, pm, noisy, clean, clean)
    assert len(calls) == 2  # (not vacuous: the layer ran again in the backward pass)
    for n, g in plain.items():  # (the recomputation repeats the same operations)
        torch.testing.assert_close(checkpointed[n], g, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ the Python API


def digit_sum(prompts, completions, **columns):
    """A reward that differs between completions: the sum of their digits, scaled."""
    return [sum(int(c) for c in text if c.isdigit()) / 50 for text in completions]


def test_two_tracerl_steps_through_the_python_api(sdar_path, tmp_path):
    data = Dataset.from_dict({"prompt": ["12+3=", "7*8=", "1+1=", "9-4="]})
    config = {"model.kind": "block", "model.trust_remote_code": True, "train.max_steps": 2,
              "train.prompts_per_step": 2, "train.num_generations": 2, "sampling.gen_length": 8,
              "sampling.steps": 8, "train.algorithm": "tracerl", "estimator.name": "trajectory", "estimator.merge": 1,
              "train.learning_rate": 1e-2, "train.warmup_steps": 0, "output_dir": str(tmp_path / "run")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(str(sdar_path), reward_funcs=[digit_sum], train_dataset=data, config=config)
        assert trainer.policy.family == "sdar" and trainer.policy.block_size == BLOCK
        before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        trainer.train(progress=False)
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "training must change parameters"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rewards/digit_sum/mean"] is not None and math.isfinite(r["loss"]) and r["grad_norm"] > 0
        # the exact old-policy scores (composite passes) are the log-probs the cached sampler drew the tokens with
        assert r["rollout_logp_gap_max"] <= ATOL, r
